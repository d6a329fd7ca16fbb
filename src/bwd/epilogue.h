// The backward epilogue (Algorithm 3, line 16): dK_j (times the softmax
// scale) and dV_j out of registers. With MHA they go through shared memory
// (stmatrix into K's and V's buffers, free after the mainloop) to dK and dV in
// the input dtype by TMA stores, which drop the rows past seqlen_k. With
// GQA/MQA they go to the workspace in fp32 per query head, summed over each
// K/V head's group by the postprocess. The parts of a split tile
// (bwd/tail_split.h) first gather their sums; the last part stores. A packed
// sequence's (varlen) block partly past its packed keys is stored row by
// row: past it lie the next sequence's rows, which a TMA store would write.
#pragma once

#include <cuda/atomic>
#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "bwd/sequence.h"
#include "bwd/tail_split.h"
#include "bwd/traits.h"
#include "common/layout.h"

namespace flash3::bwd {

template <class Traits_>
struct Epilogue {
  using Traits = Traits_;
  using Element = typename Traits::Element;
  static constexpr int kHeadDim = Traits::kHeadDim;
  static constexpr int kHeadDimV = Traits::kHeadDimV;
  static constexpr int kBlockN = Traits::kBlockN;
  static constexpr int kNumConsumerThreads = Traits::kNumConsumerThreads;
  using SharedStorage = typename Traits::SharedStorage;
  // dK in K's buffer and dV in V's, each (N, its head dim), laid out as V.
  using SmemLayoutdK = typename Traits::SmemLayoutdK;
  using SmemLayoutdV = typename Traits::SmemLayoutV;
  using TileShapedK = Shape<typename Traits::N, typename Traits::D>;
  using TileShapedV = Shape<typename Traits::N, typename Traits::Dv>;

  using GmemShape = typename Traits::GmemShape;
  using GmemTensordK = typename Traits::template GmemTensor<Element>;
  using GmemTensordV = typename Traits::template GmemTensor<Element, kHeadDimV>;
  using TmadK = decltype(make_tma_copy(SM90_TMA_STORE{}, GmemTensordK{}, SmemLayoutdK{}, TileShapedK{}, _1{}));
  using TmadV = decltype(make_tma_copy(SM90_TMA_STORE{}, GmemTensordV{}, SmemLayoutdV{}, TileShapedV{}, _1{}));

  struct Params {
    TmadK tma_dk;
    TmadV tma_dv;
    GmemShape shape_k;  // dK's; dV's is Traits::shape_v of it
    float* dk_accum;  // GQA/MQA: dense [batch, heads_q, seqlen_k, d]
    float* dv_accum;  // dense [batch, heads_q, seqlen_k, dv]
    float* split_sums;    // WorkspaceLayout::split_sums, cleared by the preprocess
    int* split_arrivals;  // WorkspaceLayout::split_arrivals, likewise
    bool grouped;
    int seqlen_k;
    int num_heads_q;
    int head_group;
    float softmax_scale;
    // Packed sequences: dK and dV as plain memory, (row, head) strides, for
    // a sequence's last partial block; seqlen_k is total_k (dk_accum's rows).
    Element* dk;
    Element* dv;
    int64_t dk_strides[2];
    int64_t dv_strides[2];
  };

  CUTE_DEVICE static void prefetch_descriptors(Params const& p) {
    cute::prefetch_tma_descriptor(p.tma_dk.get_tma_descriptor());
    cute::prefetch_tma_descriptor(p.tma_dv.get_tma_descriptor());
  }

  // A split tile's part: adds its dK and dV to the tile's sums and counts
  // itself in. The last part to arrive takes the sums and goes on to store
  // the tile; the others are done (false). dK's and dV's registers in one
  // pass (dV's fewer where V's head dim is smaller).
  template <class FragdK, class FragdV>
  CUTE_DEVICE static bool gather_parts(Params const& p, SharedStorage& smem, FragdK& tdKrdK, FragdV& tdVrdV,
                                       TilePart const& work, int thread_idx) {
    constexpr int kdKElements = kBlockN * kHeadDim, kdVElements = kBlockN * kHeadDimV;
    constexpr int kRegisters = cute::max(decltype(size(tdKrdK))::value, decltype(size(tdVrdV))::value);
    float* const dk_sum = p.split_sums + int64_t(work.split_index) * (kdKElements + kdVElements);
    float* const dv_sum = dk_sum + kdKElements;
    CUTE_UNROLL
    for (int i = 0; i < kRegisters; i += 4) {
      int const at = fragment_offset(thread_idx, i, kNumConsumerThreads);
      if (i < size(tdKrdK)) {
        atomicAdd(reinterpret_cast<float4*>(dk_sum + at),
                  make_float4(tdKrdK(i), tdKrdK(i + 1), tdKrdK(i + 2), tdKrdK(i + 3)));
      }
      if (i < size(tdVrdV)) {
        atomicAdd(reinterpret_cast<float4*>(dv_sum + at),
                  make_float4(tdVrdV(i), tdVrdV(i + 1), tdVrdV(i + 2), tdVrdV(i + 3)));
      }
    }
    // The barrier orders every thread's adds before thread 0's count, which
    // releases them to the other parts and acquires theirs for the last one.
    cutlass::arch::NamedBarrier::sync(kNumConsumerThreads, uint32_t(Barrier::kEpilogue));
    if (thread_idx == 0) {
      cuda::atomic_ref<int, cuda::thread_scope_device> const arrivals(p.split_arrivals[work.split_index]);
      smem.arrival = arrivals.fetch_add(1, cuda::memory_order_acq_rel);
    }
    cutlass::arch::NamedBarrier::sync(kNumConsumerThreads, uint32_t(Barrier::kEpilogue));
    if (smem.arrival != work.parts - 1) return false;
    CUTE_UNROLL
    for (int i = 0; i < kRegisters; i += 4) {
      int const at = fragment_offset(thread_idx, i, kNumConsumerThreads);
      if (i < size(tdKrdK)) {
        float4 const k = __ldcg(reinterpret_cast<float4 const*>(dk_sum + at));
        tdKrdK(i) = k.x, tdKrdK(i + 1) = k.y, tdKrdK(i + 2) = k.z, tdKrdK(i + 3) = k.w;
      }
      if (i < size(tdVrdV)) {
        float4 const v = __ldcg(reinterpret_cast<float4 const*>(dv_sum + at));
        tdVrdV(i) = v.x, tdVrdV(i + 1) = v.y, tdVrdV(i + 2) = v.z, tdVrdV(i + 3) = v.w;
      }
    }
    return true;
  }

  template <class FragdK, class FragdV>
  CUTE_DEVICE static void store(Params const& p, SharedStorage& smem, FragdK& tdKrdK, FragdV const& tdVrdV,
                                int n_block, int head, int batch, int thread_idx) {
    CUTE_UNROLL
    for (int i = 0; i < size(tdKrdK); ++i) tdKrdK(i) *= p.softmax_scale;
    if (p.grouped) {
      store_fp32(p, smem, tdKrdK, tdVrdV, n_block, head, batch, thread_idx);
      return;
    }
    Tensor sdK = make_tensor(make_smem_ptr(smem.k.data()), SmemLayoutdK{});
    Tensor sdV = make_tensor(make_smem_ptr(smem.v.data()), SmemLayoutdV{});
    // The same buffers viewed as the accumulators' (rows, columns).
    Tensor sdKacc = make_tensor(make_smem_ptr(smem.k.data()), typename Traits::SmemLayoutdKAcc{});
    Tensor sdVacc = make_tensor(make_smem_ptr(smem.v.data()), typename Traits::SmemLayoutdVAcc{});
    using StoreAtom = Copy_Atom<typename Traits::StoreAtomdKV, Element>;
    auto r2s_dk = make_tiled_copy_C(StoreAtom{}, typename Traits::TiledMmadK{});
    auto r2s_dv = make_tiled_copy_C(StoreAtom{}, typename Traits::TiledMmadV{});
    auto thr_r2s_dk = r2s_dk.get_thread_slice(thread_idx);
    auto thr_r2s_dv = r2s_dv.get_thread_slice(thread_idx);
    // K and V are free once both warpgroups' last GEMMs have read them.
    cutlass::arch::NamedBarrier::sync(kNumConsumerThreads, uint32_t(Barrier::kEpilogue));
    copy(r2s_dk, thr_r2s_dk.retile_S(convert_fragment<Element>(tdKrdK)), thr_r2s_dk.partition_D(sdKacc));
    copy(r2s_dv, thr_r2s_dv.retile_S(convert_fragment<Element>(tdVrdV)), thr_r2s_dv.partition_D(sdVacc));
    cutlass::arch::fence_view_async_shared();  // stmatrix (generic proxy), then TMA (async proxy)
    cutlass::arch::NamedBarrier::sync(kNumConsumerThreads, uint32_t(Barrier::kEpilogue));
    if constexpr (Traits::kPacked) {
      int const rows = smem.sequence[kLenK] - n_block * kBlockN;
      if (rows < kBlockN) {
        store_rows(p, sdK, sdV, smem.sequence[kFirstK] + n_block * kBlockN, rows, head, thread_idx);
        return;
      }
    }
    if (thread_idx == 0) {
      int const head_kv = head;  // MHA
      auto sequence = [&](auto const& m) {
        if constexpr (Traits::kPacked) return domain_offset(make_coord(smem.sequence[kFirstK], _0{}), m(_, _, head_kv, 0));
        else return m(_, _, head_kv, batch);
      };
      Tensor gdK = local_tile(sequence(p.tma_dk.get_tma_tensor(p.shape_k)), TileShapedK{}, make_coord(n_block, _0{}));
      Tensor gdV = local_tile(sequence(p.tma_dv.get_tma_tensor(Traits::shape_v(p.shape_k))), TileShapedV{},
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
  // A packed sequence's last `rows` keys of dK and dV, from packed row
  // `row0`, out of their (N, d) and (N, dv) buffers by every consumer thread,
  // 16 bytes at a time (the buffers' swizzle keeps 8 columns' 16 bytes
  // together), both in one pass over the wider rows.
  template <class SmemdK, class SmemdV>
  CUTE_DEVICE static void store_rows(Params const& p, SmemdK const& sdK, SmemdV const& sdV, int row0, int rows,
                                     int head, int thread_idx) {
    constexpr int kVec = 16 / sizeof(Element);
    constexpr int kVecs = cute::max(kHeadDim, kHeadDimV) / kVec;
    for (int i = thread_idx; i < rows * kVecs; i += kNumConsumerThreads) {
      int const r = i / kVecs, c = i % kVecs * kVec;
      int64_t const row = row0 + r;
      if (c < kHeadDim) {
        *reinterpret_cast<uint4*>(p.dk + row * p.dk_strides[0] + head * p.dk_strides[1] + c) =
            *reinterpret_cast<uint4 const*>(&sdK(r, c));
      }
      if (c < kHeadDimV) {
        *reinterpret_cast<uint4*>(p.dv + row * p.dv_strides[0] + head * p.dv_strides[1] + c) =
            *reinterpret_cast<uint4 const*>(&sdV(r, c));
      }
    }
  }

  // dK's and dV's accumulators to their fp32 rows, in one pass over the
  // registers (dV's fewer where V's head dim is smaller). Accumulator
  // elements 2i and 2i+1 are adjacent columns of one row: two columns, or
  // with the queries on the GEMMs' rows, two keys.
  template <class FragdK, class FragdV>
  CUTE_DEVICE static void store_fp32(Params const& p, SharedStorage const& smem, FragdK const& tdKrdK,
                                     FragdV const& tdVrdV, int n_block, int head, int batch, int thread_idx) {
    // (key, column) of each register.
    Tensor coords_k = typename Traits::TiledMmadK{}.get_thread_slice(thread_idx).partition_C(
        keys_first_identity<Traits>(select<0, 1>(typename Traits::TileShapedK{})));
    Tensor coords_v = typename Traits::TiledMmadV{}.get_thread_slice(thread_idx).partition_C(
        keys_first_identity<Traits>(select<0, 1>(typename Traits::TileShapedV{})));
    int const key0 = n_block * kBlockN;
    // Packed sequences: the one batch entry's rows from the sequence's first,
    // the keys up to its packed length (zeros past those that take part).
    int64_t const base = Traits::kPacked ? int64_t(head) * p.seqlen_k + smem.sequence[kFirstK]
                                         : (int64_t(batch) * p.num_heads_q + head) * p.seqlen_k;
    int const key_end = Traits::kPacked ? smem.sequence[kLenK] : p.seqlen_k;
    constexpr int kRun = Traits::kQueriesOnRows ? 1 : 2;  // adjacent columns per store
    constexpr int kRegisters = cute::max(decltype(size(tdKrdK))::value, decltype(size(tdVrdV))::value);
    CUTE_UNROLL
    for (int i = 0; i < kRegisters; i += kRun) {
      auto store = [&](float* accum, auto const& frag, auto const& coords, int dim) {
        int const key = key0 + get<0>(coords(i));
        if (key >= key_end) return;
        int64_t const at = (base + key) * dim + get<1>(coords(i));
        if constexpr (kRun == 2) {
          *reinterpret_cast<float2*>(accum + at) = make_float2(frag(i), frag(i + 1));
        } else {
          accum[at] = frag(i);
        }
      };
      if (i < size(tdKrdK)) store(p.dk_accum, tdKrdK, coords_k, kHeadDim);
      if (i < size(tdVrdV)) store(p.dv_accum, tdVrdV, coords_v, kHeadDimV);
    }
  }
};

}  // namespace flash3::bwd
