// Which key blocks an M-block of queries must visit, and which of them need a
// mask. Plain integer code, shared by the kernel and the CPU tests.
//
// The causal mask is aligned to the bottom-right corner: query row i sees key
// column j iff j <= i + (seqlen_k - seqlen_q).
#pragma once

#include "common/int_math.h"

namespace flash3 {

struct BlockRange {
  int n_block_min;   // first key block visited
  int n_block_max;   // one past the last; empty when n_block_max <= n_block_min
  int n_block_mask;  // blocks >= n_block_mask need the mask (causal diagonal or seqlen_k end)

  FLASH3_HOST_DEVICE bool empty() const { return n_block_max <= n_block_min; }
};

// Tile m_block holds query rows [tile_first_row, + block_m): a causal launch
// starts its first tile above the sequence (row_offset rows, negative first
// rows), so that its partial tile is the top one, whose rows see the fewest
// keys, rather than the bottom one, whose rows see them all (launch_forward).
FLASH3_HOST_DEVICE int tile_first_row(int m_block, int block_m, int row_offset) {
  return m_block * block_m - row_offset;
}

FLASH3_HOST_DEVICE BlockRange block_range(int m_block, int block_m, int block_n, int seqlen_q, int seqlen_k,
                                          bool causal, int row_offset = 0) {
  BlockRange r;
  int const num_n_blocks = div_up(seqlen_k, block_n);
  r.n_block_min = 0;
  r.n_block_max = num_n_blocks;
  // Only the last block can hold columns past seqlen_k.
  r.n_block_mask = (seqlen_k % block_n == 0) ? num_n_blocks : num_n_blocks - 1;
  if (causal) {
    int const offset = seqlen_k - seqlen_q;
    int const tile_row = tile_first_row(m_block, block_m, row_offset);
    int const first_row = tile_row < 0 ? 0 : tile_row;
    int const last_row = tile_row + block_m - 1;
    // The last row of the tile sees up to column last_row + offset.
    int const last_visible = (last_row < seqlen_q ? last_row : seqlen_q - 1) + offset;
    int const n_max = last_visible < 0 ? 0 : last_visible / block_n + 1;
    if (n_max < r.n_block_max) r.n_block_max = n_max;
    // Block n holds a column past the first row's limit iff (n+1)*block_n - 1 > first_row + offset.
    int const first_cut = div_floor(first_row + offset + 1, block_n);
    int const first_cut_clamped = first_cut < 0 ? 0 : first_cut;
    if (first_cut_clamped < r.n_block_mask) r.n_block_mask = first_cut_clamped;
  }
  return r;
}

// The row offset of a launch's first tile: with partial_tile_first, the rows
// above the sequence that make its partial tile the first one, in whole
// warpgroups of 64 (so that the last tile lacks fewer than 64 rows); else 0.
FLASH3_HOST_DEVICE int first_tile_row_offset(int64_t seqlen_q, int block_m, bool partial_tile_first) {
  return partial_tile_first ? int((block_m - seqlen_q % block_m) % block_m / 64 * 64) : 0;
}

// The key blocks that one consumer warpgroup's rows see: the tile's rows
// 64 * group .. + 63 (row_offset is a multiple of 64, so they are one 64-row
// block of the sequence). Empty when they all lie outside the sequence or see
// no key. With the causal mask its n_block_max can be below the tile's: the
// blocks in between are all masked for these rows.
FLASH3_HOST_DEVICE BlockRange warpgroup_block_range(int m_block, int block_m, int group, int block_n, int seqlen_q,
                                                    int seqlen_k, bool causal, int row_offset = 0) {
  int const rows = m_block * (block_m / 64) + group - row_offset / 64;  // the warpgroup's block of 64 rows
  if (rows < 0 || rows * 64 >= seqlen_q) return {0, 0, 0};
  return block_range(rows, 64, block_n, seqlen_q, seqlen_k, causal);
}

}  // namespace flash3
