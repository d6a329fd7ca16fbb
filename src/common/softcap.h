// Softcapping (Gemma 2), one rule for both passes: each scaled score s
// becomes softcap * tanh(s / softcap) before the mask and the softmax. The
// kernels keep the GEMM's raw accumulator x (s = softmax_scale * x) and
// compute t = tanh(pre * x), pre = softmax_scale / softcap; the softmax then
// takes t in place of x, with softcap * log2(e) in place of its scale. A
// runtime option: one uniform branch per block, no kernel of its own.
#pragma once

#include <cmath>

#include <cute/config.hpp>
#include <cuda_fp16.h>
#include <cutlass/fast_math.h>

#include "common/host_device.h"

namespace flash3 {

struct Softcap {
  float pre = 0.f;         // softmax_scale / softcap; 0: off
  float scale_log2 = 0.f;  // softcap * log2(e): the softmax's scale of t
  float t_per_log2 = 0.f;  // 1 / scale_log2: the backward's t from log2(P) (a multiply, not a divide a score)

  FLASH3_HOST_DEVICE bool on() const { return pre != 0.f; }
};

// softcap 0 is off (FlashAttention's convention).
inline Softcap softcap_of(float softcap, float softmax_scale) {
  if (softcap == 0.f) return {};
  return {softmax_scale / softcap, softcap * float(M_LOG2E), 1.f / (softcap * float(M_LOG2E))};
}

#if defined(__CUDACC__)
// t = tanh(pre * x) over a fragment, in place: one MUFU op an element
// (tanh.approx, relative error below 2^-10.9), the same in both passes, so
// that the backward's P matches the forward's LSE.
template <class Fragment>
__device__ __forceinline__ void softcap_scores(Fragment& s, float pre) {
  CUTE_UNROLL
  for (int i = 0; i < size(s); ++i) s(i) = cutlass::fast_tanh(s(i) * pre);
}

// The backward's slope d(softcap * tanh(s / softcap)) / ds = 1 - t^2 of
// each of a thread's kN scores, which dS takes. kKeep: computed with t and
// kept to dS in f16 pairs (relative error 2^-11, below dS's rounding to 16
// bits; kN / 2 registers). Otherwise nothing is kept, and dS recovers t from
// P, whose registers replaced it: log2(P) = t * scale_log2 - LSE's log2 (one
// MUFU op more a score, for the kernels that have no registers to spare).
template <int kN, bool kKeep>
struct SoftcapSlopes {
  static_assert(kN % 2 == 0);
  __half2 pairs[kKeep ? kN / 2 : 1];

  template <class Fragment>
  __device__ __forceinline__ void keep(Fragment const& t) {
    if constexpr (kKeep) {
      CUTE_UNROLL
      for (int i = 0; i < kN; i += 2) {
        pairs[i / 2] = __floats2half2_rn(fmaf(-t(i), t(i), 1.f), fmaf(-t(i + 1), t(i + 1), 1.f));
      }
    }
  }
  // Score i's slope, given its P and its row's LSE in log2 units. 0 where
  // the mask set P to 0 (there the recovered t is -inf, or NaN on a row that
  // sees no key).
  __device__ __forceinline__ float operator()(int i, float p, float lse_log2, Softcap const& softcap) const {
    if constexpr (kKeep) {
      return i % 2 == 0 ? __low2float(pairs[i / 2]) : __high2float(pairs[i / 2]);
    } else {
      float const t = (__log2f(p) + lse_log2) * softcap.t_per_log2;
      return fmaxf(1.f - t * t, 0.f);
    }
  }
};
#endif

}  // namespace flash3
