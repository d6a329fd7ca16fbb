// The FlashAttention-3 forward kernel: Algorithm 1's producer / consumer
// split, persistent over the tiles the scheduler hands out.
//
//   warpgroup 0      producer: setmaxnreg down, TMA loads of Q, K_j, V_j
//                    (warp 0); FP8: V_j's transpose (warps 1-3)
//   warpgroups 1, 2  consumers: setmaxnreg up, the mainloop (Algorithm 2),
//                    the epilogue
// Without warp specialization (the ablation) there are only the two
// consumer warpgroups, and their first thread issues the loads too.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/pipeline/pipeline.hpp>

#include "common/tile_scheduler.h"
#include "fwd/block_range.h"
#include "fwd/epilogue.h"
#include "fwd/mainloop.h"
#include "fwd/softmax.h"
#include "fwd/traits.h"
#include "fwd/transpose_v.h"

namespace flash3::fwd {

template <class Traits>
struct Kernel {
  using MainloopT = Mainloop<Traits>;
  using EpilogueT = Epilogue<Traits>;
  using SharedStorage = typename Traits::SharedStorage;
  using PipelineQ = typename Traits::PipelineQ;
  using QState = typename PipelineQ::PipelineState;
  using PipelineK = typename Traits::PipelineK;
  using PipelineV = typename Traits::PipelineV;
  using PipelineVLoad = typename Traits::PipelineVLoad;
  using PipelineState = typename PipelineK::PipelineState;
  using PipelineTile = typename Traits::PipelineTile;

  struct Params {
    typename MainloopT::Params mainloop;
    typename EpilogueT::Params epilogue;
    TileScheduler scheduler;
    // Zero at the launch: tiles past the first wave are then claimed with
    // atomicAdd, each CTA taking the next when it finishes one (greedy LPT
    // for the causal mask's unequal tiles; equal tiles too, which the SMs
    // finish at different times), and the launch leaves it zero. nullptr:
    // CTA c takes tiles c, c + grid, ... (no more tiles than CTAs, or the
    // ablation without persistence).
    int* tile_counter;
  };

  // The producer warp picks each next tile and hands it to the consumers
  // through pipeline_tile, so a dynamic order reaches every warpgroup.
  //
  // A launch makes exactly num_tiles claims: claims 0 .. num_tiles - grid - 1
  // hand out the tiles past the first wave, and each CTA stops after one claim
  // more. The last claim is therefore num_tiles - 1; it zeroes the counter,
  // so the next launch on the stream needs no memset (run 72).
  //
  // The producer claims (claim_issue) before waiting for the stage of its
  // tile's last block, which it would wait for anyway, so that the atomic's
  // round trip to L2 (~1k cycles) passes meanwhile; the claim's result is
  // used (next_tile) once that block is loaded (Mainloop::load, run 103).
  CUTE_DEVICE static int claim_issue(Params const& params) {
    bool const issues = params.tile_counter != nullptr && threadIdx.x % cutlass::NumThreadsPerWarp == 0;
    return issues ? atomicAdd(params.tile_counter, 1) : 0;
  }
  CUTE_DEVICE static int next_tile(Params const& params, int tile, int claim) {
    if (params.tile_counter == nullptr) return tile + gridDim.x;
    int next = 0;
    if (threadIdx.x % cutlass::NumThreadsPerWarp == 0) {
      if (claim == params.scheduler.num_tiles() - 1) atomicExch(params.tile_counter, 0);
      next = claim + gridDim.x;
    }
    return __shfl_sync(0xffffffff, next, 0);
  }

  // A TMA pipeline's roles: the producer warpgroup loads, the consumers read
  // (without warp specialization, the consumers do both).
  template <class Pipeline>
  CUTE_DEVICE static typename Pipeline::Params tma_pipeline_params(int warp_group, uint32_t bytes, bool leader) {
    typename Pipeline::Params params;
    params.transaction_bytes = bytes;
    params.role = !Traits::kWarpSpecialized ? Pipeline::ThreadCategory::ProducerConsumer
                  : warp_group == 0        ? Pipeline::ThreadCategory::Producer
                                           : Pipeline::ThreadCategory::Consumer;
    params.is_leader = leader;
    params.num_consumers = Traits::kNumConsumerThreads;
    return params;
  }

  static constexpr int kNumThreads = Traits::kNumThreads;
  static constexpr int kSmemBytes = sizeof(SharedStorage);

  CUTE_DEVICE static void run(Params const& params, char* smem_buf) {
    SharedStorage& smem = *reinterpret_cast<SharedStorage*>(smem_buf);
    int const warp_group = cutlass::canonical_warp_group_idx();
    int const warp_in_group = cutlass::canonical_warp_idx_sync() % cutlass::NumWarpsPerWarpGroup;
    bool const lane_leader = cute::elect_one_sync();

    // Algorithm 1, line 1: the pipeline objects of the circular K and V buffers.
    if (threadIdx.x == 0) {
      MainloopT::prefetch_descriptors(params.mainloop);
      EpilogueT::prefetch_descriptors(params.epilogue);
    }
    auto pipeline_params = tma_pipeline_params<PipelineK>(warp_group, MainloopT::kKVBytes, threadIdx.x == 0);
    PipelineK pipeline_k(smem.pipeline_k, pipeline_params, Shape<_1, _1, _1>{});
    // Without a leader: Loads::q() arrives itself.
    PipelineQ pipeline_q(smem.pipeline_q, tma_pipeline_params<PipelineQ>(warp_group, MainloopT::kQBytes, false),
                         Shape<_1, _1, _1>{});
    // The transposing threads: FP8's producer warps 1-3.
    bool const transposer = Traits::kFp8 && warp_group == 0 && warp_in_group != 0;
    bool const producer = Traits::kWarpSpecialized && warp_group == 0;
    auto pipeline_v = [&] {
      if constexpr (Traits::kFp8) {
        // Transposer -> consumers.
        typename PipelineV::Params params_v;
        params_v.role = transposer ? PipelineV::ThreadCategory::Producer
                        : warp_group > 0 ? PipelineV::ThreadCategory::Consumer
                                         : PipelineV::ThreadCategory::NonParticipant;
        params_v.producer_arv_count = Traits::kNumTransposeThreads;
        params_v.consumer_arv_count = Traits::kNumConsumerThreads;
        return PipelineV(smem.pipeline_v, params_v);
      } else {
        return PipelineV(smem.pipeline_v, pipeline_params, Shape<_1, _1, _1>{});
      }
    }();
    // FP8: the TMA load of V, from warp 0 to the transposers.
    auto pipeline_v_load = [&] {
      if constexpr (Traits::kFp8) {
        typename PipelineVLoad::Params params_load = pipeline_params;
        params_load.role = warp_group > 0 ? PipelineVLoad::ThreadCategory::NonParticipant
                           : transposer   ? PipelineVLoad::ThreadCategory::Consumer
                                          : PipelineVLoad::ThreadCategory::Producer;
        params_load.num_consumers = Traits::kNumTransposeThreads;
        return PipelineVLoad(smem.pipeline_v_load, params_load, Shape<_1, _1, _1>{});
      } else {
        return 0;
      }
    }();
    typename PipelineTile::Params tile_params;
    tile_params.role = producer && !transposer ? PipelineTile::ThreadCategory::Producer
                                               : PipelineTile::ThreadCategory::Consumer;
    tile_params.producer_arv_count = cutlass::NumThreadsPerWarp;
    tile_params.consumer_arv_count = Traits::kNumConsumerThreads + Traits::kNumTransposeThreads;
    PipelineTile pipeline_tile(smem.pipeline_tile, tile_params);
    __syncthreads();  // barriers initialised before anyone waits on them

    TileScheduler const& scheduler = params.scheduler;
    int const num_tiles = scheduler.num_tiles();
    auto range_of = [&](TileCoord tile) {
      return block_range(tile.m_block, Traits::kBlockM, Traits::kBlockN, params.mainloop.seqlen_q,
                         params.mainloop.seqlen_k, Traits::kCausal, params.mainloop.row_offset);
    };

    if (transposer) {
      // FP8: each V_j, once loaded, to V_j^T for the PV GEMM.
      cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegisters>();
      if constexpr (Traits::kFp8) {
        int const thread_idx = threadIdx.x - cutlass::NumThreadsPerWarp;
        constexpr uint32_t kStageBytes = Traits::kBlockN * Traits::kHeadDim;  // one byte per element
        char* const v = reinterpret_cast<char*>(smem.v.data());
        char* const vt = reinterpret_cast<char*>(smem.vt.data());
        // V's staging slots and V^T's are filled in step: one counter of
        // V blocks gives both states (V^T's producer phase is the opposite of
        // the staging slot's consumer phase), which is all the transposers
        // hold across blocks besides the block count (registers are scarce here).
        uint32_t step = 0;
        typename PipelineTile::PipelineState read_tile;
        for (;;) {
          pipeline_tile.consumer_wait(read_tile);
          int const t = smem.tile_index;
          TileCoord const tile = smem.tile;
          pipeline_tile.consumer_release(read_tile);
          ++read_tile;
          if (t >= num_tiles) break;
          BlockRange const range = range_of(tile);
          for (uint32_t const end = step + max(range.n_block_max - range.n_block_min, 0); step != end; ++step) {
            uint32_t const index = step % Traits::kStages, phase = (step / Traits::kStages) & 1;
            PipelineState const read_v(index, phase, 0), write_v(index, phase ^ 1, 0);
            pipeline_v_load.consumer_wait(read_v);
            pipeline_v.producer_acquire(write_v);
            TransposeV<Traits>::run(v + index * kStageBytes, vt + index * kStageBytes, thread_idx);
            // The GEMM reads V^T through the async proxy.
            cutlass::arch::fence_view_async_shared();
            pipeline_v.producer_commit(write_v);
            pipeline_v_load.consumer_release(read_v);
          }
        }
      }
    } else if (producer) {
      // Producer (lines 2-10).
      cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegisters>();
      if (warp_in_group != 0) return;
      QState write_q = cutlass::make_producer_start_state<PipelineQ>();
      PipelineState write_k = cutlass::make_producer_start_state<PipelineK>();
      PipelineState write_v = cutlass::make_producer_start_state<PipelineV>();
      auto write_tile = cutlass::make_producer_start_state<PipelineTile>();
      // V's TMA loads feed FP8's transposers, else the consumers.
      auto& pipeline_v_tma = *[&] {
        if constexpr (Traits::kFp8) {
          return &pipeline_v_load;
        } else {
          return &pipeline_v;
        }
      }();
      using Loads = typename MainloopT::template Loads<std::remove_reference_t<decltype(pipeline_v_tma)>>;
      auto loads_of = [&](TileCoord tile) {
        return Loads{params.mainloop, smem, pipeline_q, pipeline_k, pipeline_v_tma, write_q, write_k, write_v,
                     tile, lane_leader};
      };
      // With two Q buffers each tile's Q is loaded during the tile before
      // (MainloopT::load's ahead), the first tile's here.
      int t = blockIdx.x;
      TileCoord tile = t < num_tiles ? scheduler.tile(t) : TileCoord{};
      if (Traits::kQStages > 1 && t < num_tiles) loads_of(tile).q();
      for (;;) {
        pipeline_tile.producer_acquire(write_tile);
        if (lane_leader) {
          smem.tile_index = t;
          smem.tile = tile;
        }
        pipeline_tile.producer_commit(write_tile);
        ++write_tile;
        if (t >= num_tiles) break;
        int claim = 0, next = num_tiles;
        TileCoord next_tile_coord{};
        MainloopT::load(
            loads_of(tile), range_of(tile), [&] { claim = claim_issue(params); },
            [&] {
              next = next_tile(params, t, claim);
              if (next < num_tiles) {
                next_tile_coord = scheduler.tile(next);
                if constexpr (Traits::kQStages > 1) loads_of(next_tile_coord).q();
              }
            });
        t = next;
        tile = next_tile_coord;
      }
    } else {
      // Consumers (lines 11-26).
      if constexpr (Traits::kWarpSpecialized) cutlass::arch::warpgroup_reg_alloc<Traits::kConsumerRegisters>();
      int const thread_idx = threadIdx.x - Traits::kFirstConsumerThread;
      int const consumer_group = thread_idx / cutlass::NumThreadsPerWarpGroup;
      QState read_q;
      PipelineState read_k, read_v;
      // Without a producer: the states of consumer thread 0's loads.
      QState write_q = cutlass::make_producer_start_state<PipelineQ>();
      PipelineState write_k = cutlass::make_producer_start_state<PipelineK>();
      PipelineState write_v = cutlass::make_producer_start_state<PipelineV>();
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
      typename PipelineTile::PipelineState read_tile;
      for (int t = blockIdx.x, iteration = 0;; ++iteration) {
        TileCoord tile;
        if constexpr (Traits::kWarpSpecialized) {
          pipeline_tile.consumer_wait(read_tile);
          t = smem.tile_index;
          tile = smem.tile;
          pipeline_tile.consumer_release(read_tile);
          ++read_tile;
        } else {
          if (iteration > 0) {
            // Every consumer is past the previous tile: the tile index's slot is free.
            cutlass::arch::NamedBarrier::sync(Traits::kNumConsumerThreads, uint32_t(Barrier::kTileStart));
            if (thread_idx < cutlass::NumThreadsPerWarp) {
              t = next_tile(params, t, claim_issue(params));
              if (thread_idx == 0) smem.tile_index = t;
            }
            cutlass::arch::NamedBarrier::sync(Traits::kNumConsumerThreads, uint32_t(Barrier::kTileStart));
            t = smem.tile_index;
          }
          if (t < num_tiles) tile = scheduler.tile(t);
        }
        if (t >= num_tiles) break;
        BlockRange const range = range_of(tile);
        typename MainloopT::template Loads<PipelineV> const loads{
            params.mainloop, smem, pipeline_q, pipeline_k, pipeline_v, write_q, write_k, write_v, tile, true};
        if constexpr (!Traits::kWarpSpecialized) {
          if (thread_idx == 0) MainloopT::load_first_blocks(loads, range);
          __syncwarp();
        }
        auto load_ahead = [&](int n_block) {
          if constexpr (!Traits::kWarpSpecialized) {
            if (thread_idx == 0) MainloopT::load_ahead(loads, range, n_block);
            __syncwarp();
          }
        };
        softmax.reset();
        DeferredEpilogue<decltype(previous_epilogue)> deferred{previous_epilogue};
        float const o_descale = MainloopT::mma(params.mainloop, smem, pipeline_k, pipeline_v, read_k, read_v, tOrO,
                                               softmax, tile, range, pipeline_q, read_q, thread_idx, load_ahead,
                                               deferred);
        ++read_q;
        // Line 24: O / l and the LSE; line 25, the epilogue.
        float o_scale[2];
        softmax.finalize(o_scale, done_lse);
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
  }
};

template <class Traits>
__global__ void __launch_bounds__(Traits::kNumThreads, 1)
    forward_kernel(CUTE_GRID_CONSTANT typename Kernel<Traits>::Params const params) {
  extern __shared__ __align__(1024) char smem[];
  Kernel<Traits>::run(params, smem);
}

}  // namespace flash3::fwd
