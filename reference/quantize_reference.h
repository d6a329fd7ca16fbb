// CPU reference of flash3::quantize_fp8 (FP8 e4m3 quantization with descale
// factors and the optional Hadamard transform of Q and K), and host e4m3
// conversions. Plain C++, no CUDA headers.
//
// The reference repeats the kernel's float32 arithmetic step for step (the
// shared parts come from src/quant/hadamard.h): subnormal inputs flushed to
// zero; with the transform, the signs, the butterflies with h = 1, 2, 4, ...
// (each result flushed, as the kernel's -ftz=true does), then times
// hadamard_norm(d); amax the fmax of |x| over a group (NaN ignored); scale =
// scale_from_amax(amax); stored value float_to_e4m3(x * (1 / scale)). Its
// outputs therefore equal the kernel's bit for bit.
#pragma once

#include <cstdint>

#include "flash3/flash3.h"

namespace flash3::reference {

// OCP FP8 E4M3 ("e4m3fn": bias 7, no infinities, 0x7F and 0xFF are NaN, largest
// finite 448, smallest subnormal 2^-9). float_to_e4m3 rounds to nearest, ties
// to even, and saturates: anything of magnitude >= 448, infinities included,
// becomes +-448 (0x7E / 0xFE); NaN becomes 0x7F; the sign of zero is kept. It is
// the conversion of the kernel (cvt.rn.satfinite.e4m3x2.f32).
uint8_t float_to_e4m3(float x);
float e4m3_to_float(uint8_t bits);

// In place, x (n floats, n a power of two) <- x H, with H the n x n Sylvester
// Hadamard matrix (H_ij = (-1)^popcount(i & j), symmetric), unnormalized:
// butterflies (a, b) -> (a + b, a - b) on the pairs (i, i + h), h = 1, 2, 4, ...,
// each result flushed to zero when subnormal.
void fwht(float* x, int64_t n);

// In place, x (head_dim floats; 64, 128 or 256) <- x M, M = diag(s) H / sqrt(d),
// s the signs of `seed` (quant::hadamard_sign_negative), with the kernel's
// float32 operations: flush, sign flips, fwht, times hadamard_norm(head_dim).
void hadamard_rotate(float* x, int64_t head_dim, uint64_t seed);

// Number of scales of one tensor, as flash3::fp8_scale_count.
int64_t scale_count(ScaleGranularity granularity, int64_t batch, int64_t heads, int64_t seqlen, int64_t block);

// One tensor. `in`: dense float [batch, seqlen, heads, head_dim] holding the
// values the kernel reads (e.g. bf16 inputs widened); `out`: dense e4m3, same
// shape; `scale`: scale_count(...) floats, [1], [batch, heads] or [batch, heads,
// blocks] for kPerTensor, kPerHead, kPerBlock (`block` rows per scale).
// An empty tensor (batch or seqlen 0) writes nothing. Throws
// std::invalid_argument for negative sizes, heads < 1, a head_dim other than
// 64, 128, 256, or block < 1 with kPerBlock.
void quantize_tensor_cpu(int64_t batch, int64_t seqlen, int64_t heads, int64_t head_dim,
                         ScaleGranularity granularity, int64_t block, bool hadamard, uint64_t seed, const float* in,
                         uint8_t* out, float* scale);

struct QuantizeShape {
  int64_t batch = 0;
  int64_t seqlen_q = 0;
  int64_t seqlen_k = 0;
  int64_t heads_q = 0;
  int64_t heads_kv = 0;
  int64_t head_dim = 0;
  ScaleGranularity granularity = ScaleGranularity::kPerBlock;
  int64_t block_q = 0;   // rows per scale with kPerBlock: fp8_block_sizes(head_dim).q
  int64_t block_kv = 0;  // and .kv
  bool hadamard = false;
  uint64_t seed = 0;
};

// quantize_fp8 on dense arrays: q, q_out [batch, seqlen_q, heads_q, head_dim];
// k, v, k_out, v_out [batch, seqlen_k, heads_kv, head_dim]; Q and K transformed
// when shape.hadamard, V never.
void quantize_cpu(const QuantizeShape& shape, const float* q, const float* k, const float* v, uint8_t* q_out,
                  uint8_t* k_out, uint8_t* v_out, float* q_scale, float* k_scale, float* v_scale);

}  // namespace flash3::reference
