// The attention mask, one policy for both passes: which key columns a query
// row sees, and the block ranges that follow from it (which key blocks a
// forward tile visits, which query blocks a backward key block visits, and
// which of them need the mask applied element by element). Plain integer
// code, shared by the kernels and the CPU tests. The kernels' appliers
// (fwd/mask.h, bwd/mask.h) only map accumulator elements to (row, column)
// and apply the rule written here.
//
// Query row i sees key column j iff j < seqlen_k and j lies in the row's
// window: i + g - window_left <= j <= i + g + window_right, g = seqlen_k -
// seqlen_q, each bound absent at -1 (FlashAttention's window_size); the
// causal mask is window_right 0. The diagonal is aligned to the bottom-right
// corner, as FlashAttention 2/3 align it.
#pragma once

#include <algorithm>
#include <cstdint>

#include "common/int_math.h"

namespace flash3 {

// A call's window as the kernels hold it (int), from the API's (int64_t,
// -1 unbounded; causal: right 0). A bound no (row, key) pair of these
// sequences reaches is dropped (-1): rows see keys up to seqlen_q - 1 right
// of their diagonal and seqlen_k - 1 left of it.
struct Window {
  int left = -1;
  int right = -1;

  FLASH3_HOST_DEVICE bool any() const { return left >= 0 || right >= 0; }
};

inline Window window_of(bool causal, int64_t left, int64_t right, int64_t seqlen_q, int64_t seqlen_k) {
  Window w;
  w.left = left >= 0 && left < seqlen_k ? int(left) : -1;
  w.right = causal ? 0 : right >= 0 && right < seqlen_q ? int(right) : -1;
  return w;
}

// The key blocks a range of query rows visits (the forward's walk).
struct BlockRange {
  int n_block_min;   // first key block visited
  int n_block_max;   // one past the last; empty when n_block_max <= n_block_min
  int n_block_mask;  // blocks >= n_block_mask need the mask (the right edge: causal diagonal or seqlen_k)

  FLASH3_HOST_DEVICE bool empty() const { return n_block_max <= n_block_min; }
};

// The query blocks a key block visits (the backward's walk).
struct QueryRange {
  int m_block_min;
  int m_block_max;   // one past the last
  int m_block_mask;  // blocks below it cross the right edge (causal diagonal)

  FLASH3_HOST_DEVICE bool empty() const { return m_block_max <= m_block_min; }
};

struct MaskPolicy {
  int seqlen_q;
  int seqlen_k;
  bool causal;
  int window_left = -1;   // -1: unbounded
  int window_right = -1;  // -1: unbounded; causal makes it 0

  FLASH3_HOST_DEVICE int diagonal() const { return seqlen_k - seqlen_q; }
  FLASH3_HOST_DEVICE bool bounded_right() const { return causal || window_right >= 0; }
  FLASH3_HOST_DEVICE bool bounded_left() const { return window_left >= 0; }
  // Row i sees columns up to i + right_offset() (with bounded_right()) and
  // from i - left_offset() (with bounded_left()).
  FLASH3_HOST_DEVICE int right_offset() const { return diagonal() + (causal ? 0 : window_right); }
  FLASH3_HOST_DEVICE int left_offset() const { return window_left - diagonal(); }

  // The first key column that query row `row` may not see.
  FLASH3_HOST_DEVICE int col_limit(int row) const {
    int const edge = row + 1 + right_offset();
    return bounded_right() && edge < seqlen_k ? edge : seqlen_k;
  }

  // The first key column that query row `row` may see (0 without a left
  // bound; at or past col_limit when it sees none).
  FLASH3_HOST_DEVICE int col_start(int row) const {
    int const edge = row - left_offset();
    return bounded_left() && edge > 0 ? edge : 0;
  }

  // The key blocks that query rows first_row .. last_row visit. The rows may
  // reach outside the sequence (a forward tile above or past it); those see
  // nothing. Only the last block can hold columns past seqlen_k.
  FLASH3_HOST_DEVICE BlockRange key_blocks(int first_row, int last_row, int block_n) const {
    BlockRange r;
    int const num_n_blocks = div_up(seqlen_k, block_n);
    r.n_block_min = 0;
    r.n_block_max = num_n_blocks;
    r.n_block_mask = (seqlen_k % block_n == 0) ? num_n_blocks : num_n_blocks - 1;
    int const first = first_row < 0 ? 0 : first_row;
    int const last = last_row < seqlen_q ? last_row : seqlen_q - 1;
    if (bounded_right()) {
      int const offset = right_offset();
      // The last row sees up to column last + offset.
      int const last_visible = last + offset;
      int const n_max = last_visible < 0 ? 0 : last_visible / block_n + 1;
      if (n_max < r.n_block_max) r.n_block_max = n_max;
      // Block n holds a column past the first row's limit iff (n+1)*block_n - 1 > first + offset.
      int const first_cut = div_floor(first + offset + 1, block_n);
      int const first_cut_clamped = first_cut < 0 ? 0 : first_cut;
      if (first_cut_clamped < r.n_block_mask) r.n_block_mask = first_cut_clamped;
    }
    // The first row sees from col_start(first) on.
    if (bounded_left()) r.n_block_min = last < first ? r.n_block_max : col_start(first) / block_n;
    return r;
  }

  // With a left bound, the key blocks below this one hold a column before
  // the start of some row of first_row .. last_row: they need the mask too.
  // (Apart from key_blocks' range, so that kernels without a left bound
  // carry nothing more.)
  FLASH3_HOST_DEVICE int key_blocks_masked_below(int last_row, int block_n) const {
    int const last = last_row < seqlen_q ? last_row : seqlen_q - 1;
    return bounded_left() ? div_up(col_start(last), block_n) : 0;
  }

  // The query blocks that key block n_block visits: the rows that see some
  // key of the block, from n_block * block_n - right_offset() with a right
  // bound, up to the block's last key + left_offset() with a left one.
  // m_blocks = div_up(seqlen_q, block_m), passed in so that a kernel reads it
  // from its parameters rather than holding it in a register.
  FLASH3_HOST_DEVICE QueryRange query_blocks(int n_block, int block_m, int block_n, int m_blocks) const {
    QueryRange r{0, m_blocks, 0};
    if (bounded_right()) {
      int const offset = right_offset();
      r.m_block_min = std::max(0, div_floor(n_block * block_n - offset, block_m));
      // Row q sees the whole block iff q >= (n_block + 1) * block_n - 1 - offset.
      int const first_full_row = (n_block + 1) * block_n - 1 - offset;
      r.m_block_mask =
          std::max(r.m_block_min, std::min(r.m_block_max, div_floor(first_full_row + block_m - 1, block_m)));
    }
    if (bounded_left()) {
      int const last_key = std::min((n_block + 1) * block_n, seqlen_k) - 1;
      // Row q sees the block's last key iff q <= last_key + left_offset().
      int const last_row = last_key + left_offset();
      r.m_block_max = last_row < 0 ? 0 : std::min(m_blocks, last_row / block_m + 1);
      r.m_block_mask = std::min(r.m_block_mask, r.m_block_max);
    }
    return r;
  }

  // With a left bound, the query blocks from this one on (up to
  // query_blocks' m_block_max) hold a row that misses key block n_block's
  // first key: they need the mask too. At least the range's m_block_mask.
  FLASH3_HOST_DEVICE int query_blocks_masked_from(QueryRange const& r, int n_block, int block_m, int block_n) const {
    if (!bounded_left()) return r.m_block_max;
    // Row q misses the block's first key iff q > n_block * block_n + left_offset().
    int const first_cut = div_floor(n_block * block_n + left_offset() + 1, block_m);
    return std::max(r.m_block_mask, std::min(r.m_block_max, first_cut));
  }

  // The last key block that query block m_block sees (-1: none).
  FLASH3_HOST_DEVICE int last_key_block(int m_block, int block_m, int block_n) const {
    int const n_blocks = div_up(seqlen_k, block_n);
    if (!bounded_right()) return n_blocks - 1;
    int const last_row = std::min((m_block + 1) * block_m, seqlen_q) - 1;
    int const last_key = last_row + right_offset();
    return last_key < 0 ? -1 : std::min(n_blocks - 1, last_key / block_n);
  }

  // The first key block that query block m_block sees (0 without a left
  // bound; past last_key_block when it sees none).
  FLASH3_HOST_DEVICE int first_key_block(int m_block, int block_m, int block_n) const {
    return col_start(m_block * block_m) / block_n;
  }
};

}  // namespace flash3
