// The FlashAttention-3 backward kernel (paper Algorithm 3): one CTA per
// (key block j, query head, batch), or per part of one in the last wave, as
// its Scheduler hands them out (bwd/scheduler.h). A Kernel composes a
// Mainloop (loads, the five GEMMs, dQ), an Epilogue (dK, dV) and the Scheduler.
//
//   warpgroup 0, warp 0   producer: setmaxnreg down, TMA loads of K_j, V_j,
//                         then Q_i, dO_i for each query block i
//   warpgroup 0, warp 1   dq_writer: adds each dQ_i to global memory (at d = 256
//                         only in deterministic mode; Mainloop::consumers_add_dq)
//                         and counts the key block in
//   warpgroup 0, warp 2   lse_loader: LSE_i, D_i, once the preprocess (which
//                         runs beside this kernel) has done the head
//   warpgroups 1, 2       consumers: setmaxnreg up, the five GEMMs per query
//                         block, then dK_j and dV_j
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/pipeline/pipeline.hpp>

#include "bwd/epilogue.h"
#include "bwd/mainloop.h"
#include "bwd/scheduler.h"
#include "bwd/tail_split.h"
#include "bwd/traits.h"
#include "common/dependent_launch.h"

namespace flash3::bwd {

template <class Mainloop_, class Epilogue_, class Scheduler_>
struct Kernel {
  using MainloopT = Mainloop_;
  using EpilogueT = Epilogue_;
  using Scheduler = Scheduler_;
  using Traits = typename MainloopT::Traits;
  using SharedStorage = typename Traits::SharedStorage;
  using PipelineQ = typename Traits::PipelineQ;
  using PipelinedO = typename Traits::PipelinedO;
  using PipelinedQ = typename Traits::PipelinedQ;
  using PipelineLseD = typename Traits::PipelineLseD;
  using Work = typename Scheduler::Work;

  struct Params {
    typename MainloopT::Params mainloop;
    typename EpilogueT::Params epilogue;
    typename Scheduler::Params scheduler;
  };

  CUTE_DEVICE static Work work(Params const& p) { return Scheduler::work(p.scheduler); }

  // The query blocks a CTA's work visits.
  CUTE_DEVICE static QueryRange range_of(Params const& p, SharedStorage const& smem, Work const& w) {
    return part_range(MainloopT::query_range(p.mainloop, smem, w.n_block), w.part.part, w.part.parts);
  }

  static constexpr int kNumThreads = Traits::kNumThreads;
  static constexpr int kSmemBytes = sizeof(SharedStorage);

  // A TMA pipeline from a warp of warpgroup 0, whose first thread issues,
  // to the consumers.
  template <class Pipeline>
  CUTE_DEVICE static Pipeline make_load_pipeline(typename Pipeline::SharedStorage& storage, uint32_t bytes,
                                                 int warp_group, int warp) {
    typename Pipeline::Params params;
    params.transaction_bytes = bytes;
    params.role = warp_group == 0 ? Pipeline::ThreadCategory::Producer : Pipeline::ThreadCategory::Consumer;
    params.is_leader = threadIdx.x == warp * cutlass::NumThreadsPerWarp;
    params.num_consumers = Traits::kNumConsumerThreads;
    return Pipeline(storage, params, Shape<_1, _1, _1>{});
  }

  CUTE_DEVICE static void run(Params const& params, char* smem_buf) {
    SharedStorage& smem = *reinterpret_cast<SharedStorage*>(smem_buf);
    int const warp_group = cutlass::canonical_warp_group_idx();
    int const warp_in_group = cutlass::canonical_warp_idx_sync() % cutlass::NumWarpsPerWarpGroup;
    auto const& mp = params.mainloop;
    // Packed sequences: the grid is the longest sequence's key blocks
    // (seqlen_k); a CTA past its own sequence's keys has no dK or dV rows to
    // write. The others read their sequence into the slot.
    if constexpr (Traits::kPacked) {
      Work const w = work(params);
      if (w.n_block * Traits::kBlockN >= packed_len_k(mp.lengths, w.batch)) return;
      if (threadIdx.x == 0) read_sequence(smem.sequence, mp.lengths, w.batch, Traits::kBlockM);
    }

    if (threadIdx.x == 0) {
      MainloopT::prefetch_descriptors(mp);
      EpilogueT::prefetch_descriptors(params.epilogue);
      smem.barrier_kv.init(/*arrive_count=*/1);
    }
    auto pipeline_q = make_load_pipeline<PipelineQ>(smem.pipeline_q, MainloopT::kQBytes, warp_group, 0);
    auto pipeline_do = make_load_pipeline<PipelinedO>(smem.pipeline_do, MainloopT::kdOBytes, warp_group, 0);
    auto pipeline_lse = make_load_pipeline<PipelineLseD>(smem.pipeline_lse, MainloopT::kLseDBytes, warp_group, 2);
    // dQ_i's buffer: the consumers fill it, the dq_writer empties it.
    typename PipelinedQ::Params dq_params;
    dq_params.role = warp_group == 0 ? PipelinedQ::ThreadCategory::Consumer : PipelinedQ::ThreadCategory::Producer;
    dq_params.producer_arv_count = Traits::kNumConsumerThreads;
    dq_params.consumer_arv_count = cutlass::NumThreadsPerWarp;
    PipelinedQ pipeline_dq(smem.pipeline_dq, dq_params);
    __syncthreads();  // barriers initialised (and the sequence read) before anyone waits on them
    // The postprocess may start on the SMs this grid's last wave frees. (The
    // preprocess runs beside this grid: Mainloop::load_lse_d waits for it.)
    let_dependents_start();
    bool const producer = warp_group == 0 && warp_in_group == 0;

    // Each role decodes the CTA's work itself (Scheduler::work).
    if (warp_group == 0) {
      cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegisters>();
      Work const w = work(params);
      QueryRange const range = range_of(params, smem, w);
      if (producer) {
        // Producer (lines 3-4, 6).
        MainloopT::load(mp, smem, pipeline_q, pipeline_do, w.n_block, w.head, w.batch, range);
      } else if (warp_in_group == 1) {
        MainloopT::write_dq(mp, smem, pipeline_dq, w.n_block, w.head, w.batch, range,
                            threadIdx.x % cutlass::NumThreadsPerWarp);
      } else if (warp_in_group == 2) {
        MainloopT::load_lse_d(mp, smem, pipeline_lse, w.head, w.batch, range);
      }
    } else {
      // Consumers (lines 5, 7-16).
      cutlass::arch::warpgroup_reg_alloc<Traits::kConsumerRegisters>();
      int const thread_idx = threadIdx.x - cutlass::NumThreadsPerWarpGroup;
      Tensor tdKrdK = partition_fragment_C(typename Traits::TiledMmadK{}, select<0, 1>(typename Traits::TileShapedK{}));
      Tensor tdVrdV = partition_fragment_C(typename Traits::TiledMmadV{}, select<0, 1>(typename Traits::TileShapedV{}));
      clear(tdKrdK);
      clear(tdVrdV);
      Work const w = work(params);
      MainloopT::mma(mp, smem, pipeline_q, pipeline_do, pipeline_lse, pipeline_dq, tdKrdK, tdVrdV, w.n_block, w.head,
                     w.batch, range_of(params, smem, w), thread_idx);
      // The CTA's work is decoded again rather than held through the mainloop
      // (as blockIdx was read again before the tail split).
      Work const done = work(params);
      if (done.part.parts > 1 &&
          !EpilogueT::gather_parts(params.epilogue, smem, tdKrdK, tdVrdV, done.part, thread_idx)) {
        return;
      }
      EpilogueT::store(params.epilogue, smem, tdKrdK, tdVrdV, done.n_block, done.head, done.batch, thread_idx);
    }
  }
};

template <class KernelT>
__global__ void __launch_bounds__(KernelT::kNumThreads, 1)
    backward_kernel(CUTE_GRID_CONSTANT typename KernelT::Params const params) {
  extern __shared__ __align__(1024) char smem[];
  KernelT::run(params, smem);
}

}  // namespace flash3::bwd
