#include "api/device.h"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <string>

namespace flash3 {

Status query_device(DeviceInfo& info) {
  int device = 0;
  int major = 0, minor = 0, l2 = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&info.num_sms, cudaDevAttrMultiProcessorCount, device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device);
  if (err != cudaSuccess) {
    cudaGetLastError();  // do not leave the error for the caller's next check
    return Status(Status::Code::kCudaError, std::string("no usable CUDA device: ") + cudaGetErrorString(err));
  }
  if (major != 9 || minor != 0) {
    return Status(Status::Code::kUnsupported, "device: flash3 needs a Hopper GPU (sm_90); this one is sm_" +
                                                  std::to_string(major) + std::to_string(minor));
  }
  info.id = device;
  info.l2_bytes = l2;
  return Status();
}

cudaError_t scratch_alloc_async(void** ptr, size_t bytes, int device, cudaStream_t stream) {
  // Captured in a graph, the allocation is the graph's own, kept across
  // replays (and no pool is created while a capture forbids it).
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  cudaError_t const capture_err = cudaStreamIsCapturing(stream, &capture);
  if (capture_err != cudaSuccess) return capture_err;
  if (capture != cudaStreamCaptureStatusNone) return cudaMallocAsync(ptr, bytes, stream);
  static std::mutex mutex;
  static std::map<int, cudaMemPool_t> pools;  // one per device, for the process's lifetime
  cudaMemPool_t pool;
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = pools.find(device);
    if (it == pools.end()) {
      cudaMemPoolProps props = {};
      props.allocType = cudaMemAllocationTypePinned;
      props.handleTypes = cudaMemHandleTypeNone;
      props.location.type = cudaMemLocationTypeDevice;
      props.location.id = device;
      cudaError_t err = cudaMemPoolCreate(&pool, &props);
      if (err != cudaSuccess) return err;
      // Keep what was allocated once: these allocations are a few bytes.
      uint64_t keep = UINT64_MAX;
      err = cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
      if (err != cudaSuccess) {
        cudaMemPoolDestroy(pool);
        return err;
      }
      it = pools.emplace(device, pool).first;
    }
    pool = it->second;
  }
  return cudaMallocFromPoolAsync(ptr, bytes, pool, stream);
}

}  // namespace flash3
