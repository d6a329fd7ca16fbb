// The supported head dims (common/head_dims.inc, the one list), for the
// API's validation and messages. No CuTe.
#pragma once

#include <cstdint>
#include <string>

namespace flash3 {

struct HeadDimSupport {
  int head_dim;
  bool fp8;
};

// Q/K's head dim and V's, where they differ.
struct HeadDimPair {
  int head_dim;
  int head_dim_v;
};

#define FLASH3_HEAD_DIM_PAIR(D, DV)
inline constexpr HeadDimSupport kHeadDims[] = {
#define FLASH3_HEAD_DIM(D, FP8) {D, FP8},
#include "common/head_dims.inc"
#undef FLASH3_HEAD_DIM
};
#undef FLASH3_HEAD_DIM_PAIR

#define FLASH3_HEAD_DIM(D, FP8)
inline constexpr HeadDimPair kHeadDimPairs[] = {
#define FLASH3_HEAD_DIM_PAIR(D, DV) {D, DV},
#include "common/head_dims.inc"
#undef FLASH3_HEAD_DIM_PAIR
};
#undef FLASH3_HEAD_DIM

// MLA in its absorbed form (ForwardArgs::qv): Q and K hold the rotary part
// (head_dim), V, Qv and O the latent part (head_dim_v), as DeepSeek-V2/V3's
// 64 and 512.
inline constexpr HeadDimPair kMlaHeadDims{64, 512};

// Whether a call's head dims are MLA's (head_dim_v 0 is head_dim's).
constexpr bool mla_head_dims(int64_t head_dim, int64_t head_dim_v) {
  return head_dim == kMlaHeadDims.head_dim && head_dim_v == kMlaHeadDims.head_dim_v;
}

constexpr bool head_dim_supported(int64_t head_dim, bool fp8) {
  for (HeadDimSupport const& h : kHeadDims) {
    if (h.head_dim == head_dim && (h.fp8 || !fp8)) return true;
  }
  return false;
}

// V's head dim of a call's arguments (ForwardArgs, BackwardArgs): head_dim_v,
// 0 meaning head_dim.
template <class Args>
constexpr int64_t head_dim_v_of(Args const& a) {
  return a.head_dim_v != 0 ? a.head_dim_v : a.head_dim;
}

// A V head dim for Q/K's: 0 or the same, or a pair's.
constexpr bool head_dim_v_supported(int64_t head_dim, int64_t head_dim_v) {
  if (head_dim_v == 0 || head_dim_v == head_dim) return true;
  for (HeadDimPair const& p : kHeadDimPairs) {
    if (p.head_dim == head_dim && p.head_dim_v == head_dim_v) return true;
  }
  return false;
}

// "64, 96, 128, 192 or 256" (of those FP8 supports, with fp8).
inline std::string head_dim_list(bool fp8) {
  std::string list, last;
  for (HeadDimSupport const& h : kHeadDims) {
    if (fp8 && !h.fp8) continue;
    if (!last.empty()) list += list.empty() ? last : ", " + last;
    last = std::to_string(h.head_dim);
  }
  return list.empty() ? last : list + " or " + last;
}

// "128 with head_dim 192" (the pairs, in words).
inline std::string head_dim_pair_list() {
  std::string list;
  for (HeadDimPair const& p : kHeadDimPairs) {
    if (!list.empty()) list += ", ";
    list += std::to_string(p.head_dim_v) + " with head_dim " + std::to_string(p.head_dim);
  }
  return list;
}

}  // namespace flash3
