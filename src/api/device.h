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

// Small stream-ordered scratch allocations of the launch code (the causal
// forward's tile counter), from a memory pool of flash3's own per device that
// keeps its memory between calls. The default pool returns its memory at
// every synchronization, and allocating it again cost a causal forward call
// after one 40-100 us (performance record, run 57). Free with cudaFreeAsync.
cudaError_t scratch_alloc_async(void** ptr, size_t bytes, int device, cudaStream_t stream);

}  // namespace flash3
