// Compile-time description of one backward kernel (paper Algorithm 3):
// element type, head dim, tile sizes, and the CuTe layouts and MMAs of its
// five GEMMs.
//
// A CTA owns one block of kBlockN keys (K_j, V_j) and walks the query blocks
// i of kBlockM rows, with two consumer warpgroups:
//   S^T  = K_j Q_i^T        (N x M)  SS
//   dP^T = V_j dO_i^T       (N x M)  SS
//   dV  += P^T dO_i         (N x dv)
//   dK  += dS^T Q_i         (N x d)
//   dQ_i = dS K_j           (M x d)  SS   dS through shared memory; warpgroups split M or d
// (dv is V's head dim, d Q's and K's: the same, or a pair of
// common/head_dims.inc, whose dP^T = V_j dO_i^T runs over dv.)
// Computing S and dP transposed puts the keys on the accumulator's rows, so
// P^T and dS^T are the A operands of the dV and dK GEMMs.
//
// Up to head dim 128 the warpgroups split the keys (64 each, N = 128): each
// holds its keys' rows of P^T and dS^T, and of dK and dV, in registers (RS
// GEMMs). Above 128, dK and dV (2 x 64 x d fp32 per warpgroup) no longer fit:
// the block holds 64 keys, the warpgroups split the queries of S^T and dP^T
// and the head dim of dK and dV, and P^T and dS^T reach the dK/dV GEMMs
// through shared memory (SS GEMMs).
//
// At head dim 256 the dQ sums in the L2 bind (4 bytes per 10 N FLOP, so
// 1 / N): the block holds 80 keys, which a GEMM's rows (64 a warpgroup)
// cannot cover, so the queries are the rows instead (FlashAttention-3's
// choice at this head dim):
//   S    = Q_i K_j^T      (M x N)  SS   warpgroups split the keys
//   dP   = dO_i V_j^T     (M x N)  SS
//   dV^T = dO_i^T P       (d x N)  SS   warpgroups split d; P, dS from shared memory
//   dK^T = Q_i^T dS       (d x N)  SS
#pragma once

#include <cute/tensor.hpp>
// The extended WGMMA shapes (see ss_atom), without the switch.
#include <cute/arch/mma_sm90_gmma_ext.hpp>
#include <cute/atom/mma_traits_sm90_gmma_ext.hpp>
#include <cutlass/gemm/collective/builders/sm90_common.inl>
#include <cutlass/pipeline/pipeline.hpp>

#include "bwd/workspace.h"
#include "common/registers.h"

namespace flash3::bwd {

using namespace cute;

// The SS WGMMA atom 64 x kN x 16. N = 40 and 80 are named: they are among the
// extended shapes, which CuTe's selector offers (and its headers declare)
// only under a global switch, CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED, that
// would change the forward's atoms too.
template <class Element, int kN, GMMA::Major kMajorA, GMMA::Major kMajorB>
CUTE_HOST_DEVICE constexpr auto ss_atom() {
  constexpr bool kBf16 = std::is_same_v<Element, cutlass::bfloat16_t>;
  if constexpr (kN == 40 && kBf16) return SM90::GMMA::MMA_64x40x16_F32BF16BF16_SS<kMajorA, kMajorB>{};
  else if constexpr (kN == 40) return SM90::GMMA::MMA_64x40x16_F32F16F16_SS<kMajorA, kMajorB>{};
  else if constexpr (kN == 80 && kBf16) return SM90::GMMA::MMA_64x80x16_F32BF16BF16_SS<kMajorA, kMajorB>{};
  else if constexpr (kN == 80) return SM90::GMMA::MMA_64x80x16_F32F16F16_SS<kMajorA, kMajorB>{};
  else return GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kN>, _16>, kMajorA, kMajorB>();
}

template <class Element_, int kHeadDim_, bool kCausal_, bool kSoftcap_ = false, bool kPacked_ = false,
          int kHeadDimV_ = kHeadDim_>
struct BwdTraits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kHeadDimV = kHeadDimV_;  // V's, O's, dO's and dV's
  static constexpr bool kCausal = kCausal_;
  // Packed sequences (varlen): each CTA's sequence offsets and lengths, read
  // from device memory (as runtime branches they lengthened every kernel).
  // Built as the masked kernel alone, which serves unmasked calls too.
  static constexpr bool kPacked = kPacked_;
  static_assert(!kPacked || kCausal, "packed sequences run on the masked kernel");
  // Softcapping's kernels: its code, skipped at run time, lengthened the
  // mainloop of the others (and cost their head dim 64 about 2%).
  static constexpr bool kSoftcap = kSoftcap_;

  // Registers bind the tile. Keys split: per consumer thread dK and dV hold
  // 64 x d fp32 each (d/2 registers each), S^T and dP^T 64 x M (M/2 each), dQ
  // 64 x d/2 (d/4): 224 of 240 at d = 128 with M = 64; at d = 64 that
  // leaves room for M = 128 (208), which halves the K_j/V_j reads from shared
  // memory per query row, and is faster for it. Head dim split: dK and dV d/4
  // each, S^T and dP^T M/4, dQ d/4: 176 at d = 192; with the queries on the
  // rows at d = 256, dK^T and dV^T N d / 256 each (80), S and dP N/4 (20), dQ
  // d/4 (64: beside dK^T and dV^T it spilled, so in halves, kdQParts). With
  // V's 128 beside Q's 192, dV takes dv/4 (32): the head dim split's tiles
  // and layouts, at 160.
  static constexpr bool kSplitHeadDim = kHeadDim > 128;
  static constexpr bool kQueriesOnRows = kHeadDim > 192;
  static_assert(kHeadDimV == kHeadDim || (kSplitHeadDim && !kQueriesOnRows),
                "V's head dim of its own is built with the head dim split and the keys on the rows");
  static constexpr int kBlockM = bwd_block_m(kHeadDim);
  static constexpr int kBlockN = bwd_block_n(kHeadDim);
  // With the keys on the GEMMs' rows, a warpgroup's 64 rows divide them.
  static_assert(kQueriesOnRows || kBlockN % 64 == 0);
  // dS from P as rounded for dV's GEMM (as the same-precision reference
  // rounds it) frees S^T's fp32 registers early: needed for M = 128 to stay
  // spill-free; elsewhere the conversion back costs more than it frees.
  static constexpr bool kdSFromRoundedP = kBlockM > 64;
  // Softcapping's slopes kept in registers from S to dS (common/softcap.h)
  // where they fit beside the rest (the SASS check): they spilled at M = 128,
  // and in the unmasked kernels at M = 64.
  static constexpr bool kSoftcapSlopesKept = kBlockM == 64 && kCausal;
  static constexpr int kNumConsumerWarpGroups = 2;
  // Shared memory (227 KB) holds two stages of Q_i, and of dO_i up to d = 192;
  // at d = 256 one stage of dO_i (dO_{i+1} loads once dV_i is done, while
  // dQ_i, dK_i and S_{i+1} run), and dQ_i leaves for the dq_writer in eight
  // parts through one buffer (what room 80 keys leave).
  static constexpr int kStagesQ = 2;
  static constexpr int kStagesdO = kHeadDim > 192 ? 1 : 2;
  static constexpr int kdQChunks = kHeadDim > 192 ? 8 : 1;
  // ... or, unless deterministic, the consumers add it with atomics (Mainloop::consumers_add_dq).
  static constexpr bool kdQAtomic = kHeadDim > 192;
  // Whether key blocks count themselves into each dQ tile's arrivals: for
  // deterministic mode's turns, and with the causal mask for the postprocess
  // to convert tiles under the main kernel's last wave (bwd/postprocess.h).
  // Without the mask, where the split last wave (bwd/tail_split.h) leaves
  // little to convert under, the counting costs more than that overlap gains.
  static constexpr bool counts_arrivals(bool deterministic) { return kCausal || deterministic; }
  // dQ_i's GEMM in parts of its columns, one part's registers live at a time
  // (with the queries on the rows they would not fit beside dK^T and dV^T).
  static constexpr int kdQParts = kQueriesOnRows ? 2 : 1;

  static constexpr int kNumConsumerThreads = kNumConsumerWarpGroups * 128;
  static constexpr int kNumThreads = kNumConsumerThreads + 128;  // + producer warpgroup (producer and dq_writer warps)
  // As in the forward.
  static constexpr int kProducerRegisters = 24;
  static constexpr int kConsumerRegisters = 240;
  static_assert(fits_launch_registers(kNumThreads, 128, kProducerRegisters, kConsumerRegisters));

  // Global Q, K, V, O, dO as (seqlen, head_dim, heads, batch), 64-bit strides:
  // Q, K (and dQ, dK) of kHeadDim columns (GmemShape), V, O, dO (and dV) of
  // kHeadDimV.
  template <int kDim>
  using GmemShapeOf = Shape<int32_t, Int<kDim>, int32_t, int32_t>;
  using GmemShape = GmemShapeOf<kHeadDim>;
  using GmemStride = Stride<int64_t, _1, int64_t, int64_t>;
  template <class T, int kDim = kHeadDim>
  using GmemTensor = decltype(make_tensor(make_gmem_ptr(static_cast<T*>(nullptr)), GmemShapeOf<kDim>{}, GmemStride{}));
  // V's (dO's) shape: K's (Q's) rows, heads and batch, with V's head dim.
  CUTE_HOST_DEVICE static auto shape_v(GmemShape const& s) {
    return make_shape(get<0>(s), Int<kHeadDimV>{}, get<2>(s), get<3>(s));
  }

  using M = Int<kBlockM>;
  using N = Int<kBlockN>;
  using D = Int<kHeadDim>;
  using Dv = Int<kHeadDimV>;
  // S^T, dP^T: (keys, queries, d), or S, dP: (queries, keys, d) (dP's K mode dv).
  using TileShapeSdP = conditional_t<kQueriesOnRows, Shape<M, N, D>, Shape<N, M, D>>;
  // dK, dV: (keys, d, queries), or dK^T, dV^T: (d, keys, queries); dV's d is dv.
  template <class Dim>
  using TileShapedKVOf = conditional_t<kQueriesOnRows, Shape<Dim, N, M>, Shape<N, Dim, M>>;
  using TileShapedK = TileShapedKVOf<D>;
  using TileShapedV = TileShapedKVOf<Dv>;
  using TileShapedQ = Shape<M, D, N>;   // dQ:         (queries, d, keys)

  // How the two warpgroups split each GEMM's (M, N) tile.
  using SplitRows = Layout<Shape<_2, _1, _1>>;
  using SplitCols = Layout<Shape<_1, _2, _1>>;
  using TiledMmaSdP = conditional_t<
      kQueriesOnRows,
      decltype(make_tiled_mma(ss_atom<Element, kBlockN / 2, GMMA::Major::K, GMMA::Major::K>(), SplitCols{})),
      decltype(make_tiled_mma(GMMA::ss_op_selector<Element, Element, float,
                                                   Shape<_64, Int<kSplitHeadDim ? kBlockM / 2 : kBlockM>, D>>(),
                              conditional_t<kSplitHeadDim, SplitCols, SplitRows>{}))>;
  // dK's GEMM over d columns, dV's over dv.
  template <class Dim>
  using TiledMmadKVOf = conditional_t<
      kQueriesOnRows,
      decltype(make_tiled_mma(ss_atom<Element, kBlockN, GMMA::Major::MN, GMMA::Major::K>(), SplitRows{})),
      conditional_t<kSplitHeadDim,
                    decltype(make_tiled_mma(GMMA::ss_op_selector<Element, Element, float,
                                                                 Shape<_64, Int<Dim::value / 2>, M>, GMMA::Major::K,
                                                                 GMMA::Major::MN>(),
                                            SplitCols{})),
                    decltype(make_tiled_mma(GMMA::rs_op_selector<Element, Element, float, Shape<_64, Dim, M>,
                                                                 GMMA::Major::K, GMMA::Major::MN>(),
                                            SplitRows{}))>>;
  using TiledMmadK = TiledMmadKVOf<D>;
  using TiledMmadV = TiledMmadKVOf<Dv>;
  // dQ: with M = 128 the warpgroups split the queries (m64 x d each, half of
  // dS as A), otherwise the head dim (M x d/2 each, all of dS; in kdQParts
  // GEMMs, each warpgroup's columns of a part contiguous).
  using TiledMmadQ = conditional_t<
      (kBlockM > 64),
      decltype(make_tiled_mma(GMMA::ss_op_selector<Element, Element, float, Shape<_64, D, N>, GMMA::Major::MN,
                                                   GMMA::Major::MN>(),
                              SplitRows{})),
      decltype(make_tiled_mma(GMMA::ss_op_selector<Element, Element, float,
                                                   Shape<M, Int<kHeadDim / 2 / kdQParts>, N>, GMMA::Major::MN,
                                                   GMMA::Major::MN>(),
                              SplitCols{}))>;

  // The part of a head dim (d for dK, dv for dV) one warpgroup's dK/dV GEMM
  // covers: the swizzle atoms of Q, dO (read through transposed views) and V
  // and K (dV's and dK's epilogue buffers) divide it.
  template <int kDim>
  using DkvWidth = Int<kSplitHeadDim ? kDim / 2 : kDim>;
  // Q (d) and dO (dv): (M, dim, stage), dim contiguous; read K-major by the
  // S/dP GEMMs and, through the transposed views, MN-major by the dK/dV GEMMs.
  template <int kStages, int kDim>
  using SmemLayoutRows = decltype(tile_to_shape(
      cutlass::gemm::collective::detail::ss_smem_selector<GMMA::Major::K, Element, M, DkvWidth<kDim>>(),
      Shape<M, Int<kDim>, Int<kStages>>{}));
  template <int kStages, int kDim>
  using SmemLayoutRowsT = decltype(composition(
      SmemLayoutRows<kStages, kDim>{},
      make_layout(Shape<Int<kDim>, M, Int<kStages>>{}, Stride<M, _1, Int<kBlockM * kDim>>{})));
  using SmemLayoutQ = SmemLayoutRows<kStagesQ, kHeadDim>;
  using SmemLayoutQt = SmemLayoutRowsT<kStagesQ, kHeadDim>;
  using SmemLayoutdO = SmemLayoutRows<kStagesdO, kHeadDimV>;
  using SmemLayoutdOt = SmemLayoutRowsT<kStagesdO, kHeadDimV>;
  // K: (N, d). Its transposed view is split along d between the warpgroups in
  // the dQ GEMM, so the swizzle atom is chosen to divide d / 2.
  using SmemLayoutK = decltype(tile_to_shape(
      cutlass::gemm::collective::detail::ss_smem_selector<GMMA::Major::K, Element, N,
                                                          Int<kHeadDim / kNumConsumerWarpGroups>>(),
      Shape<N, D>{}));
  using SmemLayoutKt = decltype(composition(SmemLayoutK{}, make_layout(Shape<D, N>{}, Stride<N, _1>{})));
  // A block of keys' rows, (N, dim), dim contiguous: V, and dK and dV in the
  // epilogue (in K's and V's buffers); and its (dim, N) view.
  template <int kDim>
  using SmemLayoutKeyRows = decltype(tile_to_shape(
      cutlass::gemm::collective::detail::ss_smem_selector<GMMA::Major::K, Element, N, DkvWidth<kDim>>(),
      Shape<N, Int<kDim>>{}));
  template <int kDim>
  using SmemLayoutKeyRowsT =
      decltype(composition(SmemLayoutKeyRows<kDim>{}, make_layout(Shape<Int<kDim>, N>{}, Stride<N, _1>{})));
  using SmemLayoutV = SmemLayoutKeyRows<kHeadDimV>;
  using SmemLayoutdK = SmemLayoutKeyRows<kHeadDim>;
  // dS (and, with the head dim split, P): (M, N, buffer), M contiguous, the A
  // operand of the dQ GEMM; written through the (N, M) view from the dS^T
  // accumulators, which is also the K-major A operand of the dK (dV) GEMM.
  // Two buffers, so one warpgroup writes block i+1's while the other still
  // reads block i's.
  using SmemLayoutdS = decltype(tile_to_shape(
      cutlass::gemm::collective::detail::ss_smem_selector<GMMA::Major::MN, Element, M, N>(), Shape<M, N, _2>{}));
  using SmemLayoutdSt = decltype(composition(
      SmemLayoutdS{}, make_layout(Shape<N, M, _2>{}, Stride<M, _1, Int<kBlockM * kBlockN>>{})));
  // P (P^T) and dS (dS^T) stored with stmatrix from their accumulators into
  // the buffer's view of the same shape: the query mode is contiguous, so
  // transposed when the queries are the rows (40 columns a warpgroup at d =
  // 256 take two 8 x 8 matrices a store, not four).
  using SmemLayoutPdSAcc = conditional_t<kQueriesOnRows, SmemLayoutdS, SmemLayoutdSt>;
  using StoreAtomPdS =
      conditional_t<kQueriesOnRows,
                    conditional_t<kBlockN / 2 % 16 == 0, SM90_U16x8_STSM_T, SM90_U16x4_STSM_T>, SM90_U32x4_STSM_N>;
  // dK and dV (dK^T and dV^T) into their (N, dim) layouts, dim contiguous, likewise.
  using SmemLayoutdKAcc = conditional_t<kQueriesOnRows, SmemLayoutKeyRowsT<kHeadDim>, SmemLayoutdK>;
  using SmemLayoutdVAcc = conditional_t<kQueriesOnRows, SmemLayoutKeyRowsT<kHeadDimV>, SmemLayoutV>;
  using StoreAtomdKV = conditional_t<kQueriesOnRows, SM90_U16x8_STSM_T, SM90_U32x4_STSM_N>;

  // dQ_i in fp32, in the dQ accumulators' register order (see fragment_offset):
  // the dq_writer adds it to global memory with TMA reduce-adds of
  // (256, rows), one per chunk.
  static constexpr int kdQElements = kBlockM * kHeadDim;
  static constexpr int kdQRows = kdQElements / 256 / kdQChunks;
  using SmemLayoutdQ = Layout<Shape<_256, Int<kdQRows>>>;
  using TileShapedQAccum = Shape<_256, Int<kdQRows>>;

  using PipelineQ = cutlass::PipelineTmaAsync<kStagesQ>;     // Q_i
  using PipelinedO = cutlass::PipelineTmaAsync<kStagesdO>;   // dO_i
  using PipelineLseD = cutlass::PipelineTmaAsync<kStagesQ>;  // LSE_i and D_i (Mainloop::load_lse_d)
  using PipelinedQ = cutlass::PipelineAsync<1>;             // consumers -> dq_writer: dQ_i in shared memory

  struct SharedStorage {
    cute::array_aligned<Element, cosize_v<SmemLayoutK>, 1024> k;
    cute::array_aligned<Element, cosize_v<SmemLayoutV>, 1024> v;
    cute::array_aligned<Element, cosize_v<SmemLayoutQ>, 1024> q;
    cute::array_aligned<Element, cosize_v<SmemLayoutdO>, 1024> dout;
    cute::array_aligned<Element, cosize_v<SmemLayoutdS>, 1024> ds;
    cute::array_aligned<Element, kSplitHeadDim ? cosize_v<SmemLayoutdS> : 0, 1024> p;
    cute::array_aligned<float, kdQElements / kdQChunks, 128> dq;
    cute::array_aligned<float, kBlockM * kStagesQ, 16> lse_log2;
    cute::array_aligned<float, kBlockM * kStagesQ, 16> dpsum;
    typename PipelineQ::SharedStorage pipeline_q;
    typename PipelinedO::SharedStorage pipeline_do;
    typename PipelineLseD::SharedStorage pipeline_lse;
    typename PipelinedQ::SharedStorage pipeline_dq;
    cutlass::arch::ClusterTransactionBarrier barrier_kv;
    int arrival;  // a split tile's part: how many parts had arrived before it
    // Packed sequences: the CTA's sequence (bwd/sequence.h), written before
    // the roles start, read where used rather than held in registers.
    int sequence[kPacked ? 6 : 1];
  };
  static_assert(sizeof(SharedStorage) <= 227 * 1024, "tile sizes overflow shared memory");
};

// Named barriers (ids after CUTLASS's reserved ones).
enum class Barrier : uint32_t {
  kdSReady = 0,   // consumers: both halves of dS_i are in shared memory
  kEpilogue = 1,  // consumers: K's and V's buffers are free / dK and dV are in them
  kPReady = 2,    // consumers, head dim split: both halves of P_i are in shared memory
  kRowsZeroed = 3,  // consumers, packed sequences: the rows past a sequence are zeroed (Mainloop::zero_rows_from)
};

// Where register i of consumer thread t puts its value in a tile's fp32
// buffer (dQ_i's; a split tile's dK and dV sums): float4 groups of
// registers, consecutive threads at consecutive 16 bytes (no bank conflicts).
// For dQ, registers [c, c + 1) x R / kdQChunks are chunk c, a contiguous part
// of the tile; the postprocess reads the global accumulator in the same order.
CUTE_HOST_DEVICE constexpr int fragment_offset(int thread, int i, int num_threads) {
  return (i / 4) * num_threads * 4 + thread * 4 + i % 4;
}

// Each element's coordinates in a (rows, columns) tile, key first: (key,
// query) for S and dP, (key, d) for dK and dV, whichever mode holds the keys
// (the columns when the queries are the rows).
template <class Traits, class TileShape>
CUTE_HOST_DEVICE auto keys_first_identity(TileShape shape) {
  if constexpr (Traits::kQueriesOnRows) {
    return make_tensor(make_inttuple_iter(make_tuple(_0{}, _0{})), make_layout(shape, Stride<E<1>, E<0>>{}));
  } else {
    return make_identity_tensor(shape);
  }
}

}  // namespace flash3::bwd
