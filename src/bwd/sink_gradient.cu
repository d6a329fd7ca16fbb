#include "bwd/sink_gradient.h"

#include <cmath>
#include <cstdint>

namespace flash3::bwd {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

__global__ void __launch_bounds__(kThreads) sink_gradient_kernel(SinkGradientParams const p) {
  int const head = blockIdx.x;
  float const sink_log2 = p.sinks[head] * float(M_LOG2E);
  float sum = 0.f;
  for (int b = 0; b < p.batch; ++b) {
    int64_t const base = (int64_t(b) * p.num_heads + head) * p.padded_rows;
    // L >= sink, so the exponent is at most 0; padding rows add exp(-inf) * 0.
    for (int r = threadIdx.x; r < p.padded_rows; r += kThreads) {
      sum += exp2f(sink_log2 - p.lse_log2[base + r]) * p.dpsum[base + r];
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
  sink_gradient_kernel<<<p.num_heads, kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace flash3::bwd
