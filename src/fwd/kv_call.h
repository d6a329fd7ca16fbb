// The steps of a KV cache call around its kernels, shared by the forward's
// KV cache kernels (fwd/dispatch_kv.h) and MLA's (fwd/mla.cu): the call's
// workspace (the caller's, checked, or allocated; fwd/kv_scratch.h), its
// append (fwd/launch_append.h), then the attention with its split-KV
// partials' place.
#pragma once

#include <cuda_runtime_api.h>

#include "common/device_info.h"
#include "flash3/flash3.h"
#include "fwd/kv_scratch.h"
#include "fwd/kv_workspace.h"
#include "fwd/launch_append.h"
#include "fwd/split_partials.h"

namespace flash3::fwd {

// attend(attended, partials): the kernels of the call as the append leaves
// it (its lengths and rotated Q), with partials.num_splits splits (1: none,
// and no partials).
template <class Attend>
Status run_kv_call(ForwardArgs const& a, DeviceInfo const& device, cudaStream_t stream, Attend&& attend) {
  int const splits = num_splits_of(a, device.num_sms);
  KvWorkspaceLayout const layout = kv_workspace_layout(a, splits);
  return with_kv_workspace(a, layout, stream, [&](char* block) {
    return with_append(a, block, layout, stream, [&](ForwardArgs const& appended) {
      SplitPartials partials;
      partials.num_splits = splits;
      if (splits > 1) {
        partials.o = reinterpret_cast<float*>(block + layout.partial_o);
        partials.lse = reinterpret_cast<float*>(block + layout.partial_lse);
      }
      return attend(appended, partials);
    });
  });
}

}  // namespace flash3::fwd
