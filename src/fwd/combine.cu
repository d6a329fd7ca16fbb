// Split-KV's combine kernel (fwd/combine.h): a warp per output row. Its
// lanes first reduce the row's split LSEs to L and the weights (kept in
// shared memory), then each lane sums four columns at a time over the
// splits, float4 loads of the partials, and writes O in its dtype. It is
// launched as the split kernel's programmatic dependent (common/dependent_launch.h).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "common/dependent_launch.h"
#include "fwd/combine.h"
#include "fwd/kv_split.h"

namespace flash3::fwd {
namespace {

constexpr int kWarpsPerCta = 4;
constexpr int kLoadsInFlight = 8;

__device__ __forceinline__ float warp_max(float x) {
  for (int d = 16; d > 0; d /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffff, x, d));
  return x;
}
__device__ __forceinline__ float warp_sum(float x) {
  for (int d = 16; d > 0; d /= 2) x += __shfl_xor_sync(0xffffffff, x, d);
  return x;
}

template <class T>
__device__ __forceinline__ void store4(T* dst, float4 v);
template <>
__device__ __forceinline__ void store4(__nv_bfloat16* dst, float4 v) {
  reinterpret_cast<__nv_bfloat162*>(dst)[0] = __floats2bfloat162_rn(v.x, v.y);
  reinterpret_cast<__nv_bfloat162*>(dst)[1] = __floats2bfloat162_rn(v.z, v.w);
}
template <>
__device__ __forceinline__ void store4(__half* dst, float4 v) {
  reinterpret_cast<__half2*>(dst)[0] = __floats2half2_rn(v.x, v.y);
  reinterpret_cast<__half2*>(dst)[1] = __floats2half2_rn(v.z, v.w);
}

template <class T>
__global__ void __launch_bounds__(kWarpsPerCta * 32) combine_kernel(CombineArgs const a) {
  __shared__ float weights[kWarpsPerCta][kMaxSplits];
  int const warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int64_t const rows = int64_t(a.batch) * a.heads * a.seqlen_q;
  int64_t const row = int64_t(blockIdx.x) * kWarpsPerCta + warp;
  if (row >= rows) return;
  // Rows in the partials' order: (batch, head, query row).
  int const i = int(row % a.seqlen_q);
  int const head = int(row / a.seqlen_q % a.heads);
  int const b = int(row / (int64_t(a.seqlen_q) * a.heads));
  int64_t const split_rows = rows;  // the stride between splits, in rows
  // Launched as the split kernel's dependent: its partials are complete and visible past this wait.
  wait_for_earlier_grid();

  float top = -INFINITY;
  for (int s = lane; s < a.num_splits; s += 32) top = fmaxf(top, a.lse_partial[s * split_rows + row]);
  top = warp_max(top);
  float const sink = a.sinks != nullptr ? a.sinks[head] : -INFINITY;
  top = fmaxf(top, sink);
  // No key and no sink: O = 0, L = +inf (exp of anything minus top would be NaN).
  bool const empty = top == -INFINITY;
  float total = 0.f;
  for (int s = lane; s < a.num_splits; s += 32) {
    float const w = empty ? 0.f : expf(a.lse_partial[s * split_rows + row] - top);
    weights[warp][s] = w;
    total += w;
  }
  total = warp_sum(total) + (sink == -INFINITY ? 0.f : expf(sink - top));
  float const lse = empty || !(total > 0.f) ? INFINITY : top + logf(total);
  float const inv_total = empty || !(total > 0.f) ? 0.f : 1.f / total;
  __syncwarp();

  T* out = static_cast<T*>(a.o.data) + b * a.o.batch_stride + i * a.o.seq_stride + head * a.o.head_stride;
  auto const partial = [&](int s, int c) {
    return *reinterpret_cast<float4 const*>(a.o_partial + (s * split_rows + row) * a.head_dim_v + c);
  };
  auto const add = [](float4& acc, float w, float4 v) {
    acc.x += w * v.x;
    acc.y += w * v.y;
    acc.z += w * v.z;
    acc.w += w * v.w;
  };
  for (int c = lane * 4; c < a.head_dim_v; c += 32 * 4) {
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    // kLoadsInFlight loads issued before their sums: a load waits out the
    // L2's latency, and a row's splits are few enough that it dominates.
    // Every split's partial is written (an empty one's O zeros), so all are read.
    int s = 0;
    for (; s + kLoadsInFlight <= a.num_splits; s += kLoadsInFlight) {
      float4 v[kLoadsInFlight];
#pragma unroll
      for (int j = 0; j < kLoadsInFlight; ++j) v[j] = partial(s + j, c);
#pragma unroll
      for (int j = 0; j < kLoadsInFlight; ++j) add(acc, weights[warp][s + j], v[j]);
    }
    for (; s < a.num_splits; ++s) add(acc, weights[warp][s], partial(s, c));
    store4(out + c, make_float4(acc.x * inv_total, acc.y * inv_total, acc.z * inv_total, acc.w * inv_total));
  }
  if (a.lse != nullptr && lane == 0) a.lse[(int64_t(b) * a.heads + head) * a.seqlen_q + i] = lse;
}

}  // namespace

cudaError_t combine_splits(CombineArgs const& args, cudaStream_t stream) {
  int64_t const rows = int64_t(args.batch) * args.heads * args.seqlen_q;
  if (rows == 0) return cudaSuccess;
  unsigned const grid = unsigned((rows + kWarpsPerCta - 1) / kWarpsPerCta);
  // A dependent launch: its launch and start overlap the split kernel's end.
  dim3 const block(kWarpsPerCta * 32);
  if (args.dtype == DType::kFP16) return launch_dependent(combine_kernel<__half>, dim3(grid), block, 0, stream, args);
  return launch_dependent(combine_kernel<__nv_bfloat16>, dim3(grid), block, 0, stream, args);
}

}  // namespace flash3::fwd
