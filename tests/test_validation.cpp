// Every bad argument gets kInvalidArgument naming it, before any launch.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>

#include "flash3/flash3.h"

namespace {

using flash3::ForwardArgs;
using flash3::Status;

// A valid problem over fake, suitably aligned addresses (never dereferenced:
// validate() only looks at them).
ForwardArgs valid_args() {
  ForwardArgs a;
  a.batch = 2;
  a.seqlen_q = 100;
  a.seqlen_k = 300;
  a.heads_q = 8;
  a.heads_kv = 2;
  a.head_dim = 128;
  auto fake = [](uintptr_t addr) { return reinterpret_cast<void*>(addr); };
  a.q = flash3::contiguous<const void*>(fake(0x10000), a.seqlen_q, a.heads_q, a.head_dim);
  a.k = flash3::contiguous<const void*>(fake(0x20000), a.seqlen_k, a.heads_kv, a.head_dim);
  a.v = flash3::contiguous<const void*>(fake(0x30000), a.seqlen_k, a.heads_kv, a.head_dim);
  a.o = flash3::contiguous<void*>(fake(0x40000), a.seqlen_q, a.heads_q, a.head_dim);
  return a;
}

void expect_invalid(std::function<void(ForwardArgs&)> const& edit, std::string const& names) {
  ForwardArgs a = valid_args();
  edit(a);
  Status s = flash3::validate(a);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument) << names;
  EXPECT_EQ(s.message().rfind(names, 0), 0u) << "message '" << s.message() << "' should start with '" << names << "'";
}

TEST(Validation, ValidArgumentsPass) {
  EXPECT_TRUE(flash3::validate(valid_args()).ok());
}

TEST(Validation, EachHeadDimIsAccepted) {
  for (int d : {64, 96, 128, 192, 256}) {
    ForwardArgs a = valid_args();
    a.head_dim = d;
    for (auto* t : {&a.q.seq_stride, &a.k.seq_stride, &a.v.seq_stride, &a.o.seq_stride}) *t = 8 * d;
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

TEST(Validation, HeadDim) {
  for (int d : {0, 32, 80, 100, 160, 512, -64}) {
    expect_invalid([d](ForwardArgs& a) { a.head_dim = d; }, "head_dim");
  }
}

TEST(Validation, DtypeAndScale) {
  expect_invalid([](ForwardArgs& a) { a.dtype = static_cast<flash3::DType>(7); }, "dtype");
  expect_invalid([](ForwardArgs& a) { a.softmax_scale = NAN; }, "softmax_scale");
  expect_invalid([](ForwardArgs& a) { a.softmax_scale = INFINITY; }, "softmax_scale");
}

TEST(Validation, Pointers) {
  expect_invalid([](ForwardArgs& a) { a.q.data = nullptr; }, "q.data");
  expect_invalid([](ForwardArgs& a) { a.k.data = nullptr; }, "k.data");
  expect_invalid([](ForwardArgs& a) { a.v.data = nullptr; }, "v.data");
  expect_invalid([](ForwardArgs& a) { a.o.data = nullptr; }, "o.data");
  expect_invalid([](ForwardArgs& a) { a.q.data = reinterpret_cast<const void*>(0x10008); }, "q.data");
  expect_invalid([](ForwardArgs& a) { a.o.data = reinterpret_cast<void*>(0x40002); }, "o.data");
  expect_invalid([](ForwardArgs& a) { a.lse = reinterpret_cast<float*>(0x50002); }, "lse");
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

TEST(Validation, StridesOfSizeOneModesAreIgnored) {
  ForwardArgs a = valid_args();
  a.batch = 1;
  a.q.batch_stride = 3;  // never used when there is one batch
  a.seqlen_q = 1;
  a.q.seq_stride = -7;
  EXPECT_TRUE(flash3::validate(a).ok());
}

TEST(Validation, EmptyProblemsAreValidNoOps) {
  ForwardArgs a = valid_args();
  a.batch = 0;
  a.q.data = nullptr;  // nothing is read or written
  EXPECT_TRUE(flash3::validate(a).ok());
  a = valid_args();
  a.seqlen_q = 0;
  a.o.data = nullptr;
  EXPECT_TRUE(flash3::validate(a).ok());
  a = valid_args();
  a.seqlen_k = 0;  // no keys: O = 0, LSE = +inf; K and V are not read
  a.k.data = nullptr;
  EXPECT_TRUE(flash3::validate(a).ok());
}

TEST(Validation, ForwardRejectsBeforeTouchingTheDevice) {
  ForwardArgs a = valid_args();
  a.head_dim = 100;
  Status s = flash3::forward(a, nullptr);
  EXPECT_EQ(s.code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(s.message().rfind("head_dim", 0), 0u);
}

}  // namespace
