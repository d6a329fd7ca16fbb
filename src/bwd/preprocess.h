// Backward preprocess (Algorithm 3, line 2): D_i = rowsum(dO_i o O_i), and
// the forward's LSE in log2 units, both padded to whole query blocks so that
// the producer copies one block of each with a single bulk copy. Padding rows
// get D = 0 and LSE = +inf, which makes their P (and so everything they add
// to dK and dV) zero. It also clears the dQ accumulator, head_dim floats per
// row (the accumulator's tiles are kBwdBlockM rows of head_dim floats each).
#pragma once

#include <cmath>
#include <cstdint>

#include "flash3/flash3.h"

namespace flash3::bwd {

template <class Element>
struct PreprocessParams {
  Element const* o;
  Element const* dout;
  int64_t o_strides[3];  // batch, seq, head
  int64_t do_strides[3];
  float const* lse;  // [batch, heads, seqlen_q]
  float* lse_log2;   // [batch, heads, padded_rows]
  float* dpsum;
  float* dq_accum;   // [batch, heads, padded_rows, head_dim] floats, cleared
  int64_t rows;  // batch * heads * padded_rows
  int padded_rows;
  int seqlen_q;
  int num_heads;
  int head_dim;
};

// One warp per row.
template <class Element>
__global__ void __launch_bounds__(256) preprocess_kernel(PreprocessParams<Element> const p) {
  int64_t const row = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  int const lane = threadIdx.x % 32;
  if (row >= p.rows) return;
  int64_t const bh = row / p.padded_rows;
  int const q = int(row % p.padded_rows);
  int const batch = int(bh / p.num_heads), head = int(bh % p.num_heads);
  float d = 0.f;
  if (q < p.seqlen_q) {
    Element const* o = p.o + batch * p.o_strides[0] + q * p.o_strides[1] + head * p.o_strides[2];
    Element const* dout = p.dout + batch * p.do_strides[0] + q * p.do_strides[1] + head * p.do_strides[2];
    for (int c = lane; c < p.head_dim; c += 32) d += float(o[c]) * float(dout[c]);
  }
  float4* dq = reinterpret_cast<float4*>(p.dq_accum + row * p.head_dim);
  for (int c = lane; c < p.head_dim / 4; c += 32) dq[c] = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int offset = 16; offset > 0; offset /= 2) d += __shfl_xor_sync(0xffffffffu, d, offset);
  if (lane == 0) {
    p.dpsum[row] = d;
    p.lse_log2[row] = q < p.seqlen_q ? p.lse[bh * p.seqlen_q + q] * float(M_LOG2E) : INFINITY;
  }
}

}  // namespace flash3::bwd
