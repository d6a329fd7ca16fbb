// The order in which the forward's output tiles (m_block, head, batch) are
// handed out: tile index -> coordinates. Plain integer code, usable on the
// host (the CPU tests check coverage and order) and on the device; the
// schedulers (common/tile_scheduler.h) decide which index a CTA takes.
#pragma once

#include <algorithm>
#include <cstdint>

#include "common/host_device.h"

namespace flash3 {

struct TileCoord {
  int m_block;
  int head;
  int batch;
  int split = 0;  // split-KV: which run of the tile's key blocks (common/split_scheduler.h)
};

// Tiles are ordered for the L2 and, with a causal mask, longest first.
//
// (batch, head) pairs are cut into sections small enough that the K and V of a
// section stay in L2 together; within a section, M-blocks are walked from the
// last to the first, and heads vary fastest. With a causal mask the last
// M-block sees the most keys, so this is longest-processing-time-first order
// (the FlashAttention-3 talk's LPT ordering), and CTAs running side by side
// read the same K/V. Without a mask all tiles cost the same and only the L2
// grouping matters.
struct TileOrder {
  int num_m_blocks = 0;
  int num_heads = 0;
  int num_batch = 0;
  int heads_per_section = 1;  // (batch, head) pairs per L2 section
  int total_tiles = 0;        // kept, not recomputed: the kernel compares against it every tile

  // kv_bytes_per_head: bytes of K plus V one head reads. l2_bytes: the cache
  // to share; half of it is budgeted so Q and O traffic do not evict K/V.
  //
  // causal, num_ctas: a section's tiles run from the longest (every key) to
  // the shortest, so the last section's longest tile starts when that
  // section's work is all that is left to the grid. For it not to outlast
  // the rest, a section's work per CTA should be well above one longest tile:
  // a pair's causal work is about num_m_blocks / 2 longest tiles, and a
  // section holds at least 4 * num_ctas / num_m_blocks pairs (twice the bare
  // minimum, which measured better than 2 or 8), past the L2 budget if need
  // be, but not past the whole L2: there each pair's K and V would be read
  // from DRAM again for every wave of its M-blocks.
  //
  // Sections are then made equal: a short last section holds too little work
  // to cover its own longest tiles.
  FLASH3_HOST_DEVICE static TileOrder make(int num_m_blocks, int num_heads, int num_batch, int64_t kv_bytes_per_head,
                                           int64_t l2_bytes, bool causal = false, int num_ctas = 1) {
    TileOrder s;
    s.num_m_blocks = num_m_blocks;
    s.num_heads = num_heads;
    s.num_batch = num_batch;
    int64_t pairs = int64_t(num_heads) * num_batch;
    int64_t fit = kv_bytes_per_head > 0 ? (l2_bytes / 2) / kv_bytes_per_head : pairs;
    if (causal && num_m_blocks > 0) {
      int64_t const tail = (4 * int64_t(num_ctas) + num_m_blocks - 1) / num_m_blocks;
      int64_t const whole_l2 = kv_bytes_per_head > 0 ? l2_bytes / kv_bytes_per_head : pairs;
      if (fit < tail) fit = std::max(fit, std::min(tail, whole_l2));
    }
    fit = std::clamp<int64_t>(fit, 1, std::max<int64_t>(pairs, 1));
    int64_t const sections = (std::max<int64_t>(pairs, 1) + fit - 1) / fit;
    s.heads_per_section = int((std::max<int64_t>(pairs, 1) + sections - 1) / sections);
    s.total_tiles = num_m_blocks * num_heads * num_batch;
    return s;
  }

  FLASH3_HOST_DEVICE int num_tiles() const { return total_tiles; }

  FLASH3_HOST_DEVICE TileCoord tile(int index) const {
    int const tiles_per_section = num_m_blocks * heads_per_section;
    int const section = index / tiles_per_section;
    int const first_pair = section * heads_per_section;
    int const pairs = num_heads * num_batch;
    int const section_pairs = (pairs - first_pair < heads_per_section) ? pairs - first_pair : heads_per_section;
    int const within = index - section * tiles_per_section;
    int const pair = first_pair + within % section_pairs;
    TileCoord c;
    c.m_block = num_m_blocks - 1 - within / section_pairs;
    c.head = pair % num_heads;
    c.batch = pair / num_heads;
    return c;
  }
};

}  // namespace flash3
