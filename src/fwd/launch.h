// Host side of one forward kernel: its composition, TMA descriptors,
// scheduler, grid, launch. Arguments have been validated by the caller.
#pragma once

#include <cuda_runtime_api.h>

#include <cmath>
#include <string>
#include <type_traits>

#include "common/device_info.h"
#include "common/dynamic_smem.h"
#include "common/gmem_tensor.h"
#include "common/kv_cache.h"
#include "common/scale_view.h"
#include "common/softcap.h"
#include "common/split_scheduler.h"
#include "common/tile_scheduler.h"
#include "common/varlen_scheduler.h"
#include "flash3/flash3.h"
#include "fwd/kernel.h"
#include "fwd/kernel_no_ws.h"
#include "fwd/split_epilogue.h"
#include "fwd/split_partials.h"

namespace flash3::fwd {

// The kernel of a variant: Algorithm 1's warp-specialized kernel (packed
// sequences' and split-KV's with their schedulers, split-KV's with its
// epilogue), or the ablation's without a producer.
template <class Traits>
using ForwardKernel = std::conditional_t<
    Traits::kWarpSpecialized,
    Kernel<Mainloop<Traits>, std::conditional_t<Traits::kSplit, SplitEpilogue<Traits>, Epilogue<Traits>>,
           std::conditional_t<Traits::kSplit, SplitTileScheduler,
                              std::conditional_t<Traits::kPacked, VarlenTileScheduler, PersistentTileScheduler>>>,
    KernelNoWS<Mainloop<Traits>, Epilogue<Traits>, PersistentTileScheduler>>;

template <class Traits>
Status launch_forward(ForwardArgs const& a, DeviceInfo const& device, cudaStream_t stream,
                      SplitPartials const& partials = {}) {
  using KernelT = ForwardKernel<Traits>;
  typename KernelT::Params params;
  float const scale = a.softmax_scale != 0.f ? a.softmax_scale : 1.f / std::sqrt(float(a.head_dim));
  // FP8's descale factors; per-block ones are laid out by the scale blocks
  // (packed sequences': of the longest sequence, seqlen_q and seqlen_k).
  ScaleView q_scale, k_scale, v_scale;
  if constexpr (Traits::kFp8) {
    ScaleGranularity const g = a.fp8.granularity;
    q_scale = make_scale_view(a.fp8.q, g, a.heads_q, a.seqlen_q, Traits::kBlockM,
                              a.fp8.q_per_kv_head ? a.heads_q / a.heads_kv : 1);
    k_scale = make_scale_view(a.fp8.k, g, a.heads_kv, a.seqlen_k, Traits::kBlockN);
    v_scale = make_scale_view(a.fp8.v, g, a.heads_kv, a.seqlen_k, Traits::kBlockN);
  }
  // FwdTraits::kPartialTileFirst: the first tile starts above the sequence
  // by whole warpgroups' 64 rows.
  // Packed sequences (varlen) are one batch entry of total rows; each
  // starts at a tile of its own (no partial tile first).
  constexpr bool packed = Traits::kPacked;
  SequenceLengths const lengths{a.varlen.cu_seqlens_q, a.varlen.cu_seqlens_k, a.varlen.seqused_q,
                                a.varlen.seqused_k};
  int64_t const rows_q = packed ? a.varlen.total_q : a.seqlen_q, rows_k = packed ? a.varlen.total_k : a.seqlen_k;
  int64_t const entries = packed ? 1 : a.batch;
  // A KV cache's K and V have entries of their own (cache_batch_idx picks
  // one); a paged cache's are its pages, of page_size rows.
  int64_t const kv_entries = Traits::kKvCache ? a.kv_cache.batch_cache : entries;
  bool const paged = Traits::kKvCache && a.kv_cache.page_table != nullptr;
  int64_t const kv_rows = paged ? a.kv_cache.page_size : rows_k;
  KvCacheMap const cache{a.kv_cache.seqlens,    a.kv_cache.batch_idx,         a.kv_cache.leftpad,
                         a.kv_cache.page_table, a.kv_cache.page_table_stride, int(a.kv_cache.page_size)};
  int const row_offset =
      packed ? 0 : first_tile_row_offset(a.seqlen_q, Traits::kBlockM, Traits::kPartialTileFirst);
  using Element = typename Traits::Element;
  constexpr int kHeadDim = Traits::kHeadDim, kHeadDimV = Traits::kHeadDimV;
  params.mainloop = KernelT::MainloopT::make_params(
      gmem_tensor<kHeadDim, Element>(a.q, rows_q, a.heads_q, entries),
      gmem_tensor<kHeadDim, Element>(a.k, kv_rows, a.heads_kv, kv_entries),
      gmem_tensor<kHeadDimV, Element>(a.v, kv_rows, a.heads_kv, kv_entries), int(a.heads_q / a.heads_kv),
      int(a.seqlen_q), int(a.seqlen_k), lengths, row_offset,
      window_of(a.causal, a.window_left, a.window_right, a.seqlen_q, a.seqlen_k), scale, softcap_of(a.softcap, scale),
      q_scale, k_scale, v_scale, cache, partials.num_splits);
  if constexpr (Traits::kSplit) {
    params.epilogue = SplitEpilogue<Traits>::make_params(partials.o, partials.lse, int(a.seqlen_q), int(a.heads_q),
                                                         int(a.batch));
  } else {
    params.epilogue = Epilogue<Traits>::make_params(
        gmem_tensor<kHeadDimV, typename Traits::ElementO>(a.o, rows_q, a.heads_q, entries), a.lse, a.sinks,
        int(a.seqlen_q), int(a.heads_q), row_offset, lengths, int(rows_q));
  }

  int const num_m_blocks = int((a.seqlen_q + row_offset + Traits::kBlockM - 1) / Traits::kBlockM);
  // K and V bytes one query head reads, shared by the heads of its GQA group.
  int64_t const key_bytes = (kHeadDim + kHeadDimV) * int64_t(sizeof(Element));
  int64_t const kv_bytes = a.seqlen_k * key_bytes / (a.heads_q / a.heads_kv);
  auto kernel = forward_kernel<KernelT>;
  cudaError_t err = allow_dynamic_smem<forward_kernel<KernelT>>(device.id, KernelT::kSmemBytes);
  typename KernelT::Scheduler::Launch launch;
  if (err == cudaSuccess) {
    if constexpr (packed) {
      VarlenTileOrder order;
      order.lengths = lengths;
      order.batch = int(a.batch);
      order.num_heads = int(a.heads_q);
      order.block_m = Traits::kBlockM;
      order.block_n = Traits::kBlockN;
      order.kv_bytes_per_key = key_bytes / (a.heads_q / a.heads_kv);
      order.causal = Traits::kCausal;
      int64_t const max_tiles = int64_t(num_m_blocks) * a.heads_q * a.batch;
      err = launch.prepare(order, int(std::min<int64_t>(max_tiles, INT_MAX)), device, a.tile_counter, stream);
    } else if constexpr (Traits::kSplit) {
      err = launch.prepare(num_m_blocks, partials.num_splits, int(a.heads_q), int(a.batch), kv_bytes,
                           Traits::kCausal, device, a.tile_counter, stream);
    } else {
      err = launch.prepare(num_m_blocks, int(a.heads_q), int(a.batch), kv_bytes, Traits::kCausal,
                           a.options.persistent, device, a.tile_counter, stream);
    }
  }
  if (err == cudaSuccess) {
    params.scheduler = launch.params();
    kernel<<<launch.grid(), KernelT::kNumThreads, KernelT::kSmemBytes, stream>>>(params);
    err = cudaGetLastError();
  }
  cudaError_t const finish_err = launch.finish(stream);
  if (err == cudaSuccess) err = finish_err;
  if (err != cudaSuccess) {
    return Status(Status::Code::kCudaError, std::string("forward kernel launch: ") + cudaGetErrorString(err));
  }
  return Status();
}

}  // namespace flash3::fwd
