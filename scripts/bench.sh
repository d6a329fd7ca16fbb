#!/usr/bin/env bash
# Builds flash3 and runs the main job: the benchmark sweep of the paper, each
# shape checked against the GPU reference. Needs a Hopper GPU; without one it
# says so and exits non-zero (--help builds the benchmark and prints its
# options anywhere).
#   scripts/bench.sh [flash3-bench options, see --help]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${FLASH3_BUILD_DIR:-build}
jobs=${FLASH3_JOBS:-$(nproc)}
help=0
for arg in "$@"; do
  if [[ $arg == --help || $arg == -h ]]; then help=1; fi
done
if (( ! help )) && ! nvidia-smi -L >/dev/null 2>&1; then
  echo "flash3: no NVIDIA GPU here; the benchmark needs a Hopper GPU (H100/H200). Run scripts/test.sh for the CPU tests." >&2
  exit 2
fi
cmake -S . -B "$build" -G Ninja -DFLASH3_BUILD_TESTS=OFF -DFLASH3_BUILD_BENCH=ON
cmake --build "$build" -j "$jobs" --target flash3-bench
"$build/flash3-bench" "$@"
