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
ctest --test-dir "$build" --output-on-failure
