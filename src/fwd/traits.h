// Compile-time description of one forward kernel: element type, head dim, tile
// sizes, the paper's techniques that are switched on, and the CuTe layouts and
// MMAs that follow from them.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/gemm/collective/builders/sm90_common.inl>
#include <cutlass/pipeline/pipeline.hpp>

namespace flash3::fwd {

using namespace cute;

// Tile sizes per head dim, chosen by shared memory and registers (see
// docs/design.md for the measurements behind them). Each consumer warpgroup
// owns 64 query rows; 2 consumer warpgroups make block M = 128.
//  - block N sets the S accumulator: 64 x N fp32 is N/2 registers per thread,
//    held twice by the intra-warpgroup overlap (S_next and P), beside the
//    64 x d fp32 O accumulator (d/2 registers); 240 registers per consumer
//    thread bound it.
//  - shared memory holds Q (M x d), kStages of K and V (N x d each) and O
//    (M x d, aliasing Q when the sum would pass 227 KB).
struct TileSize {
  int block_m;
  int block_n;
  int stages;
};

constexpr TileSize tile_size(int head_dim, bool causal) {
  switch (head_dim) {
    case 64: return {128, causal ? 128 : 128, 2};
    case 96: return {128, 128, 2};
    case 128: return {128, 128, 2};
    case 192: return {128, 96, 2};
    default: return {128, 64, 2};  // 256
  }
}

template <class Element_, int kHeadDim_, bool kCausal_, bool kPingpong_ = true, bool kIntraWGOverlap_ = true>
struct FwdTraits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr bool kCausal = kCausal_;
  static constexpr bool kPingpong = kPingpong_;
  static constexpr bool kIntraWGOverlap = kIntraWGOverlap_;

  static constexpr TileSize kTile = tile_size(kHeadDim, kCausal);
  static constexpr int kBlockM = kTile.block_m;
  static constexpr int kBlockN = kTile.block_n;
  static constexpr int kStages = kTile.stages;

  static constexpr int kNumConsumerWarpGroups = kBlockM / 64;
  static constexpr int kNumConsumerThreads = kNumConsumerWarpGroups * 128;
  static constexpr int kNumThreads = kNumConsumerThreads + 128;  // + the producer warpgroup
  static_assert(kNumConsumerWarpGroups == 2, "pingpong pairs two consumer warpgroups");
  // setmaxnreg: the producer only issues TMA; the consumers hold S, P and O.
  static constexpr int kProducerRegisters = 24;
  static constexpr int kConsumerRegisters = 240;

  // Global Q, K, V, O as (seqlen, head_dim, heads, batch), 64-bit strides.
  using GmemShape = Shape<int32_t, Int<kHeadDim>, int32_t, int32_t>;
  using GmemStride = Stride<int64_t, _1, int64_t, int64_t>;
  template <class T>
  using GmemTensor = decltype(make_tensor(make_gmem_ptr(static_cast<T*>(nullptr)), GmemShape{}, GmemStride{}));

  using TileShapeQK = Shape<Int<kBlockM>, Int<kBlockN>, Int<kHeadDim>>;  // S = Q K^T: (M, N, d)
  using TileShapePV = Shape<Int<kBlockM>, Int<kHeadDim>, Int<kBlockN>>;  // O = P V:   (M, d, N)
  using AtomLayout = Layout<Shape<Int<kNumConsumerWarpGroups>, _1, _1>>;

  // S = Q K^T: both operands from shared memory (SS). O += P V: P from
  // registers (RS), V read with the sequence mode as its K mode (MN-major).
  using TiledMmaQK = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kBlockN>, Int<kHeadDim>>>(), AtomLayout{}));
  using TiledMmaPV = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, Shape<_64, Int<kHeadDim>, Int<kBlockN>>, GMMA::Major::K,
                           GMMA::Major::MN>(),
      AtomLayout{}));

  using SmemLayoutQ = decltype(tile_to_shape(
      cutlass::gemm::collective::detail::ss_smem_selector<GMMA::Major::K, Element, Int<kBlockM>, Int<kHeadDim>>(),
      Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  using SmemLayoutK = decltype(tile_to_shape(
      cutlass::gemm::collective::detail::ss_smem_selector<GMMA::Major::K, Element, Int<kBlockN>, Int<kHeadDim>>(),
      Shape<Int<kBlockN>, Int<kHeadDim>, Int<kStages>>{}));
  // V^T as the PV GEMM reads it, (d, N, stage) with d contiguous; the TMA
  // writes the same bytes through the (N, d, stage) view SmemLayoutV.
  using SmemLayoutVt = decltype(tile_to_shape(
      cutlass::gemm::collective::detail::ss_smem_selector<GMMA::Major::MN, Element, Int<kHeadDim>, Int<kBlockN>>(),
      Shape<Int<kHeadDim>, Int<kBlockN>, Int<kStages>>{}, Step<_2, _1, _3>{}));
  using SmemLayoutV = decltype(composition(
      SmemLayoutVt{}, make_layout(Shape<Int<kBlockN>, Int<kHeadDim>, Int<kStages>>{},
                                  Stride<Int<kHeadDim>, _1, Int<kHeadDim * kBlockN>>{})));
  using SmemLayoutO = SmemLayoutQ;

  using PipelineK = cutlass::PipelineTmaAsync<kStages>;
  using PipelineV = cutlass::PipelineTmaAsync<kStages>;
  using PipelineTile = cutlass::PipelineAsync<1>;  // producer -> consumers: which tile next

  static constexpr int kQBytes = kBlockM * kHeadDim * sizeof(Element);
  static constexpr int kKVBytes = kStages * kBlockN * kHeadDim * sizeof(Element);
  static constexpr int kSmemLimit = 227 * 1024;
  // O gets its own buffer when it fits: then the next tile's Q can load while
  // this tile's O is being stored.
  static constexpr bool kSeparateSmemO = kQBytes * 2 + 2 * kKVBytes + 1024 <= kSmemLimit;

  using ArrayQ = cute::array_aligned<Element, cosize_v<SmemLayoutQ>, 1024>;
  using ArrayO = cute::array_aligned<Element, cosize_v<SmemLayoutO>, 1024>;
  struct SeparateQO {
    ArrayQ q;
    ArrayO o;
  };
  union AliasedQO {
    ArrayQ q;
    ArrayO o;
  };

  struct SharedStorage {
    std::conditional_t<kSeparateSmemO, SeparateQO, AliasedQO> qo;
    cute::array_aligned<Element, cosize_v<SmemLayoutK>, 1024> k;
    cute::array_aligned<Element, cosize_v<SmemLayoutV>, 1024> v;
    typename PipelineK::SharedStorage pipeline_k;
    typename PipelineV::SharedStorage pipeline_v;
    typename PipelineTile::SharedStorage pipeline_tile;
    cutlass::arch::ClusterTransactionBarrier barrier_q;
    int tile_index;  // the one slot of pipeline_tile
  };
  static_assert(sizeof(SharedStorage) <= kSmemLimit, "tile sizes overflow shared memory");
};

// Named barriers (ids after CUTLASS's reserved ones).
enum class Barrier : uint32_t {
  kQueryEmpty = 0,   // consumers -> producer: Q's buffer may be overwritten
  kEpilogue = 1,     // consumers: O is in shared memory / its buffer is free
  kPingpongWG0 = 2,  // consumer warpgroup w waits on kPingpongWG0 + w for its turn to issue GEMMs
};

}  // namespace flash3::fwd
