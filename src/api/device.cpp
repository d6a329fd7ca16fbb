#include "api/device.h"

#include <cuda_runtime_api.h>

#include <mutex>
#include <string>

namespace flash3 {

namespace {

// What the runtime says of one device: read once, since none of it changes
// while the process runs, and each attribute query costs host time per call.
struct DeviceAttributes {
  cudaError_t err = cudaSuccess;
  int major = 0, minor = 0, num_sms = 0, l2_bytes = 0;
};

DeviceAttributes read_attributes(int device) {
  DeviceAttributes a;
  a.err = cudaDeviceGetAttribute(&a.major, cudaDevAttrComputeCapabilityMajor, device);
  if (a.err == cudaSuccess) a.err = cudaDeviceGetAttribute(&a.minor, cudaDevAttrComputeCapabilityMinor, device);
  if (a.err == cudaSuccess) a.err = cudaDeviceGetAttribute(&a.num_sms, cudaDevAttrMultiProcessorCount, device);
  if (a.err == cudaSuccess) a.err = cudaDeviceGetAttribute(&a.l2_bytes, cudaDevAttrL2CacheSize, device);
  if (a.err != cudaSuccess) cudaGetLastError();  // do not leave the error for the caller's next check
  return a;
}

DeviceAttributes const& attributes(int device) {
  constexpr int kCached = 64;  // devices past these are read on every call
  static std::once_flag once[kCached];
  static DeviceAttributes cached[kCached];
  if (device < 0 || device >= kCached) {
    thread_local DeviceAttributes uncached;
    uncached = read_attributes(device);
    return uncached;
  }
  std::call_once(once[device], [device] { cached[device] = read_attributes(device); });
  return cached[device];
}

Status no_device(cudaError_t err) {
  return Status(Status::Code::kCudaError, std::string("no usable CUDA device: ") + cudaGetErrorString(err));
}

}  // namespace

Status query_device(DeviceInfo& info) {
  int device = 0;
  if (cudaError_t const err = cudaGetDevice(&device); err != cudaSuccess) {
    cudaGetLastError();
    return no_device(err);
  }
  DeviceAttributes const& a = attributes(device);
  if (a.err != cudaSuccess) return no_device(a.err);
  if (a.major != 9 || a.minor != 0) {
    return Status(Status::Code::kUnsupported, "device: flash3 needs a Hopper GPU (sm_90); this one is sm_" +
                                                  std::to_string(a.major) + std::to_string(a.minor));
  }
  info.id = device;
  info.num_sms = a.num_sms;
  info.l2_bytes = a.l2_bytes;
  return Status();
}

}  // namespace flash3
