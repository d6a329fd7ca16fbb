// A kernel's dynamic shared memory allowance, set once per device: the
// attribute stays with the function in the device's context, and setting it
// again on every launch costs host time on the small calls that inference makes.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>

namespace flash3 {

template <auto Kernel>
cudaError_t allow_dynamic_smem(int device, int bytes) {
  static std::atomic<uint64_t> set_on{0};  // bit d: set on device d (devices past 63 set it every time)
  uint64_t const bit = device >= 0 && device < 64 ? uint64_t(1) << device : 0;
  if (bit != 0 && (set_on.load(std::memory_order_acquire) & bit) != 0) return cudaSuccess;
  cudaError_t const err = cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (err == cudaSuccess) set_on.fetch_or(bit, std::memory_order_release);
  return err;
}

}  // namespace flash3
