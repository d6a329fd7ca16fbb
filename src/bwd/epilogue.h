// The backward epilogue (Algorithm 3, line 16): dK_j (times the softmax
// scale) and dV_j out of registers. With MHA they go through shared memory
// (stmatrix into K's and V's buffers, free after the mainloop) to dK and dV in
// the input dtype by TMA stores, which drop the rows past seqlen_k. With
// GQA/MQA they go to the workspace in fp32 per query head, summed over each
// K/V head's group by the postprocess.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "bwd/traits.h"
#include "common/layout.h"

namespace flash3::bwd {

template <class Traits>
struct Epilogue {
  using Element = typename Traits::Element;
  static constexpr int kHeadDim = Traits::kHeadDim;
  static constexpr int kBlockN = Traits::kBlockN;
  static constexpr int kNumConsumerThreads = Traits::kNumConsumerThreads;
  using SharedStorage = typename Traits::SharedStorage;
  // dK and dV use V's (N, d) layout in both buffers.
  using SmemLayoutdKV = typename Traits::SmemLayoutV;
  using TileShape = Shape<typename Traits::N, typename Traits::D>;

  using GmemShape = typename Traits::GmemShape;
  using GmemTensor = typename Traits::template GmemTensor<Element>;
  using TmadKV = decltype(make_tma_copy(SM90_TMA_STORE{}, GmemTensor{}, SmemLayoutdKV{}, TileShape{}, _1{}));

  struct Params {
    TmadKV tma_dk;
    TmadKV tma_dv;
    GmemShape shape_k;
    float* dk_accum;  // GQA/MQA: dense [batch, heads_q, seqlen_k, d]
    float* dv_accum;
    bool grouped;
    int seqlen_k;
    int num_heads_q;
    int head_group;
    float softmax_scale;
  };

  CUTE_DEVICE static void prefetch_descriptors(Params const& p) {
    cute::prefetch_tma_descriptor(p.tma_dk.get_tma_descriptor());
    cute::prefetch_tma_descriptor(p.tma_dv.get_tma_descriptor());
  }

  template <class Frag>
  CUTE_DEVICE static void store(Params const& p, SharedStorage& smem, Frag& tdKrdK, Frag const& tdVrdV, int n_block,
                                int head, int batch, int thread_idx) {
    CUTE_UNROLL
    for (int i = 0; i < size(tdKrdK); ++i) tdKrdK(i) *= p.softmax_scale;
    if (p.grouped) {
      store_fp32(p, tdKrdK, tdVrdV, n_block, head, batch, thread_idx);
      return;
    }
    Tensor sdK = make_tensor(make_smem_ptr(smem.k.data()), SmemLayoutdKV{});
    Tensor sdV = make_tensor(make_smem_ptr(smem.v.data()), SmemLayoutdKV{});
    auto r2s = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, typename Traits::TiledMmadKV{});
    auto thr_r2s = r2s.get_thread_slice(thread_idx);
    // K and V are free once both warpgroups' last GEMMs have read them.
    cutlass::arch::NamedBarrier::sync(kNumConsumerThreads, uint32_t(Barrier::kEpilogue));
    copy(r2s, thr_r2s.retile_S(convert_fragment<Element>(tdKrdK)), thr_r2s.partition_D(sdK));
    copy(r2s, thr_r2s.retile_S(convert_fragment<Element>(tdVrdV)), thr_r2s.partition_D(sdV));
    cutlass::arch::fence_view_async_shared();  // stmatrix (generic proxy), then TMA (async proxy)
    cutlass::arch::NamedBarrier::sync(kNumConsumerThreads, uint32_t(Barrier::kEpilogue));
    if (thread_idx == 0) {
      int const head_kv = head;  // MHA
      Tensor gdK = local_tile(p.tma_dk.get_tma_tensor(p.shape_k)(_, _, head_kv, batch), TileShape{},
                              make_coord(n_block, _0{}));
      Tensor gdV = local_tile(p.tma_dv.get_tma_tensor(p.shape_k)(_, _, head_kv, batch), TileShape{},
                              make_coord(n_block, _0{}));
      auto tma_dk = p.tma_dk.get_slice(_0{});
      auto tma_dv = p.tma_dv.get_slice(_0{});
      copy(p.tma_dk, tma_dk.partition_S(sdK), tma_dk.partition_D(gdK));
      copy(p.tma_dv, tma_dv.partition_S(sdV), tma_dv.partition_D(gdV));
      tma_store_arrive();
      tma_store_wait<0>();  // shared memory stays valid until the stores have read it
    }
  }

 private:
  // Accumulator elements 2i and 2i+1 are adjacent columns of one row.
  template <class Frag>
  CUTE_DEVICE static void store_fp32(Params const& p, Frag const& tdKrdK, Frag const& tdVrdV, int n_block, int head,
                                     int batch, int thread_idx) {
    Tensor coords = typename Traits::TiledMmadKV{}.get_thread_slice(thread_idx).partition_C(
        make_identity_tensor(select<0, 1>(typename Traits::TileShapedKV{})));
    int const key0 = n_block * kBlockN;
    int64_t const base = (int64_t(batch) * p.num_heads_q + head) * p.seqlen_k;
    CUTE_UNROLL
    for (int i = 0; i < size(tdKrdK); i += 2) {
      int const key = key0 + get<0>(coords(i));
      if (key >= p.seqlen_k) continue;
      int64_t const at = (base + key) * kHeadDim + get<1>(coords(i));
      *reinterpret_cast<float2*>(p.dk_accum + at) = make_float2(tdKrdK(i), tdKrdK(i + 1));
      *reinterpret_cast<float2*>(p.dv_accum + at) = make_float2(tdVrdV(i), tdVrdV(i + 1));
    }
  }
};

}  // namespace flash3::bwd
