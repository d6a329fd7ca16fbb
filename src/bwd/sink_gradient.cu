#include "bwd/sink_gradient.h"

#include <cmath>
#include <cstdint>

namespace flash3::bwd {
namespace {

// One CTA a head reads all of its rows: the sum is bound by the loads' latency,
// so each thread keeps several float4 loads in flight.
constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;

__global__ void __launch_bounds__(kThreads) sink_gradient_kernel(SinkGradientParams const p) {
  int const head = blockIdx.x;
  float const sink_log2 = p.sinks[head] * float(M_LOG2E);
  int const quads = p.padded_rows / 4;
  float sum = 0.f;
  for (int b = 0; b < p.batch; ++b) {
    int64_t const base = (int64_t(b) * p.num_heads + head) * p.padded_rows;
    auto const* lse = reinterpret_cast<float4 const*>(p.lse_log2 + base);
    auto const* dpsum = reinterpret_cast<float4 const*>(p.dpsum + base);
    // L >= sink, so the exponent is at most 0; padding rows add exp(-inf) * 0.
#pragma unroll 4
    for (int i = threadIdx.x; i < quads; i += kThreads) {
      float4 const l = lse[i], d = dpsum[i];
      sum += exp2f(sink_log2 - l.x) * d.x + exp2f(sink_log2 - l.y) * d.y + exp2f(sink_log2 - l.z) * d.z +
             exp2f(sink_log2 - l.w) * d.w;
    }
  }
  for (int offset = 16; offset > 0; offset /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  __shared__ float warp_sums[kWarps];
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0.f;
    for (int w = 0; w < kWarps; ++w) total += warp_sums[w];
    p.dsinks[head] = -total;
  }
}

}  // namespace

cudaError_t launch_sink_gradient(SinkGradientParams const& p, cudaStream_t stream) {
  if (p.padded_rows % 4 != 0) return cudaErrorInvalidValue;
  sink_gradient_kernel<<<p.num_heads, kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace flash3::bwd
