// Helpers shared by the GPU tests: skipping without a device, device buffers,
// 16-bit element conversions.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>

#include "flash3/flash3.h"
#include "reference.h"

namespace flash3::testing {

// GTEST_SKIP() with the reason when no CUDA device can be used.
#define SKIP_WITHOUT_CUDA_DEVICE()                                                                    \
  do {                                                                                                \
    int device_count = 0;                                                                             \
    const cudaError_t count_err = cudaGetDeviceCount(&device_count);                                  \
    if (count_err != cudaSuccess) {                                                                   \
      cudaGetLastError();                                                                             \
      GTEST_SKIP() << "no CUDA device: cudaGetDeviceCount failed: " << cudaGetErrorString(count_err); \
    }                                                                                                 \
    if (device_count == 0) GTEST_SKIP() << "no CUDA device: cudaGetDeviceCount returned 0";           \
  } while (0)

#define CUDA_OK(x) ASSERT_EQ((x), cudaSuccess) << #x

template <class T>
struct DeviceBuffer {
  T* ptr = nullptr;
  explicit DeviceBuffer(size_t n) {
    if (n > 0 && cudaMalloc(reinterpret_cast<void**>(&ptr), n * sizeof(T)) != cudaSuccess) ptr = nullptr;
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
};

inline uint16_t to_bits(float x, DType dt) {
  return dt == DType::kBF16 ? reference::float_to_bf16(x) : reference::float_to_half(x);
}
inline float from_bits(uint16_t b, DType dt) {
  return dt == DType::kBF16 ? reference::bf16_to_float(b) : reference::half_to_float(b);
}

}  // namespace flash3::testing
