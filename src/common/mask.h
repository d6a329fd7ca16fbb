// The attention mask, one policy for both passes: which key columns a query
// row sees, and the block ranges that follow from it (which key blocks a
// forward tile visits, which query blocks a backward key block visits, and
// which of them need the mask applied element by element). Plain integer
// code, shared by the kernels and the CPU tests. The kernels' appliers
// (fwd/mask.h, bwd/mask.h) only map accumulator elements to (row, column)
// and apply the rule written here.
//
// Query row i sees key column j iff j < seqlen_k and, with the causal mask,
// j <= i + (seqlen_k - seqlen_q): the diagonal is aligned to the bottom-right
// corner, as FlashAttention 2/3 align it.
#pragma once

#include <algorithm>

#include "common/int_math.h"

namespace flash3 {

// The key blocks a range of query rows visits (the forward's walk).
struct BlockRange {
  int n_block_min;   // first key block visited
  int n_block_max;   // one past the last; empty when n_block_max <= n_block_min
  int n_block_mask;  // blocks >= n_block_mask need the mask (causal diagonal or seqlen_k end)

  FLASH3_HOST_DEVICE bool empty() const { return n_block_max <= n_block_min; }
};

// The query blocks a key block visits (the backward's walk).
struct QueryRange {
  int m_block_min;
  int m_block_max;   // one past the last
  int m_block_mask;  // blocks below it cross the causal diagonal

  FLASH3_HOST_DEVICE bool empty() const { return m_block_max <= m_block_min; }
};

struct MaskPolicy {
  int seqlen_q;
  int seqlen_k;
  bool causal;

  // Causal: row i sees column j iff j - i <= diagonal().
  FLASH3_HOST_DEVICE int diagonal() const { return seqlen_k - seqlen_q; }

  // The first key column that query row `row` may not see.
  FLASH3_HOST_DEVICE int col_limit(int row) const {
    int const diagonal_limit = row + 1 + diagonal();
    return causal && diagonal_limit < seqlen_k ? diagonal_limit : seqlen_k;
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
    if (causal) {
      int const offset = diagonal();
      int const first = first_row < 0 ? 0 : first_row;
      // The last row sees up to column last_row + offset.
      int const last_visible = (last_row < seqlen_q ? last_row : seqlen_q - 1) + offset;
      int const n_max = last_visible < 0 ? 0 : last_visible / block_n + 1;
      if (n_max < r.n_block_max) r.n_block_max = n_max;
      // Block n holds a column past the first row's limit iff (n+1)*block_n - 1 > first + offset.
      int const first_cut = div_floor(first + offset + 1, block_n);
      int const first_cut_clamped = first_cut < 0 ? 0 : first_cut;
      if (first_cut_clamped < r.n_block_mask) r.n_block_mask = first_cut_clamped;
    }
    return r;
  }

  // The query blocks that key block n_block visits: with the causal mask the
  // rows that see some key of the block, those from n_block * block_n -
  // diagonal() on, a suffix of the query blocks. m_blocks = div_up(seqlen_q,
  // block_m), passed in so that a kernel reads it from its parameters rather
  // than holding it in a register.
  FLASH3_HOST_DEVICE QueryRange query_blocks(int n_block, int block_m, int block_n, int m_blocks) const {
    QueryRange r{0, m_blocks, 0};
    if (causal) {
      int const offset = diagonal();
      r.m_block_min = std::max(0, div_floor(n_block * block_n - offset, block_m));
      // Row q sees the whole block iff q >= (n_block + 1) * block_n - 1 - offset.
      int const first_full_row = (n_block + 1) * block_n - 1 - offset;
      r.m_block_mask =
          std::max(r.m_block_min, std::min(r.m_block_max, div_floor(first_full_row + block_m - 1, block_m)));
    }
    return r;
  }

  // The last key block that query block m_block sees (-1: none).
  FLASH3_HOST_DEVICE int last_key_block(int m_block, int block_m, int block_n) const {
    int const n_blocks = div_up(seqlen_k, block_n);
    if (!causal) return n_blocks - 1;
    int const last_row = std::min((m_block + 1) * block_m, seqlen_q) - 1;
    int const last_key = last_row + diagonal();
    return last_key < 0 ? -1 : std::min(n_blocks - 1, last_key / block_n);
  }
};

}  // namespace flash3
