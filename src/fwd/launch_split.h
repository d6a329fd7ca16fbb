// Host side of split-KV: its two launches, the split kernel into float32
// partials in the call's workspace (fwd/kv_workspace.h), then the combine
// kernel into O and the LSE (fwd/split_partials.h).
#pragma once

#include "common/device_info.h"
#include "flash3/flash3.h"
#include "fwd/launch.h"
#include "fwd/split_partials.h"

namespace flash3::fwd {

template <class Traits>
Status launch_split_forward(ForwardArgs const& a, DeviceInfo const& device, SplitPartials const& partials,
                            cudaStream_t stream) {
  static_assert(Traits::kSplit);
  if (Status s = launch_forward<Traits>(a, device, stream, partials); !s.ok()) return s;
  return combine_partials(a, partials, Traits::kHeadDimV, Traits::kFp8 ? a.fp8.out_dtype : a.dtype, stream);
}

}  // namespace flash3::fwd
