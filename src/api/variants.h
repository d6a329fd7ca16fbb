// Which forward kernel variants (KernelOptions) are built, without CuTe:
// validate() refuses the others before the device is touched, so the kernel
// dispatch (fwd/dispatch.h) only meets these.
#pragma once

#include <cstdint>

#include "flash3/flash3.h"

namespace flash3 {

// Whether a forward kernel is built for `options` with this dtype and head
// dim (`fp8_out_dtype`, O's dtype, counts with kE4M3 only); the arguments
// are ones validate() accepts otherwise. Every technique on: all of them.
// The paper's ablations (Table 2) only at head dim 128, where it measures
// them, to keep builds short: pingpong or the intra-warpgroup overlap off
// with bf16, or e4m3 with a bf16 O; warp specialization off with bf16 and
// the other two on. persistent only sizes the grid: any value. A narrowed
// build (FLASH3_HEAD_DIMS, FLASH3_DTYPES) does not change this: forward()
// reports an instance it left out.
constexpr bool options_built(DType dtype, int64_t head_dim, KernelOptions const& options, DType fp8_out_dtype) {
  bool const pingpong_and_overlap = options.pingpong && options.intra_warpgroup_overlap;
  if (!options.warp_specialization) return dtype == DType::kBF16 && head_dim == 128 && pingpong_and_overlap;
  if (pingpong_and_overlap) return true;
  return head_dim == 128 && (dtype == DType::kBF16 || (dtype == DType::kE4M3 && fp8_out_dtype == DType::kBF16));
}

// options_built() in words, for validate()'s message.
inline constexpr char kOptionsBuilt[] =
    "with pingpong or intra_warpgroup_overlap off, kernels are built for head_dim 128 with bf16 or e4m3 with a "
    "bf16 O; with warp_specialization off, for bf16 with head_dim 128 and the other two on";

}  // namespace flash3
