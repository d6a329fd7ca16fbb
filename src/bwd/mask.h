// The mask applied to S^T (keys on the rows, queries on the columns) on the
// query blocks that need it: keys past seqlen_k and, with kCausal, keys right
// of the bottom-right aligned diagonal. Masked scores become -inf, so P = 0.
// Query rows past seqlen_q need no mask: their LSE is +inf in the workspace.
#pragma once

#include <cute/tensor.hpp>

#include <cmath>

namespace flash3::bwd {

template <bool kCausal, int kBlockM, int kBlockN>
struct Mask {
  int seqlen_q;
  int seqlen_k;

  // coords: the (key, query) of each element of acc_st within the tile.
  template <class TensorS, class Coords>
  CUTE_DEVICE void apply(TensorS& acc_st, Coords const& coords, int m_block, int n_block) const {
    int const key0 = n_block * kBlockN;
    int const query0 = m_block * kBlockM + seqlen_k - seqlen_q;
    CUTE_UNROLL
    for (int i = 0; i < cute::size(acc_st); ++i) {
      int const key = key0 + cute::get<0>(coords(i));
      bool masked = key >= seqlen_k;
      if constexpr (kCausal) masked |= key > query0 + cute::get<1>(coords(i));
      if (masked) acc_st(i) = -INFINITY;
    }
  }
};

}  // namespace flash3::bwd
