// The forward kernel's tile scheduler: the grid, and which tile a CTA works
// on next. It is a template parameter of the kernel (fwd::Kernel<Mainloop,
// Epilogue, Scheduler>); another scheduler (per-sequence tiles, KV splits)
// provides the same members and leaves the mainloop untouched:
//   Params                                   the kernel's scheduler parameter
//   Launch (host)                            one call's grid and Params,
//                                            held from prepare() to finish()
//   first_tile(), claim_issue(p),            the tile loop: indices >=
//   next_tile(p, tile, claim), num_tiles(p),  num_tiles end it, coord() decodes
//   coord(p, tile)                           one
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>

#include "common/device_info.h"
#include "common/tile_counter.h"
#include "common/tile_order.h"

namespace flash3 {

// The tiles in TileOrder over a persistent grid (one CTA per SM) or a
// one-shot one (a CTA per tile: the ablation without persistence). A
// persistent CTA takes its first tile by blockIdx, then claims the next from
// a counter when it finishes one: causal tiles differ in cost, and even
// equal ones finish at different times on different SMs, so claims keep
// every SM busy to the end where a fixed stride would not.
struct PersistentTileScheduler {
  struct Params {
    TileOrder order;
    // Zero at the launch (the caller's, or a TileCounter). nullptr: no more
    // tiles than CTAs, CTA c takes tile c alone.
    int* counter;
  };

  // One call's grid and parameters. kv_bytes_per_head: K and V bytes one
  // query head reads (TileOrder's L2 sections).
  class Launch {
   public:
    // given_counter: the caller's (ForwardArgs::tile_counter), used instead
    // of a TileCounter when CTAs claim tiles; nullptr: flash3's own.
    cudaError_t prepare(int num_m_blocks, int num_heads, int num_batch, int64_t kv_bytes_per_head, bool causal,
                        bool persistent, DeviceInfo const& device, int* given_counter, cudaStream_t stream) {
      int const tiles = num_m_blocks * num_heads * num_batch;
      grid_ = persistent ? std::min(tiles, device.num_sms) : tiles;
      TileOrder const order =
          TileOrder::make(num_m_blocks, num_heads, num_batch, kv_bytes_per_head, device.l2_bytes, causal, grid_);
      cudaError_t err = cudaSuccess;
      int* counter = nullptr;
      if (grid_ < tiles) {
        if (given_counter == nullptr) err = counter_.acquire(device.id, stream);
        counter = given_counter != nullptr ? given_counter : counter_.get();
      }
      params_ = Params{order, counter};
      return err;
    }
    // After the launch: a graph's counter is freed in the graph.
    cudaError_t finish(cudaStream_t stream) { return counter_.release(stream); }
    int grid() const { return grid_; }
    Params const& params() const { return params_; }

   private:
    TileCounter counter_;
    Params params_{};
    int grid_ = 0;
  };

#if defined(__CUDACC__)
  __device__ __forceinline__ static int num_tiles(Params const& p) { return p.order.num_tiles(); }
  __device__ __forceinline__ static TileCoord coord(Params const& p, int tile) { return p.order.tile(tile); }
  __device__ __forceinline__ static int first_tile() { return int(blockIdx.x); }

  // Claims: common/tile_counter.h's.
  __device__ __forceinline__ static int claim_issue(Params const& p) { return flash3::claim_issue(p.counter); }
  __device__ __forceinline__ static int next_tile(Params const& p, int tile, int claim) {
    return claimed_tile(p.counter, tile, claim, p.order.num_tiles());
  }
#endif
};

}  // namespace flash3
