// Split-KV (decoding): a tile's key blocks cut into num_splits contiguous
// runs, each run a CTA's work, whose partial O and LSE the combine kernel
// (fwd/combine.h) reduces; and how many splits a call gets. Plain integer
// code, shared by the kernel and the CPU tests.
#pragma once

#include <algorithm>
#include <cstdint>

#include "common/int_math.h"
#include "common/mask.h"

namespace flash3 {

// The most splits a call takes: the combine kernel holds one weight per
// split and row in shared memory.
inline constexpr int kMaxSplits = 128;

// Run `split` of a tile's key blocks: runs of ceil(blocks / num_splits)
// blocks from the lowest, so that the runs past the last block are empty
// (their rows get LSE -inf partials). The mask's threshold stays the tile's:
// it is an absolute block index.
FLASH3_HOST_DEVICE BlockRange split_block_range(BlockRange tile, int split, int num_splits) {
  int const blocks = tile.n_block_max > tile.n_block_min ? tile.n_block_max - tile.n_block_min : 0;
  int const per_split = div_up(blocks, num_splits);
  int const first = tile.n_block_min + split * per_split;
  int const last = first + per_split < tile.n_block_max ? first + per_split : tile.n_block_max;
  return {first, last, tile.n_block_mask};
}

// The blocks of `own` (a consumer warpgroup's rows' range) inside `split`
// (the CTA's run): empty when that warpgroup's rows see no key of the run.
FLASH3_HOST_DEVICE BlockRange within_split(BlockRange own, BlockRange split) {
  int const first = own.n_block_min > split.n_block_min ? own.n_block_min : split.n_block_min;
  int const last = own.n_block_max < split.n_block_max ? own.n_block_max : split.n_block_max;
  return {first, last, own.n_block_mask};
}

// Each split walks at least this many key blocks, so that its loads and
// GEMMs outweigh what a split adds (its epilogue's float32 partial O, the
// combine's reads of it).
inline constexpr int kMinBlocksPerSplit = 4;

// num_splits = 0's choice: no split while the tiles already fill 80% of the
// SMs, nor for a cache of at most 2 * kMinBlocksPerSplit key blocks (the
// combine's launch and reads outweigh what splitting so few blocks saves);
// otherwise the most splits that keep tiles x splits within one wave of
// CTAs over the SMs, each split at least kMinBlocksPerSplit key blocks, at
// most kMaxSplits. A second, partial wave of split CTAs costs more than the
// longer runs of one wave (docs/performance-log.md, run 192's sweep).
inline int choose_num_splits(int64_t tiles, int key_blocks, int num_sms) {
  if (tiles <= 0 || num_sms <= 0 || tiles * 5 >= int64_t(num_sms) * 4) return 1;
  if (key_blocks <= 2 * kMinBlocksPerSplit) return 1;
  int64_t const one_wave = num_sms / tiles;
  return int(std::max<int64_t>(1, std::min<int64_t>({one_wave, key_blocks / kMinBlocksPerSplit, kMaxSplits})));
}

}  // namespace flash3
