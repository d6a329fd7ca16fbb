// test_gpu's main: gtest's, except that a run that passed without a CUDA
// device exits with 77, which ctest reports as skipped (SKIP_RETURN_CODE).
#include <gtest/gtest.h>

#include "gpu_test_util.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  int const rc = RUN_ALL_TESTS();
  if (rc == 0 && flash3::testing::cuda_device().state == flash3::testing::CudaDevice::kAbsent) return 77;
  return rc;
}
