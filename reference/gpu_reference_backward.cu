// Float32 GPU attention backward: plain CUDA cores, one block per row, written
// to be obviously right rather than fast.
//
//   query_rows: one block per (batch, head, query i). Pass 1 over the keys
//     finds the row's LSE; pass 2 its D = sum_j P_ij dP_ij; pass 3 dS_ij =
//     P_ij (dP_ij - D) in chunks of keys, and dQ_i = scale * sum_j dS_ij K_j.
//     LSE and D go to a scratch buffer for the second kernel.
//   key_rows: one block per (batch, K/V head, key j), over every query head of
//     its group and every query: dV_j = sum_i P_ij dO_i and dK_j = scale *
//     sum_i dS_ij Q_i.
// With emulate_low_precision, S, P, dP and dS are rounded to the input dtype
// where a straightforward implementation in that dtype would hold them, and
// so are the outputs. Given an output O, D is rowsum(dO_i o O_i) from it
// instead (FlashAttention's D, from the forward's rounded O).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <climits>

#include "reference.h"

namespace flash3::reference {
namespace {

constexpr int kThreads = 128;  // also the chunk of keys (or queries) handled per step

template <class T>
struct Precision;
template <>
struct Precision<__nv_bfloat16> {
  static __device__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
  static __device__ float round(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }
};
template <>
struct Precision<__half> {
  static __device__ float to_float(__half x) { return __half2float(x); }
  static __device__ float round(float x) { return __half2float(__float2half_rn(x)); }
};

struct View {
  const void* data;
  int64_t batch_stride, seq_stride, head_stride;
};

struct Params {
  View q, k, v, dout, o;  // o.data: null unless D comes from it
  float *dq, *dk, *dv;  // dense [batch, seqlen, heads, d] (dv: V's head dim)
  float *lse, *dpsum;   // scratch [batch, heads_q, seqlen_q]
  const float* sinks;   // [heads_q] or nullptr
  float* dsinks;        // [heads_q], cleared, or nullptr
  int64_t batch, seqlen_q, seqlen_k, heads_q, heads_kv, group;
  int head_dim;    // Q's and K's
  int head_dim_v;  // V's, O's and dO's
  float scale;
  int64_t window_left, window_right;  // -1: unbounded; the causal mask is right 0
  float softcap;                      // 0: off
  bool emulate;
};

template <class T>
__device__ const T* row_ptr(const View& t, int64_t b, int64_t s, int64_t h) {
  return static_cast<const T*>(t.data) + b * t.batch_stride + s * t.seq_stride + h * t.head_stride;
}

template <class T>
__device__ float dot(const float* x, const T* y, int d) {
  float acc = 0.f;
  for (int c = 0; c < d; ++c) acc += x[c] * Precision<T>::to_float(y[c]);
  return acc;
}

__device__ float block_reduce(float x, float* scratch, bool is_max) {
  for (int o = 16; o > 0; o /= 2) {
    const float y = __shfl_xor_sync(0xffffffffu, x, o);
    x = is_max ? fmaxf(x, y) : x + y;
  }
  __syncthreads();
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = x;
  __syncthreads();
  float r = scratch[0];
  for (int w = 1; w < kThreads / 32; ++w) r = is_max ? fmaxf(r, scratch[w]) : r + scratch[w];
  return r;
}

__device__ bool visible(const Params& p, int64_t i, int64_t j) {
  const int64_t diagonal = i + p.seqlen_k - p.seqlen_q;
  return (p.window_right < 0 || j <= diagonal + p.window_right) && (p.window_left < 0 || j >= diagonal - p.window_left);
}

// The scaled score, softcapped: softcap * tanh(s / softcap).
__device__ float capped(const Params& p, float s) { return p.softcap > 0.f ? p.softcap * tanhf(s / p.softcap) : s; }

// The capped score's derivative by the scaled score, 1 - tanh^2, from the capped score.
__device__ float cap_slope(const Params& p, float capped_score) {
  if (p.softcap == 0.f) return 1.f;
  const float t = capped_score / p.softcap;
  return 1.f - t * t;
}

template <class T>
__device__ float score(const Params& p, const float* q_row, const T* k_row) {
  const float s = capped(p, dot(q_row, k_row, p.head_dim) * p.scale);
  return p.emulate ? Precision<T>::round(s) : s;
}

template <class T>
__global__ void __launch_bounds__(kThreads) query_rows(const Params p) {
  extern __shared__ float smem[];
  const int d = p.head_dim, dv = p.head_dim_v;
  float* q_row = smem;          // [d]
  float* do_row = q_row + d;    // [dv]
  float* ds = do_row + dv;      // [kThreads]
  float* scratch = ds + kThreads;
  const int64_t i = blockIdx.x % p.seqlen_q;
  const int64_t h = blockIdx.x / p.seqlen_q % p.heads_q;
  const int64_t b = blockIdx.x / p.seqlen_q / p.heads_q;
  const int64_t hk = h / p.group;
  for (int c = threadIdx.x; c < d; c += kThreads) q_row[c] = Precision<T>::to_float(row_ptr<T>(p.q, b, i, h)[c]);
  for (int c = threadIdx.x; c < dv; c += kThreads) do_row[c] = Precision<T>::to_float(row_ptr<T>(p.dout, b, i, h)[c]);
  __syncthreads();

  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < p.seqlen_k; j += kThreads) {
    if (visible(p, i, j)) m = fmaxf(m, score(p, q_row, row_ptr<T>(p.k, b, j, hk)));
  }
  m = block_reduce(m, scratch, true);
  float l = 0.f;
  for (int64_t j = threadIdx.x; j < p.seqlen_k; j += kThreads) {
    if (visible(p, i, j)) l += expf(score(p, q_row, row_ptr<T>(p.k, b, j, hk)) - m);
  }
  l = block_reduce(l, scratch, false);
  float lse = l > 0.f ? m + logf(l) : INFINITY;
  if (p.sinks != nullptr) {
    // The sink joins the denominator without a value.
    const float sink = p.sinks[h];
    const float top = fmaxf(m, sink);
    lse = top + logf((l > 0.f ? l * expf(m - top) : 0.f) + expf(sink - top));
  }

  auto prob = [&](int64_t j) {
    if (!visible(p, i, j)) return 0.f;
    const float pr = expf(score(p, q_row, row_ptr<T>(p.k, b, j, hk)) - lse);
    return p.emulate ? Precision<T>::round(pr) : pr;
  };
  auto slope = [&](int64_t j) { return cap_slope(p, score(p, q_row, row_ptr<T>(p.k, b, j, hk))); };
  auto dprob = [&](int64_t j) {
    const float dp = dot(do_row, row_ptr<T>(p.v, b, j, hk), dv);
    return p.emulate ? Precision<T>::round(dp) : dp;
  };
  float dsum = 0.f;
  if (p.o.data != nullptr) {
    const T* o_row = row_ptr<T>(p.o, b, i, h);
    for (int c = threadIdx.x; c < dv; c += kThreads) dsum += do_row[c] * Precision<T>::to_float(o_row[c]);
  } else {
    for (int64_t j = threadIdx.x; j < p.seqlen_k; j += kThreads) {
      const float pr = prob(j);
      if (pr != 0.f) dsum += pr * dprob(j);
    }
  }
  dsum = block_reduce(dsum, scratch, false);

  // dQ: thread c accumulates column c over the keys, a chunk at a time.
  float acc[4] = {0.f, 0.f, 0.f, 0.f};  // columns threadIdx.x + 128 * r, d <= 512
  for (int64_t j0 = 0; j0 < p.seqlen_k; j0 += kThreads) {
    const int64_t j = j0 + threadIdx.x;
    float g = 0.f;
    if (j < p.seqlen_k) {
      const float pr = prob(j);
      if (pr != 0.f) g = pr * (dprob(j) - dsum) * slope(j);
      if (p.emulate) g = Precision<T>::round(g);
    }
    __syncthreads();
    ds[threadIdx.x] = g;
    __syncthreads();
    const int64_t n = p.seqlen_k - j0 < kThreads ? p.seqlen_k - j0 : kThreads;
    for (int r = 0; r < 4; ++r) {
      const int c = threadIdx.x + kThreads * r;
      if (c >= d) break;
      for (int64_t jj = 0; jj < n; ++jj) {
        if (ds[jj] != 0.f) acc[r] += ds[jj] * Precision<T>::to_float(row_ptr<T>(p.k, b, j0 + jj, hk)[c]);
      }
    }
  }
  float* dq = p.dq + ((b * p.seqlen_q + i) * p.heads_q + h) * d;
  for (int r = 0; r < 4; ++r) {
    const int c = threadIdx.x + kThreads * r;
    if (c < d) dq[c] = p.emulate ? Precision<T>::round(acc[r] * p.scale) : acc[r] * p.scale;
  }
  if (threadIdx.x == 0) {
    p.lse[(b * p.heads_q + h) * p.seqlen_q + i] = lse;
    p.dpsum[(b * p.heads_q + h) * p.seqlen_q + i] = dsum;
    // The sink's dP is 0: its dS is P_sink (0 - D).
    if (p.dsinks != nullptr) atomicAdd(p.dsinks + h, -expf(p.sinks[h] - lse) * dsum);
  }
}

template <class T>
__global__ void __launch_bounds__(kThreads) key_rows(const Params p) {
  extern __shared__ float smem[];
  const int d = p.head_dim, dv = p.head_dim_v;
  float* k_row = smem;        // [d]
  float* v_row = k_row + d;   // [dv]
  float* pr = v_row + dv;     // [kThreads]
  float* ds = pr + kThreads;  // [kThreads]
  const int64_t j = blockIdx.x % p.seqlen_k;
  const int64_t hk = blockIdx.x / p.seqlen_k % p.heads_kv;
  const int64_t b = blockIdx.x / p.seqlen_k / p.heads_kv;
  for (int c = threadIdx.x; c < d; c += kThreads) k_row[c] = Precision<T>::to_float(row_ptr<T>(p.k, b, j, hk)[c]);
  for (int c = threadIdx.x; c < dv; c += kThreads) v_row[c] = Precision<T>::to_float(row_ptr<T>(p.v, b, j, hk)[c]);
  // Columns threadIdx.x + 128 * r of dK and dV, d and dv <= 512.
  float dk_acc[4] = {0.f, 0.f, 0.f, 0.f}, dv_acc[4] = {0.f, 0.f, 0.f, 0.f};
  for (int64_t h = hk * p.group; h < (hk + 1) * p.group; ++h) {
    for (int64_t i0 = 0; i0 < p.seqlen_q; i0 += kThreads) {
      const int64_t i = i0 + threadIdx.x;
      float pi = 0.f, g = 0.f;
      __syncthreads();  // k_row/v_row stored; the last chunk's readers are done
      if (i < p.seqlen_q && visible(p, i, j)) {
        const float lse = p.lse[(b * p.heads_q + h) * p.seqlen_q + i];
        float s = capped(p, dot(k_row, row_ptr<T>(p.q, b, i, h), d) * p.scale);
        if (p.emulate) s = Precision<T>::round(s);
        pi = expf(s - lse);
        if (p.emulate) pi = Precision<T>::round(pi);
        float dp = dot(v_row, row_ptr<T>(p.dout, b, i, h), dv);
        if (p.emulate) dp = Precision<T>::round(dp);
        g = pi * (dp - p.dpsum[(b * p.heads_q + h) * p.seqlen_q + i]) * cap_slope(p, s);
        if (p.emulate) g = Precision<T>::round(g);
      }
      pr[threadIdx.x] = pi;
      ds[threadIdx.x] = g;
      __syncthreads();
      const int64_t n = p.seqlen_q - i0 < kThreads ? p.seqlen_q - i0 : kThreads;
      for (int r = 0; r < 4; ++r) {
        const int c = threadIdx.x + kThreads * r;
        for (int64_t ii = 0; ii < n; ++ii) {
          if (pr[ii] == 0.f) continue;
          if (c < dv) dv_acc[r] += pr[ii] * Precision<T>::to_float(row_ptr<T>(p.dout, b, i0 + ii, h)[c]);
          if (c < d) dk_acc[r] += ds[ii] * Precision<T>::to_float(row_ptr<T>(p.q, b, i0 + ii, h)[c]);
        }
      }
    }
  }
  float* dk_out = p.dk + ((b * p.seqlen_k + j) * p.heads_kv + hk) * d;
  float* dv_out = p.dv + ((b * p.seqlen_k + j) * p.heads_kv + hk) * dv;
  for (int r = 0; r < 4; ++r) {
    const int c = threadIdx.x + kThreads * r;
    if (c < d) dk_out[c] = p.emulate ? Precision<T>::round(dk_acc[r] * p.scale) : dk_acc[r] * p.scale;
    if (c < dv) dv_out[c] = p.emulate ? Precision<T>::round(dv_acc[r]) : dv_acc[r];
  }
}

template <class T>
cudaError_t launch(const Params& p, cudaStream_t stream) {
  const size_t smem = (p.head_dim + p.head_dim_v + 2 * kThreads + 8) * sizeof(float);
  if (p.seqlen_q > 0) {
    query_rows<T><<<unsigned(p.batch * p.heads_q * p.seqlen_q), kThreads, smem, stream>>>(p);
    if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;
  }
  if (p.seqlen_k > 0) key_rows<T><<<unsigned(p.batch * p.heads_kv * p.seqlen_k), kThreads, smem, stream>>>(p);
  return cudaGetLastError();
}

View view(const flash3::ConstTensor& t) { return View{t.data, t.batch_stride, t.seq_stride, t.head_stride}; }

}  // namespace

cudaError_t attention_backward_gpu(const AttentionShape& shape, flash3::DType dtype, flash3::ConstTensor q,
                                   flash3::ConstTensor k, flash3::ConstTensor v, flash3::ConstTensor dout,
                                   float* dq, float* dk, float* dv, bool emulate_low_precision,
                                   cudaStream_t stream, const flash3::ConstTensor* o, const float* sinks,
                                   float* dsinks) {
  if (!is_valid(shape) || shape.head_dim > 512 || value_head_dim(shape) > 512) return cudaErrorInvalidValue;
  if (dsinks != nullptr && sinks == nullptr) return cudaErrorInvalidValue;
  if (q.dim_stride != 1 || k.dim_stride != 1 || v.dim_stride != 1 || dout.dim_stride != 1 ||
      (o != nullptr && (o->data == nullptr || o->dim_stride != 1))) {
    return cudaErrorInvalidValue;
  }
  if (dtype != flash3::DType::kBF16 && dtype != flash3::DType::kFP16) return cudaErrorInvalidValue;
  if (dsinks != nullptr) {
    const cudaError_t err = cudaMemsetAsync(dsinks, 0, size_t(shape.heads_q) * sizeof(float), stream);
    if (err != cudaSuccess) return err;
  }
  if (shape.batch == 0) return cudaSuccess;
  if (shape.batch * shape.heads_q * shape.seqlen_q > INT_MAX || shape.batch * shape.heads_kv * shape.seqlen_k > INT_MAX) {
    return cudaErrorInvalidValue;  // one block per row
  }
  Params p{};
  p.q = view(q);
  p.k = view(k);
  p.v = view(v);
  p.dout = view(dout);
  if (o != nullptr) p.o = view(*o);
  p.dq = dq;
  p.dk = dk;
  p.dv = dv;
  p.batch = shape.batch;
  p.seqlen_q = shape.seqlen_q;
  p.seqlen_k = shape.seqlen_k;
  p.heads_q = shape.heads_q;
  p.heads_kv = shape.heads_kv;
  p.group = shape.heads_q / shape.heads_kv;
  p.head_dim = int(shape.head_dim);
  p.head_dim_v = int(value_head_dim(shape));
  p.scale = float(effective_scale(shape));
  p.window_left = shape.window_left;
  p.window_right = window_right_of(shape);
  p.softcap = float(shape.softcap);
  p.emulate = emulate_low_precision;
  p.sinks = sinks;
  p.dsinks = dsinks;
  const size_t scratch = size_t(shape.batch * shape.heads_q * shape.seqlen_q) * sizeof(float);
  cudaError_t err = cudaSuccess;
  if (scratch > 0) {
    if ((err = cudaMallocAsync(reinterpret_cast<void**>(&p.lse), 2 * scratch, stream)) != cudaSuccess) return err;
    p.dpsum = p.lse + scratch / sizeof(float);
  }
  err = dtype == flash3::DType::kBF16 ? launch<__nv_bfloat16>(p, stream) : launch<__half>(p, stream);
  if (p.lse != nullptr) {
    const cudaError_t free_err = cudaFreeAsync(p.lse, stream);
    if (err == cudaSuccess) err = free_err;
  }
  return err;
}

}  // namespace flash3::reference
