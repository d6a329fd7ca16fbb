// The GPU reference against the float64 CPU reference, on the same (rounded)
// inputs. Tests that need a device skip, with the reason, when there is none.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iomanip>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "gpu_test_util.h"
#include "reference.h"

namespace {

using flash3::testing::DeviceBuffer;
using flash3::testing::from_bits;
using flash3::testing::to_bits;

using flash3::DType;
using flash3::reference::AttentionShape;
using flash3::reference::attention_cpu;
using flash3::reference::attention_gpu;

// The spacing of the format at 1.0.
double ulp_at_one(DType dt) { return dt == DType::kBF16 ? 0x1p-7 : 0x1p-10; }

// n inputs uniform in [-1, 1) as dtype's bits, and the values those bits hold.
struct RandomInputs {
  std::vector<uint16_t> bits;
  std::vector<double> vals;
};
RandomInputs random_inputs(size_t n, DType dtype, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  RandomInputs r{std::vector<uint16_t>(n), std::vector<double>(n)};
  for (size_t i = 0; i < n; ++i) {
    r.bits[i] = to_bits(dist(rng), dtype);
    r.vals[i] = from_bits(r.bits[i], dtype);
  }
  return r;
}

// A sink per query head, uniform in [-2, 2), as float and double.
void random_sinks(int64_t heads, std::mt19937& rng, std::vector<float>& sinks, std::vector<double>& sinks64) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  sinks.resize(heads);
  sinks64.resize(heads);
  for (int64_t h = 0; h < heads; ++h) sinks64[h] = sinks[h] = 2.0f * dist(rng);
}

enum class Layout {
  kDense,   // each tensor contiguous
  kPadded,  // gaps between heads, rows and batches (filled with NaN)
  kPacked,  // Q, K, V heads interleaved in one [b, s, hq + 2 hkv, d] buffer
};

struct Case {
  const char* name;
  DType dtype;
  AttentionShape shape;
  Layout layout;
};

struct Strides {
  int64_t batch, seq, head;
};

// Writes a dense [batch, seqlen, heads, d] tensor into buf at offset with the
// given strides.
void scatter(std::vector<uint16_t>& buf, int64_t offset, Strides st, const std::vector<uint16_t>& dense,
             int64_t batch, int64_t seqlen, int64_t heads, int64_t d) {
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < seqlen; ++i)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t c = 0; c < d; ++c)
          buf[offset + b * st.batch + i * st.seq + h * st.head + c] = dense[((b * seqlen + i) * heads + h) * d + c];
}

class ReferenceGpuVsCpu : public ::testing::TestWithParam<Case> {};

TEST_P(ReferenceGpuVsCpu, Matches) {
  SKIP_WITHOUT_CUDA_DEVICE();
  const Case& c = GetParam();
  const AttentionShape& s = c.shape;
  const int64_t d = s.head_dim;
  const int64_t nq = s.batch * s.seqlen_q * s.heads_q * d, nk = s.batch * s.seqlen_k * s.heads_kv * d;
  const int64_t n_lse = s.batch * s.heads_q * s.seqlen_q;

  // Random inputs in [-1, 1], rounded to the dtype; the CPU sees the rounded values.
  std::mt19937 rng(1234);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<uint16_t> q_bits(nq), k_bits(nk), v_bits(nk);
  std::vector<double> q(nq), k(nk), v(nk);
  for (auto [bits, vals] : {std::make_pair(&q_bits, &q), std::make_pair(&k_bits, &k), std::make_pair(&v_bits, &v)}) {
    for (size_t i = 0; i < bits->size(); ++i) {
      (*bits)[i] = to_bits(dist(rng), c.dtype);
      (*vals)[i] = from_bits((*bits)[i], c.dtype);
    }
  }

  Strides q_strides, kv_strides;
  int64_t q_off = 0, k_off, v_off, total;
  if (c.layout == Layout::kPacked) {
    ASSERT_EQ(s.seqlen_q, s.seqlen_k);
    const int64_t heads = s.heads_q + 2 * s.heads_kv;
    q_strides = kv_strides = {s.seqlen_q * heads * d, heads * d, d};
    k_off = s.heads_q * d;
    v_off = (s.heads_q + s.heads_kv) * d;
    total = s.batch * s.seqlen_q * heads * d;
  } else if (c.layout == Layout::kPadded) {
    // Odd paddings, so no stride is a multiple of another by accident.
    auto padded = [&](int64_t seqlen, int64_t heads) {
      const int64_t head = d + 3, seq = heads * head + 5;
      return Strides{seqlen * seq + 7, seq, head};
    };
    q_strides = padded(s.seqlen_q, s.heads_q);
    kv_strides = padded(s.seqlen_k, s.heads_kv);
    k_off = s.batch * q_strides.batch;
    v_off = k_off + s.batch * kv_strides.batch;
    total = v_off + s.batch * kv_strides.batch;
  } else {
    q_strides = {s.seqlen_q * s.heads_q * d, s.heads_q * d, d};
    kv_strides = {s.seqlen_k * s.heads_kv * d, s.heads_kv * d, d};
    k_off = nq;
    v_off = nq + nk;
    total = nq + 2 * nk;
  }
  // Any element the kernel reads that is not part of a tensor is a NaN.
  std::vector<uint16_t> host(total, c.dtype == DType::kBF16 ? 0x7fc0 : 0x7e00);
  scatter(host, q_off, q_strides, q_bits, s.batch, s.seqlen_q, s.heads_q, d);
  scatter(host, k_off, kv_strides, k_bits, s.batch, s.seqlen_k, s.heads_kv, d);
  scatter(host, v_off, kv_strides, v_bits, s.batch, s.seqlen_k, s.heads_kv, d);

  DeviceBuffer<uint16_t> storage(total);
  DeviceBuffer<float> o32(nq), o_low(nq), lse32(n_lse), lse_low(n_lse);
  CUDA_OK(cudaMemcpy(storage.ptr, host.data(), total * sizeof(uint16_t), cudaMemcpyHostToDevice));
  auto tensor = [&](int64_t offset, Strides st) {
    return flash3::ConstTensor{storage.ptr + offset, st.batch, st.seq, st.head, 1};
  };
  const flash3::ConstTensor tq = tensor(q_off, q_strides);
  const flash3::ConstTensor tk = tensor(k_off, kv_strides), tv = tensor(v_off, kv_strides);
  // Poison the outputs: an element the kernel does not write reads back as NaN.
  for (float* p : {o32.ptr, o_low.ptr}) CUDA_OK(cudaMemset(p, 0xff, nq * sizeof(float)));
  for (float* p : {lse32.ptr, lse_low.ptr}) CUDA_OK(cudaMemset(p, 0xff, n_lse * sizeof(float)));

  cudaStream_t stream;
  CUDA_OK(cudaStreamCreate(&stream));
  const cudaError_t err32 = attention_gpu(s, c.dtype, tq, tk, tv, o32.ptr, lse32.ptr, false, stream);
  const cudaError_t err_low = attention_gpu(s, c.dtype, tq, tk, tv, o_low.ptr, lse_low.ptr, true, stream);
  const cudaError_t err_sync = cudaStreamSynchronize(stream);
  cudaStreamDestroy(stream);
  CUDA_OK(err32);
  CUDA_OK(err_low);
  CUDA_OK(err_sync);

  std::vector<float> h_o32(nq), h_o_low(nq), h_lse32(n_lse), h_lse_low(n_lse);
  CUDA_OK(cudaMemcpy(h_o32.data(), o32.ptr, nq * sizeof(float), cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(h_o_low.data(), o_low.ptr, nq * sizeof(float), cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(h_lse32.data(), lse32.ptr, n_lse * sizeof(float), cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(h_lse_low.data(), lse_low.ptr, n_lse * sizeof(float), cudaMemcpyDeviceToHost));

  std::vector<double> ref_o(nq), ref_lse(n_lse);
  attention_cpu(s, q.data(), k.data(), v.data(), ref_o.data(), ref_lse.data());

  // Float32 mode: float32 rounding only. Emulated mode: a few ulps of the
  // dtype (inputs and outputs are within [-1, 1]), and every output exactly
  // representable in the dtype.
  const double low_tol = 2 * ulp_at_one(c.dtype);
  double err_o32 = 0, err_o_low = 0, err_lse32 = 0, err_lse_low = 0;
  for (int64_t i = 0; i < nq; ++i) {
    ASSERT_TRUE(std::isfinite(h_o32[i]) && std::isfinite(h_o_low[i])) << "O[" << i << "] not written";
    ASSERT_EQ(h_o_low[i], from_bits(to_bits(h_o_low[i], c.dtype), c.dtype)) << "emulated O[" << i << "] not rounded";
    err_o32 = std::max(err_o32, std::fabs(h_o32[i] - ref_o[i]));
    err_o_low = std::max(err_o_low, std::fabs(h_o_low[i] - ref_o[i]));
  }
  for (int64_t i = 0; i < n_lse; ++i) {
    if (std::isinf(ref_lse[i])) {
      ASSERT_EQ(h_lse32[i], INFINITY) << "LSE[" << i << "] of a row that sees no key";
      ASSERT_EQ(h_lse_low[i], INFINITY) << "LSE[" << i << "] of a row that sees no key";
      continue;
    }
    ASSERT_TRUE(std::isfinite(h_lse32[i]) && std::isfinite(h_lse_low[i])) << "LSE[" << i << "]";
    err_lse32 = std::max(err_lse32, std::fabs(h_lse32[i] - ref_lse[i]));
    err_lse_low = std::max(err_lse_low, std::fabs(h_lse_low[i] - ref_lse[i]) / std::max(1.0, std::fabs(ref_lse[i])));
  }
  // The measured errors, for the XML report (--gtest_output=xml).
  auto record = [](const char* key, double x) {
    std::ostringstream text;
    text << std::scientific << std::setprecision(3) << x;
    RecordProperty(key, text.str());
  };
  record("max_err_o_fp32", err_o32);
  record("max_err_o_emulated", err_o_low);
  record("max_err_lse_fp32", err_lse32);
  record("max_rel_err_lse_emulated", err_lse_low);
  EXPECT_LT(err_o32, 1e-4);
  EXPECT_LT(err_lse32, 1e-4);
  EXPECT_LE(err_o_low, low_tol);
  EXPECT_LE(err_lse_low, low_tol);
}

constexpr DType kBF16 = DType::kBF16;
constexpr DType kFP16 = DType::kFP16;

// AttentionShape: batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, scale, causal.
const Case kCases[] = {
    {"bf16_mha_7x7_d64", kBF16, {2, 7, 7, 2, 2, 64, 0.0f, false}, Layout::kDense},
    {"bf16_mqa_causal_113_d128_padded", kBF16, {1, 113, 113, 4, 1, 128, 0.0f, true}, Layout::kPadded},
    {"fp16_causal_q1_k113_d64", kFP16, {2, 1, 113, 3, 3, 64, 0.0f, true}, Layout::kDense},
    {"fp16_gqa_causal_q113_k7_d96_padded", kFP16, {1, 113, 7, 4, 2, 96, 0.0f, true}, Layout::kPadded},
    {"bf16_causal_33_d128_packed", kBF16, {2, 33, 33, 2, 2, 128, 0.0f, true}, Layout::kPacked},
    {"fp16_gqa_causal_64_d192_packed", kFP16, {2, 64, 64, 8, 2, 192, 0.0f, true}, Layout::kPacked},
    {"fp16_q7_k1_d256_padded", kFP16, {1, 7, 1, 2, 1, 256, 0.0f, false}, Layout::kPadded},
    {"bf16_1x1_d40", kBF16, {1, 1, 1, 1, 1, 40, 0.0f, false}, Layout::kDense},
    {"fp16_causal_q17_k65_d3_padded", kFP16, {1, 17, 65, 2, 2, 3, 0.0f, true}, Layout::kPadded},
    {"bf16_no_keys", kBF16, {2, 5, 0, 2, 2, 64, 0.0f, false}, Layout::kDense},
    {"bf16_causal_q300_k500_scale03", kBF16, {1, 300, 500, 2, 2, 64, 0.3f, true}, Layout::kDense},
    {"fp16_q113_k300_d128", kFP16, {1, 113, 300, 2, 1, 128, 0.0f, false}, Layout::kPadded},
};

INSTANTIATE_TEST_SUITE_P(Shapes, ReferenceGpuVsCpu, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

// The GPU backward reference against the float64 CPU one, on the same
// (rounded) inputs and a strided dO.
TEST(ReferenceGpuBackward, MatchesCpu) {
  SKIP_WITHOUT_CUDA_DEVICE();
  // AttentionShape: batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, scale, causal.
  const std::pair<DType, AttentionShape> cases[] = {
      {DType::kBF16, {2, 7, 7, 2, 2, 64, 0.0f, false}},   {DType::kFP16, {1, 113, 200, 4, 1, 128, 0.0f, true}},
      {DType::kBF16, {1, 150, 40, 4, 2, 96, 0.5f, true}},  {DType::kFP16, {2, 1, 300, 2, 2, 40, 0.0f, true}},
      {DType::kBF16, {1, 5, 0, 2, 2, 64, 0.0f, false}},   {DType::kFP16, {1, 260, 260, 2, 2, 256, 0.0f, false}},
  };
  for (const auto& [dtype, s] : cases) {
    SCOPED_TRACE(std::to_string(s.seqlen_q) + "x" + std::to_string(s.seqlen_k) + " d" + std::to_string(s.head_dim));
    const int64_t d = s.head_dim;
    const int64_t nq = s.batch * s.seqlen_q * s.heads_q * d, nk = s.batch * s.seqlen_k * s.heads_kv * d;
    std::mt19937 rng(99);
    auto const [bits, vals] = random_inputs(2 * nq + 2 * nk, dtype, rng);
    // Layout in one buffer: Q, K, V, dO, each dense.
    DeviceBuffer<uint16_t> in(bits.size());
    DeviceBuffer<float> out32(nq + 2 * nk), out_low(nq + 2 * nk);
    if (!bits.empty()) {
      CUDA_OK(cudaMemcpy(in.ptr, bits.data(), bits.size() * 2, cudaMemcpyHostToDevice));
    }
    auto tensor = [&](int64_t offset, int64_t seqlen, int64_t heads) {
      return flash3::contiguous<const void*>(in.ptr + offset, seqlen, heads, d);
    };
    const auto tq = tensor(0, s.seqlen_q, s.heads_q), tk = tensor(nq, s.seqlen_k, s.heads_kv),
               tv = tensor(nq + nk, s.seqlen_k, s.heads_kv), tdo = tensor(nq + 2 * nk, s.seqlen_q, s.heads_q);
    for (float* p : {out32.ptr, out_low.ptr}) {
      if (p) CUDA_OK(cudaMemset(p, 0xff, (nq + 2 * nk) * sizeof(float)));
    }
    CUDA_OK(flash3::reference::attention_backward_gpu(s, dtype, tq, tk, tv, tdo, out32.ptr, out32.ptr + nq,
                                                      out32.ptr + nq + nk, false, nullptr));
    CUDA_OK(flash3::reference::attention_backward_gpu(s, dtype, tq, tk, tv, tdo, out_low.ptr, out_low.ptr + nq,
                                                      out_low.ptr + nq + nk, true, nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<float> h32(nq + 2 * nk), hlow(nq + 2 * nk);
    if (!h32.empty()) {
      CUDA_OK(cudaMemcpy(h32.data(), out32.ptr, h32.size() * 4, cudaMemcpyDeviceToHost));
      CUDA_OK(cudaMemcpy(hlow.data(), out_low.ptr, hlow.size() * 4, cudaMemcpyDeviceToHost));
    }
    std::vector<double> ref(nq + 2 * nk);
    flash3::reference::attention_backward_cpu(s, vals.data(), vals.data() + nq, vals.data() + nq + nk,
                                              vals.data() + nq + 2 * nk, ref.data(), ref.data() + nq,
                                              ref.data() + nq + nk);
    double ref_max = 0, err32 = 0, err_low = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      ASSERT_TRUE(std::isfinite(h32[i]) && std::isfinite(hlow[i])) << "gradient element " << i << " not written";
      ref_max = std::max(ref_max, std::fabs(ref[i]));
      err32 = std::max(err32, std::fabs(h32[i] - ref[i]));
      err_low = std::max(err_low, std::fabs(hlow[i] - ref[i]));
    }
    EXPECT_LE(err32, 1e-4 * std::max(1.0, ref_max));
    EXPECT_LE(err_low, 0.05 * std::max(1.0, ref_max));  // dtype rounding of P, dP, dS: coarse but bounded
  }
}

// Sinks and softcapping in both GPU references against the float64 CPU ones
// (float32 mode): O, LSE, the gradients and the sinks' own, rows that see no
// key included. Softcapping with scale 2 (scores of a few units) and caps
// that bend them.
TEST(ReferenceGpu, SinksAndSoftcapMatchCpu) {
  SKIP_WITHOUT_CUDA_DEVICE();
  auto capped = [](AttentionShape s, double softcap) {
    s.softcap = softcap;
    return s;
  };
  // AttentionShape: batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, scale, causal.
  const std::tuple<DType, AttentionShape, bool> cases[] = {
      {DType::kBF16, {2, 70, 70, 4, 2, 64, 0.0f, false}, true},
      {DType::kFP16, {1, 150, 40, 4, 1, 128, 0.0f, true}, true},  // 110 rows see no key
      {DType::kBF16, {1, 5, 0, 2, 2, 64, 0.0f, false}, true},     // no key at all
      {DType::kBF16, capped({2, 70, 90, 4, 2, 64, 2.0f, false}, 1.0), false},
      {DType::kFP16, capped({1, 150, 40, 4, 1, 128, 2.0f, true}, 1.5), true},
  };
  for (const auto& [dtype, s, with_sinks] : cases) {
    SCOPED_TRACE(std::to_string(s.seqlen_q) + "x" + std::to_string(s.seqlen_k) + " d" + std::to_string(s.head_dim) +
                 " softcap " + std::to_string(s.softcap) + (with_sinks ? " sinks" : ""));
    const int64_t d = s.head_dim;
    const int64_t nq = s.batch * s.seqlen_q * s.heads_q * d, nk = s.batch * s.seqlen_k * s.heads_kv * d;
    const int64_t n_lse = s.batch * s.heads_q * s.seqlen_q;
    std::mt19937 rng(11);
    auto const [bits, vals] = random_inputs(2 * nq + 2 * nk, dtype, rng);  // Q, K, V, dO
    std::vector<float> sinks;
    std::vector<double> sinks64;
    random_sinks(s.heads_q, rng, sinks, sinks64);
    DeviceBuffer<uint16_t> in(bits.size());
    DeviceBuffer<float> d_sinks(s.heads_q), d_dsinks(s.heads_q), o(nq), lse(n_lse), grads(nq + 2 * nk);
    CUDA_OK(cudaMemcpy(in.ptr, bits.data(), bits.size() * 2, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d_sinks.ptr, sinks.data(), s.heads_q * 4, cudaMemcpyHostToDevice));
    auto tensor = [&](int64_t offset, int64_t seqlen, int64_t heads) {
      return flash3::contiguous<const void*>(in.ptr + offset, seqlen, heads, d);
    };
    const auto tq = tensor(0, s.seqlen_q, s.heads_q), tk = tensor(nq, s.seqlen_k, s.heads_kv),
               tv = tensor(nq + nk, s.seqlen_k, s.heads_kv), tdo = tensor(nq + 2 * nk, s.seqlen_q, s.heads_q);
    float const* gpu_sinks = with_sinks ? d_sinks.ptr : nullptr;
    CUDA_OK(attention_gpu(s, dtype, tq, tk, tv, o.ptr, lse.ptr, false, nullptr, gpu_sinks));
    float* g = grads.ptr;
    CUDA_OK(flash3::reference::attention_backward_gpu(s, dtype, tq, tk, tv, tdo, g, g + nq, g + nq + nk, false,
                                                      nullptr, nullptr, gpu_sinks,
                                                      with_sinks ? d_dsinks.ptr : nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<float> h_o(nq), h_lse(n_lse), h_grads(nq + 2 * nk), h_dsinks(s.heads_q);
    CUDA_OK(cudaMemcpy(h_o.data(), o.ptr, nq * 4, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(h_lse.data(), lse.ptr, n_lse * 4, cudaMemcpyDeviceToHost));
    if (!h_grads.empty()) CUDA_OK(cudaMemcpy(h_grads.data(), g, h_grads.size() * 4, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(h_dsinks.data(), d_dsinks.ptr, s.heads_q * 4, cudaMemcpyDeviceToHost));

    std::vector<double> ref_o(nq), ref_lse(n_lse), ref_grads(nq + 2 * nk), ref_dsinks(s.heads_q);
    const double* q = vals.data();
    double const* cpu_sinks = with_sinks ? sinks64.data() : nullptr;
    attention_cpu(s, q, q + nq, q + nq + nk, ref_o.data(), ref_lse.data(), cpu_sinks);
    flash3::reference::attention_backward_cpu(s, q, q + nq, q + nq + nk, q + nq + 2 * nk, ref_grads.data(),
                                              ref_grads.data() + nq, ref_grads.data() + nq + nk, cpu_sinks,
                                              with_sinks ? ref_dsinks.data() : nullptr);
    auto max_err = [](const float* got, const double* ref, size_t n, double& ref_max) {
      double err = 0;
      for (size_t i = 0; i < n; ++i) {
        err = std::max(err, std::fabs(got[i] - ref[i]));
        ref_max = std::max(ref_max, std::fabs(ref[i]));
      }
      return err;
    };
    double o_max = 0, lse_max = 0, grad_max = 0, dsink_max = 0;
    EXPECT_LT(max_err(h_o.data(), ref_o.data(), nq, o_max), 1e-4);
    EXPECT_LT(max_err(h_lse.data(), ref_lse.data(), n_lse, lse_max), 1e-4 * std::max(1.0, lse_max));
    EXPECT_LE(max_err(h_grads.data(), ref_grads.data(), h_grads.size(), grad_max), 1e-4 * std::max(1.0, grad_max));
    if (with_sinks) {
      EXPECT_LE(max_err(h_dsinks.data(), ref_dsinks.data(), s.heads_q, dsink_max), 1e-4 * std::max(1.0, dsink_max));
    }
  }
}

// V's head dim of its own in both GPU references against the float64 CPU
// ones (float32 mode): O, LSE and the gradients, GQA, the causal mask, a
// window, softcapping and sinks; V narrower than Q/K (192 / 128, DeepSeek's)
// and wider (40 / 72), so that neither dim bounds the other's loops.
TEST(ReferenceGpu, ValueHeadDimOfItsOwnMatchesCpu) {
  SKIP_WITHOUT_CUDA_DEVICE();
  auto with = [](AttentionShape s, int64_t head_dim_v, int64_t window_left, double softcap) {
    s.head_dim_v = head_dim_v;
    s.window_left = window_left;
    s.softcap = softcap;
    return s;
  };
  // AttentionShape: batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, scale, causal.
  const std::tuple<DType, AttentionShape, bool> cases[] = {
      {DType::kBF16, with({2, 70, 90, 4, 2, 192, 0.0f, false}, 128, -1, 0.0), false},
      {DType::kFP16, with({1, 150, 40, 4, 1, 192, 0.0f, true}, 128, -1, 0.0), true},  // 110 rows see no key
      {DType::kBF16, with({1, 90, 90, 2, 2, 192, 2.0f, true}, 128, 20, 1.5), true},
      {DType::kFP16, with({2, 33, 50, 2, 1, 40, 0.0f, false}, 72, 10, 0.0), false},
  };
  for (const auto& [dtype, s, with_sinks] : cases) {
    SCOPED_TRACE(std::to_string(s.seqlen_q) + "x" + std::to_string(s.seqlen_k) + " d" + std::to_string(s.head_dim) +
                 " dv" + std::to_string(s.head_dim_v) + (s.causal ? " causal" : "") + (with_sinks ? " sinks" : ""));
    const int64_t d = s.head_dim, dv = s.head_dim_v;
    const int64_t nq = s.batch * s.seqlen_q * s.heads_q * d, nk = s.batch * s.seqlen_k * s.heads_kv * d;
    const int64_t nv = s.batch * s.seqlen_k * s.heads_kv * dv, no = s.batch * s.seqlen_q * s.heads_q * dv;
    const int64_t n_lse = s.batch * s.heads_q * s.seqlen_q, n_grads = nq + nk + nv;
    std::mt19937 rng(13);
    auto const [bits, vals] = random_inputs(nq + nk + nv + no, dtype, rng);  // Q, K, V, dO
    std::vector<float> sinks;
    std::vector<double> sinks64;
    random_sinks(s.heads_q, rng, sinks, sinks64);
    DeviceBuffer<uint16_t> in(bits.size());
    DeviceBuffer<float> d_sinks(s.heads_q), o(no), lse(n_lse), grads(n_grads);
    CUDA_OK(cudaMemcpy(in.ptr, bits.data(), bits.size() * 2, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d_sinks.ptr, sinks.data(), s.heads_q * 4, cudaMemcpyHostToDevice));
    for (float* p : {o.ptr, grads.ptr}) CUDA_OK(cudaMemset(p, 0xff, (p == o.ptr ? no : n_grads) * sizeof(float)));
    auto tensor = [&](int64_t offset, int64_t seqlen, int64_t heads, int64_t dim) {
      return flash3::contiguous<const void*>(in.ptr + offset, seqlen, heads, dim);
    };
    const auto tq = tensor(0, s.seqlen_q, s.heads_q, d), tk = tensor(nq, s.seqlen_k, s.heads_kv, d),
               tv = tensor(nq + nk, s.seqlen_k, s.heads_kv, dv), tdo = tensor(nq + nk + nv, s.seqlen_q, s.heads_q, dv);
    float const* gpu_sinks = with_sinks ? d_sinks.ptr : nullptr;
    CUDA_OK(attention_gpu(s, dtype, tq, tk, tv, o.ptr, lse.ptr, false, nullptr, gpu_sinks));
    float* g = grads.ptr;
    CUDA_OK(flash3::reference::attention_backward_gpu(s, dtype, tq, tk, tv, tdo, g, g + nq, g + nq + nk, false,
                                                      nullptr, nullptr, gpu_sinks));
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<float> h_o(no), h_lse(n_lse), h_grads(n_grads);
    CUDA_OK(cudaMemcpy(h_o.data(), o.ptr, no * 4, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(h_lse.data(), lse.ptr, n_lse * 4, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(h_grads.data(), g, n_grads * 4, cudaMemcpyDeviceToHost));

    std::vector<double> ref_o(no), ref_lse(n_lse), ref_grads(n_grads);
    const double* q = vals.data();
    double const* cpu_sinks = with_sinks ? sinks64.data() : nullptr;
    attention_cpu(s, q, q + nq, q + nq + nk, ref_o.data(), ref_lse.data(), cpu_sinks);
    flash3::reference::attention_backward_cpu(s, q, q + nq, q + nq + nk, q + nq + nk + nv, ref_grads.data(),
                                              ref_grads.data() + nq, ref_grads.data() + nq + nk, cpu_sinks);
    auto max_err = [](const float* got, const double* ref, size_t n, double& ref_max) {
      double err = 0;
      for (size_t i = 0; i < n; ++i) {
        if (!std::isfinite(got[i]) && !(std::isinf(got[i]) && got[i] == ref[i])) return double(INFINITY);
        err = std::max(err, std::fabs(got[i] - ref[i]));
        ref_max = std::max(ref_max, std::fabs(ref[i]));
      }
      return err;
    };
    double o_max = 0, lse_max = 0, grad_max = 0;
    EXPECT_LT(max_err(h_o.data(), ref_o.data(), no, o_max), 1e-4);
    for (int64_t i = 0; i < n_lse; ++i) {
      if (std::isinf(ref_lse[i])) {
        EXPECT_EQ(h_lse[i], ref_lse[i]) << "LSE[" << i << "]";
        h_lse[i] = 0.f;
        ref_lse[i] = 0.0;
      }
    }
    EXPECT_LT(max_err(h_lse.data(), ref_lse.data(), n_lse, lse_max), 1e-4 * std::max(1.0, lse_max));
    EXPECT_LE(max_err(h_grads.data(), ref_grads.data(), n_grads, grad_max), 1e-4 * std::max(1.0, grad_max));
  }
}

// D from a given output O: with one key O = V_0 and the exact dQ and dK are 0,
// which D = rowsum(dO o O) gives up to float32's rounding; with 37 keys a
// random O moves them; dV does not involve D, so any O leaves it bitwise
// unchanged. An O the reference cannot read is refused.
TEST(ReferenceGpuBackward, DFromAGivenOutput) {
  SKIP_WITHOUT_CUDA_DEVICE();
  for (const int64_t keys : {1, 37}) {
    SCOPED_TRACE(keys);
    // AttentionShape: batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, scale, causal.
    const AttentionShape s{1, 50, keys, 2, 2, 64, 0.0f, false};
    const int64_t d = s.head_dim, nq = s.seqlen_q * s.heads_q * d, nk = keys * s.heads_kv * d;
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::vector<uint16_t> bits(3 * nq + 2 * nk);  // Q, K, V, dO, O
    for (uint16_t& b : bits) b = to_bits(dist(rng), DType::kBF16);
    if (keys == 1) {  // O_i = V_0 for every query row
      for (int64_t i = 0; i < s.seqlen_q; ++i) {
        std::copy_n(bits.begin() + nq + nk, s.heads_q * d, bits.begin() + 2 * nq + 2 * nk + i * s.heads_q * d);
      }
    }
    DeviceBuffer<uint16_t> in(bits.size());
    DeviceBuffer<float> plain(nq + 2 * nk), given(nq + 2 * nk);
    CUDA_OK(cudaMemcpy(in.ptr, bits.data(), bits.size() * 2, cudaMemcpyHostToDevice));
    auto tensor = [&](int64_t offset, int64_t seqlen, int64_t heads) {
      return flash3::contiguous<const void*>(in.ptr + offset, seqlen, heads, d);
    };
    const auto tq = tensor(0, s.seqlen_q, s.heads_q), tk = tensor(nq, keys, s.heads_kv),
               tv = tensor(nq + nk, keys, s.heads_kv), tdo = tensor(nq + 2 * nk, s.seqlen_q, s.heads_q),
               to = tensor(2 * nq + 2 * nk, s.seqlen_q, s.heads_q);
    CUDA_OK(flash3::reference::attention_backward_gpu(s, DType::kBF16, tq, tk, tv, tdo, plain.ptr, plain.ptr + nq,
                                                      plain.ptr + nq + nk, false, nullptr));
    CUDA_OK(flash3::reference::attention_backward_gpu(s, DType::kBF16, tq, tk, tv, tdo, given.ptr, given.ptr + nq,
                                                      given.ptr + nq + nk, false, nullptr, &to));
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<float> hp(nq + 2 * nk), hg(nq + 2 * nk);
    CUDA_OK(cudaMemcpy(hp.data(), plain.ptr, hp.size() * 4, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(hg.data(), given.ptr, hg.size() * 4, cudaMemcpyDeviceToHost));
    for (int64_t i = nq + nk; i < nq + 2 * nk; ++i) ASSERT_EQ(hg[i], hp[i]) << "dV[" << i - nq - nk << "]";
    if (keys == 1) {
      for (int64_t i = 0; i < nq + nk; ++i) EXPECT_LE(std::fabs(hg[i]), 5e-5) << "dQ, dK element " << i;
    } else {
      // A random O is far from the true one (a mean of V's rows): D, and so
      // dQ and dK, must move by much more than rounding, or O was not used.
      double moved = 0;
      for (int64_t i = 0; i < nq + nk; ++i) moved = std::max(moved, double(std::fabs(hg[i] - hp[i])));
      EXPECT_GT(moved, 1e-2);
    }
    flash3::ConstTensor strided = to;
    strided.dim_stride = 2;
    EXPECT_EQ(flash3::reference::attention_backward_gpu(s, DType::kBF16, tq, tk, tv, tdo, given.ptr, given.ptr + nq,
                                                        given.ptr + nq + nk, false, nullptr, &strided),
              cudaErrorInvalidValue);
  }
}

// One row whose rounding is worked out by hand in bf16, with each rounding
// step visible in the result. S = q.k = (0, 0, 1 + 101/1024) rounds to
// (0, 0, 1 + 13/128); P = softmax(S) rounds to bf16; with V = (3, 0, -1)
// O = 3 P0 - P2 nearly cancels, so P's rounding shows up in O.
TEST(ReferenceGpu, EmulationRoundsScoresAndProbabilities) {
  SKIP_WITHOUT_CUDA_DEVICE();
  const float q[2] = {1.0f, 1.0f};
  const float k[3][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}, {1.0f, 101.0f / 1024}};
  const float v[3][2] = {{3.0f, 3.0f}, {0.0f, 0.0f}, {-1.0f, -1.0f}};

  auto round_bf16 = [](float x) { return flash3::reference::bf16_to_float(flash3::reference::float_to_bf16(x)); };
  // The emulated pipeline for this row, on the host.
  auto model = [&](bool round_scores, bool round_probs) {
    float scores[3], m = -INFINITY;
    for (int j = 0; j < 3; ++j) {
      scores[j] = q[0] * k[j][0] + q[1] * k[j][1];
      if (round_scores) scores[j] = round_bf16(scores[j]);
      m = std::max(m, scores[j]);
    }
    float l = 0;
    for (float x : scores) l += std::exp(x - m);
    float o = 0;
    for (int j = 0; j < 3; ++j) {
      float p = std::exp(scores[j] - m) / l;
      if (round_probs) p = round_bf16(p);
      o += p * v[j][0];
    }
    return round_bf16(o);
  };
  const float want = model(true, true);
  ASSERT_GT(std::fabs(want - model(false, true)), 1e-4f) << "the case no longer shows S's rounding";
  ASSERT_GT(std::fabs(want - model(true, false)), 1e-4f) << "the case no longer shows P's rounding";

  // Q, K, V back to back, each exact in bf16.
  std::vector<uint16_t> host;
  std::vector<float> values(q, q + 2);
  for (auto& row : k) values.insert(values.end(), row, row + 2);
  for (auto& row : v) values.insert(values.end(), row, row + 2);
  for (float x : values) {
    host.push_back(flash3::reference::float_to_bf16(x));
    ASSERT_EQ(flash3::reference::bf16_to_float(host.back()), x) << "input not exact in bf16";
  }

  DeviceBuffer<uint16_t> in(host.size());
  DeviceBuffer<float> o(2);
  CUDA_OK(cudaMemcpy(in.ptr, host.data(), host.size() * sizeof(uint16_t), cudaMemcpyHostToDevice));
  const AttentionShape s{1, 1, 3, 1, 1, 2, 1.0f, false};
  CUDA_OK(attention_gpu(s, DType::kBF16, flash3::contiguous<const void*>(in.ptr, 1, 1, 2),
                        flash3::contiguous<const void*>(in.ptr + 2, 3, 1, 2),
                        flash3::contiguous<const void*>(in.ptr + 8, 3, 1, 2), o.ptr, nullptr, true, nullptr));
  float got[2];
  CUDA_OK(cudaMemcpy(got, o.ptr, sizeof got, cudaMemcpyDeviceToHost));
  EXPECT_NEAR(got[0], want, 1e-6f);
  EXPECT_NEAR(got[1], want, 1e-6f);
}

// O of the FP8 reference under `emulation` for one head: e4m3 Q [seqlen_q, d]
// and K, V [seqlen_k, d] from the host, one per-tensor descale for all three.
// The output is poisoned first: an element left unwritten reads back as NaN.
void fp8_reference_o(int64_t seqlen_q, int64_t seqlen_k, int64_t d, std::vector<uint8_t> const& hq,
                     std::vector<uint8_t> const& hk, std::vector<uint8_t> const& hv, float descale,
                     flash3::reference::Fp8Emulation emulation, std::vector<float>& out) {
  const size_t nq = size_t(seqlen_q * d), nk = size_t(seqlen_k * d);
  DeviceBuffer<uint8_t> q(nq), k(nk), v(nk);
  DeviceBuffer<float> scales(1), o(nq);
  ASSERT_TRUE(q.ptr && k.ptr && v.ptr && scales.ptr && o.ptr);
  CUDA_OK(cudaMemcpy(q.ptr, hq.data(), nq, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(k.ptr, hk.data(), nk, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(v.ptr, hv.data(), nk, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(scales.ptr, &descale, sizeof descale, cudaMemcpyHostToDevice));
  const flash3::Fp8Scales fp8{flash3::ScaleGranularity::kPerTensor, scales.ptr, scales.ptr, scales.ptr, DType::kBF16};
  const AttentionShape shape{1, seqlen_q, seqlen_k, 1, 1, d, 0.f, false};
  CUDA_OK(cudaMemset(o.ptr, 0xff, nq * sizeof(float)));
  CUDA_OK(flash3::reference::attention_gpu_fp8(shape, flash3::contiguous<const void*>(q.ptr, seqlen_q, 1, d),
                                               flash3::contiguous<const void*>(k.ptr, seqlen_k, 1, d),
                                               flash3::contiguous<const void*>(v.ptr, seqlen_k, 1, d), fp8, o.ptr,
                                               nullptr, emulation, nullptr));
  out.resize(nq);
  CUDA_OK(cudaMemcpy(out.data(), o.ptr, nq * sizeof(float), cudaMemcpyDeviceToHost));
}

// The paper's FP8 baseline (Fp8Emulation::kStandard): S and the normalised P
// in fp16, P times 448 in e4m3. Together the roundings move a probability by
// at most 2^-4 of itself (e4m3's half spacing) plus a little (fp16's 2^-11, S's
// fp16 error through exp), so O stays within (2^-4 + 2^-7) max|v| (plus O's
// own rounding) of the float32 result; it must differ
// from that result, and from the fused kernel's rounding (unnormalised P in
// e4m3), or the baseline of the accuracy table would be a copy of another row.
TEST(ReferenceGpu, StandardFp8RoundsScoresAndNormalizedProbabilities) {
  SKIP_WITHOUT_CUDA_DEVICE();
  using flash3::reference::Fp8Emulation;
  const int64_t seqlen_q = 64, seqlen_k = 200, d = 64;
  const size_t nq = size_t(seqlen_q * d), nk = size_t(seqlen_k * d);
  std::mt19937 rng(31);
  std::normal_distribution<float> normal(0.f, 1.f);
  // e4m3 draws of 32 N(0, 1), descale 1/32: per-tensor quantization of N(0, 1).
  auto draw = [&](size_t n, float& max_abs) {
    std::vector<uint8_t> bytes(n);
    for (auto& b : bytes) {
      const __nv_fp8_e4m3 x(32.f * normal(rng));
      b = x.__x;
      max_abs = std::max(max_abs, std::fabs(float(x)) / 32.f);
    }
    return bytes;
  };
  float unused = 0.f, v_max = 0.f;
  const std::vector<uint8_t> hq = draw(nq, unused), hk = draw(nk, unused), hv = draw(nk, v_max);
  std::vector<float> h_none, h_fused, h_standard;
  for (auto [emulation, host] : {std::pair{Fp8Emulation::kNone, &h_none}, std::pair{Fp8Emulation::kFused, &h_fused},
                                 std::pair{Fp8Emulation::kStandard, &h_standard}}) {
    ASSERT_NO_FATAL_FAILURE(fp8_reference_o(seqlen_q, seqlen_k, d, hq, hk, hv, 1.f / 32.f, emulation, *host));
  }
  double moved = 0, apart = 0;
  for (size_t i = 0; i < nq; ++i) {
    ASSERT_TRUE(std::isfinite(h_standard[i])) << "O[" << i << "]";
    const double bound = (0x1p-4 + 0x1p-7) * v_max + 0x1p-8 * std::fabs(h_none[i]) + 1e-6;
    ASSERT_LE(std::fabs(h_standard[i] - h_none[i]), bound) << "O[" << i << "]";
    moved = std::max(moved, std::fabs(double(h_standard[i]) - h_none[i]));
    apart = std::max(apart, std::fabs(double(h_standard[i]) - h_fused[i]));
  }
  EXPECT_GT(moved, 1e-4) << "kStandard rounds nothing";
  EXPECT_GT(apart, 1e-4) << "kStandard rounds as kFused does";
}

// Fp8Emulation::kFused scales P by 2^8 before rounding it to e4m3, as the
// kernels do. One row whose probabilities, but for the maximum, all equal
// p = e^-5 = 0.0067: unscaled, p is an e4m3 subnormal and rounds to 3 * 2^-9
// (13% low); scaled, 256 p = 1.725 rounds to 1.75 (1.4% high). With V = 0 at
// the maximum's key and 1 elsewhere, O = n p' / (1 + n p) moves by that much.
TEST(ReferenceGpu, FusedFp8ScalesProbabilitiesBeforeRounding) {
  SKIP_WITHOUT_CUDA_DEVICE();
  using flash3::reference::Fp8Emulation;
  const int64_t seqlen_q = 4, seqlen_k = 200, d = 64;  // softmax scale 1/8
  const size_t nq = size_t(seqlen_q * d), nk = size_t(seqlen_k * d);
  const uint8_t zero = __nv_fp8_e4m3(0.f).__x, one = __nv_fp8_e4m3(1.f).__x;
  std::vector<uint8_t> hq(nq, zero), hk(nk, zero), hv(nk, one);
  for (int64_t i = 0; i < seqlen_q; ++i) hq[size_t(i * d)] = __nv_fp8_e4m3(4.f).__x;  // score 4 * 10 / 8 = 5 at key 0
  hk[0] = __nv_fp8_e4m3(10.f).__x;
  for (int64_t c = 0; c < d; ++c) hv[size_t(c)] = zero;
  std::vector<float> h_none, h_fused;
  ASSERT_NO_FATAL_FAILURE(fp8_reference_o(seqlen_q, seqlen_k, d, hq, hk, hv, 1.f, Fp8Emulation::kNone, h_none));
  ASSERT_NO_FATAL_FAILURE(fp8_reference_o(seqlen_q, seqlen_k, d, hq, hk, hv, 1.f, Fp8Emulation::kFused, h_fused));
  const double p = std::exp(-5.0), n = double(seqlen_k - 1);
  const double want = n * p / (1 + n * p);                   // 0.5728
  const double want_fused = n * (1.75 / 256) / (1 + n * p);  // 0.5812 (unscaled: 0.4981)
  for (size_t i = 0; i < nq; ++i) {
    ASSERT_NEAR(h_none[i], want, 1e-5) << "O[" << i << "]";
    // O's bf16 rounding: 2^-9 of it.
    ASSERT_NEAR(h_fused[i], want_fused, 0x1p-8 * want_fused) << "O[" << i << "]";
  }
}

__global__ void fill_random_bf16(__nv_bfloat16* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint64_t h = uint64_t(i) * 0x9e3779b97f4a7c15ull;
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 32;
    x[i] = __float2bfloat16_rn(float(h >> 40) * 0x1p-23f - 1.0f);  // uniform in [-1, 1)
  }
}

// Q and O with more than 2^31 elements: rows past that point must read and
// write the right addresses (32-bit index arithmetic would wrap).
TEST(ReferenceGpu, TensorsOverTwoPow31Elements) {
  SKIP_WITHOUT_CUDA_DEVICE();
  const int64_t d = 64, seqlen_q = (int64_t(1) << 25) + 40, seqlen_k = 3;
  const int64_t nq = seqlen_q * d;
  static_assert(sizeof(uint16_t) == sizeof(__nv_bfloat16), "bf16 is 16 bits");
  const size_t needed = nq * (sizeof(uint16_t) + sizeof(float)) + seqlen_q * sizeof(float);
  size_t free_bytes = 0, total_bytes = 0;
  CUDA_OK(cudaMemGetInfo(&free_bytes, &total_bytes));
  if (free_bytes < needed + (size_t(1) << 30))
    GTEST_SKIP() << "needs " << (needed >> 20) << " MiB of device memory, " << (free_bytes >> 20) << " MiB free";
  ASSERT_GT(nq, int64_t(1) << 31);

  DeviceBuffer<__nv_bfloat16> q(nq);
  DeviceBuffer<float> o(nq), lse(seqlen_q);
  DeviceBuffer<uint16_t> kv(2 * seqlen_k * d);
  ASSERT_TRUE(q.ptr && o.ptr && lse.ptr && kv.ptr);
  fill_random_bf16<<<4096, 256>>>(q.ptr, nq);
  CUDA_OK(cudaGetLastError());
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<uint16_t> kv_bits(2 * seqlen_k * d);
  for (uint16_t& b : kv_bits) b = flash3::reference::float_to_bf16(dist(rng));
  CUDA_OK(cudaMemcpy(kv.ptr, kv_bits.data(), kv_bits.size() * sizeof(uint16_t), cudaMemcpyHostToDevice));

  const AttentionShape s{1, seqlen_q, seqlen_k, 1, 1, d, 0.0f, false};
  CUDA_OK(attention_gpu(s, DType::kBF16, flash3::contiguous<const void*>(q.ptr, seqlen_q, 1, d),
                        flash3::contiguous<const void*>(kv.ptr, seqlen_k, 1, d),
                        flash3::contiguous<const void*>(kv.ptr + seqlen_k * d, seqlen_k, 1, d), o.ptr, lse.ptr,
                        false, nullptr));
  CUDA_OK(cudaDeviceSynchronize());

  // Without a causal mask each row is its own problem against the same keys.
  std::vector<double> k(seqlen_k * d), v(seqlen_k * d);
  for (int64_t i = 0; i < seqlen_k * d; ++i) {
    k[i] = flash3::reference::bf16_to_float(kv_bits[i]);
    v[i] = flash3::reference::bf16_to_float(kv_bits[seqlen_k * d + i]);
  }
  std::vector<int64_t> rows = {0, 1, seqlen_q / 2};
  for (int64_t i = (int64_t(1) << 31) / d - 2; i < seqlen_q; ++i) rows.push_back(i);
  const AttentionShape row_shape{1, 1, seqlen_k, 1, 1, d, 0.0f, false};
  for (int64_t row : rows) {
    std::vector<uint16_t> q_bits(d);
    std::vector<float> got(d);
    float got_lse;
    CUDA_OK(cudaMemcpy(q_bits.data(), q.ptr + row * d, d * sizeof(uint16_t), cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(got.data(), o.ptr + row * d, d * sizeof(float), cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(&got_lse, lse.ptr + row, sizeof(float), cudaMemcpyDeviceToHost));
    std::vector<double> qd(d), want(d);
    for (int64_t c = 0; c < d; ++c) qd[c] = flash3::reference::bf16_to_float(q_bits[c]);
    double want_lse;
    attention_cpu(row_shape, qd.data(), k.data(), v.data(), want.data(), &want_lse);
    for (int64_t c = 0; c < d; ++c) ASSERT_NEAR(got[c], want[c], 1e-4) << "row " << row << " column " << c;
    ASSERT_NEAR(got_lse, want_lse, 1e-4) << "row " << row;
  }
}

// These are rejected before any CUDA call, so they run without a device too.
TEST(ReferenceGpu, RejectsInvalidArguments) {
  uint16_t dummy[8] = {};
  float out[8];
  const flash3::ConstTensor t = flash3::contiguous<const void*>(dummy, 1, 1, 8);
  flash3::ConstTensor strided = t;
  strided.dim_stride = 2;
  const AttentionShape ok{1, 1, 1, 1, 1, 8, 0.0f, false};
  const AttentionShape bad_group{1, 1, 1, 3, 2, 8, 0.0f, false};
  const AttentionShape negative{1, -1, 1, 1, 1, 8, 0.0f, false};
  EXPECT_EQ(attention_gpu(bad_group, DType::kBF16, t, t, t, out, nullptr, false, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(attention_gpu(negative, DType::kBF16, t, t, t, out, nullptr, false, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(attention_gpu(ok, DType::kBF16, strided, t, t, out, nullptr, false, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(attention_gpu(ok, DType::kBF16, t, t, t, nullptr, nullptr, false, nullptr), cudaErrorInvalidValue);
  flash3::ConstTensor no_data = t;
  no_data.data = nullptr;
  EXPECT_EQ(attention_gpu(ok, DType::kFP16, t, no_data, t, out, nullptr, false, nullptr), cudaErrorInvalidValue);
  // An empty problem is valid and launches nothing.
  const AttentionShape empty{0, 1, 1, 1, 1, 8, 0.0f, false};
  EXPECT_EQ(attention_gpu(empty, DType::kBF16, no_data, no_data, no_data, nullptr, nullptr, false, nullptr),
            cudaSuccess);
}

// The host conversions agree with CUDA's own (host-callable) round-to-nearest
// conversions on random bit patterns; needs no device.
TEST(ReferenceGpu, HostConversionsMatchCuda) {
  std::mt19937 rng(99);
  for (int n = 0; n < 1000000; ++n) {
    const uint32_t u = rng();
    float x;
    std::memcpy(&x, &u, sizeof x);
    if (std::isnan(x)) continue;
    ASSERT_EQ(flash3::reference::float_to_bf16(x), __bfloat16_as_ushort(__float2bfloat16_rn(x))) << x;
    ASSERT_EQ(flash3::reference::float_to_half(x), __half_as_ushort(__float2half_rn(x))) << x;
    // Magnitudes below 2^-14 exercise fp16's subnormals, which raw bit patterns rarely hit.
    const float tiny = std::ldexp(float(u >> 8), -38 - int(u % 16));
    const float y = (u & 16) ? -tiny : tiny;
    ASSERT_EQ(flash3::reference::float_to_half(y), __half_as_ushort(__float2half_rn(y))) << y;
  }
}

}  // namespace
