// Where a batch entry's keys live in a KV cache (decoding): which batch entry
// of the cache holds them, the row of its first key, and how many keys it
// has. The fixed-length and packed forward address keys by the batch entry
// and cu_seqlens_k; a KV cache reads three optional device arrays instead.
// Plain integer code, shared by the kernels and the CPU tests.
#pragma once

#include <cstdint>

#include "common/host_device.h"

namespace flash3 {

struct KvCacheMap {
  const int32_t* seqlens = nullptr;    // cache_seqlens [batch]: keys leftpad[b] .. seqlens[b] - 1
  const int32_t* batch_idx = nullptr;  // cache_batch_idx [batch], or nullptr: entry b reads cache row b
  const int32_t* leftpad = nullptr;    // cache_leftpad [batch], or nullptr: keys start at row 0

  FLASH3_HOST_DEVICE int kv_batch(int b) const { return batch_idx != nullptr ? batch_idx[b] : b; }
  FLASH3_HOST_DEVICE int first_key(int b) const { return leftpad != nullptr ? leftpad[b] : 0; }
  // A leftpad past the cache's length leaves no key (never a negative count,
  // which the block ranges would misread).
  FLASH3_HOST_DEVICE int keys(int b) const {
    int const n = seqlens[b] - first_key(b);
    return n > 0 ? n : 0;
  }
};

}  // namespace flash3
