// Split-KV's combine step: the splits' float32 partial O and LSE
// (fwd/split_epilogue.h's layout) reduced into O in its dtype and the final
// LSE. No CuTe here: the launch code calls it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "flash3/flash3.h"

namespace flash3::fwd {

struct CombineArgs {
  float const* o_partial;    // [num_splits, batch, heads, seqlen_q, head_dim_v]
  float const* lse_partial;  // [num_splits, batch, heads, seqlen_q]; -inf: the split saw no key for the row
  int num_splits;            // 1 .. kMaxSplits (fwd/kv_split.h)
  int batch;
  int heads;
  int seqlen_q;
  int head_dim_v;     // a multiple of 4
  DType dtype;        // O's: kBF16 or kFP16
  MutableTensor o;    // [batch, seqlen_q, heads, head_dim_v]
  float* lse;         // [batch, heads, seqlen_q], or nullptr
  float const* sinks;  // [heads], or nullptr
};

// The weights are exp(lse_s - L) with L = log(exp(sink) + sum_s exp(lse_s)):
// O = sum_s w_s O_s. A row no split saw a key for gets O = 0 and L = +inf,
// or L = sink with sinks (fwd/softmax.h's convention).
cudaError_t combine_splits(CombineArgs const& args, cudaStream_t stream);

}  // namespace flash3::fwd
