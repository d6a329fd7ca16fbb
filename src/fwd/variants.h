// The forward kernel's compile-time variants: the named options a kernel is
// compiled with (Variant, a template parameter of FwdTraits), and the one
// table of those a build holds. fwd/dispatch.h generates the dispatch from
// the table, and validate() refuses KernelOptions that no row builds. No
// CuTe here: the API layer reads it.
#pragma once

#include <cstddef>

#include "flash3/flash3.h"

namespace flash3::fwd {

// What a forward kernel is compiled for besides its dtype and head dim. The
// techniques are the paper's (KernelOptions); persistence is not among them,
// as it is the grid's choice (common/tile_scheduler.h).
struct Variant {
  bool causal = false;  // the masked kernel: the causal mask, or with `window` any sliding window
  bool window = false;  // the call's window bounds at run time (both edges masked)
  bool pingpong = true;                 // §3.1
  bool intra_warpgroup_overlap = true;  // §3.2, Algorithm 2
  bool warp_specialization = true;      // Algorithm 1's producer warpgroup
  DType fp8_out = DType::kBF16;         // FP8 only: O's dtype
  bool packed = false;                  // packed sequences (varlen): their own scheduler and offsets
  bool kv_cache = false;                // keys of a KV cache: per-entry cache row, first key and length (KvCacheMap)
  bool split = false;                   // with kv_cache: split-KV, float32 partials for the combine kernel

  constexpr Variant with_mask(bool causal, bool window) const {
    Variant v = *this;
    v.causal = causal || window;
    v.window = window;
    return v;
  }
  constexpr Variant with_packed(bool p) const {
    Variant v = *this;
    v.packed = p;
    return v;
  }
  constexpr Variant with_kv_cache(bool split_kv) const {
    Variant v = *this;
    v.kv_cache = true;
    v.split = split_kv;
    return v;
  }
  // Every technique on: the variants the window and packed kernels are built for.
  constexpr bool all_techniques() const { return pingpong && intra_warpgroup_overlap && warp_specialization; }
  // Packed sequences' kernels: every technique on, and FP8's with a bf16 O
  // only (FlashAttention-3's FP8 output), so that they add three kernels per
  // head dim, not six.
  constexpr bool packed_built(DType dtype) const {
    return all_techniques() && (dtype != DType::kE4M3 || fp8_out == DType::kBF16);
  }
  // KV cache kernels: every technique on, FP8's with a bf16 O only (as
  // packed sequences'), each split or not, without a mask or with the window
  // kernel's (which serves the causal mask too, as window_right 0): four
  // kernels per dtype and head dim.
  constexpr bool kv_cache_built(DType dtype) const { return packed_built(dtype); }
};

// A row of the table: a variant built for a dtype and one head dim, or every
// head dim the build holds; for both masks.
struct BuiltVariant {
  static constexpr int kEveryHeadDim = 0;
  DType dtype;
  int head_dim;
  Variant variant;

  constexpr bool built_for(DType d, int hdim) const {
    return dtype == d && (head_dim == kEveryHeadDim || head_dim == hdim);
  }
  // Whether a call with these arguments runs this row's kernel.
  constexpr bool selected_by(DType d, int hdim, KernelOptions const& o, DType fp8_out) const {
    return built_for(d, hdim) && variant.pingpong == o.pingpong &&
           variant.intra_warpgroup_overlap == o.intra_warpgroup_overlap &&
           variant.warp_specialization == o.warp_specialization && (d != DType::kE4M3 || variant.fp8_out == fp8_out);
  }
};

// Every kernel has all techniques on; the ablation's switches (paper Table 2)
// are built only where the paper measures them, bf16 head dim 128 (and FP8's
// at head dim 128 with a bf16 O), since each doubles that instance's kernels.
inline constexpr BuiltVariant kBuiltVariants[] = {
    {DType::kBF16, BuiltVariant::kEveryHeadDim, {}},
    {DType::kFP16, BuiltVariant::kEveryHeadDim, {}},
    {DType::kE4M3, BuiltVariant::kEveryHeadDim, {.fp8_out = DType::kBF16}},
    {DType::kE4M3, BuiltVariant::kEveryHeadDim, {.fp8_out = DType::kFP16}},
    {DType::kBF16, 128, {.pingpong = false}},
    {DType::kBF16, 128, {.intra_warpgroup_overlap = false}},
    {DType::kBF16, 128, {.pingpong = false, .intra_warpgroup_overlap = false}},
    {DType::kBF16, 128, {.warp_specialization = false}},
    {DType::kE4M3, 128, {.pingpong = false}},
    {DType::kE4M3, 128, {.intra_warpgroup_overlap = false}},
    {DType::kE4M3, 128, {.pingpong = false, .intra_warpgroup_overlap = false}},
};
inline constexpr size_t kNumBuiltVariants = sizeof(kBuiltVariants) / sizeof(kBuiltVariants[0]);
// The table in words, for validate()'s message.
inline constexpr char kBuiltVariantsInWords[] =
    "with pingpong or intra_warpgroup_overlap off, kernels are built for head_dim 128 with bf16, or e4m3 with a "
    "bf16 O; with warp_specialization off, for bf16 with head_dim 128 and the other two on";

// Whether some kernel runs a forward call with these arguments (given that
// its dtype and head dim are compiled into the build).
// The window kernels are built for the rows with every technique on.
inline constexpr char kNoWindowWithOptions[] =
    "options: the ablation's variants (a KernelOptions technique off) have no sliding-window kernel";

constexpr bool variant_built(DType dtype, int head_dim, KernelOptions const& options, DType fp8_out) {
  for (BuiltVariant const& row : kBuiltVariants) {
    if (row.selected_by(dtype, head_dim, options, fp8_out)) return true;
  }
  return false;
}

}  // namespace flash3::fwd
