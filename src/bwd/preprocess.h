// Backward preprocess (Algorithm 3, line 2): D_i = rowsum(dO_i o O_i) over
// V's head dim, and the forward's LSE in log2 units, both padded to whole
// query blocks so that the producer copies one block of each with a single
// bulk copy. Padding rows get D = 0 and LSE = +inf, which makes their P (and
// so everything they add to dK and dV) zero. It also clears the dQ
// accumulator, head_dim floats per row (the accumulator's tiles are
// bwd_block_m(head_dim) rows of head_dim floats each).
//
// It runs beside the main kernel: an eighth of the SMs take items of
// kPreprocessItemRows rows of one (batch, head), in order, and count each
// into the head's ready counter, on which the main kernel's CTAs of that head
// wait (Mainloop::load_lse_d) while the kernel starts on the other SMs.
// Beside, not before: run first on every SM (as it still is for long calls
// without the mask, bwd/launch.h), its time (its bytes at copy bandwidth, the
// same at every length for a given number of tokens) is a large share of a
// short call.
//
// Packed sequences (varlen): one batch entry, whose padded rows hold each
// sequence from a block of its own (bwd/workspace.h); a row finds its
// sequence by its block, and rows past the sequence's rows that take part
// are padding. Each item has a ready flag of its own, and items go in the
// order the main kernel's CTAs need them (bwd/sequence.h's packed_item), so
// that each waits for its own sequence's rows only.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "bwd/counters.h"
#include "bwd/sequence.h"
#include "bwd/workspace.h"
#include "common/dependent_launch.h"
#include "flash3/flash3.h"

namespace flash3::bwd {

template <class Element>
struct PreprocessParams {
  Element const* o;
  Element const* dout;
  int64_t o_strides[3];  // batch, seq, head
  int64_t do_strides[3];
  float const* lse;  // [batch, heads, seqlen_q]; packed sequences [heads, total_q]
  float* lse_log2;   // [batch, heads, padded_rows]
  float* dpsum;
  float* dq_accum;   // [batch, heads, padded_rows, head_dim] floats, cleared
  int* ready;        // ready counters (bwd/workspace.h's ready_counter), cleared before
  int padded_rows;
  int seqlen_q;
  int num_heads;
  int items_per_head;
  int items;
  SequenceLengths lengths;  // packed sequences
  int batch;                // packed sequences: the sequences
  int total_q;              // packed sequences: the LSE's rows
};

// Eight threads per row, each reading 16 bytes of O and of dO per step and
// clearing the row's accumulator with float4 stores: bandwidth-bound, so
// every access is a full vector (O and dO are 16-byte aligned, d a multiple
// of 8: validated), and each thread keeps about eight loads in flight, which
// the few SMs need to reach the memory's bandwidth. (An eighth of the SMs,
// not a quarter: the SMs it takes are the main kernel's, and a quarter made
// the short calls no faster.)
constexpr int kPreprocessThreads = 1024;
constexpr int kPreprocessThreadsPerRow = 8;
// Non-causal calls from this length on run the preprocess on every SM, before
// the main kernel (bwd/launch.h).
constexpr int64_t kPreprocessBesideBelow = 4096;
inline int preprocess_ctas(int items, int num_sms, bool beside) {
  return std::max(1, std::min(items, beside ? num_sms / 8 : num_sms));
}

// Packed sequences: padded row q's packed row, or -1 for padding. `b` is the
// sequence of one of the thread's earlier rows, advanced to q's
// (bwd/sequence.h's advance_to_block).
template <int kBlockM, class Element>
__device__ __forceinline__ int64_t packed_source_row(PreprocessParams<Element> const& p, int q, int& b) {
  int const block = q / kBlockM;
  b = advance_to_block(p.lengths, p.batch, b, block, kBlockM);
  int const r = int(block - packed_first_block(p.lengths.cu_seqlens_q[b], b, kBlockM)) * kBlockM + q % kBlockM;
  return r < p.lengths.q(b) ? int64_t(p.lengths.cu_seqlens_q[b]) + r : -1;
}

// kHeadDim: Q's (the dQ accumulator's columns); kHeadDimV: O's and dO's.
template <class Element, int kHeadDim, int kHeadDimV, bool kPacked = false>
__global__ void __launch_bounds__(kPreprocessThreads) preprocess_kernel(PreprocessParams<Element> const p) {
  let_dependents_start();  // the main kernel starts on the other SMs at once
  constexpr int kVec = 16 / sizeof(Element);
  constexpr int kVecs = (kHeadDimV / kVec + kPreprocessThreadsPerRow - 1) / kPreprocessThreadsPerRow;  // a row's, per thread
  constexpr int kRowsPerPass = kPreprocessThreads / kPreprocessThreadsPerRow;
  constexpr int kPasses = kPreprocessItemRows / kRowsPerPass;
  constexpr int kRowsAtOnce = kVecs >= 4 ? 1 : 4 / kVecs;  // rows whose loads are in flight together
  static_assert(kPasses % kRowsAtOnce == 0);
  constexpr int kBlockM = bwd_block_m(kHeadDim);
  int const part = threadIdx.x % kPreprocessThreadsPerRow;
  for (int item = blockIdx.x; item < p.items; item += gridDim.x) {
    int bh = item / p.items_per_head, chunk = item % p.items_per_head;
    if constexpr (kPacked) {
      PackedItem const at = packed_item(p.lengths, p.batch, p.num_heads, p.items_per_head, item, kBlockM);
      bh = at.head;
      chunk = at.chunk;
    }
    int const batch = bh / p.num_heads, head = bh % p.num_heads;
    int const first = chunk * kPreprocessItemRows + threadIdx.x / kPreprocessThreadsPerRow;
    Element const* o = p.o + batch * p.o_strides[0] + head * p.o_strides[2];
    Element const* dout = p.dout + batch * p.do_strides[0] + head * p.do_strides[2];
    // Packed sequences: the sequence of the thread's rows so far.
    [[maybe_unused]] int sequence = kPacked ? sequence_of_block(p.lengths, p.batch, first / kBlockM, kBlockM) : 0;
    for (int pass = 0; pass < kPasses; pass += kRowsAtOnce) {
      uint4 ov[kRowsAtOnce][kVecs], dov[kRowsAtOnce][kVecs];
      // Each row's packed row, -1 for padding (packed sequences).
      [[maybe_unused]] int64_t source[kRowsAtOnce];
      #pragma unroll
      for (int r = 0; r < kRowsAtOnce; ++r) {
        int const q = first + (pass + r) * kRowsPerPass;
        if constexpr (kPacked) source[r] = q < p.padded_rows ? packed_source_row<kBlockM>(p, q, sequence) : -1;
        #pragma unroll
        for (int v = 0; v < kVecs; ++v) {
          int const c = (part + v * kPreprocessThreadsPerRow) * kVec;
          if constexpr (kPacked) {
            bool const in = source[r] >= 0 && c < kHeadDimV;
            ov[r][v] = in ? *reinterpret_cast<uint4 const*>(o + source[r] * p.o_strides[1] + c) : make_uint4(0, 0, 0, 0);
            dov[r][v] =
                in ? *reinterpret_cast<uint4 const*>(dout + source[r] * p.do_strides[1] + c) : make_uint4(0, 0, 0, 0);
          } else {
            bool const in = q < p.seqlen_q && c < kHeadDimV;
            ov[r][v] = in ? *reinterpret_cast<uint4 const*>(o + q * p.o_strides[1] + c) : make_uint4(0, 0, 0, 0);
            dov[r][v] = in ? *reinterpret_cast<uint4 const*>(dout + q * p.do_strides[1] + c) : make_uint4(0, 0, 0, 0);
          }
        }
      }
      #pragma unroll
      for (int r = 0; r < kRowsAtOnce; ++r) {
        int const q = first + (pass + r) * kRowsPerPass;
        float d = 0.f;
        #pragma unroll
        for (int v = 0; v < kVecs; ++v) {
          Element const* oe = reinterpret_cast<Element const*>(&ov[r][v]);
          Element const* de = reinterpret_cast<Element const*>(&dov[r][v]);
          #pragma unroll
          for (int e = 0; e < kVec; ++e) d += float(oe[e]) * float(de[e]);
        }
        #pragma unroll
        for (int offset = kPreprocessThreadsPerRow / 2; offset > 0; offset /= 2) {
          d += __shfl_xor_sync(0xffffffffu, d, offset, kPreprocessThreadsPerRow);
        }
        if (q >= p.padded_rows) continue;
        int64_t const row = int64_t(bh) * p.padded_rows + q;
        float4* dq = reinterpret_cast<float4*>(p.dq_accum + row * kHeadDim);
        for (int c = part; c < kHeadDim / 4; c += kPreprocessThreadsPerRow) dq[c] = make_float4(0.f, 0.f, 0.f, 0.f);
        if (part == 0) {
          p.dpsum[row] = d;
          if constexpr (kPacked) {
            p.lse_log2[row] = source[r] >= 0 ? p.lse[int64_t(head) * p.total_q + source[r]] * float(M_LOG2E) : INFINITY;
          } else {
            p.lse_log2[row] = q < p.seqlen_q ? p.lse[int64_t(bh) * p.seqlen_q + q] * float(M_LOG2E) : INFINITY;
          }
        }
      }
    }
    __syncthreads();  // the item's writes, released by its count
    if (threadIdx.x == 0) {
      count_in(p.ready + ready_counter(kPacked, bh, int64_t(chunk) * kPreprocessItemRows, p.items_per_head).index);
    }
  }
}

}  // namespace flash3::bwd
