// Softcapping (Gemma 2), one rule for both passes: each scaled score s
// becomes softcap * tanh(s / softcap) before the mask and the softmax. The
// kernels keep the GEMM's raw accumulator x (s = softmax_scale * x) and
// compute t = tanh(pre * x), pre = softmax_scale / softcap; the softmax then
// takes t in place of x, with softcap * log2(e) in place of its scale. A
// runtime option: one uniform branch per block, no kernel of its own.
#pragma once

#include <cmath>

#include <cute/config.hpp>
#include <cutlass/fast_math.h>

#include "common/host_device.h"

namespace flash3 {

struct Softcap {
  float pre = 0.f;         // softmax_scale / softcap; 0: off
  float scale_log2 = 0.f;  // softcap * log2(e): the softmax's scale of t
  float t_per_log2 = 0.f;  // 1 / scale_log2: the backward's t from log2(P) + LSE's log2

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

// d(softcap * tanh(s / softcap)) / ds = 1 - t^2, 0 where the mask left t at
// -inf (or the backward's recovered t is NaN on a row that sees no key).
__device__ __forceinline__ float softcap_slope(float t) { return fmaxf(1.f - t * t, 0.f); }
#endif

}  // namespace flash3
