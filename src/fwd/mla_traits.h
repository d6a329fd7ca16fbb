// Compile-time description of the MLA kernel (fwd/mla_kernel.h): multi-head
// latent attention in its absorbed form (ForwardArgs::qv), decoding from a KV
// cache. The scores are S = Q K^T + Qv V^T (the rotary part, head dim 64, and
// the latent part, 512) and O = P V. O's 64 x 512 float32 accumulator is
// more than one warpgroup's registers, so the two consumer warpgroups each
// hold half of its columns: the first computes S and the softmax and hands P
// and the rows' rescale factors to the second through shared memory. Named
// for the paper's roles: producer, then the softmax and value consumers.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/gemm/collective/builders/sm90_common.inl>
#include <cutlass/pipeline/pipeline.hpp>
#include <utility>

#include "common/head_dims.h"
#include "common/registers.h"
#include "fwd/kv_boxes.h"
#include "fwd/tile_size.h"

namespace flash3::fwd {

using namespace cute;

template <bool kSplit_>
struct MlaTraits {
  using Element = cutlass::bfloat16_t;
  static constexpr bool kSplit = kSplit_;  // split-KV: float32 partials for the combine kernel
  static constexpr int kHeadDim = kMlaHeadDims.head_dim;     // Q, K: the rotary part
  static constexpr int kHeadDimV = kMlaHeadDims.head_dim_v;  // Qv, V, O: the latent part
  static constexpr int kBlockM = kMlaTile.block_m;
  static constexpr int kBlockN = kMlaTile.block_n;
  static constexpr int kStages = kMlaTile.stages;
  static constexpr int kHalfV = kHeadDimV / 2;  // O's columns per consumer warpgroup

  // Warpgroup 0 the producer (warp 0 issues the TMA loads), 1 and 2 the consumers.
  static constexpr int kNumConsumerThreads = 2 * cutlass::NumThreadsPerWarpGroup;
  static constexpr int kNumThreads = cutlass::NumThreadsPerWarpGroup + kNumConsumerThreads;
  static constexpr int kProducerRegisters = 24;
  static constexpr int kConsumerRegisters = 240;  // O's half: 128; S: 32; P: 16
  static_assert(fits_launch_registers(kNumThreads, 128, kProducerRegisters, kConsumerRegisters));

  // Global K and V (the cache) as (rows, head dim, heads, entries).
  template <int kDim>
  using GmemShapeOf = Shape<int32_t, Int<kDim>, int32_t, int32_t>;
  using GmemStride = Stride<int64_t, _1, int64_t, int64_t>;
  template <int kDim>
  using GmemTensor =
      decltype(make_tensor(make_gmem_ptr(static_cast<Element const*>(nullptr)), GmemShapeOf<kDim>{}, GmemStride{}));

  // S = Q K^T + Qv V^T by the softmax warpgroup, both operands from shared
  // memory; the same atom serves both products (k-steps of 16 over 64 and
  // over 512).
  using TiledMmaS = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, Shape<_64, Int<kBlockN>, Int<kHeadDim>>>(),
      Layout<Shape<_1, _1, _1>>{}));
  // O's half += P V's half: P from registers in the softmax warpgroup, from
  // shared memory in the value warpgroup; V read with the keys as the K mode.
  using TileShapeO = Shape<_64, Int<kHalfV>, Int<kBlockN>>;
  using TiledMmaORS = decltype(make_tiled_mma(
      GMMA::rs_op_selector<Element, Element, float, TileShapeO, GMMA::Major::K, GMMA::Major::MN>(),
      Layout<Shape<_1, _1, _1>>{}));
  using TiledMmaOSS = decltype(make_tiled_mma(
      GMMA::ss_op_selector<Element, Element, float, TileShapeO, GMMA::Major::K, GMMA::Major::MN>(),
      Layout<Shape<_1, _1, _1>>{}));

  template <int kRows, int kCols>
  using KMajorAtom =
      decltype(cutlass::gemm::collective::detail::ss_smem_selector<GMMA::Major::K, Element, Int<kRows>, Int<kCols>>());
  using SmemLayoutQ = decltype(tile_to_shape(KMajorAtom<kBlockM, kHeadDim>{}, Shape<Int<kBlockM>, Int<kHeadDim>>{}));
  using SmemLayoutQv = decltype(tile_to_shape(KMajorAtom<kBlockM, kHeadDimV>{}, Shape<Int<kBlockM>, Int<kHeadDimV>>{}));
  using SmemLayoutK = decltype(tile_to_shape(KMajorAtom<kBlockN, kHeadDim>{},
                                             Shape<Int<kBlockN>, Int<kHeadDim>, Int<kStages>>{}));
  // V as (N, dv, stage), K-major: S's operand and the TMA's destination.
  using SmemLayoutV = decltype(tile_to_shape(KMajorAtom<kBlockN, kHeadDimV>{},
                                             Shape<Int<kBlockN>, Int<kHeadDimV>, Int<kStages>>{}));
  // The same bytes as (dv, N, stage), dv contiguous: the PV GEMM's operand.
  using SmemLayoutVt = decltype(tile_to_shape(
      cutlass::gemm::collective::detail::ss_smem_selector<GMMA::Major::MN, Element, Int<kHeadDimV>, Int<kBlockN>>(),
      Shape<Int<kHeadDimV>, Int<kBlockN>, Int<kStages>>{}, Step<_2, _1, _3>{}));
  // P, (M, N) K-major: written by the softmax warpgroup, read by the value warpgroup's GEMM.
  using SmemLayoutP = decltype(tile_to_shape(KMajorAtom<kBlockM, kBlockN>{}, Shape<Int<kBlockM>, Int<kBlockN>>{}));

  // SmemLayoutV and SmemLayoutVt address the same element: V's rows of one
  // swizzle atom (8 keys of 64 columns) are Vt's columns of the transposed
  // atom, and both tile their atoms keys first. Checked at every 8th column
  // of each key and stage, a constant per key (one evaluation over all of
  // them passes the compiler's constexpr budget).
  template <int kKey>
  static constexpr bool v_views_agree_at() {
    SmemLayoutV const v{};
    SmemLayoutVt const vt{};
    for (int s = 0; s < kStages; ++s) {
      for (int d = 0; d < kHeadDimV; d += 8) {
        if (int(v(kKey, d, s)) != int(vt(d, kKey, s))) return false;
      }
    }
    return true;
  }
  template <int kKey>
  static constexpr bool kVViewsAgreeAt = v_views_agree_at<kKey>();
  template <int... kKey>
  static constexpr bool v_views_agree(std::integer_sequence<int, kKey...>) {
    return (kVViewsAgreeAt<kKey> && ...);
  }
  static_assert(v_views_agree(std::make_integer_sequence<int, kBlockN>{}), "V's K-major and MN-major views disagree");

  // A paged cache's K and V blocks load as boxes (fwd/kv_boxes.h).
  using SmemLayoutKBox = BoxLayout<decltype(take<0, 2>(SmemLayoutK{})), kHeadDim>;
  using SmemLayoutVBox = BoxLayout<decltype(take<0, 2>(SmemLayoutV{})), kHeadDimV>;
  static_assert(boxes_are_shifted_copies<decltype(take<0, 2>(SmemLayoutK{})), kHeadDim, kBlockN>() &&
                    boxes_are_shifted_copies<decltype(take<0, 2>(SmemLayoutV{})), kHeadDimV, kBlockN>(),
                "a paged cache's boxes are not the stage's layout at an offset");

  static constexpr uint32_t kKVBytes = (kBlockN * kHeadDim + kBlockN * kHeadDimV) * sizeof(Element);  // K_j and V_j

  using PipelineKV = cutlass::PipelineTmaAsync<kStages>;  // K_j and V_j in one stage

  struct SharedStorage {
    cute::array_aligned<Element, cosize_v<SmemLayoutQ>, 1024> q;
    cute::array_aligned<Element, cosize_v<SmemLayoutQv>, 1024> qv;
    cute::array_aligned<Element, cosize_v<SmemLayoutK>, 1024> k;
    cute::array_aligned<Element, cosize_v<SmemLayoutV>, 1024> v;
    cute::array_aligned<Element, cosize_v<SmemLayoutP>, 1024> p;
    // Softmax -> value warpgroup: each row's rescale factor for the block's P, then
    // its final 1 / l.
    float row_scale[kBlockM];
    typename PipelineKV::SharedStorage pipeline_kv;
  };
  static_assert(sizeof(SharedStorage) <= 227 * 1024, "MLA's tiles overflow shared memory");
};

// Named barriers between the two consumer warpgroups (ids after CUTLASS's
// reserved ones; the MLA kernel uses no others).
enum class MlaBarrier : uint32_t {
  kPFull = 0,     // the softmax warpgroup has written P and the rescale factors
  kPEmpty = 1,    // the value warpgroup's GEMM has read P
  kQueries = 2,   // the tile's Q and Qv are in shared memory
};

}  // namespace flash3::fwd
