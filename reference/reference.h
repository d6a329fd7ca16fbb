// Reference attention for flash3's tests and benchmark, written for trust, not
// speed: a float64 CPU version and a plain tiled float32 CUDA version, plus the
// 16-bit float conversions the tests use to make inputs and the dense
// self-attention arguments both they and the benchmark set up.
//
// Both compute, per batch b and query head h (using KV head h / (heads_q /
// heads_kv), i.e. GQA/MQA),
//   O = softmax(scale * Q K^T + mask) V,   LSE = log(sum_j exp(scale * q.k_j)),
// with FlashAttention's conventions: the causal mask is aligned to the
// bottom-right corner (query i sees key j iff j <= i + seqlen_k - seqlen_q),
// and a row that sees no key gets an output of zeros and an LSE of +infinity.
// Both also have FlashAttention-3's other options, with its conventions (see
// AttentionShape and attention_cpu): a sliding window, score softcapping,
// per-head attention sinks and a V head dim of its own.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "flash3/flash3.h"

// The GPU reference is declared only where CUDA's runtime header is on the
// include path, so that the CPU parts work with a plain C++ compiler.
#if __has_include(<cuda_runtime_api.h>)
#include <cuda_runtime_api.h>
#define FLASH3_REFERENCE_HAS_CUDA 1
#endif

namespace flash3::reference {

// Self-attention arguments over contiguous [batch, seqlen, heads, d] tensors
// Q, K, V and O of `dtype`, as the tests and the benchmark set them up.
inline ForwardArgs dense_forward_args(DType dtype, int64_t batch, int64_t seqlen, int64_t heads, int64_t d,
                                      const void* q, const void* k, const void* v, void* o) {
  ForwardArgs a;
  a.dtype = dtype;
  a.batch = batch;
  a.seqlen_q = a.seqlen_k = seqlen;
  a.heads_q = a.heads_kv = heads;
  a.head_dim = d;
  a.q = contiguous<const void*>(q, seqlen, heads, d);
  a.k = contiguous<const void*>(k, seqlen, heads, d);
  a.v = contiguous<const void*>(v, seqlen, heads, d);
  a.o = contiguous<void*>(o, seqlen, heads, d);
  return a;
}

struct AttentionShape {
  int64_t batch = 0;
  int64_t seqlen_q = 0;
  int64_t seqlen_k = 0;
  int64_t heads_q = 0;
  int64_t heads_kv = 0;  // divides heads_q
  int64_t head_dim = 0;
  float softmax_scale = 0.0f;  // 0 selects 1 / sqrt(head_dim)
  bool causal = false;  // the window's right bound becomes min(window_right, 0), i.e. 0
  // The fields below come after the original ones so that positional
  // initializers written before them keep their meaning.
  // Sliding window, aligned to the bottom-right corner as the causal mask is:
  // query i sees key j iff j >= i + seqlen_k - seqlen_q - window_left and
  // j <= i + seqlen_k - seqlen_q + window_right; -1 leaves that side unbounded.
  int64_t window_left = -1;
  int64_t window_right = -1;
  // FlashAttention-3's softcapping, 0 = off: the scaled score S becomes
  // softcap * tanh(S / softcap) before the mask and the softmax.
  double softcap = 0.0;
  int64_t head_dim_v = 0;  // V's (and O's) head dim; 0 selects head_dim
};

// True when the sizes are usable: batch and sequence lengths >= 0, heads and
// head_dim >= 1, heads_q a multiple of heads_kv, windows >= -1, head_dim_v >= 0
// and a finite softcap >= 0 (an infinite one would make inf * tanh(0) a NaN).
// Zero batch or seqlen_q is an empty problem; seqlen_k == 0 or a window that
// misses every key makes rows see no key.
inline bool is_valid(const AttentionShape& s) {
  return s.batch >= 0 && s.seqlen_q >= 0 && s.seqlen_k >= 0 && s.heads_q >= 1 && s.heads_kv >= 1 &&
         s.head_dim >= 1 && s.heads_q % s.heads_kv == 0 && s.window_left >= -1 && s.window_right >= -1 &&
         s.head_dim_v >= 0 && s.softcap >= 0.0 && std::isfinite(s.softcap);
}

// V's and O's head dim.
inline int64_t value_head_dim(const AttentionShape& s) { return s.head_dim_v != 0 ? s.head_dim_v : s.head_dim; }

// The keys [first, last) that query row i sees under the causal mask and the
// window (first == last when none): the one statement of the masking rule.
struct KeyRange {
  int64_t first = 0;
  int64_t last = 0;
};

inline KeyRange visible_keys(const AttentionShape& s, int64_t i) {
  const int64_t diagonal = i + s.seqlen_k - s.seqlen_q;  // the key aligned with row i
  const int64_t right = s.causal ? 0 : s.window_right;  // causal: min(window_right, 0), and -1 means unbounded
  KeyRange r{0, s.seqlen_k};
  if (s.window_left >= 0) r.first = std::clamp<int64_t>(diagonal - s.window_left, 0, s.seqlen_k);
  if (right >= 0) r.last = std::clamp<int64_t>(diagonal + right + 1, r.first, s.seqlen_k);
  return r;
}

// The scale actually applied to Q K^T (Q/K's head dim, also when V's differs).
inline double effective_scale(const AttentionShape& s) {
  return s.softmax_scale != 0.0f ? double(s.softmax_scale) : 1.0 / std::sqrt(double(s.head_dim));
}

// Float64 attention on the CPU. Dense row-major arrays:
//   q:    [batch, seqlen_q, heads_q, head_dim]
//   k:    [batch, seqlen_k, heads_kv, head_dim]
//   v:    [batch, seqlen_k, heads_kv, head_dim_v]
//   o:    [batch, seqlen_q, heads_q, head_dim_v]
//   lse:  [batch, heads_q, seqlen_q], natural log; may be nullptr.
//   sinks: [heads_q] logits, or nullptr for none. A sink joins every softmax
//         denominator of its head without a value, P_ij = exp(S_ij) /
//         (exp(sink_h) + sum_j exp(S_ij)), and the LSE includes it, so a row
//         that sees no key gets O = 0 and LSE = sink_h; -inf is no sink.
// Throws std::invalid_argument when !is_valid(shape).
void attention_cpu(const AttentionShape& shape, const double* q, const double* k, const double* v, double* o,
                   double* lse, const double* sinks = nullptr);

// The gradients of attention_cpu's O for an upstream gradient dO (float64):
//   dV = P^T dO, dP = dO V^T, dS = P o (dP - D), D = rowsum(P o dP) = rowsum(dO o O),
//   with softcapping dS o= 1 - tanh^2(scale Q K^T / softcap), softcap tanh(x / softcap)'s derivative,
//   dQ = scale dS K, dK = scale dS^T Q,
// with dK and dV summed over the query heads sharing a K/V head. dq as q;
// dout as o; dk as k; dv as v. dsinks [heads_q], which may be nullptr, gets
//   dsink_h = -sum_{b,i} P_sink(b,h,i) D(b,h,i),   P_sink = exp(sink_h - LSE)
// (a sink's dP is 0, having no value), and zeros without sinks.
// Throws std::invalid_argument when !is_valid(shape).
void attention_backward_cpu(const AttentionShape& shape, const double* q, const double* k, const double* v,
                            const double* dout, double* dq, double* dk, double* dv, const double* sinks = nullptr,
                            double* dsinks = nullptr);

// The window's bounds as the GPU versions take them: (left, right), -1
// unbounded, the causal mask folded into right.
inline int64_t window_right_of(const AttentionShape& s) { return s.causal ? 0 : s.window_right; }

#ifdef FLASH3_REFERENCE_HAS_CUDA

// Attention on the GPU with float32 accumulation, for any shape (head_dim and
// head_dim_v up to what one block's shared memory holds, about 900 on sm_90).
//   q, k, v: device bf16 or fp16 (per dtype) tensors described as in flash3.h
//            (element strides, dim_stride == 1; v of V's head dim); k and v
//            may be null when seqlen_k == 0.
//   o:       device float32, dense [batch, seqlen_q, heads_q, head_dim_v].
//   lse:     device float32, dense [batch, heads_q, seqlen_q]; may be nullptr.
//   sinks:   device float32 [heads_q], as attention_cpu's; may be nullptr.
// emulate_low_precision models a straightforward implementation in the input
// precision: S = scale * Q K^T accumulated in float32 and rounded to dtype, the
// softmax in float32, the normalized P rounded to dtype before P V (float32
// accumulation), and O rounded to dtype (still stored as float32). Otherwise
// everything after the input is float32.
// Enqueues on `stream` and does not synchronize. Returns cudaErrorInvalidValue
// for a bad shape, stride or pointer (before any CUDA call), else the launch's
// error.
cudaError_t attention_gpu(const AttentionShape& shape, flash3::DType dtype, flash3::ConstTensor q,
                          flash3::ConstTensor k, flash3::ConstTensor v, float* o, float* lse,
                          bool emulate_low_precision, cudaStream_t stream, const float* sinks = nullptr);

// How attention_gpu_fp8 rounds, beyond the dequantized inputs.
enum class Fp8Emulation {
  kNone,   // everything float32
  kFused,  // a fused FP8 kernel (flash3's, FlashAttention-3's): S in float32,
           // the unnormalized P = exp(S - max), scaled by 2^8 as flash3's
           // kernels scale it, rounded to e4m3 before P V, O rounded to
           // scales.out_dtype
  kStandard,  // the FP8 baseline of the paper's Table 3, standard attention
              // with per-tensor scaling: S and the normalized P held in fp16
              // between the GEMMs, P quantized to e4m3 with its per-tensor
              // scale (P <= 1, so 1 / 448) for the P V GEMM, O rounded
};

// attention_gpu for FP8 (e4m3) inputs q, k, v with their descale factors
// (flash3.h's Fp8Scales; per-block scales by fp8_block_sizes(head_dim)):
// the dequantized inputs' attention in float32, rounded as `emulation` says;
// sinks as attention_gpu's.
cudaError_t attention_gpu_fp8(const AttentionShape& shape, flash3::ConstTensor q, flash3::ConstTensor k,
                              flash3::ConstTensor v, const flash3::Fp8Scales& scales, float* o, float* lse,
                              Fp8Emulation emulation, cudaStream_t stream, const float* sinks = nullptr);

// attention_cpu's backward on the GPU with float32 accumulation, for any shape
// (head_dim and head_dim_v up to 512). q, k, v, dout: device tensors in dtype
// described as in flash3.h (v, dout of V's head dim). dq, dk, dv: device
// float32, dense [batch, seqlen, heads, head_dim] (dk, dv with heads_kv; dv
// with head_dim_v). emulate_low_precision rounds S, P, dP and dS to
// dtype where a straightforward implementation in dtype holds them, and the
// results. With `o` (the forward's output, in dtype, laid out as dout), D =
// rowsum(dO o O) is taken from it, as FlashAttention and flash3 take it from
// their rounded O, rather than sum_j P_ij dP_ij: the difference from the
// plain reference measures what that rounding alone costs the gradients.
// sinks (device float32 [heads_q], or nullptr) as attention_gpu's; with them,
// dsinks (device float32 [heads_q], or nullptr) gets their gradient, summed
// in float32 in no fixed order.
// Enqueues on `stream`; cudaErrorInvalidValue for a bad shape.
cudaError_t attention_backward_gpu(const AttentionShape& shape, flash3::DType dtype, flash3::ConstTensor q,
                                   flash3::ConstTensor k, flash3::ConstTensor v, flash3::ConstTensor dout,
                                   float* dq, float* dk, float* dv, bool emulate_low_precision,
                                   cudaStream_t stream, const flash3::ConstTensor* o = nullptr,
                                   const float* sinks = nullptr, float* dsinks = nullptr);
#endif

// The backward check's epsilon, shared by the GPU tests and the benchmark
// (the check: max |got - ref| <= 2 max |low - ref| + epsilon, per gradient).
// Twice what D = rowsum(dO o O) from the rounded O moves the float32
// reference (`ref` against `ref_rounded_o`, the reference given that O), then
// 1e-4 of the largest |ref| and 1e-5 for float32's own rounding.
float backward_epsilon(const float* ref, const float* ref_rounded_o, size_t n);

// 16-bit float conversions on the host, without CUDA headers. float_to_* round
// to nearest, ties to even; overflow gives infinity and NaN stays NaN.
float bf16_to_float(uint16_t bits);
uint16_t float_to_bf16(float x);
float half_to_float(uint16_t bits);
uint16_t float_to_half(float x);

}  // namespace flash3::reference
