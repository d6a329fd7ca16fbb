#!/usr/bin/env bash
# Copies what a build on the GPU machine needs and it lacks into .deps/
# (git-ignored, carried by the device tool): CUTLASS's headers from a
# configured build tree and this machine's GoogleTest, with the commit.
#   scripts/stage_deps.sh [build dir holding _deps/, or a CUTLASS include dir]
set -euo pipefail
cd "$(dirname "$0")/.."
src=${1:-build}
cutlass=$src
[ -d "$src/cute" ] || cutlass=$src/_deps/nvidia-cutlass-4.2.0.0/cutlass_library/source/include
rm -rf .deps && mkdir -p .deps/gtest/lib/x86_64-linux-gnu/cmake .deps/gtest/include
cp -r "$cutlass" .deps/cutlass
lib=/usr/lib/x86_64-linux-gnu
cp $lib/libgtest*.a $lib/libgmock*.a .deps/gtest/lib/x86_64-linux-gnu/
cp -r $lib/cmake/GTest .deps/gtest/lib/x86_64-linux-gnu/cmake/
cp -r /usr/include/gtest /usr/include/gmock .deps/gtest/include/
git rev-parse --short HEAD >.deps/COMMIT
git diff --quiet HEAD || echo "+dirty" >>.deps/COMMIT
du -sh .deps
