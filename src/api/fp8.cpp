// FP8 scale blocks: made of the forward kernel's tiles, so that per-block
// scales apply at no extra pass.
#include "common/head_dims.h"
#include "flash3/flash3.h"
#include "fwd/tile_size.h"

namespace flash3 {

Fp8BlockSizes fp8_block_sizes(int64_t head_dim) {
  if (!head_dim_supported(head_dim, true)) return {};
  fwd::Fp8ScaleBlocks const b = fwd::fp8_scale_blocks(int(head_dim));
  return {b.q, b.kv};
}

int64_t fp8_scale_count(ScaleGranularity granularity, int64_t batch, int64_t heads, int64_t seqlen, int64_t block) {
  if (batch < 0 || heads < 0 || seqlen < 0) return 0;
  switch (granularity) {
    case ScaleGranularity::kPerTensor: return 1;
    case ScaleGranularity::kPerHead: return batch * heads;
    case ScaleGranularity::kPerBlock: return block > 0 ? batch * heads * ((seqlen + block - 1) / block) : 0;
  }
  return 0;
}

}  // namespace flash3
