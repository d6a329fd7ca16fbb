// What the launch code needs to know of the device it launches on. The API
// layer fills it (api/device.h) and hands it down to the kernels' launchers.
#pragma once

#include <cstdint>

namespace flash3 {

struct DeviceInfo {
  int id = 0;
  int num_sms = 0;
  int64_t l2_bytes = 0;
};

}  // namespace flash3
