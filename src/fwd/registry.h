// The forward instances a build contains, without CuTe: the API layer calls
// these, and the generated instantiate_*.cu files define them.
#pragma once

#include "common/device_info.h"
#include "flash3/flash3.h"

namespace flash3::fwd {

// kHeadDimV: V's head dim, kHeadDim unless a pair of common/head_dims.inc.
template <DType kDType, int kHeadDim, int kHeadDimV>
Status run_forward_instance(ForwardArgs const& a, DeviceInfo const& device, cudaStream_t stream);

// A KV cache call (ForwardArgs::kv_cache) of an instance: defined in
// the instance's KV unit (fwd/instantiate_kv.cu.in), called by its forward
// unit's dispatch.
template <DType kDType, int kHeadDim, int kHeadDimV>
Status run_kv_cache_instance(ForwardArgs const& a, DeviceInfo const& device, cudaStream_t stream);

// An MLA call (ForwardArgs::qv): fwd/mla.cu, in builds with FLASH3_MLA.
Status run_mla(ForwardArgs const& a, DeviceInfo const& device, cudaStream_t stream);

}  // namespace flash3::fwd
