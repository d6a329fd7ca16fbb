// Helpers shared by the GPU tests: skipping without a device, device buffers,
// 16-bit element conversions.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

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

// The (dtype, head dim, causal) shape sweeps: their parameters, and test
// names such as bf16_d128_causal.
using SweepParam = std::tuple<DType, int, bool>;
inline std::string sweep_name(::testing::TestParamInfo<SweepParam> const& info) {
  return std::string(std::get<0>(info.param) == DType::kBF16 ? "bf16" : "fp16") + "_d" +
         std::to_string(std::get<1>(info.param)) + (std::get<2>(info.param) ? "_causal" : "");
}

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

// The forward's tolerance rule, on host copies: O (16-bit, in o_dtype)
// against the float32 reference `ref`, at most 2x (plus 1e-5) the error of a
// straightforward implementation `low`, no NaN (outputs are poisoned before
// the run); the LSE within 1e-3 relative plus lse_slack(i), and +inf where
// the reference has it.
template <class Slack>
void expect_forward_close(std::vector<uint16_t> const& o, DType o_dtype, std::vector<float> const& ref,
                          std::vector<float> const& low, std::vector<float> const& lse,
                          std::vector<float> const& ref_lse, Slack lse_slack) {
  double err = 0, low_err = 0;
  for (size_t i = 0; i < o.size(); ++i) {
    float const x = from_bits(o[i], o_dtype);
    ASSERT_FALSE(std::isnan(x)) << "O[" << i << "] not written or NaN";
    err = std::max(err, double(std::fabs(x - ref[i])));
    low_err = std::max(low_err, double(std::fabs(low[i] - ref[i])));
  }
  EXPECT_LE(err, 2 * low_err + 1e-5) << "flash3 max error " << err << ", straightforward implementation " << low_err;
  for (size_t i = 0; i < lse.size(); ++i) {
    ASSERT_FALSE(std::isnan(lse[i])) << "LSE[" << i << "] not written or NaN";
    if (std::isinf(ref_lse[i])) {
      EXPECT_EQ(lse[i], ref_lse[i]) << "LSE[" << i << "]";
    } else {
      ASSERT_NEAR(lse[i], ref_lse[i], 1e-3 * std::max(1.f, std::fabs(ref_lse[i])) + lse_slack(i)) << "LSE[" << i << "]";
    }
  }
}

}  // namespace flash3::testing
