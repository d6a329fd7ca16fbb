// MLA (ForwardArgs::qv) through the C++ API against the GPU reference of
// attention over the parts concatenated: q|qv against k|v (head dim 576),
// values v (512), one batch entry at a time over its keys read back from the
// cache (contiguous or paged, pages in shuffled order).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "flash3/flash3.h"
#include "gpu_test_util.h"
#include "reference.h"

namespace {

using flash3::DType;
using flash3::testing::DeviceBuffer;
using flash3::testing::to_bits;

constexpr int kD = 64, kDv = 512;  // the rotary part's head dim, the latent part's

struct MlaCase {
  std::vector<int> seqlens;  // keys of each batch entry
  int seqlen_q = 1;
  int heads_q = 16;
  int heads_kv = 1;
  int capacity = 1024;  // an entry's rows
  int page_size = 0;    // 0: a contiguous cache
  bool causal = false;
  int num_splits = 1;
};

void run_mla_case(MlaCase const& c, uint32_t seed) {
  int const batch = int(c.seqlens.size()), sq = c.seqlen_q, hq = c.heads_q, hkv = c.heads_kv;
  int const pages_per_entry = c.page_size ? c.capacity / c.page_size : 1;
  int const entries = c.page_size ? batch * pages_per_entry : batch;
  int const entry_rows = c.page_size ? c.page_size : c.capacity;
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  auto random = [&](size_t n) {
    std::vector<uint16_t> x(n);
    for (uint16_t& v : x) v = to_bits(normal(rng), DType::kBF16);
    return x;
  };
  std::vector<uint16_t> h_q = random(size_t(batch) * sq * hq * kD), h_qv = random(size_t(batch) * sq * hq * kDv);
  std::vector<uint16_t> h_k = random(size_t(entries) * entry_rows * hkv * kD);
  std::vector<uint16_t> h_v = random(size_t(entries) * entry_rows * hkv * kDv);
  // Entry b's j-th page is pages[b * pages_per_entry + j] (a shuffle of all pages).
  std::vector<int32_t> pages(entries);
  std::iota(pages.begin(), pages.end(), 0);
  std::shuffle(pages.begin(), pages.end(), rng);
  auto cache_row = [&](int b, int j) -> size_t {  // the cache row (entry * entry_rows + row) of key j of entry b
    if (!c.page_size) return size_t(b) * c.capacity + j;
    return size_t(pages[b * pages_per_entry + j / c.page_size]) * c.page_size + j % c.page_size;
  };
  auto upload = [](auto& device, auto const& host) {
    ASSERT_EQ(cudaMemcpy(device.ptr, host.data(), host.size() * sizeof(host[0]), cudaMemcpyHostToDevice), cudaSuccess);
  };
  DeviceBuffer<uint16_t> q(h_q.size()), qv(h_qv.size()), k(h_k.size()), v(h_v.size());
  size_t const o_elems = size_t(batch) * sq * hq * kDv, lse_elems = size_t(batch) * hq * sq;
  DeviceBuffer<uint16_t> o(o_elems);
  DeviceBuffer<float> lse(lse_elems);
  DeviceBuffer<int32_t> seqlens(batch), table(entries);
  upload(q, h_q);
  upload(qv, h_qv);
  upload(k, h_k);
  upload(v, h_v);
  upload(seqlens, c.seqlens);
  upload(table, pages);
  ASSERT_EQ(cudaMemset(o.ptr, 0xff, o_elems * 2), cudaSuccess);  // poison: an unwritten element reads back NaN
  ASSERT_EQ(cudaMemset(lse.ptr, 0xff, lse_elems * 4), cudaSuccess);

  flash3::ForwardArgs a;
  a.dtype = DType::kBF16;
  a.batch = batch;
  a.seqlen_q = sq;
  a.seqlen_k = c.capacity;
  a.heads_q = hq;
  a.heads_kv = hkv;
  a.head_dim = kD;
  a.head_dim_v = kDv;
  a.q = flash3::contiguous<const void*>(q.ptr, sq, hq, kD);
  a.qv = flash3::contiguous<const void*>(qv.ptr, sq, hq, kDv);
  a.k = flash3::contiguous<const void*>(k.ptr, entry_rows, hkv, kD);
  a.v = flash3::contiguous<const void*>(v.ptr, entry_rows, hkv, kDv);
  a.o = flash3::contiguous<void*>(o.ptr, sq, hq, kDv);
  a.lse = lse.ptr;
  a.causal = c.causal;
  a.kv_cache.seqlens = seqlens.ptr;
  a.kv_cache.batch_cache = entries;
  a.kv_cache.num_splits = c.num_splits;
  if (c.page_size) {
    a.kv_cache.page_table = table.ptr;
    a.kv_cache.page_table_stride = pages_per_entry;
    a.kv_cache.page_size = c.page_size;
  }
  flash3::Status const s = flash3::forward(a, nullptr);
  if (s.code() == flash3::Status::Code::kUnsupported) GTEST_SKIP() << s.message();
  ASSERT_TRUE(s.ok()) << s.message();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint16_t> h_o(o_elems);
  std::vector<float> h_lse(lse_elems);
  ASSERT_EQ(cudaMemcpy(h_o.data(), o.ptr, o_elems * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(h_lse.data(), lse.ptr, lse_elems * 4, cudaMemcpyDeviceToHost), cudaSuccess);

  // The reference, entry by entry: q|qv [1, sq, hq, 576] against k|v [1, keys, hkv, 576].
  std::vector<float> ref, low, ref_lse(lse_elems);
  for (int b = 0; b < batch; ++b) {
    int const keys = c.seqlens[b];
    std::vector<uint16_t> qc(size_t(sq) * hq * (kD + kDv)), kc(size_t(std::max(keys, 1)) * hkv * (kD + kDv));
    std::vector<uint16_t> vc(size_t(std::max(keys, 1)) * hkv * kDv);
    for (size_t r = 0; r < size_t(sq) * hq; ++r) {
      size_t const src = size_t(b) * sq * hq + r;
      std::copy_n(&h_q[src * kD], kD, &qc[r * (kD + kDv)]);
      std::copy_n(&h_qv[src * kDv], kDv, &qc[r * (kD + kDv) + kD]);
    }
    for (int j = 0; j < keys; ++j) {
      for (int h = 0; h < hkv; ++h) {
        size_t const src = cache_row(b, j) * hkv + h, dst = size_t(j) * hkv + h;
        std::copy_n(&h_k[src * kD], kD, &kc[dst * (kD + kDv)]);
        std::copy_n(&h_v[src * kDv], kDv, &kc[dst * (kD + kDv) + kD]);
        std::copy_n(&h_v[src * kDv], kDv, &vc[dst * kDv]);
      }
    }
    DeviceBuffer<uint16_t> dq(qc.size()), dk(kc.size()), dv(vc.size());
    upload(dq, qc);
    upload(dk, kc);
    upload(dv, vc);
    flash3::reference::AttentionShape shape{1, sq, keys, hq, hkv, kD + kDv, 1.f / std::sqrt(float(kD + kDv)),
                                            c.causal};
    shape.head_dim_v = kDv;
    size_t const rows = size_t(sq) * hq;
    DeviceBuffer<float> r_o(rows * kDv), l_o(rows * kDv), r_lse(rows);
    auto const cq = flash3::contiguous<const void*>(dq.ptr, sq, hq, kD + kDv);
    auto const ck = flash3::contiguous<const void*>(dk.ptr, keys, hkv, kD + kDv);
    auto const cv = flash3::contiguous<const void*>(dv.ptr, keys, hkv, kDv);
    ASSERT_EQ(flash3::reference::attention_gpu(shape, DType::kBF16, cq, ck, cv, r_o.ptr, r_lse.ptr, false, nullptr),
              cudaSuccess);
    ASSERT_EQ(flash3::reference::attention_gpu(shape, DType::kBF16, cq, ck, cv, l_o.ptr, nullptr, true, nullptr),
              cudaSuccess);
    std::vector<float> hr(rows * kDv), hl(rows * kDv);
    ASSERT_EQ(cudaMemcpy(hr.data(), r_o.ptr, hr.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(hl.data(), l_o.ptr, hl.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(&ref_lse[size_t(b) * hq * sq], r_lse.ptr, rows * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    ref.insert(ref.end(), hr.begin(), hr.end());
    low.insert(low.end(), hl.begin(), hl.end());
  }
  flash3::testing::expect_forward_close(h_o, DType::kBF16, ref, low, h_lse, ref_lse, [](size_t) { return 0.0; });
}

TEST(Mla, Decoding) {
  SKIP_WITHOUT_CUDA_DEVICE();
  uint32_t seed = 500;
  for (int heads : {16, 128}) {
    for (int splits : {1, 0, 3}) {
      SCOPED_TRACE(std::to_string(heads) + " heads, num_splits " + std::to_string(splits));
      run_mla_case({.seqlens = {0, 1, 63, 64, 65, 1000, 1024}, .heads_q = heads, .num_splits = splits}, seed++);
    }
  }
}

TEST(Mla, PagedCache) {
  SKIP_WITHOUT_CUDA_DEVICE();
  uint32_t seed = 600;
  for (int page : {16, 64, 256}) {
    for (int splits : {1, 4}) {
      SCOPED_TRACE("page " + std::to_string(page) + ", num_splits " + std::to_string(splits));
      run_mla_case({.seqlens = {1, page - 1, page, page + 1, 1024}, .page_size = page, .num_splits = splits}, seed++);
    }
  }
}

TEST(Mla, QueryPositionsPackedWithHeads) {
  SKIP_WITHOUT_CUDA_DEVICE();
  uint32_t seed = 700;
  for (auto [sq, hq, hkv] : {std::tuple{2, 128, 1}, std::tuple{3, 12, 2}, std::tuple{70, 8, 1}}) {
    for (int splits : {1, 2}) {
      SCOPED_TRACE(std::to_string(sq) + " positions, " + std::to_string(hq) + "/" + std::to_string(hkv) + " heads");
      run_mla_case({.seqlens = {sq, 200, 999}, .seqlen_q = sq, .heads_q = hq, .heads_kv = hkv, .causal = true,
                    .num_splits = splits},
                   seed++);
    }
  }
}

}  // namespace
