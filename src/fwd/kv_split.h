// Split-KV (decoding): a tile's key blocks cut into num_splits contiguous
// runs, each run a CTA's work, whose partial O and LSE the combine kernel
// (fwd/combine.h) reduces; and how many splits a call gets. Plain integer
// code, shared by the kernel and the CPU tests.
#pragma once

#include <algorithm>
#include <cmath>
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

// num_splits = 0's choice (FlashAttention's rule, in its own words here):
// no split while the tiles already fill 80% of the SMs; otherwise the
// fewest splits whose waves of tiles x splits over the SMs come within 85%
// of the best wave efficiency (the last wave's share of full), among the
// split counts from 1 up to what the key blocks allow (kMinBlocksPerSplit a
// split), the SMs and kMaxSplits. A count that gives the same blocks per
// split as one fewer is skipped: it adds partials without shortening a CTA.
inline int choose_num_splits(int64_t tiles, int key_blocks, int num_sms) {
  if (tiles <= 0 || key_blocks <= 0 || num_sms <= 0 || tiles * 5 >= int64_t(num_sms) * 4) return 1;
  int const most = std::min({kMaxSplits, num_sms, std::max(1, key_blocks / kMinBlocksPerSplit)});
  auto efficiency = [&](int splits) {
    double const waves = double(tiles * splits) / num_sms;
    return waves / std::ceil(waves);
  };
  auto eligible = [&](int splits) {
    return splits == 1 || div_up(key_blocks, splits) != div_up(key_blocks, splits - 1);
  };
  double best = 0.0;
  for (int s = 1; s <= most; ++s) {
    if (eligible(s)) best = std::max(best, efficiency(s));
  }
  for (int s = 1; s <= most; ++s) {
    if (eligible(s) && efficiency(s) >= 0.85 * best) return s;
  }
  return 1;
}

}  // namespace flash3
