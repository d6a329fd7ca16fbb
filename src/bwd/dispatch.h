// Where runtime arguments become template parameters of the backward kernels.
// Each (dtype, head dim, V's head dim, softcapping, packed sequences) is
// compiled in its own generated translation unit (bwd/instantiate.cu.in),
// which the API layer picks; here the mask picks the kernel.
#pragma once

#include "bwd/launch.h"
#include "bwd/traits.h"
#include "common/element.h"
#include "common/mask.h"
#include "flash3/flash3.h"

namespace flash3::bwd {

template <DType kDType, int kHeadDim, int kHeadDimV, bool kSoftcap, bool kPacked>
Status run_backward(BackwardArgs const& a, DeviceInfo const& device, cudaStream_t stream) {
  using Element = ElementOf<kDType>;
  // Packed sequences run on the masked kernel alone, which serves unmasked
  // calls as well (its mask then only bounds the keys): one kernel, not two.
  if constexpr (kPacked) {
    return launch_backward<BwdTraits<Element, kHeadDim, true, kSoftcap, true, kHeadDimV>>(a, device, stream);
  } else {
    // The masked kernel serves the causal mask and every sliding window.
    bool const masked = a.causal || window_of(false, a.window_left, a.window_right, a.seqlen_q, a.seqlen_k).any();
    return masked ? launch_backward<BwdTraits<Element, kHeadDim, true, kSoftcap, false, kHeadDimV>>(a, device, stream)
                  : launch_backward<BwdTraits<Element, kHeadDim, false, kSoftcap, false, kHeadDimV>>(a, device, stream);
  }
}

}  // namespace flash3::bwd
