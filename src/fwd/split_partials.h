// Split-KV's float32 partials (in the call's workspace, fwd/kv_workspace.h)
// and their reduction: the combine kernel's arguments for the partials as the
// split kernels lay them out, O [splits, batch, heads, seqlen_q, head_dim_v]
// and the LSE [splits, batch, heads, seqlen_q]. No CuTe: the forward's and
// MLA's split launches share it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "flash3/flash3.h"
#include "fwd/combine.h"

namespace flash3::fwd {

struct SplitPartials {
  float* o = nullptr;
  float* lse = nullptr;
  int num_splits = 1;
};

// Enqueues the combine of the partials of call `a` (its sizes as the split
// kernel ran them: GQA packed, if it was) into a.o (out_dtype) and a.lse.
inline Status combine_partials(ForwardArgs const& a, SplitPartials const& partials, int64_t head_dim_v,
                               DType out_dtype, cudaStream_t stream) {
  int64_t const dv = head_dim_v, sq = a.seqlen_q, per_batch = a.heads_q * sq;
  CombineArgs combine;
  combine.num_splits = partials.num_splits;
  combine.batch = a.batch;
  combine.seqlen = sq;
  combine.heads = a.heads_q;
  combine.head_dim = dv;
  combine.o_partial = {partials.o, per_batch * dv, dv, sq * dv, 1};
  combine.o_partial_split_stride = a.batch * per_batch * dv;
  combine.lse_partial = partials.lse;
  combine.lse_split_stride = a.batch * per_batch;
  combine.lse_batch_stride = per_batch;
  combine.lse_seq_stride = 1;
  combine.lse_head_stride = sq;
  combine.out_dtype = out_dtype;
  combine.out = a.o;
  combine.lse = a.lse;
  combine.sinks = a.sinks;
  if (cudaError_t const err = combine_splits(combine, stream); err != cudaSuccess) {
    return Status(Status::Code::kCudaError, std::string("split-KV combine launch: ") + cudaGetErrorString(err));
  }
  return Status();
}

}  // namespace flash3::fwd
