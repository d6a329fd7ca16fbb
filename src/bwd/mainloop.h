// The backward mainloop (paper Algorithm 3): the producer's TMA loads, the
// consumers' five GEMMs per query block, and the dq_writer's accumulation of
// dQ into global memory.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/pipeline/pipeline.hpp>

#include "bwd/counters.h"
#include "bwd/mask.h"
#include "bwd/sequence.h"
#include "bwd/traits.h"
#include "common/dependent_launch.h"
#include "common/layout.h"
#include "common/softcap.h"

namespace flash3::bwd {

template <class Traits_>
struct Mainloop {
  using Traits = Traits_;
  using Element = typename Traits::Element;
  static constexpr int kHeadDim = Traits::kHeadDim;
  static constexpr int kBlockM = Traits::kBlockM;
  static constexpr int kBlockN = Traits::kBlockN;
  static constexpr int kNumConsumerThreads = Traits::kNumConsumerThreads;
  using SharedStorage = typename Traits::SharedStorage;
  using PipelineQ = typename Traits::PipelineQ;
  using PipelinedO = typename Traits::PipelinedO;
  using PipelinedQ = typename Traits::PipelinedQ;
  using PipelineLseD = typename Traits::PipelineLseD;
  using PipelinedQState = typename PipelinedQ::PipelineState;

  using GmemShape = typename Traits::GmemShape;
  using GmemTensor = typename Traits::template GmemTensor<Element const>;
  using GmemTensorV = typename Traits::template GmemTensor<Element const, Traits::kHeadDimV>;
  using TmaQ = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, take<0, 2>(typename Traits::SmemLayoutQ{}),
                                      Shape<typename Traits::M, typename Traits::D>{}, _1{}));
  using TmadO = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensorV{}, take<0, 2>(typename Traits::SmemLayoutdO{}),
                                       Shape<typename Traits::M, typename Traits::Dv>{}, _1{}));
  using TmaK = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, typename Traits::SmemLayoutK{},
                                      Shape<typename Traits::N, typename Traits::D>{}, _1{}));
  using TmaV = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensorV{}, typename Traits::SmemLayoutV{},
                                      Shape<typename Traits::N, typename Traits::Dv>{}, _1{}));
  // The global dQ accumulator as (256, rows, tiles x chunks): a tile per
  // (batch, head, m_block), each in kdQChunks parts.
  using dQAccumShape = Shape<_256, Int<Traits::kdQRows>, int32_t>;
  using dQAccumTensor = decltype(make_tensor(make_gmem_ptr(static_cast<float*>(nullptr)),
                                             make_layout(dQAccumShape{}, LayoutLeft{})));
  using TmadQ = decltype(make_tma_copy(SM90_TMA_REDUCE_ADD{}, dQAccumTensor{}, typename Traits::SmemLayoutdQ{},
                                       typename Traits::TileShapedQAccum{}, _1{}));

  static constexpr uint32_t kQBytes = kBlockM * kHeadDim * sizeof(Element);
  static constexpr uint32_t kdOBytes = kBlockM * Traits::kHeadDimV * sizeof(Element);
  static constexpr uint32_t kLseDBytes = 2 * kBlockM * sizeof(float);
  static constexpr uint32_t kKVBytes = kBlockN * (kHeadDim + Traits::kHeadDimV) * sizeof(Element);

  struct Params {
    TmaQ tma_q;
    TmadO tma_do;
    TmaK tma_k;
    TmaV tma_v;
    TmadQ tma_dq;
    GmemShape shape_q;
    GmemShape shape_k;
    float* dq_accum;        // the same bytes the TMA reduce-add writes (deterministic mode adds itself)
    float const* lse_log2;  // [batch, heads_q, m_blocks * kBlockM]
    float const* dpsum;
    int* dq_arrivals;       // per dQ tile: the key blocks that have added to it (WorkspaceLayout)
    int* ready;             // the preprocess's ready counters (bwd/workspace.h's ready_counter)
    int ready_items;        // the preprocess's items per head
    bool deterministic;
    int head_group;
    int num_heads;
    int m_blocks;
    int dq_tiles;  // batch * heads_q * m_blocks
    int seqlen_q;
    int seqlen_k;
    int window_left;   // the call's Window (the masked kernel's only)
    int window_right;
    float scale_log2;  // softmax_scale * log2(e)
    Softcap softcap;   // common/softcap.h; off by default
    // Packed sequences (varlen): the tensors are one batch entry, m_blocks
    // the workspace's blocks a head (packed_row_blocks), seqlen_q/k the
    // longest sequence's; each CTA's sequence is read into shared memory
    // (bwd/sequence.h).
    SequenceLengths lengths;

    // The mask policy of the kernel's calls: the masked kernel (kCausal)
    // serves the causal mask and every window, from the call's bounds (read
    // from the parameters where used, not held in registers).
    CUTE_HOST_DEVICE MaskPolicy mask_policy() const {
      return Traits::kCausal ? MaskPolicy{seqlen_q, seqlen_k, false, window_left, window_right}
                             : MaskPolicy{seqlen_q, seqlen_k, false};
    }
  };

  CUTE_DEVICE static void prefetch_descriptors(Params const& p) {
    cute::prefetch_tma_descriptor(p.tma_q.get_tma_descriptor());
    cute::prefetch_tma_descriptor(p.tma_do.get_tma_descriptor());
    cute::prefetch_tma_descriptor(p.tma_k.get_tma_descriptor());
    cute::prefetch_tma_descriptor(p.tma_v.get_tma_descriptor());
    cute::prefetch_tma_descriptor(p.tma_dq.get_tma_descriptor());
  }

  // The mask policy of the CTA's sequence: the call's, or with packed
  // sequences that of the sequence in the slot.
  CUTE_DEVICE static MaskPolicy mask_policy(Params const& p, SharedStorage const& smem) {
    if constexpr (Traits::kPacked) {
      return MaskPolicy{smem.sequence[kSeqQ], smem.sequence[kSeqK], false, p.window_left, p.window_right};
    } else {
      return p.mask_policy();
    }
  }

  // The query blocks key block n_block visits. A packed sequence's block at
  // or past its keys that take part visits none (its dK and dV are zeros).
  CUTE_DEVICE static QueryRange query_range(Params const& p, SharedStorage const& smem, int n_block) {
    if constexpr (Traits::kPacked) {
      int const seq_q = smem.sequence[kSeqQ], seq_k = smem.sequence[kSeqK];
      if (n_block * kBlockN >= seq_k) return QueryRange{0, 0, 0};
      return mask_policy(p, smem).query_blocks(n_block, kBlockM, kBlockN, (seq_q + kBlockM - 1) / kBlockM);
    } else {
      return p.mask_policy().query_blocks(n_block, kBlockM, kBlockN, p.m_blocks);
    }
  }

  // A query block's index among the dQ tiles (a packed sequence's rows in
  // the one batch entry's).
  CUTE_DEVICE static int row_tile(Params const& p, SharedStorage const& smem, int batch, int head, int m_block) {
    if constexpr (Traits::kPacked) return head * p.m_blocks + smem.sequence[kFirstBlock] + m_block;
    else return (batch * p.num_heads + head) * p.m_blocks + m_block;
  }

  // A head's (rows, d) in a TMA tensor: a batch entry's, or a packed
  // sequence's from its first row `field` (kFirstQ, kFirstK) of the one
  // entry. Its last block reads past the sequence; the consumers zero those
  // rows (zero_rows_from).
  template <class TmaTensor>
  CUTE_DEVICE static auto sequence_rows(TmaTensor const& m, SharedStorage const& smem, SequenceField field, int head,
                                        int batch) {
    if constexpr (Traits::kPacked) return domain_offset(make_coord(smem.sequence[field], _0{}), m(_, _, head, 0));
    else return m(_, _, head, batch);
  }

  // ---------------------------------------------------------------- producer
  // Algorithm 3, lines 3-4 and 6: K_j and V_j once, then Q_i and dO_i into
  // their circular buffers. One warp; an elected lane issues (as in
  // load_lse_d).
  CUTE_DEVICE static void load(Params const& p, SharedStorage& smem, PipelineQ& pipeline_q, PipelinedO& pipeline_do,
                               int n_block, int head, int batch, QueryRange range) {
    int const head_kv = head / p.head_group;
    Tensor mQ = p.tma_q.get_tma_tensor(p.shape_q);
    Tensor mdO = p.tma_do.get_tma_tensor(Traits::shape_v(p.shape_q));
    Tensor mK = p.tma_k.get_tma_tensor(p.shape_k);
    Tensor mV = p.tma_v.get_tma_tensor(Traits::shape_v(p.shape_k));
    auto tile_md = Shape<typename Traits::M, typename Traits::D>{};
    auto tile_mdv = Shape<typename Traits::M, typename Traits::Dv>{};
    auto tile_nd = Shape<typename Traits::N, typename Traits::D>{};
    auto tile_ndv = Shape<typename Traits::N, typename Traits::Dv>{};
    Tensor gQ = local_tile(sequence_rows(mQ, smem, kFirstQ, head, batch), tile_md, make_coord(_, _0{}));  // (M, d, m_blocks)
    Tensor gdO = local_tile(sequence_rows(mdO, smem, kFirstQ, head, batch), tile_mdv, make_coord(_, _0{}));
    Tensor gK = local_tile(sequence_rows(mK, smem, kFirstK, head_kv, batch), tile_nd, make_coord(n_block, _0{}));
    Tensor gV = local_tile(sequence_rows(mV, smem, kFirstK, head_kv, batch), tile_ndv, make_coord(n_block, _0{}));
    Tensor sQ = make_tensor(make_smem_ptr(smem.q.data()), typename Traits::SmemLayoutQ{});
    Tensor sdO = make_tensor(make_smem_ptr(smem.dout.data()), typename Traits::SmemLayoutdO{});
    Tensor sK = make_tensor(make_smem_ptr(smem.k.data()), typename Traits::SmemLayoutK{});
    Tensor sV = make_tensor(make_smem_ptr(smem.v.data()), typename Traits::SmemLayoutV{});

    auto tma_q = p.tma_q.get_slice(_0{});
    auto tma_do = p.tma_do.get_slice(_0{});
    auto tma_k = p.tma_k.get_slice(_0{});
    auto tma_v = p.tma_v.get_slice(_0{});
    Tensor tQgQ = tma_q.partition_S(gQ);  // (TMA, TMA_M, TMA_D, m_blocks)
    Tensor tQsQ = tma_q.partition_D(sQ);  // (TMA, TMA_M, TMA_D, stages)
    Tensor tdOgdO = tma_do.partition_S(gdO);
    Tensor tdOsdO = tma_do.partition_D(sdO);

    if (cute::elect_one_sync()) {
      smem.barrier_kv.arrive_and_expect_tx(kKVBytes);
      auto& bar = reinterpret_cast<uint64_t&>(smem.barrier_kv);
      copy(p.tma_k.with(bar), tma_k.partition_S(gK), tma_k.partition_D(sK));
      copy(p.tma_v.with(bar), tma_v.partition_S(gV), tma_v.partition_D(sV));
    }
    auto write_q = cutlass::make_producer_start_state<PipelineQ>();
    auto write_do = cutlass::make_producer_start_state<PipelinedO>();
    for (int m_block = range.m_block_min; m_block < range.m_block_max; ++m_block) {
      pipeline_q.producer_acquire(write_q);
      if (cute::elect_one_sync()) {
        copy(p.tma_q.with(*pipeline_q.producer_get_barrier(write_q)), tQgQ(_, _, _, m_block),
             tQsQ(_, _, _, write_q.index()));
      }
      ++write_q;
      pipeline_do.producer_acquire(write_do);
      if (cute::elect_one_sync()) {
        copy(p.tma_do.with(*pipeline_do.producer_get_barrier(write_do)), tdOgdO(_, _, _, m_block),
             tdOsdO(_, _, _, write_do.index()));
      }
      ++write_do;
    }
  }

  // -------------------------------------------------------------- lse_loader
  // Algorithm 3, line 6's LSE_i and D_i, in a circular buffer of their own
  // (as many stages as Q_i's): a second producer warp, because they are the
  // preprocess's, which runs beside this kernel (bwd/preprocess.h). It waits
  // until the preprocess has done this head's rows (D, LSE and the dQ
  // accumulator cleared), a packed sequence's own rows only; the consumers'
  // work, and so the dq_writer's, follows its loads.
  // (Waiting in the producer's warp, which holds the loads' state in 24
  // registers, made ptxas spill a consumer register at d = 64. The copies'
  // lane is elected where they are issued: given as a flag, it lost ptxas the
  // uniform addresses a bulk copy takes.)
  CUTE_DEVICE static void load_lse_d(Params const& p, SharedStorage& smem, PipelineLseD& pipeline, int head,
                                     int batch, QueryRange range) {
    if (cute::elect_one_sync()) {
      if constexpr (Traits::kPacked) {
        // The items that hold the query blocks' rows of the head.
        int64_t const begin = int64_t(smem.sequence[kFirstBlock] + range.m_block_min) * kBlockM;
        int64_t const end = int64_t(smem.sequence[kFirstBlock] + range.m_block_max) * kBlockM;
        for (int64_t row = begin / kPreprocessItemRows * kPreprocessItemRows; row < end; row += kPreprocessItemRows) {
          ReadyCounter const c = ready_counter(true, head, row, p.ready_items);
          wait_at_least(p.ready + c.index, c.count);
        }
      } else {
        ReadyCounter const c = ready_counter(false, batch * p.num_heads + head, 0, p.ready_items);
        wait_at_least(p.ready + c.index, c.count);
      }
      asm volatile("fence.proxy.async.global;" ::: "memory");  // read by bulk copies (async proxy)
    }
    __syncwarp();
    auto write = cutlass::make_producer_start_state<PipelineLseD>();
    for (int m_block = range.m_block_min; m_block < range.m_block_max; ++m_block) {
      int64_t const row0 = int64_t(row_tile(p, smem, batch, head, m_block)) * kBlockM;
      pipeline.producer_acquire(write);
      if (cute::elect_one_sync()) {
        auto* bar = pipeline.producer_get_barrier(write);
        int const at = write.index() * kBlockM;
        SM90_BULK_COPY_G2S::copy(p.lse_log2 + row0, bar, smem.lse_log2.data() + at, kBlockM * sizeof(float));
        SM90_BULK_COPY_G2S::copy(p.dpsum + row0, bar, smem.dpsum.data() + at, kBlockM * sizeof(float));
      }
      ++write;
    }
  }

  // --------------------------------------------------------------- dq_writer
  // At d = 256 the consumers add dQ_i to global memory themselves, with
  // vector atomics, unless the order must be fixed: the round trip through
  // shared memory (64 KB written, 64 KB read by TMA per block) competes with
  // the SS GEMMs for its bandwidth.
  CUTE_DEVICE static bool consumers_add_dq(Params const& p) { return Traits::kdQAtomic && !p.deterministic; }

  // Each dQ tile counts the key blocks that have added to it (count_in),
  // where the counts serve (BwdTraits::counts_arrivals): deterministic mode
  // adds in turns, key block by key block (deterministic_turn), each waiting
  // for the count to reach its turn (which no later key block can pass
  // before it); the postprocess converts the tile once all have.
  CUTE_DEVICE static bool counts_arrivals(Params const& p) { return Traits::counts_arrivals(p.deterministic); }
  CUTE_DEVICE static void wait_turn(int* arrivals, int turn) {
    wait_at_least(arrivals, turn);
    asm volatile("fence.proxy.async.global;" ::: "memory");  // then the reduce-add (async proxy)
  }
  // The TMA reduce-adds issued so far, all but the newest kPending bulk
  // groups, have completed (not only read shared memory), ordered before
  // what follows.
  template <int kPending>
  CUTE_DEVICE static void wait_adds() {
    asm volatile("cp.async.bulk.wait_group %0;" ::"n"(kPending) : "memory");
    asm volatile("fence.proxy.async.global;" ::: "memory");
  }

  // The key blocks that visit query block m are first_key_block(m) ..
  // last_key_block(m). Without the mask they go in that order (from 0); with
  // it, from the last down, which is the order in which a masked launch
  // reaches m (key block j starts at its diagonal, where it is the last). Either way a CTA waits
  // only on CTAs launched before it (see Kernel::key_block), never on one
  // that may not be resident yet.
  CUTE_DEVICE static int deterministic_turn(Params const& p, SharedStorage const& smem, int m_block, int n_block) {
    if constexpr (!Traits::kCausal) return n_block;
    return mask_policy(p, smem).last_key_block(m_block, kBlockM, kBlockN) - n_block;
  }

  // Algorithm 3, line 14's accumulation, off the consumers' path: each dQ_i
  // the consumers leave in shared memory is added to the global fp32
  // accumulator with one TMA reduce-add per chunk, and counted in where the
  // counts serve (counts_arrivals). Where the consumers add dQ_i themselves,
  // they pass a token per query block once their atomics are issued, and this
  // warp counts those in.
  CUTE_DEVICE static void write_dq(Params const& p, SharedStorage& smem, PipelinedQ& pipeline_dq, int n_block,
                                   int head, int batch, QueryRange range, int lane) {
    Tensor mdQ = p.tma_dq.get_tma_tensor(make_shape(_256{}, Int<Traits::kdQRows>{}, p.dq_tiles * Traits::kdQChunks));
    Tensor sdQ = make_tensor(make_smem_ptr(smem.dq.data()), typename Traits::SmemLayoutdQ{});
    auto tma_dq = p.tma_dq.get_slice(_0{});
    PipelinedQState read;
    if (consumers_add_dq(p)) {
      if (!counts_arrivals(p)) return;
      for (int m_block = range.m_block_min; m_block < range.m_block_max; ++m_block) {
        pipeline_dq.consumer_wait(read);
        pipeline_dq.consumer_release(read);
        ++read;
        if (lane == 0) count_in(p.dq_arrivals + row_tile(p, smem, batch, head, m_block));
      }
      return;
    }
    // The accumulator's zeros (the preprocess's, which the lse_loader waited
    // for) before the reduce-adds (async proxy).
    if (lane == 0) asm volatile("fence.proxy.async.global;" ::: "memory");
    // Without turns to pass, a tile is counted in once the next one's adds
    // are issued, so that waiting for its own to complete costs nothing.
    int late = -1;
    for (int m_block = range.m_block_min; m_block < range.m_block_max; ++m_block) {
      int const tile = row_tile(p, smem, batch, head, m_block);
      int const turn = deterministic_turn(p, smem, m_block, n_block);
      CUTE_UNROLL
      for (int chunk = 0; chunk < Traits::kdQChunks; ++chunk) {
        pipeline_dq.consumer_wait(read);
        if (lane == 0) {
          if (p.deterministic && chunk == 0) wait_turn(p.dq_arrivals + tile, turn);
          copy(p.tma_dq, tma_dq.partition_S(sdQ), tma_dq.partition_D(mdQ(_, _, tile * Traits::kdQChunks + chunk)));
          tma_store_arrive();
          tma_store_wait<0>();  // the buffer has been read
        }
        __syncwarp();
        pipeline_dq.consumer_release(read);
        ++read;
      }
      if (lane == 0 && p.deterministic) {
        wait_adds<0>();  // the adds complete, released with the count: the next turn
        count_in(p.dq_arrivals + tile);
      } else if (lane == 0 && late >= 0) {
        wait_adds<Traits::kdQChunks>();
        count_in(p.dq_arrivals + late);
      }
      if (counts_arrivals(p)) late = tile;
    }
    if (lane == 0 && !p.deterministic && late >= 0) {
      wait_adds<0>();
      count_in(p.dq_arrivals + late);
    }
  }

  // --------------------------------------------------------------- consumer
  // Packed sequences: rows of a loaded tile from `first` on lie past the
  // sequence's rows that take part (past seqused, the next sequence's, or
  // no sequence's), where a fixed-length batch's TMA bounds load zeros.
  // Zeroed in shared memory before the GEMMs read them, they add nothing to
  // dK, dV or dQ, whatever they held (NaN included).
  // Each thread clears 16-byte vectors (8 columns, which the swizzle keeps
  // together) kNumConsumerThreads apart: a fixed count of predicated
  // stores. The thread's index is read afresh (volatile), so that ptxas
  // cannot hoist the stores' addresses out of the mainloop into registers
  // held across it (they spilled).
  template <class SmemTensor>
  CUTE_DEVICE static void zero_rows_from(SmemTensor&& s, int first) {
    constexpr int kVecs = decltype(size<1>(s))::value / 8;  // 16-byte vectors a row
    constexpr int kVectors = decltype(size<0>(s))::value * kVecs;
    uint32_t tid;
    asm volatile("mov.u32 %0, %%tid.x;" : "=r"(tid));
    int const thread_idx = int(tid) - cutlass::NumThreadsPerWarpGroup;  // consumers from 0
    if constexpr (kNumConsumerThreads % kVecs == 0) {
      // A thread's vectors in one column, rows kRowStep apart.
      constexpr int kRows = kVectors / kVecs, kRowStep = kNumConsumerThreads / kVecs;
      int const row = thread_idx / kVecs, col = thread_idx % kVecs * 8;
      CUTE_UNROLL
      for (int j = 0; j < (kRows + kRowStep - 1) / kRowStep; ++j) {
        int const r = row + j * kRowStep;
        if (r < kRows && r >= first) *reinterpret_cast<uint4*>(&s(r, col)) = make_uint4(0, 0, 0, 0);
      }
    } else {
      CUTE_UNROLL
      for (int j = 0; j < (kVectors + kNumConsumerThreads - 1) / kNumConsumerThreads; ++j) {
        int const i = thread_idx + j * kNumConsumerThreads;
        if (i < kVectors && i / kVecs >= first) {
          *reinterpret_cast<uint4*>(&s(i / kVecs, i % kVecs * 8)) = make_uint4(0, 0, 0, 0);
        }
      }
    }
  }
  // The zeros (generic proxy) before either warpgroup's GEMMs read them (async proxy).
  CUTE_DEVICE static void rows_zeroed() {
    cutlass::arch::fence_view_async_shared();
    cutlass::arch::NamedBarrier::sync(kNumConsumerThreads, uint32_t(Barrier::kRowsZeroed));
  }

  // The keys' operand of S (S^T), dP, dK and dV is the GEMM's A (the keys are
  // the accumulator's rows) unless the queries are the rows (bwd/traits.h);
  // the other operand (Q_i, dO_i, or their transposes) is then A.
  template <class ThrMma, class SmemTensor>
  CUTE_DEVICE static auto keys_operand(ThrMma const& thr_mma, SmemTensor const& s) {
    if constexpr (Traits::kQueriesOnRows) return thr_mma.partition_fragment_B(s);
    else return thr_mma.partition_fragment_A(s);
  }
  template <class ThrMma, class SmemTensor>
  CUTE_DEVICE static auto other_operand(ThrMma const& thr_mma, SmemTensor const& s) {
    if constexpr (Traits::kQueriesOnRows) return thr_mma.partition_fragment_A(s);
    else return thr_mma.partition_fragment_B(s);
  }
  template <bool kZeroInit, class TiledMma, class TensorKeys, class TensorOther, class TensorC>
  CUTE_DEVICE static void keys_gemm(TiledMma& tiled_mma, TensorKeys const& keys, TensorOther const& other,
                                    TensorC& c) {
    if constexpr (Traits::kQueriesOnRows) warpgroup_gemm<kZeroInit>(tiled_mma, other, keys, c);
    else warpgroup_gemm<kZeroInit>(tiled_mma, keys, other, c);
  }

  // Algorithm 3, lines 7-15 for every query block, dK_j and dV_j accumulated
  // in registers. thread_idx counts the consumer threads from 0.
  template <class FragdK, class FragdV>
  CUTE_DEVICE static void mma(Params const& p, SharedStorage& smem, PipelineQ& pipeline_q, PipelinedO& pipeline_do,
                              PipelineLseD& pipeline_lse, PipelinedQ& pipeline_dq, FragdK& tdKrdK, FragdV& tdVrdV,
                              int n_block, int head, int batch, QueryRange range, int thread_idx) {
    constexpr bool kSplitHeadDim = Traits::kSplitHeadDim;
    typename Traits::TiledMmaSdP tiled_mma_sdp;
    typename Traits::TiledMmadK tiled_mma_dk;
    typename Traits::TiledMmadV tiled_mma_dv;
    typename Traits::TiledMmadQ tiled_mma_dq;
    auto thr_mma_sdp = tiled_mma_sdp.get_thread_slice(thread_idx);
    auto thr_mma_dk = tiled_mma_dk.get_thread_slice(thread_idx);
    auto thr_mma_dv = tiled_mma_dv.get_thread_slice(thread_idx);
    auto thr_mma_dq = tiled_mma_dq.get_thread_slice(thread_idx);

    Tensor sQ = make_tensor(make_smem_ptr(smem.q.data()), typename Traits::SmemLayoutQ{});
    Tensor sQt = make_tensor(make_smem_ptr(smem.q.data()), typename Traits::SmemLayoutQt{});
    Tensor sdO = make_tensor(make_smem_ptr(smem.dout.data()), typename Traits::SmemLayoutdO{});
    Tensor sdOt = make_tensor(make_smem_ptr(smem.dout.data()), typename Traits::SmemLayoutdOt{});
    Tensor sK = make_tensor(make_smem_ptr(smem.k.data()), typename Traits::SmemLayoutK{});
    Tensor sKt = make_tensor(make_smem_ptr(smem.k.data()), typename Traits::SmemLayoutKt{});
    Tensor sV = make_tensor(make_smem_ptr(smem.v.data()), typename Traits::SmemLayoutV{});
    Tensor sdS = make_tensor(make_smem_ptr(smem.ds.data()), typename Traits::SmemLayoutdS{});
    Tensor sdSt = make_tensor(make_smem_ptr(smem.ds.data()), typename Traits::SmemLayoutdSt{});
    Tensor sPt = make_tensor(make_smem_ptr(smem.p.data()), typename Traits::SmemLayoutdSt{});

    Tensor tSrK = keys_operand(thr_mma_sdp, sK);
    Tensor tSrQ = other_operand(thr_mma_sdp, sQ);  // (MMA, MMA_M or MMA_N, MMA_K, stages)
    Tensor tdPrV = keys_operand(thr_mma_sdp, sV);
    Tensor tdPrdO = other_operand(thr_mma_sdp, sdO);
    Tensor tdVrdO = other_operand(thr_mma_dv, sdOt);
    Tensor tdKrQ = other_operand(thr_mma_dk, sQt);
    Tensor tdQrdS = thr_mma_dq.partition_fragment_A(sdS);  // (MMA, MMA_M, MMA_K, buffers)
    // K^T in the dQ GEMM's column parts: (MMA, MMA_N, MMA_K, parts).
    using DqPartShape = Shape<typename Traits::M, Int<kHeadDim / Traits::kdQParts>>;
    Tensor tdQrK = thr_mma_dq.partition_fragment_B(
        local_tile(sKt, Shape<Int<kHeadDim / Traits::kdQParts>, typename Traits::N>{}, make_coord(_, _0{})));
    // P and dS to shared memory with stmatrix (the query mode is contiguous).
    auto r2s = make_tiled_copy_C(Copy_Atom<typename Traits::StoreAtomPdS, Element>{}, tiled_mma_sdp);
    auto thr_r2s = r2s.get_thread_slice(thread_idx);
    Tensor tdSsdS = thr_r2s.partition_D(
        make_tensor(make_smem_ptr(smem.ds.data()), typename Traits::SmemLayoutPdSAcc{}));  // (R2S, .., .., buffers)
    Tensor tPsP = thr_r2s.partition_D(make_tensor(make_smem_ptr(smem.p.data()), typename Traits::SmemLayoutPdSAcc{}));

    // Each S (S^T) element's (key, query) within the tile, for the mask and
    // to find the query's LSE and D.
    Tensor coords =
        thr_mma_sdp.partition_C(keys_first_identity<Traits>(select<0, 1>(typename Traits::TileShapeSdP{})));
    using MaskT = Mask<Traits::kCausal, kBlockM, kBlockN>;
    // A window's left edge: the query blocks from this one on need the mask too.
    int const masked_from = Traits::kCausal
                                ? mask_policy(p, smem).query_blocks_masked_from(range, n_block, kBlockM, kBlockN)
                                : range.m_block_max;
    bool const last_partial = (n_block + 1) * kBlockN > (Traits::kPacked ? smem.sequence[kSeqK] : p.seqlen_k);

    typename PipelineQ::PipelineState read_q;
    typename PipelinedO::PipelineState read_do;
    auto write_dq = cutlass::make_producer_start_state<PipelinedQ>();
    smem.barrier_kv.wait(0);
    if constexpr (Traits::kPacked) {
      int const keys = smem.sequence[kSeqK] - n_block * kBlockN;
      if (!range.empty() && keys < kBlockN) {
        zero_rows_from(sK, keys);
        zero_rows_from(sV, keys);
        rows_zeroed();
      }
    }
    int buffer = 0;
    // Part `part` of dQ_i's registers (bwd/traits.h, kdQParts) out: added to
    // the global accumulator, or through shared memory for the dq_writer,
    // chunk by chunk, each once it has read the last.
    auto add_dq = [&](auto const& acc, int part, int m_block, PipelinedQState& write) {
      constexpr int kRegisters = decltype(size(acc))::value;
      int const first = part * kRegisters;
      if (consumers_add_dq(p)) {
        float* dq = p.dq_accum + int64_t(row_tile(p, smem, batch, head, m_block)) * Traits::kdQElements;
        CUTE_UNROLL
        for (int i = 0; i < kRegisters; i += 4) {
          atomicAdd(reinterpret_cast<float4*>(dq + fragment_offset(thread_idx, first + i, kNumConsumerThreads)),
                    make_float4(acc(i), acc(i + 1), acc(i + 2), acc(i + 3)));
        }
      } else {
        constexpr int kChunk = kRegisters * Traits::kdQParts / Traits::kdQChunks;
        static_assert(kRegisters % kChunk == 0 && kChunk % 4 == 0);
        CUTE_UNROLL
        for (int chunk = 0; chunk < kRegisters / kChunk; ++chunk) {
          pipeline_dq.producer_acquire(write);
          CUTE_UNROLL
          for (int i = 0; i < kChunk; i += 4) {
            int const r = chunk * kChunk + i;
            *reinterpret_cast<float4*>(smem.dq.data() + fragment_offset(thread_idx, i, kNumConsumerThreads)) =
                make_float4(acc(r), acc(r + 1), acc(r + 2), acc(r + 3));
          }
          cutlass::arch::fence_view_async_shared();  // read by the TMA reduce-add (async proxy)
          pipeline_dq.producer_commit(write);
          ++write;
        }
      }
    };
    // P^T or dS^T to its shared-memory buffer, for the GEMMs that need both
    // warpgroups' halves.
    auto share = [&](auto const& r, auto const& t_smem, Barrier ready) {
      copy(r2s, thr_r2s.retile_S(r), t_smem(_, _, _, buffer));
      cutlass::arch::fence_view_async_shared();  // generic-proxy stores, read by WGMMA (async proxy)
      cutlass::arch::NamedBarrier::sync(kNumConsumerThreads, uint32_t(ready));
    };
    // The keys' operand of the dV (dK) GEMM: P^T (dS^T) in registers, or with
    // the head dim split from shared memory (each warpgroup needs every query's column).
    auto dkv_operand = [&](auto const& thr_mma, auto& r, auto const& s_t) {
      if constexpr (kSplitHeadDim) {
        return keys_operand(thr_mma, s_t)(_, _, _, buffer);
      } else {
        return make_tensor(r.data(), accumulator_as_operand_a(r.layout()));
      }
    };
    for (int m_block = range.m_block_min; m_block < range.m_block_max; ++m_block) {
      // Lines 8 and 10: S^T = K Q_i^T and dP^T = V dO_i^T (or S and dP),
      // issued together.
      pipeline_q.consumer_wait(read_q);
      int const stage_q = read_q.index();
      if constexpr (Traits::kPacked) {
        int const rows = smem.sequence[kSeqQ] - m_block * kBlockM;
        if (rows < kBlockM) {
          pipeline_do.consumer_wait(read_do);
          zero_rows_from(sQ(_, _, stage_q), rows);
          zero_rows_from(sdO(_, _, read_do.index()), rows);
          rows_zeroed();
        }
      }
      Tensor tSrS = partition_fragment_C(tiled_mma_sdp, select<0, 1>(typename Traits::TileShapeSdP{}));
      Tensor tdPrdP = partition_fragment_C(tiled_mma_sdp, select<0, 1>(typename Traits::TileShapeSdP{}));
      keys_gemm</*kZeroInit=*/true>(tiled_mma_sdp, tSrK, tSrQ(_, _, _, stage_q), tSrS);
      pipeline_do.consumer_wait(read_do);
      int const stage_do = read_do.index();
      keys_gemm</*kZeroInit=*/true>(tiled_mma_sdp, tdPrV, tdPrdO(_, _, _, stage_do), tdPrdP);
      // LSE_i and D_i, in the stage of Q_i's number. (Waited for after S's
      // GEMM, the wait kept ptxas from reading LSE_i ahead of it.)
      pipeline_lse.consumer_wait(read_q);

      // Line 9: P = exp(S - L), with the mask on the blocks that need it,
      // while dP's GEMM runs.
      warpgroup_wait<1>();
      // Softcapping comes before the mask, whose -inf it would undo; its
      // slope 1 - t^2 is for dS (common/softcap.h).
      constexpr bool softcap = Traits::kSoftcap;
      SoftcapSlopes<decltype(size(tSrS))::value, Traits::kSoftcapSlopesKept> slopes;
      if constexpr (softcap) {
        softcap_scores(tSrS, p.softcap.pre);
        slopes.keep(tSrS);
      }
      if (last_partial || m_block < range.m_block_mask || m_block >= masked_from) {
        MaskT::apply(mask_policy(p, smem), tSrS, coords, m_block, n_block);
      }
      float const* lse_log2 = smem.lse_log2.data() + stage_q * kBlockM;
      float const* dpsum = smem.dpsum.data() + stage_q * kBlockM;
      float const scale_log2 = softcap ? p.softcap.scale_log2 : p.scale_log2;
      CUTE_UNROLL
      for (int i = 0; i < size(tSrS); ++i) {
        tSrS(i) = exp2f(fmaf(tSrS(i), scale_log2, -lse_log2[get<1>(coords(i))]));
      }

      // Line 12: dV += P^T dO_i.
      Tensor rP = convert_fragment<Element>(tSrS);
      if constexpr (kSplitHeadDim) share(rP, tPsP, Barrier::kPReady);
      keys_gemm</*kZeroInit=*/false>(tiled_mma_dv, dkv_operand(thr_mma_dv, rP, sPt), tdVrdO(_, _, _, stage_do),
                                     tdVrdV);

      // Line 11: dS = P o (dP - D), while dV's GEMM runs.
      // With softcapping times its slope.
      warpgroup_wait<1>();
      auto p_at = [&](int i) { return Traits::kdSFromRoundedP ? float(rP(i)) : tSrS(i); };
      if constexpr (softcap) {
        CUTE_UNROLL
        for (int i = 0; i < size(tdPrdP); ++i) {
          int const row = get<1>(coords(i));
          tdPrdP(i) = p_at(i) * (tdPrdP(i) - dpsum[row]) * slopes(i, p_at(i), lse_log2[row], p.softcap);
        }
      } else {
        CUTE_UNROLL
        for (int i = 0; i < size(tdPrdP); ++i) tdPrdP(i) = p_at(i) * (tdPrdP(i) - dpsum[get<1>(coords(i))]);
      }

      // dS^T (dS) to shared memory for the dQ GEMM, which needs all keys.
      Tensor rdS = convert_fragment<Element>(tdPrdP);
      share(rdS, tdSsdS, Barrier::kdSReady);

      // Line 14: dQ_i = dS K, then line 13: dK += dS^T Q_i. dQ_i goes out
      // while dK's GEMM runs. A single dO stage is freed once dQ's (first)
      // GEMM is done, dV's before it, so that dO_{i+1} loads during dQ_i, dK_i
      // and S_{i+1}; with two, at the end (faster where two fit). At d = 256
      // dQ_i's registers do not fit beside dK^T's and dV^T's: its second half
      // of columns is computed once the first has left.
      int const ds_buffer = buffer;
      auto dq_gemm = [&](int part) {
        Tensor acc = partition_fragment_C(tiled_mma_dq, DqPartShape{});
        warpgroup_gemm</*kZeroInit=*/true>(tiled_mma_dq, tdQrdS(_, _, _, ds_buffer), tdQrK(_, _, _, part), acc);
        return acc;
      };
      Tensor tdQrdQ = dq_gemm(0);
      keys_gemm</*kZeroInit=*/false>(tiled_mma_dk, dkv_operand(thr_mma_dk, rdS, sdSt), tdKrQ(_, _, _, stage_q),
                                     tdKrdK);
      buffer ^= 1;
      warpgroup_wait<1>();
      if constexpr (Traits::kStagesdO == 1) pipeline_do.consumer_release(read_do);
      add_dq(tdQrdQ, 0, m_block, write_dq);
      CUTE_UNROLL
      for (int part = 1; part < Traits::kdQParts; ++part) {
        Tensor tdQrdQ_part = dq_gemm(part);
        warpgroup_wait<0>();
        add_dq(tdQrdQ_part, part, m_block, write_dq);
      }
      if (consumers_add_dq(p) && counts_arrivals(p)) {  // a token: dQ_i's atomics are issued, for write_dq
        pipeline_dq.producer_acquire(write_dq);
        pipeline_dq.producer_commit(write_dq);
        ++write_dq;
      }
      warpgroup_wait<0>();
      if constexpr (Traits::kStagesdO > 1) pipeline_do.consumer_release(read_do);
      ++read_do;
      pipeline_q.consumer_release(read_q);  // Q_i is read
      pipeline_lse.consumer_release(read_q);
      ++read_q;
    }
  }
};

}  // namespace flash3::bwd
