// Backward preprocess (Algorithm 3, line 2): D_i = rowsum(dO_i o O_i), and
// the forward's LSE in log2 units, both padded to whole query blocks so that
// the producer copies one block of each with a single bulk copy. Padding rows
// get D = 0 and LSE = +inf, which makes their P (and so everything they add
// to dK and dV) zero. It also clears the dQ accumulator, head_dim floats per
// row (the accumulator's tiles are bwd_block_m(head_dim) rows of head_dim floats each),
// and the split tiles' counters and sums (bwd/tail_split.h).
#pragma once

#include <cmath>
#include <cstdint>

#include "common/dependent_launch.h"
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
  uint4* split;      // WorkspaceLayout::split_arrivals on, split_vectors x 16 bytes, cleared
  int64_t split_vectors;
  int64_t rows;  // batch * heads * padded_rows
  int padded_rows;
  int seqlen_q;
  int num_heads;
  int head_dim;
};

// Eight threads per row, each reading 16 bytes of O and of dO per step and
// clearing the row's accumulator with float4 stores: bandwidth-bound, so
// every access is a full vector (O and dO are 16-byte aligned, d a multiple
// of 8: validated).
constexpr int kPreprocessThreads = 256;
constexpr int kPreprocessThreadsPerRow = 8;

template <class Element>
__global__ void __launch_bounds__(kPreprocessThreads) preprocess_kernel(PreprocessParams<Element> const p) {
  let_dependents_start();  // the main kernel's CTAs take the SMs this grid's last wave frees
  constexpr int kVec = 16 / sizeof(Element);
  constexpr int kRowsPerCta = kPreprocessThreads / kPreprocessThreadsPerRow;
  int64_t const row = int64_t(blockIdx.x) * kRowsPerCta + threadIdx.x / kPreprocessThreadsPerRow;
  int const part = threadIdx.x % kPreprocessThreadsPerRow;
  // Rows past the end stay for the warp's shuffles.
  bool const valid = row < p.rows;
  int64_t const bh = row / p.padded_rows;
  int const q = int(row % p.padded_rows);
  int const batch = int(bh / p.num_heads), head = int(bh % p.num_heads);
  float d = 0.f;
  if (valid && q < p.seqlen_q) {
    Element const* o = p.o + batch * p.o_strides[0] + q * p.o_strides[1] + head * p.o_strides[2];
    Element const* dout = p.dout + batch * p.do_strides[0] + q * p.do_strides[1] + head * p.do_strides[2];
    for (int c = part * kVec; c < p.head_dim; c += kPreprocessThreadsPerRow * kVec) {
      uint4 const ov = *reinterpret_cast<uint4 const*>(o + c);
      uint4 const dov = *reinterpret_cast<uint4 const*>(dout + c);
      Element const* oe = reinterpret_cast<Element const*>(&ov);
      Element const* de = reinterpret_cast<Element const*>(&dov);
      for (int e = 0; e < kVec; ++e) d += float(oe[e]) * float(de[e]);
    }
  }
  for (int offset = kPreprocessThreadsPerRow / 2; offset > 0; offset /= 2) {
    d += __shfl_xor_sync(0xffffffffu, d, offset, kPreprocessThreadsPerRow);
  }
  int64_t const threads = int64_t(gridDim.x) * kPreprocessThreads;
  for (int64_t i = int64_t(blockIdx.x) * kPreprocessThreads + threadIdx.x; i < p.split_vectors; i += threads) {
    p.split[i] = make_uint4(0, 0, 0, 0);
  }
  if (!valid) return;
  float4* dq = reinterpret_cast<float4*>(p.dq_accum + row * p.head_dim);
  for (int c = part; c < p.head_dim / 4; c += kPreprocessThreadsPerRow) dq[c] = make_float4(0.f, 0.f, 0.f, 0.f);
  if (part == 0) {
    p.dpsum[row] = d;
    p.lse_log2[row] = q < p.seqlen_q ? p.lse[bh * p.seqlen_q + q] * float(M_LOG2E) : INFINITY;
  }
}

}  // namespace flash3::bwd
