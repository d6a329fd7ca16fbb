// The one place where runtime arguments become template parameters of the
// forward kernel. Each (dtype, head dim) is compiled in its own generated
// translation unit (fwd/instantiate.cu.in) that instantiates run_forward.
#pragma once

#include "api/device.h"
#include "common/element.h"
#include "flash3/flash3.h"
#include "fwd/launch.h"
#include "fwd/traits.h"

namespace flash3::fwd {

// The ablation variants (paper Table 2) are compiled for the configuration
// the paper measures them on, bf16 with head dim 128, to keep builds short.
template <DType kDType, int kHeadDim>
constexpr bool kHasAblations = kDType == DType::kBF16 && kHeadDim == 128;

template <DType kDType, int kHeadDim, bool kCausal>
Status run_forward_causal(ForwardArgs const& a, DeviceInfo const& device, cudaStream_t stream) {
  using Element = ElementOf<kDType>;
  bool const pingpong = a.options.pingpong;
  bool const overlap = a.options.intra_warpgroup_overlap;
  if constexpr (kDType == DType::kE4M3) {
    // FP8: O in bf16 or fp16; the ablation variants with head dim 128 and a
    // bf16 O.
    using BF16 = cutlass::bfloat16_t;
    if (pingpong && overlap) {
      return a.fp8.out_dtype == DType::kBF16
                 ? launch_forward<FwdTraits<Element, kHeadDim, kCausal, true, true, BF16>>(a, device, stream)
                 : launch_forward<FwdTraits<Element, kHeadDim, kCausal, true, true, cutlass::half_t>>(a, device, stream);
    }
    if constexpr (kHeadDim == 128) {
      if (a.fp8.out_dtype == DType::kBF16) {
        if (!pingpong && overlap) return launch_forward<FwdTraits<Element, kHeadDim, kCausal, false, true, BF16>>(a, device, stream);
        if (pingpong && !overlap) return launch_forward<FwdTraits<Element, kHeadDim, kCausal, true, false, BF16>>(a, device, stream);
        return launch_forward<FwdTraits<Element, kHeadDim, kCausal, false, false, BF16>>(a, device, stream);
      }
    }
  } else {
    if (!a.options.warp_specialization) {
      if constexpr (kHasAblations<kDType, kHeadDim>) {
        if (pingpong && overlap) {
          return launch_forward<FwdTraits<Element, kHeadDim, kCausal, true, true, Element, false>>(a, device, stream);
        }
      }
      return Status(Status::Code::kUnsupported,
                    "options: switching off warp_specialization is only built for bf16 with head_dim 128, with "
                    "pingpong and intra_warpgroup_overlap on");
    }
    if (pingpong && overlap) {
      return launch_forward<FwdTraits<Element, kHeadDim, kCausal, true, true>>(a, device, stream);
    }
    if constexpr (kHasAblations<kDType, kHeadDim>) {
      if (!pingpong && overlap) return launch_forward<FwdTraits<Element, kHeadDim, kCausal, false, true>>(a, device, stream);
      if (pingpong && !overlap) return launch_forward<FwdTraits<Element, kHeadDim, kCausal, true, false>>(a, device, stream);
      return launch_forward<FwdTraits<Element, kHeadDim, kCausal, false, false>>(a, device, stream);
    }
  }
  return Status(Status::Code::kUnsupported,
                "options: switching off pingpong or intra_warpgroup_overlap is only built for head_dim 128 (bf16, or "
                "e4m3 with a bf16 O)");
}

template <DType kDType, int kHeadDim>
Status run_forward(ForwardArgs const& a, DeviceInfo const& device, cudaStream_t stream) {
  return a.causal ? run_forward_causal<kDType, kHeadDim, true>(a, device, stream)
                  : run_forward_causal<kDType, kHeadDim, false>(a, device, stream);
}

}  // namespace flash3::fwd
