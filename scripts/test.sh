#!/usr/bin/env bash
# Builds flash3 and runs its tests: the CPU tests everywhere, the GPU tests
# where a Hopper GPU is present (they skip, saying why, elsewhere).
#   scripts/test.sh [extra cmake -D options]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${FLASH3_BUILD_DIR:-build}
jobs=${FLASH3_JOBS:-$(nproc)}
cmake -S . -B "$build" -G Ninja -DFLASH3_BUILD_TESTS=ON -DFLASH3_BUILD_BENCH=ON "$@"
cmake --build "$build" -j "$jobs"
if ! nvidia-smi -L >/dev/null 2>&1; then
  # ctest shows no output of passing tests: say here why the GPU tests skip.
  echo "GPU tests will skip: $("$build/tests/test_gpu" --gtest_filter='Forward.*' 2>&1 | grep -m1 -o 'no CUDA device.*')"
fi
ctest --test-dir "$build" --output-on-failure
