// Helpers shared by the GPU tests: skipping without a device, device buffers,
// 16-bit element conversions.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <ostream>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "flash3/flash3.h"
#include "reference.h"

namespace flash3::testing {

// Whether a CUDA device can be used. No GPU reads as cudaErrorNoDevice (or a
// count of 0), no driver as cudaErrorInsufficientDriver: both are kAbsent.
// Any other error is a GPU that is there but unusable: kBroken.
struct CudaDevice {
  enum State { kUsable, kAbsent, kBroken } state;
  std::string reason;
};
inline CudaDevice cuda_device() {
  int count = 0;
  cudaError_t const err = cudaGetDeviceCount(&count);
  cudaGetLastError();
  if (err == cudaSuccess) {
    if (count > 0) return {CudaDevice::kUsable, ""};
    return {CudaDevice::kAbsent, "no CUDA device (cudaGetDeviceCount returned 0)"};
  }
  if (err == cudaErrorNoDevice) return {CudaDevice::kAbsent, "no CUDA device (cudaErrorNoDevice)"};
  if (err == cudaErrorInsufficientDriver) {
    return {CudaDevice::kAbsent, "no CUDA device (cudaErrorInsufficientDriver: no NVIDIA driver loaded, or one "
                                 "older than the CUDA runtime)"};
  }
  return {CudaDevice::kBroken, std::string("cudaGetDeviceCount failed: ") + cudaGetErrorName(err)};
}

// GTEST_SKIP() with the reason when no CUDA device is present; a failure
// when one is there but unusable.
#define SKIP_WITHOUT_CUDA_DEVICE()                                             \
  do {                                                                         \
    using CudaDevice_ = ::flash3::testing::CudaDevice;                         \
    CudaDevice_ const device_ = ::flash3::testing::cuda_device();              \
    if (device_.state == CudaDevice_::kAbsent) GTEST_SKIP() << device_.reason; \
    if (device_.state == CudaDevice_::kBroken) GTEST_FAIL() << device_.reason; \
  } while (0)

#define CUDA_OK(x) ASSERT_EQ((x), cudaSuccess) << #x

// Q/K's head dim and V's: the same, or a pair of common/head_dims.inc.
struct HeadDims {
  int qk;
  int v;
  // V's as the arguments take it (ForwardArgs::head_dim_v): 0 when the same.
  int v_arg() const { return v == qk ? 0 : v; }
};
inline void PrintTo(HeadDims const& h, std::ostream* os) { *os << "d" << h.qk << (h.v != h.qk ? "/" : "") << h.v; }
// Every head dim both passes are built for, and the pair.
inline constexpr HeadDims kHeadDims[] = {{64, 64}, {96, 96}, {128, 128}, {192, 192}, {256, 256}, {192, 128}};

// The (dtype, head dims, causal) shape sweeps: their parameters, and test
// names such as bf16_d128_causal and bf16_d192_v128.
using SweepParam = std::tuple<DType, HeadDims, bool>;
inline std::string sweep_name(::testing::TestParamInfo<SweepParam> const& info) {
  HeadDims const h = std::get<1>(info.param);
  return std::string(std::get<0>(info.param) == DType::kBF16 ? "bf16" : "fp16") + "_d" + std::to_string(h.qk) +
         (h.v != h.qk ? "_v" + std::to_string(h.v) : "") + (std::get<2>(info.param) ? "_causal" : "");
}

// Shapes drawn at random (fixed seeds, so a failure reproduces), for what
// the sweeps' hand-picked shapes may miss: any head dim and dtype, either
// mask, GQA/MQA, and sequence lengths from 1 to max_seqlen drawn
// log-uniformly and independently, so that seqlen_q and seqlen_k differ by
// up to that factor either way (with the mask, many rows then see no key,
// or every row sees all of them).
struct RandomShape {
  DType dtype;
  int head_dim;
  bool causal;
  int batch, seqlen_q, seqlen_k, heads_q, heads_kv;
};
// FLASH3_RANDOM_SHAPES=N draws N instead of `count` (the first `count` the
// same), for a longer search on the GPU machine than the suite's.
inline std::vector<RandomShape> random_shapes(uint32_t seed, int count, int max_seqlen) {
  if (char const* n = std::getenv("FLASH3_RANDOM_SHAPES")) count = std::atoi(n);
  std::mt19937 rng(seed);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  auto seqlen = [&] {
    return std::max(1, int(std::exp(std::uniform_real_distribution<double>(0.0, std::log(max_seqlen))(rng))));
  };
  int const dims[] = {64, 96, 128, 192, 256};
  std::vector<RandomShape> shapes;
  for (int i = 0; i < count; ++i) {
    RandomShape c{};
    c.dtype = pick(0, 1) ? DType::kBF16 : DType::kFP16;
    c.head_dim = dims[pick(0, 4)];
    c.causal = pick(0, 1) == 1;
    c.batch = pick(1, 3);
    c.seqlen_q = seqlen();
    c.seqlen_k = seqlen();
    c.heads_kv = pick(1, 4);
    c.heads_q = c.heads_kv * pick(1, 4);
    shapes.push_back(c);
  }
  return shapes;
}

// A shape with the mask policy's options, as both passes' tests take them.
struct OptionCase {
  DType dtype;
  int head_dim;
  bool causal;
  int batch, seqlen_q, seqlen_k, heads_q, heads_kv;
  int window_left = -1, window_right = -1;
  float softcap = 0.f;
  bool sinks = false;
  int head_dim_v = 0;  // V's, as ForwardArgs::head_dim_v
};

// Sliding windows (Forward.Windows, Backward.Windows): bounds of 0, inside a
// block, across blocks, one side only, wider than the sequence; with causal;
// unequal lengths (rows that see no key); every head dim (and pair) and
// dtype, GQA.
inline std::vector<OptionCase> window_cases() {
  struct W {
    int left, right;
    bool causal;
  };
  W const windows[] = {{0, 0, false}, {17, 3, false}, {100, -1, false}, {-1, 50, false}, {300, 0, false},
                       {128, -1, true}, {5000, 5000, false}};
  std::vector<OptionCase> cases;
  for (DType dtype : {DType::kBF16, DType::kFP16}) {
    for (HeadDims const h : kHeadDims) {
      for (W const w : windows) {
        for (auto const [sq, sk] : {std::pair{700, 700}, std::pair{300, 900}, std::pair{900, 200}}) {
          cases.push_back({dtype, h.qk, w.causal, 2, sq, sk, 4, 2, w.left, w.right});
          cases.back().head_dim_v = h.v_arg();
        }
      }
    }
  }
  return cases;
}

// Softcapping (Forward.Softcap, Backward.Softcap): caps that bend the scores
// (1.5, with scores of a few units) and that barely do (30), every head dim
// (and pair) and dtype, both masks, GQA; then with a window, and with sinks
// and rows that see no key.
inline std::vector<OptionCase> softcap_cases() {
  std::vector<OptionCase> cases;
  for (DType dtype : {DType::kBF16, DType::kFP16}) {
    for (HeadDims const h : kHeadDims) {
      for (float softcap : {1.5f, 30.f}) {
        for (bool causal : {false, true}) {
          cases.push_back({dtype, h.qk, causal, 2, 300, 300, 4, 2, -1, -1, softcap});
          cases.back().head_dim_v = h.v_arg();
        }
      }
    }
  }
  cases.push_back({DType::kBF16, 128, false, 2, 700, 700, 4, 2, 100, 20, 1.5f});
  cases.push_back({DType::kBF16, 128, true, 1, 500, 100, 8, 1, -1, -1, 1.5f, true});
  return cases;
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
