// What the launch code needs to know of the current device.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "flash3/flash3.h"

namespace flash3 {

struct DeviceInfo {
  int id = 0;
  int num_sms = 0;
  int64_t l2_bytes = 0;
};

// Fills `info` for the current device; kUnsupported unless it is sm_90 (the
// kernels are built for sm_90a, which runs on compute capability 9.0 only).
Status query_device(DeviceInfo& info);

// The forward's tile counter (persistent launches with more tiles than SMs):
// zero when a launch starts, and left zero by it (fwd::Kernel::next_tile).
// - A direct call uses its stream's own counter, one int per (device, stream),
//   zeroed in stream order when first used and kept for the process's
//   lifetime. Launches on one stream run one after another, so none needs a
//   memset before it (+1-2% on short causal calls, performance record run
//   72), and calls on other streams have their own. cudaStreamPerThread, one
//   handle for a different stream in each host thread, has one per thread.
// - Under graph capture the counter is the graph's own allocation, zeroed and
//   freed by its nodes: replays may run on any stream, beside direct calls.
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
