// Host side of a KV cache call's scratch (fwd/kv_workspace.h): the caller's
// kv_cache.workspace, refused before any launch when smaller than the call
// needs, or a block allocated and freed in stream order around the call.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "flash3/flash3.h"
#include "fwd/kv_workspace.h"

namespace flash3::fwd {

// Calls run(block) with the call's scratch block (nullptr when it needs none).
template <class Run>
Status with_kv_workspace(ForwardArgs const& a, KvWorkspaceLayout const& layout, cudaStream_t stream, Run&& run) {
  if (layout.bytes == 0) return run(static_cast<char*>(nullptr));
  if (a.kv_cache.workspace != nullptr) {
    if (a.kv_cache.workspace_bytes < layout.bytes) {
      return Status(Status::Code::kInvalidArgument,
                    "kv_cache.workspace_bytes: this call needs " + std::to_string(layout.bytes) +
                        " bytes of workspace (plan_kv_cache), got " + std::to_string(a.kv_cache.workspace_bytes));
    }
    return run(static_cast<char*>(a.kv_cache.workspace));
  }
  void* block = nullptr;
  if (cudaError_t const err = cudaMallocAsync(&block, layout.bytes, stream); err != cudaSuccess) {
    return Status(Status::Code::kCudaError, std::string("kv_cache: scratch: ") + cudaGetErrorString(err));
  }
  Status status = run(static_cast<char*>(block));
  // Freed in stream order, after the kernels that use it, launched or not.
  cudaError_t const free_err = cudaFreeAsync(block, stream);
  if (status.ok() && free_err != cudaSuccess) {
    status = Status(Status::Code::kCudaError, std::string("kv_cache: scratch: ") + cudaGetErrorString(free_err));
  }
  return status;
}

}  // namespace flash3::fwd
