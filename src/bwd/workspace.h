// The backward pass's workspace: what it holds and where. Plain host code
// (the size query runs without a device), shared by the API and the kernels.
#pragma once

#include <cstddef>
#include <cstdint>

namespace flash3::bwd {

// Query rows per step of the backward mainloop.
constexpr int bwd_block_m(int64_t head_dim) { return head_dim <= 64 ? 128 : 64; }

struct WorkspaceLayout {
  // Byte offsets from the workspace's start, each 256-byte aligned.
  size_t dq_accum = 0;   // float [batch, heads_q, m_blocks, block_m * head_dim], tiles in register order
  size_t lse_log2 = 0;   // float [batch, heads_q, m_blocks * block_m]: LSE * log2(e), +inf past seqlen_q
  size_t dpsum = 0;      // float, same shape: D = rowsum(dO * O), 0 past seqlen_q
  size_t semaphore = 0;  // int [batch, heads_q, m_blocks]: deterministic mode's dQ turn counters
  size_t dk_accum = 0;   // float [batch, heads_q, seqlen_k, head_dim], GQA/MQA only: dK per query head
  size_t dv_accum = 0;   // float, same shape: dV per query head
  size_t bytes = 0;      // total
  int64_t m_blocks = 0;
};

inline WorkspaceLayout workspace_layout(int64_t batch, int64_t seqlen_q, int64_t seqlen_k, int64_t heads_q,
                                        int64_t heads_kv, int64_t head_dim, bool deterministic) {
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
  w.semaphore = take(deterministic ? size_t(batch * heads_q * w.m_blocks) * sizeof(int) : 0);
  bool const grouped = heads_q != heads_kv;
  size_t const kv_accum = grouped ? size_t(batch * heads_q * seqlen_k * head_dim) * sizeof(float) : 0;
  w.dk_accum = take(kv_accum);
  w.dv_accum = take(kv_accum);
  w.bytes = offset;
  return w;
}

}  // namespace flash3::bwd
