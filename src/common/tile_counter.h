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

}  // namespace flash3
