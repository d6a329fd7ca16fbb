// validate(QuantizeArgs) and quantize_fp8(): the FP8 quantization entry point.
// The checks are host code only (nothing here touches the device, so they run
// in CI), in the style of api/validate.cpp: each failure is kInvalidArgument
// with a message that starts with the argument's name.
#include <cstdint>
#include <string>
#include <tuple>
#include <utility>

#include "api/device.h"
#include "flash3/flash3.h"
#include "quant/quantize.h"

namespace flash3 {
namespace {

constexpr int64_t kMaxExtent = (int64_t(1) << 31) - 1;  // sizes, and CTAs per launch (the grid's x)
constexpr int64_t kAlignBytes = 16;                     // 16-byte vector loads and stores
constexpr int64_t kMaxStride = int64_t(1) << 40;        // elements
constexpr int64_t kMaxSpan = int64_t(1) << 62;          // elements a tensor may span: 64-bit offsets

Status invalid(std::string message) { return Status(Status::Code::kInvalidArgument, std::move(message)); }

// A [batch, seqlen, heads, head_dim] tensor of `elem_bytes`-byte elements read
// or written with 16-byte vectors: 16-byte aligned base, strides (of the modes
// of more than one index) positive multiples of 16 bytes, contiguous head dim.
template <class Pointer>
Status check_tensor(char const* name, TensorRef<Pointer> const& t, int64_t batch, int64_t seqlen, int64_t heads,
                    int64_t head_dim, int64_t elem_bytes) {
  std::string const n(name);
  if (t.data == nullptr) return invalid(n + ".data: null pointer");
  if (reinterpret_cast<uintptr_t>(t.data) % kAlignBytes != 0) {
    return invalid(n + ".data: must be 16-byte aligned (16-byte vector accesses)");
  }
  if (t.dim_stride != 1) return invalid(n + ".dim_stride: the head dimension must be contiguous (stride 1)");
  struct Mode {
    char const* field;
    int64_t extent;
    int64_t stride;
  };
  Mode const modes[] = {{"batch_stride", batch, t.batch_stride},
                        {"seq_stride", seqlen, t.seq_stride},
                        {"head_stride", heads, t.head_stride}};
  int64_t const multiple = kAlignBytes / elem_bytes;
  int64_t span = head_dim;  // elements from the first to past the last, below kMaxSpan
  for (Mode const& m : modes) {
    if (m.extent <= 1) continue;  // a stride of a mode of size 1 is never used
    if (m.stride <= 0) return invalid(n + "." + m.field + ": must be positive");
    if (m.stride % multiple != 0) {
      return invalid(n + "." + m.field + ": must be a multiple of " + std::to_string(multiple) +
                     " elements (16 bytes)");
    }
    if (m.stride >= kMaxStride) return invalid(n + "." + m.field + ": must be below 2^40 elements");
    if (m.extent - 1 > (kMaxSpan - span) / m.stride) return invalid(n + ": spans 2^62 elements or more");
    span += (m.extent - 1) * m.stride;
  }
  return Status();
}

Status check_scale(char const* name, float const* scale) {
  if (scale == nullptr) return invalid(std::string(name) + ": null pointer");
  if (reinterpret_cast<uintptr_t>(scale) % alignof(float) != 0) {
    return invalid(std::string(name) + ": must be 4-byte aligned");
  }
  return Status();
}

}  // namespace

Status validate(QuantizeArgs const& a) {
  if (a.dtype != DType::kBF16 && a.dtype != DType::kFP16) return invalid("dtype: must be kBF16 or kFP16");
  struct Size {
    char const* name;
    int64_t value;
  };
  for (Size const& s : {Size{"batch", a.batch}, Size{"seqlen_q", a.seqlen_q}, Size{"seqlen_k", a.seqlen_k}}) {
    if (s.value < 0) return invalid(std::string(s.name) + ": must not be negative");
    if (s.value > kMaxExtent) return invalid(std::string(s.name) + ": must be below 2^31");
  }
  for (Size const& s : {Size{"heads_q", a.heads_q}, Size{"heads_kv", a.heads_kv}}) {
    if (s.value < 1) return invalid(std::string(s.name) + ": must be at least 1");
    if (s.value > kMaxExtent) return invalid(std::string(s.name) + ": must be below 2^31");
  }
  if (a.heads_q % a.heads_kv != 0) return invalid("heads_kv: must divide heads_q (MHA, GQA or MQA)");
  if (a.head_dim != 64 && a.head_dim != 128 && a.head_dim != 256) {
    return invalid("head_dim: must be 64, 128 or 256, got " + std::to_string(a.head_dim));
  }
  switch (a.granularity) {
    case ScaleGranularity::kPerTensor: case ScaleGranularity::kPerHead: case ScaleGranularity::kPerBlock: break;
    default: return invalid("granularity: must be kPerTensor, kPerHead or kPerBlock");
  }
  // A launch has at most batch * heads * (ceil(seqlen / kMinTileRows) + 1)
  // CTAs (quant/quantize.h): below 2^31. (batch * heads < 2^62: no overflow.)
  for (auto const& [seqlen, heads, what] : {std::tuple{a.seqlen_q, a.heads_q, "batch * heads_q * seqlen_q"},
                                            std::tuple{a.seqlen_k, a.heads_kv, "batch * heads_kv * seqlen_k"}}) {
    int64_t const tiles = (seqlen + quant::kMinTileRows - 1) / quant::kMinTileRows + 1;
    if (a.batch > 0 && seqlen > 0 && tiles > kMaxExtent / (a.batch * heads)) {
      return invalid(std::string("batch: ") + what + " / " + std::to_string(quant::kMinTileRows) +
                     " must be below 2^31");
    }
  }
  if (a.batch == 0) return Status();  // nothing to read or write
  if (a.seqlen_q > 0) {
    if (Status s = check_tensor("q", a.q, a.batch, a.seqlen_q, a.heads_q, a.head_dim, 2); !s.ok()) return s;
    if (Status s = check_tensor("q_out", a.q_out, a.batch, a.seqlen_q, a.heads_q, a.head_dim, 1); !s.ok()) return s;
    if (Status s = check_scale("q_scale", a.q_scale); !s.ok()) return s;
  }
  if (a.seqlen_k > 0) {
    if (Status s = check_tensor("k", a.k, a.batch, a.seqlen_k, a.heads_kv, a.head_dim, 2); !s.ok()) return s;
    if (Status s = check_tensor("k_out", a.k_out, a.batch, a.seqlen_k, a.heads_kv, a.head_dim, 1); !s.ok()) return s;
    if (Status s = check_scale("k_scale", a.k_scale); !s.ok()) return s;
    if (Status s = check_tensor("v", a.v, a.batch, a.seqlen_k, a.heads_kv, a.head_dim, 2); !s.ok()) return s;
    if (Status s = check_tensor("v_out", a.v_out, a.batch, a.seqlen_k, a.heads_kv, a.head_dim, 1); !s.ok()) return s;
    if (Status s = check_scale("v_scale", a.v_scale); !s.ok()) return s;
  }
  return Status();
}

Status quantize_fp8(QuantizeArgs const& args, cudaStream_t stream) {
  if (Status s = validate(args); !s.ok()) return s;
  DeviceInfo device;
  if (Status s = query_device(device); !s.ok()) return s;
  if (args.batch == 0 || (args.seqlen_q == 0 && args.seqlen_k == 0)) return Status();
  return quant::launch_quantize(args, fp8_block_sizes(args.head_dim), stream);
}

}  // namespace flash3
