// The mask policy (common/mask.h) applied to S^T (or S, bwd/traits.h) on
// the query blocks that need it: keys past seqlen_k and, with kCausal, keys
// right of the diagonal. Masked scores become -inf, so P = 0. Query rows
// past seqlen_q need no mask: their LSE is +inf in the workspace.
#pragma once

#include <cute/tensor.hpp>

#include <cmath>

#include "common/mask.h"

namespace flash3::bwd {

template <bool kCausal, int kBlockM, int kBlockN>
struct Mask {
  MaskPolicy policy;

  CUTE_DEVICE Mask(int seqlen_q, int seqlen_k) : policy{seqlen_q, seqlen_k, kCausal} {}

  // coords: the (key, query) of each element of acc_st within the tile, whichever
  // mode of the accumulator holds the keys: this thread's first element's, at
  // run time, plus each element's offset, known at compile time. The tests
  // compare the offsets with two bounds per block, so that no element's key
  // is held in a register across the mainloop (hoisted, ten of them spilled
  // at d = 256).
  template <class TensorS, class Coords>
  CUTE_DEVICE void apply(TensorS& acc_st, Coords const& coords, int m_block, int n_block) const {
    auto const base = *coords.data();
    int const key0 = n_block * kBlockN + int(cute::get<0>(base));
    // The policy's rule (key < col_limit(query)) as two bounds on the offsets.
    int const key_limit = policy.seqlen_k - key0;  // offsets from it on: past seqlen_k
    int const diagonal = m_block * kBlockM + int(cute::get<1>(base)) + policy.diagonal() - key0;
    CUTE_UNROLL
    for (int i = 0; i < cute::size(acc_st); ++i) {
      auto const offset = coords.layout()(i);
      int const key = cute::get<0>(offset), query = cute::get<1>(offset);
      bool masked = key >= key_limit;
      if constexpr (kCausal) masked |= key - query > diagonal;  // right of the bottom-right aligned diagonal
      if (masked) acc_st(i) = -INFINITY;
    }
  }
};

}  // namespace flash3::bwd
