// The mask applied to S on the key blocks that block_range() marks: columns
// past seqlen_k, and with kCausal the columns right of the bottom-right
// aligned diagonal. Masked scores become -inf before the softmax.
#pragma once

#include <cmath>

#include "common/layout.h"
#include "fwd/block_range.h"

namespace flash3::fwd {

template <bool kCausal, int kBlockM, int kBlockN, class TiledMma>
struct Mask {
  int seqlen_q;
  int seqlen_k;
  int row_offset;  // rows above the sequence in the first tile (tile_first_row)

  // thread_idx: the thread's index among the consumer threads, as used to
  // partition the accumulator.
  template <class TensorS>
  CUTE_DEVICE void apply(TensorS& acc_s, int m_block, int n_block, int thread_idx) const {
    // The (row, col) of each accumulator element within the tile.
    Tensor coords = TiledMma{}.get_thread_slice(thread_idx).partition_C(
        make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{}));
    Tensor s = make_tensor(acc_s.data(), accumulator_rowcol(acc_s.layout()));
    Tensor c = make_tensor(coords.data(), accumulator_rowcol(coords.layout()));
    int const col0 = n_block * kBlockN;
    CUTE_UNROLL
    for (int r = 0; r < size<0>(s); ++r) {
      int limit = seqlen_k;  // first column this row may not see
      if constexpr (kCausal) {
        int const row = tile_first_row(m_block, kBlockM, row_offset) + get<0>(c(r, 0));
        limit = min(limit, row + 1 + seqlen_k - seqlen_q);
      }
      CUTE_UNROLL
      for (int j = 0; j < size<1>(s); ++j) {
        if (col0 + get<1>(c(r, j)) >= limit) s(r, j) = -INFINITY;
      }
    }
  }
};

}  // namespace flash3::fwd
