#include "api/device.h"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>

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

namespace {

// A counter allocated and zeroed in stream order, never freed: it stays valid
// on its stream, and on a later stream given the same handle, which only
// exists once this one's work has finished and left the counter zero.
cudaError_t new_counter(int** counter, cudaStream_t stream) {
  cudaError_t err = cudaMallocAsync(reinterpret_cast<void**>(counter), sizeof(int), stream);
  return err == cudaSuccess ? cudaMemsetAsync(*counter, 0, sizeof(int), stream) : err;
}

}  // namespace

cudaError_t TileCounter::acquire(int device, cudaStream_t stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  cudaError_t err = cudaStreamIsCapturing(stream, &capture);
  if (err != cudaSuccess) return err;
  if (capture != cudaStreamCaptureStatusNone) {
    err = cudaMallocAsync(reinterpret_cast<void**>(&ptr_), sizeof(int), stream);
    graph_owned_ = err == cudaSuccess;
    return err == cudaSuccess ? cudaMemsetAsync(ptr_, 0, sizeof(int), stream) : err;
  }
  if (stream == cudaStreamPerThread) {
    // One handle, a different stream in each host thread: the thread's own.
    thread_local std::map<int, int*> per_thread;
    int*& counter = per_thread[device];
    if (counter == nullptr && (err = new_counter(&counter, stream)) != cudaSuccess) return err;
    ptr_ = counter;
    return cudaSuccess;
  }
  static std::mutex mutex;
  static std::map<std::pair<int, cudaStream_t>, int*> counters;
  std::lock_guard<std::mutex> lock(mutex);
  int*& counter = counters[std::make_pair(device, stream)];
  if (counter == nullptr && (err = new_counter(&counter, stream)) != cudaSuccess) return err;
  ptr_ = counter;
  return cudaSuccess;
}

cudaError_t TileCounter::release(cudaStream_t stream) {
  if (!graph_owned_) return cudaSuccess;
  graph_owned_ = false;
  return cudaFreeAsync(ptr_, stream);
}

}  // namespace flash3
