// Backward postprocess: the fp32 dQ accumulator to dQ in the input dtype
// (times the softmax scale), and for GQA/MQA the per-query-head dK, dV summed
// over each K/V head's group.
#pragma once

#include <cuda/atomic>
#include <cute/tensor.hpp>

#include "bwd/counters.h"
#include "bwd/sequence.h"
#include "common/mask.h"
#include "bwd/traits.h"
#include "common/dependent_launch.h"

namespace flash3::bwd {

template <class Element>
struct PostprocessParams {
  float const* dq_accum;  // tiles in the dQ accumulators' register order
  int* dq_arrivals;       // per tile: the key blocks that have added to it (WorkspaceLayout)
  int* ready;             // the preprocess's ready counters (bwd/workspace.h's ready_counter)
  int ready_items;
  int* done;              // this grid's finished CTAs
  bool deterministic;
  Element* dq;
  int64_t dq_strides[3];  // batch, seq, head
  int seqlen_q;
  int seqlen_k;
  int window_left;  // the call's Window (the masked kernel's only)
  int window_right;
  int num_heads;
  int m_blocks;
  float softmax_scale;
  // Packed sequences: the grid is the longest sequence's query blocks; a
  // sequence's tiles lie from its first workspace block (bwd/workspace.h),
  // m_blocks being the workspace's blocks a head.
  SequenceLengths lengths;
};

// One CTA per (m_block, head, batch), a thread per dQ GEMM thread: each reads
// back the values that thread accumulated (float4s, coalesced) and knows their
// (row, column) from the same MMA partition. The tile turns row-major in
// shared memory, so that dQ leaves in 16-byte stores, whole rows at a time.
//
// The grid starts once every CTA of the main kernel has started. Where the key
// blocks count themselves in (BwdTraits::counts_arrivals), each CTA waits only
// until the preprocess has cleared its tile and the tile's key blocks have
// all added to it (the counters are cleared before the preprocess,
// bwd/launch.h): the conversion runs on the SMs the main kernel's last wave
// frees, under that wave, and the last CTA to finish waits for the main
// kernel to complete, so that this grid's completion (on which the next
// kernel on the stream waits) implies the main kernel's. Otherwise each CTA
// waits for the main kernel to complete.
template <class Traits>
__global__ void __launch_bounds__(Traits::kNumConsumerThreads)
    postprocess_dq_kernel(PostprocessParams<typename Traits::Element> const p) {
  using Element = typename Traits::Element;
  constexpr int kM = Traits::kBlockM, kD = Traits::kHeadDim, kThreads = Traits::kNumConsumerThreads;
  constexpr int kVec = 16 / sizeof(Element);
  // Rows 16 bytes apart from a multiple of 128: the 8 rows of one fragment
  // store fall in different banks.
  constexpr int kLd = kD + kVec;
  __shared__ alignas(16) Element tile[kM * kLd];
  let_dependents_start();
  int const m_block = blockIdx.x, head = blockIdx.y, batch = blockIdx.z;
  int const tid = threadIdx.x;
  bool const counted = Traits::counts_arrivals(p.deterministic);
  // Packed sequences: a CTA past its sequence's packed rows converts
  // nothing (it still counts itself done); rows past those that take part
  // are zeros in the accumulator (cleared, no key block adds to them).
  int seq_q = p.seqlen_q, seq_k = p.seqlen_k, rows = 0;
  int64_t t = 0, first_q = 0;
  if constexpr (Traits::kPacked) {
    seq_q = p.lengths.q(batch);
    seq_k = p.lengths.k(batch);
    rows = min(kM, packed_len_q(p.lengths, batch) - m_block * kM);
    first_q = p.lengths.cu_seqlens_q[batch];
    t = int64_t(head) * p.m_blocks + packed_first_block(first_q, batch, kM) + m_block;
  } else {
    rows = min(kM, p.seqlen_q - m_block * kM);
    t = (int64_t(batch) * p.num_heads + head) * p.m_blocks + m_block;
  }
  bool const inside = !Traits::kPacked || rows > 0;
  if (!counted) {
    wait_for_earlier_grid();  // the main kernel's dQ sums
  } else if (tid == 0 && inside) {
    MaskPolicy const mask = Traits::kCausal ? MaskPolicy{seq_q, seq_k, false, p.window_left, p.window_right}
                                            : MaskPolicy{seq_q, seq_k, false};
    // The key blocks that add to this tile: first_key_block .. last_key_block
    // (none to a packed sequence's block past its rows that take part).
    int const key_blocks =
        Traits::kPacked && m_block * kM >= seq_q
            ? 0
            : mask.last_key_block(m_block, kM, Traits::kBlockN) - mask.first_key_block(m_block, kM, Traits::kBlockN) + 1;
    ReadyCounter const ready = ready_counter(Traits::kPacked, t / p.m_blocks, t % p.m_blocks * kM, p.ready_items);
    wait_at_least<256>(p.ready + ready.index, ready.count);
    wait_at_least<256>(p.dq_arrivals + t, key_blocks);
  }
  __syncthreads();
  if (inside) {
    Tensor coords = typename Traits::TiledMmadQ{}.get_thread_slice(tid).partition_C(
        make_identity_tensor(select<0, 1>(typename Traits::TileShapedQ{})));
    float const* src = p.dq_accum + t * Traits::kdQElements;
    CUTE_UNROLL
    for (int i = 0; i < size(coords); i += 4) {
      float4 const v = __ldcg(reinterpret_cast<float4 const*>(src + fragment_offset(tid, i, kThreads)));
      float const vals[4] = {v.x, v.y, v.z, v.w};
      CUTE_UNROLL
      for (int j = 0; j < 4; ++j) {
        tile[get<0>(coords(i + j)) * kLd + get<1>(coords(i + j))] = Element(vals[j] * p.softmax_scale);
      }
    }
    __syncthreads();
    Element* dq = Traits::kPacked
                      ? p.dq + (first_q + int64_t(m_block) * kM) * p.dq_strides[1] + head * p.dq_strides[2]
                      : p.dq + batch * p.dq_strides[0] + int64_t(m_block) * kM * p.dq_strides[1] + head * p.dq_strides[2];
    for (int c = tid; c < rows * (kD / kVec); c += kThreads) {
      int const row = c / (kD / kVec), col = c % (kD / kVec) * kVec;
      *reinterpret_cast<uint4*>(dq + row * p.dq_strides[1] + col) =
          *reinterpret_cast<uint4 const*>(&tile[row * kLd + col]);
    }
  }
  if (counted && tid == 0) {
    cuda::atomic_ref<int, cuda::thread_scope_device> const done(*p.done);
    if (done.fetch_add(1, cuda::memory_order_relaxed) == int(gridDim.x * gridDim.y * gridDim.z) - 1) {
      wait_for_earlier_grid();
    }
  }
}

template <class Element>
struct SumGroupsParams {
  float const* dk_accum;  // [batch, heads_q, seqlen_k, head_dim]; nullptr: write zeros
  float const* dv_accum;  // [batch, heads_q, seqlen_k, head_dim_v]
  Element* dk;
  Element* dv;
  int64_t dk_strides[3];
  int64_t dv_strides[3];
  int64_t elements;  // batch * seqlen_k * heads_kv * max(head_dim, head_dim_v)
  int seqlen_k;
  int heads_kv;
  int head_group;
  int head_dim;    // dK's columns
  int head_dim_v;  // dV's
  int const* rows_end;  // packed sequences (one batch entry of total_k rows): cu_seqlens_k + batch
};

// dK[b, j, h] = sum over the group's query heads g of dK_accum[b, h * group + g, j],
// and dV's likewise, a thread per column of the wider of the two. Packed
// sequences: rows past the last sequence's belong to none and are not written.
constexpr int kSumGroupsThreads = 256;

template <class Element, bool kPacked = false>
__global__ void __launch_bounds__(kSumGroupsThreads) sum_groups_kernel(SumGroupsParams<Element> const p) {
  wait_for_earlier_grid();  // the postprocess, which ends after the main kernel's dK, dV sums
  int64_t const i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= p.elements) return;
  int const width = max(p.head_dim, p.head_dim_v);
  int const col = int(i % width);
  int64_t const rest = i / width;
  int const head = int(rest % p.heads_kv);
  int const key = int(rest / p.heads_kv % p.seqlen_k);
  int const batch = int(rest / p.heads_kv / p.seqlen_k);
  if (kPacked && key >= *p.rows_end) return;
  // The group's query heads' rows: (row + g) * dim + col.
  int64_t const row = (int64_t(batch) * p.heads_kv * p.head_group + head * p.head_group) * p.seqlen_k + key;
  auto group_sum = [&](float const* accum, int dim) {
    float sum = 0.f;
    if (accum != nullptr) {
      for (int g = 0; g < p.head_group; ++g) sum += accum[(row + int64_t(g) * p.seqlen_k) * dim + col];
    }
    return Element(sum);
  };
  if (col < p.head_dim) {
    p.dk[batch * p.dk_strides[0] + key * p.dk_strides[1] + head * p.dk_strides[2] + col] =
        group_sum(p.dk_accum, p.head_dim);
  }
  if (col < p.head_dim_v) {
    p.dv[batch * p.dv_strides[0] + key * p.dv_strides[1] + head * p.dv_strides[2] + col] =
        group_sum(p.dv_accum, p.head_dim_v);
  }
}

}  // namespace flash3::bwd
