// FP8's descale factors as a policy of the consumer mainloop (the paper's
// §3.3 block quantization): a stored value x stands for x * scale, so S of
// key block n is scaled by Q's descale times K_n's, and O, accumulated in
// units of the descale of the V block last added, is rescaled by the ratio
// when the next block's differs. 16-bit inputs take NoDescale, which the
// compiler removes.
#pragma once

#include <cute/tensor.hpp>

#include "common/scale_view.h"
#include "common/tile_order.h"

namespace flash3::fwd {

// One key block's factors: S's (Q's times K's) and V's.
struct BlockDescale {
  float qk = 1.f;
  float v = 1.f;
};

struct NoDescale {
  template <class Params, class SharedStorage>
  CUTE_DEVICE NoDescale(Params const&, SharedStorage const&, TileCoord, int, int) {}
  CUTE_DEVICE BlockDescale block(int) const { return {}; }
  CUTE_DEVICE void start(BlockDescale) {}
  // Whether O needs rescaling for the next block besides a moved row max.
  template <int kRows>
  CUTE_DEVICE bool fold(float (&)[kRows], BlockDescale) {
    return false;
  }
  // The factor O still needs besides 1 / l.
  CUTE_DEVICE float o_factor() const { return 1.f; }
};

template <class MainloopT>
struct Fp8Descale {
  using Traits = typename MainloopT::Traits;
  using Params = typename MainloopT::Params;
  using SharedStorage = typename Traits::SharedStorage;
  // Read where they are (kernel parameters, shared memory) at each use, not
  // held in registers through the mainloop.
  Params const& p;
  SharedStorage const& smem;
  int q_stage;  // Q's buffer, beside which the producer put Q's descale
  // K's and V's descales share one layout (launch.h), so one offset of this
  // tile's (batch, head) serves both: a register, not two pointers. (32 bits:
  // validate() keeps batch * heads * ceil(seqlen / 64) below 2^31, packed
  // sequences' batch and longest seqlen too, and a scale block is >= 64 rows.)
  int kv_offset;
  float v_descale = 1.f;  // of the V block last added to O

  CUTE_DEVICE Fp8Descale(Params const& p, SharedStorage const& smem, TileCoord tile, int head_kv, int q_stage)
      : p(p), smem(smem), q_stage(q_stage),
        kv_offset(int(tile.batch * p.k_scale.batch_stride + head_kv * p.k_scale.head_stride)) {}

  // Loaded before the block's GEMMs are issued, so that the loads' latency
  // hides behind them. A scale block is a key block (fp8_scale_blocks); with
  // packed sequences tile.batch is the sequence and n_block counts from its
  // first key, as the scales' layout does (flash3.h, Varlen).
  CUTE_DEVICE BlockDescale block(int n_block) const {
    int const i = kv_offset + n_block * int(p.k_scale.block_stride);
    return {smem.q_descale[q_stage] * p.k_scale.data[i], p.v_scale.data[i]};
  }
  CUTE_DEVICE void start(BlockDescale first) { v_descale = first.v; }
  // O in units of the next block's V descale: the ratio joins O's rescale.
  template <int kRows>
  CUTE_DEVICE bool fold(float (&o_scale)[kRows], BlockDescale next) {
    float const ratio = v_descale / next.v;
    v_descale = next.v;
    CUTE_UNROLL
    for (int r = 0; r < kRows; ++r) o_scale[r] *= ratio;
    return true;
  }
  CUTE_DEVICE float o_factor() const { return v_descale; }
};

}  // namespace flash3::fwd
