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

#include <cute/arch/copy_sm75.hpp>
#include <cute/arch/copy_sm90.hpp>
#include <cute/tensor.hpp>

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
  static_assert(kBlockN % 32 == 0 && kHeadDim % 16 == 0 && sizeof(Element) == 1);

  // A warp moves a unit of 32 keys by 16 head-dim entries (512 bytes) with
  // one LDSM.T, four byte permutes and one STSM:
  //  - ldmatrix .trans x4 reads the 16-byte rows of keys 8i..8i+7 as four
  //    8 x 8 matrices of 16-bit pairs and hands lane l, of each, keys
  //    2(l%4), 2(l%4)+1 at head-dim entries 2(l/4), 2(l/4)+1;
  //  - byte permutes of matrices 0, 1 (and 2, 3) give four keys
  //    {2q, 2q+1, 8+2q, 9+2q} (+16) of one head-dim entry: exactly the keys
  //    of the GEMM's k = 4q..4q+3 (key_of_k), so
  //  - stmatrix x4 writes them as rows 2(l/4) (even entries, matrices 0, 2)
  //    and 2(l/4)+1 (odd, 1, 3) of V^T, columns 4q..4q+3 (+16).
  // Units are dealt to the warps round-robin; each lane keeps kInFlight
  // loads in flight before it permutes and stores: one, so that the
  // transposers fit the 24 registers FlashAttention-3's split leaves them
  // (two in flight pay only where the transposers bound, and need 40).
  static constexpr int kKeyRegions = kBlockN / 32;
  static constexpr int kUnits = kKeyRegions * (kHeadDim / 16);
  static constexpr int kInFlight = 1;

  using LayoutV = decltype(take<0, 2>(typename Traits::SmemLayoutV{}));
  using LayoutVt = decltype(take<0, 2>(typename Traits::SmemLayoutVt{}));

  // Byte offsets within a stage of V (N, d) and of V^T (d, N): a unit's
  // corner, and a lane's row (of V: key 8i + l%8 of matrix i = l/8; of V^T:
  // entry 2(l%8) + j%2, keys 16(j/2).. of matrix j = l/8) within the unit.
  CUTE_HOST_DEVICE static constexpr uint32_t unit_v(int u) {
    return LayoutV{}(make_coord(32 * (u % kKeyRegions), 16 * (u / kKeyRegions)));
  }
  CUTE_HOST_DEVICE static constexpr uint32_t unit_vt(int u) {
    return LayoutVt{}(make_coord(16 * (u / kKeyRegions), 32 * (u % kKeyRegions)));
  }
  CUTE_HOST_DEVICE static constexpr uint32_t lane_v(int l) { return LayoutV{}(make_coord(l, 0)); }
  CUTE_HOST_DEVICE static constexpr uint32_t lane_vt(int l) {
    return LayoutVt{}(make_coord(2 * (l % 8) + (l / 8) % 2, 16 * (l / 16)));
  }

  // The two parts touch different bits of the unswizzled offset and a
  // swizzle is linear over GF(2), so an offset is unit ^ lane. Outside the
  // bits both parts can set (the swizzled 16-byte column), ^ is +: the
  // lane's part there joins the stage's address once, the unit's is an
  // immediate, and one XOR of the column bits is left per unit.
  template <class UnitPart, class LanePart>
  static constexpr uint32_t shared_bits(UnitPart unit, LanePart lane) {
    uint32_t units = 0, lanes = 0;
    for (int u = 0; u < kUnits; ++u) units |= unit(u);
    for (int l = 0; l < cutlass::NumThreadsPerWarp; ++l) lanes |= lane(l);
    return units & lanes;
  }
  static constexpr uint32_t kSharedV = shared_bits(unit_v, lane_v);
  static constexpr uint32_t kSharedVt = shared_bits(unit_vt, lane_vt);
  static constexpr bool separable(int u) {
    for (int l = 0; l < cutlass::NumThreadsPerWarp; ++l) {
      int const k = 32 * (u % kKeyRegions), d = 16 * (u / kKeyRegions);
      if (uint32_t(LayoutV{}(make_coord(k + l, d))) != (unit_v(u) ^ lane_v(l))) return false;
      if (uint32_t(LayoutVt{}(make_coord(d + 2 * (l % 8) + (l / 8) % 2, k + 16 * (l / 16)))) !=
          (unit_vt(u) ^ lane_vt(l))) {
        return false;
      }
    }
    return true;
  }
  // One constant evaluation per unit (a template argument each): the whole
  // check at once passes the compiler's constexpr budget for large tiles.
  template <int... kUnit>
  static constexpr bool separable(std::integer_sequence<int, kUnit...>) {
    return (std::bool_constant<separable(kUnit)>::value && ...);
  }
  static_assert(separable(std::make_integer_sequence<int, kUnits>{}),
                "a unit's and a lane's offsets must combine by XOR");

  // Warp w's units (w, w + kWarps, ...) ordered by the swizzle bits their
  // addresses XOR into the lane's, so that one such address is live at a time.
  template <int kWarp, int kMine>
  static constexpr cute::array<int, kMine> unit_order() {
    cute::array<int, kMine> order{};
    auto key = [](int u) { return (unit_v(u) & kSharedV) << 16 | (unit_vt(u) & kSharedVt); };
    for (int i = 0; i < kMine; ++i) {
      int const u = kWarp + kWarps * i;
      int j = i;
      for (; j > 0 && key(order[j - 1]) > key(u); --j) order[j] = order[j - 1];
      order[j] = u;
    }
    return order;
  }

  // v, vt: one stage of V as loaded and of V^T as the GEMM reads it. The
  // warp index picks one of kWarps unrolled copies, so each unit's part is
  // a constant.
  CUTE_DEVICE static void run(char* v, char* vt, int thread_idx) {
    // The lane is read afresh: its parts are computed here, each stage,
    // instead of being hoisted out of the loops with one XOR per unit and
    // spilled (the transposers hold 24 registers).
    uint32_t lane;
    asm volatile("mov.u32 %0, %%laneid;" : "=r"(lane));
    uint32_t const lane_v_all = lane_v(int(lane)), lane_vt_all = lane_vt(int(lane));
    v += lane_v_all & ~kSharedV;
    vt += lane_vt_all & ~kSharedVt;
    uint32_t const v_shared = lane_v_all & kSharedV, vt_shared = lane_vt_all & kSharedVt;
    int const warp = thread_idx / cutlass::NumThreadsPerWarp;
    cute::for_each(make_int_sequence<kWarps>{}, [&](auto w) {
      constexpr int kWarp = decltype(w)::value;
      constexpr int kMine = (kUnits - kWarp + kWarps - 1) / kWarps;  // units kWarp, kWarp + kWarps, ...
      if (warp != kWarp) return;
      constexpr cute::array<int, kMine> kOrder = unit_order<kWarp, kMine>();
      cute::for_each(make_int_sequence<(kMine + kInFlight - 1) / kInFlight>{}, [&](auto batch) {
        constexpr int kFirst = decltype(batch)::value * kInFlight;
        constexpr int kCount = cute::min(kInFlight, kMine - kFirst);
        uint32_t r[kCount][4];
        CUTE_UNROLL
        for (int i = 0; i < kCount; ++i) {
          uint32_t const unit = unit_v(kOrder[kFirst + i]);
          char const* src = v + (unit & ~kSharedV) + (v_shared ^ (unit & kSharedV));
          SM75_U16x8_LDSM_T::copy(*reinterpret_cast<uint128_t const*>(src), r[i][0], r[i][1], r[i][2], r[i][3]);
        }
        CUTE_UNROLL
        for (int i = 0; i < kCount; ++i) {
          uint32_t const unit = unit_vt(kOrder[kFirst + i]);
          char* dst = vt + (unit & ~kSharedVt) + (vt_shared ^ (unit & kSharedVt));
          SM90_U32x4_STSM_N::copy(__byte_perm(r[i][0], r[i][1], 0x6420), __byte_perm(r[i][0], r[i][1], 0x7531),
                                  __byte_perm(r[i][2], r[i][3], 0x6420), __byte_perm(r[i][2], r[i][3], 0x7531),
                                  *reinterpret_cast<uint128_t*>(dst));
        }
      });
    });
  }
};

}  // namespace flash3::fwd
