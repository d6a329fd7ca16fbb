// The device a call runs on: the API layer checks it before any launch.
#pragma once

#include "common/device_info.h"
#include "flash3/flash3.h"

namespace flash3 {

// Fills `info` for the current device; kUnsupported unless it is sm_90 (the
// kernels are built for sm_90a, which runs on compute capability 9.0 only).
Status query_device(DeviceInfo& info);

}  // namespace flash3
