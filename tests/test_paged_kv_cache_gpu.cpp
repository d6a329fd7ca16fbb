// The paged KV cache forward (ForwardArgs::kv_cache.page_table), split and
// not, against the references with each batch entry's keys gathered from its
// pages into a plain tensor. The pages are scattered over the pool in random
// order; every row the kernel must not read (pages no entry owns, rows past
// the 16-row box of an entry's last key) holds NaN, which would show in O.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <numeric>
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
using flash3::testing::to_bits;

constexpr uint16_t kNaN = 0x7fff;  // NaN in bf16 and fp16 alike
constexpr int kBoxRows = 16;

struct PagedCase {
  DType dtype = DType::kBF16;
  int head_dim = 128;
  int seqlen_q = 1;
  int page_size = 64;
  int max_pages = 20;  // an entry's table columns: capacity max_pages * page_size
  std::vector<int> seqlens;
  int heads_q = 8;
  int heads_kv = 2;
  int spare_pages = 5;  // pool pages no entry owns
  bool causal = false;
  int window_left = -1;
  int num_splits = 1;
};

void run_paged_case(PagedCase const& c, uint32_t seed) {
  int const batch = int(c.seqlens.size()), d = c.head_dim, ps = c.page_size;
  int const capacity = c.max_pages * ps;
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  // Each entry owns the pages its keys need; the pool holds them in random order.
  std::vector<int> owned(batch);
  int num_pages = c.spare_pages;
  for (int b = 0; b < batch; ++b) num_pages += owned[b] = (c.seqlens[b] + ps - 1) / ps;
  std::vector<int> order(num_pages);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<int32_t> table(size_t(batch) * c.max_pages, -1);  // unread columns: no page
  size_t const row_elems = size_t(c.heads_kv) * d;
  std::vector<uint16_t> pool_k(size_t(num_pages) * ps * row_elems, kNaN), pool_v = pool_k;
  std::vector<uint16_t> plain_k(size_t(batch) * capacity * row_elems, 0), plain_v = plain_k;
  int next = 0;
  for (int b = 0; b < batch; ++b) {
    for (int slot = 0; slot < owned[b]; ++slot) table[size_t(b) * c.max_pages + slot] = order[next++];
    // Keys and the rows up to their last box's end are finite; the plain
    // tensor holds the keys.
    int const rows = std::min((c.seqlens[b] + kBoxRows - 1) / kBoxRows * kBoxRows, owned[b] * ps);
    for (int j = 0; j < rows; ++j) {
      size_t const at = (size_t(table[size_t(b) * c.max_pages + j / ps]) * ps + j % ps) * row_elems;
      for (size_t e = 0; e < row_elems; ++e) {
        pool_k[at + e] = to_bits(normal(rng), c.dtype);
        pool_v[at + e] = to_bits(normal(rng), c.dtype);
        if (j < c.seqlens[b]) {
          plain_k[(size_t(b) * capacity + j) * row_elems + e] = pool_k[at + e];
          plain_v[(size_t(b) * capacity + j) * row_elems + e] = pool_v[at + e];
        }
      }
    }
  }
  size_t const q_elems = size_t(batch) * c.seqlen_q * c.heads_q * d, lse_elems = size_t(batch) * c.heads_q * c.seqlen_q;
  DeviceBuffer<uint16_t> q(q_elems), k(pool_k.size()), v(pool_v.size()), o(q_elems), pk(plain_k.size()),
      pv(plain_v.size());
  DeviceBuffer<float> lse(lse_elems);
  DeviceBuffer<int32_t> seqlens(batch), d_table(table.size());
  std::vector<uint16_t> h_q(q_elems);
  for (uint16_t& x : h_q) x = to_bits(normal(rng), c.dtype);
  ASSERT_EQ(cudaMemcpy(q.ptr, h_q.data(), q_elems * 2, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(k.ptr, pool_k.data(), pool_k.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(v.ptr, pool_v.data(), pool_v.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(pk.ptr, plain_k.data(), plain_k.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(pv.ptr, plain_v.data(), plain_v.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(seqlens.ptr, c.seqlens.data(), batch * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d_table.ptr, table.data(), table.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemset(o.ptr, 0xff, q_elems * 2), cudaSuccess);
  ASSERT_EQ(cudaMemset(lse.ptr, 0xff, lse_elems * 4), cudaSuccess);

  flash3::ForwardArgs a;
  a.dtype = c.dtype;
  a.batch = batch;
  a.seqlen_q = c.seqlen_q;
  a.seqlen_k = capacity;
  a.heads_q = c.heads_q;
  a.heads_kv = c.heads_kv;
  a.head_dim = d;
  a.q = flash3::contiguous<const void*>(q.ptr, c.seqlen_q, c.heads_q, d);
  a.k = flash3::contiguous<const void*>(k.ptr, ps, c.heads_kv, d);
  a.v = flash3::contiguous<const void*>(v.ptr, ps, c.heads_kv, d);
  a.o = flash3::contiguous<void*>(o.ptr, c.seqlen_q, c.heads_q, d);
  a.lse = lse.ptr;
  a.causal = c.causal;
  a.window_left = c.window_left;
  a.kv_cache.seqlens = seqlens.ptr;
  a.kv_cache.batch_cache = num_pages;
  a.kv_cache.num_splits = c.num_splits;
  a.kv_cache.page_table = d_table.ptr;
  a.kv_cache.page_table_stride = c.max_pages;
  a.kv_cache.page_size = ps;
  flash3::Status const s = flash3::forward(a, nullptr);
  // A build narrowed to some head dims (FLASH3_HEAD_DIMS) has no kernel for the others.
  if (s.code() == flash3::Status::Code::kUnsupported) {
    std::printf("head_dim %d skipped: %s\n", d, s.message().c_str());
    return;
  }
  ASSERT_TRUE(s.ok()) << s.message();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint16_t> h_o(q_elems);
  std::vector<float> h_lse(lse_elems);
  ASSERT_EQ(cudaMemcpy(h_o.data(), o.ptr, q_elems * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(h_lse.data(), lse.ptr, lse_elems * 4, cudaMemcpyDeviceToHost), cudaSuccess);

  AttentionShape mask{batch, c.seqlen_q, 0, c.heads_q, c.heads_kv, d, 0.f, c.causal};
  mask.window_left = c.window_left;
  flash3::testing::expect_entries_close(
      mask, c.dtype, q.ptr, batch, nullptr,
      [&](int b) {
        size_t const first = size_t(b) * capacity * row_elems;
        return flash3::testing::EntryKeys{pk.ptr + first, pv.ptr + first, c.seqlens[b]};
      },
      h_o, h_lse);
}

// Lengths of 0, 1, at and around page and box boundaries, and a full entry.
std::vector<int> page_edge_seqlens(int page_size, int max_pages) {
  return {0, 1, 15, 16, 17, page_size - 1, page_size, page_size + 1, 3 * page_size, max_pages * page_size};
}

TEST(PagedKvCache, PageSizes) {
  SKIP_WITHOUT_CUDA_DEVICE();
  uint32_t seed = 1000;
  for (int ps : {16, 48, 64, 256}) {
    for (int splits : {1, 0, 3}) {
      SCOPED_TRACE("page_size " + std::to_string(ps) + " num_splits " + std::to_string(splits));
      int const max_pages = 2048 / ps;
      run_paged_case({.page_size = ps, .max_pages = max_pages, .seqlens = page_edge_seqlens(ps, max_pages),
                      .num_splits = splits},
                     seed++);
    }
  }
}

TEST(PagedKvCache, CausalWindowsGqa) {
  SKIP_WITHOUT_CUDA_DEVICE();
  uint32_t seed = 1100;
  for (int sq : {1, 7, 130}) {
    for (int splits : {1, 4}) {
      SCOPED_TRACE("seqlen_q " + std::to_string(sq) + " num_splits " + std::to_string(splits));
      std::vector<int> lens = {sq, 300, 1024, 513};
      run_paged_case({.seqlen_q = sq, .page_size = 16, .max_pages = 64, .seqlens = lens, .causal = true,
                      .num_splits = splits},
                     seed++);
      run_paged_case({.seqlen_q = sq, .page_size = 64, .seqlens = lens, .heads_q = 32, .heads_kv = 4,
                      .window_left = 100, .num_splits = splits},
                     seed++);
      run_paged_case({.dtype = DType::kFP16, .seqlen_q = sq, .page_size = 256, .max_pages = 4, .seqlens = lens,
                      .heads_kv = 1, .causal = true, .num_splits = splits},
                     seed++);
    }
  }
}

TEST(PagedKvCache, EveryHeadDim) {
  SKIP_WITHOUT_CUDA_DEVICE();
  uint32_t seed = 1200;
  for (int d : {64, 96, 128, 192, 256}) {
    SCOPED_TRACE("head_dim " + std::to_string(d));
    run_paged_case({.head_dim = d, .seqlen_q = 2, .page_size = 32, .max_pages = 40, .seqlens = page_edge_seqlens(32, 40),
                    .causal = true, .num_splits = 0},
                   seed++);
  }
}

}  // namespace
