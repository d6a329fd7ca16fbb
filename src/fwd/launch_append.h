// Host side of a KV cache append (KvAppend): its kernel is enqueued on the
// attention's stream right before it, so stream order makes the new rows
// visible to the attention (a plain launch: the attention kernels take no
// programmatic dependent launch). The call's workspace (fwd/kv_workspace.h)
// holds the entries' lengths after the append, which the attention reads as
// its kv_cache.seqlens, and with rotary tables Q's rotated copy, which it
// reads as its Q: the attention kernels are those of a call without an
// append.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "common/kv_cache.h"
#include "flash3/flash3.h"
#include "fwd/append_kv.h"
#include "fwd/kv_workspace.h"

namespace flash3::fwd {

// FlashAttention's rule: with a causal mask or a window, query row i is
// rotated at position seqlens[b] + i, else every row at seqlens[b]. A window
// side that spans the whole sequence is none, as FlashAttention-3 trims it.
inline bool rotary_position_per_row(ForwardArgs const& a) {
  bool const left = a.window_left >= 0 && a.window_left < a.seqlen_k - 1;
  bool const right = a.window_right >= 0 && a.window_right < a.seqlen_q - 1;
  return a.causal || left || right;
}

// Appends kv_cache.append's rows (if any), then calls attend with the
// arguments the attention runs on: `a`, or `a` reading the appended lengths
// and the rotated Q from the call's workspace (`block`, laid out by `layout`).
template <class Attend>
Status with_append(ForwardArgs const& a, char* block, KvWorkspaceLayout const& layout, cudaStream_t stream,
                   Attend&& attend) {
  KvAppend const& n = a.kv_cache.append;
  if (n.k.data == nullptr) return attend(a);
  bool const rotary = n.rotary_cos != nullptr;
  auto* const lengths = reinterpret_cast<int32_t*>(block + layout.lengths);
  void* const q_rotated = rotary ? block + layout.q_rotated : nullptr;
  ForwardArgs attended = a;
  attended.kv_cache.seqlens = lengths;
  attended.kv_cache.append = {};
  if (rotary) attended.q = contiguous<const void*>(q_rotated, a.seqlen_q, a.heads_q, a.head_dim);
  AppendKvArgs args{};
  args.dtype = a.dtype;
  args.batch = int(a.batch);
  args.seqlen_new = int(n.seqlen_new);
  args.heads_kv = int(a.heads_kv);
  args.head_dim = int(a.head_dim);
  args.head_dim_v = int(a.head_dim_v != 0 ? a.head_dim_v : a.head_dim);
  args.k_new = n.k;
  args.v_new = n.v;
  // The caches are ForwardArgs' K and V, const for the attention, which only
  // reads them; the append is documented to write their new rows.
  args.k_cache = {const_cast<void*>(a.k.data), a.k.batch_stride, a.k.seq_stride, a.k.head_stride, a.k.dim_stride};
  args.v_cache = {const_cast<void*>(a.v.data), a.v.batch_stride, a.v.seq_stride, a.v.head_stride, a.v.dim_stride};
  args.cache = KvCacheMap{a.kv_cache.seqlens,    a.kv_cache.batch_idx,         a.kv_cache.leftpad,
                          a.kv_cache.page_table, a.kv_cache.page_table_stride, int(a.kv_cache.page_size)};
  args.seqlens_after = lengths;
  args.cos = n.rotary_cos;
  args.sin = n.rotary_sin;
  args.rotary_dim = int(n.rotary_dim);
  args.interleaved = n.rotary_interleaved;
  args.q = a.q;
  args.q_rotated = q_rotated;
  args.seqlen_q = int(a.seqlen_q);
  args.heads_q = int(a.heads_q);
  args.q_position_per_row = rotary_position_per_row(a);
  if (cudaError_t const err = append_kv(args, stream); err != cudaSuccess) {
    return Status(Status::Code::kCudaError, std::string("kv_cache.append launch: ") + cudaGetErrorString(err));
  }
  return attend(attended);
}

}  // namespace flash3::fwd
