// The forward mainloop: the producer's TMA loads (Algorithm 1, lines 4-10) and
// the consumer warpgroups' GEMMs and softmax (Algorithm 2, or Algorithm 1's
// lines 13-23 when the intra-warpgroup overlap is switched off).
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/pipeline/pipeline.hpp>
#include <type_traits>

#include "common/layout.h"
#include "common/scale_view.h"
#include "common/softcap.h"
#include "common/kv_cache.h"
#include "common/varlen_tiles.h"
#include "common/tile_order.h"
#include "fwd/block_range.h"
#include "fwd/descale.h"
#include "fwd/kv_boxes.h"
#include "fwd/kv_split.h"
#include "fwd/mask.h"
#include "fwd/softmax.h"
#include "fwd/traits.h"

namespace flash3::fwd {

// What a consumer warpgroup does with the previous tile's O before this
// tile's first PV GEMM, once: store it (FwdTraits::kDeferEpilogue), then
// clear O. It runs right after the warpgroup has issued the tile's first
// QK^T, so that the GEMM runs on the tensor cores meanwhile; on
// entering the tile where it issues none (no key block for its rows), or
// without the intra-warpgroup overlap. The deferred epilogue waits for no
// other warpgroup, so the pingpong's offset between them survives it.
template <class Fn>
struct DeferredEpilogue {
  Fn& fn;
  bool pending = true;
  CUTE_DEVICE void operator()() {
    if (pending) {
      pending = false;
      fn();
    }
  }
};

template <class Traits_>
struct Mainloop {
  using Traits = Traits_;
  using Element = typename Traits::Element;
  static constexpr int kHeadDim = Traits::kHeadDim;
  static constexpr int kBlockM = Traits::kBlockM;
  static constexpr int kBlockN = Traits::kBlockN;
  static constexpr int kNumConsumerThreads = Traits::kNumConsumerThreads;
  using TileShapeQK = typename Traits::TileShapeQK;
  using SmemLayoutQ = typename Traits::SmemLayoutQ;
  using SmemLayoutK = typename Traits::SmemLayoutK;
  using SmemLayoutV = typename Traits::SmemLayoutV;
  using SmemLayoutVt = typename Traits::SmemLayoutVt;
  using PipelineQ = typename Traits::PipelineQ;
  using QState = typename PipelineQ::PipelineState;
  using PipelineK = typename Traits::PipelineK;
  using PipelineV = typename Traits::PipelineV;
  using PipelineState = typename PipelineK::PipelineState;
  using SharedStorage = typename Traits::SharedStorage;

  using GmemShape = typename Traits::GmemShape;
  using GmemTensor = typename Traits::template GmemTensor<Element const>;
  using GmemTensorV = typename Traits::template GmemTensor<Element const, Traits::kHeadDimV>;
  using TileShapeV = Shape<Int<kBlockN>, Int<Traits::kHeadDimV>>;  // a block of V: (N, dv)
  using TmaQ = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, take<0, 2>(SmemLayoutQ{}),
                                      select<0, 2>(TileShapeQK{}), _1{}));
  using TmaK = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, take<0, 2>(SmemLayoutK{}),
                                      select<1, 2>(TileShapeQK{}), _1{}));
  using TmaV = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensorV{}, take<0, 2>(SmemLayoutV{}), TileShapeV{}, _1{}));

  // A paged cache's K and V blocks load as boxes of kBoxRows rows
  // (fwd/kv_boxes.h) from the page pool viewed as (page_size, d, heads,
  // pages), each box the stage's layout at an offset (checked below).
  using SmemLayoutKBox = BoxLayout<decltype(take<0, 2>(SmemLayoutK{})), kHeadDim>;
  using SmemLayoutVBox = BoxLayout<decltype(take<0, 2>(SmemLayoutV{})), Traits::kHeadDimV>;
  struct NoBoxes {};
  using TmaKBox = std::conditional_t<Traits::kKvCache,
                                     decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, SmemLayoutKBox{},
                                                            BoxShape<kHeadDim>{}, _1{})),
                                     NoBoxes>;
  using TmaVBox = std::conditional_t<Traits::kKvCache,
                                     decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensorV{}, SmemLayoutVBox{},
                                                            BoxShape<Traits::kHeadDimV>{}, _1{})),
                                     NoBoxes>;
  static_assert(!Traits::kKvCache ||
                    (boxes_are_shifted_copies<decltype(take<0, 2>(SmemLayoutK{})), kHeadDim, kBlockN>() &&
                     boxes_are_shifted_copies<decltype(take<0, 2>(SmemLayoutV{})), Traits::kHeadDimV, kBlockN>()),
                "a paged cache's boxes are not the stage's layout at an offset");
  template <class Box, class Layout, int kDim, class G>
  static Box box_tma(G const& g) {
    if constexpr (Traits::kKvCache) {
      return make_tma_copy(SM90_TMA_LOAD{}, g, Layout{}, BoxShape<kDim>{}, _1{});
    } else {
      return {};
    }
  }

  // Bytes of one TMA load of Q, of a K block and of a V block.
  static constexpr uint32_t kQBytes = kBlockM * kHeadDim * sizeof(Element);
  static constexpr uint32_t kKBytes = kBlockN * kHeadDim * sizeof(Element);
  static constexpr uint32_t kVBytes = kBlockN * Traits::kHeadDimV * sizeof(Element);

  // FP8's descale factors, a policy of the consumer mainloop.
  using Descale = std::conditional_t<Traits::kFp8, Fp8Descale<Mainloop>, NoDescale>;

  struct Params {
    TmaQ tma_q;
    TmaK tma_k;
    TmaV tma_v;
    TmaKBox tma_k_box;  // a KV cache's: a paged cache's boxes
    TmaVBox tma_v_box;
    GmemShape shape_q;
    GmemShape shape_k;
    int head_group;  // heads_q / heads_kv: query heads sharing one K/V head
    int seqlen_q;      // packed sequences: the longest's
    int seqlen_k;
    SequenceLengths lengths;  // packed sequences (varlen), or none
    KvCacheMap cache;         // a KV cache's entries, or none
    int num_splits;           // split-KV: runs of each tile's key blocks (1 without)
    int row_offset;    // rows above the sequence in the first tile (tile_first_row)
    int window_left;   // the call's Window (the masked kernel's only)
    int window_right;
    float scale_log2;  // softmax_scale * log2(e)
    Softcap softcap;   // common/softcap.h; off by default
    // FP8's descale factors, per (batch, head, block) of Q (block M) and of
    // K and V (block N).
    ScaleView q_scale;
    ScaleView k_scale;
    ScaleView v_scale;

    // A batch entry's sequence: its lengths, and where its rows start in
    // the packed tensors (0 for fixed-length batches, whose entries are
    // TMA's batch coordinate instead); a KV cache's keys start at the
    // entry's leftpad in the cache row it reads (kv_batch).
    CUTE_DEVICE int seq_q(int batch) const { return Traits::kPacked ? lengths.q(batch) : seqlen_q; }
    CUTE_DEVICE int seq_k(int batch) const {
      if constexpr (Traits::kKvCache) return cache.keys(batch);
      return Traits::kPacked ? lengths.k(batch) : seqlen_k;
    }
    CUTE_DEVICE int first_q(int batch) const { return Traits::kPacked ? lengths.cu_seqlens_q[batch] : 0; }
    CUTE_DEVICE int first_k(int batch) const {
      if constexpr (Traits::kKvCache) return cache.first_key(batch);
      return Traits::kPacked ? lengths.cu_seqlens_k[batch] : 0;
    }
    CUTE_DEVICE int kv_batch(int batch) const {
      if constexpr (Traits::kKvCache) return cache.kv_batch(batch);
      return Traits::kPacked ? 0 : batch;
    }

    // The mask policy of a batch entry's tiles: the causal mask's at compile
    // time, or a window's from the call's bounds (read from the parameters
    // where used, not held in registers).
    CUTE_DEVICE MaskPolicy mask_policy(int batch) const { return policy_of(seq_q(batch), seq_k(batch)); }
    CUTE_DEVICE MaskPolicy policy_of(int sq, int sk) const {
      if constexpr (Traits::kWindow) return MaskPolicy{sq, sk, false, window_left, window_right};
      return MaskPolicy{sq, sk, Traits::kCausal};
    }
  };

  static Params make_params(GmemTensor const& q, GmemTensor const& k, GmemTensorV const& v, int head_group,
                            int seqlen_q, int seqlen_k, SequenceLengths lengths, int row_offset, Window window,
                            float softmax_scale, Softcap softcap, ScaleView q_scale = {}, ScaleView k_scale = {},
                            ScaleView v_scale = {}, KvCacheMap cache = {}, int num_splits = 1) {
    return {make_tma_copy(SM90_TMA_LOAD{}, q, take<0, 2>(SmemLayoutQ{}), select<0, 2>(TileShapeQK{}), _1{}),
            make_tma_copy(SM90_TMA_LOAD{}, k, take<0, 2>(SmemLayoutK{}), select<1, 2>(TileShapeQK{}), _1{}),
            make_tma_copy(SM90_TMA_LOAD{}, v, take<0, 2>(SmemLayoutV{}), TileShapeV{}, _1{}),
            box_tma<TmaKBox, SmemLayoutKBox, kHeadDim>(k),
            box_tma<TmaVBox, SmemLayoutVBox, Traits::kHeadDimV>(v),
            q.shape(),
            k.shape(),
            head_group,
            seqlen_q,
            seqlen_k,
            lengths,
            cache,
            num_splits,
            row_offset,
            window.left,
            window.right,
            softmax_scale * float(M_LOG2E),
            softcap,
            q_scale,
            k_scale,
            v_scale};
  }

  CUTE_DEVICE static void prefetch_descriptors(Params const& p) {
    cute::prefetch_tma_descriptor(p.tma_q.get_tma_descriptor());
    cute::prefetch_tma_descriptor(p.tma_k.get_tma_descriptor());
    cute::prefetch_tma_descriptor(p.tma_v.get_tma_descriptor());
    if constexpr (Traits::kKvCache) {
      if (p.cache.paged()) {
        cute::prefetch_tma_descriptor(p.tma_k_box.get_tma_descriptor());
        cute::prefetch_tma_descriptor(p.tma_v_box.get_tma_descriptor());
      }
    }
  }

  // ---------------------------------------------------------------- producer
  // The TMA loads of one tile: Q into the next of its buffers, and K_j or
  // V_j into the next stage of their circular buffer (FP8: V into the buffer
  // the transpose reads). `leader` is the one thread that issues the copies.
  template <class PipelineVLoad>
  struct Loads {
    Params const& p;
    SharedStorage& smem;
    PipelineQ& pipeline_q;
    PipelineK& pipeline_k;
    PipelineVLoad& pipeline_v;
    QState& write_q;
    PipelineState& write_k;
    PipelineState& write_v;
    TileCoord tile;
    bool leader;
    int head_kv;

    CUTE_DEVICE Loads(Params const& p, SharedStorage& smem, PipelineQ& pipeline_q, PipelineK& pipeline_k,
                      PipelineVLoad& pipeline_v, QState& write_q, PipelineState& write_k, PipelineState& write_v,
                      TileCoord tile, bool leader)
        : p(p), smem(smem), pipeline_q(pipeline_q), pipeline_k(pipeline_k), pipeline_v(pipeline_v),
          write_q(write_q), write_k(write_k), write_v(write_v), tile(tile), leader(leader),
          head_kv(tile.head / p.head_group) {}

    // Waits for the buffer's last tile to be done with it (query_done).
    // pipeline_q has no leader: its arrive is issued here, after FP8's Q
    // descale and an entry's lengths are written, so that it publishes them
    // with Q's bytes.
    CUTE_DEVICE void q() const {
      pipeline_q.producer_acquire(write_q);
      if (leader) {
        // Rows above the sequence (a causal launch's first tile) load as
        // zeros; a packed sequence's last tile reads the next one's first
        // rows, whose outputs are not stored.
        Tensor mQ = [&] {
          if constexpr (Traits::kPacked) {
            return domain_offset(make_coord(p.first_q(tile.batch) - p.row_offset, _0{}),
                                 p.tma_q.get_tma_tensor(p.shape_q)(_, _, tile.head, 0));
          } else {
            return domain_offset(make_coord(-p.row_offset, _0{}),
                                 p.tma_q.get_tma_tensor(p.shape_q)(_, _, tile.head, tile.batch));
          }
        }();
        Tensor gQ = local_tile(mQ, select<0, 2>(TileShapeQK{}), make_coord(tile.m_block, _0{}));
        Tensor sQ = make_tensor(make_smem_ptr(smem.q.data()), SmemLayoutQ{});
        auto tma = p.tma_q.get_slice(_0{});
        if constexpr (Traits::kFp8) smem.q_descale[write_q.index()] = p.q_scale(tile.batch, tile.head, tile.m_block);
        if constexpr (Traits::kPerEntryLengths) {
          smem.sequence[write_q.index()][0] = p.seq_q(tile.batch);
          smem.sequence[write_q.index()][1] = p.seq_k(tile.batch);
        }
        auto* barrier = pipeline_q.producer_get_barrier(write_q);
        cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(barrier, kQBytes);
        copy(p.tma_q.with(*barrier), tma.partition_S(gQ), tma.partition_D(sQ)(_, _, _, write_q.index()));
      }
      ++write_q;
    }
    CUTE_DEVICE void k(int n_block) const {
      block(p.tma_k, p.tma_k_box, p.shape_k, smem.k.data(), SmemLayoutK{}, pipeline_k, write_k, n_block);
    }
    CUTE_DEVICE void v(int n_block) const {
      block(p.tma_v, p.tma_v_box, Traits::shape_v(p.shape_k), smem.v.data(), SmemLayoutV{}, pipeline_v, write_v,
            n_block);
    }

    // A block of K or V, of the head dim of `shape`: one load, or a paged
    // cache's block (its page read before the stage's wait: fwd/kv_boxes.h).
    template <class Tma, class TmaBox, class GShape, class Layout, class Pipeline>
    CUTE_DEVICE void block(Tma const& tma, TmaBox const& tma_box, GShape const& shape, Element* buffer, Layout layout,
                           Pipeline& pipeline, PipelineState& write, int n_block) const {
      bool paged = false;
      PagedBlock where{};
      if constexpr (Traits::kKvCache) {
        paged = p.cache.paged();
        if (paged && leader) where = paged_block<kBlockN>(p.cache, tile.batch, n_block * kBlockN);
      }
      pipeline.producer_acquire(write);
      if (leader) {
        if constexpr (Traits::kKvCache) {
          if (paged) {
            load_paged<kBlockN>(tma, tma_box, shape, buffer, layout, *pipeline.producer_get_barrier(write),
                                write.index(), p.cache, tile.batch, head_kv, n_block, where);
          }
        }
        if (!paged) whole(tma, shape, buffer, layout, *pipeline.producer_get_barrier(write), write.index(), n_block);
      }
      ++write;
    }

    template <class Tma, class GShape, class Layout, class Barrier>
    CUTE_DEVICE void whole(Tma const& tma, GShape const& shape, Element* buffer, Layout layout, Barrier& barrier,
                           int stage, int n_block) const {
      auto const tile_shape = make_shape(Int<kBlockN>{}, get<1>(shape));
      // A packed sequence's last block reads the next one's first keys,
      // a KV cache's the rows past its cache_seqlens, which the mask hides
      // (seq_k).
      Tensor g = [&] {
        if constexpr (Traits::kPacked || Traits::kKvCache) {
          return local_tile(domain_offset(make_coord(p.first_k(tile.batch), _0{}),
                                          tma.get_tma_tensor(shape)(_, _, head_kv, p.kv_batch(tile.batch))),
                            tile_shape, make_coord(n_block, _0{}));
        } else {
          return local_tile(tma.get_tma_tensor(shape)(_, _, head_kv, tile.batch), tile_shape,
                            make_coord(n_block, _0{}));
        }
      }();
      Tensor s = make_tensor(make_smem_ptr(buffer), layout);  // (N, d or dv, stages)
      auto slice = tma.get_slice(_0{});
      copy(tma.with(barrier), slice.partition_S(g), slice.partition_D(s)(_, _, _, stage));
    }
  };

  // Algorithm 1, lines 4-10, run by one warp of the producer warpgroup. Key
  // blocks are walked from the last to the first so that the masked blocks
  // come first (the consumer does the same).
  //
  // The kernel's next tile is claimed in two steps: claim() before the wait
  // for the stage of the tile's last block, ahead() after that block's
  // loads, which takes the claim's result and, with two Q buffers, loads
  // the next tile's Q. That is about kStages blocks and an epilogue before
  // the consumers need it, room for Q's DRAM latency; issued after the
  // claim's round trip and the next tile's first K, Q's load would stand
  // between the two tiles. A claim much earlier (at a tile's start) breaks
  // the longest-first balance of causal tiles, and ahead() before the last
  // block's loads delays them.
  template <class PipelineVLoad, class Claim, class Ahead>
  CUTE_DEVICE static void load(Loads<PipelineVLoad> const& loads, BlockRange range, Claim&& claim, Ahead&& ahead) {
    int const first = range.n_block_max - 1;
    if constexpr (Traits::kQStages == 1) {
      // K of the first block does not depend on Q's buffer: start it before
      // waiting for the consumers to free Q.
      if (!range.empty()) loads.k(first);
      loads.q();
    }
    if (first <= range.n_block_min) claim();  // one block or none
    for (int n_block = first; n_block >= range.n_block_min; --n_block) {
      if (Traits::kQStages > 1 || n_block != first) loads.k(n_block);
      loads.v(n_block);
      if (n_block == range.n_block_min + 1) claim();
    }
    ahead();
  }

  // Without warp specialization one consumer thread issues the same loads:
  // at the start of a tile Q and the first kStages K and kStages - 1 V
  // blocks; then, before Algorithm 2's iteration for block n, K_{n-S+1} and
  // V_{n-S+2}, each into the stage iteration n + 1 freed (its QK^T read K_{n+1},
  // its PV V_{n+2}). Waiting for a stage then never waits on this iteration.
  template <class PipelineVLoad>
  CUTE_DEVICE static void load_first_blocks(Loads<PipelineVLoad> const& loads, BlockRange range) {
    int const n = range.n_block_max - 1;
    if (!range.empty()) loads.k(n);
    loads.q();
    if (range.empty()) return;
    loads.v(n);
    for (int j = n - 1; j >= max(range.n_block_min, n - Traits::kStages + 1); --j) loads.k(j);
    for (int j = n - 1; j >= max(range.n_block_min, n - Traits::kStages + 2); --j) loads.v(j);
  }
  template <class PipelineVLoad>
  CUTE_DEVICE static void load_ahead(Loads<PipelineVLoad> const& loads, BlockRange range, int n_block) {
    if (n_block - Traits::kStages + 1 >= range.n_block_min) loads.k(n_block - Traits::kStages + 1);
    if (n_block - Traits::kStages + 2 >= range.n_block_min) loads.v(n_block - Traits::kStages + 2);
  }

  // --------------------------------------------------------------- consumer
  // Pingpong (§3.1): warpgroup w waits for its turn before issuing GEMMs and
  // passes the turn to the other warpgroup once they are issued, so one
  // warpgroup's softmax runs while the other's GEMMs occupy the tensor cores.
  // The turn goes round the warpgroups in order; each barrier joins the
  // warpgroup that waits and the one that passes.
  static constexpr int kTurnThreads = 2 * cutlass::NumThreadsPerWarpGroup;
  CUTE_DEVICE static void pingpong_wait_turn(int warp_group) {
    if constexpr (Traits::kPingpong) {
      cutlass::arch::NamedBarrier::sync(kTurnThreads, uint32_t(Barrier::kPingpongWG0) + warp_group);
    }
  }
  CUTE_DEVICE static void pingpong_pass_turn(int warp_group) {
    if constexpr (Traits::kPingpong) {
      // (The pair's form compiles to one instruction; other forms cost hdim
      // 256 causal a register, spilled in its mainloop.)
      constexpr int kRing = Traits::kNumConsumerWarpGroups;
      int const next = kRing == 2 ? 1 - warp_group : (warp_group + 1) % kRing;
      cutlass::arch::NamedBarrier::arrive(kTurnThreads, uint32_t(Barrier::kPingpongWG0) + next);
    }
  }
  // A turn with no GEMM to issue.
  CUTE_DEVICE static void pingpong_take_turn(int warp_group) {
    pingpong_wait_turn(warp_group);
    pingpong_pass_turn(warp_group);
  }
  // Warpgroup 0 goes first: the last one passes it the turn.
  CUTE_DEVICE static void pingpong_start(int warp_group) {
    if (warp_group == Traits::kNumConsumerWarpGroups - 1) pingpong_pass_turn(warp_group);
  }

  // O (un-normalised) and the softmax state for one tile. thread_idx counts
  // the consumer threads from 0. load_ahead(n) runs before the iteration for
  // key block n (the loads, without warp specialization). Returns the factor
  // O still needs besides 1 / l: FP8's V descale of the last block (O is
  // held in units of the descale of the block last added), else 1.
  template <class FragO, class Softmax, class LoadAhead, class Epilogue>
  CUTE_DEVICE static float mma(Params const& p, SharedStorage& smem, PipelineK& pipeline_k,
                              PipelineV& pipeline_v, PipelineState& read_k, PipelineState& read_v,
                              FragO& tOrO, Softmax& softmax, TileCoord tile, BlockRange range,
                              PipelineQ& pipeline_q, QState read_q, int thread_idx, LoadAhead&& load_ahead,
                              DeferredEpilogue<Epilogue>& previous_epilogue) {
    int const warp_group = thread_idx / cutlass::NumThreadsPerWarpGroup;
    if constexpr (!Traits::kIntraWGOverlap) previous_epilogue();
    // The mask policy inside the loop, from the parameters or, for packed
    // sequences and KV caches, the tile's lengths the producer published
    // with Q (read only between pipeline_q's wait and query_done).
    auto loop_mask_policy = [&] {
      if constexpr (Traits::kPerEntryLengths) {
        int const* lengths = smem.sequence[read_q.index()];
        return p.policy_of(lengths[0], lengths[1]);
      } else {
        return p.policy_of(p.seqlen_q, p.seqlen_k);
      }
    };
    if constexpr (Traits::kWarpSpecialized) {
      // The key blocks this warpgroup's own 64 rows see. A warpgroup whose
      // rows all lie outside the sequence (past seqlen_q in its last M-block,
      // or above it in a causal launch's first) or see no key sits the tile
      // out; with the causal mask, the first blocks of the walk (the
      // highest) can be all masked for the upper warpgroups' rows
      // (for warpgroup 0 of M-block m at head dim 256, one of 2m + 2), and
      // are passed by. (The warpgroup index is read afresh, warp-uniform:
      // derived from thread_idx it cost head dim 64 three spilled registers.
      // Without a producer, the ablation's kernel, the branch doubled the
      // mainloop's R2UR moves: that kernel keeps every warpgroup busy.)
      int const group = cutlass::canonical_warp_group_idx() - 1;
      BlockRange own =
          warpgroup_block_range(p.mask_policy(tile.batch), tile.m_block, kBlockM, group, kBlockN, p.row_offset);
      // Split-KV: `range` is the CTA's run of the tile's blocks; the rows
      // walk the part of their own range inside it.
      if constexpr (Traits::kSplit) own = within_split(own, range);
      if (own.empty()) {
        // Q's load is still waited for: with every warpgroup idle (a tile
        // whose rows all see no key) nothing else would, and the CTA could
        // exit while it is in flight.
        previous_epilogue();
        pipeline_q.consumer_wait(read_q);
        idle(pipeline_q, read_q, pipeline_k, pipeline_v, read_k, read_v, range, warp_group);
        return 1.f;
      }
      if constexpr (Traits::kCausal) {
        pass_blocks(pipeline_k, pipeline_v, read_k, read_v, range.n_block_max - own.n_block_max, warp_group);
        range.n_block_max = own.n_block_max;
      }
    }
    typename Traits::TiledMmaQK tiled_mma_qk;
    typename Traits::TiledMmaPV tiled_mma_pv;
    auto thr_mma_qk = tiled_mma_qk.get_thread_slice(thread_idx);
    auto thr_mma_pv = tiled_mma_pv.get_thread_slice(thread_idx);

    Tensor sQ = make_tensor(make_smem_ptr(smem.q.data()), SmemLayoutQ{});
    Tensor sK = make_tensor(make_smem_ptr(smem.k.data()), SmemLayoutK{});
    Tensor sVt = make_tensor(make_smem_ptr(smem_vt(smem)), SmemLayoutVt{});
    Tensor tSrQ = thr_mma_qk.partition_fragment_A(sQ);   // (MMA, MMA_M, MMA_K, stages)
    Tensor tSrK = thr_mma_qk.partition_fragment_B(sK);    // (MMA, MMA_N, MMA_K, stages)
    Tensor tOrV = thr_mma_pv.partition_fragment_B(sVt);   // (MMA, MMA_N, MMA_K, stages)

    Tensor tSrS = partition_fragment_C(tiled_mma_qk, select<0, 1>(TileShapeQK{}));
    auto operand_p = [](auto const& acc_s) {
      if constexpr (Traits::kFp8) {
        return accumulator_to_fp8_operand_a<Element>(acc_s);
      } else {
        return convert_fragment<Element>(make_tensor(acc_s.data(), accumulator_as_operand_a(acc_s.layout())));
      }
    };
    decltype(operand_p(tSrS)) tOrP;
    float o_scale[Softmax::kRowsPerThread];

    // FP8's descales (fwd/descale.h): S's per key block, O's rescale by V's.
    Descale descale(p, smem, tile, tile.head / p.head_group, read_q.index());
    // Whether the last softmax step moved a row max (warp-uniform): if not,
    // and no descale changes, O needs no rescale.
    bool max_moved = true;
    auto rescale_o = [&](BlockDescale next) {
      if (descale.fold(o_scale, next) || max_moved) rescale_rows(tOrO, o_scale);
    };

    using MaskT = Mask<Traits::kWindow, kBlockM, kBlockN, typename Traits::TiledMmaQK>;

    pipeline_q.consumer_wait(read_q);
    if (range.empty()) {
      previous_epilogue();
      query_done(pipeline_q, read_q);
      return 1.f;
    }

    auto qk_gemm = [&](auto& acc_s) {
      pipeline_k.consumer_wait(read_k);
      warpgroup_gemm</*kZeroInit=*/true>(tiled_mma_qk, tSrQ(_, _, _, read_q.index()), tSrK(_, _, _, read_k.index()),
                                         acc_s);
    };
    auto pv_gemm = [&]() {
      pipeline_v.consumer_wait(read_v);
      warpgroup_gemm</*kZeroInit=*/false>(tiled_mma_pv, tOrP, tOrV(_, _, _, read_v.index()), tOrO);
    };
    auto release_k = [&]() { pipeline_k.consumer_release(read_k); ++read_k; };
    auto release_v = [&]() { pipeline_v.consumer_release(read_v); ++read_v; };
    auto softmax_step = [&](auto& acc_s, int n_block, auto needs_mask, BlockDescale block) {
      // Softcapping comes before the mask, whose -inf it would undo (bf16
      // and fp16: the FP8 kernels, short of registers, have none).
      float scale_log2 = p.scale_log2 * block.qk;
      if (!Traits::kFp8 && p.softcap.on()) {
        softcap_scores(acc_s, p.softcap.pre * block.qk);
        scale_log2 = p.softcap.scale_log2;
      }
      // With three consumer warpgroups (160 registers) the mask's coordinates
      // come from a fresh thread index: hoisted out of the loop, they spilled
      // in head dim 64's causal kernel. With two they stay hoisted (10-25
      // fewer instructions per masked block).
      if constexpr (decltype(needs_mask)::value) {
        MaskT::apply(loop_mask_policy(), p.row_offset, acc_s, tile.m_block, n_block,
                     Traits::kNumConsumerWarpGroups == 3 ? Traits::consumer_thread_idx() : thread_idx);
      }
      max_moved = softmax.step(acc_s, o_scale, scale_log2);
    };
    auto to_operand = [&](auto const& acc_s) { tOrP = operand_p(acc_s); };

    int n_block = range.n_block_max - 1;
    int const n_block_mask = max(range.n_block_mask, range.n_block_min);
    // A window's left edge: the blocks below this one need the mask too
    // (the walk's last ones).
    auto masked_below = [&]() {
      if constexpr (!Traits::kWindow) return 0;
      int const last_row = tile_first_row(tile.m_block, kBlockM, p.row_offset) + kBlockM - 1;
      return p.mask_policy(tile.batch).key_blocks_masked_below(last_row, kBlockN);
    };
    int const n_block_unmasked_min = Traits::kWindow ? max(masked_below(), range.n_block_min) : range.n_block_min;

    if constexpr (Traits::kIntraWGOverlap) {
      // Algorithm 2, lines 3-6: S_cur = Q K_0^T, softmax.
      BlockDescale const first = descale.block(n_block);
      pingpong_wait_turn(warp_group);
      qk_gemm(tSrS);
      pingpong_pass_turn(warp_group);
      previous_epilogue();
      warpgroup_wait<0>();
      release_k();
      if (n_block >= n_block_mask || (Traits::kWindow && n_block < n_block_unmasked_min)) {
        softmax_step(tSrS, n_block, cute::true_type{}, first);
      } else {
        softmax_step(tSrS, n_block, cute::false_type{}, first);
      }
      to_operand(tSrS);
      descale.start(first);
      // Lines 7-17: S_next = Q K_j^T and O += P_cur V_{j-1} are issued
      // together; the softmax of S_next runs while O's GEMM is in flight.
      auto iteration = [&](int n, auto needs_mask) {
        Tensor tSrS_next = partition_fragment_C(tiled_mma_qk, select<0, 1>(TileShapeQK{}));
        BlockDescale const next = descale.block(n);
        load_ahead(n);
        pingpong_wait_turn(warp_group);
        qk_gemm(tSrS_next);
        pv_gemm();
        pingpong_pass_turn(warp_group);
        warpgroup_wait<1>();  // S_next is ready, O's GEMM may still run
        release_k();
        softmax_step(tSrS_next, n, needs_mask, next);
        warpgroup_wait<0>();
        release_v();
        rescale_o(next);
        to_operand(tSrS_next);
      };
      --n_block;
      // Without the causal mask only the first block can need one. FP8 leaves
      // the (then idle) masked loop out, which frees the registers head dim
      // 256's 96-key blocks need; BF16 keeps it: without it the compiler
      // schedules the head dim 256 mainloop worse.
      if constexpr (Traits::kWindow) {
        // The masked blocks at both ends of the walk (the window's left edge
        // below) in one loop, with the iteration inlined twice, not thrice.
        for (; n_block >= range.n_block_min; --n_block) {
          if (n_block >= n_block_mask || n_block < n_block_unmasked_min) {
            iteration(n_block, cute::true_type{});
          } else {
            iteration(n_block, cute::false_type{});
          }
        }
      } else {
        if constexpr (Traits::kCausal || !Traits::kFp8) {
          for (; n_block >= n_block_mask; --n_block) iteration(n_block, cute::true_type{});
        }
        for (; n_block >= range.n_block_min; --n_block) iteration(n_block, cute::false_type{});
      }
      query_done(pipeline_q, read_q);
      // Lines 18-19: the last O += P V.
      pingpong_wait_turn(warp_group);
      pv_gemm();
      pingpong_pass_turn(warp_group);
      warpgroup_wait<0>();
      release_v();
    } else {
      // Algorithm 1, lines 15-23: each block's softmax waits for its QK^T, and
      // its PV waits for the softmax.
      auto iteration = [&](int n, auto needs_mask) {
        BlockDescale const next = descale.block(n);
        pingpong_wait_turn(warp_group);
        qk_gemm(tSrS);
        pingpong_pass_turn(warp_group);
        warpgroup_wait<0>();
        release_k();
        softmax_step(tSrS, n, needs_mask, next);
        rescale_o(next);
        to_operand(tSrS);
        pingpong_wait_turn(warp_group);
        pv_gemm();
        pingpong_pass_turn(warp_group);
        warpgroup_wait<0>();
        release_v();
      };
      for (; n_block >= n_block_mask; --n_block) iteration(n_block, cute::true_type{});
      for (; n_block >= n_block_unmasked_min; --n_block) iteration(n_block, cute::false_type{});
      if constexpr (Traits::kWindow) {
        for (; n_block >= range.n_block_min; --n_block) iteration(n_block, cute::true_type{});
      }
      query_done(pipeline_q, read_q);
    }
    return descale.o_factor();
  }

  // Key blocks a consumer warpgroup has no use for: it issues no GEMM for
  // them, so that the other warpgroups have the tensor cores to themselves,
  // but takes the pingpong turns mma() would take and waits for and releases
  // their K and V stages, so that the turn ring and the pipelines stay in
  // step.
  CUTE_DEVICE static void pass_blocks(PipelineK& pipeline_k, PipelineV& pipeline_v, PipelineState& read_k,
                                      PipelineState& read_v, int count, int warp_group) {
    for (int i = 0; i < count; ++i) {
      // Algorithm 2 takes a turn per block (its QK^T with the previous
      // block's PV), Algorithm 1 two.
      CUTE_UNROLL
      for (int t = 0; t < (Traits::kIntraWGOverlap ? 1 : 2); ++t) pingpong_take_turn(warp_group);
      pipeline_k.consumer_wait(read_k);
      pipeline_k.consumer_release(read_k);
      ++read_k;
      pipeline_v.consumer_wait(read_v);
      pipeline_v.consumer_release(read_v);
      ++read_v;
    }
  }

  // A warpgroup with no key to attend to in this tile: its 64 query rows all
  // lie outside the sequence (at head dim 64, causal, seqlen 1024: two of the
  // first tile's three, above it), or see no key.
  CUTE_DEVICE static void idle(PipelineQ& pipeline_q, QState read_q, PipelineK& pipeline_k, PipelineV& pipeline_v,
                               PipelineState& read_k, PipelineState& read_v, BlockRange range, int warp_group) {
    int const blocks = range.n_block_max - range.n_block_min;
    pass_blocks(pipeline_k, pipeline_v, read_k, read_v, blocks, warp_group);
    // Algorithm 2's last turn: the last PV.
    if (Traits::kIntraWGOverlap && blocks > 0) pingpong_take_turn(warp_group);
    query_done(pipeline_q, read_q);
  }

  CUTE_DEVICE static Element* smem_vt(SharedStorage& smem) {
    if constexpr (Traits::kFp8) {
      return smem.vt.data();
    } else {
      return smem.v.data();
    }
  }

  // Q's buffer is free once this thread's last QK^T has completed.
  CUTE_DEVICE static void query_done(PipelineQ& pipeline_q, QState read_q) { pipeline_q.consumer_release(read_q); }
};

}  // namespace flash3::fwd
