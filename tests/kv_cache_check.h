// The KV cache GPU tests' call and check: the ForwardArgs of a decoding
// call, and flash3's O and LSE against the references, run one batch entry
// at a time over that entry's keys as a plain tensor.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <vector>

#include "flash3/flash3.h"
#include "gpu_test_util.h"
#include "reference.h"

namespace flash3::testing {

// A decoding call's sizes and dense tensors: q and o [batch, seqlen_q,
// heads_q, d], the caches [.., cache_rows, heads_kv, d] with cache_rows an
// entry's (contiguous cache) or a page's; seqlen_k is an entry's capacity.
// The kv_cache fields are the caller's to set.
inline ForwardArgs cache_call(DType dtype, int batch, int seqlen_q, int seqlen_k, int heads_q, int heads_kv, int d,
                              const void* q, const void* k, const void* v, int cache_rows, void* o, float* lse) {
  ForwardArgs a;
  a.dtype = dtype;
  a.batch = batch;
  a.seqlen_q = seqlen_q;
  a.seqlen_k = seqlen_k;
  a.heads_q = heads_q;
  a.heads_kv = heads_kv;
  a.head_dim = d;
  a.q = contiguous(q, seqlen_q, heads_q, d);
  a.k = contiguous(k, cache_rows, heads_kv, d);
  a.v = contiguous(v, cache_rows, heads_kv, d);
  a.o = contiguous(o, seqlen_q, heads_q, d);
  a.lse = lse;
  return a;
}

// Runs the call and waits for it: false when this build has no kernel for
// it (one narrowed with FLASH3_HEAD_DIMS), said on stdout, or when it fails
// (a test failure).
inline bool forward_ran(ForwardArgs const& a) {
  Status const s = forward(a, nullptr);
  if (s.code() == Status::Code::kUnsupported) {
    std::printf("head_dim %d skipped: %s\n", int(a.head_dim), s.message().c_str());
    return false;
  }
  EXPECT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return s.ok();
}

// An entry's keys and values, [1, keys, heads_kv, head_dim], contiguous.
struct EntryKeys {
  const uint16_t* k;
  const uint16_t* v;
  int keys;
};

// q: the call's [batch, seqlen_q, heads_q, d] on the device; `mask` the
// call's AttentionShape but for batch and seqlen_k (causal, window, softcap);
// entry(b) entry b's keys; o and lse flash3's results on the host.
template <class Entry>
void expect_entries_close(reference::AttentionShape mask, DType dtype, const uint16_t* q, int batch,
                          const float* sinks, Entry&& entry, std::vector<uint16_t> const& o,
                          std::vector<float> const& lse) {
  int const sq = mask.seqlen_q, hq = mask.heads_q, hkv = mask.heads_kv, d = mask.head_dim;
  size_t const q_batch = size_t(sq) * hq * d, lse_batch = size_t(hq) * sq;
  size_t const q_elems = q_batch * batch, lse_elems = lse_batch * batch;
  DeviceBuffer<float> ref_o(q_elems), ref_lse(lse_elems), low_o(q_elems);
  for (int b = 0; b < batch; ++b) {
    EntryKeys const e = entry(b);
    reference::AttentionShape shape = mask;
    shape.batch = 1;
    shape.seqlen_k = e.keys;
    ConstTensor const qb = contiguous<const void*>(q + b * q_batch, sq, hq, d);
    ConstTensor const kb = contiguous<const void*>(e.k, e.keys, hkv, d);
    ConstTensor const vb = contiguous<const void*>(e.v, e.keys, hkv, d);
    EXPECT_EQ(reference::attention_gpu(shape, dtype, qb, kb, vb, ref_o.ptr + b * q_batch, ref_lse.ptr + b * lse_batch,
                                       false, nullptr, sinks),
              cudaSuccess);
    EXPECT_EQ(reference::attention_gpu(shape, dtype, qb, kb, vb, low_o.ptr + b * q_batch, nullptr, true, nullptr,
                                       sinks),
              cudaSuccess);
  }
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> h_ref(q_elems), h_low(q_elems), h_ref_lse(lse_elems);
  EXPECT_EQ(cudaMemcpy(h_ref.data(), ref_o.ptr, q_elems * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(h_low.data(), low_o.ptr, q_elems * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(h_ref_lse.data(), ref_lse.ptr, lse_elems * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  expect_forward_close(o, dtype, h_ref, h_low, lse, h_ref_lse, [](size_t) { return 0.0; });
}

}  // namespace flash3::testing
