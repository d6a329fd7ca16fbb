// The MLA kernel (ForwardArgs::qv): one CTA per tile of 64 rows of one KV
// head's queries and, split-KV, per split of its key blocks. A tile's rows
// are (position, query head) pairs, the group's heads innermost (packed
// GQA for any number of query positions: decoding's 128 heads of one token
// are two tiles, speculative decoding's tokens share the tiles), so each K
// and V block is read once per 64 rows of a KV head.
//
//   consumers     load_queries(): the tile's rows of Q and Qv, gathered by
//                 (position, head), into shared memory
//   warpgroup 0   producer(): K_j and V_j of each key block into a circular
//                 buffer of two stages (warp 0)
//   warpgroup 1   softmax_consumer(): S = Q K_j^T + Qv V_j^T, the mask, the
//                 online softmax; P and the rows' rescale factors to shared
//                 memory; O[:, :256] += P V_j[:, :256] (P from registers)
//   warpgroup 2   value_consumer(): O[:, 256:] += P V_j[:, 256:] (P from
//                 shared memory), rescaled by warpgroup 1's factors
// The second warpgroup's GEMM of block j runs while the first computes S of
// block j + 1. Then O / l and the LSE out, from registers (decoding writes
// few rows), as bf16 O or split-KV's float32 partials.
#pragma once

#include <cmath>

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/arch/reg_reconfig.h>
#include <cutlass/pipeline/pipeline.hpp>

#include "common/kv_cache.h"
#include "common/layout.h"
#include "common/mask.h"
#include "fwd/kv_boxes.h"
#include "fwd/kv_split.h"
#include "fwd/mask.h"
#include "fwd/mla_traits.h"
#include "fwd/packed_rows.h"
#include "fwd/softmax.h"

namespace flash3::fwd {

template <class Traits>
struct MlaKernel {
  using Element = typename Traits::Element;
  using SharedStorage = typename Traits::SharedStorage;
  static constexpr int kBlockM = Traits::kBlockM;
  static constexpr int kBlockN = Traits::kBlockN;
  static constexpr int kHeadDim = Traits::kHeadDim;
  static constexpr int kHeadDimV = Traits::kHeadDimV;
  static constexpr int kHalfV = Traits::kHalfV;
  static constexpr int kNumThreads = Traits::kNumThreads;
  static constexpr int kSmemBytes = sizeof(SharedStorage);
  using PipelineKV = typename Traits::PipelineKV;
  using KVState = typename PipelineKV::PipelineState;

  using GmemTensor = typename Traits::template GmemTensor<kHeadDim>;
  using GmemTensorV = typename Traits::template GmemTensor<kHeadDimV>;
  using TmaK = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, take<0, 2>(typename Traits::SmemLayoutK{}),
                                      Shape<Int<kBlockN>, Int<kHeadDim>>{}, _1{}));
  using TmaV = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensorV{}, take<0, 2>(typename Traits::SmemLayoutV{}),
                                      Shape<Int<kBlockN>, Int<kHeadDimV>>{}, _1{}));
  using TmaKBox = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensor{}, typename Traits::SmemLayoutKBox{},
                                         BoxShape<kHeadDim>{}, _1{}));
  using TmaVBox = decltype(make_tma_copy(SM90_TMA_LOAD{}, GmemTensorV{}, typename Traits::SmemLayoutVBox{},
                                         BoxShape<kHeadDimV>{}, _1{}));

  struct Params {
    ConstTensor q;  // [batch, seqlen_q, heads_kv * group, head dim], as the call has them
    ConstTensor qv;
    TmaK tma_k;
    TmaV tma_v;
    TmaKBox tma_k_box;  // a paged cache's boxes
    TmaVBox tma_v_box;
    typename Traits::template GmemShapeOf<kHeadDim> shape_k;
    typename Traits::template GmemShapeOf<kHeadDimV> shape_v;
    int m_blocks;  // tiles of each (batch, KV head): its rows / 64
    int heads_kv;
    PackedRows packed;  // a KV head's rows: (position, query head) pairs
    KvCacheMap cache;
    int num_splits;
    Window window;     // the mask, causal as window_right 0
    float scale_log2;  // softmax_scale * log2(e)
    // O (bf16, [batch, seqlen_q, heads_q, 512]) and the LSE ([batch,
    // heads_q, seqlen_q]), or split-KV's float32 partials O [splits, batch,
    // heads_q, seqlen_q, 512] and LSE [splits, batch, heads_q, seqlen_q].
    void* o;
    int64_t o_batch_stride;
    int64_t o_seq_stride;
    int64_t o_head_stride;
    float* lse;
    int batch;

    CUTE_DEVICE MaskPolicy mask_policy(int b) const {
      return MaskPolicy{packed.seqlen_q, cache.keys(b), false, window.left, window.right};
    }
  };

  struct Tile {
    int m_block;
    int head_kv;
    int batch;
    int split;
  };

  CUTE_DEVICE static Tile tile_of(Params const& p) {
    int const x = blockIdx.x;
    int const rest = x / p.m_blocks;
    return {x % p.m_blocks, rest % p.heads_kv, rest / p.heads_kv, int(blockIdx.y)};
  }

  // The key blocks the tile walks: those its rows' query positions see under
  // the mask (fwd/packed_rows.h), and split-KV's run of them (producer and
  // consumers alike).
  CUTE_DEVICE static BlockRange range_of(Params const& p, Tile t) {
    BlockRange const range = p.packed.key_blocks(p.mask_policy(t.batch), t.m_block, kBlockM, kBlockN);
    if constexpr (Traits::kSplit) return split_block_range(range, t.split, p.num_splits);
    return range;
  }

  CUTE_DEVICE static void run(Params const& p, char* smem_buf) {
    SharedStorage& smem = *reinterpret_cast<SharedStorage*>(smem_buf);
    int const warp_group = cutlass::canonical_warp_group_idx();
    if (threadIdx.x == 0) {
      cute::prefetch_tma_descriptor(p.cache.paged() ? p.tma_k_box.get_tma_descriptor() : p.tma_k.get_tma_descriptor());
      cute::prefetch_tma_descriptor(p.cache.paged() ? p.tma_v_box.get_tma_descriptor() : p.tma_v.get_tma_descriptor());
    }
    PipelineKV pipeline_kv(smem.pipeline_kv, pipeline_params<PipelineKV>(warp_group, Traits::kKVBytes),
                           Shape<_1, _1, _1>{});
    __syncthreads();  // barriers initialised before anyone waits on them
    // Each role computes its tile after setmaxnreg: values held across it
    // go to the stack.
    if (warp_group == 0) {
      cutlass::arch::warpgroup_reg_dealloc<Traits::kProducerRegisters>();
      if (cutlass::canonical_warp_idx_sync() == 0) producer(p, smem, pipeline_kv);
    } else {
      cutlass::arch::warpgroup_reg_alloc<Traits::kConsumerRegisters>();
      // One call site: both consumer warpgroups meet at the same barrier
      // instruction (kQueries), as the sanitizer's synccheck wants.
      Start const start = consumer_start(p, smem);
      if (warp_group == 1) {
        softmax_consumer(p, smem, pipeline_kv, start);
      } else {
        value_consumer(p, smem, pipeline_kv, start);
      }
    }
  }

  // Warpgroup 0 loads (thread 0 sets each stage's byte count), the
  // consumers' 256 threads release.
  template <class Pipeline>
  CUTE_DEVICE static typename Pipeline::Params pipeline_params(int warp_group, uint32_t bytes) {
    typename Pipeline::Params params;
    params.transaction_bytes = bytes;
    params.role = warp_group == 0 ? Pipeline::ThreadCategory::Producer : Pipeline::ThreadCategory::Consumer;
    params.is_leader = threadIdx.x == 0;
    params.num_consumers = Traits::kNumConsumerThreads;
    return params;
  }

  // ---------------------------------------------------------------- producer
  // The key blocks from the last to the first (the masked ones first, as the
  // consumers walk them). A tile with no key block loads nothing, and its
  // consumers wait for nothing.
  CUTE_DEVICE static void producer(Params const& p, SharedStorage& smem, PipelineKV& pipeline_kv) {
    Tile const tile = tile_of(p);
    BlockRange const range = range_of(p, tile);
    bool const leader = cute::elect_one_sync();
    bool const paged = p.cache.paged();
    KVState write = cutlass::make_producer_start_state<PipelineKV>();
    for (int n_block = range.n_block_max - 1; n_block >= range.n_block_min; --n_block) {
      PagedBlock const where =
          paged && leader ? paged_block<kBlockN>(p.cache, tile.batch, n_block * kBlockN) : PagedBlock{};
      pipeline_kv.producer_acquire(write);
      if (leader) {
        auto& barrier = *pipeline_kv.producer_get_barrier(write);
        if (paged) {
          load_paged<kBlockN>(p.tma_k, p.tma_k_box, p.shape_k, smem.k.data(), typename Traits::SmemLayoutK{}, barrier,
                              write.index(), p.cache, tile.batch, tile.head_kv, n_block, where);
          load_paged<kBlockN>(p.tma_v, p.tma_v_box, p.shape_v, smem.v.data(), typename Traits::SmemLayoutV{}, barrier,
                              write.index(), p.cache, tile.batch, tile.head_kv, n_block, where);
        } else {
          load_block(p, p.tma_k, p.shape_k, smem.k.data(), typename Traits::SmemLayoutK{}, barrier, write.index(),
                     tile.batch, tile.head_kv, n_block);
          load_block(p, p.tma_v, p.shape_v, smem.v.data(), typename Traits::SmemLayoutV{}, barrier, write.index(),
                     tile.batch, tile.head_kv, n_block);
        }
      }
      ++write;
    }
  }

  // Key block n_block of a contiguous cache: the entry's cache row, from its
  // first key (leftpad); rows past its keys are read and masked.
  template <class Tma, class GShape, class Layout, class Barrier>
  CUTE_DEVICE static void load_block(Params const& p, Tma const& tma, GShape const& shape, Element* buffer,
                                     Layout layout, Barrier& barrier, int stage, int batch, int head_kv, int n_block) {
    Tensor g = local_tile(domain_offset(make_coord(p.cache.first_key(batch), _0{}),
                                        tma.get_tma_tensor(shape)(_, _, head_kv, p.cache.kv_batch(batch))),
                          make_shape(Int<kBlockN>{}, get<1>(shape)), make_coord(n_block, _0{}));
    Tensor s = make_tensor(make_smem_ptr(buffer), layout);  // (N, d, stages)
    auto slice = tma.get_slice(_0{});
    copy(tma.with(barrier), slice.partition_S(g), slice.partition_D(s)(_, _, _, stage));
  }

  // --------------------------------------------------------------- consumers
  CUTE_DEVICE static int consumer_thread() { return threadIdx.x % cutlass::NumThreadsPerWarpGroup; }
  static constexpr int kPairThreads = Traits::kNumConsumerThreads;  // both consumer warpgroups meet at a barrier
  CUTE_DEVICE static void sync(MlaBarrier b) { cutlass::arch::NamedBarrier::sync(kPairThreads, uint32_t(b)); }
  CUTE_DEVICE static void arrive(MlaBarrier b) { cutlass::arch::NamedBarrier::arrive(kPairThreads, uint32_t(b)); }

  // The tile's rows of Q and Qv into shared memory, by both consumer
  // warpgroups: each 16-byte chunk of a row gathered from its (position,
  // head), rows past the KV head's as zeros; all loads issued before the
  // stores. The GEMMs read them through the async proxy.
  CUTE_DEVICE static void load_queries(Params const& p, SharedStorage& smem, Tile tile) {
    constexpr int kChunksQ = kHeadDim / 8, kChunksRow = (kHeadDim + kHeadDimV) / 8;
    constexpr int kPerThread = kBlockM * kChunksRow / Traits::kNumConsumerThreads;
    static_assert(kBlockM * kChunksRow % Traits::kNumConsumerThreads == 0);
    Tensor sQ = make_tensor(make_smem_ptr(smem.q.data()), typename Traits::SmemLayoutQ{});
    Tensor sQv = make_tensor(make_smem_ptr(smem.qv.data()), typename Traits::SmemLayoutQv{});
    int const first = threadIdx.x - cutlass::NumThreadsPerWarpGroup;
    uint4 chunk[kPerThread];
    CUTE_UNROLL
    for (int i = 0; i < kPerThread; ++i) {
      int const c = first + i * Traits::kNumConsumerThreads, row = c / kChunksRow, part = c % kChunksRow;
      int const r = tile.m_block * kBlockM + row;
      bool const latent = part >= kChunksQ;
      ConstTensor const& t = latent ? p.qv : p.q;
      chunk[i] = make_uint4(0, 0, 0, 0);
      if (r < p.packed.rows()) {
        chunk[i] = *reinterpret_cast<uint4 const*>(
            static_cast<Element const*>(t.data) + tile.batch * t.batch_stride + p.packed.position(r) * t.seq_stride +
            p.packed.head(tile.head_kv, r) * t.head_stride + (latent ? part - kChunksQ : part) * 8);
      }
    }
    CUTE_UNROLL
    for (int i = 0; i < kPerThread; ++i) {
      int const c = first + i * Traits::kNumConsumerThreads, row = c / kChunksRow, part = c % kChunksRow;
      Element* dst = part >= kChunksQ ? &sQv(row, (part - kChunksQ) * 8) : &sQ(row, part * 8);
      *reinterpret_cast<uint4*>(dst) = chunk[i];
    }
    cutlass::arch::fence_view_async_shared();
    sync(MlaBarrier::kQueries);
  }

  // Both consumers' start: the tile, its key blocks, and (when it has any)
  // its queries in shared memory.
  struct Start {
    Tile tile;
    BlockRange range;
  };
  CUTE_DEVICE static Start consumer_start(Params const& p, SharedStorage& smem) {
    Tile const tile = tile_of(p);
    BlockRange const range = range_of(p, tile);
    if (!range.empty()) load_queries(p, smem, tile);
    return {tile, range};
  }

  // The tile rows a thread's accumulator rows are (the same in both
  // consumers' accumulators: a thread's rows depend on its index only).
  CUTE_DEVICE static void rows_of(int (&rows)[2]) {
    Tensor coords = typename Traits::TiledMmaS{}.get_thread_slice(consumer_thread()).partition_C(
        make_identity_tensor(Shape<Int<kBlockM>, Int<kBlockN>>{}));
    Tensor rc = make_tensor(coords.data(), accumulator_rowcol(coords.layout()));
    rows[0] = get<0>(rc(0, 0));
    rows[1] = get<0>(rc(1, 0));
  }

  // Warpgroup 1, the softmax consumer: S, the softmax, P; its half of O.
  CUTE_DEVICE static void softmax_consumer(Params const& p, SharedStorage& smem, PipelineKV& pipeline_kv,
                                           Start const start) {
    auto const [tile, range] = start;
    int const t = consumer_thread();
    typename Traits::TiledMmaS mma_s;
    typename Traits::TiledMmaORS mma_o;
    auto thr_s = mma_s.get_thread_slice(t);
    auto thr_o = mma_o.get_thread_slice(t);
    Tensor sQ = make_tensor(make_smem_ptr(smem.q.data()), typename Traits::SmemLayoutQ{});
    Tensor sQv = make_tensor(make_smem_ptr(smem.qv.data()), typename Traits::SmemLayoutQv{});
    Tensor sK = make_tensor(make_smem_ptr(smem.k.data()), typename Traits::SmemLayoutK{});
    Tensor sV = make_tensor(make_smem_ptr(smem.v.data()), typename Traits::SmemLayoutV{});
    Tensor sP = make_tensor(make_smem_ptr(smem.p.data()), typename Traits::SmemLayoutP{});
    Tensor tSrQ = thr_s.partition_fragment_A(sQ);
    Tensor tSrQv = thr_s.partition_fragment_A(sQv);
    Tensor tSrK = thr_s.partition_fragment_B(sK);  // (MMA, MMA_N, MMA_K, stages)
    Tensor tSrV = thr_s.partition_fragment_B(sV);
    Tensor tOrV = thr_o.partition_fragment_B(value_half<0>(smem));
    Tensor tPsP = thr_s.partition_C(sP);  // P's elements where this thread holds them in S
    Tensor tOrO = partition_fragment_C(mma_o, Shape<_64, Int<kHalfV>>{});
    clear(tOrO);
    OnlineSoftmax<2> softmax;
    int rows[2];
    rows_of(rows);
    MaskPolicy const mask = p.mask_policy(tile.batch);
    int const first_row = tile.m_block * kBlockM;
    int const masked_below = p.packed.key_blocks_masked_below(mask, tile.m_block, kBlockM, kBlockN);
    using MaskT = Mask<true, kBlockM, kBlockN, typename Traits::TiledMmaS>;

    KVState read;
    for (int n_block = range.n_block_max - 1; n_block >= range.n_block_min; --n_block) {
      Tensor tSrS = partition_fragment_C(mma_s, Shape<_64, Int<kBlockN>>{});
      pipeline_kv.consumer_wait(read);
      int const stage = read.index();
      warpgroup_gemm</*kZeroInit=*/true>(mma_s, tSrQ, tSrK(_, _, _, stage), tSrS);
      warpgroup_gemm</*kZeroInit=*/false>(mma_s, tSrQv, tSrV(_, _, _, stage), tSrS);
      warpgroup_wait<0>();
      if (n_block >= range.n_block_mask || n_block < masked_below) {
        MaskT::apply_rows(mask, tSrS, n_block, t, [&](int r) { return p.packed.position(first_row + r); });
      }
      float o_scale[2];
      softmax.step(tSrS, o_scale, p.scale_log2);
      // P to shared memory once the value warpgroup has read the previous block's.
      sync(MlaBarrier::kPEmpty);
      Tensor rP = convert_fragment<Element>(tSrS);
      CUTE_UNROLL
      for (int i = 0; i < size(rP); ++i) tPsP(i) = rP(i);
      share_row_scale(smem, rows, o_scale);
      cutlass::arch::fence_view_async_shared();  // P is read by a GEMM (the async proxy)
      arrive(MlaBarrier::kPFull);
      rescale_rows(tOrO, o_scale);
      Tensor tOrP = make_tensor(rP.data(), accumulator_as_operand_a(rP.layout()));
      warpgroup_gemm</*kZeroInit=*/false>(mma_o, tOrP, tOrV(_, _, _, stage), tOrO);
      warpgroup_wait<0>();
      pipeline_kv.consumer_release(read);
      ++read;
    }
    // O / l and the LSE; the value warpgroup gets 1 / l once it has read the
    // last block's factors.
    float o_scale[2], lse[2];
    softmax.finalize(o_scale, lse, -INFINITY);
    sync(MlaBarrier::kPEmpty);
    share_row_scale(smem, rows, o_scale);
    arrive(MlaBarrier::kPFull);
    rescale_rows(tOrO, o_scale);
    store(p, tile, tOrO, 0, rows, lse);
  }

  // Warpgroup 2, the value consumer: the other half of O.
  CUTE_DEVICE static void value_consumer(Params const& p, SharedStorage& smem, PipelineKV& pipeline_kv,
                                         Start const start) {
    auto const [tile, range] = start;
    int const t = consumer_thread();
    typename Traits::TiledMmaOSS mma_o;
    auto thr_o = mma_o.get_thread_slice(t);
    Tensor sP = make_tensor(make_smem_ptr(smem.p.data()), typename Traits::SmemLayoutP{});
    Tensor tOrP = thr_o.partition_fragment_A(sP);
    Tensor tOrV = thr_o.partition_fragment_B(value_half<1>(smem));
    Tensor tOrO = partition_fragment_C(mma_o, Shape<_64, Int<kHalfV>>{});
    clear(tOrO);
    int rows[2];
    rows_of(rows);
    float o_scale[2];
    // P's buffer starts empty (this arrival), so the softmax warpgroup waits
    // on kPEmpty before every write, with no barrier under a condition.
    arrive(MlaBarrier::kPEmpty);
    KVState read;
    for (int n_block = range.n_block_max - 1; n_block >= range.n_block_min; --n_block) {
      pipeline_kv.consumer_wait(read);
      sync(MlaBarrier::kPFull);
      read_row_scale(smem, rows, o_scale);
      rescale_rows(tOrO, o_scale);
      warpgroup_gemm</*kZeroInit=*/false>(mma_o, tOrP, tOrV(_, _, _, read.index()), tOrO);
      warpgroup_wait<0>();
      arrive(MlaBarrier::kPEmpty);
      pipeline_kv.consumer_release(read);
      ++read;
    }
    sync(MlaBarrier::kPFull);
    read_row_scale(smem, rows, o_scale);
    rescale_rows(tOrO, o_scale);
    float const no_lse[2] = {0.f, 0.f};
    store(p, tile, tOrO, 1, rows, no_lse);
  }

  // Half h of V^T's columns, (256, N, stages): warpgroup h's part of PV.
  template <int kHalf>
  CUTE_DEVICE static auto value_half(SharedStorage& smem) {
    Tensor sVt = make_tensor(make_smem_ptr(smem.v.data()), typename Traits::SmemLayoutVt{});
    return local_tile(sVt, Shape<Int<kHalfV>, Int<kBlockN>, Int<Traits::kStages>>{}, make_coord(Int<kHalf>{}, _0{}, _0{}));
  }

  // The four threads of a quad hold the same rows; the first writes.
  CUTE_DEVICE static void share_row_scale(SharedStorage& smem, int const (&rows)[2], float const (&scale)[2]) {
    if (consumer_thread() % 4 == 0) {
      smem.row_scale[rows[0]] = scale[0];
      smem.row_scale[rows[1]] = scale[1];
    }
  }
  CUTE_DEVICE static void read_row_scale(SharedStorage& smem, int const (&rows)[2], float (&scale)[2]) {
    scale[0] = smem.row_scale[rows[0]];
    scale[1] = smem.row_scale[rows[1]];
  }

  // ---------------------------------------------------------------- epilogue
  // Half `half` of O's columns (and, from warpgroup 1, the LSE) from
  // registers, two adjacent columns a store: bf16 O, or split-KV's float32
  // partial O and LSE (-inf for a row that saw no key of its split: no
  // weight in the combine). Rows past the KV head's (seqlen_q * group) are
  // not stored.
  template <class FragO>
  CUTE_DEVICE static void store(Params const& p, Tile tile, FragO const& tOrO, int half, int const (&rows)[2],
                                float const (&lse)[2]) {
    Tensor coords = typename Traits::TiledMmaOSS{}.get_thread_slice(consumer_thread()).partition_C(
        make_identity_tensor(Shape<_64, Int<kHalfV>>{}));
    Tensor rc = make_tensor(coords.data(), accumulator_rowcol(coords.layout()));
    Tensor o = make_tensor(tOrO.data(), accumulator_rowcol(tOrO.layout()));
    int64_t const heads_q = int64_t(p.heads_kv) * p.packed.group, seqlen_q = p.packed.seqlen_q;
    CUTE_UNROLL
    for (int r = 0; r < 2; ++r) {
      int const row = tile.m_block * kBlockM + rows[r];
      if (row >= p.packed.rows()) continue;
      int const position = p.packed.position(row), head = p.packed.head(tile.head_kv, row);
      // The (batch, head, position) row of the LSE and of split-KV's partials.
      int64_t const lse_row = (tile.batch * heads_q + head) * seqlen_q + position;
      if constexpr (Traits::kSplit) {
        int64_t const split_row = int64_t(tile.split) * p.batch * heads_q * seqlen_q + lse_row;
        float* o_row = static_cast<float*>(p.o) + split_row * kHeadDimV + half * kHalfV;
        CUTE_UNROLL
        for (int c = 0; c < size<1>(o); c += 2) {
          *reinterpret_cast<float2*>(o_row + get<1>(rc(r, c))) = make_float2(o(r, c), o(r, c + 1));
        }
        if (half == 0 && consumer_thread() % 4 == 0) p.lse[split_row] = lse[r] == INFINITY ? -INFINITY : lse[r];
      } else {
        Element* o_row = static_cast<Element*>(p.o) + tile.batch * p.o_batch_stride + position * p.o_seq_stride +
                         head * p.o_head_stride + half * kHalfV;
        CUTE_UNROLL
        for (int c = 0; c < size<1>(o); c += 2) {
          Element pair[2] = {Element(o(r, c)), Element(o(r, c + 1))};
          *reinterpret_cast<uint32_t*>(o_row + get<1>(rc(r, c))) = *reinterpret_cast<uint32_t const*>(pair);
        }
        if (half == 0 && p.lse != nullptr && consumer_thread() % 4 == 0) p.lse[lse_row] = lse[r];
      }
    }
  }
};

template <class KernelT>
__global__ void __launch_bounds__(KernelT::kNumThreads, 1)
    mla_kernel(CUTE_GRID_CONSTANT typename KernelT::Params const params) {
  extern __shared__ __align__(1024) char smem[];
  KernelT::run(params, smem);
}

}  // namespace flash3::fwd
