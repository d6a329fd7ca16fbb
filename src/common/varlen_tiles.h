// Variable-length batches (packed sequences, FlashAttention's cu_seqlens):
// the forward's tiles of every sequence and head, longest sequences first.
// A sequence of n query rows has ceil(n / block_m) tiles a head, so no tile
// covers padding; a tile's cost grows with its sequence's keys, so handing
// out the sequences with the most key blocks first leaves short tiles for
// the end of the grid (longest processing time first, as TileOrder does for
// the causal mask). The lengths live in device memory: the table is built
// on the device before the main kernel (build_varlen_tiles: one CTA; the
// same code runs on the host in the CPU tests) and read by the scheduler.
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

// The table, in a workspace of 2 * batch + num_keys ints (table_ints()):
// order[s] is the sequence in slot s (slots by descending key blocks, ties by
// index), tile_end[s] the tiles of slots 0 .. s (all heads).
struct VarlenTileTable {
  int* order = nullptr;
  int* tile_end = nullptr;
  int* counts = nullptr;  // scratch of the build: sequences per key-block count

  // The largest key-block count sorted apart; longer sequences share its
  // slot range (still ahead of every shorter one). Bounds the scratch, since
  // the lengths themselves are not known on the host.
  static constexpr int kMaxKeyBlocks = 4096;
  static constexpr int64_t table_ints(int batch) { return 2 * int64_t(batch) + kMaxKeyBlocks + 1; }
  static VarlenTileTable in(int* workspace, int batch) {
    VarlenTileTable t;
    t.order = workspace;
    t.tile_end = workspace + batch;
    t.counts = workspace + 2 * batch;
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

  FLASH3_HOST_DEVICE int m_blocks(int b) const { return div_up(lengths.q(b) > 0 ? lengths.q(b) : 0, block_m); }
  FLASH3_HOST_DEVICE int key_blocks(int b) const {
    int const n = div_up(lengths.k(b) > 0 ? lengths.k(b) : 0, block_n);
    return n < VarlenTileTable::kMaxKeyBlocks ? n : VarlenTileTable::kMaxKeyBlocks;
  }

  // The build, by `threads` threads of one CTA (thread `t`), or by one on the
  // host; `sync` separates its phases (__syncthreads on the device). A
  // counting sort by descending key blocks, then the tiles' prefix sums.
  template <class Sync>
  FLASH3_HOST_DEVICE void build(int t, int threads, Sync sync) const {
    int* counts = table.counts;
    for (int i = t; i <= VarlenTileTable::kMaxKeyBlocks; i += threads) counts[i] = 0;
    sync();
    // Each count's first slot: the sequences with more key blocks come first.
    if (t == 0) {
      for (int b = 0; b < batch; ++b) ++counts[key_blocks(b)];
      int slot = 0;
      for (int n = VarlenTileTable::kMaxKeyBlocks; n >= 0; --n) {
        int const c = counts[n];
        counts[n] = slot;
        slot += c;
      }
      // Ties keep the sequences' order: one thread places them.
      for (int b = 0; b < batch; ++b) table.order[counts[key_blocks(b)]++] = b;
      int tiles = 0;
      for (int s = 0; s < batch; ++s) {
        tiles += m_blocks(table.order[s]) * num_heads;
        table.tile_end[s] = tiles;
      }
    }
    sync();
  }

  FLASH3_HOST_DEVICE int num_tiles() const { return batch > 0 ? table.tile_end[batch - 1] : 0; }

  // Tile `index` (< num_tiles()): its slot by binary search over tile_end;
  // within a sequence, its last query block first (with the causal mask the
  // one that sees the most keys), heads fastest so that CTAs side by side
  // read the same K and V.
  FLASH3_HOST_DEVICE TileCoord tile(int index) const {
    int lo = 0, hi = batch - 1;
    while (lo < hi) {
      int const mid = (lo + hi) / 2;
      if (table.tile_end[mid] > index) hi = mid;
      else lo = mid + 1;
    }
    int const b = table.order[lo];
    int const within = index - (lo > 0 ? table.tile_end[lo - 1] : 0);
    TileCoord c;
    c.batch = b;
    c.head = within % num_heads;
    c.m_block = m_blocks(b) - 1 - within / num_heads;
    return c;
  }
};

// Builds `order`'s table (its workspace allocated by the caller) on
// `stream`, one CTA, before the kernel that reads it.
cudaError_t build_varlen_tiles(VarlenTileOrder const& order, cudaStream_t stream);

}  // namespace flash3
