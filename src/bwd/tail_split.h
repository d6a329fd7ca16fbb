// The backward's last wave, split. Without the causal mask every CTA (key
// block, head, batch) walks all query blocks, so CTAs take equal times and a
// launch of T of them on P slots ends with T mod P CTAs alone on the GPU for
// a whole CTA's time (the paper's head dim 64 shapes: 4096 CTAs, 4 in the
// 32nd wave). The last T mod P tiles are cut instead into `parts` CTAs, each
// walking a share of the query blocks; the parts add their dK and dV into
// fp32 sums, and the last to finish stores the tile (Epilogue::gather_parts).
// Plain integer code, shared by the kernel, the launch and the CPU tests.
#pragma once

#include <cstdint>

#include "common/mask.h"

namespace flash3::bwd {

// The split tiles are the last `split_tiles` in launch order.
struct TailSplit {
  int split_tiles = 0;
  int parts = 1;

  FLASH3_HOST_DEVICE int64_t ctas(int64_t tiles) const { return tiles + int64_t(split_tiles) * (parts - 1); }
};

// A CTA's share of the work: `part` of `parts` of tile `tile`; split_index
// numbers the split tiles from 0 (-1 for a whole tile).
struct TilePart {
  int tile;
  int part;
  int parts;
  int split_index;
};

// Fixed cost of a CTA, in query blocks' time: K and V's loads, the
// pipelines' fill and drain, the epilogue.
constexpr int kCtaOverheadBlocks = 2;
constexpr int kMaxTailParts = 16;

// The split that ends the launch soonest, if any: equal CTAs of
// m_blocks + overhead, the full waves in step, then ceil(split_tiles * parts
// / slots) rounds of the parts. The split must save more than a CTA's
// overhead, which the sums (cleared, added, read back) cost besides: a split
// that saves just that much comes out slower. At most max_split_tiles tiles
// (the workspace's sums).
inline TailSplit plan_tail_split(int64_t tiles, int64_t slots, int m_blocks, int max_split_tiles) {
  TailSplit best;
  if (slots <= 0 || tiles <= slots) return best;  // one wave: nothing waits for a tail
  int64_t const rest = tiles % slots;
  if (rest == 0 || rest > max_split_tiles) return best;
  int64_t best_time = m_blocks;  // the unsplit last wave, less the sums' cost
  for (int parts = 2; parts <= kMaxTailParts && parts <= m_blocks; ++parts) {
    int64_t const rounds = (rest * parts + slots - 1) / slots;
    int64_t const time = rounds * ((m_blocks + parts - 1) / parts + kCtaOverheadBlocks);
    if (time < best_time) {
      best_time = time;
      best = TailSplit{int(rest), parts};
    }
  }
  return best;
}

// CTA `cta` of a launch of split.ctas(tiles): whole tiles first, then each
// split tile's parts side by side.
FLASH3_HOST_DEVICE TilePart tile_part(int cta, int tiles, TailSplit split) {
  int const whole = tiles - split.split_tiles;
  if (cta < whole) return TilePart{cta, 0, 1, -1};
  int const s = (cta - whole) / split.parts;
  return TilePart{whole + s, (cta - whole) % split.parts, split.parts, s};
}

// Part `part` of `parts` of a range's query blocks (as even as can be).
FLASH3_HOST_DEVICE QueryRange part_range(QueryRange r, int part, int parts) {
  int const n = r.m_block_max - r.m_block_min;
  int const lo = r.m_block_min + int(int64_t(n) * part / parts);
  int const hi = r.m_block_min + int(int64_t(n) * (part + 1) / parts);
  return QueryRange{lo, hi, r.m_block_mask};
}

}  // namespace flash3::bwd
