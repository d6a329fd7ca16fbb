// The arithmetic that the FP8 quantization kernel (quant/quantize.cu) and its
// CPU reference (reference/quantize_reference.cpp) share, so that the two give
// bitwise-identical results: the Hadamard transform's random signs and norm,
// the scale of an absolute maximum, and the flush of float32 subnormals that
// the kernel's --use_fast_math (-ftz=true) implies. Plain C++ for the host
// compiler, __host__ __device__ under nvcc; no CUDA header needed.
#pragma once

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <math.h>

#include "common/host_device.h"


namespace flash3::quant {

// The largest finite e4m3 value; a scale maps a group's amax onto it.
constexpr float kE4M3Max = 448.0f;

// splitmix64's output function (Steele, Lea, Flood 2014): a bijective 64-bit
// mix whose every output bit depends on every input bit.
FLASH3_HOST_DEVICE uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// The sign s_i of column i in M = diag(s) H / sqrt(d): true for -1. A function
// of (seed, i) alone: the same for Q and K, every batch, head and row.
FLASH3_HOST_DEVICE bool hadamard_sign_negative(uint64_t seed, int64_t i) {
  return (splitmix64(splitmix64(seed) + uint64_t(i)) >> 63) != 0;
}

// 1 / sqrt(d) rounded to float32, for the head dims that quantization takes
// (exact powers of two for 64 and 256).
FLASH3_HOST_DEVICE float hadamard_norm(int64_t head_dim) {
  return head_dim == 64 ? 0.125f : head_dim == 128 ? 0.08838834764831845f : 0.0625f;
}

// A float32 subnormal becomes a zero of the same sign; anything else is kept.
// The kernel is built with -ftz=true, which does this to every operand and
// result of its float arithmetic; the reference applies it after each step.
FLASH3_HOST_DEVICE float flush_subnormal(float x) {
  return fabsf(x) < FLT_MIN ? copysignf(0.0f, x) : x;
}

// x / y correctly rounded (the kernel's plain '/' is approximate under
// --use_fast_math).
FLASH3_HOST_DEVICE float div_rn(float x, float y) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(x, y);
#else
  return x / y;
#endif
}

// The descale factor of a group from its absolute maximum (amax >= 0, not
// NaN): amax / 448, 1 for an all-zero group, and at least FLT_MIN (a group so
// small that amax / 448 would be subnormal gets the smallest normal scale, so
// that 1 / scale stays finite; its values still fit, at most 448 after division).
FLASH3_HOST_DEVICE float scale_from_amax(float amax) {
  if (amax == 0.0f) return 1.0f;
  float const s = div_rn(amax, kE4M3Max);
  return s >= FLT_MIN ? s : FLT_MIN;
}

// What a value is multiplied by before its conversion to e4m3.
FLASH3_HOST_DEVICE float inverse_scale(float scale) { return div_rn(1.0f, scale); }

}  // namespace flash3::quant
