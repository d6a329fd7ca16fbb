// Argument checks of the public API. Host code only: nothing here touches the
// device, so every check runs in CI.
#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>
#include <utility>

#include "api/checks.h"
#include "common/head_dims.h"
#include "common/kv_cache.h"
#include "common/mask.h"
#include "flash3/flash3.h"
#include "fwd/kv_split.h"
#include "fwd/variants.h"

namespace flash3 {
namespace {

using checks::invalid;

int64_t element_bytes(DType dtype) { return dtype == DType::kE4M3 ? 1 : 2; }

// Whether a call is MLA's (ForwardArgs::qv; the backward has none).
bool latent(ForwardArgs const& a) { return a.qv.data != nullptr; }
bool latent(BackwardArgs const&) { return false; }

// The sizes, head dim, scale and mask both passes share.
template <class Args>
Status check_problem(Args const& a) {
  if (Status s = checks::attention_sizes(a.batch, a.seqlen_q, a.seqlen_k, a.heads_q, a.heads_kv, a.head_dim,
                                        a.head_dim_v, latent(a));
      !s.ok()) {
    return s;
  }
  if (!std::isfinite(a.softmax_scale) || a.softmax_scale < 0.f) {
    return invalid("softmax_scale: must be finite and not negative (0 selects 1/sqrt(head_dim))");
  }
  if (a.window_left < -1) return invalid("window_left: must be -1 (unbounded) or >= 0, got " + std::to_string(a.window_left));
  if (a.window_right < -1) {
    return invalid("window_right: must be -1 (unbounded) or >= 0, got " + std::to_string(a.window_right));
  }
  if (!std::isfinite(a.softcap) || a.softcap < 0.f) {
    return invalid("softcap: must be finite and not negative (0 is off), got " + std::to_string(a.softcap));
  }
  if (a.causal && a.window_right > 0) {
    return invalid("window_right: the causal mask is window_right 0; got " + std::to_string(a.window_right) +
                   " with causal");
  }
  return Status();
}

// FP8's scales: present, aligned, and of a known granularity.
Status check_fp8(ForwardArgs const& a) {
  Fp8Scales const& f = a.fp8;
  if (head_dim_v_of(a) != a.head_dim) {
    return invalid("head_dim_v: FP8 (kE4M3) has no V head dim of its own: must be 0 or head_dim, got " +
                   std::to_string(a.head_dim_v));
  }
  if (!head_dim_supported(a.head_dim, true)) {
    return invalid("head_dim: FP8 (kE4M3) supports " + head_dim_list(true) + ", got " + std::to_string(a.head_dim));
  }
  if (f.out_dtype != DType::kBF16 && f.out_dtype != DType::kFP16) return invalid("fp8.out_dtype: must be kBF16 or kFP16");
  if (f.granularity != ScaleGranularity::kPerTensor && f.granularity != ScaleGranularity::kPerHead &&
      f.granularity != ScaleGranularity::kPerBlock) {
    return invalid("fp8.granularity: must be kPerTensor, kPerHead or kPerBlock");
  }
  if (f.q_per_kv_head && f.granularity != ScaleGranularity::kPerHead) {
    return invalid("fp8.q_per_kv_head: Q's scales per KV head are a kPerHead layout; granularity is not kPerHead");
  }
  if (a.batch == 0 || a.seqlen_q == 0) return Status();
  for (auto const& [name, scale, needed] : {std::tuple{"fp8.q", f.q, true}, std::tuple{"fp8.k", f.k, a.seqlen_k > 0},
                                            std::tuple{"fp8.v", f.v, a.seqlen_k > 0}}) {
    if (!needed) continue;
    if (Status s = checks::scale(name, scale); !s.ok()) return s;
  }
  return Status();
}

// The forward's packed kernels are built with every option on, FP8's for a
// bf16 O (fwd::Variant::packed_built).
Status check_varlen(ForwardArgs const& a) {
  if (Status s = checks::varlen(a.varlen); !s.ok() || a.varlen.cu_seqlens_q == nullptr) return s;
  if (a.dtype == DType::kE4M3 && a.fp8.out_dtype != DType::kBF16) {
    return Status(Status::Code::kUnsupported, "fp8.out_dtype: packed sequences (varlen) in FP8 write O in kBF16 "
                                              "only, got kFP16");
  }
  if (!(a.options.pingpong && a.options.intra_warpgroup_overlap && a.options.warp_specialization &&
        a.options.persistent)) {
    return Status(Status::Code::kUnsupported, "varlen: packed sequences run with every KernelOption on");
  }
  return Status();
}

// A paged cache's host-side fields (the table itself is trusted): boxes of
// 16 rows load its keys (common/kv_cache.h), so pages are whole boxes and an
// entry's keys start at a page's first row (no leftpad). Without a table its
// fields must be left unset, so that a caller who meant a paged cache does
// not get a contiguous one.
Status check_page_table(ForwardArgs const& a) {
  KvCache const& c = a.kv_cache;
  if (c.page_table == nullptr) {
    if (c.page_size != 0) return invalid("kv_cache.page_size: set without kv_cache.page_table");
    if (c.page_table_stride != 0) return invalid("kv_cache.page_table_stride: set without kv_cache.page_table");
    return Status();
  }
  if (c.page_size < PagedBoxes::kRows || c.page_size % PagedBoxes::kRows != 0 || c.page_size > checks::kMaxExtent) {
    return invalid("kv_cache.page_size: must be a positive multiple of " + std::to_string(PagedBoxes::kRows) +
                   " below 2^31, got " + std::to_string(c.page_size));
  }
  if (a.seqlen_k % c.page_size != 0) {
    return invalid("seqlen_k: a paged entry's capacity, max_pages_per_seq * page_size: must be a multiple of "
                   "kv_cache.page_size (" + std::to_string(c.page_size) + "), got " + std::to_string(a.seqlen_k));
  }
  if (c.page_table_stride < 0) {
    return invalid("kv_cache.page_table_stride: must not be negative, got " + std::to_string(c.page_table_stride));
  }
  if (c.batch_idx != nullptr) {
    return invalid("kv_cache.batch_idx: a paged cache takes none (row b of page_table is entry b's)");
  }
  if (c.leftpad != nullptr) {
    return invalid("kv_cache.leftpad: a paged cache takes none (an entry's keys start at its first page's row 0)");
  }
  return Status();
}

// An append's host-side fields (kv_cache.append; seqlens, which places its
// rows, is trusted): the new keys and values as tensors of seqlen_new rows,
// and the rotary tables as rows of rotary_dim / 2 in q's dtype, 16-byte
// vectors, covering every position a cache entry holds (seqlen_k). Without
// append.k the others must be left unset, so that a caller who meant an
// append does not get a plain call.
Status check_append(ForwardArgs const& a) {
  KvAppend const& n = a.kv_cache.append;
  if (n.k.data == nullptr) {
    if (n.v.data != nullptr) return invalid("kv_cache.append.v: given without kv_cache.append.k");
    if (n.seqlen_new != 0) return invalid("kv_cache.append.seqlen_new: set without kv_cache.append.k");
    if (n.rotary_cos != nullptr || n.rotary_sin != nullptr) {
      return invalid("kv_cache.append.rotary_cos: the rotary tables rotate appended keys: given without "
                     "kv_cache.append.k");
    }
    if (n.rotary_dim != 0) return invalid("kv_cache.append.rotary_dim: set without kv_cache.append.k");
    return Status();
  }
  if (a.kv_cache.seqlens == nullptr) return invalid("kv_cache.append.k: given without kv_cache.seqlens");
  if (n.seqlen_new < 1 || n.seqlen_new > a.seqlen_k) {
    return invalid("kv_cache.append.seqlen_new: must be in [1, seqlen_k] (" + std::to_string(a.seqlen_k) +
                   ", an entry's capacity), got " + std::to_string(n.seqlen_new));
  }
  if (a.batch > 0 && a.seqlen_q < 1) {
    return invalid("seqlen_q: an append (kv_cache.append) needs at least one query row, got 0");
  }
  int64_t const bytes = element_bytes(a.dtype);
  if (Status s = checks::tensor("kv_cache.append.k", n.k, a.batch, n.seqlen_new, a.heads_kv, a.head_dim, bytes);
      !s.ok()) {
    return s;
  }
  if (Status s = checks::tensor("kv_cache.append.v", n.v, a.batch, n.seqlen_new, a.heads_kv, head_dim_v_of(a), bytes);
      !s.ok()) {
    return s;
  }
  if (n.rotary_cos == nullptr) {
    if (n.rotary_sin != nullptr) return invalid("kv_cache.append.rotary_cos: null pointer, but rotary_sin given");
    if (n.rotary_dim != 0) return invalid("kv_cache.append.rotary_dim: set without kv_cache.append.rotary_cos");
    return Status();
  }
  if (n.rotary_sin == nullptr) return invalid("kv_cache.append.rotary_sin: null pointer, but rotary_cos given");
  for (auto const& [name, p] : {std::pair{"kv_cache.append.rotary_cos", n.rotary_cos},
                                std::pair{"kv_cache.append.rotary_sin", n.rotary_sin}}) {
    if (reinterpret_cast<uintptr_t>(p) % checks::kAlignBytes != 0) {
      return invalid(std::string(name) + ": must be 16-byte aligned");
    }
  }
  if (n.rotary_dim < 16 || n.rotary_dim % 16 != 0 || n.rotary_dim > a.head_dim) {
    return invalid("kv_cache.append.rotary_dim: must be a positive multiple of 16 up to head_dim (" +
                   std::to_string(a.head_dim) + "), got " + std::to_string(n.rotary_dim));
  }
  if (n.rotary_seqlen < a.seqlen_k || n.rotary_seqlen > checks::kMaxExtent) {
    return invalid("kv_cache.append.rotary_seqlen: the tables' rows must cover every position of an entry, at least "
                   "seqlen_k (" + std::to_string(a.seqlen_k) + ") and below 2^31, got " +
                   std::to_string(n.rotary_seqlen));
  }
  return Status();
}

// A KV cache's host-side fields (its device arrays are trusted): without
// kv_cache.seqlens the others must be left unset, so that a caller who meant
// a cache call does not get a plain one.
Status check_kv_cache(ForwardArgs const& a) {
  KvCache const& c = a.kv_cache;
  if (c.seqlens == nullptr) {
    if (c.batch_idx != nullptr || c.leftpad != nullptr) {
      return invalid("kv_cache.seqlens: null pointer, but kv_cache.batch_idx or kv_cache.leftpad given");
    }
    if (c.batch_cache != 0) return invalid("kv_cache.batch_cache: set without kv_cache.seqlens");
    if (c.page_table != nullptr) return invalid("kv_cache.page_table: given without kv_cache.seqlens");
    if (Status s = check_page_table(a); !s.ok()) return s;
    if (c.num_splits != 1) {
      return invalid("kv_cache.num_splits: split-KV runs with a KV cache (kv_cache.seqlens), got num_splits " +
                     std::to_string(c.num_splits));
    }
    if (c.workspace != nullptr || c.workspace_bytes != 0) {
      return invalid("kv_cache.workspace: given without kv_cache.seqlens");
    }
    return check_append(a);
  }
  for (auto const& [name, p] : {std::pair{"kv_cache.seqlens", c.seqlens}, std::pair{"kv_cache.batch_idx", c.batch_idx},
                                std::pair{"kv_cache.leftpad", c.leftpad}, std::pair{"kv_cache.page_table", c.page_table}}) {
    if (reinterpret_cast<uintptr_t>(p) % alignof(int32_t) != 0) return invalid(std::string(name) + ": must be 4-byte aligned");
  }
  // Its parts hold 16-byte vectors (fwd/kv_workspace.h).
  if (reinterpret_cast<uintptr_t>(c.workspace) % 16 != 0) return invalid("kv_cache.workspace: must be 16-byte aligned");
  if (c.workspace == nullptr && c.workspace_bytes != 0) {
    return invalid("kv_cache.workspace_bytes: set without kv_cache.workspace");
  }
  if (c.batch_cache < 1 || c.batch_cache > checks::kMaxExtent) {
    return invalid("kv_cache.batch_cache: must be in [1, 2^31), got " + std::to_string(c.batch_cache));
  }
  if (Status s = check_page_table(a); !s.ok()) return s;
  if (c.page_table == nullptr && c.batch_idx == nullptr && c.batch_cache < a.batch) {
    return invalid("kv_cache.batch_cache: without kv_cache.batch_idx entry b reads cache entry b, so it must be at "
                   "least batch (" + std::to_string(a.batch) + "), got " + std::to_string(c.batch_cache));
  }
  if (Status s = checks::num_splits(a.batch, a.seqlen_q, a.heads_q, c.num_splits, kMaxSplits); !s.ok()) return s;
  if (a.varlen.cu_seqlens_q != nullptr) {
    return invalid("varlen.cu_seqlens_q: packed sequences and a KV cache do not combine (give one or the other)");
  }
  if (a.dtype == DType::kE4M3) {
    if (a.fp8.out_dtype != DType::kBF16) {
      return Status(Status::Code::kUnsupported, "fp8.out_dtype: an FP8 KV cache writes O in kBF16 only, got kFP16");
    }
    // A scale block is a block of the kernel's tile rows from a sequence's
    // first row; a cache's entries start at leftpad and grow by appends.
    if (a.fp8.granularity == ScaleGranularity::kPerBlock) {
      return Status(Status::Code::kUnsupported,
                    "fp8.granularity: an FP8 KV cache takes kPerTensor or kPerHead descales, not kPerBlock");
    }
    if (a.kv_cache.append.rotary_cos != nullptr) {
      return Status(Status::Code::kUnsupported,
                    "kv_cache.append.rotary_cos: an FP8 (kE4M3) cache takes appended rows as they are, without rotary");
    }
  }
  if (!(a.options.pingpong && a.options.intra_warpgroup_overlap && a.options.warp_specialization &&
        a.options.persistent)) {
    return Status(Status::Code::kUnsupported, "kv_cache: a KV cache runs with every KernelOption on");
  }
  return check_append(a);
}

// MLA (qv): its kernels' form of the call, a bf16 KV cache without softcap
// or sinks (the head dims are attention_sizes'), and qv as q's latent part.
Status check_mla(ForwardArgs const& a) {
  if (a.qv.data == nullptr) return Status();
  if (a.kv_cache.seqlens == nullptr) {
    return Status(Status::Code::kUnsupported, "qv: MLA (qv) runs against a KV cache (kv_cache.seqlens)");
  }
  if (a.dtype != DType::kBF16) return Status(Status::Code::kUnsupported, "qv: MLA (qv) runs in kBF16");
  if (a.softcap != 0.f) return Status(Status::Code::kUnsupported, "softcap: MLA (qv) has no softcapping");
  if (a.sinks != nullptr) return Status(Status::Code::kUnsupported, "sinks: MLA (qv) has no attention sinks");
  // Its tiles' rows are a KV head's (position, query head) pairs, counted in 32 bits.
  if (a.seqlen_q * (a.heads_q / a.heads_kv) > checks::kMaxExtent) {
    return invalid("seqlen_q: MLA's rows, seqlen_q x heads_q / heads_kv, must be below 2^31");
  }
  if (a.batch == 0 || a.seqlen_q == 0) return Status();
  return checks::tensor("qv", a.qv, a.batch, a.seqlen_q, a.heads_q, a.head_dim_v, 2);
}

}  // namespace

Status validate(ForwardArgs const& a) {
  if (a.dtype != DType::kBF16 && a.dtype != DType::kFP16 && a.dtype != DType::kE4M3) {
    return invalid("dtype: must be kBF16, kFP16 or kE4M3");
  }
  bool const fp8 = a.dtype == DType::kE4M3;
  if (Status s = check_problem(a); !s.ok()) return s;
  if (fp8) {
    if (Status s = check_fp8(a); !s.ok()) return s;
    if (a.softcap != 0.f) return Status(Status::Code::kUnsupported, "softcap: the FP8 (kE4M3) forward has none");
  }
  // kUnsupported, as forward() would answer: the options are well formed, their kernel is not built.
  if (!fwd::variant_built(a.dtype, int(a.head_dim), a.options, a.fp8.out_dtype)) {
    return Status(Status::Code::kUnsupported, "options: no kernel is built for these KernelOptions with this dtype "
                                              "and head_dim " + std::to_string(a.head_dim) + " (" +
                                              fwd::kBuiltVariantsInWords + ")");
  }
  if (Window const w = window_of(a.causal, a.window_left, a.window_right, a.seqlen_q, a.seqlen_k);
      (w.left >= 0 || (!a.causal && w.right >= 0)) &&
      !(a.options.pingpong && a.options.intra_warpgroup_overlap && a.options.warp_specialization)) {
    return Status(Status::Code::kUnsupported, fwd::kNoWindowWithOptions);
  }
  bool const packed = a.varlen.cu_seqlens_q != nullptr;
  if (Status s = check_varlen(a); !s.ok()) return s;
  if (Status s = check_kv_cache(a); !s.ok()) return s;
  if (Status s = check_mla(a); !s.ok()) return s;
  // A KV cache's K and V have entries of their own; a paged cache's are
  // pages of page_size rows.
  int64_t const kv_entries = a.kv_cache.seqlens != nullptr ? a.kv_cache.batch_cache : packed ? 1 : a.batch;
  bool const paged = a.kv_cache.seqlens != nullptr && a.kv_cache.page_table != nullptr;
  if (a.batch == 0 || a.seqlen_q == 0 || (packed && a.varlen.total_q == 0)) return Status();  // nothing to write
  int64_t const in_bytes = element_bytes(a.dtype);
  int64_t const out_bytes = element_bytes(fp8 ? a.fp8.out_dtype : a.dtype);
  // Packed sequences: one batch entry of total rows.
  int64_t const entries = packed ? 1 : a.batch;
  int64_t const rows_q = packed ? a.varlen.total_q : a.seqlen_q;
  int64_t const rows_k = packed ? a.varlen.total_k : paged ? a.kv_cache.page_size : a.seqlen_k;
  if (Status s = checks::tensor("q", a.q, entries, rows_q, a.heads_q, a.head_dim, in_bytes); !s.ok()) return s;
  int64_t const head_dim_v = head_dim_v_of(a);
  if (Status s = checks::output("o", a.o, entries, rows_q, a.heads_q, head_dim_v, out_bytes); !s.ok()) return s;
  if (rows_k > 0) {
    if (Status s = checks::tensor("k", a.k, kv_entries, rows_k, a.heads_kv, a.head_dim, in_bytes); !s.ok()) return s;
    if (Status s = checks::tensor("v", a.v, kv_entries, rows_k, a.heads_kv, head_dim_v, in_bytes); !s.ok()) {
      return s;
    }
  }
  // LSE's and the sinks' layouts are fixed and dense, so they cannot overlap
  // themselves: only their alignment to check.
  if (reinterpret_cast<uintptr_t>(a.lse) % alignof(float) != 0) return invalid("lse: must be 4-byte aligned");
  if (reinterpret_cast<uintptr_t>(a.sinks) % alignof(float) != 0) return invalid("sinks: must be 4-byte aligned");
  // The kernel's atomics on the counter need its natural alignment.
  if (reinterpret_cast<uintptr_t>(a.tile_counter) % alignof(int) != 0) {
    return invalid("tile_counter: must be 4-byte aligned");
  }
  return Status();
}

Status validate(BackwardArgs const& a) {
  if (a.dtype != DType::kBF16 && a.dtype != DType::kFP16) {
    return invalid("dtype: the backward pass supports kBF16 and kFP16");
  }
  if (Status s = check_problem(a); !s.ok()) return s;
  if (Status s = checks::backward_grid(a.batch, a.heads_q); !s.ok()) return s;
  if (a.dsinks != nullptr && a.sinks == nullptr) return invalid("dsinks: given without sinks");
  for (auto const& [name, p] : {std::pair<char const*, void const*>{"sinks", a.sinks}, {"dsinks", a.dsinks}}) {
    if (reinterpret_cast<uintptr_t>(p) % alignof(float) != 0) return invalid(std::string(name) + ": must be 4-byte aligned");
  }
  if (Status s = checks::varlen(a.varlen); !s.ok()) return s;
  // Packed sequences: one batch entry of total rows (the LSE [heads_q, total_q]).
  bool const packed = a.varlen.cu_seqlens_q != nullptr;
  int64_t const entries = packed ? 1 : a.batch;
  int64_t const rows_q = packed ? a.varlen.total_q : a.seqlen_q, rows_k = packed ? a.varlen.total_k : a.seqlen_k;
  if (a.batch == 0 || (rows_q == 0 && rows_k == 0)) return Status();  // no gradient to write
  int64_t const head_dim_v = head_dim_v_of(a);
  if (rows_q > 0) {
    for (auto const& [name, t, dim] : {std::tuple{"q", a.q, a.head_dim}, std::tuple{"o", a.o, head_dim_v},
                                       std::tuple{"dout", a.dout, head_dim_v}}) {
      if (Status s = checks::tensor(name, t, entries, rows_q, a.heads_q, dim, 2); !s.ok()) return s;
    }
    if (Status s = checks::output("dq", a.dq, entries, rows_q, a.heads_q, a.head_dim, 2); !s.ok()) return s;
    if (a.lse == nullptr) return invalid("lse: null pointer (the forward's LSE is needed)");
    if (reinterpret_cast<uintptr_t>(a.lse) % alignof(float) != 0) return invalid("lse: must be 4-byte aligned");
  }
  if (rows_k > 0) {
    if (Status s = checks::tensor("k", a.k, entries, rows_k, a.heads_kv, a.head_dim, 2); !s.ok()) return s;
    if (Status s = checks::tensor("v", a.v, entries, rows_k, a.heads_kv, head_dim_v, 2); !s.ok()) return s;
    if (Status s = checks::output("dk", a.dk, entries, rows_k, a.heads_kv, a.head_dim, 2); !s.ok()) return s;
    if (Status s = checks::output("dv", a.dv, entries, rows_k, a.heads_kv, head_dim_v, 2); !s.ok()) return s;
  }
  if (reinterpret_cast<uintptr_t>(a.workspace) % 256 != 0) return invalid("workspace: must be 256-byte aligned");
  return Status();
}

}  // namespace flash3
