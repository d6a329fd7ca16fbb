// The mask policy (common/mask.h) applied to S on the key blocks that
// block_range() marks: each accumulator element's (row, column) in the tile,
// columns at or past the row's col_limit set to -inf before the softmax.
#pragma once

#include <cmath>

#include "common/layout.h"
#include "common/mask.h"
#include "fwd/block_range.h"

namespace flash3::fwd {

template <bool kCausal, int kBlockM, int kBlockN, class TiledMma>
struct Mask {
  MaskPolicy policy;
  int row_offset;  // rows above the sequence in the first tile (tile_first_row)

  CUTE_DEVICE Mask(int seqlen_q, int seqlen_k, int row_offset)
      : policy{seqlen_q, seqlen_k, kCausal}, row_offset(row_offset) {}

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
      int const limit = policy.col_limit(tile_first_row(m_block, kBlockM, row_offset) + get<0>(c(r, 0)));
      CUTE_UNROLL
      for (int j = 0; j < size<1>(s); ++j) {
        if (col0 + get<1>(c(r, j)) >= limit) s(r, j) = -INFINITY;
      }
    }
  }
};

}  // namespace flash3::fwd
