// Host side of split-KV: how many splits a KV cache call takes, and its two
// launches: the split kernel into float32 partials in stream-ordered
// scratch memory, then the combine kernel into O and the LSE.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "common/device_info.h"
#include "common/int_math.h"
#include "flash3/flash3.h"
#include "fwd/combine.h"
#include "fwd/kv_split.h"
#include "fwd/launch.h"

namespace flash3::fwd {

// kv_cache.num_splits, or with 0 choose_num_splits' choice for these tiles
// and the longest sequence's key blocks (the cache's rows: cache_seqlens is
// device memory, not read here).
inline int num_splits_of(ForwardArgs const& a, DeviceInfo const& device, int block_m, int block_n) {
  if (a.kv_cache.num_splits != 0) return int(a.kv_cache.num_splits);
  int64_t const tiles = a.batch * a.heads_q * div_up(int(a.seqlen_q), block_m);
  return choose_num_splits(tiles, div_up(int(a.seqlen_k), block_n), device.num_sms);
}

template <class Traits>
Status launch_split_forward(ForwardArgs const& a, DeviceInfo const& device, int num_splits, cudaStream_t stream) {
  static_assert(Traits::kSplit);
  int64_t const rows = int64_t(num_splits) * a.batch * a.heads_q * a.seqlen_q;
  void* scratch = nullptr;
  cudaError_t err = cudaMallocAsync(&scratch, size_t(rows) * (Traits::kHeadDimV + 1) * sizeof(float), stream);
  if (err != cudaSuccess) {
    return Status(Status::Code::kCudaError, std::string("split-KV partials: ") + cudaGetErrorString(err));
  }
  SplitPartials partials;
  partials.o = static_cast<float*>(scratch);
  partials.lse = partials.o + rows * Traits::kHeadDimV;
  partials.num_splits = num_splits;
  Status status = launch_forward<Traits>(a, device, stream, partials);
  if (status.ok()) {
    CombineArgs combine{partials.o, partials.lse, num_splits, int(a.batch), int(a.heads_q), int(a.seqlen_q),
                        Traits::kHeadDimV, a.dtype, a.o, a.lse, a.sinks};
    if ((err = combine_splits(combine, stream)) != cudaSuccess) {
      status = Status(Status::Code::kCudaError, std::string("split-KV combine launch: ") + cudaGetErrorString(err));
    }
  }
  // Freed in stream order, after the kernels that use it, launched or not.
  cudaError_t const free_err = cudaFreeAsync(scratch, stream);
  if (status.ok() && free_err != cudaSuccess) {
    status = Status(Status::Code::kCudaError, std::string("split-KV partials: ") + cudaGetErrorString(free_err));
  }
  return status;
}

}  // namespace flash3::fwd
