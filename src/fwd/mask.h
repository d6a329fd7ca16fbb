// The mask policy (common/mask.h) applied to S on the key blocks that
// block_range() marks: each accumulator element's (row, column) in the tile,
// columns outside the row's [col_start, col_limit) set to -inf before the
// softmax. The policy comes from the kernel's parameters at each use (the
// call's window bounds are not held in registers across the mainloop).
#pragma once

#include <cmath>

#include "common/layout.h"
#include "common/mask.h"
#include "fwd/block_range.h"

namespace flash3::fwd {

// kWindow: both edges of each row's window (the window kernel's); otherwise
// only the right one (the causal diagonal, or seqlen_k).
template <bool kWindow, int kBlockM, int kBlockN, class TiledMma>
struct Mask {
  // thread_idx: the thread's index among the consumer threads, as used to
  // partition the accumulator.
  template <class TensorS>
  CUTE_DEVICE static void apply(MaskPolicy const& policy, int row_offset, TensorS& acc_s, int m_block, int n_block,
                                int thread_idx) {
    int const first_row = tile_first_row(m_block, kBlockM, row_offset);
    apply_rows(policy, acc_s, n_block, thread_idx, [first_row](int r) { return first_row + r; });
  }

  // The same where the tile's rows are not consecutive query rows: query
  // row position_of(r) for the tile's row r (MLA's packed (position, head)
  // rows).
  template <class TensorS, class PositionOf>
  CUTE_DEVICE static void apply_rows(MaskPolicy const& policy, TensorS& acc_s, int n_block, int thread_idx,
                                     PositionOf&& position_of) {
    // The (row, col) of each accumulator element within the tile.
    Tensor coords = TiledMma{}.get_thread_slice(thread_idx).partition_C(
        make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{}));
    Tensor s = make_tensor(acc_s.data(), accumulator_rowcol(acc_s.layout()));
    Tensor c = make_tensor(coords.data(), accumulator_rowcol(coords.layout()));
    int const col0 = n_block * kBlockN;
    CUTE_UNROLL
    for (int r = 0; r < size<0>(s); ++r) {
      int const row = position_of(get<0>(c(r, 0)));
      int const limit = policy.col_limit(row) - col0;
      if constexpr (kWindow) {
        int const start = policy.col_start(row) - col0;
        CUTE_UNROLL
        for (int j = 0; j < size<1>(s); ++j) {
          int const col = get<1>(c(r, j));
          if (col >= limit || col < start) s(r, j) = -INFINITY;
        }
      } else {
        CUTE_UNROLL
        for (int j = 0; j < size<1>(s); ++j) {
          if (get<1>(c(r, j)) >= limit) s(r, j) = -INFINITY;
        }
      }
    }
  }
};

}  // namespace flash3::fwd
