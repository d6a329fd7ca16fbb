// The persistent forward's tile counter (launches with more tiles than CTAs):
// zero when a launch starts, and left zero by it (PersistentTileScheduler).
// - A direct call uses its stream's own counter, one int per (device, stream),
//   zeroed in stream order when first used and kept for the process's
//   lifetime. Launches on one stream run one after another, so none needs a
//   memset before it, and calls on other streams have their own.
//   cudaStreamPerThread, one handle for a different stream in each host
//   thread, has one per thread.
// - Under graph capture the counter is the graph's own allocation, zeroed and
//   freed by its nodes: replays may run on any stream, beside direct calls.
#pragma once

#include <cuda_runtime_api.h>

namespace flash3 {

class TileCounter {
 public:
  cudaError_t acquire(int device, cudaStream_t stream);
  int* get() const { return ptr_; }
  // Frees a graph's counter (in the graph); a stream's stays.
  cudaError_t release(cudaStream_t stream);

 private:
  int* ptr_ = nullptr;
  bool graph_owned_ = false;
};

#if defined(__CUDACC__)
// The claims on a counter, by the persistent schedulers: made by one warp
// (its lane 0) and split in two, so that the atomic's round trip to L2
// passes while the warp waits for something else (the producer: the stage
// of its tile's last block). counter nullptr: no more tiles than CTAs, each
// takes the tile after its own by the grid's stride.
//
// A launch makes exactly num_tiles claims: claims 0 .. num_tiles - grid - 1
// hand out the tiles past the first wave, and each CTA stops after one claim
// more. The last claim is therefore num_tiles - 1; it zeroes the counter, so
// the next launch on the stream needs no memset.
__device__ __forceinline__ int claim_issue(int* counter) {
  bool const issues = counter != nullptr && threadIdx.x % 32 == 0;
  return issues ? atomicAdd(counter, 1) : 0;
}
__device__ __forceinline__ int claimed_tile(int* counter, int tile, int claim, int num_tiles) {
  if (counter == nullptr) return tile + int(gridDim.x);
  int next = 0;
  if (threadIdx.x % 32 == 0) {
    if (claim == num_tiles - 1) atomicExch(counter, 0);
    next = claim + int(gridDim.x);
  }
  return __shfl_sync(0xffffffff, next, 0);
}
#endif

}  // namespace flash3
