// What the launch code needs to know of the current device.
#pragma once

#include <cstdint>

#include "flash3/flash3.h"

namespace flash3 {

struct DeviceInfo {
  int num_sms = 0;
  int64_t l2_bytes = 0;
};

// Fills `info` for the current device; kUnsupported unless it is sm_90 (the
// kernels are built for sm_90a, which runs on compute capability 9.0 only).
Status query_device(DeviceInfo& info);

}  // namespace flash3
