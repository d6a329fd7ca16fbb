// The KV cache append kernel (fwd/append_kv.h): a thread per 16 bytes (eight
// elements) of a row of the new keys, the new values or Q, picked by
// blockIdx.y; the keys' blocks also write the lengths after the append.
// Rotated dims are computed in float32 and rounded once to the element type;
// the other dims (and e4m3 rows, which take no rotary) are copied as they
// are. Only the rows it appends (and Q's copy) are written.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "fwd/append_kv.h"

namespace flash3::fwd {
namespace {

constexpr int kVec = 8;  // elements: 16 bytes of a 16-bit type, 8 of e4m3
constexpr int kThreads = 256;
// Blocks per tensor at most; a larger tensor is walked by a grid-stride loop.
constexpr int64_t kMaxBlocks = int64_t(1) << 20;

enum Job { kKeys, kValues, kQuery };

template <int N>
struct Floats {
  float x[N];
};

// N elements (16 or 8 bytes, aligned) as floats.
template <class T, int N>
__device__ __forceinline__ Floats<N> load(T const* p) {
  static_assert(N == 8 || N == 4);
  using Raw = std::conditional_t<N == 8, uint4, uint2>;
  Raw const raw = *reinterpret_cast<Raw const*>(p);
  T const* e = reinterpret_cast<T const*>(&raw);
  Floats<N> f;
#pragma unroll
  for (int i = 0; i < N; ++i) f.x[i] = static_cast<float>(e[i]);
  return f;
}

template <class T>
__device__ __forceinline__ void store(T* p, Floats<kVec> const& f) {
  uint4 raw;
  T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
  for (int i = 0; i < kVec; ++i) e[i] = T(f.x[i]);
  *reinterpret_cast<uint4*>(p) = raw;
}

template <class T>
using Chunk = std::conditional_t<sizeof(T) == 2, uint4, uint2>;  // kVec elements

template <class T>
__device__ __forceinline__ void copy(T* out, T const* in) {
  *reinterpret_cast<Chunk<T>*>(out) = *reinterpret_cast<Chunk<T> const*>(in);
}

// Chunk c (elements 8c .. 8c + 7) of a row at `position`, interleaved: its
// four pairs (2p, 2p + 1) by angles 4c .. 4c + 3.
template <class T>
__device__ __forceinline__ void rotate_interleaved(T* out, T const* in, T const* cos, T const* sin, int c) {
  Floats<kVec> x = load<T, kVec>(in + c * kVec);
  Floats<kVec / 2> const cs = load<T, kVec / 2>(cos + c * kVec / 2), sn = load<T, kVec / 2>(sin + c * kVec / 2);
#pragma unroll
  for (int p = 0; p < kVec / 2; ++p) {
    float const x0 = x.x[2 * p], x1 = x.x[2 * p + 1];
    x.x[2 * p] = x0 * cs.x[p] - x1 * sn.x[p];
    x.x[2 * p + 1] = x1 * cs.x[p] + x0 * sn.x[p];
  }
  store(out + c * kVec, x);
}

// Chunk c of the first half and its partner in the second, non-interleaved:
// element e pairs with e + half, both by angle e.
template <class T>
__device__ __forceinline__ void rotate_halves(T* out, T const* in, T const* cos, T const* sin, int c, int half) {
  int const e = c * kVec;
  Floats<kVec> lo = load<T, kVec>(in + e), hi = load<T, kVec>(in + e + half);
  Floats<kVec> const cs = load<T, kVec>(cos + e), sn = load<T, kVec>(sin + e);
#pragma unroll
  for (int i = 0; i < kVec; ++i) {
    float const x0 = lo.x[i], x1 = hi.x[i];
    lo.x[i] = x0 * cs.x[i] - x1 * sn.x[i];
    hi.x[i] = x1 * cs.x[i] + x0 * sn.x[i];
  }
  store(out + e, lo);
  store(out + e + half, hi);
}

template <class T>
__global__ void __launch_bounds__(kThreads) append_kv_kernel(AppendKvArgs const a) {
  Job const job = Job(blockIdx.y);
  int const heads = job == kQuery ? a.heads_q : a.heads_kv;
  int const rows = job == kQuery ? a.seqlen_q : a.seqlen_new;
  int const chunks = (job == kValues ? a.head_dim_v : a.head_dim) / kVec;
  ConstTensor const src = job == kKeys ? a.k_new : job == kValues ? a.v_new : a.q;
  MutableTensor const dst = job == kKeys ? a.k_cache : a.v_cache;
  bool const rotary = job != kValues && a.cos != nullptr;
  int const half = a.rotary_dim / 2;
  int64_t const total = int64_t(a.batch) * rows * heads * chunks;
  int64_t const stride = int64_t(gridDim.x) * kThreads;
  if (job == kKeys) {
    for (int64_t b = int64_t(blockIdx.x) * kThreads + threadIdx.x; b < a.batch; b += stride) {
      a.seqlens_after[b] = a.cache.seqlens[b] + a.seqlen_new;
    }
  }
  for (int64_t idx = int64_t(blockIdx.x) * kThreads + threadIdx.x; idx < total; idx += stride) {
    int const c = int(idx % chunks);
    int64_t const row = idx / chunks;
    int const h = int(row % heads);
    int const i = int(row / heads % rows);
    int const b = int(row / (int64_t(heads) * rows));
    T const* in = static_cast<T const*>(src.data) + b * src.batch_stride + i * src.seq_stride + h * src.head_stride;
    int const first = a.cache.seqlens[b];  // the entry's first appended key
    T* out;
    if (job == kQuery) {
      out = static_cast<T*>(a.q_rotated) + ((int64_t(b) * rows + i) * heads + h) * (chunks * kVec);
    } else {
      KvCacheMap::Row const r = a.cache.row_of(b, first + i);
      out = static_cast<T*>(dst.data) + r.entry * dst.batch_stride + r.row * dst.seq_stride + h * dst.head_stride;
    }
    if (sizeof(T) == 1 || !rotary || c * kVec >= a.rotary_dim) {
      copy(out + c * kVec, in + c * kVec);
      continue;
    }
    if constexpr (sizeof(T) == 2) {
      int const position = job == kQuery && !a.q_position_per_row ? first : first + i;
      T const* cos = static_cast<T const*>(a.cos) + int64_t(position) * half;
      T const* sin = static_cast<T const*>(a.sin) + int64_t(position) * half;
      if (a.interleaved) {
        rotate_interleaved(out, in, cos, sin, c);
      } else if (c * kVec < half) {  // a chunk of the second half is its partner's to write
        rotate_halves(out, in, cos, sin, c, half);
      }
    }
  }
}

}  // namespace

cudaError_t append_kv(AppendKvArgs const& args, cudaStream_t stream) {
  int64_t const q_chunks = args.cos != nullptr ? int64_t(args.seqlen_q) * args.heads_q * args.head_dim : 0;
  int64_t const kv_chunks = int64_t(args.seqlen_new) * args.heads_kv * std::max(args.head_dim, args.head_dim_v);
  int64_t const chunks = args.batch * std::max(q_chunks, kv_chunks) / kVec;
  if (chunks == 0) return cudaSuccess;
  dim3 const grid(unsigned(std::min((chunks + kThreads - 1) / kThreads, kMaxBlocks)), args.cos != nullptr ? 3 : 2);
  if (args.dtype == DType::kE4M3) {
    append_kv_kernel<__nv_fp8_e4m3><<<grid, kThreads, 0, stream>>>(args);
  } else if (args.dtype == DType::kFP16) {
    append_kv_kernel<__half><<<grid, kThreads, 0, stream>>>(args);
  } else {
    append_kv_kernel<__nv_bfloat16><<<grid, kThreads, 0, stream>>>(args);
  }
  return cudaGetLastError();
}

}  // namespace flash3::fwd
