// The backward kernel's tile scheduler, a template parameter of bwd::Kernel:
// one CTA per (key block, query head, batch), or, without the causal mask,
// per part of a tile in the last wave (bwd/tail_split.h). CTAs start in
// blockIdx order, so the order is the grid's:
// - Causal key blocks differ in work (block j visits the query blocks from
//   its diagonal down): the grid is (key block, head, batch), the longest
//   blocks, j = 0, first; deterministic launches go last to first instead,
//   the order in which their dQ turns come (Mainloop::deterministic_turn).
// - Blocks without the mask take equal times: the grid counts tiles, key
//   blocks innermost, then the parts of the split ones.
#pragma once

#include <cuda_runtime_api.h>

#include "bwd/tail_split.h"

namespace flash3::bwd {

template <bool kCausal>
struct KeyBlockScheduler {
  struct Params {
    int tiles;  // n_blocks x heads x batch
    int n_blocks;
    int num_heads;
    bool deterministic;
    TailSplit split;
  };

  // A CTA's key block, head, batch and part.
  struct Work {
    int n_block;
    int head;
    int batch;
    TilePart part;
  };

  static dim3 grid(Params const& p, int batch) {
    return kCausal ? dim3(unsigned(p.n_blocks), unsigned(p.num_heads), unsigned(batch))
                   : dim3(unsigned(p.split.ctas(p.tiles)));
  }

#if defined(__CUDACC__)
  // Decoded by each role for itself, where it needs it: held across the
  // roles' branch, a decoded value cost the consumers a register. (Decoding
  // the causal grid from one index as well cost registers the mainloop
  // spilled.)
  __device__ __forceinline__ static Work work(Params const& p) {
    if constexpr (kCausal) {
      int const j = p.deterministic ? int(gridDim.x - 1 - blockIdx.x) : int(blockIdx.x);
      return Work{j, int(blockIdx.y), int(blockIdx.z), TilePart{-1, 0, 1, -1}};
    } else {
      TilePart const part = tile_part(int(blockIdx.x), p.tiles, p.split);
      int const rows = part.tile / p.n_blocks;
      return Work{part.tile % p.n_blocks, rows % p.num_heads, rows / p.num_heads, part};
    }
  }
#endif
};

}  // namespace flash3::bwd
