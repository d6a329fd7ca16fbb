// The register split of warp-specialized kernels (setmaxnreg).
#pragma once

namespace flash3 {

// setmaxnreg moves registers only within what the CTA was launched with:
// 64K / threads per thread, rounded down to a multiple of 8 (168 for 384
// threads, 128 for 512). A split asking for more than that waits in
// setmaxnreg forever (producer 32 + consumers 240 at 384 threads hung on the
// GPU), so each kernel's traits assert that theirs fits.
constexpr bool fits_launch_registers(int threads, int producer_threads, int producer_registers,
                                     int consumer_registers) {
  int const per_thread = 64 * 1024 / threads / 8 * 8;
  return producer_threads * producer_registers + (threads - producer_threads) * consumer_registers <=
         threads * per_thread;
}

}  // namespace flash3
