// Host side of split-KV: its two launches, the split kernel into float32
// partials in the call's workspace (fwd/kv_workspace.h), then the combine
// kernel into O and the LSE.
#pragma once

#include <cuda_runtime_api.h>

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
  CombineArgs combine{partials.o, partials.lse, num_splits, int(a.batch), int(a.heads_q), int(a.seqlen_q),
                      Traits::kHeadDimV, a.dtype, a.o, a.lse, a.sinks};
  if (cudaError_t const err = combine_splits(combine, stream); err != cudaSuccess) {
    return Status(Status::Code::kCudaError, std::string("split-KV combine launch: ") + cudaGetErrorString(err));
  }
  return Status();
}

}  // namespace flash3::fwd
