// combine()'s host side, without a GPU: validate(CombineArgs) names each bad
// argument, and a call with nothing to write succeeds without a device.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>

#include "expect_invalid.h"
#include "flash3/flash3.h"

namespace {

using flash3::CombineArgs;
using flash3::Status;

// 3 splits of [2, 5, 4, 128] partials as FlashAttention-3 lays them out:
// O [splits, batch, seqlen, heads, d], the LSE [splits, batch, seqlen, heads]
// (its seqlen mode contiguous), into a bf16 O and a float32 LSE.
CombineArgs valid_combine_args() {
  CombineArgs a;
  a.num_splits = 3;
  a.batch = 2;
  a.seqlen = 5;
  a.heads = 4;
  a.head_dim = 128;
  a.o_partial = flash3::contiguous<const void*>(reinterpret_cast<const void*>(0x100000), 5, 4, 128);
  a.o_partial_split_stride = 2 * 5 * 4 * 128;
  a.lse_partial = reinterpret_cast<const float*>(0x200000);
  a.lse_split_stride = 2 * 4 * 5;
  a.lse_batch_stride = 4 * 5;
  a.lse_seq_stride = 1;
  a.lse_head_stride = 5;
  a.out_dtype = flash3::DType::kBF16;
  a.out = flash3::contiguous<void*>(reinterpret_cast<void*>(0x300000), 5, 4, 128);
  a.lse = reinterpret_cast<float*>(0x400000);
  return a;
}

void expect_invalid(std::function<void(CombineArgs&)> const& edit, std::string const& name) {
  flash3::testing::expect_invalid_args(valid_combine_args(), edit, name);
}

TEST(CombineValidation, ValidArgumentsPass) {
  EXPECT_TRUE(flash3::validate(valid_combine_args()).ok());
  CombineArgs a = valid_combine_args();
  a.out_dtype = flash3::DType::kFP32;
  a.lse = nullptr;
  a.num_splits = 128;
  EXPECT_TRUE(flash3::validate(a).ok());
}

TEST(CombineValidation, EachArgumentIsNamed) {
  expect_invalid([](CombineArgs& a) { a.num_splits = 0; }, "num_splits");
  expect_invalid([](CombineArgs& a) { a.num_splits = 129; }, "num_splits");
  expect_invalid([](CombineArgs& a) { a.batch = -1; }, "batch");
  expect_invalid([](CombineArgs& a) { a.seqlen = int64_t(1) << 31; }, "seqlen");
  expect_invalid([](CombineArgs& a) { a.heads = 0; }, "heads");
  expect_invalid([](CombineArgs& a) { a.head_dim = 126; }, "head_dim");
  expect_invalid([](CombineArgs& a) { a.batch = 1 << 20; a.seqlen = 1 << 20; }, "batch");
  expect_invalid([](CombineArgs& a) { a.out_dtype = flash3::DType::kE4M3; }, "out_dtype");
  expect_invalid([](CombineArgs& a) { a.o_partial.data = nullptr; }, "o_partial.data");
  expect_invalid([](CombineArgs& a) { a.o_partial.seq_stride = 130; }, "o_partial.seq_stride");
  expect_invalid([](CombineArgs& a) { a.o_partial_split_stride = 2; }, "o_partial_split_stride");
  expect_invalid([](CombineArgs& a) { a.lse_partial = nullptr; }, "lse_partial");
  expect_invalid([](CombineArgs& a) { a.lse_partial = reinterpret_cast<const float*>(0x200002); }, "lse_partial");
  expect_invalid([](CombineArgs& a) { a.lse_head_stride = -5; }, "lse_head_stride");
  expect_invalid([](CombineArgs& a) { a.out.data = nullptr; }, "out.data");
  expect_invalid([](CombineArgs& a) { a.out.head_stride = 64; }, "out.head_stride");  // overlaps itself
  expect_invalid([](CombineArgs& a) { a.lse = reinterpret_cast<float*>(0x400001); }, "lse");
  expect_invalid([](CombineArgs& a) { a.sinks = reinterpret_cast<const float*>(0x500003); }, "sinks");
}

// One split needs no stride between splits; a combine of nothing needs no tensor.
TEST(CombineValidation, DegenerateShapes) {
  CombineArgs a = valid_combine_args();
  a.num_splits = 1;
  a.o_partial_split_stride = 0;
  EXPECT_TRUE(flash3::validate(a).ok());
  a = CombineArgs{};
  a.num_splits = 2;
  a.heads = 8;
  a.head_dim = 64;
  EXPECT_TRUE(flash3::validate(a).ok());
  EXPECT_TRUE(flash3::combine(a, nullptr).ok());  // batch 0: nothing to write, no device touched
}

TEST(CombineValidation, CombineRejectsBeforeTouchingTheDevice) {
  CombineArgs a = valid_combine_args();
  a.head_dim = 3;
  EXPECT_EQ(flash3::combine(a, nullptr).code(), Status::Code::kInvalidArgument);
}

}  // namespace
