// Programmatic dependent launch (PDL) for a chain of kernels on one stream:
// a kernel launched with launch_dependent() may start while the kernel before
// it still runs its last wave, so that its launch and its prologue overlap
// that wave. The earlier kernel allows it with let_dependents_start(); the
// later one calls wait_for_earlier_grid() before it first touches memory the
// earlier one writes (or reads: the wait returns once that grid has completed
// and its writes are visible). Without the launch attribute the wait returns
// at once, so a kernel may be launched either way.
#pragma once

#include <cuda_runtime.h>
#include <cutlass/arch/grid_dependency_control.h>

namespace flash3 {

#if defined(__CUDA_ARCH__)
// Without CUTLASS_ENABLE_GDC_FOR_SM90 (CMakeLists.txt) CUTLASS compiles both
// calls to nothing, and a dependent kernel would race the one before it.
static_assert(cutlass::arch::IsGdcGloballyEnabled, "build the kernels with CUTLASS_ENABLE_GDC_FOR_SM90");
#endif

__device__ __forceinline__ void let_dependents_start() { cutlass::arch::launch_dependent_grids(); }
__device__ __forceinline__ void wait_for_earlier_grid() { cutlass::arch::wait_on_dependent_grids(); }

template <class... KernelParams, class... Args>
cudaError_t launch_dependent(void (*kernel)(KernelParams...), dim3 grid, dim3 block, size_t smem_bytes,
                             cudaStream_t stream, Args const&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, kernel, args...);
}

}  // namespace flash3
