// Which query blocks a key block visits in the backward pass, and which of
// them need the causal mask. Plain integer code, shared by the kernel and the
// CPU tests.
#pragma once

#include <algorithm>

#include "common/int_math.h"

namespace flash3::bwd {

// The query blocks a key block visits, and the first that needs no causal mask.
struct QueryRange {
  int m_block_min;
  int m_block_max;   // one past the last
  int m_block_mask;  // blocks below it cross the causal diagonal

  FLASH3_HOST_DEVICE bool empty() const { return m_block_max <= m_block_min; }
};

// Query row q sees key k iff k <= q + seqlen_k - seqlen_q (bottom-right
// aligned). The rows that see some key of block n are those from
// n * block_n - offset on: a suffix of the query blocks. m_blocks =
// div_up(seqlen_q, block_m), passed in so that the kernel reads it from its
// parameters rather than holding it in a register.
FLASH3_HOST_DEVICE QueryRange query_range(int n_block, int block_m, int block_n, int seqlen_q, int seqlen_k,
                                          int m_blocks, bool causal) {
  QueryRange r{0, m_blocks, 0};
  if (causal) {
    int const offset = seqlen_k - seqlen_q;
    r.m_block_min = std::max(0, div_floor(n_block * block_n - offset, block_m));
    // Row q sees the whole block iff q >= (n_block + 1) * block_n - 1 - offset.
    int const first_full_row = (n_block + 1) * block_n - 1 - offset;
    r.m_block_mask =
        std::max(r.m_block_min, std::min(r.m_block_max, div_floor(first_full_row + block_m - 1, block_m)));
  }
  return r;
}

// The last key block that query block m_block sees (-1: none). Deterministic
// mode orders the key blocks adding to a query block's dQ from this one down:
// it is the first that a causal launch reaches, at its first query block.
FLASH3_HOST_DEVICE int last_key_block(int m_block, int block_m, int block_n, int seqlen_q, int seqlen_k,
                                      bool causal) {
  int const n_blocks = div_up(seqlen_k, block_n);
  if (!causal) return n_blocks - 1;
  int const last_row = std::min((m_block + 1) * block_m, seqlen_q) - 1;
  int const last_key = last_row + seqlen_k - seqlen_q;
  return last_key < 0 ? -1 : std::min(n_blocks - 1, last_key / block_n);
}

}  // namespace flash3::bwd
