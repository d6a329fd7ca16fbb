#!/usr/bin/env bash
# Copies the built binaries the GPU machine needs into .device/ (git-ignored,
# carried by the device tool), with the commit they were built from.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${FLASH3_BUILD_DIR:-build}
mkdir -p .device
cp "$build/flash3-bench" "$build/tests/test_gpu" .device/
git rev-parse --short HEAD > .device/COMMIT 2>/dev/null || echo uncommitted > .device/COMMIT
git diff --quiet 2>/dev/null || echo "+dirty" >> .device/COMMIT
du -sh .device
