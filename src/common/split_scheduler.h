// The forward's tile scheduler for split-KV: PersistentTileScheduler's
// members (common/tile_scheduler.h) over tiles (m_block, head, batch,
// split). The splits of an M-block are its TileOrder's M-blocks, one after
// the other (m_block * num_splits + split), so that the CTAs that share a
// (batch, head) run side by side over its K and V.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "common/device_info.h"
#include "common/tile_order.h"
#include "common/tile_scheduler.h"

namespace flash3 {

// A tile index's coordinates: the order over num_m_blocks * num_splits
// M-blocks, decoded.
FLASH3_HOST_DEVICE TileCoord split_tile(TileOrder const& order, int num_splits, int index) {
  TileCoord c = order.tile(index);
  c.split = c.m_block % num_splits;
  c.m_block /= num_splits;
  return c;
}

struct SplitTileScheduler {
  struct Params {
    PersistentTileScheduler::Params tiles;  // over num_m_blocks * num_splits M-blocks
    int num_splits;
  };

  class Launch {
   public:
    // As PersistentTileScheduler::Launch::prepare, every tile split in
    // num_splits; the grid is persistent.
    cudaError_t prepare(int num_m_blocks, int num_splits, int num_heads, int num_batch, int64_t kv_bytes_per_head,
                        bool causal, DeviceInfo const& device, int* given_counter, cudaStream_t stream) {
      cudaError_t const err = tiles_.prepare(num_m_blocks * num_splits, num_heads, num_batch,
                                             kv_bytes_per_head, causal, true, device, given_counter,
                                             stream);
      params_ = Params{tiles_.params(), num_splits};
      return err;
    }
    cudaError_t finish(cudaStream_t stream) { return tiles_.finish(stream); }
    int grid() const { return tiles_.grid(); }
    Params const& params() const { return params_; }

   private:
    PersistentTileScheduler::Launch tiles_;
    Params params_{};
  };

#if defined(__CUDACC__)
  __device__ __forceinline__ static int num_tiles(Params const& p) { return p.tiles.order.num_tiles(); }
  __device__ __forceinline__ static TileCoord coord(Params const& p, int tile) {
    return split_tile(p.tiles.order, p.num_splits, tile);
  }
  __device__ __forceinline__ static int first_tile() { return int(blockIdx.x); }
  __device__ __forceinline__ static int claim_issue(Params const& p) { return flash3::claim_issue(p.tiles.counter); }
  __device__ __forceinline__ static int next_tile(Params const& p, int tile, int claim) {
    return claimed_tile(p.tiles.counter, tile, claim, num_tiles(p));
  }
#endif
};

}  // namespace flash3
