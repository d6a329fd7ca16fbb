// Variable-length batches (packed sequences, FlashAttention's cu_seqlens):
// the forward's tiles of every sequence and head, longest sequences first.
// A sequence of n query rows has ceil(n / block_m) tiles a head, so no tile
// covers padding; a tile's cost grows with its sequence's keys, so handing
// out the sequences with the most key blocks first leaves short tiles for
// the end of the grid (longest processing time first, as TileOrder does for
// the causal mask). Sequences of equal lengths (in blocks) are ordered
// together as the fixed-length batch of them would be (TileOrder: L2
// sections of heads, query blocks from the last, longest first across them). The lengths live in device memory: the table is
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

// The table, in a workspace of table_ints() ints. order[s] is the sequence in
// slot s (slots by descending key blocks, ties by index), tile_end[s] the
// tiles of slots 0 .. s (all heads). Consecutive slots of equal key blocks
// and query blocks form a group, whose tiles are ordered together as one
// fixed-length batch of them (TileOrder): group_first[s] is the first slot
// of slot s's group, and at a group's first slot g, group_size[g] its slots
// and sections[g] its TileOrder::heads_per_section. tiles[i] is tile i's
// coordinates, expanded from the rest by every thread of a grid: the
// persistent kernel's producer then finds its next tile in one load, not a
// search (between two short tiles, where its latency would be exposed).
struct VarlenTileTable {
  int* order = nullptr;
  int* tile_end = nullptr;
  int* group_first = nullptr;
  int* group_size = nullptr;
  int* sections = nullptr;
  TileCoord* tiles = nullptr;

  // max_tiles bounds the tiles (max_tiles_of()).
  static constexpr int64_t table_ints(int batch, int64_t max_tiles) {
    return 5 * int64_t(batch) + 3 * max_tiles;
  }
  static VarlenTileTable in(int* workspace, int batch) {
    static_assert(sizeof(TileCoord) == 3 * sizeof(int));
    VarlenTileTable t;
    t.order = workspace;
    t.tile_end = workspace + batch;
    t.group_first = workspace + 2 * batch;
    t.group_size = workspace + 3 * batch;
    t.sections = workspace + 4 * batch;
    t.tiles = reinterpret_cast<TileCoord*>(workspace + 5 * int64_t(batch));
    return t;
  }
  // The most tiles `batch` sequences of `total_q` rows in all, none longer
  // than seqlen_q, can have: each has at most rows / block_m + 1 blocks.
  static constexpr int64_t max_tiles_of(int64_t total_q, int64_t seqlen_q, int batch, int heads, int block_m) {
    int64_t const by_total = (total_q / block_m + batch) * heads;
    int64_t const by_longest = (seqlen_q + block_m - 1) / block_m * heads * batch;
    return by_total < by_longest ? by_total : by_longest;
  }
};

struct VarlenTileOrder {
  VarlenTileTable table;
  SequenceLengths lengths;
  int batch = 0;
  int num_heads = 0;
  int block_m = 0;
  int block_n = 0;
  // TileOrder's L2 sections of a group: K and V bytes one query head reads
  // per key, the L2, the mask, the grid.
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
  // Whether slots holding sequences a and b (b next) order their tiles together.
  FLASH3_HOST_DEVICE bool same_group(int a, int b) const {
    return sort_key(a) == sort_key(b) && m_blocks(a) == m_blocks(b);
  }
  // The heads per L2 section of a group of `size` sequences like sequence b.
  FLASH3_HOST_DEVICE int group_sections(int b, int size) const {
    int64_t const keys = lengths.k(b) > 0 ? lengths.k(b) : 0;
    return TileOrder::make(m_blocks(b), num_heads, size, kv_bytes_per_key * keys, l2_bytes, causal, num_ctas)
        .heads_per_section;
  }

  // The table as the device builds it, by one host thread (a stable sort by
  // descending sort_key, the prefix sums, the groups, the tiles).
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
      table.group_first[s] = s > 0 && same_group(table.order[s - 1], b) ? table.group_first[s - 1] : s;
    }
    for (int s = 0; s < batch; ++s) {
      int const g = table.group_first[s];
      if (s + 1 == batch || table.group_first[s + 1] != g) {
        table.group_size[g] = s - g + 1;
        table.sections[g] = group_sections(table.order[g], s - g + 1);
      }
    }
    for (int i = 0; i < num_tiles(); ++i) table.tiles[i] = tile(i);
  }

  FLASH3_HOST_DEVICE int num_tiles() const { return batch > 0 ? table.tile_end[batch - 1] : 0; }

  // Tile `index` (< num_tiles()), from the rest of the table (the expansion
  // into tiles[]): its slot by binary search over tile_end, then its place
  // in its group's TileOrder.
  FLASH3_HOST_DEVICE TileCoord tile(int index) const {
    int lo = 0, hi = batch - 1;
    while (lo < hi) {
      int const mid = (lo + hi) / 2;
      if (table.tile_end[mid] > index) hi = mid;
      else lo = mid + 1;
    }
    int const g = table.group_first[lo];
    int const size = table.group_size[g];
    int const first = g > 0 ? table.tile_end[g - 1] : 0;
    TileOrder group;
    group.num_heads = num_heads;
    group.num_batch = size;
    group.total_tiles = table.tile_end[g + size - 1] - first;
    group.num_m_blocks = group.total_tiles / (num_heads * size);
    group.heads_per_section = table.sections[g];
    TileCoord c = group.tile(index - first);
    c.batch = table.order[g + c.batch];
    return c;
  }
};

// Builds `order`'s table (its workspace allocated by the caller, for at most
// max_tiles tiles) on `stream` before the kernel that reads it: one CTA, then
// the tiles' expansion by a grid.
cudaError_t build_varlen_tiles(VarlenTileOrder const& order, int64_t max_tiles, cudaStream_t stream);

}  // namespace flash3
