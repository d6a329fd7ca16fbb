// Variable-length batches (packed sequences, FlashAttention's cu_seqlens):
// the forward's tiles of every sequence and head, longest sequences first.
// A sequence of n query rows has ceil(n / block_m) tiles a head, so no tile
// covers padding; a tile's cost grows with its sequence's keys, so handing
// out the sequences with the most key blocks first leaves short tiles for
// the end of the grid (longest processing time first, as TileOrder does for
// the causal mask). Within a sequence the tiles follow TileOrder, as a
// fixed-length batch of that one sequence would: heads in L2 sections, query
// blocks from the last. The lengths live in device memory: the table is
// built on the device before the main kernel (build_varlen_tiles) and read
// by the scheduler; build_on_host() builds the same table in the CPU tests.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/host_device.h"
#include "common/int_math.h"
#include "common/tile_order.h"

namespace flash3 {

// Each sequence's lengths: cu_seqlens_* [batch + 1] prefix sums of the
// packed rows; seqused_* [batch] (optional) the rows of each sequence that
// take part, the first n of its packed ones.
struct SequenceLengths {
  const int32_t* cu_seqlens_q = nullptr;
  const int32_t* cu_seqlens_k = nullptr;
  const int32_t* seqused_q = nullptr;
  const int32_t* seqused_k = nullptr;

  FLASH3_HOST_DEVICE int q(int b) const {
    return seqused_q != nullptr ? seqused_q[b] : cu_seqlens_q[b + 1] - cu_seqlens_q[b];
  }
  FLASH3_HOST_DEVICE int k(int b) const {
    return seqused_k != nullptr ? seqused_k[b] : cu_seqlens_k[b + 1] - cu_seqlens_k[b];
  }
  FLASH3_HOST_DEVICE bool packed() const { return cu_seqlens_q != nullptr; }
};

// The table, in a workspace of table_ints() ints: order[s] is the sequence in
// slot s (slots by descending key blocks, ties by index), tile_end[s] the
// tiles of slots 0 .. s (all heads), sections[s] the heads per L2 section of
// slot s's sequence (TileOrder::heads_per_section).
struct VarlenTileTable {
  int* order = nullptr;
  int* tile_end = nullptr;
  int* sections = nullptr;

  static constexpr int64_t table_ints(int batch) { return 3 * int64_t(batch); }
  static VarlenTileTable in(int* workspace, int batch) {
    VarlenTileTable t;
    t.order = workspace;
    t.tile_end = workspace + batch;
    t.sections = workspace + 2 * batch;
    return t;
  }
};

struct VarlenTileOrder {
  VarlenTileTable table;
  SequenceLengths lengths;
  int batch = 0;
  int num_heads = 0;
  int block_m = 0;
  int block_n = 0;
  // TileOrder's L2 sections of one sequence: K and V bytes one query head
  // reads per key, the L2, the mask, the grid.
  int64_t kv_bytes_per_key = 0;
  int64_t l2_bytes = 0;
  bool causal = false;
  int num_ctas = 1;

  // Sequences of more key blocks than this sort as this many; their order
  // among themselves is by index (the device build's counting sort has a
  // bucket per count).
  static constexpr int kMaxKeyBlocks = 4096;

  FLASH3_HOST_DEVICE int m_blocks(int b) const { return div_up(lengths.q(b) > 0 ? lengths.q(b) : 0, block_m); }
  FLASH3_HOST_DEVICE int sort_key(int b) const {
    int const n = div_up(lengths.k(b) > 0 ? lengths.k(b) : 0, block_n);
    return n < kMaxKeyBlocks ? n : kMaxKeyBlocks;
  }
  // Sequence b's tiles as a fixed-length batch of it alone would have them.
  FLASH3_HOST_DEVICE TileOrder sequence_order(int b) const {
    int64_t const keys = lengths.k(b) > 0 ? lengths.k(b) : 0;
    return TileOrder::make(m_blocks(b), num_heads, 1, kv_bytes_per_key * keys, l2_bytes, causal, num_ctas);
  }

  // The table as the device builds it, by one host thread (a stable sort by
  // descending sort_key, then the prefix sums).
  void build_on_host() const {
    for (int s = 0, slot = 0; s <= kMaxKeyBlocks; ++s) {
      for (int b = 0; b < batch; ++b) {
        if (sort_key(b) == kMaxKeyBlocks - s) table.order[slot++] = b;
      }
    }
    for (int s = 0, tiles = 0; s < batch; ++s) {
      int const b = table.order[s];
      tiles += m_blocks(b) * num_heads;
      table.tile_end[s] = tiles;
      table.sections[s] = sequence_order(b).heads_per_section;
    }
  }

  FLASH3_HOST_DEVICE int num_tiles() const { return batch > 0 ? table.tile_end[batch - 1] : 0; }

  // Tile `index` (< num_tiles()): its slot by binary search over tile_end,
  // then its place in its sequence's TileOrder.
  FLASH3_HOST_DEVICE TileCoord tile(int index) const {
    int lo = 0, hi = batch - 1;
    while (lo < hi) {
      int const mid = (lo + hi) / 2;
      if (table.tile_end[mid] > index) hi = mid;
      else lo = mid + 1;
    }
    int const b = table.order[lo];
    int const first = lo > 0 ? table.tile_end[lo - 1] : 0;
    TileOrder within;
    within.num_m_blocks = table.tile_end[lo] - first;
    within.num_m_blocks /= num_heads;
    within.num_heads = num_heads;
    within.num_batch = 1;
    within.heads_per_section = table.sections[lo];
    within.total_tiles = within.num_m_blocks * num_heads;
    TileCoord c = within.tile(index - first);
    c.batch = b;
    return c;
  }
};

// Builds `order`'s table (its workspace allocated by the caller) on
// `stream`, one CTA, before the kernel that reads it.
cudaError_t build_varlen_tiles(VarlenTileOrder const& order, cudaStream_t stream);

}  // namespace flash3
