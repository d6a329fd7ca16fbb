// FP8 descale factors as the kernels read them: one float per (batch, head,
// block of rows), the three granularities differing only in their strides
// (per tensor: all 0; per head: the block stride 0), per head also shared by
// a GQA group's query heads (Fp8Scales::q_per_kv_head). CuTe-free, so that
// the API and the references share it.
#pragma once

#include <cstdint>

#include "common/host_device.h"
#include "flash3/flash3.h"

namespace flash3 {

struct ScaleView {
  float const* data = nullptr;
  int64_t batch_stride = 0;
  int64_t head_stride = 0;
  int64_t block_stride = 0;
  int64_t heads_per_scale = 1;  // consecutive heads that share one head's scales

  FLASH3_HOST_DEVICE float operator()(int64_t batch, int64_t head, int64_t block) const {
    int64_t const scale_head = heads_per_scale == 1 ? head : head / heads_per_scale;
    return data[batch * batch_stride + scale_head * head_stride + block * block_stride];
  }
};

// The layouts fp8_scale_count() describes; per head, `heads_per_scale`
// consecutive heads may share one scale ([batch, heads / heads_per_scale]).
inline ScaleView make_scale_view(float const* data, ScaleGranularity granularity, int64_t heads, int64_t seqlen,
                                 int64_t block, int64_t heads_per_scale = 1) {
  switch (granularity) {
    case ScaleGranularity::kPerHead: return {data, heads / heads_per_scale, 1, 0, heads_per_scale};
    case ScaleGranularity::kPerBlock: {
      int64_t const blocks = block > 0 ? (seqlen + block - 1) / block : 0;
      return {data, heads * blocks, blocks, 1};
    }
    default: return {data, 0, 0, 0};
  }
}

}  // namespace flash3
