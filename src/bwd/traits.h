// Compile-time description of one backward kernel (paper Algorithm 3):
// element type, head dim, tile sizes, and the CuTe layouts and MMAs of its
// five GEMMs.
//
// A CTA owns one block of kBlockN keys (K_j, V_j) and walks the query blocks
// i of kBlockM rows. Each of the two consumer warpgroups owns 64 of the keys:
//   S^T  = K_j Q_i^T        (N x M)  SS   warpgroups split the keys
//   dP^T = V_j dO_i^T       (N x M)  SS   "
//   dV  += P^T dO_i         (N x d)  RS   P^T stays in registers
//   dK  += dS^T Q_i         (N x d)  RS   dS^T stays in registers
//   dQ_i = dS K_j           (M x d)  SS   dS through shared memory; warpgroups split d
// Computing S and dP transposed puts the keys on the accumulator's rows, so
// P^T and dS^T are already the A operands of the dV and dK GEMMs.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/gemm/collective/builders/sm90_common.inl>
#include <cutlass/pipeline/pipeline.hpp>

#include "bwd/workspace.h"

namespace flash3::bwd {

using namespace cute;

template <class Element_, int kHeadDim_, bool kCausal_>
struct BwdTraits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr bool kCausal = kCausal_;

  // Registers bind the tile: per consumer thread dK and dV hold 64 x d fp32
  // each (d/2 registers each), S^T and dP^T 64 x M (M/2 each), dQ 64 x d/2
  // (d/4): 224 of 240 at d = 128.
  static constexpr int kBlockM = kBwdBlockM;
  static constexpr int kBlockN = 128;
  static constexpr int kStages = 2;
  static_assert(kHeadDim <= 128, "the dK/dV accumulators of head dims above 128 do not fit in registers");

  static constexpr int kNumConsumerWarpGroups = kBlockN / 64;
  static constexpr int kNumConsumerThreads = kNumConsumerWarpGroups * 128;
  static constexpr int kNumThreads = kNumConsumerThreads + 128;  // + producer warpgroup (producer and dq_writer warps)
  // As in the forward. (32 + 240, exactly the register file, hangs in
  // setmaxnreg: the consumers' increase never gets its registers.)
  static constexpr int kProducerRegisters = 24;
  static constexpr int kConsumerRegisters = 240;

  // Global Q, K, V, O, dO as (seqlen, head_dim, heads, batch), 64-bit strides.
  using GmemShape = Shape<int32_t, Int<kHeadDim>, int32_t, int32_t>;
  using GmemStride = Stride<int64_t, _1, int64_t, int64_t>;
  template <class T>
  using GmemTensor = decltype(make_tensor(make_gmem_ptr(static_cast<T*>(nullptr)), GmemShape{}, GmemStride{}));

  using M = Int<kBlockM>;
  using N = Int<kBlockN>;
  using D = Int<kHeadDim>;
  using TileShapeSdP = Shape<N, M, D>;  // S^T, dP^T: (keys, queries, d)
  using TileShapedKV = Shape<N, D, M>;  // dK, dV:     (keys, d, queries)
  using TileShapedQ = Shape<M, D, N>;   // dQ:         (queries, d, keys)

  using TiledMmaSdP = decltype(make_tiled_mma(GMMA::ss_op_selector<Element, Element, float, Shape<_64, M, D>>(),
                                              Layout<Shape<Int<kNumConsumerWarpGroups>, _1, _1>>{}));
  using TiledMmadKV = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, Shape<_64, D, M>, GMMA::Major::K, GMMA::Major::MN>(),
      Layout<Shape<Int<kNumConsumerWarpGroups>, _1, _1>>{}));
  using TiledMmadQ = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<M, Int<kHeadDim / kNumConsumerWarpGroups>, N>,
                           GMMA::Major::MN, GMMA::Major::MN>(),
      Layout<Shape<_1, Int<kNumConsumerWarpGroups>, _1>>{}));

  // Q and dO: (M, d, stage), d contiguous; read K-major by the S/dP GEMMs and,
  // through the transposed views, MN-major by the dK/dV GEMMs.
  using SmemLayoutQ = decltype(tile_to_shape(
      cutlass::gemm::collective::detail::ss_smem_selector<GMMA::Major::K, Element, M, D>(),
      Shape<M, D, Int<kStages>>{}));
  using SmemLayoutQt = decltype(composition(
      SmemLayoutQ{}, make_layout(Shape<D, M, Int<kStages>>{}, Stride<M, _1, Int<kBlockM * kHeadDim>>{})));
  // K: (N, d). Its transposed view is split along d between the warpgroups in
  // the dQ GEMM, so the swizzle atom is chosen to divide d / 2.
  using SmemLayoutK = decltype(tile_to_shape(
      cutlass::gemm::collective::detail::ss_smem_selector<GMMA::Major::K, Element, N,
                                                          Int<kHeadDim / kNumConsumerWarpGroups>>(),
      Shape<N, D>{}));
  using SmemLayoutKt = decltype(composition(SmemLayoutK{}, make_layout(Shape<D, N>{}, Stride<N, _1>{})));
  using SmemLayoutV = decltype(tile_to_shape(
      cutlass::gemm::collective::detail::ss_smem_selector<GMMA::Major::K, Element, N, D>(), Shape<N, D>{}));
  // dS: (M, N, buffer), M contiguous, the A operand of the dQ GEMM; written
  // through the (N, M) view from the dS^T accumulators. Two buffers, so one
  // warpgroup writes block i+1's while the other still reads block i's.
  using SmemLayoutdS = decltype(tile_to_shape(
      cutlass::gemm::collective::detail::ss_smem_selector<GMMA::Major::MN, Element, M, N>(), Shape<M, N, _2>{}));
  using SmemLayoutdSt = decltype(composition(
      SmemLayoutdS{}, make_layout(Shape<N, M, _2>{}, Stride<M, _1, Int<kBlockM * kBlockN>>{})));

  // dQ_i in fp32, in the dQ accumulators' register order (see dq_fragment_offset):
  // the dq_writer adds it to global memory as one TMA reduce-add of (256, rows).
  static constexpr int kdQElements = kBlockM * kHeadDim;
  static constexpr int kdQRows = kdQElements / 256;
  using SmemLayoutdQ = Layout<Shape<_256, Int<kdQRows>>>;
  using TileShapedQAccum = Shape<_256, Int<kdQRows>>;

  using PipelineQdO = cutlass::PipelineTmaAsync<kStages>;  // Q_i, dO_i, LSE_i, D_i together
  using PipelinedQ = cutlass::PipelineAsync<1>;            // consumers -> dq_writer: dQ_i in shared memory

  struct SharedStorage {
    cute::array_aligned<Element, cosize_v<SmemLayoutK>, 1024> k;
    cute::array_aligned<Element, cosize_v<SmemLayoutV>, 1024> v;
    cute::array_aligned<Element, cosize_v<SmemLayoutQ>, 1024> q;
    cute::array_aligned<Element, cosize_v<SmemLayoutQ>, 1024> dout;
    cute::array_aligned<Element, cosize_v<SmemLayoutdS>, 1024> ds;
    cute::array_aligned<float, kdQElements, 128> dq;
    cute::array_aligned<float, kBlockM * kStages, 16> lse_log2;
    cute::array_aligned<float, kBlockM * kStages, 16> dpsum;
    typename PipelineQdO::SharedStorage pipeline_qdo;
    typename PipelinedQ::SharedStorage pipeline_dq;
    cutlass::arch::ClusterTransactionBarrier barrier_kv;
  };
  static_assert(sizeof(SharedStorage) <= 227 * 1024, "tile sizes overflow shared memory");
};

// Named barriers (ids after CUTLASS's reserved ones).
enum class Barrier : uint32_t {
  kdSReady = 0,  // consumers: both halves of dS_i are in shared memory
  kEpilogue = 1,  // consumers: K's and V's buffers are free / dK and dV are in them
};

// Where register i of consumer thread t puts its dQ value: float4 groups of
// registers, consecutive threads at consecutive 16 bytes (no bank conflicts).
// The postprocess reads the global accumulator in the same order.
CUTE_HOST_DEVICE constexpr int dq_fragment_offset(int thread, int i, int num_threads) {
  return (i / 4) * num_threads * 4 + thread * 4 + i % 4;
}

}  // namespace flash3::bwd
