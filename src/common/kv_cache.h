// Where a batch entry's keys live in a KV cache (decoding): which batch entry
// of the cache holds them, the row of its first key, and how many keys it
// has. The fixed-length and packed forward address keys by the batch entry
// and cu_seqlens_k; a KV cache reads three optional device arrays instead,
// and a paged cache a page table. Plain integer code, shared by the kernels
// and the CPU tests.
#pragma once

#include <cstdint>

#include "common/host_device.h"

namespace flash3 {

struct KvCacheMap {
  const int32_t* seqlens = nullptr;    // cache_seqlens [batch]: keys leftpad[b] .. seqlens[b] - 1
  const int32_t* batch_idx = nullptr;  // cache_batch_idx [batch], or nullptr: entry b reads cache row b
  const int32_t* leftpad = nullptr;    // cache_leftpad [batch], or nullptr: keys start at row 0
  // A paged cache: key j of entry b is row j % page_size of page
  // page_table[b * page_table_stride + j / page_size]; nullptr: contiguous.
  const int32_t* page_table = nullptr;
  int64_t page_table_stride = 0;
  int page_size = 0;

  FLASH3_HOST_DEVICE bool paged() const { return page_table != nullptr; }
  FLASH3_HOST_DEVICE int kv_batch(int b) const { return batch_idx != nullptr ? batch_idx[b] : b; }
  FLASH3_HOST_DEVICE int first_key(int b) const { return leftpad != nullptr ? leftpad[b] : 0; }
  // A leftpad past the cache's length leaves no key (never a negative count,
  // which the block ranges would misread).
  FLASH3_HOST_DEVICE int keys(int b) const {
    int const n = seqlens[b] - first_key(b);
    return n > 0 ? n : 0;
  }

  // Where key `key` of entry b is stored (key counted from the entry's row 0,
  // leftpad included): the caches' batch entry, or page, and its row there.
  struct Row {
    int64_t entry;
    int row;
  };
  FLASH3_HOST_DEVICE Row row_of(int b, int key) const {
    if (paged()) return {page_table[b * page_table_stride + key / page_size], key % page_size};
    return {kv_batch(b), key};
  }
};

// Where a paged cache's key block of kBlockN keys from key `first` lies: in
// one page when pages are a multiple of kBlockN rows and the block holds
// keys only (not the entry's last block), then loaded whole; else in boxes
// (PagedBoxes). The producer reads it before it waits for the block's
// stage, so that the table's read overlaps the wait instead of delaying the
// load.
struct PagedBlock {
  bool whole;
  int page;  // the page holding the whole block
};
template <int kBlockN>
FLASH3_HOST_DEVICE PagedBlock paged_block(KvCacheMap const& m, int b, int first) {
  if (m.page_size % kBlockN != 0 || first + kBlockN > m.keys(b)) return {false, 0};
  return {true, m.page_table[int64_t(b) * m.page_table_stride + first / m.page_size]};
}

// A paged cache's key block is loaded as boxes of kRows keys, each from one
// page: page sizes are multiples of kRows and a paged entry's keys start at
// key 0 (no leftpad), so no box straddles two pages. The walk starts at the
// block's first key and steps a box at a time without dividing again.
// Boxes wholly past the entry's keys get page -1, which TMA reads as zeros
// (out of the pool), so the table is never read past the entry's pages.
struct PagedBoxes {
  static constexpr int kRows = 16;
  const int32_t* table;  // the entry's row of page_table
  int page_size;
  int keys;  // the entry's key count
  int key;   // the current box's first key
  int slot;  // its page's column of the table
  int row;   // its first row in that page

  FLASH3_HOST_DEVICE PagedBoxes(KvCacheMap const& m, int b, int first)
      : table(m.page_table + int64_t(b) * m.page_table_stride),
        page_size(m.page_size),
        keys(m.keys(b)),
        key(first),
        slot(first / m.page_size),
        row(first % m.page_size) {}

  FLASH3_HOST_DEVICE int page() const { return key < keys ? table[slot] : -1; }
  FLASH3_HOST_DEVICE void next() {
    key += kRows;
    row += kRows;
    if (row == page_size) {
      row = 0;
      ++slot;
    }
  }
};

}  // namespace flash3
