// FLASH3_HOST_DEVICE: plain integer code shared by the host (CPU tests, launch
// code) and the kernels.
#pragma once

#if defined(__CUDACC__)
#define FLASH3_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define FLASH3_HOST_DEVICE inline
#endif
