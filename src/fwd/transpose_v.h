// FP8 V transpose (paper §3.3, "layout transformations"): FP8 WGMMA reads its
// B operand K-major only, so for O += P V, V^T must have the sequence mode
// contiguous, while V arrives from global memory with the head dim
// contiguous. Three warps of the producer warpgroup transpose each V tile in
// shared memory after its TMA load, while the consumers run their GEMMs.
//
// The transpose also permutes the keys to match P's registers (Figures 3, 4):
// within each 32 keys, the S accumulator holds for thread t of a quad the
// columns {2t, 2t+1, 8+2t, 9+2t} (and +16), while an FP8 A operand takes
// k = 4t..4t+3 (and +16). So P's registers are used as they are, key n of
// the block being fed as k = perm(n), and V^T gets key n at column perm(n).
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/memory.h>

namespace flash3::fwd {

using namespace cute;

// The PV GEMM's k index of key n within a block, and its inverse:
// n = kk0 + 2 q + 8 kk1 + 16 kh  <->  k = kk0 + 2 kk1 + 4 q + 16 kh  (32-key
// groups are kept).
CUTE_HOST_DEVICE constexpr int key_of_k(int k) {
  int const kk0 = k & 1, kk1 = (k >> 1) & 1, q = (k >> 2) & 3, rest = k & ~15;
  return kk0 + 2 * q + 8 * kk1 + rest;
}

template <class Traits>
struct TransposeV {
  using Element = typename Traits::Element;
  static constexpr int kBlockN = Traits::kBlockN;
  static constexpr int kHeadDim = Traits::kHeadDim;
  static constexpr int kWarps = Traits::kNumTransposeThreads / cutlass::NumThreadsPerWarp;
  static_assert(kBlockN % 32 == 0 && kHeadDim % 64 == 0);

  // The tile is cut into 4 x 4 byte squares: 4 keys (rows of V, columns k
  // of V^T) by 4 head-dim entries, each moved with four 32-bit loads, eight
  // byte permutes and four 32-bit stores. A warp takes a region of 32 keys
  // by 16 kSquares head-dim entries at a time, lane l the squares
  // (l % 8, l / 8 + 4 s), s < kSquares, of it: its loads and stores spread
  // over the banks of the swizzled rows, and each lane has kSquares squares'
  // loads in flight. Head dim 256 takes 4 squares (fewer, longer loop
  // iterations: +12% measured); 64 and 128 take 2 (with 4, 128 measured 4%
  // slower, and 64's regions would no longer spread over the 3 warps).
  static constexpr uint32_t kSquares = kHeadDim >= 256 ? 4 : 2;
  static constexpr uint32_t kRegionDims = 16 * kSquares;
  static constexpr uint32_t kKeyRegions = kBlockN / 32;
  static constexpr uint32_t kRegions = kKeyRegions * (kHeadDim / kRegionDims);

  using LayoutV = decltype(take<0, 2>(typename Traits::SmemLayoutV{}));
  using LayoutVt = decltype(take<0, 2>(typename Traits::SmemLayoutVt{}));

  // Addresses are split into a lane's part (its keys and head-dim entries
  // within a region) and a region's part. The two touch different bits of
  // the unswizzled offset and a swizzle is linear over GF(2), so an address
  // is the XOR of the two swizzled parts: the lane's are computed once.
  struct Lane {
    uint32_t v[4];   // row j of the lane's square: key key_of_k(k + j)
    uint32_t vt[4];  // row c of its transposed square: head-dim entry d + c
  };

  CUTE_DEVICE static Lane lane_offsets(int thread_idx) {
    uint32_t const lane = uint32_t(thread_idx) % cutlass::NumThreadsPerWarp;
    uint32_t const k = 4 * (lane % 8), d = 4 * (lane / 8);
    Lane l;
    CUTE_UNROLL
    for (uint32_t j = 0; j < 4; ++j) {
      l.v[j] = uint32_t(LayoutV{}(make_coord(uint32_t(key_of_k(int(k + j))), d))) * sizeof(Element);
      l.vt[j] = uint32_t(LayoutVt{}(make_coord(d + j, k))) * sizeof(Element);
    }
    return l;
  }

  // v, vt: shared-memory addresses of one stage of V (N, d) as loaded and of
  // V^T (d, N) as the GEMM reads it.
  CUTE_DEVICE static void run(uint32_t v, uint32_t vt, Lane const& lane, int thread_idx) {
    for (uint32_t region = uint32_t(thread_idx) / cutlass::NumThreadsPerWarp; region < kRegions; region += kWarps) {
      uint32_t const k0 = 32 * (region % kKeyRegions), d0 = kRegionDims * (region / kKeyRegions);
      uint32_t w[kSquares][4];
      CUTE_UNROLL
      for (uint32_t sq = 0; sq < kSquares; ++sq) {
        uint32_t const base = uint32_t(LayoutV{}(make_coord(k0, d0 + 16 * sq))) * sizeof(Element);
        CUTE_UNROLL
        for (uint32_t j = 0; j < 4; ++j) cutlass::arch::shared_load<4>(&w[sq][j], v + (base ^ lane.v[j]));
      }
      CUTE_UNROLL
      for (uint32_t sq = 0; sq < kSquares; ++sq) {
        // 4 x 4 byte transpose: t[c] holds byte c of w[sq][0..3].
        uint32_t const lo01 = __byte_perm(w[sq][0], w[sq][1], 0x5140), hi01 = __byte_perm(w[sq][0], w[sq][1], 0x7362);
        uint32_t const lo23 = __byte_perm(w[sq][2], w[sq][3], 0x5140), hi23 = __byte_perm(w[sq][2], w[sq][3], 0x7362);
        uint32_t const t[4] = {__byte_perm(lo01, lo23, 0x5410), __byte_perm(lo01, lo23, 0x7632),
                               __byte_perm(hi01, hi23, 0x5410), __byte_perm(hi01, hi23, 0x7632)};
        uint32_t const base = uint32_t(LayoutVt{}(make_coord(d0 + 16 * sq, k0))) * sizeof(Element);
        CUTE_UNROLL
        for (uint32_t c = 0; c < 4; ++c) cutlass::arch::shared_store<4>(vt + (base ^ lane.vt[c]), &t[c]);
      }
    }
  }
};

}  // namespace flash3::fwd
