// The combine kernel (CombineArgs, flash3.h): split-KV's partials, or a
// caller's (combine()), reduced into O in its dtype and the final LSE. No
// CuTe here: the launch code and the API call it.
#pragma once

#include <cuda_runtime_api.h>

#include "flash3/flash3.h"

namespace flash3::fwd {

// Enqueues the kernel for valid arguments with at least one row.
cudaError_t combine_splits(CombineArgs const& args, cudaStream_t stream);

}  // namespace flash3::fwd
