// Appending to a KV cache (ForwardArgs::kv_cache.append) on the GPU. After
// the call every cache element holds what it held before, bit for bit, but
// for the appended rows, which hold the new keys (rotated on the host with
// rotary tables, rotary_reference.h) and values; rows and pages no entry
// uses hold a finite poison (the attention reads masked rows, which must be
// finite), so that a stray write shows as a changed element. O and the LSE
// are checked against the references over each entry's keys read back from
// the cache as a plain tensor, with Q rotated on the host.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "flash3/flash3.h"
#include "gpu_test_util.h"
#include "kv_cache_check.h"
#include "reference.h"
#include "rotary_reference.h"

namespace {

using flash3::DType;
using flash3::reference::AttentionShape;
using flash3::testing::DeviceBuffer;
using flash3::testing::from_bits;
using flash3::testing::to_bits;

constexpr uint16_t kPoison = 0x3e3e;  // finite in bf16 and fp16 alike

struct AppendCase {
  DType dtype = DType::kBF16;
  int head_dim = 128;
  int seqlen_q = 1;
  int seqlen_new = 1;
  std::vector<int> seqlens;  // cache_seqlens, before the append
  int capacity = 512;        // an entry's rows
  int page_size = 0;         // 0: a contiguous cache, else a paged one
  int heads_q = 8;
  int heads_kv = 2;
  bool permute = false;  // contiguous: entry b in cache entry batch_cache - 1 - b (cache_batch_idx)
  bool leftpad = false;  // contiguous: keys from min(seqlens[b], 13 * b % 37)
  int rotary_dim = 0;    // 0: no rotary embedding
  bool interleaved = false;
  bool causal = false;
  int window_left = -1;
  int num_splits = 1;
};

// Where the cache holds key `key` of entry b: its first element.
struct CacheLayout {
  int capacity;
  int page_size;
  size_t row_elems;
  std::vector<int32_t> entry;  // contiguous: entry b's cache entry
  std::vector<int32_t> table;  // paged: [batch, capacity / page_size]
  size_t at(int b, int key) const {
    if (page_size == 0) return (size_t(entry[b]) * capacity + key) * row_elems;
    int const columns = capacity / page_size;
    return (size_t(table[size_t(b) * columns + key / page_size]) * page_size + key % page_size) * row_elems;
  }
};

bool close_enough(uint16_t got, uint16_t want, DType dtype) {
  float const g = from_bits(got, dtype), w = from_bits(want, dtype);
  float const tol = dtype == DType::kBF16 ? 1.f / 128 : 1.f / 1024;  // about an ulp: FMA may round differently
  return std::fabs(g - w) <= tol * std::max(1.f, std::fabs(w));
}

void run_append_case(AppendCase const& c, uint32_t seed) {
  int const batch = int(c.seqlens.size()), d = c.head_dim, sn = c.seqlen_new, ps = c.page_size;
  bool const paged = ps > 0;
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  CacheLayout layout{c.capacity, ps, size_t(c.heads_kv) * d, {}, {}};
  // Contiguous: two cache entries beyond the batch's. Paged: each entry owns
  // the pages its keys after the append need, three pages are no entry's,
  // and the pool holds them in random order.
  int slots = 0;
  if (!paged) {
    slots = batch + 2;
    for (int b = 0; b < batch; ++b) layout.entry.push_back(c.permute ? slots - 1 - b : b);
  } else {
    int const columns = c.capacity / ps;
    std::vector<int> owned(batch);
    slots = 3;
    for (int b = 0; b < batch; ++b) slots += owned[b] = (c.seqlens[b] + sn + ps - 1) / ps;
    std::vector<int> order(slots);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    layout.table.assign(size_t(batch) * columns, -1);
    int next = 0;
    for (int b = 0; b < batch; ++b) {
      for (int col = 0; col < owned[b]; ++col) layout.table[size_t(b) * columns + col] = order[next++];
    }
  }
  size_t const cache_elems = size_t(slots) * (paged ? ps : c.capacity) * layout.row_elems;
  std::vector<uint16_t> cache_k(cache_elems, kPoison), cache_v(cache_elems, kPoison);
  for (int b = 0; b < batch; ++b) {
    for (int key = 0; key < c.seqlens[b]; ++key) {
      for (size_t e = 0; e < layout.row_elems; ++e) {
        cache_k[layout.at(b, key) + e] = to_bits(normal(rng), c.dtype);
        cache_v[layout.at(b, key) + e] = to_bits(normal(rng), c.dtype);
      }
    }
  }
  size_t const new_elems = size_t(batch) * sn * layout.row_elems;
  size_t const q_elems = size_t(batch) * c.seqlen_q * c.heads_q * d;
  std::vector<uint16_t> new_k(new_elems), new_v(new_elems), h_q(q_elems);
  for (uint16_t& x : new_k) x = to_bits(normal(rng), c.dtype);
  for (uint16_t& x : new_v) x = to_bits(normal(rng), c.dtype);
  for (uint16_t& x : h_q) x = to_bits(normal(rng), c.dtype);
  // Tables of every position an entry holds, at the usual frequencies.
  int const half = c.rotary_dim / 2;
  std::vector<uint16_t> cos_bits(size_t(c.capacity) * half), sin_bits(cos_bits.size());
  for (int pos = 0; pos < c.capacity; ++pos) {
    for (int p = 0; p < half; ++p) {
      double const angle = pos * std::pow(10000.0, -2.0 * p / c.rotary_dim);
      cos_bits[size_t(pos) * half + p] = to_bits(float(std::cos(angle)), c.dtype);
      sin_bits[size_t(pos) * half + p] = to_bits(float(std::sin(angle)), c.dtype);
    }
  }
  // A row (head_dim values) rotated at `pos` on the host, rounded once.
  auto rotated = [&](uint16_t const* row, int pos, uint16_t* out) {
    std::vector<float> x(d), cs(half), sn_(half);
    for (int i = 0; i < d; ++i) x[i] = from_bits(row[i], c.dtype);
    for (int p = 0; p < half; ++p) {
      cs[p] = from_bits(cos_bits[size_t(pos) * half + p], c.dtype);
      sn_[p] = from_bits(sin_bits[size_t(pos) * half + p], c.dtype);
    }
    if (half > 0) flash3::testing::rotate_row(x.data(), c.rotary_dim, cs.data(), sn_.data(), c.interleaved);
    for (int i = 0; i < d; ++i) out[i] = to_bits(x[i], c.dtype);
  };
  // The caches as they must be after the call; `fresh` marks appended rows.
  std::vector<uint16_t> want_k = cache_k, want_v = cache_v;
  std::vector<bool> fresh(cache_elems / layout.row_elems, false);
  for (int b = 0; b < batch; ++b) {
    for (int j = 0; j < sn; ++j) {
      size_t const at = layout.at(b, c.seqlens[b] + j);
      fresh[at / layout.row_elems] = true;
      for (int h = 0; h < c.heads_kv; ++h) {
        size_t const src = ((size_t(b) * sn + j) * c.heads_kv + h) * d;
        rotated(&new_k[src], c.seqlens[b] + j, &want_k[at + size_t(h) * d]);
        std::copy_n(&new_v[src], d, &want_v[at + size_t(h) * d]);
      }
    }
  }
  bool const per_row = c.causal || (c.window_left >= 0 && c.window_left < c.capacity - 1);
  std::vector<uint16_t> q_rotated(q_elems);
  for (int b = 0; b < batch; ++b) {
    for (int i = 0; i < c.seqlen_q; ++i) {
      for (int h = 0; h < c.heads_q; ++h) {
        size_t const at = ((size_t(b) * c.seqlen_q + i) * c.heads_q + h) * d;
        rotated(&h_q[at], c.seqlens[b] + (per_row ? i : 0), &q_rotated[at]);
      }
    }
  }

  std::vector<int32_t> h_pad(batch, 0);
  for (int b = 0; b < batch && c.leftpad; ++b) h_pad[b] = std::min(c.seqlens[b], 13 * b % 37);
  DeviceBuffer<uint16_t> q(q_elems), k(cache_elems), v(cache_elems), o(q_elems), nk(new_elems), nv(new_elems),
      cos(std::max<size_t>(cos_bits.size(), 1)), sin(std::max<size_t>(sin_bits.size(), 1));
  size_t const lse_elems = size_t(batch) * c.heads_q * c.seqlen_q;
  DeviceBuffer<float> lse(lse_elems);
  DeviceBuffer<int32_t> seqlens(batch), entry(batch), pad(batch), table(std::max<size_t>(layout.table.size(), 1));
  auto upload = [](auto* dst, auto const& host) {
    if (host.empty()) return;
    ASSERT_EQ(cudaMemcpy(dst, host.data(), host.size() * sizeof(host[0]), cudaMemcpyHostToDevice), cudaSuccess);
  };
  upload(q.ptr, h_q);
  upload(k.ptr, cache_k);
  upload(v.ptr, cache_v);
  upload(nk.ptr, new_k);
  upload(nv.ptr, new_v);
  upload(cos.ptr, cos_bits);
  upload(sin.ptr, sin_bits);
  upload(seqlens.ptr, c.seqlens);
  upload(entry.ptr, layout.entry);
  upload(pad.ptr, h_pad);
  upload(table.ptr, layout.table);
  ASSERT_EQ(cudaMemset(o.ptr, 0xff, q_elems * 2), cudaSuccess);
  ASSERT_EQ(cudaMemset(lse.ptr, 0xff, lse_elems * 4), cudaSuccess);

  flash3::ForwardArgs a = flash3::testing::cache_call(c.dtype, batch, c.seqlen_q, c.capacity, c.heads_q, c.heads_kv,
                                                      d, q.ptr, k.ptr, v.ptr, paged ? ps : c.capacity, o.ptr, lse.ptr);
  a.causal = c.causal;
  a.window_left = c.window_left;
  a.kv_cache.seqlens = seqlens.ptr;
  a.kv_cache.batch_idx = c.permute ? entry.ptr : nullptr;
  a.kv_cache.leftpad = c.leftpad ? pad.ptr : nullptr;
  a.kv_cache.batch_cache = slots;
  a.kv_cache.num_splits = c.num_splits;
  if (paged) {
    a.kv_cache.page_table = table.ptr;
    a.kv_cache.page_table_stride = c.capacity / ps;
    a.kv_cache.page_size = ps;
  }
  flash3::KvAppend& n = a.kv_cache.append;
  n.k = flash3::contiguous<const void*>(nk.ptr, sn, c.heads_kv, d);
  n.v = flash3::contiguous<const void*>(nv.ptr, sn, c.heads_kv, d);
  n.seqlen_new = sn;
  if (c.rotary_dim > 0) {
    n.rotary_cos = cos.ptr;
    n.rotary_sin = sin.ptr;
    n.rotary_seqlen = c.capacity;
    n.rotary_dim = c.rotary_dim;
    n.rotary_interleaved = c.interleaved;
  }
  if (!flash3::testing::forward_ran(a)) return;
  std::vector<uint16_t> got_k(cache_elems), got_v(cache_elems), got_q(q_elems), h_o(q_elems);
  std::vector<float> h_lse(lse_elems);
  ASSERT_EQ(cudaMemcpy(got_k.data(), k.ptr, cache_elems * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(got_v.data(), v.ptr, cache_elems * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(got_q.data(), q.ptr, q_elems * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(h_o.data(), o.ptr, q_elems * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(h_lse.data(), lse.ptr, lse_elems * 4, cudaMemcpyDeviceToHost), cudaSuccess);

  EXPECT_TRUE(got_q == h_q) << "q must be read, not changed";
  // Rows not appended: bit for bit as before. Appended rows: the values
  // exactly, the keys within rounding of the host's rotation.
  auto expect_cache = [&](char const* name, std::vector<uint16_t> const& got, std::vector<uint16_t> const& want,
                          bool rotated_rows) {
    size_t bad = 0, first = 0;
    for (size_t e = 0; e < cache_elems; ++e) {
      bool const appended = fresh[e / layout.row_elems];
      bool const ok = appended && rotated_rows ? close_enough(got[e], want[e], c.dtype) : got[e] == want[e];
      if (!ok && bad++ == 0) first = e;
    }
    EXPECT_EQ(bad, 0u) << name << " cache element " << first << " (row " << first / layout.row_elems
                       << (fresh[first / layout.row_elems] ? ", appended" : ", not appended") << "): got "
                       << from_bits(got[first], c.dtype) << ", want " << from_bits(want[first], c.dtype);
  };
  expect_cache("K", got_k, want_k, c.rotary_dim > 0);
  expect_cache("V", got_v, want_v, false);

  // Each entry's keys after the append, from the cache as it came back.
  std::vector<uint16_t> plain_k(size_t(batch) * c.capacity * layout.row_elems, 0), plain_v = plain_k;
  for (int b = 0; b < batch; ++b) {
    for (int key = 0; key < c.seqlens[b] + sn; ++key) {
      size_t const to = (size_t(b) * c.capacity + key) * layout.row_elems;
      std::copy_n(&got_k[layout.at(b, key)], layout.row_elems, &plain_k[to]);
      std::copy_n(&got_v[layout.at(b, key)], layout.row_elems, &plain_v[to]);
    }
  }
  DeviceBuffer<uint16_t> pk(plain_k.size()), pv(plain_v.size()), rq(q_elems);
  upload(pk.ptr, plain_k);
  upload(pv.ptr, plain_v);
  upload(rq.ptr, q_rotated);
  AttentionShape mask{batch, c.seqlen_q, 0, c.heads_q, c.heads_kv, d, 0.f, c.causal};
  mask.window_left = c.window_left;
  flash3::testing::expect_entries_close(
      mask, c.dtype, rq.ptr, batch, nullptr,
      [&](int b) {
        size_t const first = (size_t(b) * c.capacity + h_pad[b]) * layout.row_elems;
        return flash3::testing::EntryKeys{pk.ptr + first, pv.ptr + first,
                                          std::max(c.seqlens[b] + sn - h_pad[b], 0)};
      },
      h_o, h_lse);
}

TEST(KvAppend, ContiguousCache) {
  SKIP_WITHOUT_CUDA_DEVICE();
  uint32_t seed = 2000;
  for (int sn : {1, 5, 130}) {
    for (int splits : {1, 0, 3}) {
      SCOPED_TRACE("seqlen_new " + std::to_string(sn) + " num_splits " + std::to_string(splits));
      run_append_case({.seqlen_new = sn, .seqlens = {0, 1, 127, 128, 300, 512 - sn}, .num_splits = splits}, seed++);
    }
  }
}

TEST(KvAppend, BatchIdxLeftpadCausal) {
  SKIP_WITHOUT_CUDA_DEVICE();
  uint32_t seed = 2100;
  for (bool permute : {false, true}) {
    for (bool pad : {false, true}) {
      for (int splits : {1, 4}) {
        SCOPED_TRACE(std::string(permute ? "batch_idx " : "") + (pad ? "leftpad " : "") + "num_splits " +
                     std::to_string(splits));
        run_append_case({.seqlen_q = 3, .seqlen_new = 3, .seqlens = {0, 20, 40, 200, 509}, .permute = permute,
                         .leftpad = pad, .causal = true, .num_splits = splits},
                        seed++);
      }
    }
  }
}

// Appends that start at, end at and cross page boundaries, from an empty entry.
TEST(KvAppend, PagedAcrossPages) {
  SKIP_WITHOUT_CUDA_DEVICE();
  uint32_t seed = 2200;
  for (int ps : {16, 64, 256}) {
    for (int sn : {1, 3, 17}) {
      for (int splits : {1, 0}) {
        SCOPED_TRACE("page_size " + std::to_string(ps) + " seqlen_new " + std::to_string(sn) + " num_splits " +
                     std::to_string(splits));
        run_append_case({.seqlen_new = sn, .seqlens = {0, ps - 1, ps, ps + 1, 2 * ps - sn, 1024 - sn},
                         .capacity = 1024, .page_size = ps, .num_splits = splits},
                        seed++);
      }
    }
  }
}

// Rotary embedding: interleaved and not, over all of the head dim and part
// of it, Q at one position (no mask) or at its rows' (causal, window).
TEST(KvAppend, Rotary) {
  SKIP_WITHOUT_CUDA_DEVICE();
  uint32_t seed = 2300;
  for (int rd : {128, 64, 16}) {
    for (bool interleaved : {false, true}) {
      for (int splits : {1, 3}) {
        SCOPED_TRACE("rotary_dim " + std::to_string(rd) + (interleaved ? " interleaved" : "") + " num_splits " +
                     std::to_string(splits));
        std::vector<int> lens = {0, 15, 64, 333};
        run_append_case({.seqlen_q = 4, .seqlen_new = 4, .seqlens = lens, .rotary_dim = rd,
                         .interleaved = interleaved, .num_splits = splits},
                        seed++);
        run_append_case({.seqlen_q = 4, .seqlen_new = 4, .seqlens = lens, .page_size = 16, .rotary_dim = rd,
                         .interleaved = interleaved, .causal = true, .num_splits = splits},
                        seed++);
        run_append_case({.seqlen_q = 2, .seqlen_new = 2, .seqlens = lens, .heads_q = 32, .heads_kv = 4,
                         .leftpad = true, .rotary_dim = rd, .interleaved = interleaved, .window_left = 50,
                         .num_splits = splits},
                        seed++);
      }
    }
  }
}

TEST(KvAppend, GqaMqaFp16OtherHeadDims) {
  SKIP_WITHOUT_CUDA_DEVICE();
  uint32_t seed = 2400;
  for (int splits : {1, 0}) {
    run_append_case({.dtype = DType::kFP16, .seqlen_q = 5, .seqlen_new = 5, .seqlens = {0, 100, 250},
                     .heads_q = 16, .heads_kv = 1, .rotary_dim = 32, .causal = true, .num_splits = splits},
                    seed++);
    for (int d : {64, 96, 192, 256}) {
      SCOPED_TRACE("head_dim " + std::to_string(d));
      run_append_case({.head_dim = d, .seqlen_new = 2, .seqlens = {0, 31, 400}, .page_size = 32,
                       .rotary_dim = 32, .interleaved = true, .num_splits = splits},
                      seed++);
    }
  }
}

}  // namespace
