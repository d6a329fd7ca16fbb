// The one place where runtime arguments become template parameters of the
// backward kernels. Each (dtype, head dim) is compiled in its own generated
// translation unit (bwd/instantiate.cu.in).
#pragma once

#include "bwd/launch.h"
#include "bwd/traits.h"
#include "common/element.h"
#include "common/mask.h"
#include "flash3/flash3.h"

namespace flash3::bwd {

template <DType kDType, int kHeadDim>
Status run_backward(BackwardArgs const& a, DeviceInfo const& device, cudaStream_t stream) {
  using Element = ElementOf<kDType>;
  // The masked kernel serves the causal mask and every sliding window;
  // softcapping has kernels of its own.
  bool const masked = a.causal || window_of(false, a.window_left, a.window_right, a.seqlen_q, a.seqlen_k).any();
  if (a.softcap != 0.f) {
    return masked ? launch_backward<BwdTraits<Element, kHeadDim, true, true>>(a, device, stream)
                  : launch_backward<BwdTraits<Element, kHeadDim, false, true>>(a, device, stream);
  }
  return masked ? launch_backward<BwdTraits<Element, kHeadDim, true>>(a, device, stream)
                : launch_backward<BwdTraits<Element, kHeadDim, false>>(a, device, stream);
}

}  // namespace flash3::bwd
