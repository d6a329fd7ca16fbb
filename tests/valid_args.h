// Valid problems over fake, suitably aligned addresses, for the CPU tests of
// validation: never dereferenced, validate() only looks at them.
#pragma once

#include <cstdint>
#include <type_traits>

#include "flash3/flash3.h"

namespace flash3::testing {

inline void* fake_address(uintptr_t addr) { return reinterpret_cast<void*>(addr); }

// The sizes and the Q, K, V inputs every pass takes.
template <class Args>
Args with_valid_inputs() {
  Args a;
  a.batch = 2;
  a.seqlen_q = 100;
  a.seqlen_k = 300;
  a.heads_q = 8;
  a.heads_kv = 2;
  a.head_dim = 128;
  a.q = contiguous<const void*>(fake_address(0x10000), a.seqlen_q, a.heads_q, a.head_dim);
  a.k = contiguous<const void*>(fake_address(0x20000), a.seqlen_k, a.heads_kv, a.head_dim);
  a.v = contiguous<const void*>(fake_address(0x30000), a.seqlen_k, a.heads_kv, a.head_dim);
  return a;
}

inline ForwardArgs valid_forward_args() {
  ForwardArgs a = with_valid_inputs<ForwardArgs>();
  a.o = contiguous<void*>(fake_address(0x40000), a.seqlen_q, a.heads_q, a.head_dim);
  return a;
}

// A valid decoding call: q [2, 1, 8, 128] against caches of 3 entries of
// 300 rows (valid_forward_args' K and V, one more entry).
inline ForwardArgs valid_cache_args() {
  ForwardArgs a = valid_forward_args();
  a.seqlen_q = 1;
  a.q = contiguous<const void*>(a.q.data, 1, a.heads_q, a.head_dim);
  a.o = contiguous<void*>(a.o.data, 1, a.heads_q, a.head_dim);
  a.kv_cache.seqlens = reinterpret_cast<const int32_t*>(0x80000);
  a.kv_cache.batch_cache = 3;
  a.kv_cache.num_splits = 0;
  return a;
}

inline QuantizeArgs valid_quantize_args() {
  QuantizeArgs a = with_valid_inputs<QuantizeArgs>();
  a.q_out = contiguous<void*>(fake_address(0x40000), a.seqlen_q, a.heads_q, a.head_dim);
  a.k_out = contiguous<void*>(fake_address(0x50000), a.seqlen_k, a.heads_kv, a.head_dim);
  a.v_out = contiguous<void*>(fake_address(0x60000), a.seqlen_k, a.heads_kv, a.head_dim);
  a.q_scale = reinterpret_cast<float*>(0x70000);
  a.k_scale = reinterpret_cast<float*>(0x71000);
  a.v_scale = reinterpret_cast<float*>(0x72000);
  return a;
}

// Each tensor of `a` (ForwardArgs or BackwardArgs) laid out densely for its
// own head dim, rows_q or rows_k rows: Q, K, dQ, dK for Q's head dim; V, O,
// dO, dV for V's. packed: one batch entry of those rows (batch_stride unused).
template <class Args>
void lay_out_tensors(Args& a, int64_t rows_q, int64_t rows_k, bool packed) {
  int64_t const d = a.head_dim, dv = a.head_dim_v != 0 ? a.head_dim_v : a.head_dim;
  auto lay_out = [packed](auto& t, int64_t rows, int64_t heads, int64_t dim) {
    t = contiguous(t.data, rows, heads, dim);
    if (packed) t.batch_stride = 0;
  };
  lay_out(a.q, rows_q, a.heads_q, d);
  lay_out(a.k, rows_k, a.heads_kv, d);
  lay_out(a.v, rows_k, a.heads_kv, dv);
  lay_out(a.o, rows_q, a.heads_q, dv);
  if constexpr (std::is_same_v<Args, BackwardArgs>) {
    lay_out(a.dout, rows_q, a.heads_q, dv);
    lay_out(a.dq, rows_q, a.heads_q, d);
    lay_out(a.dk, rows_k, a.heads_kv, d);
    lay_out(a.dv, rows_k, a.heads_kv, dv);
  }
}

// `a` with Q/K's head dim `d` and V's `head_dim_v` (0: d's).
template <class Args>
Args with_head_dims(Args a, int64_t d, int64_t head_dim_v) {
  a.head_dim = d;
  a.head_dim_v = head_dim_v;
  lay_out_tensors(a, a.seqlen_q, a.seqlen_k, false);
  return a;
}

// `a` over packed sequences (varlen): 3 sequences in 250 query and 700 key
// rows, each tensor one batch entry of those rows; the device arrays are
// never read.
template <class Args>
Args as_packed(Args a) {
  a.batch = 3;
  a.varlen.cu_seqlens_q = reinterpret_cast<const int32_t*>(0xb0000);
  a.varlen.cu_seqlens_k = reinterpret_cast<const int32_t*>(0xb0100);
  a.varlen.total_q = 250;
  a.varlen.total_k = 700;
  lay_out_tensors(a, a.varlen.total_q, a.varlen.total_k, true);
  return a;
}

}  // namespace flash3::testing
