// The forward epilogue (Algorithm 1, line 25): O from registers to shared
// memory (stmatrix), then to global memory by TMA stores, all columns at once
// or, where shared memory holds only half of O, in two column halves; the
// LSE straight from registers. With FwdTraits::kDeferEpilogue each consumer
// warpgroup stores its own 64 rows and waits for no other warpgroup, so that
// it can run its epilogue while the others' GEMMs run; otherwise the
// warpgroups join and one TMA store takes the whole tile. Only rows of the
// sequence are written: 64-row blocks above it (a causal launch's first
// tile) are skipped, and the TMA store's bounds clip the rows past seqlen_q.
#pragma once

#include <cmath>

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>

#include "common/layout.h"
#include "common/tile_order.h"
#include "common/varlen_tiles.h"
#include "fwd/block_range.h"
#include "fwd/traits.h"

namespace flash3::fwd {

template <class Traits_>
struct Epilogue {
  using Traits = Traits_;
  using Element = typename Traits::ElementO;
  static constexpr int kBlockM = Traits::kBlockM;
  static constexpr int kNumConsumerThreads = Traits::kNumConsumerThreads;
  using TileShapePV = typename Traits::TileShapePV;
  using TileShapeOChunk = typename Traits::TileShapeOChunk;
  using TileShapeOStore = typename Traits::TileShapeOStore;
  static constexpr int kOChunks = Traits::kOChunks;
  static constexpr int kStoreRows = Traits::kOStoreRows;
  // The threads that meet before and after writing the buffer: a warpgroup,
  // or all consumers.
  static constexpr int kSyncThreads = Traits::kDeferEpilogue ? cutlass::NumThreadsPerWarpGroup : kNumConsumerThreads;
  using SmemLayoutO = typename Traits::SmemLayoutO;
  using SmemLayoutOStore = typename Traits::SmemLayoutOStore;
  using SharedStorage = typename Traits::SharedStorage;

  // O has V's head dim.
  using GmemShape = typename Traits::template GmemShapeOf<Traits::kHeadDimV>;
  using GmemTensor = typename Traits::template GmemTensor<Element, Traits::kHeadDimV>;
  using TmaO = decltype(make_tma_copy(SM90_TMA_STORE{}, GmemTensor{}, SmemLayoutOStore{}, TileShapeOStore{}, _1{}));

  struct Params {
    TmaO tma_o;
    GmemShape shape_o;
    float* lse;  // [batch, heads, seqlen_q], packed sequences [heads, total_q]; or nullptr
    float const* sinks;  // [heads] or nullptr
    int seqlen_q;
    int num_heads;
    int row_offset;  // rows above the sequence in the first tile (tile_first_row)
    // Packed sequences (varlen): their lengths, and O as plain memory for
    // a sequence's last rows, which a TMA store would write past it.
    SequenceLengths lengths;
    Element* o;
    int64_t o_row_stride;
    int64_t o_head_stride;
    int total_q;
  };

  static Params make_params(GmemTensor const& o, float* lse, float const* sinks, int seqlen_q, int num_heads,
                            int row_offset, SequenceLengths lengths = {}, int total_q = 0) {
    return {make_tma_copy(SM90_TMA_STORE{}, o, SmemLayoutOStore{}, TileShapeOStore{}, _1{}),
            o.shape(),
            lse,
            sinks,
            seqlen_q,
            num_heads,
            row_offset,
            lengths,
            o.data().get(),
            int64_t(get<0>(o.stride())),
            int64_t(get<2>(o.stride())),
            total_q};
  }

  // The head's sink in the softmax's log2 units, -inf without sinks (which
  // leaves the softmax's denominator as it is).
  CUTE_DEVICE static float sink_log2(Params const& p, int head) {
    return p.sinks == nullptr ? -INFINITY : p.sinks[head] * float(M_LOG2E);
  }

  CUTE_DEVICE static void prefetch_descriptors(Params const& p) {
    cute::prefetch_tma_descriptor(p.tma_o.get_tma_descriptor());
  }

  // The last tile's O must be read out of shared memory before the CTA exits.
  CUTE_DEVICE static void store_tail() {
    if (Traits::consumer_thread_idx() % kSyncThreads == 0) tma_store_wait<0>();
  }

  // O in the output type, from the normalised fp32 accumulator.
  template <class FragO>
  CUTE_DEVICE static auto convert(FragO const& tOrO) {
    return convert_fragment<Element>(tOrO);
  }

  // A packed sequence's last rows (`rows` of the part's kStoreRows, from
  // packed row `row0`) of column chunk `chunk`, from the buffer's part to O
  // by the kSyncThreads threads (`thread` of them), element by element: one
  // partial block a sequence and head.
  CUTE_DEVICE static void store_rows(Params const& p, SharedStorage& smem, int part, int chunk, int head, int row0,
                                     int rows, int thread) {
    constexpr int kWidth = size<1>(TileShapeOStore{});
    constexpr int kVector = 8;
    Tensor sO_part =
        make_tensor(make_smem_ptr(smem.o.data() + part * cosize(SmemLayoutOStore{})), SmemLayoutOStore{});
    for (int i = thread; i < rows * (kWidth / kVector); i += kSyncThreads) {
      int const r = i / (kWidth / kVector), c = i % (kWidth / kVector) * kVector;
      Element* dst = p.o + (row0 + r) * p.o_row_stride + head * p.o_head_stride + chunk * kWidth + c;
      CUTE_UNROLL
      for (int e = 0; e < kVector; ++e) dst[e] = sO_part(r, c + e);
    }
  }

  // rO: this thread's O (convert); lse: its rows' LSE.
  template <class FragO, int kRows>
  CUTE_DEVICE static void store(Params const& p, SharedStorage& smem, FragO const& rO, float const (&lse)[kRows],
                                TileCoord tile) {
    int const thread_idx = Traits::consumer_thread_idx();
    // The thread that issues the stores of the buffer's blocks [first, last).
    bool const leader = thread_idx % kSyncThreads == 0;
    int const first = Traits::kDeferEpilogue ? thread_idx / cutlass::NumThreadsPerWarpGroup : 0;
    int const last = Traits::kDeferEpilogue ? first + 1 : kBlockM / kStoreRows;
    auto const barrier = uint32_t(Barrier::kEpilogueWG0) + first;
    Tensor sO = make_tensor(make_smem_ptr(smem.o.data()), SmemLayoutO{});
    auto r2s = make_tiled_copy_C(Copy_Atom<SM90_U32x4_STSM_N, Element>{}, typename Traits::TiledMmaOChunk{});
    auto thr_r2s = r2s.get_thread_slice(thread_idx);
    Tensor dst = thr_r2s.partition_D(sO);
    // A packed sequence's rows start at its cu_seqlens_q in the one batch entry.
    constexpr bool packed = Traits::kPacked;
    int const seqlen_q = packed ? p.lengths.q(tile.batch) : p.seqlen_q;
    int const first_q = packed ? p.lengths.cu_seqlens_q[tile.batch] : 0;
    Tensor mO = p.tma_o.get_tma_tensor(p.shape_o);
    Tensor gO = [&] {  // (rows, W, i, chunk)
      if constexpr (packed) {
        return local_tile(domain_offset(make_coord(first_q, _0{}), mO(_, _, tile.head, 0)), TileShapeOStore{},
                          make_coord(_, _));
      } else {
        return local_tile(mO(_, _, tile.head, tile.batch), TileShapeOStore{}, make_coord(_, _));
      }
    }();
    auto tma_o = p.tma_o.get_slice(_0{});
    // The store of a part of the buffer: block `block` of kStoreRows rows.
    auto part_block = [&](int part) {
      return tile.m_block * (kBlockM / kStoreRows) + part - p.row_offset / kStoreRows;
    };

    for_each(make_int_sequence<kOChunks>{}, [&](auto chunk) {
      // This chunk's slice of the thread's O fragment, as an O-chunk-wide
      // accumulator (the fragment holds its column groups outermost).
      Tensor rO_chunk = make_tensor(rO.data() + chunk * (size(rO) / kOChunks),
                                    partition_fragment_C(typename Traits::TiledMmaOChunk{}, TileShapeOChunk{}).layout());
      Tensor src = thr_r2s.retile_S(rO_chunk);
      // The buffer is free once the previous store has read it.
      if (leader) tma_store_wait<0>();
      cutlass::arch::NamedBarrier::sync(kSyncThreads, barrier);
      copy(r2s, src, dst);
      // stmatrix writes go through the generic proxy; the TMA store reads
      // through the async proxy.
      cutlass::arch::fence_view_async_shared();
      cutlass::arch::NamedBarrier::sync(kSyncThreads, barrier);
      if (leader) {
        for (int part = first; part < last; ++part) {
          // The block of the sequence this part of the tile holds: blocks
          // wholly outside the sequence are not stored, one partly past its
          // end is clipped by the TMA store's bounds (a packed sequence's by
          // store_rows below: past its end lie the next one's rows).
          int const block = part_block(part);
          if (block < 0 || block * kStoreRows >= seqlen_q || (packed && (block + 1) * kStoreRows > seqlen_q)) continue;
          Tensor sO_part = make_tensor(make_smem_ptr(smem.o.data() + part * cosize(SmemLayoutOStore{})),
                                       SmemLayoutOStore{});
          copy(p.tma_o, tma_o.partition_S(sO_part), tma_o.partition_D(gO(_, _, block, chunk)));
        }
        tma_store_arrive();
      }
      if constexpr (packed) {
        for (int part = first; part < last; ++part) {
          int const block = part_block(part);
          if (block >= 0 && block * kStoreRows < seqlen_q && (block + 1) * kStoreRows > seqlen_q) {
            store_rows(p, smem, part, chunk, tile.head, first_q + block * kStoreRows, seqlen_q - block * kStoreRows,
                       thread_idx % kSyncThreads);
          }
        }
      }
    });

    if (p.lse != nullptr) {
      // The four threads of a quad hold the same rows; the first writes.
      Tensor coords = typename Traits::TiledMmaPV{}.get_thread_slice(thread_idx).partition_C(
          make_identity_tensor(select<0, 1>(TileShapePV{})));
      Tensor rc = make_tensor(coords.data(), accumulator_rowcol(coords.layout()));
      if (thread_idx % 4 == 0) {
        int64_t const base = packed ? int64_t(tile.head) * p.total_q + first_q
                                    : (int64_t(tile.batch) * p.num_heads + tile.head) * p.seqlen_q;
        CUTE_UNROLL
        for (int r = 0; r < kRows; ++r) {
          int const row = tile_first_row(tile.m_block, kBlockM, p.row_offset) + get<0>(rc(r, 0));
          if (row >= 0 && row < seqlen_q) p.lse[base + row] = lse[r];
        }
      }
    }
  }
};

}  // namespace flash3::fwd
