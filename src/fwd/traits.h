// Compile-time description of one forward kernel: element type, head dim, tile
// sizes, the paper's techniques that are switched on, and the CuTe layouts and
// MMAs that follow from them.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/gemm/collective/builders/sm90_common.inl>
#include <cutlass/pipeline/pipeline.hpp>

#include "common/element.h"
#include "common/registers.h"
#include "common/tile_order.h"
#include "fwd/tile_size.h"
#include "fwd/variants.h"

namespace flash3::fwd {

using namespace cute;

// Element is Q, K, V's type; O's is the same, except for FP8's
// (kVariant.fp8_out). kHeadDim is Q's and K's head dim, kHeadDimV V's and O's
// (a pair of common/head_dims.inc, or the same).
template <class Element_, int kHeadDim_, Variant kVariant = Variant{}, int kHeadDimV_ = kHeadDim_>
struct FwdTraits {
  using Element = Element_;
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kHeadDimV = kHeadDimV_;
  // FP8 (§3.3): V is transposed in shared memory by the producer warpgroup,
  // P is re-laid out in registers, and the inputs carry descale factors.
  static constexpr bool kFp8 = sizeof(Element) == 1;
  static_assert(!kFp8 || kHeadDimV == kHeadDim, "FP8's V transpose and scale blocks take V's head dim as Q's");
  using ElementO = std::conditional_t<kFp8, ElementOf<kVariant.fp8_out>, Element>;
  static constexpr bool kCausal = kVariant.causal;  // the masked kernel (fwd/variants.h)
  static constexpr bool kWindow = kVariant.window;
  static constexpr bool kPacked = kVariant.packed;  // packed sequences (varlen)
  static constexpr bool kKvCache = kVariant.kv_cache;  // keys of a KV cache (common/kv_cache.h)
  static constexpr bool kSplit = kVariant.split;       // split-KV: float32 partials (fwd/split_epilogue.h)
  static_assert(!kSplit || kKvCache, "split-KV is built for the KV cache kernels");
  // Each batch entry's own key count (and packed sequences' query count),
  // read from device memory by the mask and the block ranges.
  static constexpr bool kPerEntryLengths = kPacked || kKvCache;
  static constexpr bool kPingpong = kVariant.pingpong;
  // The window kernels from head dim 192 (V's 128 too) and in FP8 run
  // Algorithm 1's iteration: with the overlap's S_next and P both live they
  // spill.
  static constexpr bool kIntraWGOverlap =
      kVariant.intra_warpgroup_overlap && !(kVariant.window && (sizeof(Element) == 1 || kHeadDim_ >= 192));
  // Algorithm 1's producer warpgroup. Switched off (the ablation), the
  // consumers issue the TMA loads themselves, between their GEMMs.
  static constexpr bool kWarpSpecialized = kVariant.warp_specialization;

  static constexpr TileSize kTile = tile_size(kHeadDim, kHeadDimV, kFp8, kWindow || (kPacked && kCausal) || kKvCache);
  // OnlineSoftmax's lazy row max, where skipping O's rescale (dv/2 multiplies
  // per thread and key block) pays for the check: from O's head dim 128 on.
  static constexpr bool kLazyRowMax = !kFp8 && kHeadDimV >= 128;
  static constexpr int kBlockM = kTile.block_m;
  static constexpr int kBlockN = kTile.block_n;
  static constexpr int kStages = kTile.stages;

  static constexpr int kNumConsumerWarpGroups = kBlockM / 64;
  static constexpr int kNumConsumerThreads = kNumConsumerWarpGroups * 128;
  static constexpr int kFirstConsumerThread = kWarpSpecialized ? 128 : 0;  // after the producer warpgroup
  static constexpr int kNumThreads = kFirstConsumerThread + kNumConsumerThreads;
  // The consumer thread index read afresh from %tid.x, where a value derived
  // from it would otherwise be hoisted out of a loop and held (or spilled)
  // through the mainloop: the epilogue's coordinates, the mask's.
  CUTE_DEVICE static int consumer_thread_idx() {
    uint32_t tid;
    asm volatile("mov.u32 %0, %%tid.x;" : "=r"(tid));
    return int(tid) - kFirstConsumerThread;
  }
  static_assert(kNumConsumerWarpGroups == 2 || kNumConsumerWarpGroups == 3,
                "pingpong passes the turn round a ring of 2 or 3 warpgroups");
  // Without a producer, loads are issued one block ahead, into the stage the
  // previous iteration of Algorithm 2 freed; FP8's V transpose needs the
  // producer's warps.
  static_assert(kWarpSpecialized || (kIntraWGOverlap && !kFp8),
                "the variant without warp specialization is built on Algorithm 2, for BF16/FP16");
  // The producer warpgroup: warp 0 issues the TMA loads; with FP8 the other
  // three transpose V.
  static constexpr int kNumTransposeThreads = kFp8 ? 3 * cutlass::NumThreadsPerWarp : 0;
  // setmaxnreg: the producer only issues TMA; the consumers hold S, P and O.
  // 128 x 24 + 256 x 240 and 128 x 24 + 384 x 160 fit what the CTA has.
  // FP8's transposers fit 24 beside two consumer warpgroups (one counter for
  // their pipeline states, one unit in flight); beside three of 160 there
  // are 32 to give.
  static constexpr int kProducerRegisters = kFp8 && kNumConsumerWarpGroups == 3 ? 32 : 24;
  static constexpr int kConsumerRegisters = kNumConsumerWarpGroups == 3 ? 160 : 240;
  static_assert(!kWarpSpecialized || fits_launch_registers(kNumThreads, 128, kProducerRegisters, kConsumerRegisters));

  // Global Q, K, V, O as (seqlen, head_dim, heads, batch), 64-bit strides:
  // Q and K of kHeadDim columns (GmemShape), V and O of kHeadDimV.
  template <int kDim>
  using GmemShapeOf = Shape<int32_t, Int<kDim>, int32_t, int32_t>;
  using GmemShape = GmemShapeOf<kHeadDim>;
  using GmemStride = Stride<int64_t, _1, int64_t, int64_t>;
  template <class T, int kDim = kHeadDim>
  using GmemTensor = decltype(make_tensor(make_gmem_ptr(static_cast<T*>(nullptr)), GmemShapeOf<kDim>{}, GmemStride{}));
  // V's and O's shape: K's (or Q's) rows, heads and batch, with V's head dim.
  CUTE_HOST_DEVICE static auto shape_v(GmemShape const& s) {
    return make_shape(get<0>(s), Int<kHeadDimV>{}, get<2>(s), get<3>(s));
  }

  using TileShapeQK = Shape<Int<kBlockM>, Int<kBlockN>, Int<kHeadDim>>;   // S = Q K^T: (M, N, d)
  using TileShapePV = Shape<Int<kBlockM>, Int<kHeadDimV>, Int<kBlockN>>;  // O = P V:   (M, dv, N)
  using AtomLayout = Layout<Shape<Int<kNumConsumerWarpGroups>, _1, _1>>;

  // S = Q K^T: both operands from shared memory (SS). O += P V: P from
  // registers (RS). V^T is read with the sequence mode as its K mode: BF16
  // WGMMA reads V as loaded (MN-major); FP8 WGMMA takes K-major operands
  // only, hence the transposed copy of V.
  static constexpr GMMA::Major kMajorVt = kFp8 ? GMMA::Major::K : GMMA::Major::MN;
  using TiledMmaQK = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kBlockN>, Int<kHeadDim>>>(), AtomLayout{}));
  // O += P V over `Width` of O's columns (all of them, or a chunk of O).
  template <class Width>
  using TiledMmaPVOver = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, Shape<_64, Width, Int<kBlockN>>, GMMA::Major::K, kMajorVt>(),
      AtomLayout{}));
  using TiledMmaPV = TiledMmaPVOver<Int<kHeadDimV>>;

  static constexpr int kQBytes = kBlockM * kHeadDim * sizeof(Element);
  static constexpr int kOBytes = kBlockM * kHeadDimV * sizeof(ElementO);
  static constexpr int kKBytes = kStages * kBlockN * kHeadDim * sizeof(Element);
  static constexpr int kVBytes = kStages * kBlockN * kHeadDimV * sizeof(Element);
  static constexpr int kSmemLimit = 227 * 1024;
  // Q's buffers. With one, the next tile's Q loads once this tile's last
  // QK^T is done, and its DRAM latency stands between the two tiles; two let
  // it load during this tile (Mainloop::load). 16-bit only: in FP8's kernels
  // the second Q pipeline state costs more registers than it saves.
  static constexpr int kQStages = !kFp8 && 2 * kQBytes + kOBytes + kKBytes + kVBytes + 1024 <= kSmemLimit ? 2 : 1;
  // Each warpgroup's epilogue deferred into the next tile, under its first
  // QK^T (Kernel, DeferredEpilogue), with a store of its own rows: where the
  // next tile's Q is there by then (two buffers), and in the kernels of three
  // warpgroups, whose epilogues then overlap the other warpgroups' GEMMs. The
  // others keep one joined store of the whole tile.
  // Split-KV stores its float32 partial O at once: held into the next tile
  // it would take O's registers twice.
  static constexpr bool kDeferEpilogue = !kSplit && (kNumConsumerWarpGroups == 3 || kQStages == 2);
  using SmemLayoutQ = decltype(tile_to_shape(
      cutlass::gemm::collective::detail::ss_smem_selector<GMMA::Major::K, Element, Int<kBlockM>, Int<kHeadDim>>(),
      Shape<Int<kBlockM>, Int<kHeadDim>, Int<kQStages>>{}));
  using SmemLayoutK = decltype(tile_to_shape(
      cutlass::gemm::collective::detail::ss_smem_selector<GMMA::Major::K, Element, Int<kBlockN>, Int<kHeadDim>>(),
      Shape<Int<kBlockN>, Int<kHeadDim>, Int<kStages>>{}));
  // V^T as the PV GEMM reads it, (dv, N, stage). BF16: dv contiguous, and the
  // TMA writes the same bytes through the (N, dv, stage) view SmemLayoutV.
  // FP8: N contiguous, written by the transpose from the TMA's buffer
  // SmemLayoutV, which is laid out as K.
  using SmemLayoutVt = decltype(tile_to_shape(
      cutlass::gemm::collective::detail::ss_smem_selector<kMajorVt, Element, Int<kHeadDimV>, Int<kBlockN>>(),
      Shape<Int<kHeadDimV>, Int<kBlockN>, Int<kStages>>{},
      std::conditional_t<kFp8, Step<_1, _2, _3>, Step<_2, _1, _3>>{}));
  using SmemLayoutV = std::conditional_t<
      kFp8, SmemLayoutK,
      decltype(composition(SmemLayoutVt{}, make_layout(Shape<Int<kBlockN>, Int<kHeadDimV>, Int<kStages>>{},
                                                       Stride<Int<kHeadDimV>, _1, Int<kHeadDimV * kBlockN>>{})))>;

  // O leaves through its own shared-memory buffer and TMA stores, so that Q's
  // buffer is free once the tile's last QK^T is done and the next tile's Q
  // loads under the last PV GEMM and the epilogue. Where a whole O tile does
  // not fit beside Q and the K/V stages (16-bit head dims 192, 192 with V's
  // 128, and 256, FP8 256), the buffer holds half of O's columns and the
  // halves go out one after the other.
  static constexpr int kOChunks =
      kQStages * kQBytes + kOBytes + kKBytes + (kFp8 ? 2 : 1) * kVBytes + 1024 <= kSmemLimit ? 1 : 2;
  using OChunkWidth = Int<kHeadDimV / kOChunks>;
  using TileShapeOChunk = Shape<Int<kBlockM>, OChunkWidth>;
  // Where a sequence's partial tile holds only one of three warpgroups'
  // rows, a causal launch makes it the first tile, whose rows see the fewest
  // keys, rather than the last, whose rows see them all: its tiles start
  // above the sequence by whole warpgroups (block_range; launch_forward).
  // Not FP8, whose Q scale blocks are the tiles.
  static constexpr bool kPartialTileFirst = kCausal && !kFp8 && kNumConsumerWarpGroups == 3 && !kSplit;
  // O leaves by TMA stores of this shape. With the deferred epilogue each
  // consumer warpgroup stores its own 64 rows from a block of its own in the
  // buffer, waiting for no other warpgroup, and rows above the sequence
  // (kPartialTileFirst) are left out by whole stores (a TMA store may not
  // start at a negative row: it traps). Otherwise the warpgroups join and
  // one store takes the whole tile: at head dims above 64 a store per
  // warpgroup doubles the stores, as O's rows span two 64-column swizzle
  // atoms, which only the deferral pays for.
  static constexpr int kOStoreRows = kDeferEpilogue ? 64 : kBlockM;
  static_assert(kDeferEpilogue || !kPartialTileFirst);
  using TileShapeOStore = Shape<Int<kOStoreRows>, OChunkWidth>;
  using SmemLayoutOStore = decltype(tile_to_shape(
      cutlass::gemm::collective::detail::ss_smem_selector<GMMA::Major::K, ElementO, Int<kOStoreRows>, OChunkWidth>(),
      TileShapeOStore{}));
  using SmemLayoutO = decltype(tile_to_shape(SmemLayoutOStore{}, TileShapeOChunk{}));
  // The accumulator layout of an O chunk: a thread's fragment of O holds its
  // column groups outermost, so chunk c is the c-th contiguous slice of it.
  using TiledMmaOChunk = TiledMmaPVOver<OChunkWidth>;
  // What the epilogue's slicing relies on: per warpgroup one GMMA atom spans
  // all of O's columns (a chunk's, of the chunk's), so a thread's fragment is
  // ((2, 2, columns / 8), 1, 1), compact, with its 8-column groups outermost.
  template <class Width>
  static constexpr bool kColumnGroupsOutermost = [] {
    using Frag = decltype(partition_fragment_C(TiledMmaPVOver<Width>{}, Shape<Int<kBlockM>, Width>{}).layout());
    return size<1>(Frag{}) == 1 && size<2>(Frag{}) == 1 && size<0, 2>(Frag{}) == Width::value / 8 &&
           stride<0, 2>(Frag{}) == 4;
  }();
  static_assert(kColumnGroupsOutermost<Int<kHeadDimV>> && kColumnGroupsOutermost<OChunkWidth>,
                "O's chunks are not contiguous slices of a thread's O fragment");

  using PipelineQ = cutlass::PipelineTmaAsync<kQStages>;
  using PipelineK = cutlass::PipelineTmaAsync<kStages>;
  // What the consumers wait on for V: its TMA load (BF16), or its transpose
  // (FP8), which in turn waits on the TMA load through PipelineVLoad.
  using PipelineV = std::conditional_t<kFp8, cutlass::PipelineAsync<kStages>, cutlass::PipelineTmaAsync<kStages>>;
  using PipelineVLoad = cutlass::PipelineTmaAsync<kStages>;
  using PipelineTile = cutlass::PipelineAsync<1>;  // producer -> consumers: which tile next

  struct None {};
  using ArrayV = cute::array_aligned<Element, cosize_v<SmemLayoutV>, 1024>;

  struct SharedStorage {
    cute::array_aligned<Element, cosize_v<SmemLayoutQ>, 1024> q;
    cute::array_aligned<ElementO, cosize_v<SmemLayoutO>, 1024> o;  // one chunk of O
    cute::array_aligned<Element, cosize_v<SmemLayoutK>, 1024> k;
    ArrayV v;                                  // V as the TMA loads it
    std::conditional_t<kFp8, ArrayV, None> vt;  // FP8: V^T, as the PV GEMM reads it
    typename PipelineQ::SharedStorage pipeline_q;
    typename PipelineK::SharedStorage pipeline_k;
    typename PipelineV::SharedStorage pipeline_v;
    std::conditional_t<kFp8, typename PipelineVLoad::SharedStorage, None> pipeline_v_load;
    typename PipelineTile::SharedStorage pipeline_tile;
    // The one slot of pipeline_tile: the next tile's index and coordinates,
    // the latter computed once, by the producer, so that the scheduler's
    // divisions stay off the consumers' path at each tile's start. Without
    // a producer (the ablation) the consumers compute them.
    int tile_index;
    TileCoord tile;
    // Packed sequences and KV caches: the tile's (seqlen_q, seqlen_k) for the
    // mask inside the consumers' mainloop (fewer registers held across it),
    // published with Q by pipeline_q, a pair per Q stage.
    int sequence[kPerEntryLengths ? kQStages : 1][2];
    std::conditional_t<kFp8, float[kQStages], None> q_descale;  // FP8: Q's descale, published with Q by pipeline_q
  };
  static_assert(sizeof(SharedStorage) <= kSmemLimit, "tile sizes overflow shared memory");
};

// Named barriers (ids after CUTLASS's reserved ones).
enum class Barrier : uint32_t {
  kEpilogueWG0 = 0,  // O is in shared memory / its buffer is free: warpgroup w's rows on kEpilogueWG0 + w
                     // with the deferred epilogue, else the whole tile's on kEpilogueWG0
  kPingpongWG0 = 3,  // consumer warpgroup w waits on kPingpongWG0 + w for its turn to issue GEMMs
  kTileStart = 6,    // without a producer: consumers past the previous tile / the next tile's index written
};

}  // namespace flash3::fwd
