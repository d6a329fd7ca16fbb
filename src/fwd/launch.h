// Host side of one forward kernel: TMA descriptors, scheduler, grid, launch.
// Arguments have been validated by the caller.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "api/device.h"
#include "common/gmem_tensor.h"
#include "common/scale_view.h"
#include "flash3/flash3.h"
#include "fwd/kernel.h"

namespace flash3::fwd {

template <class Traits>
Status launch_forward(ForwardArgs const& a, DeviceInfo const& device, cudaStream_t stream) {
  using KernelT = Kernel<Traits>;
  typename KernelT::Params params;
  float const scale = a.softmax_scale != 0.f ? a.softmax_scale : 1.f / std::sqrt(float(a.head_dim));
  // FP8's descale factors; per-block ones are laid out by the scale blocks.
  ScaleView q_scale, k_scale, v_scale;
  if constexpr (Traits::kFp8) {
    ScaleGranularity const g = a.fp8.granularity;
    q_scale = make_scale_view(a.fp8.q, g, a.heads_q, a.seqlen_q, Traits::kBlockM);
    k_scale = make_scale_view(a.fp8.k, g, a.heads_kv, a.seqlen_k, Traits::kScaleBlockN);
    v_scale = make_scale_view(a.fp8.v, g, a.heads_kv, a.seqlen_k, Traits::kScaleBlockN);
  }
  // FwdTraits::kPartialTileFirst: the first tile starts above the sequence
  // by whole warpgroups' 64 rows (run 78).
  int const row_offset = first_tile_row_offset(a.seqlen_q, Traits::kBlockM, Traits::kPartialTileFirst);
  params.mainloop = KernelT::MainloopT::make_params(
      gmem_tensor<Traits>(a.q, a.seqlen_q, a.heads_q, a.batch), gmem_tensor<Traits>(a.k, a.seqlen_k, a.heads_kv, a.batch),
      gmem_tensor<Traits>(a.v, a.seqlen_k, a.heads_kv, a.batch), int(a.heads_q / a.heads_kv), int(a.seqlen_q),
      int(a.seqlen_k), row_offset, scale, q_scale, k_scale, v_scale);
  params.epilogue = KernelT::EpilogueT::make_params(
      gmem_tensor<Traits, void*, typename Traits::ElementO>(a.o, a.seqlen_q, a.heads_q, a.batch), a.lse,
      int(a.seqlen_q), int(a.heads_q), row_offset);

  int const num_m_blocks = int((a.seqlen_q + row_offset + Traits::kBlockM - 1) / Traits::kBlockM);
  // K and V bytes one query head reads, shared by the heads of its GQA group.
  int64_t const kv_bytes = 2 * a.seqlen_k * a.head_dim * int64_t(sizeof(typename Traits::Element)) /
                           (a.heads_q / a.heads_kv);
  int const num_tiles = num_m_blocks * int(a.heads_q) * int(a.batch);
  int const grid = a.options.persistent ? std::min(num_tiles, device.num_sms) : num_tiles;
  params.scheduler = TileScheduler::make(num_m_blocks, int(a.heads_q), int(a.batch), kv_bytes, device.l2_bytes,
                                         Traits::kCausal, grid);
  auto kernel = forward_kernel<Traits>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, KernelT::kSmemBytes);
  // A persistent grid claims its tiles dynamically (causal tiles differ in
  // cost; equal tiles gained 2-5% at seqlen 512-1k over a static order, run
  // 74) from a counter that is the stream's own, so concurrent calls on other
  // streams each have theirs (a graph gets one of its own: TileCounter).
  bool const dynamic = a.options.persistent && grid < num_tiles;
  TileCounter counter;
  if (dynamic && err == cudaSuccess) err = counter.acquire(device.id, stream);
  params.tile_counter = counter.get();
  if (err == cudaSuccess) {
    kernel<<<grid, KernelT::kNumThreads, KernelT::kSmemBytes, stream>>>(params);
    err = cudaGetLastError();
  }
  cudaError_t const release_err = counter.release(stream);
  if (err == cudaSuccess) err = release_err;
  if (err != cudaSuccess) {
    return Status(Status::Code::kCudaError, std::string("forward kernel launch: ") + cudaGetErrorString(err));
  }
  return Status();
}

}  // namespace flash3::fwd
