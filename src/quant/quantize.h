// The launcher of the FP8 quantization kernels (quant/quantize.cu), called by
// quantize_fp8() (api/quantize.cpp) once the arguments are validated.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "flash3/flash3.h"

namespace flash3::quant {

// The fewest rows a CTA of the kernels handles, and the most CTAs of one
// scale block (a cluster). A launch over one tensor has at most
// batch * heads * (ceil(seqlen / kMinTileRows) + kMaxCluster - 1) CTAs (a
// last scale block of kMaxCluster CTAs may have all but its first empty; the
// per-head kernel's cluster has at most one CTA per tile), which validate()
// keeps below 2^31 (the grid's x limit); a per-head launch that takes several
// tensors takes no more than fit below it.
constexpr int64_t kMinTileRows = 32;
constexpr int kMaxCluster = 2;

// Enqueues the quantization of every non-empty tensor of `args` (validated, on
// an sm_90 device) on `stream`: for kPerBlock and kPerHead one kernel per
// tensor; for kPerTensor a memset of the scale, an amax pass and a
// quantization pass per tensor. `blocks` are fp8_block_sizes(args.head_dim):
// kUnsupported, with nothing enqueued, when they are not the ones the kernels
// were compiled for; kCudaError when a launch fails.
Status launch_quantize(QuantizeArgs const& args, Fp8BlockSizes blocks, cudaStream_t stream);

}  // namespace flash3::quant
