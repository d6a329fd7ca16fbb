#!/usr/bin/env bash
# Builds flash3's wheel (python/flash3 with libflash3_c) into dist/, offline:
# without build isolation, so nothing is downloaded, and scikit-build-core
# (>= 0.10), CMake (>= 3.25), Ninja and nvcc must be installed already.
#   scripts/build_wheel.sh [pip wheel arguments, e.g. -v to see the build]
# Environment, each optional:
#   FLASH3_HEAD_DIMS="128"         head dims to compile (a CMake list: "64;128"); default all
#   FLASH3_DTYPES="bf16"           dtypes to compile (bf16, fp16, e4m3); default all
#   FLASH3_CUTLASS_DIR=<dir>       CUTLASS headers (holding cute/ and cutlass/); without it
#                                  CMake pip-installs nvidia-cutlass, which needs the network
#   CMAKE_ARGS="-D..."             more CMake arguments (e.g. ccache as compiler launcher)
#   CMAKE_BUILD_PARALLEL_LEVEL=N   compile jobs (default: Ninja's, one per core)
set -euo pipefail
cd "$(dirname "$0")/.."
if ! python3 -c "import scikit_build_core" 2>/dev/null; then
  echo "build_wheel.sh: needs scikit-build-core: python3 -m pip install 'scikit-build-core>=0.10'" >&2
  exit 1
fi
python3 -m pip wheel . --no-deps --no-build-isolation -w dist "$@"
