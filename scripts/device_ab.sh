#!/usr/bin/env bash
# A/B of source variants on the GPU machine:
# each variant is the working tree, with PATCHES/<variant>.revpatch reverted
# and/or PATCHES/<variant>.patch applied when they exist, configured and built
# in build-exp/<variant> (all variants at once, the machine's cores shared),
# then timed in interleaved rounds, so that the card's drift falls on all.
#   scripts/device_ab.sh "<flash3-bench args>" variant ...
# Environment: PATCHES (default exp, git-ignored scratch: name it in the
# device tool's carry), DTYPES and HDIMS (the narrowed build,
# default bf16 and 64;128;256), TARGETS (default flash3-bench), ROUNDS
# (default 2), NOBENCH=1 to build only. Needs the CUTLASS headers carried at
# build/_deps/nvidia-cutlass-4.2.0.0/cutlass_library/source/include.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
cutlass=$root/build/_deps/nvidia-cutlass-4.2.0.0/cutlass_library/source/include
patches=$root/${PATCHES:-exp}
args=$1
shift
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
for v in "$@"; do
  (
    d=build-exp/$v
    mkdir -p $d/src
    tar --exclude=./build* --exclude=./.device --exclude=./exp --exclude=./.git -cf - . | tar -xf - -C $d/src
    [ -f "$patches/$v.revpatch" ] && (cd $d/src && patch -s -R -p1 <"$patches/$v.revpatch")
    [ -f "$patches/$v.patch" ] && (cd $d/src && patch -s -p1 <"$patches/$v.patch")
    cmake -S $d/src -B $d/b -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASH3_CUTLASS_DIR="$cutlass" \
      -DFLASH3_DTYPES="${DTYPES:-bf16}" -DFLASH3_HEAD_DIMS="${HDIMS:-64;128;256}" >"$OUT/cmake_$v.log" 2>&1
    ninja -C $d/b -j $(($(nproc) / $#)) ${TARGETS:-flash3-bench} >"$OUT/build_$v.log" 2>&1 || echo "BUILD FAILED $v"
  ) &
done
wait
echo "built at $(date +%T)"
[ -n "${NOBENCH:-}" ] && exit 0
for round in $(seq "${ROUNDS:-2}"); do
  for v in "$@"; do
    echo "== $v round $round"
    timeout 90 build-exp/$v/b/flash3-bench $args 2>/dev/null | grep '^| ' | grep -v method
  done
done
