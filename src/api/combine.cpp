// validate(CombineArgs) and combine(): partial attentions combined
// (FlashAttention-3's flash_attn_combine). The checks are host code only, so
// they run in CI: each failure is kInvalidArgument naming the argument.
#include <cstdint>
#include <string>

#include "api/checks.h"
#include "api/device.h"
#include "flash3/flash3.h"
#include "fwd/combine.h"
#include "fwd/kv_split.h"

namespace flash3 {

using checks::invalid;
using checks::kMaxExtent;

Status validate(CombineArgs const& a) {
  if (a.num_splits < 1 || a.num_splits > kMaxSplits) {
    return invalid("num_splits: must be in [1, " + std::to_string(kMaxSplits) + "], got " +
                   std::to_string(a.num_splits));
  }
  for (auto const& [name, n] : {std::pair{"batch", a.batch}, std::pair{"seqlen", a.seqlen}}) {
    if (n < 0 || n > kMaxExtent) return invalid(std::string(name) + ": must be in [0, 2^31), got " + std::to_string(n));
  }
  if (a.heads < 1 || a.heads > kMaxExtent) return invalid("heads: must be in [1, 2^31), got " + std::to_string(a.heads));
  if (a.head_dim < 4 || a.head_dim % 4 != 0 || a.head_dim > kMaxExtent) {
    return invalid("head_dim: must be a positive multiple of 4, got " + std::to_string(a.head_dim));
  }
  // A warp per row, four rows a CTA: the grid's x extent.
  if (a.batch > 0 && a.seqlen * a.heads > 4 * kMaxExtent / a.batch) {
    return invalid("batch: batch * seqlen * heads must be below 2^33");
  }
  if (a.out_dtype != DType::kBF16 && a.out_dtype != DType::kFP16 && a.out_dtype != DType::kFP32) {
    return invalid("out_dtype: must be kBF16, kFP16 or kFP32");
  }
  if (a.batch == 0 || a.seqlen == 0) return Status();  // nothing to read or write
  if (Status s = checks::tensor("o_partial", a.o_partial, a.batch, a.seqlen, a.heads, a.head_dim, 4); !s.ok()) {
    return s;
  }
  if (a.num_splits > 1 && (a.o_partial_split_stride <= 0 || a.o_partial_split_stride % 4 != 0)) {
    return invalid("o_partial_split_stride: must be a positive multiple of 4 elements (16 bytes)");
  }
  if (a.lse_partial == nullptr) return invalid("lse_partial: null pointer");
  if (reinterpret_cast<uintptr_t>(a.lse_partial) % alignof(float) != 0) {
    return invalid("lse_partial: must be 4-byte aligned");
  }
  for (auto const& [name, stride] :
       {std::pair{"lse_split_stride", a.lse_split_stride}, std::pair{"lse_batch_stride", a.lse_batch_stride},
        std::pair{"lse_seq_stride", a.lse_seq_stride}, std::pair{"lse_head_stride", a.lse_head_stride}}) {
    if (stride < 0 || stride > checks::kMaxSpan / kMaxExtent) {
      return invalid(std::string(name) + ": must be in [0, 2^31), got " + std::to_string(stride));
    }
  }
  int64_t const out_bytes = a.out_dtype == DType::kFP32 ? 4 : 2;
  if (Status s = checks::output("out", a.out, a.batch, a.seqlen, a.heads, a.head_dim, out_bytes); !s.ok()) return s;
  if (reinterpret_cast<uintptr_t>(a.lse) % alignof(float) != 0) return invalid("lse: must be 4-byte aligned");
  if (reinterpret_cast<uintptr_t>(a.sinks) % alignof(float) != 0) return invalid("sinks: must be 4-byte aligned");
  return Status();
}

Status combine(CombineArgs const& args, cudaStream_t stream) {
  if (Status s = validate(args); !s.ok()) return s;
  if (args.batch == 0 || args.seqlen == 0) return Status();  // no output: a no-op, even without a device
  DeviceInfo device;
  if (Status s = query_device(device); !s.ok()) return s;
  if (cudaError_t const err = fwd::combine_splits(args, stream); err != cudaSuccess) {
    return Status(Status::Code::kCudaError, std::string("combine launch: ") + cudaGetErrorString(err));
  }
  return Status();
}

}  // namespace flash3
