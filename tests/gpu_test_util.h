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
#include <utility>
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

// A packed batch's layout (varlen) for the GPU tests: sequence b's len_q[b]
// query and len_k[b] key rows that take part, then kSequsedPad rows past
// them where seqused is given, then `tail` rows past the last sequence;
// cu_seqlens and seqused on the host and the device.
struct PackedBatch {
  static constexpr int kSequsedPad = 5;
  std::vector<int> len_q, len_k;
  bool seqused;
  std::vector<int32_t> cu_q{0}, cu_k{0};
  int total_q, total_k;
  int64_t max_q, max_k;  // the longest sequence's rows, its padding included
  DeviceBuffer<int32_t> d_cu_q, d_cu_k, d_used_q, d_used_k;

  PackedBatch(std::vector<int> lq, std::vector<int> lk, bool used, int tail)
      : len_q(std::move(lq)), len_k(std::move(lk)), seqused(used), d_cu_q(len_q.size() + 1),
        d_cu_k(len_q.size() + 1), d_used_q(len_q.size()), d_used_k(len_q.size()) {
    int const pad = seqused ? kSequsedPad : 0;
    for (size_t b = 0; b < len_q.size(); ++b) {
      cu_q.push_back(cu_q.back() + len_q[b] + pad);
      cu_k.push_back(cu_k.back() + len_k[b] + pad);
    }
    total_q = cu_q.back() + tail;
    total_k = cu_k.back() + tail;
    max_q = *std::max_element(len_q.begin(), len_q.end()) + pad;
    max_k = *std::max_element(len_k.begin(), len_k.end()) + pad;
  }
  int batch() const { return int(len_q.size()); }

  // cu_seqlens and seqused to the device.
  cudaError_t upload() const {
    size_t const n = len_q.size();
    for (auto [dst, src, count] : {std::tuple{d_cu_q.ptr, cu_q.data(), n + 1}, std::tuple{d_cu_k.ptr, cu_k.data(), n + 1},
                                   std::tuple{d_used_q.ptr, len_q.data(), n}, std::tuple{d_used_k.ptr, len_k.data(), n}}) {
      if (cudaError_t const err = cudaMemcpy(dst, src, count * 4, cudaMemcpyHostToDevice); err != cudaSuccess) {
        return err;
      }
    }
    return cudaSuccess;
  }

  Varlen varlen() const {
    return {d_cu_q.ptr, d_cu_k.ptr, seqused ? d_used_q.ptr : nullptr, seqused ? d_used_k.ptr : nullptr, total_q,
            total_k};
  }

  // ForwardArgs over packed [rows, heads, head dim] buffers (V and O at V's
  // head dim, head_dim_v; 0: head_dim's).
  ForwardArgs forward_args(DType dtype, int heads_q, int heads_kv, int head_dim, int head_dim_v, void const* q,
                           void const* k, void const* v, void* o, float* lse) const {
    int64_t const d = head_dim, dv = head_dim_v != 0 ? head_dim_v : head_dim;
    ForwardArgs a;
    a.dtype = dtype;
    a.batch = batch();
    a.seqlen_q = max_q;
    a.seqlen_k = max_k;
    a.heads_q = heads_q;
    a.heads_kv = heads_kv;
    a.head_dim = head_dim;
    a.head_dim_v = head_dim_v;
    a.q = {q, 0, heads_q * d, d, 1};
    a.k = {k, 0, heads_kv * d, d, 1};
    a.v = {v, 0, heads_kv * dv, dv, 1};
    a.o = {o, 0, heads_q * dv, dv, 1};
    a.lse = lse;
    a.varlen = varlen();
    return a;
  }
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

// The packed forward's results (host copies; O and the references row by
// row, row_elems apiece; the LSE [heads_q, total_q]): the rows that take part
// gathered in order for expect_forward_close, each other row (past seqused,
// past the last sequence) checked to keep its poison, O 0xffff and the LSE
// NaN. on_used_lse(b, i, r, h) is called for each gathered LSE entry: row i
// of sequence b, packed row r, head h. Call it under ASSERT_NO_FATAL_FAILURE.
struct PackedForwardRows {
  std::vector<uint16_t> o;
  std::vector<float> ref, low, lse, ref_lse;
};
template <class OnUsedLse>
void gather_packed_rows(PackedBatch const& packed, int heads_q, size_t row_elems, std::vector<uint16_t> const& h_o,
                        std::vector<float> const& h_ref, std::vector<float> const& h_low,
                        std::vector<float> const& h_lse, std::vector<float> const& h_ref_lse, PackedForwardRows& out,
                        OnUsedLse on_used_lse) {
  int const batch = packed.batch(), pad = packed.seqused ? PackedBatch::kSequsedPad : 0;
  for (int b = 0; b <= batch; ++b) {
    int const first = packed.cu_q[b], rows = b < batch ? packed.len_q[b] + pad : packed.total_q - first;
    for (int i = 0; i < rows; ++i) {
      size_t const r = size_t(first + i);
      bool const used = b < batch && i < packed.len_q[b];
      for (size_t e = r * row_elems; e < (r + 1) * row_elems; ++e) {
        if (used) {
          out.o.push_back(h_o[e]);
          out.ref.push_back(h_ref[e]);
          out.low.push_back(h_low[e]);
        } else {
          ASSERT_EQ(h_o[e], 0xffff) << "O row " << r << " written, past its sequence's used rows";
        }
      }
      for (int h = 0; h < heads_q; ++h) {
        size_t const l = size_t(h) * packed.total_q + r;
        if (used) {
          out.lse.push_back(h_lse[l]);
          out.ref_lse.push_back(h_ref_lse[l]);
          on_used_lse(b, i, r, h);
        } else {
          ASSERT_TRUE(std::isnan(h_lse[l])) << "LSE row " << r << " written, past its sequence's used rows";
        }
      }
    }
  }
}

}  // namespace flash3::testing
