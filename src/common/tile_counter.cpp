#include "common/tile_counter.h"

#include <map>
#include <mutex>
#include <utility>

namespace flash3 {

namespace {

// A counter allocated and zeroed in stream order. A stream's is never freed:
// it stays valid on its stream, and on a later stream given the same handle,
// which only exists once this one's work has finished and left it zero.
// On failure to allocate, *counter is nullptr.
cudaError_t new_counter(int** counter, cudaStream_t stream) {
  cudaError_t const err = cudaMallocAsync(reinterpret_cast<void**>(counter), sizeof(int), stream);
  if (err != cudaSuccess) {
    *counter = nullptr;
    return err;
  }
  return cudaMemsetAsync(*counter, 0, sizeof(int), stream);
}

}  // namespace

cudaError_t TileCounter::acquire(int device, cudaStream_t stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  cudaError_t err = cudaStreamIsCapturing(stream, &capture);
  if (err != cudaSuccess) return err;
  if (capture != cudaStreamCaptureStatusNone) {
    err = new_counter(&ptr_, stream);
    graph_owned_ = ptr_ != nullptr;
    return err;
  }
  int** counter;
  std::unique_lock<std::mutex> lock;
  if (stream == cudaStreamPerThread) {
    // One handle, a different stream in each host thread: the thread's own.
    thread_local std::map<int, int*> per_thread;
    counter = &per_thread[device];
  } else {
    static std::mutex mutex;
    static std::map<std::pair<int, cudaStream_t>, int*> per_stream;
    lock = std::unique_lock<std::mutex>(mutex);
    counter = &per_stream[std::make_pair(device, stream)];
  }
  if (*counter == nullptr && (err = new_counter(counter, stream)) != cudaSuccess) return err;
  ptr_ = *counter;
  return cudaSuccess;
}

cudaError_t TileCounter::release(cudaStream_t stream) {
  if (!graph_owned_) return cudaSuccess;
  graph_owned_ = false;
  return cudaFreeAsync(ptr_, stream);
}

}  // namespace flash3
