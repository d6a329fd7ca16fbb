// Argument checks that validate(ForwardArgs), validate(BackwardArgs),
// validate(QuantizeArgs) and backward_workspace_size share. Host code only: nothing here touches the
// device, so every check runs in CI. Each failure is kInvalidArgument (not_compiled: kUnsupported) with a
// message that starts with the argument's name.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <utility>

#include "common/head_dims.h"
#include "flash3/flash3.h"

namespace flash3::checks {

constexpr int64_t kMaxExtent = (int64_t(1) << 31) - 1;  // TMA coordinates, tile and CTA counts are 32-bit
constexpr int64_t kAlignBytes = 16;                     // TMA and 16-byte vectors: base address and strides
constexpr int64_t kMaxStrideBytes = int64_t(1) << 40;   // TMA: strides below 2^40 bytes
constexpr int64_t kMaxSpan = int64_t(1) << 62;          // elements a tensor may span: 64-bit offsets

inline Status invalid(std::string message) { return Status(Status::Code::kInvalidArgument, std::move(message)); }

// kUnsupported: the call's dtype and head dims are valid but no kernel of
// this build takes them (the dispatch's answer after its instances).
inline Status not_compiled(int64_t head_dim, int64_t head_dim_v) {
  return Status(Status::Code::kUnsupported,
                "head_dim: " + std::to_string(head_dim) +
                    (head_dim_v != head_dim ? " with head_dim_v " + std::to_string(head_dim_v) : std::string()) +
                    " with this dtype is not compiled into this build (see FLASH3_HEAD_DIMS and FLASH3_DTYPES)");
}

// Sizes: batch and sequence lengths non-negative, heads at least 1, all
// below 2^31, heads_kv dividing heads_q.
inline Status sizes(int64_t batch, int64_t seqlen_q, int64_t seqlen_k, int64_t heads_q, int64_t heads_kv) {
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
  return Status();
}

// The sizes and head dims of the attention passes: as sizes(), head dims
// they are built for (V's 0, the same, or a pair's), and tile counts below 2^31.
// latent: MLA's call (ForwardArgs::qv), whose head dims are kMlaHeadDims.
inline Status attention_sizes(int64_t batch, int64_t seqlen_q, int64_t seqlen_k, int64_t heads_q, int64_t heads_kv,
                              int64_t head_dim, int64_t head_dim_v, bool latent = false) {
  if (Status s = sizes(batch, seqlen_q, seqlen_k, heads_q, heads_kv); !s.ok()) return s;
  if (latent) {
    if (!mla_head_dims(head_dim, head_dim_v)) {
      return invalid("head_dim: MLA (qv) takes head_dim " + std::to_string(kMlaHeadDims.head_dim) +
                     " and head_dim_v " + std::to_string(kMlaHeadDims.head_dim_v) + ", got " +
                     std::to_string(head_dim) + " and " + std::to_string(head_dim_v));
    }
  } else if (!head_dim_supported(head_dim, false)) {
    return invalid("head_dim: must be " + head_dim_list(false) + ", got " + std::to_string(head_dim));
  }
  if (!latent && !head_dim_v_supported(head_dim, head_dim_v)) {
    return invalid("head_dim_v: must be 0 (head_dim's), head_dim, or " + head_dim_pair_list() + "; got " +
                   std::to_string(head_dim_v) + " with head_dim " + std::to_string(head_dim) +
                   " (" + std::to_string(kMlaHeadDims.head_dim_v) + " with head_dim " +
                   std::to_string(kMlaHeadDims.head_dim) + " is MLA's, with qv)");
  }
  // (m_blocks * heads * batch) tiles are counted in 32 bits; 64 is the smallest
  // block M. blocks * heads_q < 2^25 * 2^31 fits in 64 bits, its product with
  // batch may not: compare against kMaxExtent / batch instead.
  for (auto const& [seqlen, name] : {std::pair{seqlen_q, "seqlen_q"}, std::pair{seqlen_k, "seqlen_k"}}) {
    if (batch > 0 && (seqlen + 63) / 64 * heads_q > kMaxExtent / batch) {
      return invalid(std::string("batch: batch * heads_q * ") + name + " / 64 must be below 2^31");
    }
  }
  return Status();
}

// A tensor's strided modes: the stride's field name, the extent and the stride.
struct Mode {
  char const* field;
  int64_t extent;
  int64_t stride;
};
template <class Pointer>
std::array<Mode, 3> modes(TensorRef<Pointer> const& t, int64_t batch, int64_t seqlen, int64_t heads) {
  return {Mode{"batch_stride", batch, t.batch_stride}, Mode{"seq_stride", seqlen, t.seq_stride},
          Mode{"head_stride", heads, t.head_stride}};
}

// A [batch, seqlen, heads, head_dim] tensor of `elem_bytes`-byte elements
// that TMA (or 16-byte vectors) reads or writes: 16-byte aligned base,
// contiguous head dim, strides of the modes of more than one index positive
// multiples of 16 bytes and below 2^40 bytes, spanning fewer than 2^62
// elements.
template <class Pointer>
Status tensor(char const* name, TensorRef<Pointer> const& t, int64_t batch, int64_t seqlen, int64_t heads,
              int64_t head_dim, int64_t elem_bytes) {
  std::string const n(name);
  if (t.data == nullptr) return invalid(n + ".data: null pointer");
  if (reinterpret_cast<uintptr_t>(t.data) % kAlignBytes != 0) return invalid(n + ".data: must be 16-byte aligned");
  if (t.dim_stride != 1) return invalid(n + ".dim_stride: the head dimension must be contiguous (stride 1)");
  int64_t span = head_dim;  // elements from the first to past the last
  for (Mode const& m : modes(t, batch, seqlen, heads)) {
    if (m.extent <= 1) continue;  // a stride of a mode of size 1 is never used
    if (m.stride <= 0) return invalid(n + "." + m.field + ": must be positive");
    if ((m.stride * elem_bytes) % kAlignBytes != 0) {
      return invalid(n + "." + m.field + ": must be a multiple of " + std::to_string(kAlignBytes / elem_bytes) +
                     " elements (16 bytes)");
    }
    if (m.stride >= kMaxStrideBytes / elem_bytes) {
      return invalid(n + "." + m.field + ": must be below 2^40 bytes");
    }
    if (m.extent - 1 > (kMaxSpan - span) / m.stride) return invalid(n + ": spans 2^62 elements or more");
    span += (m.extent - 1) * m.stride;
  }
  return Status();
}

// An output tensor: as tensor(), and no two of its elements at one address
// (their writers would race). Sorted by stride, each mode of more than one
// index must step past all that the head dim and the smaller modes span. This
// also refuses a few interleavings whose elements are distinct (strides 2d and
// 3d over 3 and 2 indices, d the head dim), which no real layout is.
template <class Pointer>
Status output(char const* name, TensorRef<Pointer> const& t, int64_t batch, int64_t seqlen, int64_t heads,
              int64_t head_dim, int64_t elem_bytes) {
  if (Status s = tensor(name, t, batch, seqlen, heads, head_dim, elem_bytes); !s.ok()) return s;
  std::array<Mode, 3> by_stride = modes(t, batch, seqlen, heads);
  std::stable_sort(by_stride.begin(), by_stride.end(), [](Mode const& x, Mode const& y) { return x.stride < y.stride; });
  int64_t span = head_dim;  // below 2^62, as tensor() checked
  for (Mode const& m : by_stride) {
    if (m.extent <= 1) continue;
    if (m.stride < span) {
      return invalid(std::string(name) + "." + m.field + ": must be at least " + std::to_string(span) +
                     " (what the head dim and the smaller strides span): an output must not overlap itself");
    }
    span += (m.extent - 1) * m.stride;
  }
  return Status();
}

// An FP8 scale array: present and float-aligned.
inline Status scale(char const* name, float const* scale) {
  if (scale == nullptr) return invalid(std::string(name) + ": null pointer");
  if (reinterpret_cast<uintptr_t>(scale) % alignof(float) != 0) {
    return invalid(std::string(name) + ": must be 4-byte aligned");
  }
  return Status();
}

// The backward's grids hold the batch (packed sequences: the sequences) and
// the query heads on CUDA's z and y axes, at most 65535 each.
inline Status backward_grid(int64_t batch, int64_t heads_q) {
  constexpr int64_t kMaxGridYZ = 65535;
  if (batch > kMaxGridYZ) return invalid("batch: the backward takes at most 65535, got " + std::to_string(batch));
  if (heads_q > kMaxGridYZ) return invalid("heads_q: the backward takes at most 65535, got " + std::to_string(heads_q));
  return Status();
}

// Split-KV's count (0: chosen, else 1 .. kMaxSplits) and its tiles (m_block,
// head, batch, split), counted in 32 bits.
inline Status num_splits(int64_t batch, int64_t seqlen_q, int64_t heads_q, int64_t splits, int max_splits) {
  if (splits < 0 || splits > max_splits) {
    return invalid("kv_cache.num_splits: must be 0 (chosen) or 1 .. " + std::to_string(max_splits) + ", got " +
                   std::to_string(splits));
  }
  if (batch > 0 && (seqlen_q + 63) / 64 * heads_q * std::max<int64_t>(splits, 1) > kMaxExtent / batch) {
    return invalid("kv_cache.num_splits: batch * heads_q * seqlen_q / 64 * num_splits must be below 2^31");
  }
  return Status();
}

// Packed sequences' host-side arguments, both passes (the device arrays are
// trusted). Without cu_seqlens_q the other arrays are refused (a caller
// who meant packed sequences would otherwise get fixed-length results).
inline Status varlen(Varlen const& v) {
  if (v.cu_seqlens_q == nullptr) {
    if (v.cu_seqlens_k != nullptr || v.seqused_q != nullptr || v.seqused_k != nullptr) {
      return invalid("varlen.cu_seqlens_q: null pointer, but other varlen arrays given (packed sequences need both "
                     "cu_seqlens)");
    }
    return Status();
  }
  if (v.cu_seqlens_k == nullptr) return invalid("varlen.cu_seqlens_k: null pointer (needed with cu_seqlens_q)");
  for (auto const& [name, p] : {std::pair{"varlen.cu_seqlens_q", v.cu_seqlens_q},
                                std::pair{"varlen.cu_seqlens_k", v.cu_seqlens_k},
                                std::pair{"varlen.seqused_q", v.seqused_q}, std::pair{"varlen.seqused_k", v.seqused_k}}) {
    if (reinterpret_cast<uintptr_t>(p) % alignof(int32_t) != 0) return invalid(std::string(name) + ": must be 4-byte aligned");
  }
  for (auto const& [name, total] : {std::pair{"varlen.total_q", v.total_q}, std::pair{"varlen.total_k", v.total_k}}) {
    if (total < 0 || total > INT32_MAX) {
      return invalid(std::string(name) + ": must be in [0, 2^31), got " + std::to_string(total));
    }
  }
  return Status();
}

}  // namespace flash3::checks
