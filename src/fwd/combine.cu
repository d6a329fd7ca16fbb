// The combine kernel (fwd/combine.h): a warp per output row. Its
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
template <>
__device__ __forceinline__ void store4(float* dst, float4 v) {
  *reinterpret_cast<float4*>(dst) = v;
}

template <class T>
__global__ void __launch_bounds__(kWarpsPerCta * 32) combine_kernel(CombineArgs const a) {
  __shared__ float weights[kWarpsPerCta][kMaxSplits];
  int const warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  int64_t const rows = a.batch * a.heads * a.seqlen;
  int64_t const row = int64_t(blockIdx.x) * kWarpsPerCta + warp;
  if (row >= rows) return;
  // Rows in the output LSE's order: (batch, head, query row).
  int64_t const i = row % a.seqlen;
  int64_t const head = row / a.seqlen % a.heads;
  int64_t const b = row / (a.seqlen * a.heads);
  int const splits = int(a.num_splits);
  float const* lse_row = a.lse_partial + b * a.lse_batch_stride + i * a.lse_seq_stride + head * a.lse_head_stride;
  float const* o_row = static_cast<float const*>(a.o_partial.data) + b * a.o_partial.batch_stride +
                       i * a.o_partial.seq_stride + head * a.o_partial.head_stride;
  // Launched as the split kernel's dependent: its partials are complete and visible past this wait.
  wait_for_earlier_grid();

  float top = -INFINITY;
  for (int s = lane; s < splits; s += 32) top = fmaxf(top, lse_row[s * a.lse_split_stride]);
  top = warp_max(top);
  float const sink = a.sinks != nullptr ? a.sinks[head] : -INFINITY;
  top = fmaxf(top, sink);
  // No key and no sink: O = 0, L = +inf (exp of anything minus top would be NaN).
  bool const empty = top == -INFINITY;
  float total = 0.f;
  for (int s = lane; s < splits; s += 32) {
    float const w = empty ? 0.f : expf(lse_row[s * a.lse_split_stride] - top);
    weights[warp][s] = w;
    total += w;
  }
  total = warp_sum(total) + (sink == -INFINITY ? 0.f : expf(sink - top));
  float const lse = empty || !(total > 0.f) ? INFINITY : top + logf(total);
  float const inv_total = empty || !(total > 0.f) ? 0.f : 1.f / total;
  __syncwarp();

  T* out = static_cast<T*>(a.out.data) + b * a.out.batch_stride + i * a.out.seq_stride + head * a.out.head_stride;
  auto const partial = [&](int s, int64_t c) {
    return *reinterpret_cast<float4 const*>(o_row + s * a.o_partial_split_stride + c);
  };
  // A split with no key for the row weighs 0; its O is finite when forward()
  // wrote it (zeros) but may be anything a caller left there, so it is not added.
  auto const add = [](float4& acc, float w, float4 v) {
    if (w == 0.f) return;
    acc.x += w * v.x;
    acc.y += w * v.y;
    acc.z += w * v.z;
    acc.w += w * v.w;
  };
  for (int64_t c = lane * 4; c < a.head_dim; c += 32 * 4) {
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    // kLoadsInFlight loads issued before their sums: a load waits out the
    // L2's latency, and a row's splits are few enough that it dominates.
    int s = 0;
    for (; s + kLoadsInFlight <= splits; s += kLoadsInFlight) {
      float4 v[kLoadsInFlight];
#pragma unroll
      for (int j = 0; j < kLoadsInFlight; ++j) v[j] = partial(s + j, c);
#pragma unroll
      for (int j = 0; j < kLoadsInFlight; ++j) add(acc, weights[warp][s + j], v[j]);
    }
    for (; s < splits; ++s) add(acc, weights[warp][s], partial(s, c));
    store4(out + c, make_float4(acc.x * inv_total, acc.y * inv_total, acc.z * inv_total, acc.w * inv_total));
  }
  if (a.lse != nullptr && lane == 0) a.lse[(b * a.heads + head) * a.seqlen + i] = lse;
}

}  // namespace

cudaError_t combine_splits(CombineArgs const& args, cudaStream_t stream) {
  int64_t const rows = args.batch * args.heads * args.seqlen;
  if (rows == 0) return cudaSuccess;
  dim3 const grid(unsigned((rows + kWarpsPerCta - 1) / kWarpsPerCta));
  dim3 const block(kWarpsPerCta * 32);
  // A dependent launch: its launch and start overlap the split kernel's end.
  switch (args.out_dtype) {
    case DType::kFP16: return launch_dependent(combine_kernel<__half>, grid, block, 0, stream, args);
    case DType::kFP32: return launch_dependent(combine_kernel<float>, grid, block, 0, stream, args);
    default: return launch_dependent(combine_kernel<__nv_bfloat16>, grid, block, 0, stream, args);
  }
}

}  // namespace flash3::fwd
