// The KV cache forward (ForwardArgs::kv_cache) and split-KV against the
// references with each batch entry's keys as a plain tensor: a view of its
// cache entry's rows leftpad[b] .. seqlens[b] - 1 (kv_cache_check.h).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "flash3/flash3.h"
#include "gpu_test_util.h"
#include "kv_cache_check.h"
#include "reference.h"

namespace {

using flash3::DType;
using flash3::reference::AttentionShape;
using flash3::testing::DeviceBuffer;
using flash3::testing::from_bits;
using flash3::testing::to_bits;

struct CacheCase {
  DType dtype = DType::kBF16;
  int head_dim = 128;
  int seqlen_q = 1;
  int max_len = 1024;  // the cache's rows per entry
  int heads_q = 8;
  int heads_kv = 2;
  std::vector<int> seqlens;  // one per batch entry
  int extra_entries = 0;     // cache entries beyond the batch's
  bool permute = false;      // cache_batch_idx: entry b reads cache entry batch_cache - 1 - b
  bool leftpad = false;      // cache_leftpad: entry b's keys start at min(seqlens[b], 13 * b % 37)
  bool causal = false;
  int window_left = -1;
  int window_right = -1;
  float softcap = 0.f;
  bool sinks = false;
  int num_splits = 1;
  int workspace = 0;  // kv_cache.workspace: 0 none, 1 of plan_kv_cache's bytes, -1 a byte short of them
};

struct CacheResult {
  std::vector<uint16_t> o;
  std::vector<float> lse;
  std::string unsupported;  // the build has no kernel for the case: why
};

int leftpad_of(CacheCase const& c, int b) { return c.leftpad ? std::min(c.seqlens[b], 13 * b % 37) : 0; }

// Runs flash3 on the case; with `check`, compares it with the references.
CacheResult run_cache_case(CacheCase const& c, uint32_t seed, bool check = true) {
  CacheResult result;
  int const batch = int(c.seqlens.size()), batch_cache = batch + c.extra_entries, d = c.head_dim;
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  size_t const q_elems = size_t(batch) * c.seqlen_q * c.heads_q * d;
  size_t const cache_elems = size_t(batch_cache) * c.max_len * c.heads_kv * d;
  size_t const lse_elems = size_t(batch) * c.heads_q * c.seqlen_q;
  DeviceBuffer<uint16_t> q(q_elems), k(cache_elems), v(cache_elems), o(q_elems);
  DeviceBuffer<float> lse(lse_elems), sinks(c.heads_q);
  DeviceBuffer<int32_t> seqlens(batch), batch_idx(batch), leftpad(batch);
  auto upload = [&](uint16_t* dst, size_t n) {
    std::vector<uint16_t> host(n);
    for (uint16_t& x : host) x = to_bits(normal(rng), c.dtype);
    EXPECT_EQ(cudaMemcpy(dst, host.data(), n * 2, cudaMemcpyHostToDevice), cudaSuccess);
  };
  upload(q.ptr, q_elems);
  upload(k.ptr, cache_elems);
  upload(v.ptr, cache_elems);
  std::vector<int32_t> h_idx(batch), h_pad(batch);
  for (int b = 0; b < batch; ++b) {
    h_idx[b] = c.permute ? batch_cache - 1 - b : b;
    h_pad[b] = leftpad_of(c, b);
  }
  EXPECT_EQ(cudaMemcpy(seqlens.ptr, c.seqlens.data(), batch * 4, cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(batch_idx.ptr, h_idx.data(), batch * 4, cudaMemcpyHostToDevice), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(leftpad.ptr, h_pad.data(), batch * 4, cudaMemcpyHostToDevice), cudaSuccess);
  std::vector<float> h_sinks(c.heads_q);
  for (float& x : h_sinks) x = 2.f * normal(rng);
  EXPECT_EQ(cudaMemcpy(sinks.ptr, h_sinks.data(), c.heads_q * 4, cudaMemcpyHostToDevice), cudaSuccess);
  // Poison: an element the kernels do not write reads back as NaN.
  EXPECT_EQ(cudaMemset(o.ptr, 0xff, q_elems * 2), cudaSuccess);
  EXPECT_EQ(cudaMemset(lse.ptr, 0xff, lse_elems * 4), cudaSuccess);

  flash3::ForwardArgs a;
  a.dtype = c.dtype;
  a.batch = batch;
  a.seqlen_q = c.seqlen_q;
  a.seqlen_k = c.max_len;
  a.heads_q = c.heads_q;
  a.heads_kv = c.heads_kv;
  a.head_dim = d;
  a.q = flash3::contiguous<const void*>(q.ptr, c.seqlen_q, c.heads_q, d);
  a.k = flash3::contiguous<const void*>(k.ptr, c.max_len, c.heads_kv, d);
  a.v = flash3::contiguous<const void*>(v.ptr, c.max_len, c.heads_kv, d);
  a.o = flash3::contiguous<void*>(o.ptr, c.seqlen_q, c.heads_q, d);
  a.lse = lse.ptr;
  a.causal = c.causal;
  a.window_left = c.window_left;
  a.window_right = c.window_right;
  a.softcap = c.softcap;
  a.sinks = c.sinks ? sinks.ptr : nullptr;
  a.kv_cache.seqlens = seqlens.ptr;
  a.kv_cache.batch_idx = c.permute ? batch_idx.ptr : nullptr;
  a.kv_cache.leftpad = c.leftpad ? leftpad.ptr : nullptr;
  a.kv_cache.batch_cache = batch_cache;
  a.kv_cache.num_splits = c.num_splits;
  flash3::KvCachePlan plan;
  EXPECT_TRUE(flash3::plan_kv_cache(a, &plan).ok());
  DeviceBuffer<uint8_t> workspace(std::max<size_t>(plan.workspace_bytes, 1));
  if (c.workspace != 0) {
    a.kv_cache.workspace = workspace.ptr;
    a.kv_cache.workspace_bytes = plan.workspace_bytes - (c.workspace < 0 ? 1 : 0);
  }
  flash3::Status const s = flash3::forward(a, nullptr);
  if (s.code() == flash3::Status::Code::kUnsupported) {
    result.unsupported = s.message();
    return result;
  }
  if (c.workspace < 0) {  // refused before any launch: O still poisoned
    EXPECT_EQ(s.code(), flash3::Status::Code::kInvalidArgument) << s.message();
    EXPECT_EQ(s.message().rfind("kv_cache.workspace_bytes", 0), 0u) << s.message();
    std::vector<uint16_t> h_o(q_elems);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(h_o.data(), o.ptr, q_elems * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(std::count(h_o.begin(), h_o.end(), uint16_t(0xffff)), std::ptrdiff_t(q_elems));
    return result;
  }
  EXPECT_TRUE(s.ok()) << s.message();
  if (!s.ok()) return result;
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  result.o.resize(q_elems);
  result.lse.resize(lse_elems);
  EXPECT_EQ(cudaMemcpy(result.o.data(), o.ptr, q_elems * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(result.lse.data(), lse.ptr, lse_elems * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  if (!check) return result;

  AttentionShape mask{batch, c.seqlen_q, 0, c.heads_q, c.heads_kv, d, 0.f, c.causal};
  mask.window_left = c.window_left;
  mask.window_right = c.window_right;
  mask.softcap = c.softcap;
  size_t const row_elems = size_t(c.heads_kv) * d;
  flash3::testing::expect_entries_close(
      mask, c.dtype, q.ptr, batch, c.sinks ? sinks.ptr : nullptr,
      [&](int b) {
        size_t const first = (size_t(h_idx[b]) * c.max_len + h_pad[b]) * row_elems;
        return flash3::testing::EntryKeys{k.ptr + first, v.ptr + first, std::max(c.seqlens[b] - h_pad[b], 0)};
      },
      result.o, result.lse);
  return result;
}

// Cache lengths of 0, 1, around a key block (128 or fewer at every head
// dim), and longer than many.
std::vector<int> mixed_seqlens(int max_len) {
  return {0, 1, 63, 127, 128, 129, std::min(1000, max_len), max_len};
}

TEST(KvCache, Decoding) {
  SKIP_WITHOUT_CUDA_DEVICE();
  uint32_t seed = 100;
  for (int splits : {1, 0, 4}) {
    SCOPED_TRACE("num_splits " + std::to_string(splits));
    run_cache_case({.seqlens = mixed_seqlens(1024), .num_splits = splits}, seed++);
  }
}

TEST(KvCache, BatchIdxAndLeftpad) {
  SKIP_WITHOUT_CUDA_DEVICE();
  uint32_t seed = 200;
  for (int splits : {1, 3}) {
    for (bool permute : {false, true}) {
      for (bool pad : {false, true}) {
        SCOPED_TRACE("splits " + std::to_string(splits) + (permute ? " batch_idx" : "") + (pad ? " leftpad" : ""));
        run_cache_case({.max_len = 700, .seqlens = mixed_seqlens(700), .extra_entries = 3, .permute = permute,
                        .leftpad = pad, .num_splits = splits},
                       seed++);
      }
    }
  }
}

TEST(KvCache, CausalAndWindowsWithSeveralQueries) {
  SKIP_WITHOUT_CUDA_DEVICE();
  uint32_t seed = 300;
  for (int sq : {1, 5, 200}) {
    for (int splits : {1, 5}) {
      SCOPED_TRACE("seqlen_q " + std::to_string(sq) + " splits " + std::to_string(splits));
      std::vector<int> lens = {sq, sq + 1, 300, 1024, 777};
      run_cache_case({.seqlen_q = sq, .seqlens = lens, .leftpad = true, .causal = true, .num_splits = splits},
                     seed++);
      run_cache_case({.seqlen_q = sq, .seqlens = lens, .window_left = 150, .num_splits = splits}, seed++);
      run_cache_case(
          {.seqlen_q = sq, .seqlens = lens, .causal = true, .window_left = 64, .num_splits = splits}, seed++);
    }
  }
}

TEST(KvCache, GqaMqaSoftcapSinksFp16) {
  SKIP_WITHOUT_CUDA_DEVICE();
  uint32_t seed = 400;
  for (int splits : {1, 6}) {
    run_cache_case({.heads_q = 32, .heads_kv = 8, .seqlens = mixed_seqlens(1024), .num_splits = splits}, seed++);
    run_cache_case({.heads_q = 4, .heads_kv = 1, .seqlens = mixed_seqlens(1024), .softcap = 20.f,
                    .num_splits = splits},
                   seed++);
    run_cache_case({.seqlens = mixed_seqlens(1024), .causal = true, .sinks = true, .num_splits = splits}, seed++);
    run_cache_case({.dtype = DType::kFP16, .seqlens = mixed_seqlens(1024), .num_splits = splits}, seed++);
  }
}

// Each split rounds P to 16 bits against its own running max, so split O
// differs from unsplit O by that rounding (2^-9 of each term, a few times
// that of the row's size in the worst of its elements), then by O's own
// rounding: within 2^-6 of the larger of the element and its row's RMS (an
// element near zero by cancellation keeps its row's error). The LSE within
// float32 rounding.
TEST(KvCache, SplitEqualsUnsplit) {
  SKIP_WITHOUT_CUDA_DEVICE();
  CacheCase c{.seqlen_q = 3, .max_len = 4096, .seqlens = {2000, 1, 0, 4096, 129}, .causal = true};
  CacheResult const whole = run_cache_case(c, 500, false);
  // 64 splits: more than the shorter entries' key blocks (empty splits).
  for (int splits : {2, 7, 64, 128}) {
    SCOPED_TRACE("num_splits " + std::to_string(splits));
    c.num_splits = splits;
    CacheResult const split = run_cache_case(c, 500, false);
    ASSERT_EQ(split.o.size(), whole.o.size());
    size_t const d = size_t(c.head_dim);
    for (size_t row = 0; row < whole.o.size(); row += d) {
      float sum_sq = 0.f;
      for (size_t i = row; i < row + d; ++i) sum_sq += std::pow(from_bits(whole.o[i], c.dtype), 2.f);
      float const rms = std::sqrt(sum_sq / float(d));
      for (size_t i = row; i < row + d; ++i) {
        float const x = from_bits(split.o[i], c.dtype), y = from_bits(whole.o[i], c.dtype);
        ASSERT_LE(std::fabs(x - y), std::ldexp(std::max({std::fabs(y), rms, 1e-3f}), -6)) << "O[" << i << "]";
      }
    }
    for (size_t i = 0; i < whole.lse.size(); ++i) {
      if (std::isinf(whole.lse[i])) {
        EXPECT_EQ(split.lse[i], whole.lse[i]) << "LSE[" << i << "]";
      } else {
        EXPECT_NEAR(split.lse[i], whole.lse[i], 1e-5f * std::max(1.f, std::fabs(whole.lse[i]))) << "LSE[" << i << "]";
      }
    }
  }
}

// The caller's workspace (kv_cache.workspace of plan_kv_cache's bytes): O
// and the LSE bit for bit those of the call's own scratch; a byte short is
// refused before any launch, O untouched.
TEST(KvCache, CallersWorkspace) {
  SKIP_WITHOUT_CUDA_DEVICE();
  CacheCase c{.seqlen_q = 1, .max_len = 4096, .heads_q = 16, .heads_kv = 2, .seqlens = {2000, 1, 0, 4096}};
  for (int splits : {0, 5}) {
    SCOPED_TRACE("num_splits " + std::to_string(splits));
    c.num_splits = splits;
    c.workspace = 0;
    CacheResult const own = run_cache_case(c, 700, false);
    if (!own.unsupported.empty()) GTEST_SKIP() << own.unsupported;
    c.workspace = 1;
    CacheResult const callers = run_cache_case(c, 700, false);
    EXPECT_EQ(callers.o, own.o);
    EXPECT_EQ(callers.lse, own.lse);
    c.workspace = -1;
    run_cache_case(c, 700, false);
  }
}

// Entries with no key: O = 0 and LSE +inf, or the sink's, split or not.
TEST(KvCache, EmptyCaches) {
  SKIP_WITHOUT_CUDA_DEVICE();
  uint32_t seed = 600;
  for (int splits : {1, 4}) {
    for (bool sinks : {false, true}) {
      run_cache_case({.seqlen_q = 2, .max_len = 256, .seqlens = {0, 0, 0}, .sinks = sinks, .num_splits = splits},
                     seed++);
    }
  }
}

TEST(KvCache, EveryHeadDim) {
  SKIP_WITHOUT_CUDA_DEVICE();
  uint32_t seed = 700;
  for (int d : {64, 96, 128, 192, 256}) {
    for (int splits : {1, 0}) {
      CacheCase c{.head_dim = d, .seqlen_q = 2, .seqlens = mixed_seqlens(1024), .causal = true, .num_splits = splits};
      SCOPED_TRACE("head_dim " + std::to_string(d));
      CacheResult const r = run_cache_case(c, seed++);
      // A build narrowed to some head dims (FLASH3_HEAD_DIMS) has no kernel for the others.
      if (!r.unsupported.empty()) std::printf("head_dim %d skipped: %s\n", d, r.unsupported.c_str());
    }
  }
}

}  // namespace
