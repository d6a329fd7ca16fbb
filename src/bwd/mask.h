// The mask policy (common/mask.h) applied to S^T (or S, bwd/traits.h) on
// the query blocks that need it: keys past seqlen_k and, in the masked
// kernel (kCausal: the causal mask or a window), keys outside the row's
// window. Masked scores become -inf, so P = 0. Query rows past seqlen_q need
// no mask: their LSE is +inf in the workspace. The policy comes from the
// kernel's parameters at each use.
#pragma once

#include <cute/tensor.hpp>

#include <cmath>

#include "common/mask.h"

namespace flash3::bwd {

template <bool kCausal, int kBlockM, int kBlockN>
struct Mask {
  // coords: the (key, query) of each element of acc_st within the tile, whichever
  // mode of the accumulator holds the keys: this thread's first element's, at
  // run time, plus each element's offset, known at compile time. The tests
  // compare the offsets with bounds per block, so that no element's key is
  // held in a register across the mainloop (hoisted, ten of them spilled at
  // d = 256).
  template <class TensorS, class Coords>
  CUTE_DEVICE static void apply(MaskPolicy const& policy, TensorS& acc_st, Coords const& coords, int m_block,
                                int n_block) {
    auto const base = *coords.data();
    int const key0 = n_block * kBlockN + int(cute::get<0>(base));
    int const query0 = m_block * kBlockM + int(cute::get<1>(base));
    // The policy's rule (col_start(query) <= key < col_limit(query)) as
    // bounds on the offsets' difference.
    int const key_limit = policy.seqlen_k - key0;  // offsets from it on: past seqlen_k
    int const right = query0 + policy.right_offset() - key0;  // key - query beyond it: right of the window
    int const left = query0 - policy.left_offset() - key0;    // key - query below it: left of the window
    bool const bounded_left = kCausal && policy.bounded_left();
    CUTE_UNROLL
    for (int i = 0; i < cute::size(acc_st); ++i) {
      auto const offset = coords.layout()(i);
      int const key = cute::get<0>(offset), query = cute::get<1>(offset);
      bool masked = key >= key_limit;
      if constexpr (kCausal) masked |= (policy.bounded_right() && key - query > right) ||
                                       (bounded_left && key - query < left);
      if (masked) acc_st(i) = -INFINITY;
    }
  }
};

}  // namespace flash3::bwd
