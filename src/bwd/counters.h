// The backward's counters in global memory (WorkspaceLayout): the
// preprocess's items done per head, the key blocks that have added to each dQ
// tile. A kernel counts its finished work in with release; another waits,
// with acquire, until a count is reached, and then sees that work.
#pragma once

#include <cuda/atomic>

namespace flash3::bwd {

__device__ __forceinline__ void count_in(int* counter) {
  cuda::atomic_ref<int, cuda::thread_scope_device>(*counter).fetch_add(1, cuda::memory_order_release);
}

// Spins until *counter >= value, reading it every kBackoffNs nanoseconds
// (0: back to back, where the wait holds up a critical path).
template <unsigned kBackoffNs = 0>
__device__ __forceinline__ void wait_at_least(int* counter, int value) {
  cuda::atomic_ref<int, cuda::thread_scope_device> const count(*counter);
  while (count.load(cuda::memory_order_acquire) < value) {
    if constexpr (kBackoffNs > 0) __nanosleep(kBackoffNs);
  }
}

}  // namespace flash3::bwd
