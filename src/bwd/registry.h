// The backward instances a build contains, without CuTe: the API layer calls
// these, and the generated bwd_*.cu files define them.
#pragma once

#include "common/device_info.h"
#include "flash3/flash3.h"

namespace flash3::bwd {

// kHeadDimV: V's head dim, kHeadDim unless a pair of common/head_dims.inc.
// kSoftcap: the kernels with softcapping (its code lengthens the mainloop of
// the others); kPacked: those of packed sequences (varlen); each in
// translation units of their own.
template <DType kDType, int kHeadDim, int kHeadDimV, bool kSoftcap, bool kPacked>
Status run_backward_instance(BackwardArgs const& a, DeviceInfo const& device, cudaStream_t stream);

}  // namespace flash3::bwd
