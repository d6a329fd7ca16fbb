// Online softmax (paper §2.3, Algorithm 1 lines 18-19 and 24) over the rows a
// consumer thread holds of the S accumulator. FP32 throughout; the softmax
// scale is folded into exp2 (one FFMA + one MUFU.EX2 per score).
#pragma once

#include <cmath>

#include "common/layout.h"

namespace flash3::fwd {

// Max / sum across the 4 threads of a quad, which together hold a row.
template <class Op>
CUTE_DEVICE float quad_allreduce(float x, Op op) {
  x = op(x, __shfl_xor_sync(0xffffffff, x, 1));
  return op(x, __shfl_xor_sync(0xffffffff, x, 2));
}

// kPLog2Max: P~ is scaled to [0, 2^kPLog2Max] (l with it, so that O and the
// LSE are unchanged). FP8 uses 8: P~ then fills e4m3's range up to 256 of
// 448, and probabilities down to 2^-14 of the row's largest stay normal
// numbers (3 mantissa bits) instead of e4m3 subnormals.
//
// kLazyMax: m is only a stabiliser, so it may stay while no score of the
// warp's rows exceeds its row's m by more than kMaxGrowth (log2 units); P~
// then stays below 2^kMaxGrowth, which bf16 and fp16 P hold, and the quad
// shuffles of the row max and O's rescale are skipped. (FP8's P~ already
// spans e4m3's range, so FP8 moves m at every new maximum.)
template <int kRows, int kPLog2Max = 0, bool kLazyMax = false>
struct OnlineSoftmax {
  static constexpr int kRowsPerThread = kRows;
  static constexpr int kMaxGrowth = 8;
  static_assert(!kLazyMax || kPLog2Max == 0, "a lazy max needs P's range to spare");
  float row_max[kRows];  // m_i, scaled: in log2 units of softmax_scale * S
  float row_sum[kRows];  // l_i, this thread's share until finalize()

  CUTE_DEVICE OnlineSoftmax() { reset(); }

  CUTE_DEVICE void reset() {
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      row_max[r] = -INFINITY;
      row_sum[r] = 0.f;
    }
  }

  // S -> P~ = exp2(scale_log2 * S - m_new) in place; m and l updated. Returns
  // in o_scale the factor exp2(m_old - m_new) by which O must be rescaled (1
  // while a row has seen only masked scores: its O is still 0). scale_log2 is softmax_scale *
  // log2(e), times the block's descale factors with FP8 (which may differ
  // from block to block, hence m kept scaled); it is read from the kernel
  // parameters each time rather than held in a register.
  // Returns whether m moved (warp-uniform; with kLazyMax, o_scale is 1 when
  // it did not).
  template <class TensorS>
  CUTE_DEVICE bool step(TensorS& acc_s, float (&o_scale)[kRows], float scale_log2) {
    Tensor s = make_tensor(acc_s.data(), accumulator_rowcol(acc_s.layout()));
    static_assert(decltype(size<0>(s))::value == kRows);
    float local_max[kRows];
    bool grows = false;
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      local_max[r] = -INFINITY;
      CUTE_UNROLL
      for (int c = 0; c < size<1>(s); ++c) local_max[r] = fmaxf(local_max[r], s(r, c));
      grows |= local_max[r] * scale_log2 > row_max[r] + float(kMaxGrowth);
    }
    bool const moves = !kLazyMax || __any_sync(0xffffffff, grows);
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      if (moves) {
        float const m =
            fmaxf(row_max[r], quad_allreduce(local_max[r], [](float a, float b) { return fmaxf(a, b); }) * scale_log2);
        // A row with every score masked so far keeps m = -inf; exp2 then sees
        // -inf (giving 0), never inf - inf.
        o_scale[r] = m == -INFINITY ? 1.f : exp2f(row_max[r] - m);
        row_max[r] = m;
      } else {
        o_scale[r] = 1.f;
      }
      float const m_sub = row_max[r] == -INFINITY ? 0.f : row_max[r] - float(kPLog2Max);
      float sum = 0.f;
      CUTE_UNROLL
      for (int c = 0; c < size<1>(s); ++c) {
        s(r, c) = exp2f(fmaf(s(r, c), scale_log2, -m_sub));
        sum += s(r, c);
      }
      row_sum[r] = row_sum[r] * o_scale[r] + sum;
    }
    return moves;
  }

  // Line 24: the final 1/l_i for O, and L_i = m_i + log(l_i) (natural log).
  // A sink (sink_log2, in m's log2 units; -inf for none) joins l_i without a
  // value; both are taken relative to the larger of m_i and the sink, so
  // that neither overflows. A row that saw no key gets O = 0 and L = +inf
  // (as FlashAttention), or L = sink with one.
  CUTE_DEVICE void finalize(float (&o_scale)[kRows], float (&lse)[kRows], float sink_log2) {
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      float const sum = quad_allreduce(row_sum[r], [](float a, float b) { return a + b; });
      bool const seen = sum > 0.f;  // false also for NaN
      float const m = seen ? row_max[r] - float(kPLog2Max) : -INFINITY;
      float const top = fmaxf(m, sink_log2);
      float const keys = seen ? exp2f(m - top) : 0.f;  // the keys' share, relative to top
      float const total = sum * keys + (sink_log2 == -INFINITY ? 0.f : exp2f(sink_log2 - top));
      bool const empty = !(total > 0.f);
      o_scale[r] = empty ? 0.f : keys / total;
      lse[r] = empty ? INFINITY : top * float(M_LN2) + logf(total);
    }
  }
};

// O *= per-row factor.
template <int kRows, class TensorO>
CUTE_DEVICE void rescale_rows(TensorO& acc_o, float const (&scale)[kRows]) {
  Tensor o = make_tensor(acc_o.data(), accumulator_rowcol(acc_o.layout()));
  CUTE_UNROLL
  for (int r = 0; r < kRows; ++r) {
    CUTE_UNROLL
    for (int c = 0; c < size<1>(o); ++c) o(r, c) *= scale[r];
  }
}

}  // namespace flash3::fwd
