// The FP8 forward kernel against the GPU reference on fresh random inputs.
//
// Inputs are quantized on the host (quantize_fp8's CPU reference) at each
// scale granularity, with magnitudes that change from block to block so that
// per-block scales differ (the kernel folds Q's and K's into S and V's into
// O's running rescale).
// Reference: attention of the dequantized inputs in float32. Tolerance, as
// in the BF16 tests: the kernel's max error at most 2x (plus a small
// epsilon) that of a straightforward FP8 implementation (the reference
// emulating e4m3 P and a bf16/fp16 O). The LSE gets a looser bound than
// with 16-bit inputs: FP8 WGMMA accumulates with about 14 bits of mantissa
// (not float32's 23), so S = Q K^T itself carries an error of up to about
// 2^-13 of sum_c |q_c k_c| per k-step of 32; the test bounds that sum by
// |q| max_j |k_j| (Cauchy-Schwarz).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "flash3/flash3.h"
#include "gpu_test_util.h"
#include "quantize_reference.h"
#include "reference.h"

namespace {

using flash3::DType;
using flash3::ScaleGranularity;
using flash3::reference::AttentionShape;
using flash3::reference::Fp8Emulation;
using flash3::testing::DeviceBuffer;
using flash3::testing::from_bits;

struct Fp8Case {
  int head_dim;
  bool causal;
  ScaleGranularity granularity;
  DType out_dtype;
  int batch, seqlen_q, seqlen_k, heads_q, heads_kv;
  bool packed_qkv = false;  // Q, K, V interleaved in one [b, s, 3, h, d] buffer
};

char const* granularity_name(ScaleGranularity g) {
  return g == ScaleGranularity::kPerTensor ? "tensor" : g == ScaleGranularity::kPerHead ? "head" : "block";
}

std::string name(Fp8Case const& c) {
  return "e4m3 d" + std::to_string(c.head_dim) + (c.causal ? " causal" : "") + " per-" +
         granularity_name(c.granularity) + (c.out_dtype == DType::kBF16 ? " ->bf16" : " ->fp16") + " b" +
         std::to_string(c.batch) + " sq" + std::to_string(c.seqlen_q) + " sk" + std::to_string(c.seqlen_k) + " h" +
         std::to_string(c.heads_q) + "/" + std::to_string(c.heads_kv) + (c.packed_qkv ? " packed" : "");
}

// A dense float [batch, seqlen, heads, d] tensor quantized to e4m3 with
// amax / 448 scales over the granularity's groups, by the CPU reference of
// quantize_fp8.
struct Quantized {
  std::vector<uint8_t> bytes;
  std::vector<float> scales;
};

Quantized quantize(std::vector<float> const& x, ScaleGranularity g, int64_t batch, int64_t seqlen, int64_t heads,
                   int64_t d, int64_t block) {
  Quantized q;
  q.bytes.resize(x.size());
  q.scales.resize(size_t(flash3::fp8_scale_count(g, batch, heads, seqlen, block)));
  flash3::reference::quantize_tensor_cpu(batch, seqlen, heads, d, g, block, /*hadamard=*/false, 0, x.data(),
                                         q.bytes.data(), q.scales.data());
  return q;
}

// Euclidean norm of each dequantized row (b, s, h) of a quantized tensor.
std::vector<float> row_norms(Quantized const& t, ScaleGranularity g, int64_t batch, int64_t seqlen, int64_t heads,
                             int64_t d, int64_t block) {
  int64_t const blocks = (seqlen + block - 1) / block;
  std::vector<float> norms(size_t(batch * seqlen * heads));
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t s = 0; s < seqlen; ++s)
      for (int64_t h = 0; h < heads; ++h) {
        int64_t const grp = g == ScaleGranularity::kPerTensor ? 0
                            : g == ScaleGranularity::kPerHead ? b * heads + h
                                                              : (b * heads + h) * blocks + s / block;
        int64_t const row = (b * seqlen + s) * heads + h;
        double sum = 0;
        for (int64_t c = 0; c < d; ++c) {
          double const v = double(flash3::reference::e4m3_to_float(t.bytes[row * d + c])) * t.scales[grp];
          sum += v * v;
        }
        norms[row] = float(std::sqrt(sum));
      }
  return norms;
}

// Normal values whose magnitude changes every 32 rows of each head (by up to
// 2^3 either way), so that blocks get different scales.
std::vector<float> random_tensor(std::mt19937& rng, int64_t batch, int64_t seqlen, int64_t heads, int64_t d) {
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_real_distribution<float> exponent(-3.f, 3.f);
  std::vector<float> x(size_t(batch * seqlen * heads * d));
  std::vector<float> factor(size_t(batch * heads * ((seqlen + 31) / 32)));
  for (float& f : factor) f = std::exp2(exponent(rng));
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t s = 0; s < seqlen; ++s)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t c = 0; c < d; ++c)
          x[((b * seqlen + s) * heads + h) * d + c] = normal(rng) * factor[(b * heads + h) * ((seqlen + 31) / 32) + s / 32];
  return x;
}

void run_fp8_case(Fp8Case const& c, uint32_t seed) {
  SCOPED_TRACE(name(c));
  int64_t const d = c.head_dim;
  std::mt19937 rng(seed);
  flash3::Fp8BlockSizes const blocks = flash3::fp8_block_sizes(d);
  ASSERT_GT(blocks.q, 0);
  Quantized const hq = quantize(random_tensor(rng, c.batch, c.seqlen_q, c.heads_q, d), c.granularity, c.batch,
                                c.seqlen_q, c.heads_q, d, blocks.q);
  Quantized const hk = quantize(random_tensor(rng, c.batch, c.seqlen_k, c.heads_kv, d), c.granularity, c.batch,
                                c.seqlen_k, c.heads_kv, d, blocks.kv);
  Quantized const hv = quantize(random_tensor(rng, c.batch, c.seqlen_k, c.heads_kv, d), c.granularity, c.batch,
                                c.seqlen_k, c.heads_kv, d, blocks.kv);

  flash3::ForwardArgs a;
  a.dtype = DType::kE4M3;
  a.batch = c.batch;
  a.seqlen_q = c.seqlen_q;
  a.seqlen_k = c.seqlen_k;
  a.heads_q = c.heads_q;
  a.heads_kv = c.heads_kv;
  a.head_dim = d;
  a.causal = c.causal;

  size_t const q_elems = hq.bytes.size(), kv_elems = hk.bytes.size();
  size_t const lse_elems = size_t(c.batch) * c.heads_q * c.seqlen_q;
  DeviceBuffer<uint8_t> qkv(c.packed_qkv ? 3 * q_elems : 0), q(c.packed_qkv ? 0 : q_elems),
      k(c.packed_qkv ? 0 : kv_elems), v(c.packed_qkv ? 0 : kv_elems);
  DeviceBuffer<uint16_t> o(q_elems);
  DeviceBuffer<float> lse(lse_elems), ref_o(q_elems), ref_lse(lse_elems), low_o(q_elems);
  DeviceBuffer<float> q_scale(hq.scales.size()), k_scale(hk.scales.size()), v_scale(hv.scales.size());
  ASSERT_TRUE(o.ptr && lse.ptr && ref_o.ptr && ref_lse.ptr && low_o.ptr && q_scale.ptr && k_scale.ptr && v_scale.ptr);
  if (c.packed_qkv) {
    ASSERT_EQ(c.seqlen_q, c.seqlen_k);
    ASSERT_EQ(c.heads_q, c.heads_kv);
    ASSERT_NE(qkv.ptr, nullptr);
    // Row (b, s) holds Q, K, V's heads one after the other.
    std::vector<uint8_t> packed(3 * q_elems);
    int64_t const row = c.heads_q * d;
    for (int64_t r = 0; r < int64_t(c.batch) * c.seqlen_q; ++r) {
      for (int which = 0; which < 3; ++which) {
        auto const& src = which == 0 ? hq.bytes : which == 1 ? hk.bytes : hv.bytes;
        std::copy_n(src.begin() + r * row, row, packed.begin() + (3 * r + which) * row);
      }
    }
    CUDA_OK(cudaMemcpy(qkv.ptr, packed.data(), packed.size(), cudaMemcpyHostToDevice));
    auto view = [&](int which) {
      return flash3::ConstTensor{qkv.ptr + which * row, 3 * row * c.seqlen_q, 3 * row, d, 1};
    };
    a.q = view(0);
    a.k = view(1);
    a.v = view(2);
  } else {
    ASSERT_TRUE(q.ptr && k.ptr && v.ptr);
    CUDA_OK(cudaMemcpy(q.ptr, hq.bytes.data(), q_elems, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(k.ptr, hk.bytes.data(), kv_elems, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(v.ptr, hv.bytes.data(), kv_elems, cudaMemcpyHostToDevice));
    a.q = flash3::contiguous<const void*>(q.ptr, c.seqlen_q, c.heads_q, d);
    a.k = flash3::contiguous<const void*>(k.ptr, c.seqlen_k, c.heads_kv, d);
    a.v = flash3::contiguous<const void*>(v.ptr, c.seqlen_k, c.heads_kv, d);
  }
  CUDA_OK(cudaMemcpy(q_scale.ptr, hq.scales.data(), hq.scales.size() * 4, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(k_scale.ptr, hk.scales.data(), hk.scales.size() * 4, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(v_scale.ptr, hv.scales.data(), hv.scales.size() * 4, cudaMemcpyHostToDevice));
  a.fp8.granularity = c.granularity;
  a.fp8.q = q_scale.ptr;
  a.fp8.k = k_scale.ptr;
  a.fp8.v = v_scale.ptr;
  a.fp8.out_dtype = c.out_dtype;
  // Poison: an element the kernel does not write reads back as NaN.
  CUDA_OK(cudaMemset(o.ptr, 0xff, q_elems * 2));
  CUDA_OK(cudaMemset(lse.ptr, 0xff, lse_elems * 4));
  a.o = flash3::contiguous<void*>(o.ptr, c.seqlen_q, c.heads_q, d);
  a.lse = lse.ptr;

  flash3::Status s = flash3::forward(a, nullptr);
  if (s.code() == flash3::Status::Code::kUnsupported) GTEST_SKIP() << s.message();
  ASSERT_TRUE(s.ok()) << s.message();
  CUDA_OK(cudaDeviceSynchronize());

  AttentionShape shape{c.batch, c.seqlen_q, c.seqlen_k, c.heads_q, c.heads_kv, d, 0.f, c.causal};
  CUDA_OK(flash3::reference::attention_gpu_fp8(shape, a.q, a.k, a.v, a.fp8, ref_o.ptr, ref_lse.ptr,
                                                Fp8Emulation::kNone, nullptr));
  CUDA_OK(flash3::reference::attention_gpu_fp8(shape, a.q, a.k, a.v, a.fp8, low_o.ptr, nullptr,
                                                Fp8Emulation::kFused, nullptr));
  CUDA_OK(cudaDeviceSynchronize());

  std::vector<uint16_t> h_o(q_elems);
  std::vector<float> h_lse(lse_elems), h_ref(q_elems), h_ref_lse(lse_elems), h_low(q_elems);
  CUDA_OK(cudaMemcpy(h_o.data(), o.ptr, q_elems * 2, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(h_lse.data(), lse.ptr, lse_elems * 4, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(h_ref.data(), ref_o.ptr, q_elems * 4, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(h_ref_lse.data(), ref_lse.ptr, lse_elems * 4, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(h_low.data(), low_o.ptr, q_elems * 4, cudaMemcpyDeviceToHost));

  std::vector<float> const q_norm = row_norms(hq, c.granularity, c.batch, c.seqlen_q, c.heads_q, d, blocks.q);
  std::vector<float> const k_norm = row_norms(hk, c.granularity, c.batch, c.seqlen_k, c.heads_kv, d, blocks.kv);
  std::vector<float> k_max(size_t(c.batch) * c.heads_kv, 0.f);  // max_j |k_j| per (batch, K/V head)
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t s = 0; s < c.seqlen_k; ++s)
      for (int64_t h = 0; h < c.heads_kv; ++h)
        k_max[b * c.heads_kv + h] = std::max(k_max[b * c.heads_kv + h], k_norm[(b * c.seqlen_k + s) * c.heads_kv + h]);
  double const accumulation = (d / 32) * std::exp2(-13.0) / std::sqrt(double(d));  // per k-step, times the scale
  auto lse_slack = [&](size_t i) {
    int64_t const row = int64_t(i) % c.seqlen_q, h = int64_t(i) / c.seqlen_q % c.heads_q;
    int64_t const b = int64_t(i) / c.seqlen_q / c.heads_q;
    return accumulation * q_norm[(b * c.seqlen_q + row) * c.heads_q + h] *
           k_max[b * c.heads_kv + h / (c.heads_q / c.heads_kv)];
  };
  flash3::testing::expect_forward_close(h_o, c.out_dtype, h_ref, h_low, h_lse, h_ref_lse, lse_slack);
}

class ForwardFp8 : public ::testing::TestWithParam<std::tuple<int, bool, ScaleGranularity>> {};

TEST_P(ForwardFp8, ShapeSweep) {
  SKIP_WITHOUT_CUDA_DEVICE();
  auto [d, causal, g] = GetParam();
  DType const bf16 = DType::kBF16;
  std::vector<Fp8Case> cases = {
      {d, causal, g, bf16, 2, 1, 1, 4, 4},          {d, causal, g, bf16, 2, 7, 7, 4, 4},
      {d, causal, g, bf16, 1, 113, 113, 8, 2},      {d, causal, g, DType::kFP16, 2, 255, 255, 8, 8},
      {d, causal, g, bf16, 1, 1023, 1023, 8, 1},    {d, causal, g, bf16, 1, 4097, 4097, 2, 2},
      {d, causal, g, bf16, 2, 113, 1023, 4, 1},     {d, causal, g, bf16, 2, 1023, 113, 4, 4},
      {d, causal, g, bf16, 1, 1, 4097, 8, 2},       {d, causal, g, bf16, 1, 300, 7, 2, 2},
      {d, causal, g, bf16, 2, 255, 255, 4, 4, true},
  };
  uint32_t seed = 4321 + d + (causal ? 1 : 0) + 7 * int(g);
  for (Fp8Case const& c : cases) run_fp8_case(c, seed++);
}

INSTANTIATE_TEST_SUITE_P(All, ForwardFp8,
                         ::testing::Combine(::testing::Values(64, 128, 256), ::testing::Bool(),
                                            ::testing::Values(ScaleGranularity::kPerTensor, ScaleGranularity::kPerHead,
                                                              ScaleGranularity::kPerBlock)),
                         [](auto const& info) {
                           return "d" + std::to_string(std::get<0>(info.param)) +
                                  (std::get<1>(info.param) ? "_causal_" : "_") + granularity_name(std::get<2>(info.param));
                         });

// Tiles whose rows all see no key, ending the CTAs' walks (test_forward_gpu's
// Forward.TilesWhoseRowsSeeNoKey).
TEST(ForwardFp8, TilesWhoseRowsSeeNoKey) {
  SKIP_WITHOUT_CUDA_DEVICE();
  run_fp8_case(Fp8Case{128, true, ScaleGranularity::kPerBlock, DType::kBF16, 1, 20000, 64, 4, 4}, 78);
}

// ---- Packed sequences (varlen) ----------------------------------------------

// A packed [total, heads, d] tensor quantized as the packed FP8 forward reads
// it (flash3.h, Varlen): per tensor, one scale over every row; per head and
// per block, each sequence's packed rows quantized as a fixed-length batch of
// one, its scales entry b of the [batch, heads] or [batch, heads, blocks of
// the longest sequence] layout, and the rows past the last sequence apart
// (their scales dropped). The scales of blocks wholly past a sequence's used
// rows are NaN: a kernel that read one would show it in O.
struct PackedQuantized {
  std::vector<uint8_t> bytes;
  std::vector<float> scales;  // the kernel's layout
  ScaleGranularity granularity;
  int64_t heads, block;
  int64_t blocks = 1;  // per (sequence, head) in the layout

  // The scale of row `row` of sequence b.
  float scale(int b, int64_t h, int64_t row) const {
    if (granularity == ScaleGranularity::kPerTensor) return scales[0];
    int64_t const j = granularity == ScaleGranularity::kPerBlock ? row / block : 0;
    return scales[size_t((b * heads + h) * blocks + j)];
  }
  // Sequence b's scales as the fixed-length layout of its first `used` rows
  // alone holds them.
  std::vector<float> sequence(int b, int64_t used) const {
    if (granularity == ScaleGranularity::kPerTensor) return {scales[0]};
    int64_t const n = granularity == ScaleGranularity::kPerBlock ? (used + block - 1) / block : 1;
    std::vector<float> s;
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t j = 0; j < n; ++j) s.push_back(scales[size_t((b * heads + h) * blocks + j)]);
    }
    return s;
  }
};

PackedQuantized quantize_packed(std::vector<float> const& x, ScaleGranularity g, std::vector<int32_t> const& cu,
                                std::vector<int> const& used, int64_t total, int64_t heads, int64_t d, int64_t block) {
  int const batch = int(used.size());
  PackedQuantized p{std::vector<uint8_t>(x.size()), {}, g, heads, block};
  auto quantize_rows = [&](int64_t first, int64_t rows, ScaleGranularity gr) {
    std::vector<float> s(size_t(flash3::fp8_scale_count(gr, 1, heads, rows, block)));
    flash3::reference::quantize_tensor_cpu(1, rows, heads, d, gr, block, /*hadamard=*/false, 0,
                                           x.data() + first * heads * d, p.bytes.data() + first * heads * d,
                                           s.data());
    return s;
  };
  if (g == ScaleGranularity::kPerTensor) {
    p.scales = quantize_rows(0, total, g);
    return p;
  }
  int64_t longest = 0;
  for (int b = 0; b < batch; ++b) longest = std::max<int64_t>(longest, cu[b + 1] - cu[b]);
  if (g == ScaleGranularity::kPerBlock) p.blocks = (longest + block - 1) / block;
  p.scales.assign(size_t(batch * heads * p.blocks), std::numeric_limits<float>::quiet_NaN());
  for (int b = 0; b < batch; ++b) {
    int64_t const rows = cu[b + 1] - cu[b];
    if (rows == 0) continue;
    std::vector<float> const s = quantize_rows(cu[b], rows, g);
    bool const per_block = g == ScaleGranularity::kPerBlock;
    int64_t const own = per_block ? (rows + block - 1) / block : 1;  // the sequence's blocks in s
    int64_t const read = per_block ? (used[b] + block - 1) / block : (used[b] > 0 ? 1 : 0);  // the kernel's
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t j = 0; j < read; ++j) p.scales[size_t((b * heads + h) * p.blocks + j)] = s[size_t(h * own + j)];
    }
  }
  if (total > cu[batch]) quantize_rows(cu[batch], total - cu[batch], ScaleGranularity::kPerTensor);
  return p;
}

// The packed FP8 forward against the reference run on each sequence alone
// with its own scales, as the fixed-length path computes it. Lengths of 0,
// 1, shorter than a tile, longer than two, not multiples of a block; GQA;
// seqused below the packed lengths; 3 rows past the last sequence. Rows past
// seqused and past the last sequence must keep their poison (O and LSE).
struct VarlenFp8Case {
  int head_dim;
  int mask;  // 0: none, 1: causal, 2: a window (90, 30)
  ScaleGranularity granularity;
  std::vector<int> len_q, len_k;
  int heads_q = 4, heads_kv = 2;
  bool seqused = false;  // 5 packed rows past each sequence's used ones
};

void run_varlen_fp8(VarlenFp8Case const& c, uint32_t seed) {
  flash3::testing::PackedBatch const packed(c.len_q, c.len_k, c.seqused, /*tail=*/3);
  int const batch = packed.batch();
  int64_t const d = c.head_dim, hq = c.heads_q, hkv = c.heads_kv;
  bool const causal = c.mask == 1;
  int const window_left = c.mask == 2 ? 90 : -1, window_right = c.mask == 2 ? 30 : -1;
  ScaleGranularity const g = c.granularity;
  SCOPED_TRACE("e4m3 varlen d" + std::to_string(d) + (c.mask == 1 ? " causal" : c.mask == 2 ? " window" : "") +
               " per-" + granularity_name(g) + " batch " + std::to_string(batch) + " h" + std::to_string(hq) + "/" +
               std::to_string(hkv) + (c.seqused ? " seqused" : ""));
  flash3::Fp8BlockSizes const blocks = flash3::fp8_block_sizes(d);
  ASSERT_GT(blocks.q, 0);
  std::vector<int32_t> const& cu_q = packed.cu_q;
  std::vector<int32_t> const& cu_k = packed.cu_k;
  int64_t const total_q = packed.total_q, total_k = packed.total_k;
  std::mt19937 rng(seed);
  PackedQuantized const q8 =
      quantize_packed(random_tensor(rng, 1, total_q, hq, d), g, cu_q, c.len_q, total_q, hq, d, blocks.q);
  PackedQuantized const k8 =
      quantize_packed(random_tensor(rng, 1, total_k, hkv, d), g, cu_k, c.len_k, total_k, hkv, d, blocks.kv);
  PackedQuantized const v8 =
      quantize_packed(random_tensor(rng, 1, total_k, hkv, d), g, cu_k, c.len_k, total_k, hkv, d, blocks.kv);

  size_t const q_elems = q8.bytes.size(), kv_elems = k8.bytes.size(), lse_elems = size_t(hq * total_q);
  DeviceBuffer<uint8_t> q(q_elems), k(kv_elems), v(kv_elems);
  DeviceBuffer<uint16_t> o(q_elems);
  DeviceBuffer<float> lse(lse_elems), ref_o(q_elems), low_o(q_elems), ref_lse(lse_elems);
  DeviceBuffer<float> q_scale(q8.scales.size()), k_scale(k8.scales.size()), v_scale(v8.scales.size());
  ASSERT_TRUE(q.ptr && k.ptr && v.ptr && o.ptr && lse.ptr && ref_o.ptr && low_o.ptr && ref_lse.ptr && q_scale.ptr &&
              k_scale.ptr && v_scale.ptr && packed.d_cu_q.ptr && packed.d_cu_k.ptr && packed.d_used_q.ptr &&
              packed.d_used_k.ptr);
  for (auto [dst, t] : {std::pair{q.ptr, &q8}, std::pair{k.ptr, &k8}, std::pair{v.ptr, &v8}}) {
    CUDA_OK(cudaMemcpy(dst, t->bytes.data(), t->bytes.size(), cudaMemcpyHostToDevice));
  }
  for (auto [dst, t] : {std::pair{q_scale.ptr, &q8}, std::pair{k_scale.ptr, &k8}, std::pair{v_scale.ptr, &v8}}) {
    CUDA_OK(cudaMemcpy(dst, t->scales.data(), t->scales.size() * 4, cudaMemcpyHostToDevice));
  }
  CUDA_OK(packed.upload());
  // Poison: an element the kernel does not write reads back as NaN.
  CUDA_OK(cudaMemset(o.ptr, 0xff, q_elems * 2));
  CUDA_OK(cudaMemset(lse.ptr, 0xff, lse_elems * 4));

  flash3::ForwardArgs a =
      packed.forward_args(DType::kE4M3, int(hq), int(hkv), int(d), 0, q.ptr, k.ptr, v.ptr, o.ptr, lse.ptr);
  a.causal = causal;
  a.window_left = window_left;
  a.window_right = window_right;
  a.fp8 = {g, q_scale.ptr, k_scale.ptr, v_scale.ptr, DType::kBF16};
  flash3::Status s = flash3::forward(a, nullptr);
  if (s.code() == flash3::Status::Code::kUnsupported) GTEST_SKIP() << s.message();
  ASSERT_TRUE(s.ok()) << s.message();
  CUDA_OK(cudaDeviceSynchronize());

  // The reference, sequence by sequence: views into the packed buffers, and
  // the sequence's scales in the fixed-length layout of its used rows.
  for (int b = 0; b < batch; ++b) {
    if (c.len_q[b] == 0) continue;
    AttentionShape shape{1, c.len_q[b], c.len_k[b], hq, hkv, d, 0.f, causal};
    shape.window_left = window_left;
    shape.window_right = window_right;
    auto view = [&](uint8_t* base, int row, int64_t heads) {
      return flash3::ConstTensor{base + row * heads * d, 0, heads * d, d, 1};
    };
    std::vector<float> const sq = q8.sequence(b, c.len_q[b]), sk = k8.sequence(b, c.len_k[b]),
                             sv = v8.sequence(b, c.len_k[b]);
    DeviceBuffer<float> seq_q(sq.size()), seq_k(sk.size()), seq_v(sv.size()), seq_lse(size_t(hq * c.len_q[b]));
    for (auto [dst, host] : {std::pair{seq_q.ptr, &sq}, std::pair{seq_k.ptr, &sk}, std::pair{seq_v.ptr, &sv}}) {
      if (!host->empty()) CUDA_OK(cudaMemcpy(dst, host->data(), host->size() * 4, cudaMemcpyHostToDevice));
    }
    flash3::Fp8Scales const scales{g, seq_q.ptr, seq_k.ptr, seq_v.ptr, DType::kBF16};
    size_t const at = size_t(cu_q[b] * hq * d);
    CUDA_OK(flash3::reference::attention_gpu_fp8(shape, view(q.ptr, cu_q[b], hq), view(k.ptr, cu_k[b], hkv),
                                                  view(v.ptr, cu_k[b], hkv), scales, ref_o.ptr + at, seq_lse.ptr,
                                                  Fp8Emulation::kNone, nullptr));
    CUDA_OK(flash3::reference::attention_gpu_fp8(shape, view(q.ptr, cu_q[b], hq), view(k.ptr, cu_k[b], hkv),
                                                  view(v.ptr, cu_k[b], hkv), scales, low_o.ptr + at, nullptr,
                                                  Fp8Emulation::kFused, nullptr));
    for (int64_t h = 0; h < hq; ++h) {
      CUDA_OK(cudaMemcpy(ref_lse.ptr + h * total_q + cu_q[b], seq_lse.ptr + h * c.len_q[b], c.len_q[b] * 4,
                         cudaMemcpyDeviceToDevice));
    }
    CUDA_OK(cudaDeviceSynchronize());  // before this sequence's buffers are freed
  }
  std::vector<uint16_t> h_o(q_elems);
  std::vector<float> h_lse(lse_elems), h_ref(q_elems), h_low(q_elems), h_ref_lse(lse_elems);
  CUDA_OK(cudaMemcpy(h_o.data(), o.ptr, q_elems * 2, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(h_lse.data(), lse.ptr, lse_elems * 4, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(h_ref.data(), ref_o.ptr, q_elems * 4, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(h_low.data(), low_o.ptr, q_elems * 4, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(h_ref_lse.data(), ref_lse.ptr, lse_elems * 4, cudaMemcpyDeviceToHost));

  // The LSE's slack (run_fp8_case's), from the dequantized rows' norms.
  auto norm = [&](PackedQuantized const& t, int b, int64_t heads, int64_t packed_row, int64_t row, int64_t h) {
    double sum = 0;
    for (int64_t e = 0; e < d; ++e) {
      double const x = double(flash3::reference::e4m3_to_float(t.bytes[size_t((packed_row * heads + h) * d + e)])) *
                       t.scale(b, h, row);
      sum += x * x;
    }
    return std::sqrt(sum);
  };
  double const accumulation = (d / 32) * std::exp2(-13.0) / std::sqrt(double(d));
  std::vector<double> k_max(size_t(batch * hkv), 0.0);  // max_j |k_j| per (sequence, K/V head)
  for (int b = 0; b < batch; ++b)
    for (int64_t h = 0; h < hkv; ++h)
      for (int i = 0; i < c.len_k[b]; ++i) {
        k_max[size_t(b * hkv + h)] = std::max(k_max[size_t(b * hkv + h)], norm(k8, b, hkv, cu_k[b] + i, i, h));
      }

  // The used rows, compared; the others (past seqused, past the last
  // sequence), still poisoned.
  flash3::testing::PackedForwardRows used;
  std::vector<double> slack;
  ASSERT_NO_FATAL_FAILURE(flash3::testing::gather_packed_rows(
      packed, int(hq), size_t(hq * d), h_o, h_ref, h_low, h_lse, h_ref_lse, used,
      [&](int b, int i, size_t r, int h) {
        slack.push_back(accumulation * norm(q8, b, hq, r, i, h) * k_max[size_t(b * hkv + h / (hq / hkv))]);
      }));
  flash3::testing::expect_forward_close(used.o, DType::kBF16, used.ref, used.low, used.lse, used.ref_lse,
                                        [&](size_t i) { return slack[i]; });
}

TEST(ForwardFp8, Varlen) {
  SKIP_WITHOUT_CUDA_DEVICE();
  std::vector<int> const len_q{300, 0, 1, 129, 1000, 64, 77}, len_k{250, 40, 0, 700, 1000, 64, 300};
  uint32_t seed = 2400;
  for (int d : {64, 128, 256}) {
    for (ScaleGranularity g : {ScaleGranularity::kPerTensor, ScaleGranularity::kPerHead, ScaleGranularity::kPerBlock}) {
      for (int mask : {0, 1, 2}) run_varlen_fp8({d, mask, g, len_q, len_k, 4, 2, (mask + int(g)) % 2 == 1}, seed++);
    }
  }
  // MQA with seqused; equal lengths, as a fixed-length batch holds them; one sequence.
  run_varlen_fp8({128, 1, ScaleGranularity::kPerBlock, len_q, len_k, 8, 1, true}, seed++);
  run_varlen_fp8({64, 1, ScaleGranularity::kPerBlock, {512, 512, 512}, {512, 512, 512}}, seed++);
  run_varlen_fp8({256, 0, ScaleGranularity::kPerHead, {3000}, {2000}}, seed++);
}

// Paper Table 3's inputs, N(0, 1) + N(0, 100) * Bernoulli(0.001), on a
// smaller shape than the benchmark's (flash3-bench --fp8-accuracy): with block
// quantization and incoherent processing, the RMSE of O against the float32
// reference on the 16-bit inputs stays under a bound, and well under that of
// per-tensor quantization.
TEST(ForwardFp8, AccuracyWithOutliers) {
  SKIP_WITHOUT_CUDA_DEVICE();
  // The paper's Table 3 shape: on smaller ones the ratio below varies with
  // the draw (1.96 at seqlen 2048, 4 heads, with 192-key blocks).
  int64_t const batch = 2, seqlen = 4096, heads = 16, d = 128;
  size_t const n = size_t(batch * seqlen * heads * d);
  std::mt19937 rng(77);
  std::normal_distribution<float> normal(0.f, 1.f), outlier(0.f, 10.f);
  std::bernoulli_distribution rare(0.001);
  DeviceBuffer<uint16_t> q(n), k(n), v(n), o(n);
  DeviceBuffer<uint8_t> q8(n), k8(n), v8(n);
  DeviceBuffer<float> ref(n), q_scale(n / 64), k_scale(n / 64), v_scale(n / 64);
  ASSERT_TRUE(q.ptr && k.ptr && v.ptr && o.ptr && q8.ptr && k8.ptr && v8.ptr && ref.ptr);
  for (uint16_t* t : {q.ptr, k.ptr, v.ptr}) {
    std::vector<uint16_t> host(n);
    for (auto& x : host) x = flash3::testing::to_bits(normal(rng) + (rare(rng) ? outlier(rng) : 0.f), DType::kBF16);
    CUDA_OK(cudaMemcpy(t, host.data(), n * 2, cudaMemcpyHostToDevice));
  }
  flash3::ForwardArgs a =
      flash3::reference::dense_forward_args(DType::kBF16, batch, seqlen, heads, d, q.ptr, k.ptr, v.ptr, o.ptr);
  AttentionShape shape{batch, seqlen, seqlen, heads, heads, d, 0.f, false};
  CUDA_OK(flash3::reference::attention_gpu(shape, DType::kBF16, a.q, a.k, a.v, ref.ptr, nullptr, false, nullptr));
  std::vector<float> h_ref(n);
  CUDA_OK(cudaMemcpy(h_ref.data(), ref.ptr, n * 4, cudaMemcpyDeviceToHost));

  // A build narrowed to other dtypes has no e4m3 kernel: the test skips.
  std::string not_built;
  auto rmse = [&](ScaleGranularity g, bool hadamard) {
    flash3::QuantizeArgs qa;
    qa.batch = batch;
    qa.seqlen_q = qa.seqlen_k = seqlen;
    qa.heads_q = qa.heads_kv = heads;
    qa.head_dim = d;
    qa.q = a.q;
    qa.k = a.k;
    qa.v = a.v;
    qa.q_out = flash3::contiguous<void*>(q8.ptr, seqlen, heads, d);
    qa.k_out = flash3::contiguous<void*>(k8.ptr, seqlen, heads, d);
    qa.v_out = flash3::contiguous<void*>(v8.ptr, seqlen, heads, d);
    qa.granularity = g;
    qa.q_scale = q_scale.ptr;
    qa.k_scale = k_scale.ptr;
    qa.v_scale = v_scale.ptr;
    qa.hadamard = hadamard;
    qa.seed = 5;
    flash3::Status s = flash3::quantize_fp8(qa, nullptr);
    EXPECT_TRUE(s.ok()) << s.message();
    flash3::ForwardArgs f = a;
    f.dtype = DType::kE4M3;
    f.q = flash3::contiguous<const void*>(q8.ptr, seqlen, heads, d);
    f.k = flash3::contiguous<const void*>(k8.ptr, seqlen, heads, d);
    f.v = flash3::contiguous<const void*>(v8.ptr, seqlen, heads, d);
    f.fp8 = {g, q_scale.ptr, k_scale.ptr, v_scale.ptr, DType::kBF16};
    EXPECT_EQ(cudaMemset(o.ptr, 0xff, n * 2), cudaSuccess);
    s = flash3::forward(f, nullptr);
    if (s.code() == flash3::Status::Code::kUnsupported) {
      not_built = s.message();
      return 0.0;
    }
    EXPECT_TRUE(s.ok()) << s.message();
    std::vector<uint16_t> h_o(n);
    EXPECT_EQ(cudaMemcpy(h_o.data(), o.ptr, n * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    double sum = 0;
    for (size_t i = 0; i < n; ++i) {
      double const e = double(from_bits(h_o[i], DType::kBF16)) - h_ref[i];
      sum += e * e;
    }
    return std::sqrt(sum / double(n));
  };
  double const per_tensor = rmse(ScaleGranularity::kPerTensor, false);
  if (!not_built.empty()) GTEST_SKIP() << not_built;
  double const block_hadamard = rmse(ScaleGranularity::kPerBlock, true);
  std::printf("RMSE of O: per-tensor %.3e, per-block + Hadamard %.3e (%.2fx lower)\n", per_tensor, block_hadamard,
              per_tensor / block_hadamard);
  EXPECT_LE(block_hadamard, 1.1e-2);
  EXPECT_LE(2.0 * block_hadamard, per_tensor);
}

}  // namespace
