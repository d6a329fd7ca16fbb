// The split-KV epilogue: a split's O (normalised by its own l) and LSE, in
// float32, to the partials the combine kernel (fwd/combine.h) reduces. The
// Epilogue interface of fwd/epilogue.h; the partials leave from registers
// (two adjacent columns a store), since a float32 O tile does not fit in
// shared memory beside the K/V stages, and decoding writes few rows.
// Layout (float32): O [num_splits, batch, heads, seqlen_q, head_dim_v], the
// LSE [num_splits, batch, heads, seqlen_q], natural log. A row that sees no
// key of its split gets LSE -inf (no weight in the combine) and O 0.
#pragma once

#include <cmath>

#include <cute/tensor.hpp>

#include "common/layout.h"
#include "common/tile_order.h"
#include "fwd/block_range.h"
#include "fwd/traits.h"

namespace flash3::fwd {

template <class Traits_>
struct SplitEpilogue {
  using Traits = Traits_;
  using SharedStorage = typename Traits::SharedStorage;
  using TileShapePV = typename Traits::TileShapePV;
  static constexpr int kBlockM = Traits::kBlockM;
  static constexpr int kHeadDimV = Traits::kHeadDimV;
  static_assert(!Traits::kPartialTileFirst, "a split's tiles start at the sequence's first row");

  struct Params {
    float* o_partial;
    float* lse_partial;
    int seqlen_q;
    int num_heads;
    int batch;
  };

  static Params make_params(float* o_partial, float* lse_partial, int seqlen_q, int num_heads, int batch) {
    return {o_partial, lse_partial, seqlen_q, num_heads, batch};
  }

  // Sinks join the softmax once, in the combine: none in a split.
  CUTE_DEVICE static float sink_log2(Params const&, int) { return -INFINITY; }
  CUTE_DEVICE static void prefetch_descriptors(Params const&) {}
  CUTE_DEVICE static void store_tail() {}

  // O stays float32.
  template <class FragO>
  CUTE_DEVICE static FragO convert(FragO const& tOrO) {
    return tOrO;
  }

  template <class FragO, int kRows>
  CUTE_DEVICE static void store(Params const& p, SharedStorage&, FragO const& rO, float const (&lse)[kRows],
                                TileCoord tile) {
    int const thread_idx = Traits::consumer_thread_idx();
    Tensor coords = typename Traits::TiledMmaPV{}.get_thread_slice(thread_idx).partition_C(
        make_identity_tensor(select<0, 1>(TileShapePV{})));
    Tensor rc = make_tensor(coords.data(), accumulator_rowcol(coords.layout()));
    Tensor o = make_tensor(rO.data(), accumulator_rowcol(rO.layout()));
    static_assert(decltype(size<0>(o))::value == kRows);
    // Row `row` of (split, batch, head): rows of one (batch, head) are
    // contiguous, splits outermost.
    int64_t const first = ((int64_t(tile.split) * p.batch + tile.batch) * p.num_heads + tile.head) * p.seqlen_q;
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) {
      int const row = tile.m_block * kBlockM + get<0>(rc(r, 0));
      if (row >= p.seqlen_q) continue;
      float* o_row = p.o_partial + (first + row) * kHeadDimV;
      // A thread's columns come in pairs of adjacent ones (the accumulator's
      // innermost mode of 2).
      CUTE_UNROLL
      for (int c = 0; c < size<1>(o); c += 2) {
        *reinterpret_cast<float2*>(o_row + get<1>(rc(r, c))) = make_float2(o(r, c), o(r, c + 1));
      }
      // The four threads of a quad hold the same rows; the first writes.
      // finalize() gives a row that saw no key +inf (the forward's
      // convention); here it must weigh nothing.
      if (thread_idx % 4 == 0) p.lse_partial[first + row] = lse[r] == INFINITY ? -INFINITY : lse[r];
    }
  }
};

}  // namespace flash3::fwd
