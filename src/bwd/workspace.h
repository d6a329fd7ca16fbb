// The backward pass's workspace: what it holds and where. Plain host code
// (the size query runs without a device), shared by the API and the kernels.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/head_dims.h"
#include "common/host_device.h"
#include "flash3/flash3.h"

namespace flash3::bwd {

// Query rows per step of the backward mainloop, and keys per CTA (80 at
// d = 256: the dQ sums' bytes per FLOP go as 1 / keys, bwd/traits.h).
constexpr int bwd_block_m(int64_t head_dim) { return head_dim <= 64 ? 128 : 64; }
constexpr int bwd_block_n(int64_t head_dim) { return head_dim > 192 ? 80 : head_dim > 128 ? 64 : 128; }

// The most tiles whose last wave is split (bwd/tail_split.h): fewer than
// the CTAs of one wave on any sm_90 part. Each has fp32 sums of dK (head_dim
// columns) and dV (head_dim_v).
constexpr int kMaxSplitTiles = 132;
constexpr size_t split_tile_bytes(int64_t head_dim, int64_t head_dim_v) {
  return size_t(bwd_block_n(head_dim) * (head_dim + head_dim_v)) * sizeof(float);
}

// The preprocess's work items: this many rows of one head (bwd/preprocess.h),
// whole query blocks, so that a block waits for one item.
constexpr int kPreprocessItemRows = 512;
static_assert(kPreprocessItemRows % bwd_block_m(64) == 0 && kPreprocessItemRows % bwd_block_m(256) == 0);
FLASH3_HOST_DEVICE int64_t preprocess_items_per_head(int64_t padded_rows) {
  return (padded_rows + kPreprocessItemRows - 1) / kPreprocessItemRows;
}

struct WorkspaceLayout {
  // Byte offsets from the workspace's start, each 256-byte aligned.
  size_t dq_accum = 0;   // float [batch, heads_q, m_blocks, block_m * head_dim], tiles in register order
  size_t lse_log2 = 0;   // float [batch, heads_q, m_blocks * block_m]: LSE * log2(e), +inf past seqlen_q
  size_t dpsum = 0;      // float, same shape: D = rowsum(dO * O), 0 past seqlen_q
  size_t dk_accum = 0;   // float [batch, heads_q, seqlen_k, head_dim], GQA/MQA only: dK per query head
  size_t dv_accum = 0;   // float [batch, heads_q, seqlen_k, head_dim_v]: dV per query head
  // From here on cleared before the preprocess (the split sums' used part):
  // the preprocess's ready counters (ready_counter()); int [batch, heads_q, m_blocks]:
  // how many key blocks have added to each dQ tile (deterministic mode's
  // turns; the postprocess converts a tile once all have); one int counting
  // the postprocess's finished CTAs.
  size_t ready = 0;
  size_t dq_arrivals = 0;
  size_t post_done = 0;
  // Without the causal mask or deterministic mode, the split tiles of the
  // last wave (bwd/tail_split.h): int [split_tiles] arrival counters, then
  // float [split_tiles, block_n * (head_dim (dK) + head_dim_v (dV))] sums in
  // the accumulators' register order.
  size_t split_arrivals = 0;
  size_t split_sums = 0;
  int split_tiles = 0;   // capacity
  size_t bytes = 0;      // total
  int64_t m_blocks = 0;
};

// Packed sequences (varlen) lay out the per-row workspace (dQ accumulator,
// LSE, D, dQ tile counters) as one batch entry per head, each sequence's
// rows from a block boundary of their own so that a block holds one
// sequence: sequence b from block cu_seqlens_q[b] / block_m + b, which lies
// past the blocks of sequence b - 1; the host, which never reads
// cu_seqlens, bounds the blocks of all by total_q / block_m + batch.
FLASH3_HOST_DEVICE int64_t packed_first_block(int64_t cu_seqlen_q, int64_t b, int64_t block_m) {
  return cu_seqlen_q / block_m + b;
}
FLASH3_HOST_DEVICE int64_t packed_row_blocks(int64_t total_q, int64_t batch, int64_t block_m) {
  return packed_first_block(total_q, batch, block_m);
}

inline WorkspaceLayout workspace_layout(int64_t batch, int64_t seqlen_q, int64_t seqlen_k, int64_t heads_q,
                                        int64_t heads_kv, int64_t head_dim, int64_t head_dim_v, bool causal,
                                        bool deterministic, bool packed = false) {
  WorkspaceLayout w;
  int64_t const block_m = bwd_block_m(head_dim);
  w.m_blocks = (seqlen_q + block_m - 1) / block_m;
  int64_t const rows = batch * heads_q * w.m_blocks * block_m;
  size_t offset = 0;
  auto take = [&](size_t bytes) {
    size_t const at = offset;
    offset += (bytes + 255) / 256 * 256;
    return at;
  };
  w.dq_accum = take(size_t(rows * head_dim) * sizeof(float));
  w.lse_log2 = take(size_t(rows) * sizeof(float));
  w.dpsum = take(size_t(rows) * sizeof(float));
  bool const grouped = heads_q != heads_kv;
  size_t const per_column = grouped ? size_t(batch * heads_q * seqlen_k) * sizeof(float) : 0;
  w.dk_accum = take(per_column * head_dim);
  w.dv_accum = take(per_column * head_dim_v);
  int64_t const ready_per_head = packed ? preprocess_items_per_head(w.m_blocks * block_m) : 1;
  w.ready = take(size_t(batch * heads_q * ready_per_head) * sizeof(int));
  w.dq_arrivals = take(size_t(batch * heads_q * w.m_blocks) * sizeof(int));
  w.post_done = take(sizeof(int));
  if (!causal && !deterministic) {
    int64_t const tiles = (seqlen_k + bwd_block_n(head_dim) - 1) / bwd_block_n(head_dim) * heads_q * batch;
    w.split_tiles = int(tiles < kMaxSplitTiles ? tiles : kMaxSplitTiles);
  }
  w.split_arrivals = take(size_t(w.split_tiles) * sizeof(int));
  w.split_sums = take(size_t(w.split_tiles) * split_tile_bytes(head_dim, head_dim_v));
  w.bytes = offset;
  return w;
}

// Packed sequences: one batch entry of packed_row_blocks() blocks a head
// and of total_k keys; no split last wave (their kernel is the masked one,
// bwd/dispatch.h).
inline WorkspaceLayout packed_workspace_layout(int64_t batch, int64_t total_q, int64_t total_k, int64_t heads_q,
                                               int64_t heads_kv, int64_t head_dim, int64_t head_dim_v,
                                               bool deterministic) {
  int64_t const block_m = bwd_block_m(head_dim);
  return workspace_layout(1, packed_row_blocks(total_q, batch, block_m) * block_m, total_k, heads_q, heads_kv,
                          head_dim, head_dim_v, /*causal=*/true, deterministic, /*packed=*/true);
}

// The preprocess's counter that covers a head's padded row `row`, and the
// count that says its rows are done. Fixed-length batches: one per head,
// counting the head's items (its CTAs wait for them all). Packed sequences:
// one per item, since a head's rows hold every sequence and a CTA needs its
// own sequence's only (the preprocess does them in the packed order).
struct ReadyCounter {
  int64_t index;
  int count;
};
FLASH3_HOST_DEVICE ReadyCounter ready_counter(bool packed, int64_t batch_head, int64_t row, int64_t items_per_head) {
  if (packed) return {batch_head * items_per_head + row / kPreprocessItemRows, 1};
  return {batch_head, int(items_per_head)};
}

// The layout of a call's workspace (the API's size query and the launch).
inline WorkspaceLayout workspace_layout_of(BackwardArgs const& a) {
  int64_t const head_dim_v = head_dim_v_of(a);
  if (a.varlen.cu_seqlens_q != nullptr) {
    return packed_workspace_layout(a.batch, a.varlen.total_q, a.varlen.total_k, a.heads_q, a.heads_kv, a.head_dim,
                                   head_dim_v, a.deterministic);
  }
  return workspace_layout(a.batch, a.seqlen_q, a.seqlen_k, a.heads_q, a.heads_kv, a.head_dim, head_dim_v, a.causal,
                          a.deterministic);
}

}  // namespace flash3::bwd
