// A paged KV cache's key blocks as TMA boxes (common/kv_cache.h, PagedBoxes):
// the shared-memory layout of one box, the check that every box of a stage
// is that layout at an offset, and the loads of one block, box by box. The
// forward mainloop and the MLA kernel load their paged blocks through these.
#pragma once

#include <cute/tensor.hpp>
#include <utility>

#include "common/kv_cache.h"

namespace flash3::fwd {

using namespace cute;

inline constexpr int kBoxRows = PagedBoxes::kRows;

template <int kDim>
using BoxShape = Shape<Int<kBoxRows>, Int<kDim>>;

// A box of a stage's (N, d) layout: its first kBoxRows rows.
template <class StageLayout, int kDim>
using BoxLayout = decltype(composition(StageLayout{}, make_tile(Layout<Int<kBoxRows>>{}, Layout<Int<kDim>>{})));

// Each box's check is a constant of its own: one evaluation over every box
// passes the compiler's constexpr budget at head dim 192.
template <class StageLayout, int kDim, int kBox>
constexpr bool box_is_shifted_copy() {
  StageLayout const stage{};
  int const shift = int(stage(kBox * kBoxRows, 0)) - int(stage(0, 0));
  for (int r = 0; r < kBoxRows; ++r) {
    for (int c = 0; c < kDim; c += 8) {
      if (int(stage(kBox * kBoxRows + r, c)) != int(stage(r, c)) + shift) return false;
    }
  }
  return true;
}
template <class StageLayout, int kDim, int kBox>
inline constexpr bool kBoxIsShiftedCopy = box_is_shifted_copy<StageLayout, kDim, kBox>();
template <class StageLayout, int kDim, int... kBox>
constexpr bool boxes_are_shifted_copies(std::integer_sequence<int, kBox...>) {
  return (kBoxIsShiftedCopy<StageLayout, kDim, kBox> && ...);
}
// Whether a box is the same layout at an offset for every box of a block of
// kBlockN rows (the swizzle atoms are 8 rows, so a box of 16 holds whole
// atoms and starts on one): then one TMA descriptor loads them all.
template <class StageLayout, int kDim, int kBlockN>
constexpr bool boxes_are_shifted_copies() {
  static_assert(kBlockN % kBoxRows == 0, "a key block is whole boxes");
  return boxes_are_shifted_copies<StageLayout, kDim>(std::make_integer_sequence<int, kBlockN / kBoxRows>{});
}

// Key block n_block of batch entry `batch` (head head_kv) into `stage` of
// `buffer`: kBlockN / kBoxRows boxes, each from its page of the pool viewed
// as (page_size, d, heads, pages) (page -1 past the entry's keys: zeros),
// all counted by the stage's transaction barrier, whose byte count is the
// whole block's as for one load.
template <int kBlockN, class TmaBox, class GShape, class Element, class Layout, class Barrier>
CUTE_DEVICE void load_paged_block(TmaBox const& tma, GShape const& shape, Element* buffer, Layout layout,
                                  Barrier& barrier, int stage, KvCacheMap const& cache, int batch, int head_kv,
                                  int n_block) {
  auto const box_shape = make_shape(Int<kBoxRows>{}, get<1>(shape));
  Tensor pool = tma.get_tma_tensor(shape)(_, _, head_kv, _);           // (page_size, d, pages)
  Tensor s = make_tensor(make_smem_ptr(buffer), layout)(_, _, stage);  // (N, d)
  auto slice = tma.get_slice(_0{});
  PagedBoxes walk(cache, batch, n_block * kBlockN);
  CUTE_UNROLL
  for (int box = 0; box < kBlockN / kBoxRows; ++box) {
    Tensor g = local_tile(pool(_, _, walk.page()), box_shape, make_coord(walk.row / kBoxRows, _0{}));
    copy(tma.with(barrier), slice.partition_S(g), slice.partition_D(local_tile(s, box_shape, make_coord(box, _0{}))));
    walk.next();
  }
}

// Key block n_block of a paged cache: one load through the pool's whole-block
// atom `tma` where `where` says it is whole, else boxes through `tma_box`.
// Rows past an entry's keys are read only up to the end of the last key's box.
template <int kBlockN, class Tma, class TmaBox, class GShape, class Element, class Layout, class Barrier>
CUTE_DEVICE void load_paged(Tma const& tma, TmaBox const& tma_box, GShape const& shape, Element* buffer, Layout layout,
                            Barrier& barrier, int stage, KvCacheMap const& cache, int batch, int head_kv,
                            int n_block, PagedBlock where) {
  if (where.whole) {
    Tensor g = local_tile(tma.get_tma_tensor(shape)(_, _, head_kv, where.page),
                          make_shape(Int<kBlockN>{}, get<1>(shape)),
                          make_coord(n_block * kBlockN % cache.page_size / kBlockN, _0{}));
    Tensor s = make_tensor(make_smem_ptr(buffer), layout);  // (N, d, stages)
    auto slice = tma.get_slice(_0{});
    copy(tma.with(barrier), slice.partition_S(g), slice.partition_D(s)(_, _, _, stage));
  } else {
    load_paged_block<kBlockN>(tma_box, shape, buffer, layout, barrier, stage, cache, batch, head_kv, n_block);
  }
}

}  // namespace flash3::fwd
