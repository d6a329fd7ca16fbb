// Host side of split-KV: its two launches, the split kernel into float32
// partials in the call's workspace (fwd/kv_workspace.h), then the combine
// kernel into O and the LSE.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "common/device_info.h"
#include "flash3/flash3.h"
#include "fwd/combine.h"
#include "fwd/launch.h"

namespace flash3::fwd {

template <class Traits>
Status launch_split_forward(ForwardArgs const& a, DeviceInfo const& device, int num_splits, float* partial_o,
                            float* partial_lse, cudaStream_t stream) {
  static_assert(Traits::kSplit);
  SplitPartials partials;
  partials.o = partial_o;
  partials.lse = partial_lse;
  partials.num_splits = num_splits;
  if (Status s = launch_forward<Traits>(a, device, stream, partials); !s.ok()) return s;
  // The partials as SplitEpilogue lays them out: O [splits, batch, heads,
  // seqlen_q, head_dim_v] and the LSE [splits, batch, heads, seqlen_q].
  int64_t const dv = Traits::kHeadDimV, sq = a.seqlen_q, per_batch = a.heads_q * sq;
  CombineArgs combine;
  combine.num_splits = num_splits;
  combine.batch = a.batch;
  combine.seqlen = sq;
  combine.heads = a.heads_q;
  combine.head_dim = dv;
  combine.o_partial = {partial_o, per_batch * dv, dv, sq * dv, 1};
  combine.o_partial_split_stride = a.batch * per_batch * dv;
  combine.lse_partial = partial_lse;
  combine.lse_split_stride = a.batch * per_batch;
  combine.lse_batch_stride = per_batch;
  combine.lse_seq_stride = 1;
  combine.lse_head_stride = sq;
  combine.out_dtype = Traits::kFp8 ? a.fp8.out_dtype : a.dtype;
  combine.out = a.o;
  combine.lse = a.lse;
  combine.sinks = a.sinks;
  if (cudaError_t const err = combine_splits(combine, stream); err != cudaSuccess) {
    return Status(Status::Code::kCudaError, std::string("split-KV combine launch: ") + cudaGetErrorString(err));
  }
  return Status();
}

}  // namespace flash3::fwd
