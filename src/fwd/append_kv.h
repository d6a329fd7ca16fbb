// Appending to a KV cache (flash3.h's KvAppend): one kernel writes the new
// keys and values into their cache rows, rotating the keys' and Q's first
// rotary_dim dims when the call has rotary tables (Q into a copy the
// attention then reads), and each entry's length after the append, which the
// attention reads as its seqlens (the caller's stay as they were). No CuTe
// here: the launch code calls it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/kv_cache.h"
#include "flash3/flash3.h"

namespace flash3::fwd {

struct AppendKvArgs {
  DType dtype;  // every tensor's and the tables': kBF16, kFP16, or kE4M3 (no tables)
  int batch;
  int seqlen_new;
  int heads_kv;
  int head_dim;    // K's and Q's, a multiple of 8
  int head_dim_v;  // a multiple of 8
  ConstTensor k_new;  // [batch, seqlen_new, heads_kv, head_dim]
  ConstTensor v_new;  // [batch, seqlen_new, heads_kv, head_dim_v]
  // The caches, [entries or pages, rows, heads_kv, ...]: key seqlens[b] + j
  // of entry b goes to cache.row_of(b, seqlens[b] + j).
  MutableTensor k_cache;
  MutableTensor v_cache;
  KvCacheMap cache;
  int32_t* seqlens_after;  // [batch]: seqlens[b] + seqlen_new
  // Rotary tables [rotary_seqlen, rotary_dim / 2] (nullptr: no rotation, and
  // Q is left alone), rotary_dim a multiple of 16.
  void const* cos;
  void const* sin;
  int rotary_dim;
  bool interleaved;
  // With the tables: Q [batch, seqlen_q, heads_q, head_dim] rotated into
  // q_rotated (contiguous), row i at position seqlens[b] + i, or every row at
  // seqlens[b] without q_position_per_row.
  ConstTensor q;
  void* q_rotated;
  int seqlen_q;
  int heads_q;
  bool q_position_per_row;
};

// Enqueues the append on `stream`; the attention launched after it on the
// same stream sees the new rows.
cudaError_t append_kv(AppendKvArgs const& args, cudaStream_t stream);

}  // namespace flash3::fwd
