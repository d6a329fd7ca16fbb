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

// `a` (ForwardArgs or BackwardArgs) with Q/K's head dim `d` and V's
// `head_dim_v` (0: d's), each tensor laid out densely for its own head dim:
// Q, K, dQ, dK for d; V, O, dO, dV for V's.
template <class Args>
Args with_head_dims(Args a, int64_t d, int64_t head_dim_v) {
  int64_t const dv = head_dim_v != 0 ? head_dim_v : d;
  a.head_dim = d;
  a.head_dim_v = head_dim_v;
  auto lay_out = [](auto& t, int64_t seqlen, int64_t heads, int64_t dim) { t = contiguous(t.data, seqlen, heads, dim); };
  lay_out(a.q, a.seqlen_q, a.heads_q, d);
  lay_out(a.k, a.seqlen_k, a.heads_kv, d);
  lay_out(a.v, a.seqlen_k, a.heads_kv, dv);
  lay_out(a.o, a.seqlen_q, a.heads_q, dv);
  if constexpr (std::is_same_v<Args, BackwardArgs>) {
    lay_out(a.dout, a.seqlen_q, a.heads_q, dv);
    lay_out(a.dq, a.seqlen_q, a.heads_q, d);
    lay_out(a.dk, a.seqlen_k, a.heads_kv, d);
    lay_out(a.dv, a.seqlen_k, a.heads_kv, dv);
  }
  return a;
}

}  // namespace flash3::testing
