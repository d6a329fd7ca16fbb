// The varlen tile table's build on the device (common/varlen_tiles.h).
#include "common/varlen_tiles.h"

namespace flash3 {
namespace {

constexpr int kBuildThreads = 256;

__global__ void __launch_bounds__(kBuildThreads) build_kernel(VarlenTileOrder const order) {
  order.build(int(threadIdx.x), kBuildThreads, [] { __syncthreads(); });
}

}  // namespace

cudaError_t build_varlen_tiles(VarlenTileOrder const& order, cudaStream_t stream) {
  build_kernel<<<1, kBuildThreads, 0, stream>>>(order);
  return cudaGetLastError();
}

}  // namespace flash3
