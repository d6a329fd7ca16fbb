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

inline constexpr HeadDimSupport kHeadDims[] = {
#define FLASH3_HEAD_DIM(D, FP8) {D, FP8},
#include "common/head_dims.inc"
#undef FLASH3_HEAD_DIM
};

constexpr bool head_dim_supported(int64_t head_dim, bool fp8) {
  for (HeadDimSupport const& h : kHeadDims) {
    if (h.head_dim == head_dim && (h.fp8 || !fp8)) return true;
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

}  // namespace flash3
