// Packed GQA for decoding (the talk's "pack the query heads of a GQA group
// into one tile"): with one query a sequence, the heads_q / heads_kv query
// heads that share a KV head become the rows of one M tile, so each K and V
// block is loaded and multiplied once per KV head instead of once per query
// head. It is a view of the call, not a kernel: q [batch, 1, heads_kv *
// group, d] is [batch, group, heads_kv, d] with the sequence stride the head
// stride and the head stride group times it; O likewise; the LSE [batch,
// heads_q, 1] is [batch, heads_kv, group] as it lies; FP8 Q scales per KV
// head are the packed heads' own. Plain integer code,
// shared by the dispatch and the CPU tests.
#pragma once

#include "common/mask.h"
#include "flash3/flash3.h"

namespace flash3::fwd {

// A KV cache call with one query a sequence and several query heads a KV
// head. The causal mask and a right window are vacuous for a single
// bottom-right query (it sees every key), so the packed call drops them; a
// left window (a bound by the row's position), sinks (a logit by the row's
// head) and FP8 Q scales per query head (one descale a tile) would read the
// packed rows as positions and heads, so those calls stay unpacked.
inline bool packs_gqa(ForwardArgs const& a) {
  bool const scale_per_query_head = a.dtype == DType::kE4M3 && a.fp8.granularity != ScaleGranularity::kPerTensor &&
                                    !a.fp8.q_per_kv_head;
  return a.kv_cache.seqlens != nullptr && a.seqlen_q == 1 && a.heads_q > a.heads_kv && a.sinks == nullptr &&
         !scale_per_query_head && window_of(a.causal, a.window_left, a.window_right, a.seqlen_q, a.seqlen_k).left < 0;
}

// The call with each GQA group's query heads as its sequence (packs_gqa(a)).
inline ForwardArgs packed_gqa(ForwardArgs const& a) {
  int64_t const group = a.heads_q / a.heads_kv;
  ForwardArgs p = a;
  p.seqlen_q = group;
  p.heads_q = a.heads_kv;
  p.q.seq_stride = a.q.head_stride;
  p.q.head_stride = a.q.head_stride * group;
  p.o.seq_stride = a.o.head_stride;
  p.o.head_stride = a.o.head_stride * group;
  p.causal = false;
  p.window_left = p.window_right = -1;
  return p;
}

}  // namespace flash3::fwd
