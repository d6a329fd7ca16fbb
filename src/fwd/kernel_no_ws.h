// The forward kernel without warp specialization (the ablation of Algorithm
// 1's producer): only the consumer warpgroups, which issue the TMA loads
// themselves between their GEMMs and claim their tiles among themselves.
// The consumer loop is fwd::Kernel's.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "fwd/kernel.h"

namespace flash3::fwd {

template <class Mainloop_, class Epilogue_, class Scheduler_>
struct KernelNoWS {
  using Base = Kernel<Mainloop_, Epilogue_, Scheduler_>;
  using MainloopT = typename Base::MainloopT;
  using Scheduler = typename Base::Scheduler;
  using Traits = typename Base::Traits;
  using Params = typename Base::Params;
  using SharedStorage = typename Base::SharedStorage;
  using PipelinesT = typename Base::PipelinesT;
  using QState = typename Base::QState;
  using PipelineState = typename Base::PipelineState;
  static_assert(!Traits::kWarpSpecialized);
  static constexpr int kNumThreads = Traits::kNumThreads;
  static constexpr int kSmemBytes = Base::kSmemBytes;

  // Consumer thread 0 issues the loads: at the start of a tile Q and the
  // first blocks, then before each key block's iteration the blocks one
  // stage ahead (Mainloop::load_first_blocks, load_ahead).
  struct Loader {
    QState write_q = cutlass::make_producer_start_state<typename Traits::PipelineQ>();
    PipelineState write_k = cutlass::make_producer_start_state<typename Traits::PipelineK>();
    PipelineState write_v = cutlass::make_producer_start_state<typename Traits::PipelineV>();

    // The tile's first loads; returns the loads ahead of key block n.
    CUTE_DEVICE auto start(Params const& params, SharedStorage& smem, PipelinesT& pipes, TileCoord tile,
                           BlockRange range, int thread_idx) {
      typename MainloopT::template Loads<typename Traits::PipelineV> const loads{
          params.mainloop, smem, pipes.q, pipes.k, pipes.v, write_q, write_k, write_v, tile, true};
      if (thread_idx == 0) MainloopT::load_first_blocks(loads, range);
      __syncwarp();
      return [loads, range, thread_idx](int n_block) {
        if (thread_idx == 0) MainloopT::load_ahead(loads, range, n_block);
        __syncwarp();
      };
    }
  };

  CUTE_DEVICE static void run(Params const& params, char* smem_buf) {
    SharedStorage& smem = *reinterpret_cast<SharedStorage*>(smem_buf);
    PipelinesT pipes = Base::make_pipelines(params, smem);
    __syncthreads();  // barriers initialised before anyone waits on them
    auto const& sp = params.scheduler;
    int const thread_idx = threadIdx.x;
    // The first tile by blockIdx; each next one claimed by the first warp
    // once every consumer is past the previous tile (the index's slot is free).
    auto next_tile = [&](int& t, TileCoord& tile, auto&, int iteration) {
      if (iteration > 0) {
        cutlass::arch::NamedBarrier::sync(Traits::kNumConsumerThreads, uint32_t(Barrier::kTileStart));
        if (thread_idx < cutlass::NumThreadsPerWarp) {
          t = Scheduler::next_tile(sp, t, Scheduler::claim_issue(sp));
          if (thread_idx == 0) smem.tile_index = t;
        }
        cutlass::arch::NamedBarrier::sync(Traits::kNumConsumerThreads, uint32_t(Barrier::kTileStart));
        t = smem.tile_index;
      }
      if (t < Scheduler::num_tiles(sp)) tile = Scheduler::coord(sp, t);
    };
    Base::consumer(params, smem, pipes, next_tile, Loader{});
  }
};

}  // namespace flash3::fwd
