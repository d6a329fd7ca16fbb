// libflash3_c through its C ABI alone (flash3_c.h), as the Python package
// calls it: status codes and messages, the ABI's offsets, the size queries.
// flash3.h provides the structs only; this executable links libflash3_c, not
// the C++ library. Nothing here touches the device.
#include "flash3/flash3_c.h"

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>

#include "flash3/flash3.h"
#include "valid_args.h"

namespace {

using flash3::testing::valid_forward_args;

using flash3::BackwardArgs;
using flash3::ForwardArgs;
using flash3::QuantizeArgs;

constexpr int kOk = 0, kInvalidArgument = 1, kUnsupported = 2;

// The full message of a call that fails (a large buffer).
std::string message_of(int (*validate)(const void*, char*, size_t), void const* args) {
  char message[1024];
  validate(args, message, sizeof message);
  return message;
}

TEST(CApi, Version) { EXPECT_STREQ(flash3_version(), FLASH3_EXPECTED_VERSION); }

TEST(CApi, ValidationErrorComesBackWithCodeAndMessage) {
  ForwardArgs a = valid_forward_args();
  char message[256] = "untouched";
  EXPECT_EQ(flash3_validate_forward(&a, message, sizeof message), kOk);
  EXPECT_STREQ(message, "untouched");  // written only on failure
  a.head_dim = 100;
  EXPECT_EQ(flash3_validate_forward(&a, message, sizeof message), kInvalidArgument);
  EXPECT_EQ(std::string(message).rfind("head_dim: ", 0), 0u) << message;
  // forward() validates first: the same answer, without a device.
  char again[256];
  EXPECT_EQ(flash3_forward(&a, nullptr, again, sizeof again), kInvalidArgument);
  EXPECT_STREQ(again, message);
}

TEST(CApi, UnsupportedOptions) {
  ForwardArgs a = valid_forward_args();
  a.head_dim = 64;
  a.q = flash3::contiguous<const void*>(a.q.data, a.seqlen_q, a.heads_q, 64);
  a.k = flash3::contiguous<const void*>(a.k.data, a.seqlen_k, a.heads_kv, 64);
  a.v = flash3::contiguous<const void*>(a.v.data, a.seqlen_k, a.heads_kv, 64);
  a.o = flash3::contiguous<void*>(a.o.data, a.seqlen_q, a.heads_q, 64);
  a.options.pingpong = false;  // the ablation is built at head dim 128 only
  char message[256];
  EXPECT_EQ(flash3_validate_forward(&a, message, sizeof message), kUnsupported);
  EXPECT_EQ(std::string(message).rfind("options: ", 0), 0u) << message;
}

TEST(CApi, MessageBuffers) {
  ForwardArgs a = valid_forward_args();
  a.head_dim = 100;
  std::string const full = message_of(flash3_validate_forward, &a);
  ASSERT_GT(full.size(), 8u);
  // No buffer, or one of no bytes: the code alone.
  EXPECT_EQ(flash3_validate_forward(&a, nullptr, 0), kInvalidArgument);
  EXPECT_EQ(flash3_validate_forward(&a, nullptr, 64), kInvalidArgument);
  char guard[4] = {'x', 'x', 'x', 'x'};
  EXPECT_EQ(flash3_validate_forward(&a, guard, 0), kInvalidArgument);
  EXPECT_EQ(guard[0], 'x');
  // A small buffer: the message's start, NUL-terminated, nothing past it.
  char small[12];
  std::memset(small, 'x', sizeof small);
  EXPECT_EQ(flash3_validate_forward(&a, small, 8), kInvalidArgument);
  EXPECT_EQ(std::string(small), full.substr(0, 7));
  EXPECT_EQ(small[8], 'x');
  EXPECT_EQ(flash3_validate_forward(&a, small, 1), kInvalidArgument);
  EXPECT_EQ(small[0], '\0');
}

TEST(CApi, NullArgs) {
  for (auto validate : {flash3_validate_forward, flash3_validate_backward, flash3_validate_quantize}) {
    EXPECT_EQ(message_of(validate, nullptr), "args: null pointer");
    EXPECT_EQ(validate(nullptr, nullptr, 0), kInvalidArgument);
  }
  for (auto run : {flash3_forward, flash3_backward, flash3_quantize_fp8}) {
    EXPECT_EQ(run(nullptr, nullptr, nullptr, 0), kInvalidArgument);
  }
  size_t bytes = 7;
  EXPECT_EQ(flash3_backward_workspace_size(nullptr, &bytes, nullptr, 0), kInvalidArgument);
  EXPECT_EQ(bytes, 0u);
}

TEST(CApi, EachPassValidates) {
  BackwardArgs b;
  b.dtype = flash3::DType::kE4M3;
  EXPECT_EQ(message_of(flash3_validate_backward, &b).rfind("dtype: ", 0), 0u);
  char message[256];
  EXPECT_EQ(flash3_backward(&b, nullptr, message, sizeof message), kInvalidArgument);
  QuantizeArgs q;
  q.heads_q = q.heads_kv = 1;
  q.head_dim = 96;
  EXPECT_EQ(message_of(flash3_validate_quantize, &q).rfind("head_dim: ", 0), 0u);
  EXPECT_EQ(flash3_quantize_fp8(&q, nullptr, message, sizeof message), kInvalidArgument);
}

TEST(CApi, EmptyProblemsSucceedWithoutADevice) {
  ForwardArgs f = valid_forward_args();
  f.batch = 0;
  EXPECT_EQ(flash3_forward(&f, nullptr, nullptr, 0), kOk);
  BackwardArgs b;
  b.heads_q = b.heads_kv = 1;
  b.head_dim = 128;
  EXPECT_EQ(flash3_backward(&b, nullptr, nullptr, 0), kOk);
  QuantizeArgs q;
  q.heads_q = q.heads_kv = 1;
  q.head_dim = 128;
  EXPECT_EQ(flash3_quantize_fp8(&q, nullptr, nullptr, 0), kOk);
}

TEST(CApi, AbiOffsets) {
  EXPECT_EQ(flash3_abi_offset("ForwardArgs", ""), int64_t(sizeof(ForwardArgs)));
  EXPECT_EQ(flash3_abi_offset("BackwardArgs", ""), int64_t(sizeof(BackwardArgs)));
  EXPECT_EQ(flash3_abi_offset("QuantizeArgs", ""), int64_t(sizeof(QuantizeArgs)));
  EXPECT_EQ(flash3_abi_offset("TensorRef", ""), int64_t(sizeof(flash3::ConstTensor)));
  EXPECT_EQ(flash3_abi_offset("Fp8Scales", ""), int64_t(sizeof(flash3::Fp8Scales)));
  EXPECT_EQ(flash3_abi_offset("KernelOptions", ""), int64_t(sizeof(flash3::KernelOptions)));

  EXPECT_EQ(flash3_abi_offset("ForwardArgs", "dtype"), int64_t(offsetof(ForwardArgs, dtype)));
  EXPECT_EQ(flash3_abi_offset("ForwardArgs", "head_dim"), int64_t(offsetof(ForwardArgs, head_dim)));
  EXPECT_EQ(flash3_abi_offset("ForwardArgs", "q"), int64_t(offsetof(ForwardArgs, q)));
  EXPECT_EQ(flash3_abi_offset("ForwardArgs", "q.data"), int64_t(offsetof(ForwardArgs, q.data)));
  EXPECT_EQ(flash3_abi_offset("ForwardArgs", "k.seq_stride"), int64_t(offsetof(ForwardArgs, k.seq_stride)));
  EXPECT_EQ(flash3_abi_offset("ForwardArgs", "o.dim_stride"), int64_t(offsetof(ForwardArgs, o.dim_stride)));
  EXPECT_EQ(flash3_abi_offset("ForwardArgs", "causal"), int64_t(offsetof(ForwardArgs, causal)));
  EXPECT_EQ(flash3_abi_offset("ForwardArgs", "fp8.granularity"), int64_t(offsetof(ForwardArgs, fp8.granularity)));
  EXPECT_EQ(flash3_abi_offset("ForwardArgs", "fp8.out_dtype"), int64_t(offsetof(ForwardArgs, fp8.out_dtype)));
  EXPECT_EQ(flash3_abi_offset("ForwardArgs", "options.pingpong"), int64_t(offsetof(ForwardArgs, options.pingpong)));
  EXPECT_EQ(flash3_abi_offset("ForwardArgs", "options.warp_specialization"),
            int64_t(offsetof(ForwardArgs, options.warp_specialization)));
  EXPECT_EQ(flash3_abi_offset("ForwardArgs", "tile_counter"), int64_t(offsetof(ForwardArgs, tile_counter)));
  EXPECT_EQ(flash3_abi_offset("ForwardArgs", "head_dim_v"), int64_t(offsetof(ForwardArgs, head_dim_v)));
  EXPECT_EQ(flash3_abi_offset("BackwardArgs", "dout.head_stride"), int64_t(offsetof(BackwardArgs, dout.head_stride)));
  EXPECT_EQ(flash3_abi_offset("BackwardArgs", "deterministic"), int64_t(offsetof(BackwardArgs, deterministic)));
  EXPECT_EQ(flash3_abi_offset("BackwardArgs", "varlen.seqused_k"), int64_t(offsetof(BackwardArgs, varlen.seqused_k)));
  EXPECT_EQ(flash3_abi_offset("BackwardArgs", "varlen.total_k"), int64_t(offsetof(BackwardArgs, varlen.total_k)));
  EXPECT_EQ(flash3_abi_offset("BackwardArgs", "workspace"), int64_t(offsetof(BackwardArgs, workspace)));
  EXPECT_EQ(flash3_abi_offset("BackwardArgs", "head_dim_v"), int64_t(offsetof(BackwardArgs, head_dim_v)));
  EXPECT_EQ(flash3_abi_offset("QuantizeArgs", "v_out.batch_stride"),
            int64_t(offsetof(QuantizeArgs, v_out.batch_stride)));
  EXPECT_EQ(flash3_abi_offset("QuantizeArgs", "granularity"), int64_t(offsetof(QuantizeArgs, granularity)));
  EXPECT_EQ(flash3_abi_offset("QuantizeArgs", "seed"), int64_t(offsetof(QuantizeArgs, seed)));
  EXPECT_EQ(flash3_abi_offset("Fp8Scales", "v"), int64_t(offsetof(flash3::Fp8Scales, v)));
  EXPECT_EQ(flash3_abi_offset("KernelOptions", "persistent"), int64_t(offsetof(flash3::KernelOptions, persistent)));
}

TEST(CApi, UnknownAbiNames) {
  EXPECT_EQ(flash3_abi_offset("ForwardArgs", "nope"), -1);
  EXPECT_EQ(flash3_abi_offset("ForwardArgs", "q."), -1);
  EXPECT_EQ(flash3_abi_offset("ForwardArgs", "q.data.x"), -1);
  EXPECT_EQ(flash3_abi_offset("ForwardArgs", "batch.x"), -1);
  EXPECT_EQ(flash3_abi_offset("ForwardArgs", "deterministic"), -1);  // BackwardArgs's
  EXPECT_EQ(flash3_abi_offset("Forward", ""), -1);
  EXPECT_EQ(flash3_abi_offset("forwardargs", ""), -1);
  EXPECT_EQ(flash3_abi_offset(nullptr, ""), -1);
  EXPECT_EQ(flash3_abi_offset("ForwardArgs", nullptr), -1);
}

TEST(CApi, BackwardWorkspaceSize) {
  BackwardArgs b = flash3::testing::with_valid_inputs<BackwardArgs>();
  size_t bytes = 0;
  EXPECT_EQ(flash3_backward_workspace_size(&b, &bytes, nullptr, 0), kOk);
  // At least the fp32 dQ accumulator: 2 x 8 heads x 128 padded rows x 128.
  EXPECT_GE(bytes, size_t(2 * 8 * 128 * 128 * 4));
  b.batch = 0;
  EXPECT_EQ(flash3_backward_workspace_size(&b, &bytes, nullptr, 0), kOk);
  EXPECT_EQ(bytes, 0u);
  b.batch = 2;
  b.head_dim = 80;
  bytes = 7;
  char message[256];
  EXPECT_EQ(flash3_backward_workspace_size(&b, &bytes, message, sizeof message), kInvalidArgument);
  EXPECT_EQ(bytes, 0u);
  EXPECT_EQ(std::string(message).rfind("head_dim: ", 0), 0u) << message;
  EXPECT_EQ(flash3_backward_workspace_size(&b, nullptr, message, sizeof message), kInvalidArgument);
  EXPECT_EQ(std::string(message).rfind("bytes: ", 0), 0u) << message;
}

TEST(CApi, PlanKvCache) {
  ForwardArgs a = flash3::testing::valid_cache_args();
  a.kv_cache.num_splits = 4;
  int64_t splits = 0;
  size_t bytes = 0;
  EXPECT_EQ(flash3_plan_kv_cache(&a, &splits, &bytes, nullptr, 0), kOk);
  EXPECT_EQ(splits, 4);
  // 4 splits x 2 entries x 8 heads x 1 query: float32 partial O of 128 columns, then their LSE (256 bytes aligned).
  EXPECT_EQ(bytes, size_t(4 * 2 * 8 * 128 * 4 + 256));
  a.kv_cache.num_splits = -2;
  char message[256];
  EXPECT_EQ(flash3_plan_kv_cache(&a, &splits, &bytes, message, sizeof message), kInvalidArgument);
  EXPECT_EQ(splits, 1);
  EXPECT_EQ(bytes, 0u);
  EXPECT_EQ(std::string(message).rfind("kv_cache.num_splits", 0), 0u) << message;
  EXPECT_EQ(flash3_plan_kv_cache(&a, nullptr, &bytes, message, sizeof message), kInvalidArgument);
  EXPECT_EQ(std::string(message).rfind("num_splits: ", 0), 0u) << message;
  EXPECT_EQ(flash3_plan_kv_cache(nullptr, &splits, &bytes, message, sizeof message), kInvalidArgument);
}

TEST(CApi, Fp8Sizes) {
  int64_t q = -1, kv = -1;
  flash3_fp8_block_sizes(128, &q, &kv);
  EXPECT_EQ(q, 128);
  EXPECT_EQ(kv, 192);
  flash3_fp8_block_sizes(64, &q, &kv);
  EXPECT_EQ(q, 192);
  EXPECT_EQ(kv, 128);
  flash3_fp8_block_sizes(96, &q, &kv);  // no FP8 at head dim 96
  EXPECT_EQ(q, 0);
  EXPECT_EQ(kv, 0);
  flash3_fp8_block_sizes(256, nullptr, nullptr);
  EXPECT_EQ(flash3_fp8_scale_count(0, 3, 4, 1000, 128), 1);
  EXPECT_EQ(flash3_fp8_scale_count(1, 3, 4, 1000, 128), 12);
  EXPECT_EQ(flash3_fp8_scale_count(2, 3, 4, 1000, 128), 3 * 4 * 8);
  EXPECT_EQ(flash3_fp8_scale_count(7, 3, 4, 1000, 128), 0);
}

}  // namespace
