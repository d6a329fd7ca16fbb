// Every bad argument gets kInvalidArgument naming it, before any launch.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "expect_invalid.h"
#include "valid_args.h"
#include "flash3/flash3.h"

namespace {

using flash3::testing::as_packed;
using flash3::testing::valid_forward_args;
using flash3::testing::with_head_dims;

using flash3::ForwardArgs;
using flash3::Status;

// Dense rows of 8 heads of head dim `d` (K and V's 2 heads padded to 8): a
// layout valid for every head dim.
template <class Pointer>
void rows_of_8_heads(flash3::TensorRef<Pointer>& t, int64_t seqlen, int64_t d) {
  t = flash3::contiguous<Pointer>(t.data, seqlen, 8, d);
}

void set_head_dim(ForwardArgs& a, int d) {
  a.head_dim = d;
  for (auto* t : {&a.q, &a.k, &a.v}) rows_of_8_heads(*t, t == &a.q ? a.seqlen_q : a.seqlen_k, d);
  rows_of_8_heads(a.o, a.seqlen_q, d);
}

void expect_invalid(std::function<void(ForwardArgs&)> const& edit, std::string const& names) {
  flash3::testing::expect_invalid_args(valid_forward_args(), edit, names);
}

TEST(Validation, ValidArgumentsPass) {
  EXPECT_TRUE(flash3::validate(valid_forward_args()).ok());
}

TEST(Validation, EachHeadDimIsAccepted) {
  for (int d : {64, 96, 128, 192, 256}) {
    ForwardArgs a = valid_forward_args();
    set_head_dim(a, d);
    EXPECT_TRUE(flash3::validate(a).ok()) << d;
  }
}

TEST(Validation, Sizes) {
  expect_invalid([](ForwardArgs& a) { a.batch = -1; }, "batch");
  expect_invalid([](ForwardArgs& a) { a.seqlen_q = -5; }, "seqlen_q");
  expect_invalid([](ForwardArgs& a) { a.seqlen_k = -1; }, "seqlen_k");
  expect_invalid([](ForwardArgs& a) { a.seqlen_q = int64_t(1) << 31; }, "seqlen_q");
  expect_invalid([](ForwardArgs& a) { a.heads_q = 0; }, "heads_q");
  expect_invalid([](ForwardArgs& a) { a.heads_kv = 0; }, "heads_kv");
  expect_invalid([](ForwardArgs& a) { a.heads_kv = 3; }, "heads_kv");
  expect_invalid([](ForwardArgs& a) { a.batch = int64_t(1) << 30; }, "batch");
}

TEST(Validation, TileCountsDoNotWrap) {
  // batch * heads_q * seqlen / 64 = 2^84: a 64-bit product of the sizes wraps
  // (to 0 here), so the count must be bounded without forming it.
  expect_invalid(
      [](ForwardArgs& a) {
        a.batch = a.seqlen_q = a.seqlen_k = a.heads_q = a.heads_kv = int64_t(1) << 30;
        for (int64_t* s : {&a.q.batch_stride, &a.q.seq_stride, &a.q.head_stride, &a.k.batch_stride, &a.k.seq_stride,
                           &a.k.head_stride, &a.v.batch_stride, &a.v.seq_stride, &a.v.head_stride,
                           &a.o.batch_stride, &a.o.seq_stride, &a.o.head_stride}) {
          *s = 8;
        }
      },
      "batch");
  // Each of the two counts alone (heads_q * seqlen / 64 just past 2^31 - 1).
  expect_invalid([](ForwardArgs& a) { a.batch = 1, a.heads_q = 1 << 16, a.heads_kv = 1, a.seqlen_q = 1 << 21; }, "batch");
  expect_invalid([](ForwardArgs& a) { a.batch = 1, a.heads_q = 1 << 16, a.heads_kv = 1, a.seqlen_k = 1 << 21; }, "batch");
}

TEST(Validation, HeadDim) {
  for (int d : {0, 32, 80, 100, 160, 512, -64}) {
    expect_invalid([d](ForwardArgs& a) { a.head_dim = d; }, "head_dim");
  }
}

// V's head dim of its own: 0 (head_dim's), head_dim, or a pair's (192 /
// 128), with bf16 and fp16, the masks, softcapping, sinks and packed
// sequences; V and O are checked for V's head dim, Q and K for Q's.
TEST(Validation, ValueHeadDim) {
  for (flash3::DType dtype : {flash3::DType::kBF16, flash3::DType::kFP16}) {
    ForwardArgs a = with_head_dims(valid_forward_args(), 192, 128);
    a.dtype = dtype;
    EXPECT_TRUE(flash3::validate(a).ok()) << flash3::validate(a).message();
    a.causal = true;
    a.window_left = 50;
    a.softcap = 30.f;
    a.sinks = reinterpret_cast<const float*>(0x50000);
    EXPECT_TRUE(flash3::validate(a).ok()) << flash3::validate(a).message();
  }
  for (auto [d, dv] : {std::pair{128, 0}, std::pair{128, 128}, std::pair{192, 192}, std::pair{64, 64}}) {
    ForwardArgs const a = with_head_dims(valid_forward_args(), d, dv);
    EXPECT_TRUE(flash3::validate(a).ok()) << d << " " << dv << ": " << flash3::validate(a).message();
  }
  for (auto [d, dv] : {std::pair{128, 64}, std::pair{192, 64}, std::pair{192, 256}, std::pair{64, 128},
                       std::pair{256, 128}, std::pair{192, -128}}) {
    expect_invalid([d, dv](ForwardArgs& a) { a = with_head_dims(a, d, dv); }, "head_dim_v");
  }
  // O's rows must hold V's 128 columns (Q's 192 need not fit); with V's head
  // dim 192, O's rows of 128 overlap.
  expect_invalid(
      [](ForwardArgs& a) {
        a = with_head_dims(a, 192, 128);
        a.o = flash3::contiguous(a.o.data, a.seqlen_q, a.heads_q, 64);
      },
      "o.head_stride");
  expect_invalid(
      [](ForwardArgs& a) {
        a = with_head_dims(a, 192, 0);
        a.o = flash3::contiguous(a.o.data, a.seqlen_q, a.heads_q, 128);
      },
      "o.head_stride");
  expect_invalid([](ForwardArgs& a) { a = with_head_dims(a, 192, 128), a.v.dim_stride = 2; }, "v.dim_stride");
  // Packed sequences: one batch entry of the total rows.
  ForwardArgs a = with_head_dims(valid_forward_args(), 192, 128);
  a.varlen.cu_seqlens_q = reinterpret_cast<const int32_t*>(0xb0000);
  a.varlen.cu_seqlens_k = reinterpret_cast<const int32_t*>(0xb0100);
  a.varlen.total_q = a.seqlen_q;
  a.varlen.total_k = a.seqlen_k;
  EXPECT_TRUE(flash3::validate(a).ok()) << flash3::validate(a).message();
  // The ablation's variants are built at head dim 128 only.
  a = with_head_dims(valid_forward_args(), 192, 128);
  a.options.pingpong = false;
  EXPECT_EQ(flash3::validate(a).code(), Status::Code::kUnsupported);
  EXPECT_EQ(flash3::validate(a).message().rfind("options", 0), 0u) << flash3::validate(a).message();
}

TEST(Validation, DtypeAndScale) {
  expect_invalid([](ForwardArgs& a) { a.dtype = static_cast<flash3::DType>(7); }, "dtype");
  expect_invalid([](ForwardArgs& a) { a.softmax_scale = NAN; }, "softmax_scale");
  expect_invalid([](ForwardArgs& a) { a.softmax_scale = INFINITY; }, "softmax_scale");
  expect_invalid([](ForwardArgs& a) { a.softmax_scale = -0.125f; }, "softmax_scale");
}

// Windows: bounds of -1 (unbounded) or more; causal is a right bound of 0.
TEST(Validation, Windows) {
  expect_invalid([](ForwardArgs& a) { a.window_left = -2; }, "window_left");
  expect_invalid([](ForwardArgs& a) { a.window_right = -5; }, "window_right");
  expect_invalid([](ForwardArgs& a) { a.causal = true, a.window_right = 3; }, "window_right");
  // The ablation's variants have no window kernel; a window wider than the
  // sequences is none.
  ForwardArgs a = valid_forward_args();
  a.options.pingpong = false;
  a.window_left = 10;
  EXPECT_EQ(flash3::validate(a).code(), flash3::Status::Code::kUnsupported);
  a.window_left = a.seqlen_k;
  EXPECT_TRUE(flash3::validate(a).ok()) << flash3::validate(a).message();
}

// Softcapping: 0 (off) or a finite positive cap; with every kernel option.
TEST(Validation, Softcap) {
  expect_invalid([](ForwardArgs& a) { a.softcap = -1.f; }, "softcap");
  expect_invalid([](ForwardArgs& a) { a.softcap = NAN; }, "softcap");
  expect_invalid([](ForwardArgs& a) { a.softcap = INFINITY; }, "softcap");
  ForwardArgs a = valid_forward_args();
  a.softcap = 30.f;
  a.options.pingpong = false;
  EXPECT_TRUE(flash3::validate(a).ok()) << flash3::validate(a).message();
}

// FP8 inputs (1-byte elements) with per-block scales.
ForwardArgs valid_fp8_args() {
  ForwardArgs a = valid_forward_args();
  a.dtype = flash3::DType::kE4M3;
  a.fp8.granularity = flash3::ScaleGranularity::kPerBlock;
  a.fp8.q = reinterpret_cast<const float*>(0x50000);
  a.fp8.k = reinterpret_cast<const float*>(0x51000);
  a.fp8.v = reinterpret_cast<const float*>(0x52000);
  return a;
}

void expect_invalid_fp8(std::function<void(ForwardArgs&)> const& edit, std::string const& names) {
  flash3::testing::expect_invalid_args(valid_fp8_args(), edit, names);
}

TEST(Validation, Fp8) {
  EXPECT_TRUE(flash3::validate(valid_fp8_args()).ok());
  // Softcapping is bf16's and fp16's.
  ForwardArgs capped = valid_fp8_args();
  capped.softcap = 30.f;
  EXPECT_EQ(flash3::validate(capped).code(), flash3::Status::Code::kUnsupported);
  for (int d : {64, 256}) {
    ForwardArgs a = valid_fp8_args();
    set_head_dim(a, d);
    EXPECT_TRUE(flash3::validate(a).ok()) << d;
  }
  expect_invalid_fp8([](ForwardArgs& a) { a.head_dim = 96; }, "head_dim");
  expect_invalid_fp8([](ForwardArgs& a) { a.head_dim = 192; }, "head_dim");
  // No V head dim of its own in FP8: the pair 192 / 128 is bf16's and fp16's.
  expect_invalid_fp8([](ForwardArgs& a) { a = with_head_dims(a, 192, 128); }, "head_dim_v");
  expect_invalid_fp8([](ForwardArgs& a) { a = with_head_dims(a, 128, 64); }, "head_dim_v");
  EXPECT_TRUE(flash3::validate(with_head_dims(valid_fp8_args(), 128, 128)).ok());
  expect_invalid_fp8([](ForwardArgs& a) { a.fp8.q = nullptr; }, "fp8.q");
  expect_invalid_fp8([](ForwardArgs& a) { a.fp8.k = nullptr; }, "fp8.k");
  expect_invalid_fp8([](ForwardArgs& a) { a.fp8.v = reinterpret_cast<const float*>(0x52002); }, "fp8.v");
  expect_invalid_fp8([](ForwardArgs& a) { a.fp8.out_dtype = flash3::DType::kE4M3; }, "fp8.out_dtype");
  expect_invalid_fp8([](ForwardArgs& a) { a.fp8.granularity = static_cast<flash3::ScaleGranularity>(5); },
                     "fp8.granularity");
  // TMA: strides of 16 bytes are 16 e4m3 elements (O stays 16-bit).
  expect_invalid_fp8([](ForwardArgs& a) { a.q.seq_stride = a.heads_q * a.head_dim + 8; }, "q.seq_stride");
  expect_invalid_fp8([](ForwardArgs& a) { a.o.seq_stride = a.heads_q * a.head_dim + 4; }, "o.seq_stride");
  expect_invalid_fp8([](ForwardArgs& a) { a.v.data = reinterpret_cast<const void*>(0x30008); }, "v.data");
  // No keys: K and V's scales are not read.
  ForwardArgs a = valid_fp8_args();
  a.seqlen_k = 0;
  a.fp8.k = a.fp8.v = nullptr;
  EXPECT_TRUE(flash3::validate(a).ok());
}

TEST(Validation, KernelOptionsWithoutAKernel) {
  using flash3::DType;
  // Bit (pingpong | overlap << 1 | warp_specialization << 2) set: a kernel is
  // built for those options. Every technique on everywhere; the ablations at
  // head dim 128 only (header: KernelOptions).
  struct Built {
    DType dtype;
    int head_dim;
    DType out_dtype;
    unsigned options;
  };
  std::vector<Built> table = {{DType::kBF16, 128, DType::kBF16, 0xF8}, {DType::kE4M3, 128, DType::kBF16, 0xF0},
                              {DType::kE4M3, 128, DType::kFP16, 0x80}, {DType::kFP16, 128, DType::kFP16, 0x80}};
  for (int d : {64, 96, 192, 256}) {
    table.push_back({DType::kBF16, d, DType::kBF16, 0x80});
    table.push_back({DType::kFP16, d, DType::kFP16, 0x80});
  }
  for (int d : {64, 256}) {
    for (DType out : {DType::kBF16, DType::kFP16}) table.push_back({DType::kE4M3, d, out, 0x80});
  }
  for (Built const& b : table) {
    for (unsigned bits = 0; bits < 16; ++bits) {
      ForwardArgs a = b.dtype == DType::kE4M3 ? valid_fp8_args() : valid_forward_args();
      a.dtype = b.dtype;
      a.fp8.out_dtype = b.out_dtype;
      set_head_dim(a, b.head_dim);
      a.options.pingpong = bits & 1;
      a.options.intra_warpgroup_overlap = bits & 2;
      a.options.warp_specialization = bits & 4;
      a.options.persistent = bits & 8;  // any value
      SCOPED_TRACE("dtype " + std::to_string(int(b.dtype)) + ", head_dim " + std::to_string(b.head_dim) +
                   ", out_dtype " + std::to_string(int(b.out_dtype)) + ", options " + std::to_string(bits));
      Status const s = flash3::validate(a);
      if (b.options >> (bits & 7) & 1) {
        EXPECT_TRUE(s.ok()) << s.message();
        continue;
      }
      EXPECT_EQ(s.code(), Status::Code::kUnsupported);
      EXPECT_EQ(s.message().rfind("options:", 0), 0u) << s.message();
      // forward() gives the same answer without touching the device, for an
      // empty problem too.
      EXPECT_EQ(flash3::forward(a, nullptr).message(), s.message());
      a.batch = 0;
      EXPECT_EQ(flash3::validate(a).message(), s.message());
    }
  }
}

TEST(Validation, Fp8BlocksAndScaleCounts) {
  using flash3::ScaleGranularity;
  for (int d : {64, 128, 256}) {
    flash3::Fp8BlockSizes const b = flash3::fp8_block_sizes(d);
    // The kernels' tiles (fwd/tile_size.h).
    EXPECT_EQ(b.q, d == 64 ? 192 : 128) << d;
    EXPECT_EQ(b.kv, d == 64 ? 128 : d == 128 ? 192 : 96) << d;
  }
  EXPECT_EQ(flash3::fp8_block_sizes(96).q, 0);
  EXPECT_EQ(flash3::fp8_scale_count(ScaleGranularity::kPerTensor, 3, 4, 1000, 128), 1);
  EXPECT_EQ(flash3::fp8_scale_count(ScaleGranularity::kPerHead, 3, 4, 1000, 128), 12);
  EXPECT_EQ(flash3::fp8_scale_count(ScaleGranularity::kPerBlock, 3, 4, 1000, 128), 3 * 4 * 8);
  EXPECT_EQ(flash3::fp8_scale_count(ScaleGranularity::kPerBlock, 3, 4, 1024, 128), 3 * 4 * 8);
  EXPECT_EQ(flash3::fp8_scale_count(ScaleGranularity::kPerBlock, 3, 4, 0, 128), 0);
}

// FP8 over packed sequences (varlen): as_packed's, the longest sequence of
// 120 query and 100 key rows.
ForwardArgs valid_packed_fp8_args(int64_t head_dim = 128) {
  ForwardArgs a = valid_fp8_args();
  a.head_dim = head_dim;
  a.seqlen_q = 120;
  a.seqlen_k = 100;
  return as_packed(a);
}

TEST(Validation, VarlenFp8) {
  using flash3::DType;
  using flash3::ScaleGranularity;
  for (int d : {64, 128, 256}) {
    for (ScaleGranularity g : {ScaleGranularity::kPerTensor, ScaleGranularity::kPerHead, ScaleGranularity::kPerBlock}) {
      ForwardArgs a = valid_packed_fp8_args(d);
      a.fp8.granularity = g;
      SCOPED_TRACE("head_dim " + std::to_string(d) + ", granularity " + std::to_string(int(g)));
      EXPECT_TRUE(flash3::validate(a).ok()) << flash3::validate(a).message();
      a.causal = true;
      a.varlen.seqused_q = reinterpret_cast<const int32_t*>(0xb0200);
      a.varlen.seqused_k = reinterpret_cast<const int32_t*>(0xb0300);
      EXPECT_TRUE(flash3::validate(a).ok()) << flash3::validate(a).message();
      a.window_left = 64;
      EXPECT_TRUE(flash3::validate(a).ok()) << flash3::validate(a).message();
    }
  }
  // An fp16 O has no packed FP8 kernel: refused naming fp8.out_dtype, by
  // forward() too, before the device (an empty problem as well).
  ForwardArgs a = valid_packed_fp8_args();
  a.fp8.out_dtype = DType::kFP16;
  Status const s = flash3::validate(a);
  EXPECT_EQ(s.code(), Status::Code::kUnsupported);
  EXPECT_EQ(s.message().rfind("fp8.out_dtype", 0), 0u) << s.message();
  EXPECT_EQ(flash3::forward(a, nullptr).message(), s.message());
  a.varlen.total_q = 0;
  EXPECT_EQ(flash3::validate(a).message(), s.message());
  // Nor a technique switched off (the ablation's FP8 variants are fixed-length).
  a = valid_packed_fp8_args();
  a.options.pingpong = false;
  EXPECT_EQ(flash3::validate(a).code(), Status::Code::kUnsupported);
  EXPECT_EQ(flash3::validate(a).message().rfind("varlen", 0), 0u) << flash3::validate(a).message();
  auto expect_invalid_packed_fp8 = [](std::function<void(ForwardArgs&)> const& edit, std::string const& names) {
    flash3::testing::expect_invalid_args(valid_packed_fp8_args(), edit, names);
  };
  expect_invalid_packed_fp8([](ForwardArgs& a) { a.fp8.q = nullptr; }, "fp8.q");
  expect_invalid_packed_fp8([](ForwardArgs& a) { a.fp8.v = reinterpret_cast<const float*>(0x52002); }, "fp8.v");
  expect_invalid_packed_fp8([](ForwardArgs& a) { a.head_dim = 96; }, "head_dim");
  expect_invalid_packed_fp8([](ForwardArgs& a) { a.softcap = -1.f; }, "softcap");
  // The tensors' checks over the packed rows, with 1-byte elements (O's 2).
  expect_invalid_packed_fp8([](ForwardArgs& a) { a.k.seq_stride = a.heads_kv * a.head_dim + 8; }, "k.seq_stride");
  expect_invalid_packed_fp8([](ForwardArgs& a) { a.o.seq_stride = a.heads_q * a.head_dim + 4; }, "o.seq_stride");
  expect_invalid_packed_fp8([](ForwardArgs& a) { a.varlen.cu_seqlens_k = nullptr; }, "varlen.cu_seqlens_k");
  expect_invalid_packed_fp8([](ForwardArgs& a) { a.varlen.total_k = -1; }, "varlen.total_k");
}

TEST(Validation, VarlenFp8ScaleCounts) {
  using flash3::ScaleGranularity;
  // Packed sequences count their scales with batch the sequences and seqlen
  // the longest's (flash3.h, Varlen), not the packed rows.
  ForwardArgs const a = valid_packed_fp8_args();
  flash3::Fp8BlockSizes const b = flash3::fp8_block_sizes(a.head_dim);  // 128 query rows, 192 keys
  auto count = [&](ScaleGranularity g, int64_t heads, int64_t seqlen, int64_t block) {
    return flash3::fp8_scale_count(g, a.batch, heads, seqlen, block);
  };
  EXPECT_EQ(count(ScaleGranularity::kPerTensor, a.heads_q, a.seqlen_q, b.q), 1);
  EXPECT_EQ(count(ScaleGranularity::kPerHead, a.heads_kv, a.seqlen_k, b.kv), 3 * 2);
  EXPECT_EQ(count(ScaleGranularity::kPerBlock, a.heads_q, a.seqlen_q, b.q), 3 * 8 * 1);
  EXPECT_EQ(count(ScaleGranularity::kPerBlock, a.heads_kv, a.seqlen_k, b.kv), 3 * 2 * 1);
  // A longest sequence of 1000 rows: 8 query blocks of 128, 6 key blocks of 192.
  EXPECT_EQ(count(ScaleGranularity::kPerBlock, a.heads_q, 1000, b.q), 3 * 8 * 8);
  EXPECT_EQ(count(ScaleGranularity::kPerBlock, a.heads_kv, 1000, b.kv), 3 * 2 * 6);
}

TEST(Validation, Pointers) {
  expect_invalid([](ForwardArgs& a) { a.q.data = nullptr; }, "q.data");
  expect_invalid([](ForwardArgs& a) { a.k.data = nullptr; }, "k.data");
  expect_invalid([](ForwardArgs& a) { a.v.data = nullptr; }, "v.data");
  expect_invalid([](ForwardArgs& a) { a.o.data = nullptr; }, "o.data");
  expect_invalid([](ForwardArgs& a) { a.q.data = reinterpret_cast<const void*>(0x10008); }, "q.data");
  expect_invalid([](ForwardArgs& a) { a.o.data = reinterpret_cast<void*>(0x40002); }, "o.data");
  expect_invalid([](ForwardArgs& a) { a.lse = reinterpret_cast<float*>(0x50002); }, "lse");
  expect_invalid([](ForwardArgs& a) { a.sinks = reinterpret_cast<const float*>(0x50006); }, "sinks");
}

// The caller's tile counter is optional and needs only an int's alignment.
TEST(Validation, TileCounter) {
  ForwardArgs a = valid_forward_args();
  a.tile_counter = reinterpret_cast<int*>(0x60004);
  EXPECT_TRUE(flash3::validate(a).ok());
  expect_invalid([](ForwardArgs& a) { a.tile_counter = reinterpret_cast<int*>(0x60002); }, "tile_counter");
}

TEST(Validation, Strides) {
  expect_invalid([](ForwardArgs& a) { a.q.dim_stride = 2; }, "q.dim_stride");
  expect_invalid([](ForwardArgs& a) { a.v.dim_stride = 0; }, "v.dim_stride");
  expect_invalid([](ForwardArgs& a) { a.k.seq_stride = 260; }, "k.seq_stride");
  expect_invalid([](ForwardArgs& a) { a.q.head_stride = 129; }, "q.head_stride");
  expect_invalid([](ForwardArgs& a) { a.o.batch_stride = -1024; }, "o.batch_stride");
  expect_invalid([](ForwardArgs& a) { a.v.seq_stride = 0; }, "v.seq_stride");
  expect_invalid([](ForwardArgs& a) { a.k.batch_stride = int64_t(1) << 40; }, "k.batch_stride");
}

TEST(Validation, OutputMustNotOverlapItself) {
  // Rows 8 elements apart share 120 of their 128 elements.
  expect_invalid([](ForwardArgs& a) { a.o.seq_stride = 8; }, "o.seq_stride");
  expect_invalid([](ForwardArgs& a) { a.o.head_stride = 64; }, "o.head_stride");
  // Equal strides put two rows at one address.
  expect_invalid([](ForwardArgs& a) { a.o.head_stride = a.o.seq_stride; }, "o.head_stride");
  // The second batch starts inside the first one's 100 rows.
  expect_invalid([](ForwardArgs& a) { a.o.batch_stride = 50 * a.o.seq_stride; }, "o.batch_stride");
  expect_invalid_fp8([](ForwardArgs& a) { a.o.seq_stride = 16; }, "o.seq_stride");
  // Modes nest in any order, padded or not: [batch, heads, seqlen, head_dim] in memory.
  ForwardArgs a = valid_forward_args();
  a.o.seq_stride = a.head_dim;
  a.o.head_stride = a.seqlen_q * a.head_dim;
  a.o.batch_stride = a.heads_q * a.seqlen_q * a.head_dim + 64;
  EXPECT_TRUE(flash3::validate(a).ok()) << flash3::validate(a).message();
  // Inputs are only read: their rows may overlap.
  a = valid_forward_args();
  a.q.seq_stride = a.k.head_stride = 8;
  EXPECT_TRUE(flash3::validate(a).ok()) << flash3::validate(a).message();
  // A mode of one index steps nowhere.
  a = valid_forward_args();
  a.batch = 1;
  a.o.batch_stride = 8;
  EXPECT_TRUE(flash3::validate(a).ok()) << flash3::validate(a).message();
}

TEST(Validation, StridesOfSizeOneModesAreIgnored) {
  ForwardArgs a = valid_forward_args();
  a.batch = 1;
  a.q.batch_stride = 3;  // never used when there is one batch
  a.seqlen_q = 1;
  a.q.seq_stride = -7;
  EXPECT_TRUE(flash3::validate(a).ok());
}

TEST(Validation, EmptyProblemsAreValidNoOps) {
  ForwardArgs a = valid_forward_args();
  a.batch = 0;
  a.q.data = nullptr;  // nothing is read or written
  EXPECT_TRUE(flash3::validate(a).ok());
  a = valid_forward_args();
  a.seqlen_q = 0;
  a.o.data = nullptr;
  EXPECT_TRUE(flash3::validate(a).ok());
  a = valid_forward_args();
  a.seqlen_k = 0;  // no keys: O = 0, LSE = +inf; K and V are not read
  a.k.data = nullptr;
  EXPECT_TRUE(flash3::validate(a).ok());
}

TEST(Validation, EmptyForwardDoesNotTouchTheDevice) {
  // Nothing to compute: ok without querying the device, so also where there
  // is none (CI). The arguments are still validated first.
  for (auto const& empty : std::initializer_list<std::function<void(ForwardArgs&)>>{
           [](ForwardArgs& a) { a.batch = 0; }, [](ForwardArgs& a) { a.seqlen_q = 0; }}) {
    ForwardArgs a = valid_forward_args();
    empty(a);
    Status s = flash3::forward(a, nullptr);
    EXPECT_TRUE(s.ok()) << s.message();
    a.heads_kv = 3;
    s = flash3::forward(a, nullptr);
    EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
    EXPECT_EQ(s.message().rfind("heads_kv", 0), 0u) << s.message();
  }
}

TEST(Validation, ForwardRejectsBeforeTouchingTheDevice) {
  ForwardArgs a = valid_forward_args();
  a.head_dim = 100;
  Status s = flash3::forward(a, nullptr);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(s.message().rfind("head_dim", 0), 0u);
}

// ------------------------------------------------------------------ backward

flash3::BackwardArgs valid_backward_args() {
  ForwardArgs const f = valid_forward_args();
  flash3::BackwardArgs a;
  a.batch = f.batch;
  a.seqlen_q = f.seqlen_q;
  a.seqlen_k = f.seqlen_k;
  a.heads_q = f.heads_q;
  a.heads_kv = f.heads_kv;
  a.head_dim = f.head_dim;
  a.q = f.q;
  a.k = f.k;
  a.v = f.v;
  auto fake = [](uintptr_t addr) { return reinterpret_cast<void*>(addr); };
  a.o = flash3::contiguous<const void*>(fake(0x40000), a.seqlen_q, a.heads_q, a.head_dim);
  a.dout = flash3::contiguous<const void*>(fake(0x50000), a.seqlen_q, a.heads_q, a.head_dim);
  a.lse = reinterpret_cast<const float*>(0x60000);
  a.dq = flash3::contiguous<void*>(fake(0x70000), a.seqlen_q, a.heads_q, a.head_dim);
  a.dk = flash3::contiguous<void*>(fake(0x80000), a.seqlen_k, a.heads_kv, a.head_dim);
  a.dv = flash3::contiguous<void*>(fake(0x90000), a.seqlen_k, a.heads_kv, a.head_dim);
  return a;
}

void expect_invalid_backward(std::function<void(flash3::BackwardArgs&)> const& edit, std::string const& names) {
  flash3::testing::expect_invalid_args(valid_backward_args(), edit, names);
}

TEST(BackwardValidation, ValidArgumentsPass) {
  EXPECT_TRUE(flash3::validate(valid_backward_args()).ok());
  for (int d : {64, 96, 192, 256}) {
    flash3::BackwardArgs a = valid_backward_args();
    a.head_dim = d;
    for (auto* t : {&a.q, &a.o, &a.dout}) rows_of_8_heads(*t, a.seqlen_q, d);
    for (auto* t : {&a.k, &a.v}) rows_of_8_heads(*t, a.seqlen_k, d);
    rows_of_8_heads(a.dq, a.seqlen_q, d);
    for (auto* t : {&a.dk, &a.dv}) rows_of_8_heads(*t, a.seqlen_k, d);
    EXPECT_TRUE(flash3::validate(a).ok()) << d;
  }
}

// As the forward's: V, O, dO and dV have V's head dim, Q, K, dQ and dK Q's;
// the workspace holds dV's per-head sums at V's.
TEST(BackwardValidation, ValueHeadDim) {
  for (flash3::DType dtype : {flash3::DType::kBF16, flash3::DType::kFP16}) {
    flash3::BackwardArgs a = with_head_dims(valid_backward_args(), 192, 128);
    a.dtype = dtype;
    EXPECT_TRUE(flash3::validate(a).ok()) << flash3::validate(a).message();
    a.causal = true;
    a.window_left = 50;
    a.softcap = 30.f;
    a.sinks = reinterpret_cast<const float*>(0x70000);
    a.dsinks = reinterpret_cast<float*>(0x70100);
    EXPECT_TRUE(flash3::validate(a).ok()) << flash3::validate(a).message();
  }
  for (auto [d, dv] : {std::pair{128, 64}, std::pair{192, 256}, std::pair{96, 128}}) {
    expect_invalid_backward([d, dv](flash3::BackwardArgs& a) { a = with_head_dims(a, d, dv); }, "head_dim_v");
  }
  // dK's rows hold Q/K's 192 columns, dV's V's 128.
  expect_invalid_backward(
      [](flash3::BackwardArgs& a) {
        a = with_head_dims(a, 192, 128);
        a.dk = flash3::contiguous(a.dk.data, a.seqlen_k, a.heads_kv, 128);
      },
      "dk.head_stride");
  expect_invalid_backward(
      [](flash3::BackwardArgs& a) {
        a = with_head_dims(a, 192, 128);
        a.dv = flash3::contiguous(a.dv.data, a.seqlen_k, a.heads_kv, 64);
      },
      "dv.head_stride");
  expect_invalid_backward([](flash3::BackwardArgs& a) { a = with_head_dims(a, 192, 128), a.dout.dim_stride = 0; },
                          "dout.dim_stride");
  // GQA's per-query-head sums: dV's at 128 columns, not 192.
  flash3::BackwardArgs const pair = with_head_dims(valid_backward_args(), 192, 128);
  flash3::BackwardArgs const same = with_head_dims(valid_backward_args(), 192, 0);
  EXPECT_GE(flash3::backward_workspace_size(same) - flash3::backward_workspace_size(pair),
            size_t(2 * 8 * 300 * 64 * 4));
}

TEST(BackwardValidation, SharedChecks) {
  expect_invalid_backward([](flash3::BackwardArgs& a) { a.batch = -1; }, "batch");
  expect_invalid_backward([](flash3::BackwardArgs& a) { a.heads_kv = 3; }, "heads_kv");
  expect_invalid_backward([](flash3::BackwardArgs& a) { a.head_dim = 80; }, "head_dim");
  expect_invalid_backward([](flash3::BackwardArgs& a) { a.softmax_scale = NAN; }, "softmax_scale");
  expect_invalid_backward([](flash3::BackwardArgs& a) { a.dtype = static_cast<flash3::DType>(9); }, "dtype");
  expect_invalid_backward([](flash3::BackwardArgs& a) { a.dtype = flash3::DType::kE4M3; }, "dtype");
}

TEST(BackwardValidation, TileCountsDoNotWrap) {
  expect_invalid_backward(
      [](flash3::BackwardArgs& a) {
        a.batch = a.seqlen_q = a.seqlen_k = a.heads_q = a.heads_kv = int64_t(1) << 30;
        for (auto* t : {&a.q, &a.k, &a.v, &a.o, &a.dout}) t->batch_stride = t->seq_stride = t->head_stride = 8;
        for (auto* t : {&a.dq, &a.dk, &a.dv}) t->batch_stride = t->seq_stride = t->head_stride = 8;
      },
      "batch");
}

// The grids' y and z extents bound the query heads and the batch (packed
// sequences: the sequences); the workspace size query says so too.
TEST(BackwardValidation, GridExtents) {
  expect_invalid_backward([](flash3::BackwardArgs& a) { a.batch = 65536; }, "batch");
  expect_invalid_backward([](flash3::BackwardArgs& a) { a.heads_q = a.heads_kv = 65536; }, "heads_q");
  flash3::BackwardArgs a = valid_backward_args();
  a.batch = 65536;
  size_t bytes = 1;
  EXPECT_EQ(flash3::backward_workspace_size(a, &bytes).code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(bytes, 0u);
}

TEST(BackwardValidation, TensorsOfTheBackward) {
  expect_invalid_backward([](flash3::BackwardArgs& a) { a.o.data = nullptr; }, "o.data");
  expect_invalid_backward([](flash3::BackwardArgs& a) { a.dout.data = nullptr; }, "dout.data");
  expect_invalid_backward([](flash3::BackwardArgs& a) { a.dout.seq_stride = 1001; }, "dout.seq_stride");
  expect_invalid_backward([](flash3::BackwardArgs& a) { a.dq.data = nullptr; }, "dq.data");
  expect_invalid_backward([](flash3::BackwardArgs& a) { a.dq.dim_stride = 2; }, "dq.dim_stride");
  expect_invalid_backward([](flash3::BackwardArgs& a) { a.dk.head_stride = 12; }, "dk.head_stride");
  expect_invalid_backward([](flash3::BackwardArgs& a) { a.dv.batch_stride = -8; }, "dv.batch_stride");
  expect_invalid_backward([](flash3::BackwardArgs& a) { a.dv.data = reinterpret_cast<void*>(0x90004); }, "dv.data");
  expect_invalid_backward([](flash3::BackwardArgs& a) { a.lse = nullptr; }, "lse");
  expect_invalid_backward([](flash3::BackwardArgs& a) { a.lse = reinterpret_cast<const float*>(0x60002); }, "lse");
  expect_invalid_backward([](flash3::BackwardArgs& a) { a.workspace = reinterpret_cast<void*>(0xa0010); },
                          "workspace");
  expect_invalid_backward([](flash3::BackwardArgs& a) { a.sinks = reinterpret_cast<const float*>(0x70001); },
                          "sinks");
}

// The backward takes the forward's window, checked as the forward's.
TEST(BackwardValidation, Windows) {
  flash3::BackwardArgs a = valid_backward_args();
  a.window_left = 10;
  a.window_right = 0;
  EXPECT_TRUE(flash3::validate(a).ok());
  expect_invalid_backward([](flash3::BackwardArgs& a) { a.window_right = -3; }, "window_right");
  expect_invalid_backward([](flash3::BackwardArgs& a) { a.causal = true, a.window_right = 2; }, "window_right");
}

TEST(BackwardValidation, Softcap) {
  flash3::BackwardArgs a = valid_backward_args();
  a.softcap = 50.f;
  EXPECT_TRUE(flash3::validate(a).ok());
  expect_invalid_backward([](flash3::BackwardArgs& a) { a.softcap = -0.5f; }, "softcap");
  expect_invalid_backward([](flash3::BackwardArgs& a) { a.softcap = NAN; }, "softcap");
}

// dsinks is the gradient of the sinks: it needs them, and a float's alignment.
TEST(BackwardValidation, SinkGradient) {
  expect_invalid_backward([](flash3::BackwardArgs& a) { a.dsinks = reinterpret_cast<float*>(0x70000); }, "dsinks");
  expect_invalid_backward(
      [](flash3::BackwardArgs& a) {
        a.sinks = reinterpret_cast<const float*>(0x70000);
        a.dsinks = reinterpret_cast<float*>(0x70102);
      },
      "dsinks");
  flash3::BackwardArgs a = valid_backward_args();
  a.sinks = reinterpret_cast<const float*>(0x70000);
  a.dsinks = reinterpret_cast<float*>(0x70100);
  EXPECT_TRUE(flash3::validate(a).ok()) << flash3::validate(a).message();
}

TEST(BackwardValidation, GradientsMustNotOverlapThemselves) {
  expect_invalid_backward([](flash3::BackwardArgs& a) { a.dq.seq_stride = 8; }, "dq.seq_stride");
  expect_invalid_backward([](flash3::BackwardArgs& a) { a.dk.head_stride = 64; }, "dk.head_stride");
  expect_invalid_backward([](flash3::BackwardArgs& a) { a.dv.batch_stride = 100 * a.dv.seq_stride; }, "dv.batch_stride");
  // O and dO are inputs here.
  flash3::BackwardArgs a = valid_backward_args();
  a.o.seq_stride = a.dout.head_stride = 8;
  EXPECT_TRUE(flash3::validate(a).ok()) << flash3::validate(a).message();
}

TEST(BackwardValidation, EmptyProblems) {
  flash3::BackwardArgs a = valid_backward_args();
  a.batch = 0;
  a.q.data = a.dq.data = nullptr;
  EXPECT_TRUE(flash3::validate(a).ok());
  EXPECT_EQ(flash3::backward_workspace_size(a), 0u);
  a = valid_backward_args();
  a.seqlen_q = 0;  // dK = dV = 0 are still written
  a.q.data = a.o.data = a.dout.data = a.dq.data = nullptr;
  a.lse = nullptr;
  EXPECT_TRUE(flash3::validate(a).ok());
  a.dk.data = nullptr;
  EXPECT_EQ(flash3::validate(a).code(), Status::Code::kInvalidArgument);
}

TEST(BackwardValidation, WorkspaceSize) {
  flash3::BackwardArgs a = valid_backward_args();
  size_t const base = flash3::backward_workspace_size(a);
  // dQ accumulator (2 x 8 heads x 128 padded rows x 128 fp32) plus LSE and D, plus per-query-head dK, dV (GQA).
  EXPECT_GE(base, size_t(2 * 8 * 128 * 128 * 4 + 2 * 2 * 8 * 128 * 4 + 2 * 2 * 8 * 300 * 128 * 4));
  a.heads_kv = a.heads_q;
  size_t const mha = flash3::backward_workspace_size(a);
  EXPECT_LT(mha, base);  // MHA writes dK, dV directly
  // Without the causal mask or deterministic mode, fp32 dK and dV sums for
  // the tiles of a split last wave: up to all 2 x 8 x div_up(300, 128) of them.
  a.causal = false;
  size_t const plain = flash3::backward_workspace_size(a);
  a.causal = true;
  size_t const causal = flash3::backward_workspace_size(a);
  EXPECT_GE(plain - causal, size_t(2 * 8 * 3) * 2 * 128 * 128 * 4);
  a.deterministic = true;  // its turns are the dQ tiles' arrival counts, which every mode has
  EXPECT_EQ(flash3::backward_workspace_size(a), causal);
}

TEST(BackwardValidation, EmptyBackwardDoesNotTouchTheDevice) {
  // No gradient to write (no batch, or neither queries nor keys): ok without
  // querying the device. The arguments are still validated first.
  for (auto const& empty : std::initializer_list<std::function<void(flash3::BackwardArgs&)>>{
           [](flash3::BackwardArgs& a) { a.batch = 0; },
           [](flash3::BackwardArgs& a) { a.seqlen_q = a.seqlen_k = 0; }}) {
    flash3::BackwardArgs a = valid_backward_args();
    empty(a);
    Status s = flash3::backward(a, nullptr);
    EXPECT_TRUE(s.ok()) << s.message();
    a.head_dim = 80;
    s = flash3::backward(a, nullptr);
    EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
    EXPECT_EQ(s.message().rfind("head_dim", 0), 0u) << s.message();
  }
}

// Sizes or head dims the workspace size cannot be computed for, and the
// argument each names.
std::vector<std::pair<std::function<void(flash3::BackwardArgs&)>, std::string>> bad_workspace_sizes() {
  return {{[](flash3::BackwardArgs& a) { a.seqlen_k = -1000; }, "seqlen_k"},
          {[](flash3::BackwardArgs& a) { a.seqlen_q = -5; }, "seqlen_q"},
          {[](flash3::BackwardArgs& a) { a.batch = -1; }, "batch"},
          {[](flash3::BackwardArgs& a) { a.heads_q = -8; }, "heads_q"},
          {[](flash3::BackwardArgs& a) { a.heads_kv = 3; }, "heads_kv"},
          {[](flash3::BackwardArgs& a) { a.head_dim = 80; }, "head_dim"},
          {[](flash3::BackwardArgs& a) { a.head_dim_v = 64; }, "head_dim_v"},
          {[](flash3::BackwardArgs& a) { a.batch = a.seqlen_q = a.heads_q = a.heads_kv = int64_t(1) << 30; }, "batch"}};
}

TEST(BackwardValidation, WorkspaceSizeOfInvalidSizesIsZero) {
  // Not a wrapped or meaningless size: 0, and backward() reports the argument.
  for (auto const& [edit, name] : bad_workspace_sizes()) {
    flash3::BackwardArgs a = valid_backward_args();
    edit(a);
    EXPECT_EQ(flash3::backward_workspace_size(a), 0u) << name;
  }
}

TEST(BackwardValidation, WorkspaceSizeWithStatus) {
  for (auto const& [edit, name] : bad_workspace_sizes()) {
    flash3::BackwardArgs a = valid_backward_args();
    edit(a);
    size_t bytes = 1;
    Status const s = flash3::backward_workspace_size(a, &bytes);
    EXPECT_EQ(s.code(), Status::Code::kInvalidArgument) << name;
    EXPECT_EQ(s.message().rfind(name, 0), 0u) << s.message();
    EXPECT_EQ(s.message(), flash3::validate(a).message());
    EXPECT_EQ(bytes, 0u) << name;
  }
  flash3::BackwardArgs a = valid_backward_args();
  size_t bytes = 0;
  EXPECT_TRUE(flash3::backward_workspace_size(a, &bytes).ok());
  EXPECT_EQ(bytes, flash3::backward_workspace_size(a));
  EXPECT_GT(bytes, 0u);
  // Only the sizes, head dim, mask and mode are read: no pointers needed yet.
  a.q.data = a.dq.data = nullptr;
  a.lse = nullptr;
  EXPECT_TRUE(flash3::backward_workspace_size(a, &bytes).ok());
  a.seqlen_q = 0;  // no query: dK = dV = 0 need no workspace
  bytes = 1;
  EXPECT_TRUE(flash3::backward_workspace_size(a, &bytes).ok());
  EXPECT_EQ(bytes, 0u);
  Status const s = flash3::backward_workspace_size(a, nullptr);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(s.message().rfind("bytes", 0), 0u) << s.message();
}

// Packed sequences (varlen): as_packed's.
flash3::BackwardArgs valid_packed_backward_args(int64_t head_dim = 128, int64_t head_dim_v = 0) {
  flash3::BackwardArgs a = valid_backward_args();
  a.head_dim = head_dim;
  a.head_dim_v = head_dim_v;
  return as_packed(a);
}

void expect_invalid_packed(std::function<void(flash3::BackwardArgs&)> const& edit, std::string const& names) {
  flash3::testing::expect_invalid_args(valid_packed_backward_args(), edit, names);
}

TEST(BackwardValidation, Varlen) {
  flash3::BackwardArgs a = valid_packed_backward_args();
  EXPECT_TRUE(flash3::validate(a).ok()) << flash3::validate(a).message();
  a.varlen.seqused_q = reinterpret_cast<const int32_t*>(0xb0200);
  a.varlen.seqused_k = reinterpret_cast<const int32_t*>(0xb0300);
  a.causal = true;
  a.window_left = 64;
  a.softcap = 30.f;
  a.deterministic = true;
  EXPECT_TRUE(flash3::validate(a).ok()) << flash3::validate(a).message();
  EXPECT_TRUE(flash3::validate(valid_packed_backward_args(192, 128)).ok())
      << flash3::validate(valid_packed_backward_args(192, 128)).message();
  expect_invalid_packed([](flash3::BackwardArgs& a) { a.varlen.cu_seqlens_k = nullptr; }, "varlen.cu_seqlens_k");
  expect_invalid_packed([](flash3::BackwardArgs& a) { a.varlen.cu_seqlens_q = nullptr; }, "varlen.cu_seqlens_q");
  expect_invalid_backward([](flash3::BackwardArgs& a) { a.varlen.seqused_k = reinterpret_cast<const int32_t*>(0xb0300); },
                          "varlen.cu_seqlens_q");
  expect_invalid_packed([](flash3::BackwardArgs& a) { a.varlen.cu_seqlens_q = reinterpret_cast<const int32_t*>(0xb0002); },
                        "varlen.cu_seqlens_q");
  expect_invalid_packed([](flash3::BackwardArgs& a) { a.varlen.seqused_q = reinterpret_cast<const int32_t*>(0xb0201); },
                        "varlen.seqused_q");
  expect_invalid_packed([](flash3::BackwardArgs& a) { a.varlen.total_q = -1; }, "varlen.total_q");
  expect_invalid_packed([](flash3::BackwardArgs& a) { a.varlen.total_k = int64_t(1) << 31; }, "varlen.total_k");
  // The tensors' checks over total rows.
  expect_invalid_packed([](flash3::BackwardArgs& a) { a.dq.seq_stride = 8; }, "dq.seq_stride");
  expect_invalid_packed([](flash3::BackwardArgs& a) { a.dk.data = nullptr; }, "dk.data");
  expect_invalid_packed([](flash3::BackwardArgs& a) { a.dout.head_stride = 12; }, "dout.head_stride");
  expect_invalid_packed([](flash3::BackwardArgs& a) { a.lse = nullptr; }, "lse");
  expect_invalid_packed([](flash3::BackwardArgs& a) { a.lse = reinterpret_cast<const float*>(0x60002); }, "lse");
  expect_invalid_packed([](flash3::BackwardArgs& a) { a.dtype = flash3::DType::kE4M3; }, "dtype");
  // No query row in any sequence: only dK and dV (zeros) to write.
  a = valid_packed_backward_args();
  a.varlen.total_q = 0;
  a.q.data = a.o.data = a.dout.data = a.dq.data = nullptr;
  a.lse = nullptr;
  EXPECT_TRUE(flash3::validate(a).ok()) << flash3::validate(a).message();
  a.dv.data = nullptr;
  EXPECT_EQ(flash3::validate(a).code(), Status::Code::kInvalidArgument);
}

TEST(BackwardValidation, VarlenWorkspaceSize) {
  // The workspace's rows: each sequence from a block of its own, bounded
  // from total_q and the batch alone (the lengths are on the device).
  flash3::BackwardArgs a = valid_packed_backward_args();
  size_t const bytes = flash3::backward_workspace_size(a);
  int64_t const block_m = 64;  // head dim 128
  int64_t const rows = (a.varlen.total_q / block_m + a.batch) * block_m;
  EXPECT_GE(bytes, size_t(a.heads_q * rows * a.head_dim * 4 + 2 * a.heads_q * rows * 4 +
                          2 * a.heads_q * a.varlen.total_k * a.head_dim * 4));
  // Independent of the longest sequence's lengths, the mask and pointers.
  a.seqlen_q = 7;
  a.seqlen_k = 9;
  a.causal = !a.causal;
  a.q.data = nullptr;
  EXPECT_EQ(flash3::backward_workspace_size(a), bytes);
  a.varlen.total_q = 0;  // no query row
  EXPECT_EQ(flash3::backward_workspace_size(a), 0u);
  a = valid_packed_backward_args();
  a.varlen.total_k = -3;
  size_t out = 1;
  Status const s = flash3::backward_workspace_size(a, &out);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(s.message().rfind("varlen.total_k", 0), 0u) << s.message();
  EXPECT_EQ(out, 0u);
}

TEST(BackwardValidation, EmptyVarlenBackwardDoesNotTouchTheDevice) {
  flash3::BackwardArgs a = valid_packed_backward_args();
  a.varlen.total_q = a.varlen.total_k = 0;
  Status const s = flash3::backward(a, nullptr);
  EXPECT_TRUE(s.ok()) << s.message();
}

TEST(BackwardValidation, BackwardRejectsBeforeTouchingTheDevice) {
  flash3::BackwardArgs a = valid_backward_args();
  a.dk.data = nullptr;
  Status s = flash3::backward(a, nullptr);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(s.message().rfind("dk.data", 0), 0u);
}

}  // namespace
