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
