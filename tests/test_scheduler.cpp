// The kernels' host-side arithmetic, checked on the CPU: the tile order and
// scheduler, the mask policy's key- and query-block ranges, the backward's
// workspace and last-wave split, the register splits.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/mask.h"
#include "common/registers.h"
#include "common/tile_scheduler.h"
#include "common/varlen_tiles.h"
#include "bwd/sequence.h"
#include "bwd/tail_split.h"
#include "bwd/workspace.h"
#include "fwd/block_range.h"
#include "fwd/tile_size.h"

namespace {

using flash3::BlockRange;
using flash3::MaskPolicy;
using flash3::QueryRange;
using flash3::TileCoord;
using flash3::TileOrder;

TEST(TileOrder, EveryTileExactlyOnce) {
  for (int m : {1, 3, 17}) {
    for (int h : {1, 5, 16}) {
      for (int b : {1, 2, 7}) {
        for (int64_t kv_bytes : {int64_t(1), int64_t(1) << 20, int64_t(1) << 40}) {
          auto s = TileOrder::make(m, h, b, kv_bytes, 50 << 20);
          ASSERT_EQ(s.num_tiles(), m * h * b);
          std::set<std::tuple<int, int, int>> seen;
          for (int t = 0; t < s.num_tiles(); ++t) {
            TileCoord c = s.tile(t);
            ASSERT_GE(c.m_block, 0);
            ASSERT_LT(c.m_block, m);
            ASSERT_GE(c.head, 0);
            ASSERT_LT(c.head, h);
            ASSERT_GE(c.batch, 0);
            ASSERT_LT(c.batch, b);
            ASSERT_TRUE(seen.insert({c.m_block, c.head, c.batch}).second) << "tile handed out twice";
          }
          EXPECT_EQ(int(seen.size()), m * h * b);
        }
      }
    }
  }
}

TEST(TileOrder, LongestFirstWithinEachSection) {
  // 4 heads of K/V fit the L2 budget: sections of 4 (batch, head) pairs.
  int64_t const l2 = 8 << 20;
  auto s = TileOrder::make(8, 6, 2, (l2 / 2) / 4, l2);
  ASSERT_EQ(s.heads_per_section, 4);
  int const pairs_in_first = 4;
  for (int t = 1; t < 8 * pairs_in_first; ++t) {
    // Within a section m_block never increases: the causal tiles seeing the
    // most keys (largest m_block) come first.
    EXPECT_LE(s.tile(t).m_block, s.tile(t - 1).m_block);
  }
  EXPECT_EQ(s.tile(0).m_block, 7);
  // Side by side tiles share an m_block and walk the section's heads.
  EXPECT_EQ(s.tile(1).m_block, 7);
  EXPECT_NE(s.tile(1).head, s.tile(0).head);
}

TEST(TileOrder, CausalSectionsLongEnoughForTheirLongestTile) {
  // 132 CTAs, 64 M-blocks: a section of three pairs would leave its longest
  // tile running nearly alone at the end; causal sections hold
  // ceil(4 * 132 / 64) = 9 pairs even though the L2 budget fits 3 ...
  int64_t const l2 = 50 << 20;
  EXPECT_EQ(TileOrder::make(64, 8, 2, 4 << 20, l2).heads_per_section, 6);
  EXPECT_EQ(TileOrder::make(64, 8, 2, 4 << 20, l2, /*causal=*/true, 132).heads_per_section, 8);  // 9, made equal
  // ... but no more than the whole L2 holds (6 pairs of 8 MB, not 9).
  int64_t const kv_bytes = 8 << 20;
  EXPECT_EQ(TileOrder::make(64, 8, 2, kv_bytes, l2).heads_per_section, 3);
  EXPECT_EQ(TileOrder::make(64, 8, 2, kv_bytes, l2, true, 132).heads_per_section, 6);
  // Never more than there are pairs; a budget that fits more stays.
  EXPECT_EQ(TileOrder::make(2, 8, 2, 1 << 20, l2, true, 132).heads_per_section, 16);
  EXPECT_EQ(TileOrder::make(64, 8, 2, 1 << 20, l2, true, 132).heads_per_section, 16);
}

TEST(TileOrder, SectionsOfEqualSize) {
  // 25 pairs, 10 fit the budget: three sections of 9, 9 and 7 pairs rather
  // than 10, 10 and 5.
  int64_t const l2 = 50 << 20;
  auto s = TileOrder::make(4, 25, 1, (l2 / 2) / 10, l2);
  EXPECT_EQ(s.heads_per_section, 9);
  EXPECT_EQ(s.tile(9 * 4).head, 9);  // the second section starts at pair 9
  EXPECT_EQ(s.tile(2 * 9 * 4 + 7 * 4 - 1).head, 24);
}

// Brute force: which key blocks hold a visible column, which a masked one.
// Tile m_block holds rows [m_block * bm - row_offset, + bm).
BlockRange brute_force(int m_block, int bm, int bn, int sq, int sk, bool causal, int row_offset = 0) {
  int n_blocks = (sk + bn - 1) / bn;
  int n_max = 0, n_mask = n_blocks;
  for (int n = 0; n < n_blocks; ++n) {
    bool any_visible = false, any_masked = false;
    for (int r = m_block * bm - row_offset; r < (m_block + 1) * bm - row_offset; ++r) {
      if (r < 0 || r >= sq) continue;  // rows outside the sequence are not stored
      for (int c = n * bn; c < (n + 1) * bn; ++c) {
        bool visible = c < sk && (!causal || c <= r + sk - sq);
        any_visible |= visible;
        any_masked |= !visible;
      }
    }
    if (any_visible) n_max = n + 1;
    if (any_masked) n_mask = std::min(n_mask, n);
  }
  return {0, n_max, n_mask};
}

// Every forward tile (block M, block N) the kernels are built with.
std::set<std::pair<int, int>> forward_tiles() {
  std::set<std::pair<int, int>> tiles;
  for (bool fp8 : {false, true}) {
    for (int d : {64, 96, 128, 192, 256}) {
      if (fp8 && (d == 96 || d == 192)) continue;
      flash3::fwd::TileSize const t = flash3::fwd::tile_size(d, d, fp8);
      tiles.insert({t.block_m, t.block_n});
    }
  }
  flash3::fwd::TileSize const pair = flash3::fwd::tile_size(192, 128, false);  // V's head dim of its own
  tiles.insert({pair.block_m, pair.block_n});
  return tiles;
}

// Every row offset a causal launch can start its first tile with (multiples
// of 64 below block M), and none.
std::vector<int> row_offsets(int bm) {
  std::vector<int> offsets;
  for (int off = 0; off < bm; off += 64) offsets.push_back(off);
  return offsets;
}

TEST(BlockRange, MatchesBruteForce) {
  for (bool causal : {false, true}) {
    for (auto const& [bm, bn] : forward_tiles()) {
      for (int off : row_offsets(bm)) {
        for (int sq : {1, 7, 128, 200, 513}) {
          for (int sk : {1, 7, 128, 200, 513, 1000}) {
            for (int m = 0; m * bm - off < sq; ++m) {
              std::string const where = std::to_string(causal) + " " + std::to_string(bm) + "x" + std::to_string(bn) +
                                        " " + std::to_string(sq) + " " + std::to_string(sk) + " " + std::to_string(m) +
                                        " offset " + std::to_string(off);
              BlockRange got = flash3::block_range(MaskPolicy{sq, sk, causal}, m, bm, bn, off);
              BlockRange want = brute_force(m, bm, bn, sq, sk, causal, off);
              ASSERT_EQ(got.n_block_max, want.n_block_max) << where;
              if (want.n_block_max > 0) {
                // Every block that holds a masked column must be masked; masking
                // a few more (clamped below by n_block_max) costs time, not correctness.
                ASSERT_LE(std::min(got.n_block_mask, got.n_block_max), std::min(want.n_block_mask, want.n_block_max))
                    << where;
                ASSERT_GE(got.n_block_mask, want.n_block_mask - 1) << where;
              }
            }
          }
        }
      }
    }
  }
}

// Each consumer warpgroup's own key range (Mainloop::mma passes the tile's
// blocks beyond it without GEMMs, and sits the tile out when it is empty):
// exactly the blocks holding a column its 64 rows see, never beyond the tile's.
TEST(BlockRange, WarpgroupRangeMatchesBruteForce) {
  for (bool causal : {false, true}) {
    for (auto const& [bm, bn] : forward_tiles()) {
      for (int off : row_offsets(bm)) {
        for (int sq : {1, 7, 64, 65, 200, 513}) {
          for (int sk : {1, 7, 128, 200, 513, 1000}) {
            for (int m = 0; m * bm - off < sq; ++m) {
              int const tile_max = flash3::block_range(MaskPolicy{sq, sk, causal}, m, bm, bn, off).n_block_max;
              for (int g = 0; g < bm / 64; ++g) {
                std::string const where = std::to_string(causal) + " " + std::to_string(bm) + "x" +
                                          std::to_string(bn) + " " + std::to_string(sq) + " " + std::to_string(sk) +
                                          " m " + std::to_string(m) + " group " + std::to_string(g) + " offset " +
                                          std::to_string(off);
                BlockRange const got = flash3::warpgroup_block_range(MaskPolicy{sq, sk, causal}, m, bm, g, bn, off);
                // Rows m * bm + 64 g - off ... + 63 are brute_force's 64-row block m * bm / 64 + g - off / 64
                // (empty when negative).
                int const block = m * bm / 64 + g - off / 64;
                int const want = block < 0 ? 0 : brute_force(block, 64, bn, sq, sk, causal).n_block_max;
                ASSERT_EQ(got.empty() ? 0 : got.n_block_max, want) << where;
                ASSERT_LE(want, tile_max) << where;
              }
            }
          }
        }
      }
    }
  }
}

// A causal launch's first tile offset: whole warpgroups, below block M, and
// the tiles then hold every row once, with the rows missing from a full tile
// at the top but for fewer than 64 at the bottom.
TEST(BlockRange, FirstTileRowOffset) {
  for (int bm : {128, 192}) {
    for (int sq = 1; sq <= 1000; ++sq) {
      int const off = flash3::first_tile_row_offset(sq, bm, true);
      ASSERT_EQ(off % 64, 0) << bm << " " << sq;
      ASSERT_GE(off, 0);
      ASSERT_LT(off, bm);
      int const tiles = (sq + off + bm - 1) / bm;
      int const past_end = tiles * bm - off - sq;  // the last tile's rows past the sequence
      ASSERT_GE(past_end, 0) << bm << " " << sq;
      ASSERT_LT(past_end, 64) << bm << " " << sq << ": the last tile lacks whole warpgroups";
      EXPECT_EQ(flash3::first_tile_row_offset(sq, bm, false), 0);
    }
  }
  EXPECT_EQ(flash3::first_tile_row_offset(1024, 192, true), 128);  // rows 960-1023 would have been the last tile
  EXPECT_EQ(flash3::first_tile_row_offset(2048, 192, true), 64);
  EXPECT_EQ(flash3::first_tile_row_offset(1152, 192, true), 0);
}

// The backward's query blocks for a key block, against a scan of every
// (query, key) pair.
TEST(QueryRange, MatchesBruteForce) {
  // The backward's tiles: (64, 128), (128, 128) at head dim 64, (64, 64) above 128.
  for (auto const [bm, bn] : {std::pair{64, 128}, std::pair{128, 128}, std::pair{64, 64}}) {
    for (bool causal : {false, true}) {
      for (int sq : {1, 7, 64, 200, 513}) {
        for (int sk : {1, 7, 128, 200, 513, 1000}) {
          for (int n = 0; n * bn < sk; ++n) {
            int const m_blocks = flash3::div_up(sq, bm);
            flash3::QueryRange const got = MaskPolicy{sq, sk, causal}.query_blocks(n, bm, bn, m_blocks);
            int lo = -1, hi = -1, first_unmasked = -1;
            for (int m = 0; m * bm < sq; ++m) {
              bool any_visible = false, any_masked = false;
              for (int i = m * bm; i < std::min(sq, (m + 1) * bm); ++i) {
                for (int j = n * bn; j < (n + 1) * bn; ++j) {
                  bool const visible = j < sk && (!causal || j <= i + sk - sq);
                  any_visible |= visible;
                  any_masked |= !visible;
                }
              }
              if (any_visible && lo < 0) lo = m;
              if (any_visible) hi = m + 1;
              if (any_visible && !any_masked && first_unmasked < 0) first_unmasked = m;
            }
            std::string const where = std::to_string(bm) + "x" + std::to_string(bn) + " " + std::to_string(causal) +
                                      " sq " + std::to_string(sq) + " sk " + std::to_string(sk) + " n " +
                                      std::to_string(n);
            for (int m = 0; m * bm < sq; ++m) {
              // The last key block query block m sees: a visit of (m, n) happens iff n <= it.
              int const last = MaskPolicy{sq, sk, causal}.last_key_block(m, bm, bn);
              flash3::QueryRange const r = MaskPolicy{sq, sk, causal}.query_blocks(n, bm, bn, m_blocks);
              ASSERT_EQ(n <= last, m >= r.m_block_min && m < r.m_block_max) << where << " m " << m;
            }
            if (lo < 0) {
              ASSERT_TRUE(got.empty()) << where;
              continue;
            }
            ASSERT_EQ(got.m_block_min, lo) << where;
            ASSERT_EQ(got.m_block_max, hi) << where;
            // Blocks below m_block_mask get the causal mask (the last, partial
            // key block always does); every block with a masked pair must.
            bool const partial = (n + 1) * bn > sk;
            if (!partial && first_unmasked >= 0) ASSERT_LE(got.m_block_mask, first_unmasked) << where;
            for (int m = lo; m < hi && !partial; ++m) {
              bool masked_pair = false;
              for (int i = m * bm; i < std::min(sq, (m + 1) * bm); ++i) {
                for (int j = n * bn; j < (n + 1) * bn; ++j) masked_pair |= causal && j > i + sk - sq;
              }
              if (masked_pair) ASSERT_LT(m, got.m_block_mask) << where << " m " << m;
            }
          }
        }
      }
    }
  }
}

// The backward's query blocks are 128 rows at head dim 64, 64 above; the
// workspace (dQ accumulator, LSE, D) is padded to whole blocks of that size.
TEST(BackwardWorkspace, QueryBlocksFollowTheHeadDim) {
  for (int d : {64, 96, 128, 192, 256}) {
    int const bm = flash3::bwd::bwd_block_m(d);
    EXPECT_EQ(bm, d == 64 ? 128 : 64) << d;
    flash3::bwd::WorkspaceLayout const w = flash3::bwd::workspace_layout(2, 200, 300, 8, 2, d, d, false, false);
    EXPECT_EQ(w.m_blocks, flash3::div_up(200, bm)) << d;
    // The dQ accumulator holds every padded row's d floats, before LSE and D.
    EXPECT_GE(w.lse_log2 - w.dq_accum, size_t(2) * 8 * w.m_blocks * bm * d * sizeof(float)) << d;
    // The last wave's split tiles: without the mask, nor deterministic mode,
    // up to kMaxSplitTiles (here 2 x 8 heads x div_up(300, block N) tiles).
    int const tiles = 2 * 8 * flash3::div_up(300, flash3::bwd::bwd_block_n(d));
    EXPECT_EQ(w.split_tiles, std::min(tiles, flash3::bwd::kMaxSplitTiles)) << d;
    EXPECT_GE(w.bytes - w.split_sums, size_t(w.split_tiles) * flash3::bwd::split_tile_bytes(d, d)) << d;
    EXPECT_EQ(flash3::bwd::workspace_layout(2, 200, 300, 8, 2, d, d, true, false).split_tiles, 0) << d;
    EXPECT_EQ(flash3::bwd::workspace_layout(2, 200, 300, 8, 2, d, d, false, true).split_tiles, 0) << d;
  }
}

// V's head dim of its own (192 / 128): the dQ accumulator and dK's per-head
// sums have Q/K's 192 columns, dV's V's 128, and a split tile's sums both.
TEST(BackwardWorkspace, ValueHeadDimSizesTheDvSums) {
  using flash3::bwd::workspace_layout;
  flash3::bwd::WorkspaceLayout const w = workspace_layout(2, 200, 300, 8, 2, 192, 128, false, false);
  flash3::bwd::WorkspaceLayout const same = workspace_layout(2, 200, 300, 8, 2, 192, 192, false, false);
  EXPECT_EQ(w.lse_log2 - w.dq_accum, same.lse_log2 - same.dq_accum);
  EXPECT_EQ(w.dv_accum - w.dk_accum, size_t(2) * 8 * 300 * 192 * sizeof(float));
  EXPECT_EQ(w.ready - w.dv_accum, size_t(2) * 8 * 300 * 128 * sizeof(float));
  EXPECT_EQ(flash3::bwd::split_tile_bytes(192, 128), size_t(64) * (192 + 128) * sizeof(float));
  EXPECT_EQ(w.split_tiles, same.split_tiles);
  EXPECT_GE(w.bytes - w.split_sums, size_t(w.split_tiles) * flash3::bwd::split_tile_bytes(192, 128));
  EXPECT_LT(w.bytes, same.bytes);
}

// The paper's non-causal shapes on 132 SMs: head dim 64 (64 query blocks of
// 128 rows at 8k) has 4096 CTAs, 4 in the 32nd wave; 128 and 256 have 2048,
// 68 in the 16th. Those tiles are split, the others not.
TEST(TailSplit, PlanForThePaperShapes) {
  using flash3::bwd::plan_tail_split;
  using flash3::bwd::TailSplit;
  TailSplit const d64 = plan_tail_split(4096, 132, 64, flash3::bwd::kMaxSplitTiles);
  EXPECT_EQ(d64.split_tiles, 4);
  EXPECT_EQ(d64.parts, flash3::bwd::kMaxTailParts);
  EXPECT_EQ(d64.ctas(4096), 4096 + 4 * 15);
  TailSplit const d128 = plan_tail_split(2048, 132, 128, flash3::bwd::kMaxSplitTiles);
  EXPECT_EQ(d128.split_tiles, 68);
  EXPECT_EQ(d128.parts, 5);  // 340 CTAs of 26 blocks: 3 rounds, 84 blocks' time against 130
  // Nothing to split: whole waves, a single wave, more leftover tiles than
  // the workspace holds, or a split that would end no sooner.
  EXPECT_EQ(plan_tail_split(132 * 8, 132, 64, 132).split_tiles, 0);
  EXPECT_EQ(plan_tail_split(100, 132, 64, 132).split_tiles, 0);
  EXPECT_EQ(plan_tail_split(132 + 20, 132, 64, 10).split_tiles, 0);
  EXPECT_EQ(plan_tail_split(132 + 131, 132, 2, 132).split_tiles, 0);
}

// Every query block of every tile is walked by exactly one CTA, the split
// tiles are the last, and each split tile's parts share one split index.
TEST(TailSplit, PartsCoverEachTileOnce) {
  using namespace flash3::bwd;
  int splits = 0;  // launches that split, so that the coverage below is not only of whole tiles
  for (int slots : {114, 132}) {
    for (int tiles : {133, 150, 263, 300, 4096}) {
      for (int m_blocks : {1, 2, 5, 64, 129}) {
        TailSplit const split = plan_tail_split(tiles, slots, m_blocks, kMaxSplitTiles);
        std::string const where = std::to_string(slots) + " slots, " + std::to_string(tiles) + " tiles, " +
                                  std::to_string(m_blocks) + " blocks";
        ASSERT_LE(split.parts, std::max(m_blocks, 1)) << where;
        splits += split.split_tiles > 0;
        std::vector<std::vector<int>> visits(tiles, std::vector<int>(m_blocks, 0));
        std::vector<int> index_of(tiles, -2);
        for (int cta = 0; cta < split.ctas(tiles); ++cta) {
          TilePart const t = tile_part(cta, tiles, split);
          ASSERT_TRUE(t.tile >= 0 && t.tile < tiles) << where << " cta " << cta;
          bool const is_split = t.tile >= tiles - split.split_tiles;
          ASSERT_EQ(t.parts, is_split ? split.parts : 1) << where << " cta " << cta;
          ASSERT_EQ(t.split_index, is_split ? t.tile - (tiles - split.split_tiles) : -1) << where;
          if (index_of[t.tile] == -2) index_of[t.tile] = t.split_index;
          ASSERT_EQ(index_of[t.tile], t.split_index) << where;
          QueryRange const r = part_range(QueryRange{0, m_blocks, 0}, t.part, t.parts);
          for (int m = r.m_block_min; m < r.m_block_max; ++m) ++visits[t.tile][m];
        }
        for (int tile = 0; tile < tiles; ++tile) {
          for (int m = 0; m < m_blocks; ++m) ASSERT_EQ(visits[tile][m], 1) << where << " tile " << tile << " m " << m;
        }
      }
    }
  }
  EXPECT_GE(splits, 10);
}

// setmaxnreg can only move registers within the CTA's launch allocation:
// 64K / threads, rounded down to 8 (168 for 384 threads, 128 for 512).
TEST(RegisterSplit, FitsTheLaunchAllocation) {
  EXPECT_TRUE(flash3::fits_launch_registers(384, 128, 24, 240));   // 2 consumer warpgroups
  EXPECT_TRUE(flash3::fits_launch_registers(384, 128, 40, 232));
  EXPECT_FALSE(flash3::fits_launch_registers(384, 128, 32, 240));  // hung on the GPU
  EXPECT_TRUE(flash3::fits_launch_registers(512, 128, 32, 160));   // 3 consumer warpgroups
  EXPECT_FALSE(flash3::fits_launch_registers(512, 128, 40, 160));
}

// FP8's scale blocks are the kernel's tiles (both masks have the same).
TEST(Fp8ScaleBlocks, WholeTiles) {
  for (int d : {64, 128, 256}) {
    flash3::fwd::Fp8ScaleBlocks const b = flash3::fwd::fp8_scale_blocks(d);
    flash3::fwd::TileSize const t = flash3::fwd::tile_size(d, d, true);
    EXPECT_EQ(b.q, t.block_m) << d;
    EXPECT_EQ(b.kv % t.block_n, 0) << d;
  }
}

// The policy's element rule against its definition: row i sees column j iff
// j < seqlen_k and, causal, j <= i + seqlen_k - seqlen_q; rows above and
// below the sequence included (the forward's tiles reach past it).
TEST(MaskPolicy, ColumnLimitMatchesDefinition) {
  for (bool causal : {false, true}) {
    for (int sq : {1, 7, 200}) {
      for (int sk : {1, 7, 200, 513}) {
        MaskPolicy const mask{sq, sk, causal};
        for (int i = -70; i < sq + 70; ++i) {
          for (int j = 0; j < sk + 70; ++j) {
            bool const visible = j < sk && (!causal || j <= i + sk - sq);
            ASSERT_EQ(j < mask.col_limit(i), visible) << causal << " " << sq << " " << sk << " (" << i << ", " << j << ")";
          }
        }
      }
    }
  }
}

// ---- sliding windows ----------------------------------------------------------

// Windows (left, right) with every bound absent, zero, inside a block, and
// past the sequence; a causal one has right 0.
struct Window {
  int left, right;
  bool causal;
};
std::vector<Window> windows() {
  return {{-1, -1, false}, {-1, 0, false}, {-1, -1, true}, {0, 0, false}, {3, -1, false}, {0, 5, false},
          {17, 3, false},  {130, 0, false}, {300, -1, false}, {2, 300, false}, {10, -1, true}, {64, 64, false},
          {1000, 1000, false}};
}

MaskPolicy window_policy(int sq, int sk, Window w) { return MaskPolicy{sq, sk, w.causal, w.left, w.right}; }

// Row i sees column j: the definition, written out.
bool sees(int i, int j, int sq, int sk, Window w) {
  int const g = sk - sq;
  int const right = w.causal ? 0 : w.right;
  return j >= 0 && j < sk && (right < 0 || j <= i + g + right) && (w.left < 0 || j >= i + g - w.left);
}

std::string window_name(Window w, int sq, int sk) {
  return "window (" + std::to_string(w.left) + ", " + std::to_string(w.right) + ")" + (w.causal ? " causal" : "") +
         " sq " + std::to_string(sq) + " sk " + std::to_string(sk);
}

TEST(MaskPolicy, WindowColumnsMatchDefinition) {
  for (Window w : windows()) {
    for (int sq : {1, 7, 200}) {
      for (int sk : {1, 7, 200, 513}) {
        MaskPolicy const mask = window_policy(sq, sk, w);
        for (int i = -70; i < sq + 70; ++i) {
          for (int j = 0; j < sk + 70; ++j) {
            ASSERT_EQ(j >= mask.col_start(i) && j < mask.col_limit(i), sees(i, j, sq, sk, w))
                << window_name(w, sq, sk) << " (" << i << ", " << j << ")";
          }
        }
      }
    }
  }
}

// The forward's key blocks under a window: exactly the blocks holding a
// visible column, and every block holding a masked one masked (above
// n_block_mask or below key_blocks_masked_below).
TEST(BlockRange, WindowMatchesBruteForce) {
  for (Window w : windows()) {
    for (auto const& [bm, bn] : forward_tiles()) {
      for (int off : row_offsets(bm)) {
        for (int sq : {1, 7, 200, 513}) {
          for (int sk : {1, 7, 200, 513, 1000}) {
            MaskPolicy const mask = window_policy(sq, sk, w);
            for (int m = 0; m * bm - off < sq; ++m) {
              std::string const where = window_name(w, sq, sk) + " tile " + std::to_string(bm) + "x" +
                                        std::to_string(bn) + " m " + std::to_string(m) + " offset " +
                                        std::to_string(off);
              BlockRange const got = flash3::block_range(mask, m, bm, bn, off);
              int const masked_below = mask.key_blocks_masked_below((m + 1) * bm - off - 1, bn);
              int lo = -1, hi = 0;
              for (int n = 0; n * bn < sk; ++n) {
                bool any_visible = false, any_masked = false;
                for (int r = std::max(0, m * bm - off); r < std::min(sq, (m + 1) * bm - off); ++r) {
                  for (int c = n * bn; c < (n + 1) * bn; ++c) {
                    bool const visible = sees(r, c, sq, sk, w);
                    any_visible |= visible;
                    any_masked |= !visible;
                  }
                }
                if (any_visible && lo < 0) lo = n;
                if (any_visible) hi = n + 1;
                bool const masked = n >= got.n_block_mask || n < masked_below;
                if (any_visible && any_masked) ASSERT_TRUE(masked) << where << " n " << n;
              }
              if (lo < 0) {
                ASSERT_TRUE(got.empty()) << where;
                continue;
              }
              ASSERT_EQ(got.n_block_min, lo) << where;
              ASSERT_EQ(got.n_block_max, hi) << where;
            }
          }
        }
      }
    }
  }
}

// The backward's query blocks under a window: exactly those holding a row
// that sees a key of the block, every one holding a masked pair inside the
// sequence masked (below m_block_mask or from query_blocks_masked_from); and the
// key blocks a query block sees, first to last, are the ones whose query
// range holds it.
TEST(QueryRange, WindowMatchesBruteForce) {
  for (Window w : windows()) {
    for (auto const [bm, bn] : {std::pair{64, 128}, std::pair{128, 128}, std::pair{64, 64}}) {
      for (int sq : {1, 7, 64, 200, 513}) {
        for (int sk : {1, 7, 128, 200, 513, 1000}) {
          MaskPolicy const mask = window_policy(sq, sk, w);
          int const m_blocks = flash3::div_up(sq, bm);
          for (int n = 0; n * bn < sk; ++n) {
            std::string const where = window_name(w, sq, sk) + " tile " + std::to_string(bm) + "x" +
                                      std::to_string(bn) + " n " + std::to_string(n);
            flash3::QueryRange const got = mask.query_blocks(n, bm, bn, m_blocks);
            int const masked_from = mask.query_blocks_masked_from(got, n, bm, bn);
            int lo = -1, hi = 0;
            for (int m = 0; m * bm < sq; ++m) {
              bool any_visible = false, masked_pair = false;
              for (int i = m * bm; i < std::min(sq, (m + 1) * bm); ++i) {
                for (int j = n * bn; j < std::min(sk, (n + 1) * bn); ++j) {
                  bool const visible = sees(i, j, sq, sk, w);
                  any_visible |= visible;
                  masked_pair |= !visible;
                }
              }
              if (any_visible && lo < 0) lo = m;
              if (any_visible) hi = m + 1;
              bool const masked = m < got.m_block_mask || m >= masked_from;
              if (any_visible && masked_pair) ASSERT_TRUE(masked) << where << " m " << m;
              int const first = mask.first_key_block(m, bm, bn), last = mask.last_key_block(m, bm, bn);
              ASSERT_EQ(any_visible, n >= first && n <= last) << where << " m " << m;
            }
            if (lo < 0) {
              ASSERT_TRUE(got.empty()) << where;
              continue;
            }
            ASSERT_EQ(got.m_block_min, lo) << where;
            ASSERT_EQ(got.m_block_max, hi) << where;
            ASSERT_LE(got.m_block_mask, masked_from) << where;
          }
        }
      }
    }
  }
}

// The forward's scheduler: a persistent grid is one CTA per SM, capped by the
// tiles; without persistence a CTA per tile; a counter only where CTAs claim
// tiles (more tiles than CTAs), so no CUDA call is made otherwise.
TEST(PersistentTileScheduler, GridAndCounter) {
  flash3::DeviceInfo device;
  device.num_sms = 132;
  device.l2_bytes = 50 << 20;
  for (bool persistent : {true, false}) {
    flash3::PersistentTileScheduler::Launch launch;
    ASSERT_EQ(launch.prepare(4, 8, 2, 1 << 20, true, persistent, device, nullptr, nullptr), cudaSuccess);
    EXPECT_EQ(launch.grid(), 64);
    EXPECT_EQ(launch.params().counter, nullptr);
    EXPECT_EQ(launch.params().order.num_tiles(), 64);
    EXPECT_EQ(launch.finish(nullptr), cudaSuccess);
  }
  flash3::PersistentTileScheduler::Launch one_shot;
  ASSERT_EQ(one_shot.prepare(16, 16, 4, 1 << 20, false, false, device, nullptr, nullptr), cudaSuccess);
  EXPECT_EQ(one_shot.grid(), 1024);
  EXPECT_EQ(one_shot.params().counter, nullptr);
  // More tiles than SMs: one CTA per SM (the counter needs a device).
  flash3::PersistentTileScheduler::Launch persistent;
  persistent.prepare(16, 16, 4, 1 << 20, false, true, device, nullptr, nullptr);
  EXPECT_EQ(persistent.grid(), 132);
  persistent.finish(nullptr);
}

// A caller's counter (ForwardArgs::tile_counter) replaces flash3's where CTAs
// claim tiles, with no CUDA call, and is not used where they do not.
TEST(PersistentTileScheduler, GivenCounter) {
  flash3::DeviceInfo device;
  device.num_sms = 132;
  device.l2_bytes = 50 << 20;
  int* const given = reinterpret_cast<int*>(0x1000);
  flash3::PersistentTileScheduler::Launch claims;
  ASSERT_EQ(claims.prepare(16, 16, 4, 1 << 20, false, true, device, given, nullptr), cudaSuccess);
  EXPECT_EQ(claims.grid(), 132);
  EXPECT_EQ(claims.params().counter, given);
  EXPECT_EQ(claims.finish(nullptr), cudaSuccess);
  flash3::PersistentTileScheduler::Launch one_wave;
  ASSERT_EQ(one_wave.prepare(4, 8, 2, 1 << 20, true, true, device, given, nullptr), cudaSuccess);
  EXPECT_EQ(one_wave.params().counter, nullptr);
  EXPECT_EQ(one_wave.finish(nullptr), cudaSuccess);
}

// Variable-length batches: packed sequences of random lengths (empty ones,
// ones shorter than a tile, seqused below the packed length), the table
// built as one device thread builds it.
struct Varlen {
  std::vector<int32_t> cu_q, cu_k, used_q, used_k;
  std::vector<int> workspace;
  flash3::VarlenTileOrder order;

  Varlen(std::vector<int> const& len_q, std::vector<int> const& len_k, int heads, bool seqused, uint32_t seed = 1) {
    int const batch = int(len_q.size());
    cu_q = {0};
    cu_k = {0};
    std::mt19937 rng(seed);
    for (int b = 0; b < batch; ++b) {
      int const pad = seqused ? int(rng() % 50) : 0;  // packed rows past the used ones
      cu_q.push_back(cu_q.back() + len_q[b] + pad);
      cu_k.push_back(cu_k.back() + len_k[b] + pad);
      used_q.push_back(len_q[b]);
      used_k.push_back(len_k[b]);
    }
    workspace.assign(flash3::VarlenTileTable::table_ints(batch), -7);
    order.table = flash3::VarlenTileTable::in(workspace.data(), batch);
    order.lengths = {cu_q.data(), cu_k.data(), seqused ? used_q.data() : nullptr, seqused ? used_k.data() : nullptr};
    order.batch = batch;
    order.num_heads = heads;
    order.block_m = 128;
    order.block_n = 176;
    // An L2 that holds every head of these sequences: one section each.
    order.kv_bytes_per_key = 512;
    order.l2_bytes = int64_t(50) << 20;
    order.build_on_host();
  }
};

std::vector<int> random_lengths(std::mt19937& rng, int batch) {
  std::vector<int> lengths;
  for (int b = 0; b < batch; ++b) {
    int const kind = int(rng() % 4);
    lengths.push_back(kind == 0 ? 0 : kind == 1 ? int(rng() % 130) : int(rng() % 5000));
  }
  return lengths;
}

TEST(VarlenTileOrder, EveryTileOfEverySequenceOnce) {
  std::mt19937 rng(2026);
  for (int trial = 0; trial < 40; ++trial) {
    int const batch = 1 + int(rng() % 70), heads = 1 + int(rng() % 3);
    std::vector<int> const len_q = random_lengths(rng, batch), len_k = random_lengths(rng, batch);
    Varlen v(len_q, len_k, heads, trial % 2 == 1, trial);
    std::set<std::tuple<int, int, int>> want, got;
    for (int b = 0; b < batch; ++b) {
      for (int m = 0; m < (len_q[b] + 127) / 128; ++m) {
        for (int h = 0; h < heads; ++h) want.insert({b, h, m});
      }
    }
    ASSERT_EQ(v.order.num_tiles(), int(want.size()));
    for (int i = 0; i < v.order.num_tiles(); ++i) {
      TileCoord const c = v.order.tile(i);
      EXPECT_TRUE(got.insert({c.batch, c.head, c.m_block}).second) << "tile " << i << " twice";
    }
    EXPECT_EQ(got, want);
  }
}

TEST(VarlenTileOrder, SequencesWithMoreKeyBlocksFirst) {
  std::mt19937 rng(7);
  std::vector<int> const len_q = random_lengths(rng, 200), len_k = random_lengths(rng, 200);
  Varlen v(len_q, len_k, 2, false);
  int last_blocks = 1 << 30, last_batch = -1, last_m = 0;
  for (int i = 0; i < v.order.num_tiles(); ++i) {
    TileCoord const c = v.order.tile(i);
    int const blocks = (len_k[c.batch] + 175) / 176;
    if (c.batch != last_batch) {
      // A new sequence: no more key blocks than the last, and ties in index order.
      EXPECT_TRUE(blocks < last_blocks || (blocks == last_blocks && c.batch > last_batch)) << "tile " << i;
      EXPECT_EQ(c.m_block, (len_q[c.batch] + 127) / 128 - 1) << "a sequence starts at its last query block";
      last_blocks = blocks;
      last_batch = c.batch;
    } else {
      EXPECT_LE(c.m_block, last_m) << "query blocks from the last down";
    }
    last_m = c.m_block;
  }
}

// Sequences longer than kMaxKeyBlocks key blocks share the first slots.
TEST(VarlenTileOrder, LongSequencesShareTheTopCount) {
  int const top = flash3::VarlenTileOrder::kMaxKeyBlocks * 176;
  Varlen v({300, 200, 100}, {top + 5000, 1000, top + 1}, 1, false);
  EXPECT_EQ(v.workspace[0], 0);
  EXPECT_EQ(v.workspace[1], 2);
  EXPECT_EQ(v.workspace[2], 1);
  EXPECT_EQ(v.order.num_tiles(), 3 + 1 + 2);
}

// Within a sequence, the tiles a fixed-length batch of that sequence alone
// has, in its order (TileOrder: L2 sections of heads, causal longest first).
TEST(VarlenTileOrder, EachSequenceInItsTileOrder) {
  for (bool causal : {false, true}) {
    Varlen v({5000, 700, 3000}, {9000, 700, 3000}, 16, false);
    v.order.causal = causal;
    v.order.kv_bytes_per_key = 512;
    v.order.l2_bytes = int64_t(4) << 20;  // a few heads a section
    v.order.num_ctas = 132;
    v.order.build_on_host();
    int i = 0;
    for (int b : {0, 2, 1}) {
      int const len_q = b == 0 ? 5000 : b == 1 ? 700 : 3000, len_k = b == 0 ? 9000 : len_q;
      TileOrder const alone = TileOrder::make((len_q + 127) / 128, 16, 1, 512 * int64_t(len_k), int64_t(4) << 20,
                                              causal, 132);
      EXPECT_GT(alone.heads_per_section, 0);
      for (int t = 0; t < alone.num_tiles(); ++t, ++i) {
        TileCoord const want = alone.tile(t), got = v.order.tile(i);
        ASSERT_EQ(got.batch, b) << "tile " << i;
        ASSERT_EQ(got.head, want.head) << "tile " << i;
        ASSERT_EQ(got.m_block, want.m_block) << "tile " << i;
      }
    }
    EXPECT_EQ(i, v.order.num_tiles());
  }
}

TEST(VarlenTileOrder, EmptyBatchesAndSequences) {
  Varlen none({0, 0, 0}, {10, 0, 500}, 4, false);
  EXPECT_EQ(none.order.num_tiles(), 0);
  Varlen keyless({1, 300}, {0, 0}, 2, true);
  EXPECT_EQ(keyless.order.num_tiles(), 2 * (1 + 3));
}

// Packed sequences' workspace rows (bwd/workspace.h): each sequence's
// blocks start past the previous sequence's, all within the bound the host
// computes from total_q and the batch, and each block maps back to its
// sequence (the preprocess's search, bwd/sequence.h).
TEST(BackwardVarlen, WorkspaceBlocksOfEachSequence) {
  std::mt19937 rng(34);
  for (int trial = 0; trial < 300; ++trial) {
    int const block_m = trial % 2 ? 64 : 128;
    int const batch = 1 + int(rng() % 12);
    std::vector<int32_t> cu{0};
    for (int b = 0; b < batch; ++b) {
      int const kind = int(rng() % 4);  // empty, shorter than a block, a few blocks, a multiple of one
      int const len = kind == 0 ? 0 : kind == 1 ? 1 + int(rng() % (block_m - 1)) : kind == 2 ? int(rng() % 700)
                                                                                             : block_m * int(1 + rng() % 4);
      cu.push_back(cu.back() + len);
    }
    int const total_q = cu.back() + int(rng() % 3);  // rows past the last sequence too
    flash3::SequenceLengths const lengths{cu.data(), cu.data(), nullptr, nullptr};
    int64_t const blocks = flash3::bwd::packed_row_blocks(total_q, batch, block_m);
    EXPECT_LE(blocks * block_m, int64_t(total_q) + int64_t(batch) * block_m);
    int64_t end = 0;  // one past the previous sequence's last block
    for (int b = 0; b < batch; ++b) {
      int64_t const first = flash3::bwd::packed_first_block(cu[b], b, block_m);
      int64_t const own = flash3::div_up(cu[b + 1] - cu[b], block_m);
      EXPECT_GE(first, end) << "sequence " << b;
      end = first + own;
      for (int64_t block = first; block < end; ++block) {
        EXPECT_EQ(flash3::bwd::sequence_of_block(lengths, batch, int(block), block_m), b) << "block " << block;
        // The preprocess's walk from an earlier block's sequence finds the same.
        int const earlier = int(std::max<int64_t>(0, block - int64_t(rng() % 4)));
        int const from = flash3::bwd::sequence_of_block(lengths, batch, earlier, block_m);
        EXPECT_EQ(flash3::bwd::advance_to_block(lengths, batch, from, int(block), block_m), b) << "block " << block;
      }
    }
    EXPECT_LE(end, blocks);
  }
}

// The preprocess's ready counters (bwd/workspace.h): one per head counting
// its items with fixed-length batches; one flag per item of a head's rows
// with packed sequences, each within the workspace's counters, so that a
// CTA waits for its own sequence's rows only.
TEST(BackwardVarlen, ReadyCountersPerItem) {
  using namespace flash3::bwd;
  for (int d : {64, 128, 256}) {
    int64_t const heads = 6, total_q = 3000, batch = 7;
    WorkspaceLayout const w = packed_workspace_layout(batch, total_q, 2000, heads, 2, d, d, false);
    int64_t const rows = w.m_blocks * bwd_block_m(d);
    int64_t const items = preprocess_items_per_head(rows);
    EXPECT_GE(w.dq_arrivals - w.ready, size_t(heads * items) * sizeof(int)) << d;
    for (int64_t head = 0; head < heads; ++head) {
      for (int64_t row = 0; row < rows; row += 37) {
        ReadyCounter const c = ready_counter(true, head, row, items);
        EXPECT_EQ(c.index, head * items + row / kPreprocessItemRows) << d;
        EXPECT_EQ(c.count, 1);
      }
    }
    ReadyCounter const fixed = ready_counter(false, 5, 1000, items);
    EXPECT_EQ(fixed.index, 5);
    EXPECT_EQ(fixed.count, items);
  }
}

// The packed preprocess's order (bwd/sequence.h's packed_item): every
// (head, chunk) once, and each (sequence, head)'s chunks all before any item
// of a later sequence's run, the order in which the main kernel's CTAs come.
TEST(BackwardVarlen, PreprocessItemsInTheMainKernelsOrder) {
  using namespace flash3::bwd;
  std::mt19937 rng(35);
  for (int trial = 0; trial < 200; ++trial) {
    int const block_m = trial % 2 ? 64 : 128;
    int const batch = 1 + int(rng() % 9), heads = 1 + int(rng() % 5);
    std::vector<int32_t> cu{0};
    for (int b = 0; b < batch; ++b) cu.push_back(cu.back() + int(rng() % 4 == 0 ? 0 : rng() % 1500));
    flash3::SequenceLengths const lengths{cu.data(), cu.data(), nullptr, nullptr};
    int64_t const rows = packed_row_blocks(cu.back(), batch, block_m) * block_m;
    int const items = int(preprocess_items_per_head(rows));
    std::vector<int> position(size_t(heads) * items, -1);  // of (head, chunk)
    std::vector<int> run_of(size_t(heads) * items);  // the sequence whose run holds item i
    for (int i = 0; i < heads * items; ++i) {
      PackedItem const at = packed_item(lengths, batch, heads, items, i, block_m);
      ASSERT_TRUE(at.head >= 0 && at.head < heads && at.chunk >= 0 && at.chunk < items) << i;
      ASSERT_EQ(position[size_t(at.head) * items + at.chunk], -1) << "twice: item " << i;
      position[size_t(at.head) * items + at.chunk] = i;
      run_of[i] = sequence_of_block(lengths, batch, at.chunk * (kPreprocessItemRows / block_m), block_m);
      if (i > 0) ASSERT_GE(run_of[i], run_of[i - 1]) << i;
    }
    for (int b = 0; b < batch; ++b) {
      int64_t const first = packed_first_block(cu[b], b, block_m), blocks = flash3::div_up(cu[b + 1] - cu[b], block_m);
      if (blocks == 0) continue;
      int first_later = heads * items;  // the first item of a later sequence's run
      for (int i = 0; i < heads * items; ++i) {
        if (run_of[i] > b) {
          first_later = i;
          break;
        }
      }
      for (int h = 0; h < heads; ++h) {
        for (int64_t block = first; block < first + blocks; ++block) {
          int64_t const chunk = block * block_m / kPreprocessItemRows;
          EXPECT_LT(position[size_t(h) * items + chunk], first_later) << "sequence " << b << " head " << h;
        }
      }
    }
  }
}

}  // namespace
