// The forward's tile scheduler for packed sequences (varlen): the members of
// PersistentTileScheduler (common/tile_scheduler.h) over VarlenTileOrder's
// tiles, whose number only the device knows. Its table is built in
// stream-ordered memory before the launch and freed after it; the grid is
// persistent, one CTA per SM at most (fewer where the sequences, all as long
// as the longest, would have fewer tiles), and CTAs claim tiles from a
// counter as PersistentTileScheduler's do.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>

#include "common/device_info.h"
#include "common/tile_counter.h"
#include "common/varlen_tiles.h"

namespace flash3 {

struct VarlenTileScheduler {
  struct Params {
    VarlenTileOrder order;
    int* counter;  // as PersistentTileScheduler's: zero at the launch, left zero; nullptr: one tile a CTA
  };

  class Launch {
   public:
    // `order` without its table, which is built here, nor the L2 and grid
    // its sections need. max_tiles bounds the tiles (every sequence as long
    // as the longest).
    cudaError_t prepare(VarlenTileOrder order, int max_tiles, DeviceInfo const& device, int* given_counter,
                        cudaStream_t stream) {
      grid_ = std::max(1, std::min(max_tiles, device.num_sms));
      order.l2_bytes = device.l2_bytes;
      order.num_ctas = grid_;
      size_t const bytes = size_t(VarlenTileTable::table_ints(order.batch)) * sizeof(int);
      cudaError_t err = cudaMallocAsync(reinterpret_cast<void**>(&table_), bytes, stream);
      if (err != cudaSuccess) return err;
      order.table = VarlenTileTable::in(table_, order.batch);
      if ((err = build_varlen_tiles(order, stream)) != cudaSuccess) return err;
      int* counter = nullptr;
      if (grid_ < max_tiles) {
        if (given_counter == nullptr) err = counter_.acquire(device.id, stream);
        counter = given_counter != nullptr ? given_counter : counter_.get();
      }
      params_ = Params{order, counter};
      return err;
    }
    // After the launch: the table freed in stream order, a graph's counter in the graph.
    cudaError_t finish(cudaStream_t stream) {
      cudaError_t err = counter_.release(stream);
      if (table_ != nullptr) {
        cudaError_t const free_err = cudaFreeAsync(table_, stream);
        if (err == cudaSuccess) err = free_err;
        table_ = nullptr;
      }
      return err;
    }
    int grid() const { return grid_; }
    Params const& params() const { return params_; }

   private:
    TileCounter counter_;
    Params params_{};
    int grid_ = 0;
    int* table_ = nullptr;
  };

#if defined(__CUDACC__)
  __device__ __forceinline__ static int num_tiles(Params const& p) { return p.order.num_tiles(); }
  __device__ __forceinline__ static TileCoord coord(Params const& p, int tile) { return p.order.tile(tile); }
  __device__ __forceinline__ static int first_tile() { return int(blockIdx.x); }

  // Claims: common/tile_counter.h's, as PersistentTileScheduler's.
  __device__ __forceinline__ static int claim_issue(Params const& p) { return flash3::claim_issue(p.counter); }
  __device__ __forceinline__ static int next_tile(Params const& p, int tile, int claim) {
    return claimed_tile(p.counter, tile, claim, num_tiles(p));
  }
#endif
};

}  // namespace flash3
