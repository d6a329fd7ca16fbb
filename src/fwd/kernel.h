// The FlashAttention-3 forward kernel: Algorithm 1's producer / consumer
// split, persistent over the tiles its scheduler hands out.
//
//   warpgroup 0      producer(): setmaxnreg down, TMA loads of Q, K_j, V_j
//                    (warp 0); transposer(): FP8's V_j transpose (warps 1-3)
//   warpgroups 1, 2  consumer(): setmaxnreg up, the mainloop (Algorithm 2),
//                    the epilogue
// A Kernel composes a Mainloop (loads and GEMMs), an Epilogue (O and LSE
// out) and a Scheduler (which tile next; common/tile_scheduler.h). The
// variant without warp specialization is fwd/kernel_no_ws.h.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/pipeline/pipeline.hpp>

#include "fwd/block_range.h"
#include "fwd/epilogue.h"
#include "fwd/kv_split.h"
#include "fwd/mainloop.h"
#include "fwd/pipelines.h"
#include "fwd/softmax.h"
#include "fwd/traits.h"
#include "fwd/transpose_v.h"

namespace flash3::fwd {

template <class Mainloop_, class Epilogue_, class Scheduler_>
struct Kernel {
  using MainloopT = Mainloop_;
  using EpilogueT = Epilogue_;
  using Scheduler = Scheduler_;
  using Traits = typename MainloopT::Traits;
  using SharedStorage = typename Traits::SharedStorage;
  using PipelinesT = Pipelines<Traits>;
  using QState = typename Traits::PipelineQ::PipelineState;
  using PipelineState = typename Traits::PipelineK::PipelineState;
  using TileState = typename Traits::PipelineTile::PipelineState;

  struct Params {
    typename MainloopT::Params mainloop;
    typename EpilogueT::Params epilogue;
    typename Scheduler::Params scheduler;
  };

  // With a producer warpgroup the consumers issue no loads.
  struct NoLoads {
    CUTE_DEVICE auto start(Params const&, SharedStorage&, PipelinesT&, TileCoord, BlockRange, int) {
      return [](int) {};
    }
  };

  static constexpr int kNumThreads = Traits::kNumThreads;
  static constexpr int kSmemBytes = sizeof(SharedStorage);

  // The key blocks a tile walks: its rows' under the mask, and with
  // split-KV the tile's split's run of them (producer and consumers alike).
  CUTE_DEVICE static BlockRange range_of(Params const& params, TileCoord tile) {
    BlockRange const range = block_range(params.mainloop.mask_policy(tile.batch), tile.m_block, Traits::kBlockM,
                                         Traits::kBlockN, params.mainloop.row_offset);
    if constexpr (Traits::kSplit) return split_block_range(range, tile.split, params.mainloop.num_splits);
    return range;
  }

  CUTE_DEVICE static PipelinesT make_pipelines(Params const& params, SharedStorage& smem) {
    if (threadIdx.x == 0) {
      MainloopT::prefetch_descriptors(params.mainloop);
      EpilogueT::prefetch_descriptors(params.epilogue);
    }
    int const warp_group = cutlass::canonical_warp_group_idx();
    int const warp_in_group = cutlass::canonical_warp_idx_sync() % cutlass::NumWarpsPerWarpGroup;
    return PipelinesT(smem, warp_group, warp_in_group, MainloopT::kQBytes, MainloopT::kKBytes, MainloopT::kVBytes);
  }

  CUTE_DEVICE static void run(Params const& params, char* smem_buf) {
    SharedStorage& smem = *reinterpret_cast<SharedStorage*>(smem_buf);
    PipelinesT pipes = make_pipelines(params, smem);
    __syncthreads();  // barriers initialised before anyone waits on them
    if (pipes.transposer) {
      cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegisters>();
      transposer(params, smem, pipes);
    } else if (cutlass::canonical_warp_group_idx() == 0) {
      cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegisters>();
      if (cutlass::canonical_warp_idx_sync() == 0) producer(params, smem, pipes);
    } else {
      cutlass::arch::warpgroup_reg_alloc<Traits::kConsumerRegisters>();
      consumer(params, smem, pipes, [&](int& t, TileCoord& tile, TileState& read_tile, int) {
        pipes.tile.consumer_wait(read_tile);
        t = smem.tile_index;
        tile = smem.tile;
        pipes.tile.consumer_release(read_tile);
        ++read_tile;
      });
    }
  }

  // The producer's tile loop (Algorithm 1, lines 2-10): each tile the
  // scheduler hands out, published to the consumers through pipelines.tile
  // (so a dynamic order reaches every warpgroup), then its loads.
  CUTE_DEVICE static void producer(Params const& params, SharedStorage& smem, PipelinesT& pipes) {
    bool const lane_leader = cute::elect_one_sync();
    QState write_q = cutlass::make_producer_start_state<typename Traits::PipelineQ>();
    PipelineState write_k = cutlass::make_producer_start_state<typename Traits::PipelineK>();
    PipelineState write_v = cutlass::make_producer_start_state<typename Traits::PipelineV>();
    auto write_tile = cutlass::make_producer_start_state<typename Traits::PipelineTile>();
    // V's TMA loads feed FP8's transposers, else the consumers.
    auto& pipeline_v_tma = *[&] {
      if constexpr (Traits::kFp8) {
        return &pipes.v_load;
      } else {
        return &pipes.v;
      }
    }();
    using Loads = typename MainloopT::template Loads<std::remove_reference_t<decltype(pipeline_v_tma)>>;
    auto loads_of = [&](TileCoord tile) {
      return Loads{params.mainloop, smem, pipes.q, pipes.k, pipeline_v_tma, write_q, write_k, write_v,
                   tile, lane_leader};
    };
    auto const& sp = params.scheduler;
    int const num_tiles = Scheduler::num_tiles(sp);
    // With two Q buffers each tile's Q is loaded during the tile before
    // (Mainloop::load's ahead), the first tile's here.
    int t = Scheduler::first_tile();
    TileCoord tile = t < num_tiles ? Scheduler::coord(sp, t) : TileCoord{};
    if (Traits::kQStages > 1 && t < num_tiles) loads_of(tile).q();
    for (;;) {
      pipes.tile.producer_acquire(write_tile);
      if (lane_leader) {
        smem.tile_index = t;
        smem.tile = tile;
      }
      pipes.tile.producer_commit(write_tile);
      ++write_tile;
      if (t >= num_tiles) break;
      int claim = 0, next = num_tiles;
      TileCoord next_coord{};
      MainloopT::load(
          loads_of(tile), range_of(params, tile), [&] { claim = Scheduler::claim_issue(sp); },
          [&] {
            next = Scheduler::next_tile(sp, t, claim);
            if (next < num_tiles) {
              next_coord = Scheduler::coord(sp, next);
              if constexpr (Traits::kQStages > 1) loads_of(next_coord).q();
            }
          });
      t = next;
      tile = next_coord;
    }
  }

  // FP8: each V_j, once loaded, to V_j^T for the PV GEMM (the paper's §3.3).
  CUTE_DEVICE static void transposer(Params const& params, SharedStorage& smem, PipelinesT& pipes) {
    if constexpr (Traits::kFp8) {
      int const thread_idx = threadIdx.x - cutlass::NumThreadsPerWarp;
      constexpr uint32_t kStageBytes = Traits::kBlockN * Traits::kHeadDimV;  // one byte per element
      char* const v = reinterpret_cast<char*>(smem.v.data());
      char* const vt = reinterpret_cast<char*>(smem.vt.data());
      int const num_tiles = Scheduler::num_tiles(params.scheduler);
      // V's staging slots and V^T's are filled in step: one counter of
      // V blocks gives both states (V^T's producer phase is the opposite of
      // the staging slot's consumer phase), which is all the transposers
      // hold across blocks besides the block count (registers are scarce here).
      uint32_t step = 0;
      TileState read_tile;
      for (;;) {
        pipes.tile.consumer_wait(read_tile);
        int const t = smem.tile_index;
        TileCoord const tile = smem.tile;
        pipes.tile.consumer_release(read_tile);
        ++read_tile;
        if (t >= num_tiles) break;
        BlockRange const range = range_of(params, tile);
        for (uint32_t const end = step + max(range.n_block_max - range.n_block_min, 0); step != end; ++step) {
          uint32_t const index = step % Traits::kStages, phase = (step / Traits::kStages) & 1;
          PipelineState const read_v(index, phase, 0), write_v(index, phase ^ 1, 0);
          pipes.v_load.consumer_wait(read_v);
          pipes.v.producer_acquire(write_v);
          TransposeV<Traits>::run(v + index * kStageBytes, vt + index * kStageBytes, thread_idx);
          // The GEMM reads V^T through the async proxy.
          cutlass::arch::fence_view_async_shared();
          pipes.v.producer_commit(write_v);
          pipes.v_load.consumer_release(read_v);
        }
      }
    }
  }

  // The consumers (Algorithm 1, lines 11-26): for each tile, the mainloop
  // (Algorithm 2), O / l and the LSE, and the epilogue.
  // next_tile(t, tile, read_tile, iteration) sets the next tile's index and
  // coordinates (an index >= num_tiles ends the loop). Without warp
  // specialization the consumers also issue the loads: Loader::start at a
  // tile's start, and what it returns before each key block's iteration.
  template <class NextTile, class Loader = NoLoads>
  CUTE_DEVICE static void consumer(Params const& params, SharedStorage& smem, PipelinesT& pipes,
                                   NextTile&& next_tile, Loader loader = {}) {
    int const thread_idx = threadIdx.x - Traits::kFirstConsumerThread;
    int const consumer_group = thread_idx / cutlass::NumThreadsPerWarpGroup;
    int const num_tiles = Scheduler::num_tiles(params.scheduler);
    QState read_q;
    PipelineState read_k, read_v;
    typename Traits::TiledMmaPV tiled_mma_pv;
    Tensor tOrO = partition_fragment_C(tiled_mma_pv, select<0, 1>(typename Traits::TileShapePV{}));
    OnlineSoftmax<2, Traits::kFp8 ? 8 : 0, Traits::kLazyRowMax> softmax;
    // The finished tile's O (in the output type: a quarter or half of the
    // fp32 accumulator's registers) and LSE. With kDeferEpilogue they are
    // stored during the next tile's first GEMM (DeferredEpilogue) or after
    // the last tile, else at once.
    decltype(EpilogueT::convert(tOrO)) done_o;
    float done_lse[2];
    TileCoord done_tile{};
    bool have_done = false;
    auto store_done = [&] {
      if (have_done) EpilogueT::store(params.epilogue, smem, done_o, done_lse, done_tile);
      have_done = false;
    };
    auto previous_epilogue = [&] {
      if constexpr (Traits::kDeferEpilogue) store_done();
      clear(tOrO);
    };
    MainloopT::pingpong_start(consumer_group);
    TileState read_tile;
    for (int t = Scheduler::first_tile(), iteration = 0;; ++iteration) {
      TileCoord tile;
      next_tile(t, tile, read_tile, iteration);
      if (t >= num_tiles) break;
      BlockRange const range = range_of(params, tile);
      auto load_ahead = loader.start(params, smem, pipes, tile, range, thread_idx);
      softmax.reset();
      DeferredEpilogue<decltype(previous_epilogue)> deferred{previous_epilogue};
      float const o_descale = MainloopT::mma(params.mainloop, smem, pipes.k, pipes.v, read_k, read_v, tOrO, softmax,
                                             tile, range, pipes.q, read_q, thread_idx, load_ahead, deferred);
      ++read_q;
      // Line 24: O / l and the LSE; line 25, the epilogue.
      float o_scale[2];
      softmax.finalize(o_scale, done_lse, EpilogueT::sink_log2(params.epilogue, tile.head));
      o_scale[0] *= o_descale;
      o_scale[1] *= o_descale;
      rescale_rows(tOrO, o_scale);
      done_o = EpilogueT::convert(tOrO);
      done_tile = tile;
      have_done = true;
      if constexpr (!Traits::kDeferEpilogue) store_done();
    }
    store_done();
    EpilogueT::store_tail();
  }
};

template <class KernelT>
__global__ void __launch_bounds__(KernelT::kNumThreads, 1)
    forward_kernel(CUTE_GRID_CONSTANT typename KernelT::Params const params) {
  extern __shared__ __align__(1024) char smem[];
  KernelT::run(params, smem);
}

}  // namespace flash3::fwd
