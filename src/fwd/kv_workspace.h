// A KV cache call's plan: its tiles, its number of splits and its scratch as
// one block (KvCache::workspace). The block holds, each part at a multiple of
// 128 bytes: the entries' lengths after an append (int32 [batch]) and Q's
// rotated copy (rotary tables rotate it; reserved with every append, so that
// a plan need not know of the tables), then split-KV's float32 partial O
// [splits x rows, head_dim_v] and LSE [splits x rows], rows = batch x
// heads_q x seqlen_q (the same with GQA packed). Plain integer code, shared
// by the dispatch, the API and the CPU tests.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/head_dims.h"
#include "common/int_math.h"
#include "flash3/flash3.h"
#include "fwd/kv_split.h"
#include "fwd/pack_gqa.h"
#include "fwd/packed_rows.h"
#include "fwd/tile_size.h"

namespace flash3::fwd {

// The KV cache kernels' tiles (their traits' kTile), MLA's at its head dims
// (which only a call with qv has; a plan may leave qv unset).
inline TileSize kv_cache_tile(ForwardArgs const& a) {
  if (mla_head_dims(a.head_dim, head_dim_v_of(a))) return kMlaTile;
  return tile_size(int(a.head_dim), int(head_dim_v_of(a)), a.dtype == DType::kE4M3, true);
}

// kv_cache.num_splits, or with 0 choose_num_splits' choice for the call's
// tiles (GQA packed when packs_gqa) and the cache's key blocks (its rows:
// cache_seqlens is device memory, not read here).
inline int num_splits_of(ForwardArgs const& a, int num_sms) {
  if (a.kv_cache.num_splits != 0) return int(a.kv_cache.num_splits);
  TileSize const tile = kv_cache_tile(a);
  // MLA's kernel packs each KV head's (position, head) rows into its tiles.
  bool const mla = mla_head_dims(a.head_dim, head_dim_v_of(a));
  ForwardArgs const t = packs_gqa(a) && !mla ? packed_gqa(a) : a;
  int64_t const tiles =
      mla ? t.batch * t.heads_kv * div_up(PackedRows{int(t.heads_q / t.heads_kv), int(t.seqlen_q)}.rows(), tile.block_m)
          : t.batch * t.heads_q * div_up(int(t.seqlen_q), tile.block_m);
  return choose_num_splits(tiles, div_up(int(t.seqlen_k), tile.block_n), num_sms);
}

struct KvWorkspaceLayout {
  size_t lengths = 0;      // offsets in bytes from the block's start
  size_t q_rotated = 0;
  size_t partial_o = 0;
  size_t partial_lse = 0;
  size_t bytes = 0;        // the whole block; 0: the call needs none
};

inline KvWorkspaceLayout kv_workspace_layout(ForwardArgs const& a, int num_splits) {
  auto const aligned = [](size_t n) { return (n + 127) / 128 * 128; };
  KvWorkspaceLayout w;
  size_t end = 0;
  if (a.kv_cache.append.seqlen_new > 0) {
    w.lengths = end;
    end = aligned(w.lengths + size_t(a.batch) * sizeof(int32_t));
    w.q_rotated = end;
    end = aligned(w.q_rotated + size_t(a.batch * a.seqlen_q * a.heads_q * a.head_dim) * 2);  // the widest dtype's
  }
  if (num_splits > 1) {
    size_t const rows = size_t(num_splits) * size_t(a.batch * a.heads_q * a.seqlen_q);
    w.partial_o = end;
    end = aligned(w.partial_o + rows * size_t(head_dim_v_of(a)) * sizeof(float));
    w.partial_lse = end;
    end = aligned(w.partial_lse + rows * sizeof(float));
  }
  w.bytes = end;
  return w;
}

}  // namespace flash3::fwd
