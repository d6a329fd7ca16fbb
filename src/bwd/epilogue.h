// The backward epilogue (Algorithm 3, line 16): dK_j (times the softmax
// scale) and dV_j from registers to global memory, rows past seqlen_k
// dropped. With MHA they land in dK and dV in the input dtype; with GQA/MQA in
// fp32 per query head, summed over each K/V head's group by the postprocess.
#pragma once

#include <cute/tensor.hpp>

#include "bwd/traits.h"

namespace flash3::bwd {

template <class Traits>
struct Epilogue {
  using Element = typename Traits::Element;
  static constexpr int kHeadDim = Traits::kHeadDim;
  static constexpr int kBlockN = Traits::kBlockN;

  struct Params {
    Element* dk;  // MHA: [batch, seqlen_k, heads, d] with these strides
    Element* dv;
    int64_t dk_strides[3];  // batch, seq, head
    int64_t dv_strides[3];
    float* dk_accum;  // GQA/MQA: dense [batch, heads_q, seqlen_k, d]
    float* dv_accum;
    bool grouped;
    int seqlen_k;
    int num_heads_q;
    float softmax_scale;
  };

  template <class Frag>
  CUTE_DEVICE static void store(Params const& p, Frag& tdKrdK, Frag const& tdVrdV, int n_block, int head, int batch,
                                int thread_idx) {
    Tensor coords = typename Traits::TiledMmadKV{}.get_thread_slice(thread_idx).partition_C(
        make_identity_tensor(select<0, 1>(typename Traits::TileShapedKV{})));
    int const key0 = n_block * kBlockN;
    // Accumulator elements 2i and 2i+1 are adjacent columns of one row.
    CUTE_UNROLL
    for (int i = 0; i < size(tdKrdK); i += 2) {
      int const key = key0 + get<0>(coords(i));
      int const col = get<1>(coords(i));
      if (key >= p.seqlen_k) continue;
      float2 const dk = make_float2(tdKrdK(i) * p.softmax_scale, tdKrdK(i + 1) * p.softmax_scale);
      float2 const dv = make_float2(tdVrdV(i), tdVrdV(i + 1));
      if (p.grouped) {
        int64_t const at = ((int64_t(batch) * p.num_heads_q + head) * p.seqlen_k + key) * kHeadDim + col;
        *reinterpret_cast<float2*>(p.dk_accum + at) = dk;
        *reinterpret_cast<float2*>(p.dv_accum + at) = dv;
      } else {
        int64_t const at_k = batch * p.dk_strides[0] + key * p.dk_strides[1] + head * p.dk_strides[2] + col;
        int64_t const at_v = batch * p.dv_strides[0] + key * p.dv_strides[1] + head * p.dv_strides[2] + col;
        p.dk[at_k] = Element(dk.x);
        p.dk[at_k + 1] = Element(dk.y);
        p.dv[at_v] = Element(dv.x);
        p.dv[at_v + 1] = Element(dv.y);
      }
    }
  }
};

}  // namespace flash3::bwd
