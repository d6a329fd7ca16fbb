// Integer division helpers for block counts, usable on host and device.
#pragma once

#include "common/host_device.h"

namespace flash3 {

FLASH3_HOST_DEVICE int div_up(int a, int b) { return (a + b - 1) / b; }
// Rounds toward minus infinity (b > 0), for offsets that may be negative.
FLASH3_HOST_DEVICE int div_floor(int a, int b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

}  // namespace flash3
