// The attention sinks' gradient (BackwardArgs::dsinks). A head's sink s joins
// each of its rows' softmax as a column without a value: its probability is
// P_s = exp(s - L_i) and its dP is 0, so dLoss/ds = sum_i P_s (0 - D_i), over
// the head's rows of every batch, D_i = rowsum(dO_i o O_i) from the
// preprocess. The kernels' dQ, dK, dV need nothing more: the forward's LSE
// already holds the sink. One CTA per head sums in a fixed order, so the
// result is the same bits on every run.
#pragma once

#include <cuda_runtime_api.h>

namespace flash3::bwd {

struct SinkGradientParams {
  float const* sinks;     // [heads]
  float const* lse_log2;  // [batch, heads, padded_rows], +inf past seqlen_q (the preprocess's)
  float const* dpsum;     // same shape, 0 past seqlen_q
  float* dsinks;          // [heads], written
  int batch;
  int num_heads;
  int padded_rows;        // a multiple of 4 (whole row blocks): rows are read as float4
};

// Enqueues the sum on `stream`, after the preprocess's D and LSE.
cudaError_t launch_sink_gradient(SinkGradientParams const& p, cudaStream_t stream);

}  // namespace flash3::bwd
