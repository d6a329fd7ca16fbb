// Argument checks of the public API. Host code only: nothing here touches the
// device, so every check runs in CI.
#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>
#include <utility>

#include "flash3/flash3.h"

namespace flash3 {
namespace {

constexpr int64_t kMaxExtent = (int64_t(1) << 31) - 1;  // TMA coordinates and tile counts are 32-bit
constexpr int64_t kTmaAlignBytes = 16;                  // TMA: base address and strides
constexpr int64_t kMaxStrideBytes = int64_t(1) << 40;   // TMA: strides below 2^40 bytes

Status invalid(std::string message) { return Status(Status::Code::kInvalidArgument, std::move(message)); }

int64_t element_bytes(DType dtype) { return dtype == DType::kE4M3 ? 1 : 2; }

template <class Pointer>
Status check_tensor(char const* name, TensorRef<Pointer> const& t, int64_t seqlen, int64_t heads, int64_t batch,
                    int64_t elem_bytes = 2) {
  std::string const n(name);
  if (t.data == nullptr) return invalid(n + ".data: null pointer");
  if (reinterpret_cast<uintptr_t>(t.data) % kTmaAlignBytes != 0) {
    return invalid(n + ".data: must be 16-byte aligned (TMA)");
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
  for (Mode const& m : modes) {
    if (m.extent <= 1) continue;  // a stride of a mode of size 1 is never used
    if (m.stride <= 0) return invalid(n + "." + m.field + ": must be positive");
    if ((m.stride * elem_bytes) % kTmaAlignBytes != 0) {
      return invalid(n + "." + m.field + ": must be a multiple of " + std::to_string(kTmaAlignBytes / elem_bytes) +
                     " elements (16 bytes, TMA)");
    }
    if (m.stride >= kMaxStrideBytes / elem_bytes) return invalid(n + "." + m.field + ": must be below 2^39 elements");
  }
  return Status();
}

// The sizes, head dim and scale both passes share.
Status check_problem(int64_t batch, int64_t seqlen_q, int64_t seqlen_k, int64_t heads_q,
                     int64_t heads_kv, int64_t head_dim, float softmax_scale) {
  struct Size {
    char const* name;
    int64_t value;
  };
  for (Size const& s : {Size{"batch", batch}, Size{"seqlen_q", seqlen_q}, Size{"seqlen_k", seqlen_k}}) {
    if (s.value < 0) return invalid(std::string(s.name) + ": must not be negative");
    if (s.value > kMaxExtent) return invalid(std::string(s.name) + ": must be below 2^31");
  }
  for (Size const& s : {Size{"heads_q", heads_q}, Size{"heads_kv", heads_kv}}) {
    if (s.value < 1) return invalid(std::string(s.name) + ": must be at least 1");
    if (s.value > kMaxExtent) return invalid(std::string(s.name) + ": must be below 2^31");
  }
  if (heads_q % heads_kv != 0) return invalid("heads_kv: must divide heads_q (MHA, GQA or MQA)");
  switch (head_dim) {
    case 64: case 96: case 128: case 192: case 256: break;
    default: return invalid("head_dim: must be 64, 96, 128, 192 or 256, got " + std::to_string(head_dim));
  }
  if (!std::isfinite(softmax_scale) || softmax_scale < 0.f) {
    return invalid("softmax_scale: must be finite and not negative (0 selects 1/sqrt(head_dim))");
  }
  // (m_blocks * heads * batch) tiles are counted in 32 bits; 64 is the smallest block M.
  if (((seqlen_q + 63) / 64) * heads_q * batch > kMaxExtent) {
    return invalid("batch: batch * heads_q * seqlen_q / 64 must be below 2^31");
  }
  if (((seqlen_k + 63) / 64) * heads_q * batch > kMaxExtent) {
    return invalid("batch: batch * heads_q * seqlen_k / 64 must be below 2^31");
  }
  return Status();
}

// FP8's scales: present, aligned, and of a known granularity.
Status check_fp8(ForwardArgs const& a) {
  Fp8Scales const& f = a.fp8;
  if (a.head_dim != 64 && a.head_dim != 128 && a.head_dim != 256) {
    return invalid("head_dim: FP8 (kE4M3) supports 64, 128 and 256, got " + std::to_string(a.head_dim));
  }
  if (f.out_dtype != DType::kBF16 && f.out_dtype != DType::kFP16) return invalid("fp8.out_dtype: must be kBF16 or kFP16");
  if (f.granularity != ScaleGranularity::kPerTensor && f.granularity != ScaleGranularity::kPerHead &&
      f.granularity != ScaleGranularity::kPerBlock) {
    return invalid("fp8.granularity: must be kPerTensor, kPerHead or kPerBlock");
  }
  if (a.batch == 0 || a.seqlen_q == 0) return Status();
  for (auto const& [name, scale, needed] : {std::tuple{"fp8.q", f.q, true}, std::tuple{"fp8.k", f.k, a.seqlen_k > 0},
                                            std::tuple{"fp8.v", f.v, a.seqlen_k > 0}}) {
    if (!needed) continue;
    if (scale == nullptr) return invalid(std::string(name) + ": null pointer (kE4M3 inputs need their scales)");
    if (reinterpret_cast<uintptr_t>(scale) % alignof(float) != 0) {
      return invalid(std::string(name) + ": must be 4-byte aligned");
    }
  }
  return Status();
}

}  // namespace

Status validate(ForwardArgs const& a) {
  if (a.dtype != DType::kBF16 && a.dtype != DType::kFP16 && a.dtype != DType::kE4M3) {
    return invalid("dtype: must be kBF16, kFP16 or kE4M3");
  }
  bool const fp8 = a.dtype == DType::kE4M3;
  if (Status s = check_problem(a.batch, a.seqlen_q, a.seqlen_k, a.heads_q, a.heads_kv, a.head_dim,
                               a.softmax_scale);
      !s.ok()) {
    return s;
  }
  if (fp8) {
    if (Status s = check_fp8(a); !s.ok()) return s;
  }
  if (a.batch == 0 || a.seqlen_q == 0) return Status();  // nothing to compute or write
  int64_t const in_bytes = element_bytes(a.dtype);
  int64_t const out_bytes = element_bytes(fp8 ? a.fp8.out_dtype : a.dtype);
  if (Status s = check_tensor("q", a.q, a.seqlen_q, a.heads_q, a.batch, in_bytes); !s.ok()) return s;
  if (Status s = check_tensor("o", a.o, a.seqlen_q, a.heads_q, a.batch, out_bytes); !s.ok()) return s;
  if (a.seqlen_k > 0) {
    if (Status s = check_tensor("k", a.k, a.seqlen_k, a.heads_kv, a.batch, in_bytes); !s.ok()) return s;
    if (Status s = check_tensor("v", a.v, a.seqlen_k, a.heads_kv, a.batch, in_bytes); !s.ok()) return s;
  }
  if (reinterpret_cast<uintptr_t>(a.lse) % alignof(float) != 0) return invalid("lse: must be 4-byte aligned");
  return Status();
}

Status validate(BackwardArgs const& a) {
  if (a.dtype != DType::kBF16 && a.dtype != DType::kFP16) {
    return invalid("dtype: the backward pass supports kBF16 and kFP16");
  }
  if (Status s = check_problem(a.batch, a.seqlen_q, a.seqlen_k, a.heads_q, a.heads_kv, a.head_dim,
                               a.softmax_scale);
      !s.ok()) {
    return s;
  }
  if (a.head_dim > 128) {
    return invalid("head_dim: the backward pass supports 64, 96 and 128, got " + std::to_string(a.head_dim));
  }
  if (a.batch == 0 || (a.seqlen_q == 0 && a.seqlen_k == 0)) return Status();  // no gradient to write
  if (a.seqlen_q > 0) {
    for (auto const& [name, t] : {std::pair{"q", a.q}, std::pair{"o", a.o}, std::pair{"dout", a.dout}}) {
      if (Status s = check_tensor(name, t, a.seqlen_q, a.heads_q, a.batch); !s.ok()) return s;
    }
    if (Status s = check_tensor("dq", a.dq, a.seqlen_q, a.heads_q, a.batch); !s.ok()) return s;
    if (a.lse == nullptr) return invalid("lse: null pointer (the forward's LSE is needed)");
    if (reinterpret_cast<uintptr_t>(a.lse) % alignof(float) != 0) return invalid("lse: must be 4-byte aligned");
  }
  if (a.seqlen_k > 0) {
    if (Status s = check_tensor("k", a.k, a.seqlen_k, a.heads_kv, a.batch); !s.ok()) return s;
    if (Status s = check_tensor("v", a.v, a.seqlen_k, a.heads_kv, a.batch); !s.ok()) return s;
    if (Status s = check_tensor("dk", a.dk, a.seqlen_k, a.heads_kv, a.batch); !s.ok()) return s;
    if (Status s = check_tensor("dv", a.dv, a.seqlen_k, a.heads_kv, a.batch); !s.ok()) return s;
  }
  if (reinterpret_cast<uintptr_t>(a.workspace) % 256 != 0) return invalid("workspace: must be 256-byte aligned");
  return Status();
}

}  // namespace flash3
