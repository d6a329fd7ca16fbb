// The KV cache's host side, without a GPU: validate()'s checks of
// ForwardArgs::kv_cache, the key map, how a tile's key blocks are split, the
// split scheduler's tiles, num_splits = 0's choice, packed GQA's view, and
// the call's plan and workspace.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <set>
#include <string>
#include <tuple>
#include <utility>

#include "common/kv_cache.h"
#include "common/mask.h"
#include "common/split_scheduler.h"
#include "expect_invalid.h"
#include "flash3/flash3.h"
#include "fwd/kv_split.h"
#include "fwd/kv_workspace.h"
#include "fwd/pack_gqa.h"
#include "fwd/packed_rows.h"
#include "valid_args.h"

namespace {

using flash3::BlockRange;
using flash3::ForwardArgs;
using flash3::Status;

using flash3::testing::valid_cache_args;

void expect_invalid(std::function<void(ForwardArgs&)> const& edit, std::string const& names) {
  flash3::testing::expect_invalid_args(valid_cache_args(), edit, names);
}

TEST(KvCacheValidation, ValidArgumentsPass) {
  EXPECT_TRUE(flash3::validate(valid_cache_args()).ok());
  ForwardArgs a = valid_cache_args();
  a.kv_cache.batch_idx = reinterpret_cast<const int32_t*>(0x81000);
  a.kv_cache.leftpad = reinterpret_cast<const int32_t*>(0x82000);
  a.kv_cache.batch_cache = 1;  // entries are picked by batch_idx
  a.causal = true;
  a.window_left = 100;
  a.softcap = 30.f;
  a.seqlen_q = 1;
  a.kv_cache.num_splits = 128;
  EXPECT_TRUE(flash3::validate(a).ok());
}

TEST(KvCacheValidation, FieldsWithoutACache) {
  expect_invalid([](ForwardArgs& a) { a.kv_cache.seqlens = nullptr; a.kv_cache.batch_cache = 0; a.kv_cache.num_splits = 1;
                                      a.kv_cache.leftpad = reinterpret_cast<const int32_t*>(0x82000); },
                 "kv_cache.seqlens");
  expect_invalid([](ForwardArgs& a) { a.kv_cache.seqlens = nullptr; a.kv_cache.num_splits = 1; }, "kv_cache.batch_cache");
  expect_invalid([](ForwardArgs& a) { a.kv_cache.seqlens = nullptr; a.kv_cache.batch_cache = 0; }, "kv_cache.num_splits");
}

TEST(KvCacheValidation, CacheFields) {
  expect_invalid([](ForwardArgs& a) { a.kv_cache.seqlens = reinterpret_cast<const int32_t*>(0x80002); },
                 "kv_cache.seqlens");
  expect_invalid([](ForwardArgs& a) { a.kv_cache.batch_idx = reinterpret_cast<const int32_t*>(0x81001); },
                 "kv_cache.batch_idx");
  expect_invalid([](ForwardArgs& a) { a.kv_cache.leftpad = reinterpret_cast<const int32_t*>(0x82003); },
                 "kv_cache.leftpad");
  expect_invalid([](ForwardArgs& a) { a.kv_cache.batch_cache = 0; }, "kv_cache.batch_cache");
  expect_invalid([](ForwardArgs& a) { a.kv_cache.batch_cache = 1; }, "kv_cache.batch_cache");  // batch 2, no batch_idx
  expect_invalid([](ForwardArgs& a) { a.kv_cache.batch_cache = int64_t(1) << 31; }, "kv_cache.batch_cache");
  expect_invalid([](ForwardArgs& a) { a.kv_cache.num_splits = -1; }, "kv_cache.num_splits");
  expect_invalid([](ForwardArgs& a) { a.kv_cache.num_splits = 129; }, "kv_cache.num_splits");
  expect_invalid([](ForwardArgs& a) { a.seqlen_q = 1 << 20; a.heads_q = 1024; a.heads_kv = 1;
                                      a.q = flash3::contiguous<const void*>(a.q.data, a.seqlen_q, a.heads_q, a.head_dim);
                                      a.o = flash3::contiguous<void*>(a.o.data, a.seqlen_q, a.heads_q, a.head_dim);
                                      a.kv_cache.num_splits = 128; },
                 "kv_cache.num_splits");
  expect_invalid([](ForwardArgs& a) {
    a.varlen.cu_seqlens_q = reinterpret_cast<const int32_t*>(0x90000);
    a.varlen.cu_seqlens_k = reinterpret_cast<const int32_t*>(0x91000);
  }, "varlen.cu_seqlens_q");
}

// K and V are checked as [batch_cache, seqlen_k, heads_kv, d].
TEST(KvCacheValidation, CachesAreTensorsOfTheirOwnBatch) {
  expect_invalid([](ForwardArgs& a) { a.k.data = nullptr; }, "k.data");
  expect_invalid([](ForwardArgs& a) { a.v.batch_stride = 3; }, "v.batch_stride");
  ForwardArgs a = valid_cache_args();
  a.kv_cache.batch_idx = reinterpret_cast<const int32_t*>(0x81000);
  a.kv_cache.batch_cache = 1;
  a.k.batch_stride = a.v.batch_stride = 3;  // one entry: its batch stride is never used
  EXPECT_TRUE(flash3::validate(a).ok());
}

TEST(KvCacheValidation, UnsupportedCombinations) {
  ForwardArgs a = valid_cache_args();
  a.options.pingpong = false;
  EXPECT_EQ(flash3::validate(a).code(), Status::Code::kUnsupported);
  a = valid_cache_args();
  a.options.persistent = false;
  Status const s = flash3::validate(a);
  EXPECT_EQ(s.code(), Status::Code::kUnsupported);
  EXPECT_EQ(s.message().rfind("kv_cache", 0), 0u) << s.message();
}

// An FP8 cache: e4m3 Q, K and V, descales per (batch, head), a bf16 O.
ForwardArgs fp8_cache_args() {
  ForwardArgs a = valid_cache_args();
  a.dtype = flash3::DType::kE4M3;
  a.fp8.granularity = flash3::ScaleGranularity::kPerHead;
  a.fp8.q = reinterpret_cast<const float*>(0x90000);
  a.fp8.k = reinterpret_cast<const float*>(0x91000);
  a.fp8.v = reinterpret_cast<const float*>(0x92000);
  return a;
}

TEST(KvCacheValidation, Fp8Cache) {
  EXPECT_TRUE(flash3::validate(fp8_cache_args()).ok());
  ForwardArgs per_kv_head = fp8_cache_args();
  per_kv_head.fp8.q_per_kv_head = true;
  EXPECT_TRUE(flash3::validate(per_kv_head).ok());
  auto expect_unsupported = [](std::function<void(ForwardArgs&)> const& edit, std::string const& name) {
    ForwardArgs a = fp8_cache_args();
    edit(a);
    Status const s = flash3::validate(a);
    EXPECT_EQ(s.code(), Status::Code::kUnsupported) << name;
    EXPECT_EQ(s.message().rfind(name, 0), 0u) << s.message();
  };
  expect_unsupported([](ForwardArgs& a) { a.fp8.granularity = flash3::ScaleGranularity::kPerBlock; },
                     "fp8.granularity");
  expect_unsupported([](ForwardArgs& a) { a.fp8.out_dtype = flash3::DType::kFP16; }, "fp8.out_dtype");
  expect_unsupported([](ForwardArgs& a) { a.kv_cache.append.rotary_cos = reinterpret_cast<const void*>(0x93000); },
                     "kv_cache.append.rotary_cos");
  flash3::testing::expect_invalid_args<ForwardArgs>(fp8_cache_args(), [](ForwardArgs& a) {
    a.fp8.granularity = flash3::ScaleGranularity::kPerTensor;
    a.fp8.q_per_kv_head = true;
  }, "fp8.q_per_kv_head");
}

// An MLA call: q [2, 1, 16, 64], qv [2, 1, 16, 512] against caches of one
// KV head, k [3, 300, 1, 64] and v [3, 300, 1, 512].
ForwardArgs mla_args() {
  ForwardArgs a = valid_cache_args();
  a.heads_q = 16;
  a.heads_kv = 1;
  a = flash3::testing::with_head_dims(a, 64, 512);
  a.qv = flash3::contiguous<const void*>(flash3::testing::fake_address(0xC0000), 1, 16, 512);
  return a;
}

TEST(KvCacheValidation, Mla) {
  EXPECT_TRUE(flash3::validate(mla_args()).ok());
  ForwardArgs paged = mla_args();
  paged.kv_cache.page_table = reinterpret_cast<const int32_t*>(0x84000);
  paged.kv_cache.page_size = 64;
  paged.seqlen_k = 320;
  paged.k = flash3::contiguous<const void*>(paged.k.data, 64, 1, 64);
  paged.v = flash3::contiguous<const void*>(paged.v.data, 64, 1, 512);
  paged.causal = true;
  EXPECT_TRUE(flash3::validate(paged).ok());
  auto invalid = [](std::function<void(ForwardArgs&)> const& edit, std::string const& name) {
    flash3::testing::expect_invalid_args<ForwardArgs>(mla_args(), edit, name);
  };
  invalid([](ForwardArgs& a) { a.head_dim_v = 256; }, "head_dim: MLA (qv) takes head_dim 64 and head_dim_v 512");
  invalid([](ForwardArgs& a) { a.head_dim = 128; }, "head_dim: MLA (qv)");
  invalid([](ForwardArgs& a) { a.qv.data = flash3::testing::fake_address(0xC0008); }, "qv.data");
  invalid([](ForwardArgs& a) { a.qv.seq_stride = 100; a.seqlen_q = 2; }, "qv.seq_stride");
  invalid([](ForwardArgs& a) { a.qv.dim_stride = 2; }, "qv.dim_stride");
  auto unsupported = [](std::function<void(ForwardArgs&)> const& edit, std::string const& name) {
    ForwardArgs a = mla_args();
    edit(a);
    Status const s = flash3::validate(a);
    EXPECT_EQ(s.code(), Status::Code::kUnsupported) << name;
    EXPECT_EQ(s.message().rfind(name, 0), 0u) << s.message();
  };
  unsupported([](ForwardArgs& a) { a.dtype = flash3::DType::kFP16; }, "qv: MLA (qv) runs in kBF16");
  unsupported([](ForwardArgs& a) { a.softcap = 10.f; }, "softcap: MLA (qv)");
  unsupported([](ForwardArgs& a) { a.sinks = reinterpret_cast<const float*>(0x85000); }, "sinks: MLA (qv)");
  unsupported([](ForwardArgs& a) { a.kv_cache = {}; }, "qv: MLA (qv) runs against a KV cache");
  // MLA's head dims without qv: a plain call's V head dims say where 512 belongs.
  ForwardArgs plain = mla_args();
  plain.qv = {};
  Status const s = flash3::validate(plain);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(s.message().find("is MLA's, with qv"), std::string::npos) << s.message();
}

TEST(KvCacheValidation, Workspace) {
  expect_invalid([](ForwardArgs& a) { a.kv_cache.workspace = reinterpret_cast<void*>(0xA0008); },
                 "kv_cache.workspace");
  expect_invalid([](ForwardArgs& a) { a.kv_cache.workspace_bytes = 256; }, "kv_cache.workspace_bytes");
  expect_invalid([](ForwardArgs& a) { a.kv_cache.seqlens = nullptr; a.kv_cache.batch_cache = 0;
                                      a.kv_cache.num_splits = 1; a.kv_cache.workspace = reinterpret_cast<void*>(0xA0000);
                                      a.kv_cache.workspace_bytes = 256; },
                 "kv_cache.workspace");
  ForwardArgs a = valid_cache_args();
  a.kv_cache.workspace = reinterpret_cast<void*>(0xA0010);
  a.kv_cache.workspace_bytes = 16;  // its size is the launch's to check: it depends on the device's choice
  EXPECT_TRUE(flash3::validate(a).ok());
}

TEST(KvCacheValidation, ForwardRejectsBeforeTouchingTheDevice) {
  ForwardArgs a = valid_cache_args();
  a.kv_cache.num_splits = 500;
  EXPECT_EQ(flash3::forward(a, nullptr).code(), Status::Code::kInvalidArgument);
}

TEST(KvCacheMap, KeysOfEachEntry) {
  int32_t const seqlens[] = {10, 0, 5, 7};
  int32_t const leftpad[] = {3, 0, 9, 7};
  int32_t const idx[] = {2, 0, 1, 3};
  flash3::KvCacheMap const plain{seqlens};
  EXPECT_EQ(plain.kv_batch(2), 2);
  EXPECT_EQ(plain.first_key(2), 0);
  EXPECT_EQ(plain.keys(0), 10);
  flash3::KvCacheMap const padded{seqlens, idx, leftpad};
  EXPECT_EQ(padded.kv_batch(0), 2);
  EXPECT_EQ(padded.first_key(0), 3);
  EXPECT_EQ(padded.keys(0), 7);
  EXPECT_EQ(padded.keys(2), 0);  // a leftpad past the length: no key, not a negative count
  EXPECT_EQ(padded.keys(3), 0);
}

// The splits of a tile's range are contiguous, disjoint and cover it, in
// order; splits past the blocks are empty.
TEST(KvSplit, SplitsCoverTheTileRange) {
  for (int lo : {0, 3}) {
    for (int blocks : {0, 1, 5, 8, 100}) {
      for (int splits : {1, 2, 3, 7, 8, 64, 128}) {
        BlockRange const tile{lo, lo + blocks, lo + blocks - 1};
        int next = lo;
        for (int s = 0; s < splits; ++s) {
          BlockRange const r = flash3::split_block_range(tile, s, splits);
          EXPECT_EQ(r.n_block_mask, tile.n_block_mask);
          if (r.empty()) continue;
          EXPECT_EQ(r.n_block_min, next) << lo << " " << blocks << " " << splits << " " << s;
          EXPECT_LE(r.n_block_max - r.n_block_min, (blocks + splits - 1) / splits);
          next = r.n_block_max;
        }
        EXPECT_EQ(next, lo + blocks) << lo << " " << blocks << " " << splits;
      }
    }
  }
}

TEST(KvSplit, WarpgroupRangeWithinASplit) {
  BlockRange const split{4, 8, 9};
  BlockRange r = flash3::within_split({0, 6, 5}, split);
  EXPECT_EQ(r.n_block_min, 4);
  EXPECT_EQ(r.n_block_max, 6);
  EXPECT_EQ(r.n_block_mask, 5);
  EXPECT_TRUE(flash3::within_split({0, 3, 2}, split).empty());   // rows' keys all below the split
  EXPECT_TRUE(flash3::within_split({9, 12, 12}, split).empty());  // a window's rows above it
  EXPECT_FALSE(flash3::within_split({0, 20, 20}, split).empty());
}

// Every (m_block, head, batch, split) once.
TEST(KvSplit, SchedulerTilesAreEachOnce) {
  for (int splits : {1, 3, 8}) {
    flash3::TileOrder const order = flash3::TileOrder::make(2 * splits, 5, 3, 1 << 20, 50 << 20, false, 132);
    std::set<std::tuple<int, int, int, int>> seen;
    for (int t = 0; t < order.num_tiles(); ++t) {
      flash3::TileCoord const c = flash3::split_tile(order, splits, t);
      EXPECT_GE(c.m_block, 0);
      EXPECT_LT(c.m_block, 2);
      EXPECT_LT(c.split, splits);
      seen.insert({c.m_block, c.head, c.batch, c.split});
    }
    EXPECT_EQ(int(seen.size()), 2 * 5 * 3 * splits);
  }
}

TEST(KvSplit, Heuristic) {
  // Enough tiles already: no split.
  EXPECT_EQ(flash3::choose_num_splits(132, 1000, 132), 1);
  EXPECT_EQ(flash3::choose_num_splits(106, 1000, 132), 1);
  // One wave: 32 tiles x 4 splits fill 128 of 132 SMs; 8 tiles x 16 (packed GQA, batch 1, 8 KV heads).
  EXPECT_EQ(flash3::choose_num_splits(32, 1024, 132), 4);
  EXPECT_EQ(flash3::choose_num_splits(8, 1024, 132), 16);
  EXPECT_EQ(flash3::choose_num_splits(40, 1024, 132), 3);
  // Few key blocks: at least kMinBlocksPerSplit each, and none split at 2 x kMinBlocksPerSplit or fewer.
  EXPECT_EQ(flash3::choose_num_splits(8, 32, 132), 8);
  EXPECT_EQ(flash3::choose_num_splits(8, 9, 132), 2);
  EXPECT_EQ(flash3::choose_num_splits(8, 8, 132), 1);
  EXPECT_EQ(flash3::choose_num_splits(8, 3, 132), 1);
  // One tile of a long sequence: up to kMaxSplits.
  EXPECT_EQ(flash3::choose_num_splits(1, 100000, 132), flash3::kMaxSplits);
  // Nothing to split.
  EXPECT_EQ(flash3::choose_num_splits(0, 100, 132), 1);
  EXPECT_EQ(flash3::choose_num_splits(10, 0, 132), 1);
  for (int tiles = 1; tiles < 200; tiles += 7) {
    for (int blocks : {1, 4, 9, 64, 1000, 5000}) {
      int const s = flash3::choose_num_splits(tiles, blocks, 132);
      EXPECT_GE(s, 1);
      EXPECT_LE(s, std::max(1, blocks / flash3::kMinBlocksPerSplit));
      EXPECT_LE(s, flash3::kMaxSplits);
      EXPECT_TRUE(s == 1 || tiles * s <= 132) << tiles << " tiles, " << blocks << " blocks: " << s;
    }
  }
}

// Packed GQA: every query (batch, head) of the decoding call is row head %
// group of packed head head / group, at the same address in Q and O and the
// same LSE index.
TEST(PackGqa, SameElementsAsRowsOfTheGroup) {
  ForwardArgs a = valid_cache_args();
  a.heads_q = 8;
  a.heads_kv = 2;
  a.q = flash3::contiguous<const void*>(a.q.data, 1, a.heads_q, a.head_dim);
  a.q.batch_stride += 64;  // a gap between entries
  a.o = flash3::contiguous<void*>(a.o.data, 1, a.heads_q, a.head_dim);
  a.causal = true;
  ASSERT_TRUE(flash3::fwd::packs_gqa(a));
  ForwardArgs const p = flash3::fwd::packed_gqa(a);
  int64_t const group = a.heads_q / a.heads_kv;
  EXPECT_EQ(p.seqlen_q, group);
  EXPECT_EQ(p.heads_q, a.heads_kv);
  EXPECT_FALSE(p.causal);
  for (int64_t b = 0; b < a.batch; ++b) {
    for (int64_t h = 0; h < a.heads_q; ++h) {
      int64_t const row = h % group, head = h / group;
      EXPECT_EQ(b * p.q.batch_stride + row * p.q.seq_stride + head * p.q.head_stride,
                b * a.q.batch_stride + h * a.q.head_stride);
      EXPECT_EQ(b * p.o.batch_stride + row * p.o.seq_stride + head * p.o.head_stride,
                b * a.o.batch_stride + h * a.o.head_stride);
      // The LSE is [batch, heads, seqlen_q], contiguous.
      EXPECT_EQ((b * p.heads_q + head) * p.seqlen_q + row, (b * a.heads_q + h) * a.seqlen_q);
    }
  }
}

// Only decoding calls with several query heads a KV head and no per-row
// position or head (a left window, sinks) are packed.
TEST(PackGqa, WhichCallsPack) {
  ForwardArgs a = valid_cache_args();
  a.heads_q = 8;
  a.heads_kv = 2;
  EXPECT_TRUE(flash3::fwd::packs_gqa(a));
  ForwardArgs mha = a;
  mha.heads_kv = 8;
  EXPECT_FALSE(flash3::fwd::packs_gqa(mha));
  ForwardArgs chunk = a;
  chunk.seqlen_q = 2;
  EXPECT_FALSE(flash3::fwd::packs_gqa(chunk));
  ForwardArgs sinks = a;
  float const sink = 0.f;
  sinks.sinks = &sink;
  EXPECT_FALSE(flash3::fwd::packs_gqa(sinks));
  ForwardArgs window = a;
  window.window_left = 16;
  EXPECT_FALSE(flash3::fwd::packs_gqa(window));
  window.window_left = a.seqlen_k;  // spans every key: no window
  EXPECT_TRUE(flash3::fwd::packs_gqa(window));
  ForwardArgs right = a;
  right.window_right = 0;
  EXPECT_TRUE(flash3::fwd::packs_gqa(right));
  ForwardArgs plain = a;
  plain.kv_cache.seqlens = nullptr;
  EXPECT_FALSE(flash3::fwd::packs_gqa(plain));
  // FP8: a tile takes one Q descale, so Q's must be per tensor or per KV head.
  ForwardArgs fp8 = fp8_cache_args();
  EXPECT_FALSE(flash3::fwd::packs_gqa(fp8));
  fp8.fp8.q_per_kv_head = true;
  EXPECT_TRUE(flash3::fwd::packs_gqa(fp8));
  fp8.fp8.q_per_kv_head = false;
  fp8.fp8.granularity = flash3::ScaleGranularity::kPerTensor;
  EXPECT_TRUE(flash3::fwd::packs_gqa(fp8));
}

// The parts of the workspace: present only when the call has them, each at
// a multiple of 128 bytes, none overlapping.
// MLA's packed rows: each (position, query head) of a KV head once, and each
// tile's key blocks (and which need the mask) as every row's position sees
// them, checked against the policy's rule key by key.
TEST(PackedRows, PositionsHeadsAndKeyBlocks) {
  constexpr int kBlock = 64;
  for (int group : {1, 6, 8, 128}) {
    for (int seqlen_q : {1, 2, 3, 70}) {
      flash3::PackedRows const packed{group, seqlen_q};
      std::set<std::pair<int, int>> seen;
      for (int head_kv = 0; head_kv < 2; ++head_kv) {
        for (int r = 0; r < packed.rows(); ++r) {
          EXPECT_TRUE(seen.insert({packed.position(r), packed.head(head_kv, r)}).second);
        }
      }
      EXPECT_EQ(seen.size(), size_t(2 * group * seqlen_q));
      for (int seqlen_k : {1, 100, 1000}) {
        for (auto [causal, left, right] : {std::tuple{false, -1, -1}, std::tuple{true, -1, 0},
                                           std::tuple{false, 40, -1}, std::tuple{false, 30, 10}}) {
          SCOPED_TRACE(std::to_string(group) + " " + std::to_string(seqlen_q) + " " + std::to_string(seqlen_k) + " " +
                       std::to_string(left) + " " + std::to_string(right));
          flash3::Window const w = flash3::window_of(causal, left, right, seqlen_q, seqlen_k);
          flash3::MaskPolicy const mask{seqlen_q, seqlen_k, false, w.left, w.right};
          for (int m = 0; m * kBlock < packed.rows(); ++m) {
            BlockRange const range = packed.key_blocks(mask, m, kBlock, kBlock);
            int const below = packed.key_blocks_masked_below(mask, m, kBlock, kBlock);
            for (int n = 0; n * kBlock < seqlen_k; ++n) {
              bool any = false, all = true;
              for (int r = m * kBlock; r < std::min((m + 1) * kBlock, packed.rows()); ++r) {
                int const i = packed.position(r);
                for (int j = n * kBlock; j < (n + 1) * kBlock; ++j) {
                  bool const visible = j < seqlen_k && j >= mask.col_start(i) && j < mask.col_limit(i);
                  any |= visible;
                  all &= visible;
                }
              }
              bool const walked = n >= range.n_block_min && n < range.n_block_max;
              if (any) EXPECT_TRUE(walked) << "block " << n << " of tile " << m;
              if (walked && !all) EXPECT_TRUE(n >= range.n_block_mask || n < below) << "block " << n << " unmasked";
            }
          }
        }
      }
    }
  }
}

TEST(KvWorkspace, Layout) {
  ForwardArgs a = valid_cache_args();  // batch 2, 8 query heads, head dim 128, one query
  EXPECT_EQ(flash3::fwd::kv_workspace_layout(a, 1).bytes, 0u);
  flash3::fwd::KvWorkspaceLayout const split = flash3::fwd::kv_workspace_layout(a, 3);
  size_t const rows = 3 * 2 * 8 * 1;
  EXPECT_EQ(split.partial_o, 0u);
  EXPECT_EQ(split.partial_lse, rows * 128 * 4);
  EXPECT_EQ(split.bytes, rows * 128 * 4 + 256);  // the LSE's 192 bytes, rounded up
  a.kv_cache.append.seqlen_new = 2;
  a.head_dim = 192;
  a.head_dim_v = 128;
  flash3::fwd::KvWorkspaceLayout const both = flash3::fwd::kv_workspace_layout(a, 3);
  EXPECT_EQ(both.lengths, 0u);
  EXPECT_EQ(both.q_rotated, 128u);
  EXPECT_EQ(both.partial_o, 128u + 2 * 8 * 192 * 2);
  EXPECT_EQ(both.partial_lse, both.partial_o + rows * 128 * 4);
  EXPECT_GE(both.bytes, both.partial_lse + rows * 4);
  for (size_t offset : {both.q_rotated, both.partial_o, both.partial_lse, both.bytes}) EXPECT_EQ(offset % 128, 0u);
  EXPECT_EQ(flash3::fwd::kv_workspace_layout(a, 1).bytes, 128u + 2 * 8 * 192 * 2);
}

// The plan's splits are the dispatch's: explicit ones as given, 0 chosen for
// the packed tiles when GQA packs; its workspace the layout's.
TEST(KvWorkspace, Plan) {
  ForwardArgs a = valid_cache_args();
  a.kv_cache.num_splits = 5;
  flash3::KvCachePlan plan;
  ASSERT_TRUE(flash3::plan_kv_cache(a, &plan).ok());
  EXPECT_EQ(plan.num_splits, 5);
  EXPECT_EQ(plan.workspace_bytes, flash3::fwd::kv_workspace_layout(a, 5).bytes);
  a.heads_kv = 2;
  a.seqlen_k = 32768;
  a.kv_cache.num_splits = 0;
  int const tiles = 2 * 2;  // batch x KV heads, each group's 4 query heads one tile
  int const blocks = 32768 / flash3::fwd::kv_cache_tile(a).block_n;
  EXPECT_EQ(flash3::fwd::num_splits_of(a, 132), flash3::choose_num_splits(tiles, blocks, 132));
  ForwardArgs unpacked = a;
  float const sink = 0.f;
  unpacked.sinks = &sink;
  EXPECT_EQ(flash3::fwd::num_splits_of(unpacked, 132), flash3::choose_num_splits(2 * 8, blocks, 132));
  // An FP8 cache plans with FP8's tiles (192-key blocks at head dim 128), and packs GQA only with one Q
  // descale per KV head or per tensor.
  ForwardArgs fp8 = fp8_cache_args();
  fp8.heads_kv = 2;
  fp8.seqlen_k = 32768;
  fp8.kv_cache.num_splits = 0;
  EXPECT_EQ(flash3::fwd::kv_cache_tile(fp8).block_n, flash3::fwd::tile_size(128, 128, true, true).block_n);
  int const fp8_blocks = (32768 + 191) / 192;
  EXPECT_EQ(flash3::fwd::num_splits_of(fp8, 132), flash3::choose_num_splits(2 * 8, fp8_blocks, 132));
  fp8.fp8.q_per_kv_head = true;
  EXPECT_EQ(flash3::fwd::num_splits_of(fp8, 132), flash3::choose_num_splits(tiles, fp8_blocks, 132));
  // MLA plans with its own tiles (64 x 64): by its head dims, qv given or not (a plan has no tensors),
  // and its tiles pack each KV head's (position, head) rows: 2 positions of 16 heads are 1 tile.
  ForwardArgs mla = mla_args();
  mla.seqlen_k = 32768;
  mla.kv_cache.num_splits = 0;
  EXPECT_EQ(flash3::fwd::kv_cache_tile(mla).block_m, flash3::fwd::kMlaTile.block_m);
  EXPECT_EQ(flash3::fwd::num_splits_of(mla, 132), flash3::choose_num_splits(2 * 1, 32768 / 64, 132));
  mla.seqlen_q = 5;  // 80 rows: 2 tiles
  EXPECT_EQ(flash3::fwd::num_splits_of(mla, 132), flash3::choose_num_splits(2 * 2, 32768 / 64, 132));
  mla.qv = {};
  mla.kv_cache.num_splits = 3;
  ASSERT_TRUE(flash3::plan_kv_cache(mla, &plan).ok());
  EXPECT_EQ(plan.workspace_bytes, flash3::fwd::kv_workspace_layout(mla, 3).bytes);
  a.batch = 0;
  ASSERT_TRUE(flash3::plan_kv_cache(a, &plan).ok());  // nothing to launch: no device needed
  EXPECT_EQ(plan.num_splits, 1);
  EXPECT_EQ(plan.workspace_bytes, 0u);
  a.batch = 2;
  a.kv_cache.num_splits = 129;
  plan.num_splits = 7;
  Status const s = flash3::plan_kv_cache(a, &plan);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(s.message().rfind("kv_cache.num_splits", 0), 0u) << s.message();
  EXPECT_EQ(plan.num_splits, 1);
  a.kv_cache.num_splits = 2;
  a.kv_cache.append.seqlen_new = -1;
  EXPECT_EQ(flash3::plan_kv_cache(a, &plan).message().rfind("kv_cache.append.seqlen_new", 0), 0u);
  a.kv_cache.append.seqlen_new = 0;
  a.head_dim = 80;
  EXPECT_EQ(flash3::plan_kv_cache(a, &plan).message().rfind("head_dim", 0), 0u);
  EXPECT_EQ(flash3::plan_kv_cache(a, nullptr).message().rfind("plan", 0), 0u);
  a.head_dim = 128;
  a.kv_cache.seqlens = nullptr;
  EXPECT_EQ(flash3::plan_kv_cache(a, &plan).message().rfind("kv_cache.seqlens", 0), 0u);
}

}  // namespace
