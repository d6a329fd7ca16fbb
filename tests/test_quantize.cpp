// FP8 quantization on the CPU: validate(QuantizeArgs) (every bad argument gets
// kInvalidArgument naming it), the host e4m3 conversions, the Hadamard
// transform of the reference, fp8_scale_count, and quantize_cpu's semantics.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "expect_invalid.h"
#include "flash3/flash3.h"
#include "quant/hadamard.h"
#include "quantize_reference.h"
#include "valid_args.h"

namespace {

using flash3::testing::valid_quantize_args;

using flash3::QuantizeArgs;
using flash3::ScaleGranularity;
using flash3::Status;
using flash3::reference::e4m3_to_float;
using flash3::reference::float_to_e4m3;

// ---------------------------------------------------------------- validation

void expect_invalid(std::function<void(QuantizeArgs&)> const& edit, std::string const& name) {
  Status const s = flash3::testing::expect_invalid_args(valid_quantize_args(), edit, name);
  QuantizeArgs a = valid_quantize_args();
  edit(a);
  // quantize_fp8 validates before anything else: the same answer, no launch
  // (these fake pointers would fault).
  Status const q = flash3::quantize_fp8(a, nullptr);
  EXPECT_EQ(q.code(), Status::Code::kInvalidArgument) << name;
  EXPECT_EQ(q.message(), s.message());
}

TEST(QuantizeValidation, ValidArgumentsPass) {
  EXPECT_TRUE(flash3::validate(valid_quantize_args()).ok());
  for (auto g : {ScaleGranularity::kPerTensor, ScaleGranularity::kPerHead, ScaleGranularity::kPerBlock}) {
    for (int d : {64, 128, 256}) {
      for (auto dt : {flash3::DType::kBF16, flash3::DType::kFP16}) {
        QuantizeArgs a = valid_quantize_args();
        a.granularity = g;
        a.head_dim = d;
        a.dtype = dt;
        a.hadamard = true;
        for (auto* s : {&a.q.seq_stride, &a.q_out.seq_stride}) *s = 8 * d;
        for (auto* s : {&a.k.seq_stride, &a.v.seq_stride, &a.k_out.seq_stride, &a.v_out.seq_stride}) *s = 2 * d;
        for (auto* s : {&a.q.head_stride, &a.k.head_stride, &a.v.head_stride, &a.q_out.head_stride,
                        &a.k_out.head_stride, &a.v_out.head_stride}) {
          *s = d;
        }
        for (auto* s : {&a.q.batch_stride, &a.q_out.batch_stride}) *s = a.seqlen_q * 8 * d;
        for (auto* s : {&a.k.batch_stride, &a.v.batch_stride, &a.k_out.batch_stride, &a.v_out.batch_stride}) {
          *s = a.seqlen_k * 2 * d;
        }
        EXPECT_TRUE(flash3::validate(a).ok()) << d;
      }
    }
  }
}

TEST(QuantizeValidation, Sizes) {
  expect_invalid([](QuantizeArgs& a) { a.batch = -1; }, "batch:");
  expect_invalid([](QuantizeArgs& a) { a.seqlen_q = -5; }, "seqlen_q:");
  expect_invalid([](QuantizeArgs& a) { a.seqlen_k = -1; }, "seqlen_k:");
  expect_invalid([](QuantizeArgs& a) { a.seqlen_q = int64_t(1) << 31; }, "seqlen_q:");
  expect_invalid([](QuantizeArgs& a) { a.seqlen_k = int64_t(1) << 31; }, "seqlen_k:");
  expect_invalid([](QuantizeArgs& a) { a.batch = int64_t(1) << 31; }, "batch:");
  expect_invalid([](QuantizeArgs& a) { a.heads_q = 0; }, "heads_q:");
  expect_invalid([](QuantizeArgs& a) { a.heads_kv = 0; }, "heads_kv:");
  expect_invalid([](QuantizeArgs& a) { a.heads_kv = -2; }, "heads_kv:");
  expect_invalid([](QuantizeArgs& a) { a.heads_kv = 3; }, "heads_kv:");
  expect_invalid([](QuantizeArgs& a) { a.heads_q = int64_t(1) << 31; }, "heads_q:");
  // batch * heads * seqlen / 32 CTAs: at most 2^31 - 1.
  expect_invalid([](QuantizeArgs& a) { a.batch = int64_t(1) << 30; }, "batch:");
  expect_invalid([](QuantizeArgs& a) { a.batch = int64_t(1) << 25, a.heads_kv = 1, a.seqlen_k = 1 << 20; }, "batch:");
}

TEST(QuantizeValidation, HeadDimDtypeGranularity) {
  for (int d : {0, 32, 80, 96, 160, 192, 512, -64}) {
    expect_invalid([d](QuantizeArgs& a) { a.head_dim = d; }, "head_dim:");
  }
  expect_invalid([](QuantizeArgs& a) { a.dtype = flash3::DType::kE4M3; }, "dtype:");
  expect_invalid([](QuantizeArgs& a) { a.dtype = static_cast<flash3::DType>(7); }, "dtype:");
  expect_invalid([](QuantizeArgs& a) { a.granularity = static_cast<ScaleGranularity>(3); }, "granularity:");
}

TEST(QuantizeValidation, Pointers) {
  expect_invalid([](QuantizeArgs& a) { a.q.data = nullptr; }, "q.data:");
  expect_invalid([](QuantizeArgs& a) { a.k.data = nullptr; }, "k.data:");
  expect_invalid([](QuantizeArgs& a) { a.v.data = nullptr; }, "v.data:");
  expect_invalid([](QuantizeArgs& a) { a.q_out.data = nullptr; }, "q_out.data:");
  expect_invalid([](QuantizeArgs& a) { a.k_out.data = nullptr; }, "k_out.data:");
  expect_invalid([](QuantizeArgs& a) { a.v_out.data = nullptr; }, "v_out.data:");
  expect_invalid([](QuantizeArgs& a) { a.q_scale = nullptr; }, "q_scale:");
  expect_invalid([](QuantizeArgs& a) { a.k_scale = nullptr; }, "k_scale:");
  expect_invalid([](QuantizeArgs& a) { a.v_scale = nullptr; }, "v_scale:");
  auto shift = [](auto p, uintptr_t bytes) {
    return reinterpret_cast<decltype(p)>(reinterpret_cast<uintptr_t>(p) + bytes);
  };
  expect_invalid([&](QuantizeArgs& a) { a.q.data = shift(a.q.data, 8); }, "q.data:");
  expect_invalid([&](QuantizeArgs& a) { a.k.data = shift(a.k.data, 2); }, "k.data:");
  expect_invalid([&](QuantizeArgs& a) { a.v.data = shift(a.v.data, 4); }, "v.data:");
  expect_invalid([&](QuantizeArgs& a) { a.q_out.data = shift(a.q_out.data, 8); }, "q_out.data:");
  expect_invalid([&](QuantizeArgs& a) { a.k_out.data = shift(a.k_out.data, 1); }, "k_out.data:");
  expect_invalid([&](QuantizeArgs& a) { a.v_out.data = shift(a.v_out.data, 4); }, "v_out.data:");
  expect_invalid([&](QuantizeArgs& a) { a.q_scale = shift(a.q_scale, 2); }, "q_scale:");
  expect_invalid([&](QuantizeArgs& a) { a.k_scale = shift(a.k_scale, 1); }, "k_scale:");
  expect_invalid([&](QuantizeArgs& a) { a.v_scale = shift(a.v_scale, 3); }, "v_scale:");
  // Scales are float32: 4-byte alignment is enough.
  QuantizeArgs a = valid_quantize_args();
  a.q_scale = shift(a.q_scale, 4);
  EXPECT_TRUE(flash3::validate(a).ok());
}

TEST(QuantizeValidation, Strides) {
  // Inputs: 2-byte elements, strides multiples of 8 elements.
  expect_invalid([](QuantizeArgs& a) { a.q.seq_stride += 4; }, "q.seq_stride:");
  expect_invalid([](QuantizeArgs& a) { a.k.head_stride = 132; }, "k.head_stride:");
  expect_invalid([](QuantizeArgs& a) { a.v.batch_stride += 1; }, "v.batch_stride:");
  expect_invalid([](QuantizeArgs& a) { a.q.head_stride = -128; }, "q.head_stride:");
  expect_invalid([](QuantizeArgs& a) { a.k.batch_stride = 0; }, "k.batch_stride:");
  expect_invalid([](QuantizeArgs& a) { a.v.seq_stride = int64_t(1) << 40; }, "v.seq_stride:");
  expect_invalid([](QuantizeArgs& a) { a.q.dim_stride = 2; }, "q.dim_stride:");
  expect_invalid([](QuantizeArgs& a) { a.k.dim_stride = 0; }, "k.dim_stride:");
  // Outputs: 1-byte elements, strides multiples of 16 elements.
  expect_invalid([](QuantizeArgs& a) { a.q_out.seq_stride += 8; }, "q_out.seq_stride:");
  expect_invalid([](QuantizeArgs& a) { a.k_out.head_stride = 136; }, "k_out.head_stride:");
  expect_invalid([](QuantizeArgs& a) { a.v_out.batch_stride += 8; }, "v_out.batch_stride:");
  expect_invalid([](QuantizeArgs& a) { a.q_out.seq_stride = -1024; }, "q_out.seq_stride:");
  expect_invalid([](QuantizeArgs& a) { a.v_out.dim_stride = -1; }, "v_out.dim_stride:");
  // An output must not overlap itself (inputs may).
  expect_invalid([](QuantizeArgs& a) { a.q_out.seq_stride = 16; }, "q_out.seq_stride:");
  expect_invalid([](QuantizeArgs& a) { a.k_out.head_stride = 64; }, "k_out.head_stride:");
  expect_invalid([](QuantizeArgs& a) { a.v_out.batch_stride = 100 * a.v_out.seq_stride; }, "v_out.batch_stride:");
  {
    QuantizeArgs a = valid_quantize_args();
    a.q.seq_stride = a.k.head_stride = 8;
    EXPECT_TRUE(flash3::validate(a).ok()) << flash3::validate(a).message();
  }
  // A multiple of 8 elements is enough for a 2-byte input, not for a 1-byte output.
  {
    QuantizeArgs a = valid_quantize_args();
    a.q.seq_stride = a.heads_q * a.head_dim + 8;
    EXPECT_TRUE(flash3::validate(a).ok());
  }
  // 64-bit offsets: a tensor may not span 2^62 elements.
  expect_invalid([](QuantizeArgs& a) { a.batch = 1 << 24, a.seqlen_q = 1, a.q.batch_stride = (int64_t(1) << 39) - 16; },
                 "q:");
  // Strides of modes of one index are never used.
  QuantizeArgs a = valid_quantize_args();
  a.heads_q = a.heads_kv = 1;
  a.q.head_stride = a.k_out.head_stride = -3;
  a.batch = 1;
  a.v.batch_stride = 0;
  EXPECT_TRUE(flash3::validate(a).ok());
  // Packed QKV ([b, s, 3, h, d]) inputs are fine.
  QuantizeArgs p = valid_quantize_args();
  p.seqlen_q = p.seqlen_k = 64;
  p.heads_q = p.heads_kv = 4;
  p.q = {reinterpret_cast<const void*>(0x10000), 64 * 3 * 4 * 128, 3 * 4 * 128, 128, 1};
  p.k = p.q, p.k.data = reinterpret_cast<const void*>(0x10000 + 4 * 128 * 2);
  p.v = p.q, p.v.data = reinterpret_cast<const void*>(0x10000 + 2 * 4 * 128 * 2);
  p.q_out = flash3::contiguous<void*>(p.q_out.data, 64, 4, 128);
  p.k_out = flash3::contiguous<void*>(p.k_out.data, 64, 4, 128);
  p.v_out = flash3::contiguous<void*>(p.v_out.data, 64, 4, 128);
  EXPECT_TRUE(flash3::validate(p).ok()) << flash3::validate(p).message();
}

TEST(QuantizeValidation, EmptyProblemsAreValidNoOps) {
  QuantizeArgs a = valid_quantize_args();
  a.batch = 0;
  a.q = {}, a.k = {}, a.v = {}, a.q_out = {}, a.k_out = {}, a.v_out = {};
  a.q_scale = a.k_scale = a.v_scale = nullptr;
  EXPECT_TRUE(flash3::validate(a).ok());

  // No queries: Q's pointers are not looked at, K's and V's are.
  QuantizeArgs b = valid_quantize_args();
  b.seqlen_q = 0;
  b.q = {}, b.q_out = {}, b.q_scale = nullptr;
  EXPECT_TRUE(flash3::validate(b).ok());
  b.k.data = nullptr;
  EXPECT_EQ(flash3::validate(b).message().rfind("k.data:", 0), 0u);

  QuantizeArgs c = valid_quantize_args();
  c.seqlen_k = 0;
  c.k = {}, c.v = {}, c.k_out = {}, c.v_out = {}, c.k_scale = c.v_scale = nullptr;
  EXPECT_TRUE(flash3::validate(c).ok());
  c.q_scale = nullptr;
  EXPECT_EQ(flash3::validate(c).message().rfind("q_scale:", 0), 0u);
}

TEST(QuantizeValidation, EmptyQuantizeDoesNotTouchTheDevice) {
  // Nothing to read or write (no batch, or neither queries nor keys): ok
  // without querying the device. The arguments are still validated first.
  QuantizeArgs a = valid_quantize_args();
  a.batch = 0;
  QuantizeArgs b = valid_quantize_args();
  b.seqlen_q = b.seqlen_k = 0;
  for (QuantizeArgs& empty : {std::ref(a), std::ref(b)}) {
    Status s = flash3::quantize_fp8(empty, nullptr);
    EXPECT_TRUE(s.ok()) << s.message();
    empty.head_dim = 96;
    s = flash3::quantize_fp8(empty, nullptr);
    EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
    EXPECT_EQ(s.message().rfind("head_dim:", 0), 0u) << s.message();
  }
}

// ---------------------------------------------------------------- e4m3

TEST(E4M3, KnownValues) {
  struct Known {
    float x;
    uint8_t bits;
  };
  float const sub = std::ldexp(1.0f, -9);  // smallest subnormal
  Known const known[] = {
      {0.0f, 0x00},
      {-0.0f, 0x80},
      {1.0f, 0x38},
      {-1.0f, 0xB8},
      {1.125f, 0x39},
      {448.0f, 0x7E},
      {-448.0f, 0xFE},
      {416.0f, 0x7D},
      {240.0f, 0x77},
      {std::ldexp(1.0f, -6), 0x08},  // smallest normal
      {sub, 0x01},
      {-sub, 0x81},
      {7 * sub, 0x07},
      {3 * sub, 0x03},
      // Ties go to the even encoding.
      {1.0625f, 0x38},              // between 1 (0x38) and 1.125 (0x39)
      {1.1875f, 0x3A},              // between 1.125 (0x39) and 1.25 (0x3A)
      {-1.1875f, 0xBA},
      {0.5f * sub, 0x00},           // between 0 and the smallest subnormal
      {1.5f * sub, 0x02},           // between 0x01 and 0x02
      {2.5f * sub, 0x02},           // between 0x02 and 0x03
      {7.5f * sub, 0x08},           // between the largest subnormal and the smallest normal
      {432.0f, 0x7E},               // between 416 (0x7D) and 448 (0x7E)
      {240.0f + 8.0f, 0x78},        // between 240 (0x77) and 256 (0x78): to even
      // Not ties.
      {0.5001f * sub, 0x01},
      {0.4999f * sub, 0x00},
      {1.0626f, 0x39},
      {1e-30f, 0x00},
      {-1e-30f, 0x80},
      {std::numeric_limits<float>::denorm_min(), 0x00},
      // Saturation.
      {449.0f, 0x7E},
      {464.0f, 0x7E},
      {500.0f, 0x7E},
      {1e30f, 0x7E},
      {-1e30f, 0xFE},
      {std::numeric_limits<float>::infinity(), 0x7E},
      {-std::numeric_limits<float>::infinity(), 0xFE},
      {std::numeric_limits<float>::quiet_NaN(), 0x7F},
      {-std::numeric_limits<float>::quiet_NaN(), 0x7F},
  };
  for (Known const& k : known) {
    EXPECT_EQ(int(float_to_e4m3(k.x)), int(k.bits)) << k.x;
  }
  EXPECT_EQ(e4m3_to_float(0x7E), 448.0f);
  EXPECT_EQ(e4m3_to_float(0xFE), -448.0f);
  EXPECT_EQ(e4m3_to_float(0x01), sub);
  EXPECT_EQ(e4m3_to_float(0x08), std::ldexp(1.0f, -6));
  EXPECT_EQ(e4m3_to_float(0x38), 1.0f);
  EXPECT_TRUE(std::signbit(e4m3_to_float(0x80)));
  EXPECT_TRUE(std::isnan(e4m3_to_float(0x7F)));
  EXPECT_TRUE(std::isnan(e4m3_to_float(0xFF)));
}

TEST(E4M3, RoundTripsEveryEncoding) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7F) == 0x7F) continue;  // NaN
    EXPECT_EQ(int(float_to_e4m3(e4m3_to_float(uint8_t(c)))), c);
  }
  // Increasing over the non-negative encodings.
  for (int c = 1; c < 0x7F; ++c) EXPECT_LT(e4m3_to_float(uint8_t(c - 1)), e4m3_to_float(uint8_t(c)));
}

// Against a brute-force nearest-encoding search, ties to the even encoding
// (the even mantissa), on random and on midpoint values.
TEST(E4M3, MatchesNearestEncodingSearch) {
  auto nearest = [](float x) -> int {
    float const a = std::fabs(x);
    if (a >= 448.0f) return 0x7E;
    int best = 0;
    double best_err = INFINITY;
    for (int c = 0; c <= 0x7E; ++c) {
      double const err = std::fabs(double(e4m3_to_float(uint8_t(c))) - double(a));
      if (err < best_err || (err == best_err && (c & 1) == 0)) {
        best = c;
        best_err = err;
      }
    }
    return best;
  };
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> exponent(-14.0f, 9.5f);
  std::vector<float> xs;
  for (int i = 0; i < 20000; ++i) xs.push_back((rng() & 1 ? 1.0f : -1.0f) * std::exp2(exponent(rng)));
  for (int c = 0; c < 0x7E; ++c) {
    float const mid = 0.5f * (e4m3_to_float(uint8_t(c)) + e4m3_to_float(uint8_t(c + 1)));  // exact
    xs.push_back(mid);
    xs.push_back(std::nextafter(mid, 0.0f));
    xs.push_back(std::nextafter(mid, 1000.0f));
  }
  for (float x : xs) {
    int const expected = nearest(x) | (std::signbit(x) ? 0x80 : 0);
    ASSERT_EQ(int(float_to_e4m3(x)), expected) << x;
  }
}

// ---------------------------------------------------------------- Hadamard

std::vector<float> random_row(int64_t d, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(d);
  for (float& v : x) v = normal(rng);
  return x;
}

double dot(std::vector<float> const& a, std::vector<float> const& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += double(a[i]) * double(b[i]);
  return s;
}

TEST(Hadamard, IsOrthogonal) {
  std::mt19937 rng(1);
  for (int64_t d : {64, 128, 256}) {
    for (uint64_t seed : {uint64_t(0), uint64_t(42), ~uint64_t(0)}) {
      std::vector<float> x = random_row(d, rng), y = random_row(d, rng);
      x[3] = 40.0f;  // an outlier
      std::vector<float> xm = x, ym = y;
      flash3::reference::hadamard_rotate(xm.data(), d, seed);
      flash3::reference::hadamard_rotate(ym.data(), d, seed);
      double const scale = std::sqrt(dot(x, x) * dot(y, y));
      EXPECT_NEAR(dot(xm, ym), dot(x, y), 1e-5 * scale) << d;
      EXPECT_NEAR(dot(xm, xm), dot(x, x), 1e-5 * dot(x, x)) << d;
      // The outlier is spread: no entry of x M is above |x| / sqrt(d) * a few.
      float m = 0;
      for (float v : xm) m = std::max(m, std::fabs(v));
      EXPECT_LT(m, 0.5f * 40.0f) << d;
    }
  }
}

TEST(Hadamard, MatchesTheMatrixProduct) {
  std::mt19937 rng(2);
  for (int64_t d : {64, 128, 256}) {
    uint64_t const seed = 1234567;
    std::vector<float> x = random_row(d, rng);
    std::vector<float> fast = x;
    flash3::reference::hadamard_rotate(fast.data(), d, seed);
    for (int64_t j = 0; j < d; ++j) {
      // (x M)_j = sum_i x_i s_i H_ij / sqrt(d), H_ij = (-1)^popcount(i & j).
      double s = 0;
      for (int64_t i = 0; i < d; ++i) {
        double const sign = flash3::quant::hadamard_sign_negative(seed, i) ? -1.0 : 1.0;
        double const h = (__builtin_popcountll(uint64_t(i & j)) & 1) != 0 ? -1.0 : 1.0;
        s += double(x[i]) * sign * h;
      }
      s /= std::sqrt(double(d));
      EXPECT_NEAR(fast[j], s, 1e-5) << "d " << d << " column " << j;
    }
  }
}

TEST(Hadamard, SignFreeTransformIsItsOwnInverse) {
  std::mt19937 rng(3);
  for (int64_t d : {64, 128, 256}) {
    std::vector<float> x = random_row(d, rng);
    std::vector<float> y = x;
    float const norm = flash3::quant::hadamard_norm(d);
    EXPECT_NEAR(norm, 1.0 / std::sqrt(double(d)), 1e-8);
    for (int pass = 0; pass < 2; ++pass) {
      flash3::reference::fwht(y.data(), d);
      for (float& v : y) v *= norm;
    }
    for (int64_t i = 0; i < d; ++i) EXPECT_NEAR(y[i], x[i], 1e-5) << d;
  }
  // Unnormalized H on a unit vector: row i of H.
  std::vector<float> e(8, 0.0f);
  e[5] = 1.0f;
  flash3::reference::fwht(e.data(), 8);
  for (int j = 0; j < 8; ++j) EXPECT_EQ(e[j], (__builtin_popcount(unsigned(5 & j)) & 1) ? -1.0f : 1.0f) << j;
}

TEST(Hadamard, SignsDependOnTheSeedAlone) {
  int differ = 0, negative = 0;
  for (int64_t i = 0; i < 256; ++i) {
    bool const s = flash3::quant::hadamard_sign_negative(99, i);
    EXPECT_EQ(s, flash3::quant::hadamard_sign_negative(99, i));
    differ += s != flash3::quant::hadamard_sign_negative(100, i);
    negative += s;
  }
  EXPECT_GT(differ, 64);
  EXPECT_GT(negative, 80);
  EXPECT_LT(negative, 176);
  // The same seed gives the same transform, bit for bit.
  std::mt19937 rng(4);
  std::vector<float> x = random_row(128, rng);
  std::vector<float> a = x, b = x, c = x;
  flash3::reference::hadamard_rotate(a.data(), 128, 5);
  flash3::reference::hadamard_rotate(b.data(), 128, 5);
  flash3::reference::hadamard_rotate(c.data(), 128, 6);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

// ---------------------------------------------------------------- scales

TEST(Fp8Scales, Count) {
  using flash3::fp8_scale_count;
  EXPECT_EQ(fp8_scale_count(ScaleGranularity::kPerTensor, 3, 5, 7, 128), 1);
  EXPECT_EQ(fp8_scale_count(ScaleGranularity::kPerHead, 3, 5, 7, 128), 15);
  EXPECT_EQ(fp8_scale_count(ScaleGranularity::kPerBlock, 3, 5, 7, 128), 15);
  EXPECT_EQ(fp8_scale_count(ScaleGranularity::kPerBlock, 3, 5, 128, 128), 15);
  EXPECT_EQ(fp8_scale_count(ScaleGranularity::kPerBlock, 3, 5, 129, 128), 30);
  EXPECT_EQ(fp8_scale_count(ScaleGranularity::kPerBlock, 2, 4, 300, 64), 2 * 4 * 5);
  EXPECT_EQ(fp8_scale_count(ScaleGranularity::kPerBlock, 2, 4, 0, 64), 0);
  EXPECT_EQ(fp8_scale_count(ScaleGranularity::kPerBlock, 2, 4, 300, 0), 0);
  EXPECT_EQ(fp8_scale_count(ScaleGranularity::kPerHead, -1, 4, 300, 64), 0);
  for (int d : {64, 128, 256}) {
    flash3::Fp8BlockSizes const b = flash3::fp8_block_sizes(d);
    EXPECT_GT(b.q, 0) << d;
    EXPECT_GT(b.kv, 0) << d;
    for (auto g : {ScaleGranularity::kPerTensor, ScaleGranularity::kPerHead, ScaleGranularity::kPerBlock}) {
      EXPECT_EQ(flash3::reference::scale_count(g, 2, 3, 301, b.q), fp8_scale_count(g, 2, 3, 301, b.q));
    }
  }
  EXPECT_EQ(flash3::fp8_block_sizes(96).q, 0);
}

TEST(Fp8Scales, FromAmax) {
  using flash3::quant::scale_from_amax;
  EXPECT_EQ(scale_from_amax(0.0f), 1.0f);
  EXPECT_EQ(scale_from_amax(448.0f), 1.0f);
  EXPECT_EQ(scale_from_amax(896.0f), 2.0f);
  EXPECT_EQ(scale_from_amax(1.0f), 1.0f / 448.0f);
  // amax / 448 subnormal: the smallest normal, so that 1 / scale is finite.
  EXPECT_EQ(scale_from_amax(1e-37f), FLT_MIN);
  EXPECT_TRUE(std::isfinite(flash3::quant::inverse_scale(scale_from_amax(1e-37f))));
  EXPECT_EQ(flash3::quant::flush_subnormal(1e-40f), 0.0f);
  EXPECT_TRUE(std::signbit(flash3::quant::flush_subnormal(-1e-40f)));
  EXPECT_EQ(flash3::quant::flush_subnormal(FLT_MIN), FLT_MIN);
}

// ---------------------------------------------------------------- quantize_cpu

struct Tensor {
  int64_t batch, seqlen, heads, head_dim;
  std::vector<float> x;
  float& at(int64_t b, int64_t s, int64_t h, int64_t i) { return x[((b * seqlen + s) * heads + h) * head_dim + i]; }
};

Tensor random_tensor(int64_t batch, int64_t seqlen, int64_t heads, int64_t d, std::mt19937& rng) {
  Tensor t{batch, seqlen, heads, d, {}};
  std::normal_distribution<float> normal(0.0f, 1.0f);
  t.x.resize(batch * seqlen * heads * d);
  for (float& v : t.x) v = normal(rng);
  return t;
}

TEST(QuantizeCpu, PerBlockScalesAndValues) {
  std::mt19937 rng(5);
  int64_t const block = 64;
  Tensor t = random_tensor(2, 150, 3, 64, rng);  // 3 blocks, the last of 22 rows
  t.at(1, 70, 2, 5) = -300.0f;                    // block 1 of (b 1, h 2)
  for (int64_t s = 128; s < 150; ++s)             // block 2 of (b 0, h 1): zeros
    for (int64_t i = 0; i < 64; ++i) t.at(0, s, 1, i) = 0.0f;
  std::vector<uint8_t> out(t.x.size(), 0xAA);
  int64_t const n = flash3::reference::scale_count(ScaleGranularity::kPerBlock, 2, 3, 150, block);
  ASSERT_EQ(n, 18);
  std::vector<float> scale(n, -1.0f);
  flash3::reference::quantize_tensor_cpu(2, 150, 3, 64, ScaleGranularity::kPerBlock, block, false, 0, t.x.data(),
                                         out.data(), scale.data());
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t h = 0; h < 3; ++h) {
      for (int64_t k = 0; k < 3; ++k) {
        float amax = 0;
        for (int64_t s = k * block; s < std::min<int64_t>(150, (k + 1) * block); ++s)
          for (int64_t i = 0; i < 64; ++i) amax = std::max(amax, std::fabs(t.at(b, s, h, i)));
        float const expected = amax == 0 ? 1.0f : amax / 448.0f;
        EXPECT_EQ(scale[(b * 3 + h) * 3 + k], expected) << b << " " << h << " " << k;
      }
    }
  }
  EXPECT_EQ(scale[(1 * 3 + 2) * 3 + 1], 300.0f / 448.0f);
  EXPECT_EQ(scale[(0 * 3 + 1) * 3 + 2], 1.0f);
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t s = 0; s < 150; ++s) {
      for (int64_t h = 0; h < 3; ++h) {
        float const sc = scale[(b * 3 + h) * 3 + s / block];
        for (int64_t i = 0; i < 64; ++i) {
          size_t const o = ((b * 150 + s) * 3 + h) * 64 + i;
          float const x = t.x[o];
          EXPECT_EQ(out[o], float_to_e4m3(x * (1.0f / sc)));
          // e4m3 keeps 3 mantissa bits: within 2^-4 relative, or a subnormal step.
          EXPECT_NEAR(e4m3_to_float(out[o]) * sc, x, std::fabs(x) / 16 + sc * std::ldexp(1.0f, -10));
        }
      }
    }
  }
  EXPECT_EQ(out[((1 * 150 + 70) * 3 + 2) * 64 + 5], 0xFE);  // the block's amax is -448
}

TEST(QuantizeCpu, PerHeadAndPerTensor) {
  std::mt19937 rng(6);
  Tensor t = random_tensor(2, 9, 4, 128, rng);
  t.at(0, 3, 1, 100) = 7.0f;
  t.at(1, 8, 3, 0) = -9.0f;
  std::vector<uint8_t> out(t.x.size());
  std::vector<float> head(8), tensor(1);
  flash3::reference::quantize_tensor_cpu(2, 9, 4, 128, ScaleGranularity::kPerHead, 0, false, 0, t.x.data(),
                                         out.data(), head.data());
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t h = 0; h < 4; ++h) {
      float amax = 0;
      for (int64_t s = 0; s < 9; ++s)
        for (int64_t i = 0; i < 128; ++i) amax = std::max(amax, std::fabs(t.at(b, s, h, i)));
      EXPECT_EQ(head[b * 4 + h], amax / 448.0f);
    }
  }
  flash3::reference::quantize_tensor_cpu(2, 9, 4, 128, ScaleGranularity::kPerTensor, 0, false, 0, t.x.data(),
                                         out.data(), tensor.data());
  EXPECT_EQ(tensor[0], 9.0f / 448.0f);
  EXPECT_EQ(out[((1 * 9 + 8) * 4 + 3) * 128 + 0], 0xFE);
}

TEST(QuantizeCpu, HadamardSpreadsOutliersAndIsUndone) {
  std::mt19937 rng(8);
  int64_t const d = 128;
  Tensor t = random_tensor(1, 64, 2, d, rng);
  for (int64_t s = 0; s < 64; ++s) t.at(0, s, 0, 17) = 60.0f;  // an outlier channel
  std::vector<uint8_t> plain(t.x.size()), rotated(t.x.size());
  std::vector<float> plain_scale(2), rotated_scale(2);
  flash3::reference::quantize_tensor_cpu(1, 64, 2, d, ScaleGranularity::kPerHead, 0, false, 0, t.x.data(),
                                         plain.data(), plain_scale.data());
  flash3::reference::quantize_tensor_cpu(1, 64, 2, d, ScaleGranularity::kPerHead, 0, true, 77, t.x.data(),
                                         rotated.data(), rotated_scale.data());
  EXPECT_LT(rotated_scale[0], 0.5f * plain_scale[0]);  // the outlier is spread over the row
  // Dequantize, undo M (M^-1 = M^T = H diag(s) / sqrt(d)): x again, within
  // e4m3's precision.
  double err_plain = 0, err_rotated = 0, norm = 0;
  for (int64_t s = 0; s < 64; ++s) {
    std::vector<float> y(d);
    for (int64_t i = 0; i < d; ++i) y[i] = e4m3_to_float(rotated[(s * 2 + 0) * d + i]) * rotated_scale[0];
    flash3::reference::fwht(y.data(), d);
    for (int64_t i = 0; i < d; ++i) {
      float const back = y[i] * flash3::quant::hadamard_norm(d) * (flash3::quant::hadamard_sign_negative(77, i) ? -1 : 1);
      float const x = t.at(0, s, 0, i);
      float const p = e4m3_to_float(plain[(s * 2 + 0) * d + i]) * plain_scale[0];
      err_rotated += (back - x) * (back - x);
      err_plain += (p - x) * (p - x);
      norm += x * x;
    }
  }
  EXPECT_LT(std::sqrt(err_rotated / norm), 0.05);
  EXPECT_LT(std::sqrt(err_plain / norm), 0.05);
}

TEST(QuantizeCpu, QkvShapesAndVIsNeverTransformed) {
  std::mt19937 rng(9);
  flash3::reference::QuantizeShape s;
  s.batch = 2, s.seqlen_q = 7, s.seqlen_k = 300, s.heads_q = 4, s.heads_kv = 2, s.head_dim = 256;
  s.granularity = ScaleGranularity::kPerBlock;
  s.block_q = 128, s.block_kv = 64;
  s.hadamard = true, s.seed = 3;
  Tensor q = random_tensor(2, 7, 4, 256, rng), k = random_tensor(2, 300, 2, 256, rng),
         v = random_tensor(2, 300, 2, 256, rng);
  std::vector<uint8_t> qo(q.x.size()), ko(k.x.size()), vo(v.x.size());
  std::vector<float> qs(2 * 4 * 1), ks(2 * 2 * 5), vs(2 * 2 * 5);
  flash3::reference::quantize_cpu(s, q.x.data(), k.x.data(), v.x.data(), qo.data(), ko.data(), vo.data(), qs.data(),
                                  ks.data(), vs.data());
  std::vector<uint8_t> expect(vo.size());
  std::vector<float> expect_scale(vs.size());
  flash3::reference::quantize_tensor_cpu(2, 300, 2, 256, ScaleGranularity::kPerBlock, 64, false, 3, v.x.data(),
                                         expect.data(), expect_scale.data());
  EXPECT_EQ(vo, expect);
  EXPECT_EQ(vs, expect_scale);
  flash3::reference::quantize_tensor_cpu(2, 300, 2, 256, ScaleGranularity::kPerBlock, 64, true, 3, k.x.data(),
                                         expect.data(), expect_scale.data());
  EXPECT_EQ(ko, expect);
  EXPECT_EQ(ks, expect_scale);
  // Q's rows are rotated with the same signs as K's: row by row, x M quantized.
  std::vector<float> row(q.x.begin(), q.x.begin() + 256);
  flash3::reference::hadamard_rotate(row.data(), 256, 3);
  for (int64_t i = 0; i < 256; ++i) EXPECT_EQ(qo[i], float_to_e4m3(row[i] * (1.0f / qs[0])));
  // heads_kv must divide heads_q.
  s.heads_kv = 3;
  EXPECT_THROW(flash3::reference::quantize_cpu(s, q.x.data(), k.x.data(), v.x.data(), qo.data(), ko.data(),
                                               vo.data(), qs.data(), ks.data(), vs.data()),
               std::invalid_argument);
}

TEST(QuantizeCpu, TinyAndSubnormalGroups) {
  Tensor t{1, 2, 1, 64, std::vector<float>(128, 0.0f)};
  t.at(0, 0, 0, 3) = 1e-40f;   // a float32 subnormal (a bf16 can hold one): flushed, as by the kernel
  t.at(0, 1, 0, 3) = -2e-37f;  // normal, but amax / 448 is not: the scale is FLT_MIN
  std::vector<uint8_t> out(128);
  std::vector<float> scale(2);
  flash3::reference::quantize_tensor_cpu(1, 2, 1, 64, ScaleGranularity::kPerBlock, 1, false, 0, t.x.data(),
                                         out.data(), scale.data());
  EXPECT_EQ(scale[0], 1.0f);
  EXPECT_EQ(out[3], 0x00);
  EXPECT_EQ(scale[1], FLT_MIN);
  EXPECT_EQ(out[64 + 3], float_to_e4m3(-2e-37f / FLT_MIN));
  EXPECT_LE(e4m3_to_float(out[64 + 3]), -1.0f);
  // Bad shapes throw.
  EXPECT_THROW(flash3::reference::quantize_tensor_cpu(1, 2, 1, 96, ScaleGranularity::kPerHead, 0, false, 0,
                                                      t.x.data(), out.data(), scale.data()),
               std::invalid_argument);
  EXPECT_THROW(flash3::reference::quantize_tensor_cpu(1, 2, 1, 64, ScaleGranularity::kPerBlock, 0, false, 0,
                                                      t.x.data(), out.data(), scale.data()),
               std::invalid_argument);
}

}  // namespace
