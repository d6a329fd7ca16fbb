// The forward kernel's pipelines (Algorithm 1, line 1: the circular buffers
// of K and V and their barriers), with each thread's role in them.
//   q, k:    TMA loads, producer -> consumers
//   v:       TMA loads (16-bit), or FP8's transposers -> consumers
//   v_load:  FP8: V's TMA loads, producer warp 0 -> transposers
//   tile:    which tile next, producer warp 0 -> consumers (and transposers)
// Without warp specialization every thread is a consumer that also loads.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/pipeline/pipeline.hpp>

namespace flash3::fwd {

template <class Traits>
struct Pipelines {
  using SharedStorage = typename Traits::SharedStorage;
  using PipelineQ = typename Traits::PipelineQ;
  using PipelineK = typename Traits::PipelineK;
  using PipelineV = typename Traits::PipelineV;
  using PipelineVLoad = std::conditional_t<Traits::kFp8, typename Traits::PipelineVLoad, int>;
  using PipelineTile = typename Traits::PipelineTile;

  // The producer warpgroup's warps 1-3 with FP8: they transpose V.
  bool transposer;
  PipelineK k;
  PipelineQ q;
  PipelineV v;
  PipelineVLoad v_load;
  PipelineTile tile;

  // q_bytes, k_bytes, v_bytes: one TMA load's of Q, of a K block, of a V block.
  CUTE_DEVICE Pipelines(SharedStorage& smem, int warp_group, int warp_in_group, uint32_t q_bytes, uint32_t k_bytes,
                        uint32_t v_bytes)
      : transposer(Traits::kFp8 && warp_group == 0 && warp_in_group != 0),
        k(smem.pipeline_k, tma_params<PipelineK>(warp_group, k_bytes, threadIdx.x == 0), Shape<_1, _1, _1>{}),
        // Without a leader: Mainloop::Loads::q() arrives itself.
        q(smem.pipeline_q, tma_params<PipelineQ>(warp_group, q_bytes, false), Shape<_1, _1, _1>{}),
        v(make_v(smem, warp_group, v_bytes, transposer)),
        v_load(make_v_load(smem, warp_group, v_bytes, transposer)),
        tile(smem.pipeline_tile, tile_params(Traits::kWarpSpecialized && warp_group == 0 && !transposer)) {}

  // A TMA pipeline's roles: the producer warpgroup loads, the consumers read
  // (without warp specialization, the consumers do both).
  template <class Pipeline>
  CUTE_DEVICE static typename Pipeline::Params tma_params(int warp_group, uint32_t bytes, bool leader) {
    typename Pipeline::Params params;
    params.transaction_bytes = bytes;
    params.role = !Traits::kWarpSpecialized ? Pipeline::ThreadCategory::ProducerConsumer
                  : warp_group == 0        ? Pipeline::ThreadCategory::Producer
                                           : Pipeline::ThreadCategory::Consumer;
    params.is_leader = leader;
    params.num_consumers = Traits::kNumConsumerThreads;
    return params;
  }

  CUTE_DEVICE static PipelineV make_v(SharedStorage& smem, int warp_group, uint32_t v_bytes, bool transposer) {
    if constexpr (Traits::kFp8) {
      // Transposers -> consumers.
      typename PipelineV::Params params;
      params.role = transposer       ? PipelineV::ThreadCategory::Producer
                    : warp_group > 0 ? PipelineV::ThreadCategory::Consumer
                                     : PipelineV::ThreadCategory::NonParticipant;
      params.producer_arv_count = Traits::kNumTransposeThreads;
      params.consumer_arv_count = Traits::kNumConsumerThreads;
      return PipelineV(smem.pipeline_v, params);
    } else {
      return PipelineV(smem.pipeline_v, tma_params<PipelineV>(warp_group, v_bytes, threadIdx.x == 0),
                       Shape<_1, _1, _1>{});
    }
  }

  CUTE_DEVICE static PipelineVLoad make_v_load(SharedStorage& smem, int warp_group, uint32_t v_bytes,
                                               bool transposer) {
    if constexpr (Traits::kFp8) {
      // Warp 0's TMA loads -> transposers.
      auto params = tma_params<PipelineVLoad>(warp_group, v_bytes, threadIdx.x == 0);
      params.role = warp_group > 0 ? PipelineVLoad::ThreadCategory::NonParticipant
                    : transposer   ? PipelineVLoad::ThreadCategory::Consumer
                                   : PipelineVLoad::ThreadCategory::Producer;
      params.num_consumers = Traits::kNumTransposeThreads;
      return PipelineVLoad(smem.pipeline_v_load, params, Shape<_1, _1, _1>{});
    } else {
      return 0;
    }
  }

  CUTE_DEVICE static typename PipelineTile::Params tile_params(bool picks_tiles) {
    typename PipelineTile::Params params;
    params.role = picks_tiles ? PipelineTile::ThreadCategory::Producer : PipelineTile::ThreadCategory::Consumer;
    params.producer_arv_count = cutlass::NumThreadsPerWarp;
    params.consumer_arv_count = Traits::kNumConsumerThreads + Traits::kNumTransposeThreads;
    return params;
  }
};

}  // namespace flash3::fwd
