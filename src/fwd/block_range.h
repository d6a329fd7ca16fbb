// The forward's tile geometry: which query rows a tile (or one consumer
// warpgroup of it) holds, and so which key blocks it visits under the mask
// policy (common/mask.h). Plain integer code, shared by the kernel and the
// CPU tests.
#pragma once

#include <cstdint>

#include "common/mask.h"

namespace flash3 {

// Tile m_block holds query rows [tile_first_row, + block_m): a causal launch
// may start its first tile above the sequence (row_offset rows, negative first
// rows), so that its partial tile is the top one, whose rows see the fewest
// keys, rather than the bottom one, whose rows see them all.
FLASH3_HOST_DEVICE int tile_first_row(int m_block, int block_m, int row_offset) {
  return m_block * block_m - row_offset;
}

FLASH3_HOST_DEVICE BlockRange block_range(MaskPolicy const& mask, int m_block, int block_m, int block_n,
                                          int row_offset = 0) {
  int const first_row = tile_first_row(m_block, block_m, row_offset);
  return mask.key_blocks(first_row, first_row + block_m - 1, block_n);
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
FLASH3_HOST_DEVICE BlockRange warpgroup_block_range(MaskPolicy const& mask, int m_block, int block_m, int group,
                                                    int block_n, int row_offset = 0) {
  int const rows = m_block * (block_m / 64) + group - row_offset / 64;  // the warpgroup's block of 64 rows
  if (rows < 0 || rows * 64 >= mask.seqlen_q) return {0, 0, 0};
  return block_range(mask, rows, 64, block_n);
}

}  // namespace flash3
