// Register-fragment views of WGMMA accumulators, and the GEMM issue helper.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/numeric_conversion.h>

namespace flash3 {

using namespace cute;

// A WGMMA accumulator fragment is ((2, 2, N/8), MMA_M, MMA_N): two adjacent
// columns, two rows 8 apart, N/8 column groups. View it as (rows, cols) so the
// softmax can loop over a thread's rows.
template <class Layout>
CUTE_HOST_DEVICE constexpr auto accumulator_rowcol(Layout acc) {
  auto v = get<0>(acc);
  return make_layout(make_layout(get<1>(v), get<1>(acc)), make_layout(get<0>(v), get<2>(v), get<2>(acc)));
}

// The same registers as the A operand of a 16-bit RS WGMMA: an A fragment is
// ((2, 2, 2), MMA_M, MMA_K), i.e. two accumulator column groups per k-block of
// 16. P = softmax(S) is fed to the PV GEMM without leaving registers.
template <class Layout>
CUTE_HOST_DEVICE constexpr auto accumulator_as_operand_a(Layout acc) {
  auto v = logical_divide(get<0>(acc), Shape<Underscore, Underscore, _2>{});  // (2, 2, (2, N/16))
  return make_layout(make_layout(get<0>(v), get<1>(v), get<2, 0>(v)), get<1>(acc),
                     coalesce(make_layout(get<2, 1>(v), get<2>(acc))));
}

// Element-wise conversion of a register fragment (e.g. fp32 P -> bf16), keeping
// its layout.
template <class To, class Engine, class Layout>
CUTE_DEVICE auto convert_fragment(Tensor<Engine, Layout> const& src) {
  using From = typename Engine::value_type;
  constexpr int kSize = decltype(size(src))::value;
  Tensor dst = make_tensor<To>(src.layout());
  cutlass::NumericArrayConverter<To, From, kSize> converter;
  *reinterpret_cast<cutlass::Array<To, kSize>*>(dst.data()) =
      converter(*reinterpret_cast<cutlass::Array<From, kSize> const*>(src.data()));
  return dst;
}

// FP8 (§3.3, Figures 3 and 4): P as the A operand of an 8-bit RS WGMMA, an
// A fragment ((4, 2, 2), MMA_M, N/32) taking k = 4t..4t+3 and 16+4t..16+4t+3
// for thread t of a quad. The accumulator's registers are used as they are,
// in this order: a thread's columns {2t, 2t+1, 8+2t, 9+2t} become k =
// 4t..4t+3, and V^T's keys are permuted to match (fwd/transpose_v.h). Only
// bytes move (the converter packs pairs, then byte permutes), no shuffles.
template <class To, class Engine, class AccLayout>
CUTE_DEVICE auto accumulator_to_fp8_operand_a(Tensor<Engine, AccLayout> const& acc) {
  constexpr int kChunks = decltype(size(acc))::value / 16;  // 32 columns each
  // A index (kk0 + 2 kk1, row half, k half, chunk) -> accumulator index
  // kk0 + 2 (row half) + 4 (4 chunk + 2 (k half) + kk1).
  Tensor in_a_order = make_tensor(acc.data(), cute::Layout<Shape<Shape<_2, _2>, _2, _2, Int<kChunks>>,
                                                     Stride<Stride<_1, _4>, _2, _8, _16>>{});
  Tensor gathered = make_tensor<float>(cute::Layout<Shape<Shape<_4, _2, _2>, _1, Int<kChunks>>>{});
  CUTE_UNROLL
  for (int i = 0; i < size(gathered); ++i) gathered(i) = in_a_order(i);
  return convert_fragment<To>(gathered);
}

// Issues one warpgroup GEMM C (+)= A B over all k-blocks and commits it as one
// WGMMA batch; the caller waits with warpgroup_wait<N>(). A is a register
// fragment (RS) or a shared-memory descriptor (SS).
template <bool kZeroInit, class TiledMma, class TensorA, class TensorB, class TensorC>
CUTE_DEVICE void warpgroup_gemm(TiledMma& tiled_mma, TensorA const& a, TensorB const& b, TensorC& c) {
  constexpr bool kARegisters = !std::is_same_v<typename TensorA::engine_type::iterator, GMMA::DescriptorIterator>;
  if constexpr (kARegisters) warpgroup_fence_operand(const_cast<TensorA&>(a));
  warpgroup_fence_operand(c);
  warpgroup_arrive();
  if constexpr (kZeroInit) tiled_mma.accumulate_ = GMMA::ScaleOut::Zero;
  CUTE_UNROLL
  for (int k = 0; k < size<2>(a); ++k) {
    cute::gemm(tiled_mma, a(_, _, k), b(_, _, k), c);
    tiled_mma.accumulate_ = GMMA::ScaleOut::One;
  }
  warpgroup_commit_batch();
  warpgroup_fence_operand(c);
  if constexpr (kARegisters) warpgroup_fence_operand(const_cast<TensorA&>(a));
}

}  // namespace flash3
