// Float32 GPU attention: plain CUDA cores and shared memory, no tensor cores.
//
// One block of 128 threads per (16 query rows, query head, batch). It makes two
// passes over the key blocks the rows can see: the first finds each row's max
// score and sum of exponentials, the second recomputes the scores and adds the
// already normalized P times V to an accumulator in shared memory. Two passes
// cost one extra Q K^T over an online softmax but need no rescaling, and let
// the emulated low-precision mode round the normalized P as a naive
// implementation does.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <climits>

#include "common/scale_view.h"
#include "reference.h"

namespace flash3::reference {
namespace {

constexpr int kBlockM = 16;                     // query rows per block
constexpr int kBlockN = 32;                     // keys per tile: one per lane when computing S
constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kRowsPerWarp = kBlockM / kWarps;  // warp w computes S rows 4w..4w+3
constexpr int kPvRows = 8;                      // rows of O per P V work item
static_assert(kRowsPerWarp == 4, "S rows are read from shared memory as one float4");
static_assert(kPvRows == 8, "P columns are read from shared memory as two float4s");

template <class T>
struct Precision;

__device__ float round_bf16(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }
__device__ float round_half(float x) { return __half2float(__float2half_rn(x)); }

// What a straightforward implementation rounds, per input type: S and the
// normalized P in the input precision for 16-bit inputs; for FP8, S stays
// float32 (the GEMM's accumulator) and the unnormalized P = exp(S - max) is
// rounded to e4m3 for the PV GEMM (normalized probabilities of long rows
// would fall into e4m3's subnormals), O being divided by the row sum after.
// As the fused kernels do, P is scaled by 2^8 for the rounding (exactly: a
// power of two), so that probabilities down to 2^-14 stay normal numbers.
template <>
struct Precision<__nv_bfloat16> {
  static __device__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
  static __device__ float round_s(float x) { return round_bf16(x); }
  static __device__ float round_p(float x) { return round_bf16(x); }
  static constexpr bool kRoundsNormalizedP = true;
};

template <>
struct Precision<__half> {
  static __device__ float to_float(__half x) { return __half2float(x); }
  static __device__ float round_s(float x) { return round_half(x); }
  static __device__ float round_p(float x) { return round_half(x); }
  static constexpr bool kRoundsNormalizedP = true;
};

template <>
struct Precision<__nv_fp8_e4m3> {
  static __device__ float to_float(__nv_fp8_e4m3 x) { return float(x); }
  static __device__ float round_s(float x) { return x; }
  static constexpr float kPScale = 256.0f;
  static __device__ float round_p(float x) { return float(__nv_fp8_e4m3(x * kPScale)) / kPScale; }
  static constexpr bool kRoundsNormalizedP = false;
};

struct Params {
  const void* q;
  const void* k;
  const void* v;
  int64_t q_batch_stride, q_seq_stride, q_head_stride;
  int64_t k_batch_stride, k_seq_stride, k_head_stride;
  int64_t v_batch_stride, v_seq_stride, v_head_stride;
  float* o;
  float* lse;
  const float* sinks;  // [heads_q] or nullptr
  int64_t seqlen_q, seqlen_k, heads_q, group, num_m_blocks;
  int head_dim;    // Q's and K's
  int head_dim_v;  // V's and O's
  int kv_ld;       // row pitch of the K/V tile in shared memory
  float scale;
  int64_t window_left, window_right;  // -1: unbounded; the causal mask is right 0
  float softcap;                      // 0: off
  bool emulate;
  bool standard_fp8;  // Fp8Emulation::kStandard (with emulate)
  bool out_bf16;  // O's rounding when emulating
  // FP8 descale factors (data == nullptr: 1) and their row blocks.
  flash3::ScaleView q_scale, k_scale, v_scale;
  int64_t q_block, kv_block;
};

__device__ float descale(const flash3::ScaleView& s, int64_t b, int64_t h, int64_t row, int64_t block) {
  return s.data ? s(b, h, row / block) : 1.0f;
}

__device__ float warp_max(float x) {
  for (int offset = 16; offset > 0; offset /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}

__device__ float warp_sum(float x) {
  for (int offset = 16; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

// Copies keys (or values) [n0, n0 + kBlockN), `cols` columns each, into
// tile[kBlockN][kv_ld] as float; keys past seqlen_k become 0 so that no stale
// value (NaN included) meets a zero probability.
template <class T>
__device__ void load_tile(float* tile, const T* src, int64_t seq_stride, int cols, int64_t n0,
                          const flash3::ScaleView& scale, int64_t b, int64_t h_kv, const Params& p) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int r = warp; r < kBlockN; r += kWarps) {
    const int64_t j = n0 + r;
    for (int c = lane; c < cols; c += 32)
      tile[r * p.kv_ld + c] =
          j < p.seqlen_k ? Precision<T>::to_float(src[j * seq_stride + c]) * descale(scale, b, h_kv, j, p.kv_block)
                         : 0.0f;
  }
}

// s[i] = S[row0 + 4 warp + i][n0 + lane]: scaled, softcapped, rounded when emulating, and
// -inf where masked (past seqlen_q or seqlen_k, or outside the row's window).
template <class T>
__device__ void scores(float (&s)[kRowsPerWarp], const float* q_t, const float* k_tile, int64_t row0, int64_t n0,
                       const Params& p) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const float4* q4 = reinterpret_cast<const float4*>(q_t) + warp;  // q_t[c][4 warp .. 4 warp + 3] is q4[c * 4]
  const float* k_row = k_tile + lane * p.kv_ld;
  for (int i = 0; i < kRowsPerWarp; ++i) s[i] = 0.0f;
#pragma unroll 4
  for (int c = 0; c < p.head_dim; ++c) {
    const float4 qc = q4[c * (kBlockM / 4)];
    const float kc = k_row[c];
    s[0] += qc.x * kc;
    s[1] += qc.y * kc;
    s[2] += qc.z * kc;
    s[3] += qc.w * kc;
  }
  const int64_t j = n0 + lane;
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int64_t row = row0 + kRowsPerWarp * warp + i;
    const bool visible =
        row < p.seqlen_q && j < p.seqlen_k &&
        (p.window_right < 0 || j <= row + p.seqlen_k - p.seqlen_q + p.window_right) &&
        (p.window_left < 0 || j >= row + p.seqlen_k - p.seqlen_q - p.window_left);
    const float x = p.softcap > 0.f ? p.softcap * tanhf(s[i] * p.scale / p.softcap) : s[i] * p.scale;
    const float rounded = p.standard_fp8 ? round_half(x) : Precision<T>::round_s(x);
    s[i] = visible ? (p.emulate ? rounded : x) : -INFINITY;
  }
}

template <class T>
__global__ void __launch_bounds__(kThreads) attention_kernel(const Params p) {
  extern __shared__ float4 smem4[];  // float4 for its 16-byte alignment
  const int d = p.head_dim, dv = p.head_dim_v;
  float* q_t = reinterpret_cast<float*>(smem4);  // [d][kBlockM]: Q transposed, so a warp's 4 rows are one float4
  float* o_acc = q_t + d * kBlockM;              // [kBlockM][dv]
  float* kv = o_acc + kBlockM * dv;              // [kBlockN][kv_ld]: the K tile, then the V tile
  float* p_t = kv + kBlockN * p.kv_ld;           // [kBlockN][kBlockM]: P transposed

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t m_block = blockIdx.x % p.num_m_blocks;
  const int64_t h = (blockIdx.x / p.num_m_blocks) % p.heads_q;
  const int64_t b = blockIdx.x / p.num_m_blocks / p.heads_q;
  const int64_t h_kv = h / p.group;
  const int64_t row0 = m_block * kBlockM;
  const T* q = static_cast<const T*>(p.q) + b * p.q_batch_stride + h * p.q_head_stride;
  const T* k = static_cast<const T*>(p.k) + b * p.k_batch_stride + h_kv * p.k_head_stride;
  const T* v = static_cast<const T*>(p.v) + b * p.v_batch_stride + h_kv * p.v_head_stride;

  for (int r = warp; r < kBlockM; r += kWarps) {
    const int64_t i = row0 + r;
    for (int c = lane; c < d; c += 32) {
      q_t[c * kBlockM + r] =
          i < p.seqlen_q ? Precision<T>::to_float(q[i * p.q_seq_stride + c]) * descale(p.q_scale, b, h, i, p.q_block)
                         : 0.0f;
    }
    for (int c = lane; c < dv; c += 32) o_acc[r * dv + c] = 0.0f;
  }

  // The window's right edge for the block's last row bounds the keys any row sees.
  int64_t n_end = p.seqlen_k;
  if (p.window_right >= 0) {
    const int64_t last_visible_end = row0 + kBlockM + p.seqlen_k - p.seqlen_q + p.window_right;
    n_end = last_visible_end < 0 ? 0 : (last_visible_end < n_end ? last_visible_end : n_end);
  }

  // Pass 1: each row's max score and sum of exp(score - max), kept identical
  // in every lane of the warp that owns the row.
  float row_max[kRowsPerWarp], row_sum[kRowsPerWarp];
  for (int i = 0; i < kRowsPerWarp; ++i) {
    row_max[i] = -INFINITY;
    row_sum[i] = 0.0f;
  }
  float s[kRowsPerWarp];
  for (int64_t n0 = 0; n0 < n_end; n0 += kBlockN) {
    __syncthreads();  // Q is stored; the last tile's readers are done
    load_tile(kv, k, p.k_seq_stride, d, n0, p.k_scale, b, h_kv, p);
    __syncthreads();
    scores<T>(s, q_t, kv, row0, n0, p);
    for (int i = 0; i < kRowsPerWarp; ++i) {
      const float new_max = fmaxf(row_max[i], warp_max(s[i]));
      if (new_max == -INFINITY) continue;  // nothing visible yet; also avoids (-inf) - (-inf)
      const float tile_sum = warp_sum(expf(s[i] - new_max));
      row_sum[i] = row_sum[i] * expf(row_max[i] - new_max) + tile_sum;
      row_max[i] = new_max;
    }
  }

  // A sink joins each row's denominator without a value.
  if (p.sinks != nullptr) {
    const float sink = p.sinks[h];
    for (int i = 0; i < kRowsPerWarp; ++i) {
      const float new_max = fmaxf(row_max[i], sink);
      row_sum[i] = (row_max[i] == -INFINITY ? 0.0f : row_sum[i] * expf(row_max[i] - new_max)) + expf(sink - new_max);
      row_max[i] = new_max;
    }
  }

  // Pass 2: P = exp(S - max) / sum, then O += P V.
  for (int64_t n0 = 0; n0 < n_end; n0 += kBlockN) {
    __syncthreads();
    load_tile(kv, k, p.k_seq_stride, d, n0, p.k_scale, b, h_kv, p);
    __syncthreads();
    scores<T>(s, q_t, kv, row0, n0, p);
    float prob[kRowsPerWarp];
    for (int i = 0; i < kRowsPerWarp; ++i) {
      if (row_sum[i] == 0.0f) {
        prob[i] = 0.0f;
      } else if (!p.emulate) {
        prob[i] = expf(s[i] - row_max[i]) / row_sum[i];
      } else if (p.standard_fp8) {
        constexpr float kPScale = 448.0f;  // e4m3's largest finite value over P's bound, 1
        const float p_half = round_half(expf(s[i] - row_max[i]) / row_sum[i]);
        prob[i] = float(__nv_fp8_e4m3(p_half * kPScale)) / kPScale;
      } else if (Precision<T>::kRoundsNormalizedP) {
        prob[i] = Precision<T>::round_p(expf(s[i] - row_max[i]) / row_sum[i]);
      } else {
        prob[i] = Precision<T>::round_p(expf(s[i] - row_max[i])) / row_sum[i];
      }
    }
    __syncthreads();  // every thread is done with the K tile
    reinterpret_cast<float4*>(p_t)[lane * (kBlockM / 4) + warp] = make_float4(prob[0], prob[1], prob[2], prob[3]);
    load_tile(kv, v, p.v_seq_stride, dv, n0, p.v_scale, b, h_kv, p);
    __syncthreads();
    // Work item: column c of O for rows r0..r0+7; neighbouring threads take
    // neighbouring columns, so V reads are conflict-free and P reads broadcast.
    for (int item = threadIdx.x; item < (kBlockM / kPvRows) * dv; item += kThreads) {
      const int c = item % dv, r0 = item / dv * kPvRows;
      float acc[kPvRows];
      for (int r = 0; r < kPvRows; ++r) acc[r] = o_acc[(r0 + r) * dv + c];
      const float4* p4 = reinterpret_cast<const float4*>(p_t) + r0 / 4;
#pragma unroll 4
      for (int j = 0; j < kBlockN; ++j) {
        const float vj = kv[j * p.kv_ld + c];
        const float4 pa = p4[j * (kBlockM / 4)], pb = p4[j * (kBlockM / 4) + 1];
        acc[0] += pa.x * vj;
        acc[1] += pa.y * vj;
        acc[2] += pa.z * vj;
        acc[3] += pa.w * vj;
        acc[4] += pb.x * vj;
        acc[5] += pb.y * vj;
        acc[6] += pb.z * vj;
        acc[7] += pb.w * vj;
      }
      for (int r = 0; r < kPvRows; ++r) o_acc[(r0 + r) * dv + c] = acc[r];
    }
  }
  __syncthreads();

  for (int r = warp; r < kBlockM; r += kWarps) {
    const int64_t i = row0 + r;
    if (i >= p.seqlen_q) break;
    float* o_row = p.o + ((b * p.seqlen_q + i) * p.heads_q + h) * dv;
    for (int c = lane; c < dv; c += 32) {
      const float x = o_acc[r * dv + c];
      o_row[c] = p.emulate ? (p.out_bf16 ? round_bf16(x) : round_half(x)) : x;
    }
  }
  if (p.lse && lane == 0) {
    for (int i = 0; i < kRowsPerWarp; ++i) {
      const int64_t row = row0 + kRowsPerWarp * warp + i;
      if (row < p.seqlen_q)
        p.lse[(b * p.heads_q + h) * p.seqlen_q + row] = row_sum[i] > 0.0f ? row_max[i] + logf(row_sum[i]) : INFINITY;
    }
  }
}

template <class T>
cudaError_t launch(const Params& p, int64_t grid, size_t smem_bytes, cudaStream_t stream) {
  const cudaError_t err =
      cudaFuncSetAttribute(attention_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem_bytes));
  if (err != cudaSuccess) return err;
  attention_kernel<T><<<unsigned(grid), kThreads, smem_bytes, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace

namespace {

cudaError_t run(const AttentionShape& shape, flash3::DType dtype, flash3::ConstTensor q, flash3::ConstTensor k,
                flash3::ConstTensor v, const flash3::Fp8Scales* fp8, float* o, float* lse,
                bool emulate_low_precision, bool standard_fp8, cudaStream_t stream, const float* sinks) {
  if (!is_valid(shape)) return cudaErrorInvalidValue;
  if (q.dim_stride != 1 || k.dim_stride != 1 || v.dim_stride != 1) return cudaErrorInvalidValue;
  if (shape.batch == 0 || shape.seqlen_q == 0) return cudaSuccess;
  if (!q.data || !o || (shape.seqlen_k > 0 && (!k.data || !v.data))) return cudaErrorInvalidValue;

  // Far past what shared memory holds; bounds the size arithmetic below.
  const int64_t d = shape.head_dim, dv = value_head_dim(shape);
  if (d > 65536 || dv > 65536) return cudaErrorInvalidValue;
  // An odd pitch, for K's rows and V's: lanes reading one column each of 32 rows hit 32 banks.
  const int64_t kv_ld = std::max(d, dv) | 1;
  const int64_t smem_floats = kBlockM * (d + dv) + kBlockN * kv_ld + kBlockN * kBlockM;
  const int64_t num_m_blocks = (shape.seqlen_q + kBlockM - 1) / kBlockM;
  if (num_m_blocks > INT_MAX / shape.heads_q / shape.batch) return cudaErrorInvalidValue;  // gridDim.x limit
  const int64_t grid = num_m_blocks * shape.heads_q * shape.batch;

  Params p;
  p.q = q.data;
  p.k = k.data;
  p.v = v.data;
  p.q_batch_stride = q.batch_stride;
  p.q_seq_stride = q.seq_stride;
  p.q_head_stride = q.head_stride;
  p.k_batch_stride = k.batch_stride;
  p.k_seq_stride = k.seq_stride;
  p.k_head_stride = k.head_stride;
  p.v_batch_stride = v.batch_stride;
  p.v_seq_stride = v.seq_stride;
  p.v_head_stride = v.head_stride;
  p.o = o;
  p.lse = lse;
  p.sinks = sinks;
  p.seqlen_q = shape.seqlen_q;
  p.seqlen_k = shape.seqlen_k;
  p.heads_q = shape.heads_q;
  p.group = shape.heads_q / shape.heads_kv;
  p.num_m_blocks = num_m_blocks;
  p.head_dim = int(d);
  p.head_dim_v = int(dv);
  p.kv_ld = int(kv_ld);
  p.scale = float(effective_scale(shape));
  p.window_left = shape.window_left;
  p.window_right = window_right_of(shape);
  p.softcap = float(shape.softcap);
  p.emulate = emulate_low_precision;
  p.standard_fp8 = standard_fp8;
  p.out_bf16 = dtype == flash3::DType::kBF16;
  p.q_block = p.kv_block = 1;
  if (fp8 != nullptr) {
    const flash3::Fp8BlockSizes blocks = flash3::fp8_block_sizes(shape.head_dim);
    if (blocks.q == 0 || !fp8->q || (shape.seqlen_k > 0 && (!fp8->k || !fp8->v))) return cudaErrorInvalidValue;
    p.q_block = blocks.q;
    p.kv_block = blocks.kv;
    p.q_scale = flash3::make_scale_view(fp8->q, fp8->granularity, shape.heads_q, shape.seqlen_q, blocks.q,
                                        fp8->q_per_kv_head ? shape.heads_q / shape.heads_kv : 1);
    p.k_scale = flash3::make_scale_view(fp8->k, fp8->granularity, shape.heads_kv, shape.seqlen_k, blocks.kv);
    p.v_scale = flash3::make_scale_view(fp8->v, fp8->granularity, shape.heads_kv, shape.seqlen_k, blocks.kv);
    p.out_bf16 = fp8->out_dtype == flash3::DType::kBF16;
  }

  const size_t smem_bytes = size_t(smem_floats) * sizeof(float);
  switch (dtype) {
    case flash3::DType::kBF16: return launch<__nv_bfloat16>(p, grid, smem_bytes, stream);
    case flash3::DType::kFP16: return launch<__half>(p, grid, smem_bytes, stream);
    case flash3::DType::kE4M3: return launch<__nv_fp8_e4m3>(p, grid, smem_bytes, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t attention_gpu(const AttentionShape& shape, flash3::DType dtype, flash3::ConstTensor q,
                          flash3::ConstTensor k, flash3::ConstTensor v, float* o, float* lse,
                          bool emulate_low_precision, cudaStream_t stream, const float* sinks) {
  if (dtype != flash3::DType::kBF16 && dtype != flash3::DType::kFP16) return cudaErrorInvalidValue;
  return run(shape, dtype, q, k, v, nullptr, o, lse, emulate_low_precision, false, stream, sinks);
}

cudaError_t attention_gpu_fp8(const AttentionShape& shape, flash3::ConstTensor q, flash3::ConstTensor k,
                              flash3::ConstTensor v, const flash3::Fp8Scales& scales, float* o, float* lse,
                              Fp8Emulation emulation, cudaStream_t stream, const float* sinks) {
  if (scales.out_dtype != flash3::DType::kBF16 && scales.out_dtype != flash3::DType::kFP16) return cudaErrorInvalidValue;
  return run(shape, flash3::DType::kE4M3, q, k, v, &scales, o, lse, emulation != Fp8Emulation::kNone,
             emulation == Fp8Emulation::kStandard, stream, sinks);
}

}  // namespace flash3::reference
