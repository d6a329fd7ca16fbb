#include "api/device.h"

#include <cuda_runtime_api.h>

#include <cstdint>
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

}  // namespace flash3
