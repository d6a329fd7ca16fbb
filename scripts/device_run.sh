#!/usr/bin/env bash
# One call on the lent GPU machine: GPU tests, compute-sanitizer, the benchmark
# sweep, the Table 2 ablation and flash3 beside its peers, logs under $OUT, a
# short summary last with the SM clock during the timed stages (the logs
# themselves in $OUT/logs.tgz; `scripts/perf_report.py --import logs.tgz` makes
# docs/performance.md from them). Binaries are built on the workstation and
# carried in .device/ (scripts/stage_device.sh), or built here by the stage
# `build` from the carried dependencies in .deps/ (scripts/stage_deps.sh).
#   scripts/device_run.sh [stage ...]   stages: build test python wheel train overhead sanitize sanitize_varlen sanitize_kv bench bwd
#                                       pair fp8 ablation compare sustained match ab features varlen decode
#                                       prefill mla parallel
#                                       (default: test python sanitize bench bwd fp8 ablation compare)
# FLASH3_TEST_FILTER narrows the GPU tests (a gtest filter); BUILD_DTYPES and
# BUILD_HEAD_DIMS narrow the stage build (CMake's FLASH3_DTYPES,
# FLASH3_HEAD_DIMS; default every one) for an experiment's quicker build. The stages
# `compare` (the GPU idle PEERS_GAP_MS, default 50, before every sample) and
# `sustained` (each shape under continuous load for 2 s first) time flash3 and
# its peers with python -m flash3.benchmark, the passes PEERS_PASSES (default
# "fwd bwd fwd+bwd"; a whole sustained sweep outlasts one call). The stage `ab`
# times the carried baseline .base/flash3-bench against this build in
# AB_ROUNDS (3) interleaved rounds of the AB_SWEEPS (fwd bwd fp8), in the
# regime AB_REGIME (default "--gap-ms 300": the GPU idle before each shape).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/flash3-out}
mkdir -p "$OUT"
B=.device
stages=${*:-test python sanitize bench bwd fp8 ablation compare}
export PYTHONUNBUFFERED=1
summary=()
has() { [[ " $stages " == *" $1 "* ]]; }

if has build; then
  # Every dtype and head dim (unless narrowed), with the machine's cores.
  start=$(date +%s)
  narrow=()
  [ -n "${BUILD_DTYPES:-}" ] && narrow+=("-DFLASH3_DTYPES=$BUILD_DTYPES")
  [ -n "${BUILD_HEAD_DIMS:-}" ] && narrow+=("-DFLASH3_HEAD_DIMS=$BUILD_HEAD_DIMS")
  # An earlier call's narrowing stays in CMake's cache unless this call drops it.
  widen=(-UFLASH3_DTYPES -UFLASH3_HEAD_DIMS)
  cmake -S . -B build-device -G Ninja -DFLASH3_CUTLASS_DIR="$PWD/.deps/cutlass" "${widen[@]}" "${narrow[@]}" \
    -DGTest_DIR="$PWD/.deps/gtest/lib/x86_64-linux-gnu/cmake/GTest" >"$OUT/build.log" 2>&1 &&
    ninja -k 0 -C build-device flash3-bench test_gpu flash3_c >>"$OUT/build.log" 2>&1
  rc=$?
  summary+=("build rc=$rc in $(($(date +%s) - start)) s")
  [ $rc = 0 ] || { grep -m5 -E "error|FAILED" "$OUT/build.log"; exit 1; }
  mkdir -p $B && cp build-device/flash3-bench build-device/tests/test_gpu $B/ && cp .deps/COMMIT $B/COMMIT
  # The machine code of every kernel (CI checks a subset: .ci/run).
  if [ ${#narrow[@]} = 0 ]; then
    find build-device/CMakeFiles/flash3_kernels.dir -name '*.o' -print0 |
      xargs -0 python3 tests/check_sass.py --cuobjdump "$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)" \
        --nvdisasm "$(command -v nvdisasm || echo /usr/local/cuda/bin/nvdisasm)" \
        >"$OUT/sass.log" 2>&1
    summary+=("sass, every kernel: rc=$? $(tail -1 "$OUT/sass.log")")
  fi
fi

nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
echo "commit $(cat $B/COMMIT 2>/dev/null)" | tee -a "$OUT/gpu.txt"
echo "date $(date -u '+%Y-%m-%d %H:%M UTC')" | tee -a "$OUT/gpu.txt"
echo "command scripts/device_run.sh${*:+ $*}" | tee -a "$OUT/gpu.txt"

if has test; then
  timeout 300 $B/test_gpu --gtest_brief=1 --gtest_filter="${FLASH3_TEST_FILTER:-*}" >"$OUT/test_gpu.log" 2>&1
  rc=$?
  summary+=("test_gpu rc=$rc: $(grep -E '^\[  (PASSED|FAILED)' "$OUT/test_gpu.log" | tr '\n' ' ')")
  grep -E "FAILED|Failure|error" "$OUT/test_gpu.log" | head -20
fi

if has wheel; then
  # A wheel carried in dist/ (scripts/build_wheel.sh on another machine) is
  # installed as is; without one, `pip install .` builds it here as a user
  # would (offline: the carried CUTLASS headers, the machine's
  # scikit-build-core). Then the tests on the installed package.
  wheel=$(ls dist/flash3-*.whl 2>/dev/null | head -1)
  if [ -n "$wheel" ]; then
    timeout 300 python3 -m pip install --no-deps --no-index "$wheel" >"$OUT/wheel.log" 2>&1
    summary+=("pip install $wheel rc=$?")
  else
    FLASH3_CUTLASS_DIR=$PWD/.deps/cutlass timeout 500 python3 -m pip install --no-build-isolation --no-deps . \
      >"$OUT/wheel.log" 2>&1
    summary+=("pip install . rc=$?")
  fi
  (cd /tmp && timeout 400 python3 -m pytest -q -rs "$OLDPWD/tests/python" >"$OUT/pytest_installed.log" 2>&1)
  summary+=("pytest on the installed package rc=$?: $(tail -1 "$OUT/pytest_installed.log")")
fi

# Python runs the package from the tree on a built library: the build
# stage's, or else the installed package's (stage wheel).
pylib=$PWD/build-device/libflash3_c.so
[ -f "$pylib" ] || pylib=$(cd /tmp && python3 -c "import os, flash3._abi as a; print(os.path.join(os.path.dirname(a.__file__), 'libflash3_c.so'))" 2>/dev/null)
py=(env FLASH3_LIBRARY="$pylib" PYTHONPATH="$PWD/python" python3)

if has python; then
  timeout 400 "${py[@]}" -m pytest -q -rs tests/python >"$OUT/pytest.log" 2>&1
  summary+=("pytest tests/python rc=$?: $(tail -1 "$OUT/pytest.log")")
fi

if has train; then
  # examples/train_gpt.py: 200 steps with flash3 and with SDPA, same seed and batches.
  timeout 300 "${py[@]}" examples/train_gpt.py >"$OUT/train_gpt.txt" 2>&1
  summary+=("train_gpt rc=$?: $(grep -E 'tokens/s| vs ' "$OUT/train_gpt.txt" | tr '\n' ' ')")
fi

if has overhead; then
  # Host time per call, flash3 against SDPA's FlashAttention-2 (tiny shape, 10,000 calls).
  timeout 300 "${py[@]}" -m flash3.benchmark --overhead --json "$OUT/overhead.json" >"$OUT/overhead.txt" 2>&1
  summary+=("overhead rc=$?: $(grep -E ': flash3 .* us, SDPA' "$OUT/overhead.txt" | tr '\n' ' ')")
fi

if has sanitize; then
  # Small shapes of every head dim and mask, and a causal one with more tiles
  # than SMs, which claims tiles dynamically.
  small="--seqlen 200 --tokens 400 --hidden 256 --hdim 64,128,256 --reps 1"
  dynamic="--seqlen 2048 --tokens 8192 --hidden 512 --hdim 128 --causal 1 --reps 1 --no-check"
  # The backward kernels (preprocess, main, postprocess), GQA so that the
  # per-head dK/dV sum runs too, and deterministic mode's semaphores.
  bwd="--pass bwd --seqlen 200 --tokens 400 --hidden 512 --hdim 64,128,256 --gqa 2 --reps 1"
  bwd_det="--pass bwd --seqlen 300 --tokens 300 --hidden 256 --hdim 128,256 --causal 1 --deterministic --reps 1"
  # More CTAs than a wave (160-192 of them): the last wave's tiles split into parts.
  bwd_split="--pass bwd --seqlen 300 --tokens 300 --hidden 4096 --hdim 64 --causal 0 --reps 1"
  bwd_split2="--pass bwd --seqlen 300 --tokens 600 --hidden 4096 --hdim 128,256 --causal 0 --reps 1"
  # FP8: the quantization and the kernel with its V transpose.
  fp8="--dtype e4m3 --seqlen 300 --tokens 600 --hidden 256 --hdim 64,128,256 --hadamard --reps 1"
  # Per-head scales: the quantizer's clusters of up to 16 CTAs per head.
  fp8_head="--dtype e4m3 --granularity head --seqlen 2100 --tokens 2100 --hidden 256 --hdim 64,128,256 --causal 0 --reps 1"
  # racecheck runs past its time limit on that one: clusters of up to 5 CTAs instead.
  fp8_head_race="--dtype e4m3 --granularity head --seqlen 600 --tokens 1200 --hidden 256 --hdim 64,128,256 --causal 0 --reps 1"
  # Attention sinks: the softmax's finalize with one, and their gradient's kernel.
  sinks="--pass fwd+bwd --seqlen 200 --tokens 400 --hidden 512 --hdim 64,128 --gqa 2 --sinks --reps 1"
  # Sliding windows: both edges masked, key blocks outside skipped, both passes.
  window="--pass fwd+bwd --seqlen 300 --tokens 600 --hidden 512 --hdim 64,128,256 --window 70,10 --causal 0 --reps 1"
  window_causal="--pass fwd+bwd --seqlen 300 --tokens 600 --hidden 512 --hdim 64,128,256 --window 100,0 --causal 1 --reps 1"
  # Softcapping: its tanh in both passes, and the backward's slopes (kept at
  # head dim 128, recovered from P at 64).
  softcap="--pass fwd+bwd --seqlen 300 --tokens 600 --hidden 512 --hdim 64,128,256 --softcap 1.5 --reps 1"
  # V's head dim of its own (192 / 128): both passes, GQA, softcapping's kernels.
  pair="--pass fwd+bwd --seqlen 300 --tokens 600 --hidden 384 --hdim 192/128 --gqa 2 --reps 1"
  pair_softcap="--pass fwd+bwd --seqlen 300 --tokens 600 --hidden 384 --hdim 192/128 --softcap 1.5 --sinks --reps 1"
  # The ablation variant without warp specialization: several tiles per CTA.
  nows="--no-ws --seqlen 512 --tokens 8192 --hidden 512 --hdim 128 --reps 1 --no-check"
  for tool in memcheck racecheck synccheck; do
    for args in "$small" "$dynamic" "$bwd" "$bwd_det" "$bwd_split" "$bwd_split2" "$fp8" "$fp8_head" "$sinks" "$window" "$window_causal" "$softcap" "$pair" "$pair_softcap" "$nows"; do
      [ $tool = racecheck ] && [ "$args" = "$fp8_head" ] && args=$fp8_head_race
      timeout 200 compute-sanitizer --tool $tool --error-exitcode 9 $B/flash3-bench $args >>"$OUT/sanitize.log" 2>&1
      summary+=("compute-sanitizer $tool rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitize.log" | tail -1)")
    done
    # Tiles whose rows all see no key (seqlen_q well above seqlen_k, causal),
    # which the benchmark's shapes lack: the test that has them.
    timeout 200 compute-sanitizer --tool $tool --error-exitcode 9 $B/test_gpu \
      --gtest_filter='Forward.TilesWhoseRowsSeeNoKey' >>"$OUT/sanitize.log" 2>&1
    summary+=("compute-sanitizer $tool (no-key tiles) rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitize.log" | tail -1)")
  done
fi
if has sanitize || has sanitize_varlen; then
  # Packed sequences (varlen), both passes and FP8: their tests' batches
  # (empty sequences, seqused, partial blocks), which the benchmark does not have.
  # racecheck outlasts a call on the tests: a few small calls from Python
  # instead (scripts/sanitize_varlen.py), the head dims SANITIZE_HDIMS.
  for tool in memcheck racecheck synccheck; do
    if [ $tool = racecheck ]; then
      FLASH3_LIBRARY="$pylib" PYTHONPATH="$PWD/python" timeout 300 compute-sanitizer --tool racecheck \
        --error-exitcode 9 python3 scripts/sanitize_varlen.py ${SANITIZE_HDIMS:-64 128 256 192/128} >>"$OUT/sanitize.log" 2>&1
    else
      timeout 300 compute-sanitizer --tool $tool --error-exitcode 9 $B/test_gpu \
        --gtest_filter='Forward.Varlen:Backward.Varlen:ForwardFp8.Varlen' >>"$OUT/sanitize.log" 2>&1
    fi
    summary+=("compute-sanitizer $tool (varlen) rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitize.log" | tail -1)")
  done
fi
if has sanitize || has sanitize_kv; then
  # The KV cache's kernels (split and not, paged, packed GQA, the append,
  # the e4m3 cache): small calls from Python (scripts/sanitize_kv_cache.py),
  # the head dims SANITIZE_KV_HDIMS.
  for tool in memcheck racecheck synccheck; do
    FLASH3_LIBRARY="$pylib" PYTHONPATH="$PWD/python" timeout 300 compute-sanitizer --tool $tool \
      --error-exitcode 9 python3 scripts/sanitize_kv_cache.py ${SANITIZE_KV_HDIMS:-64 128 256} >>"$OUT/sanitize.log" 2>&1
    summary+=("compute-sanitizer $tool (KV cache) rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitize.log" | tail -1)")
  done
fi

# The clocks while the timed stages run (scripts/clock_summary.py): the lent
# cards run power-capped on long shapes, which moves their TFLOP/s.
sampler=
if has bench || has bwd || has pair || has fp8 || has ablation || has compare || has sustained || has ab || has match; then
  nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active \
    --format=csv,noheader -lms 200 >"$OUT/clocks.csv" 2>/dev/null &
  sampler=$!
fi

if has bench; then
  timeout 400 $B/flash3-bench --json "$OUT/bench.json" >"$OUT/bench.txt" 2>"$OUT/bench.err"
  summary+=("bench rc=$?")
fi

if has bwd; then
  timeout 400 $B/flash3-bench --pass bwd --hdim 64,128,256 --json "$OUT/bench_bwd.json" >"$OUT/bench_bwd.txt" 2>"$OUT/bench_bwd.err"
  summary+=("bench bwd rc=$?")
  # Deterministic mode's cost, against the default rows above.
  timeout 200 $B/flash3-bench --pass bwd --hdim 128,256 --seqlen 2048,8192 --deterministic \
    --json "$OUT/bench_bwd_det.json" >"$OUT/bench_bwd_det.txt" 2>&1
  summary+=("bench bwd deterministic rc=$?")
fi

if has pair; then
  # V's head dim of its own (192/128) beside the symmetric 192, both passes
  # and masks, in the sweep's regime (issue 34: within 5% of 192's TFLOP/s).
  timeout 200 $B/flash3-bench --hdim 192,192/128 --json "$OUT/bench_pair.json" >"$OUT/bench_pair.txt" 2>&1
  summary+=("bench pair rc=$?")
  timeout 300 $B/flash3-bench --pass bwd --hdim 192,192/128 --json "$OUT/bench_pair_bwd.json" \
    >"$OUT/bench_pair_bwd.txt" 2>&1
  summary+=("bench pair bwd rc=$?")
fi

if has fp8; then
  timeout 300 $B/flash3-bench --dtype e4m3 --json "$OUT/bench_fp8.json" >"$OUT/bench_fp8.txt" 2>"$OUT/bench_fp8.err"
  summary+=("bench fp8 rc=$?")
  timeout 120 $B/flash3-bench --fp8-accuracy >"$OUT/fp8_accuracy.txt" 2>&1
  summary+=("fp8 accuracy rc=$?")
  timeout 120 $B/flash3-bench --quant-bandwidth >"$OUT/quant_bandwidth.txt" 2>&1
  summary+=("quant bandwidth rc=$?")
fi

if has ablation; then
  timeout 120 $B/flash3-bench --ablation --json "$OUT/ablation.json" >"$OUT/ablation.txt" 2>&1
  summary+=("ablation rc=$?")
fi

if has match; then
  # flash_attn_func's TFLOP/s against flash3-bench's, forward and backward at
  # the paper's shapes, both with the GPU idle before every sample (no sample
  # under the power cap: the A/B's regime), so that the two read alike.
  regime=(--gap-ms 50 --reps 10 --no-check)
  for pass in fwd bwd; do
    timeout 200 $B/flash3-bench --pass $pass "${regime[@]}" --gap-per-sample --json "$OUT/match_bench_$pass.json" \
      >"$OUT/match_bench_$pass.txt" 2>&1 || summary+=("match: flash3-bench $pass rc=$?")
    timeout 300 "${py[@]}" -m flash3.benchmark --methods flash3 --pass $pass "${regime[@]}" \
      --json "$OUT/match_py_$pass.json" >"$OUT/match_py_$pass.txt" 2>&1 || summary+=("match: python $pass rc=$?")
  done
  python3 scripts/match_table.py --bench "$OUT"/match_bench_*.json --python "$OUT"/match_py_*.json >"$OUT/match.md"
  summary+=("match rc=$?: $(tail -1 "$OUT/match.md")")
fi

if has ab; then
  # The two builds take turns by (head dim, mask), a few seconds each, and
  # the one that goes first alternates; every shape is timed in the same
  # regime (AB_REGIME, flash3-bench's options), so that the power-capped
  # card's clock, which follows its recent load, falls on both alike.
  mkdir -p "$OUT/ab"
  read -ra regime <<<"${AB_REGIME:---gap-ms 300}"
  turn=0
  for round in $(seq "${AB_ROUNDS:-3}"); do
    for sweep in ${AB_SWEEPS:-fwd bwd fp8}; do
      case $sweep in fwd) args=() ;; bwd) args=(--pass bwd) ;; fp8) args=(--dtype e4m3) ;; esac
      for hdim in 64 128 256; do
        for causal in 0 1; do
          order="base new"
          [ $((turn++ % 2)) = 1 ] && order="new base"
          for build in $order; do
            bin=$B/flash3-bench
            [ $build = base ] && bin=.base/flash3-bench
            timeout 100 $bin "${args[@]}" --hdim $hdim --causal $causal "${regime[@]}" --no-check \
              --json "$OUT/ab/${build}_${sweep}_${round}_${hdim}_${causal}.json" >/dev/null 2>>"$OUT/ab.err" ||
              summary+=("ab $build $sweep $hdim $causal round $round rc=$?")
          done
        done
      done
    done
  done
  python3 scripts/ab_table.py "$OUT/ab" >"$OUT/ab.md"
  summary+=("ab: $(tail -1 "$OUT/ab.md") (baseline $(cat .base/COMMIT 2>/dev/null))")
fi

if has features; then
  # Issue 34's speed targets, each beside the plain kernel of the same run in
  # the same regime (AB_REGIME), AB_ROUNDS interleaved rounds, head dim 128:
  # a causal 4096 window at 16k (TFLOP/s over the pairs it visits, against
  # the causal kernel's), softcapping (30) and a sink at 8k.
  mkdir -p "$OUT/features"
  read -ra regime <<<"${AB_REGIME:---gap-ms 300}"
  for round in $(seq "${AB_ROUNDS:-3}"); do
    for pass in fwd bwd; do
      for job in plain:16k window:16k plain:8k softcap:8k sinks:8k; do
        kind=${job%:*} size=${job#*:}
        case $size in 16k) shape=(--seqlen 16384 --causal 1) ;; 8k) shape=(--seqlen 8192 --causal both) ;; esac
        case $kind in plain) extra=() ;; window) extra=(--window 4096,0) ;; softcap) extra=(--softcap 30) ;;
          sinks) extra=(--sinks) ;; esac
        timeout 100 $B/flash3-bench --pass $pass --hdim 128 --tokens 16384 "${shape[@]}" "${extra[@]}" "${regime[@]}" \
          --no-check --json "$OUT/features/${kind}_${pass}_${round}_${size}.json" >/dev/null 2>>"$OUT/features.err" ||
          summary+=("features $job $pass round $round rc=$?")
      done
    done
  done
  for kind in window softcap sinks; do
    python3 scripts/ab_table.py "$OUT/features" --a plain --b $kind --tolerance 0.03 >"$OUT/features_$kind.md"
    summary+=("features $kind/plain TFLOP/s: $(tail -1 "$OUT/features_$kind.md")")
  done
fi

# flash3 beside SDPA's FlashAttention-2 and cuDNN (and FA3 / flash_attn where
# importable), each method timed the same way in one process; a process and a
# file per pass, so that a regime's sweep can be split over calls and merged.
# The two regimes go to files of their own: the power-capped card reads faster
# after idle gaps than under load, so their numbers are never compared.
peers() {  # peers NAME [regime options]: $OUT/NAME_<pass>.json, $OUT/NAME.txt
  local name=$1 pass start
  shift
  for pass in ${PEERS_PASSES:-fwd bwd fwd+bwd}; do
    start=$(date +%s)
    timeout 540 "${py[@]}" -m flash3.benchmark --pass "$pass" "$@" --json "$OUT/${name}_$pass.json" \
      >>"$OUT/$name.txt" 2>>"$OUT/$name.err"
    summary+=("$name $pass rc=$? in $(($(date +%s) - start)) s")
  done
}
has compare && peers peers --gap-ms "${PEERS_GAP_MS:-50}"

# Packed sequences beside the fixed-length kernel (issue 34's varlen targets):
# equal lengths and the log-uniform mix, both passes, SDPA on the same mix.
if has varlen; then
  timeout 400 "${py[@]}" -m flash3.benchmark --varlen --pass all --hdim "${VARLEN_HDIM:-128}" --gap-ms 50 \
    --json "$OUT/varlen.json" >"$OUT/varlen.txt" 2>"$OUT/varlen.err"
  summary+=("varlen rc=$?")
  tail -32 "$OUT/varlen.txt"
  # The FP8 forward over packed sequences, in the same regime.
  timeout 200 "${py[@]}" -m flash3.benchmark --varlen --dtype e4m3 --pass fwd --hdim "${VARLEN_HDIM:-128}" \
    --gap-ms 50 --json "$OUT/varlen_fp8.json" >"$OUT/varlen_fp8.txt" 2>"$OUT/varlen_fp8.err"
  summary+=("varlen e4m3 rc=$?")
  tail -16 "$OUT/varlen_fp8.txt"
fi
# Decoding from a KV cache (issue 35's sweep): GB/s of K and V, flash3
# contiguous, paged and appending with rotary, beside SDPA's backends.
if has decode; then
  timeout 400 "${py[@]}" -m flash3.benchmark --decode --gap-ms 50 --json "$OUT/decode.json" \
    >"$OUT/decode.txt" 2>"$OUT/decode.err"
  summary+=("decode rc=$?")
  grep -E '^\|' "$OUT/decode.txt"
fi
# Chunked prefill (issue 35): a chunk of queries against a KV cache, causal,
# beside flash_attn_func on the same work.
if has prefill; then
  timeout 300 "${py[@]}" -m flash3.benchmark --prefill --gap-ms 50 --json "$OUT/prefill.json" \
    >"$OUT/prefill.txt" 2>"$OUT/prefill.err"
  summary+=("prefill rc=$?")
  grep -E '^\|' "$OUT/prefill.txt"
fi
# MLA decoding (issue 35): 128 query heads against one latent KV head (qv),
# TFLOP/s and TB/s, contiguous and paged.
if has mla; then
  timeout 300 "${py[@]}" -m flash3.benchmark --mla --gap-ms 50 --json "$OUT/mla.json" \
    >"$OUT/mla.txt" 2>"$OUT/mla.err"
  summary+=("mla rc=$?")
  grep -E '^\|' "$OUT/mla.txt"
fi
has sustained && peers peers_sustained --sustained
# Context parallelism over the machine's GPUs (issue 37; kinds of 2 or 4
# GPUs): its tests against one GPU, then 128k tokens causal, forward and
# backward, ring and all-gather, against one GPU.
if has parallel; then
  timeout 300 "${py[@]}" -m pytest -q -rs tests/python/test_parallel_gpu.py >"$OUT/parallel_test.log" 2>&1
  summary+=("parallel tests rc=$?: $(tail -1 "$OUT/parallel_test.log")")
  timeout 400 "${py[@]}" bench/context_parallel.py --gpus "$(nvidia-smi -L | wc -l)" >"$OUT/parallel.txt" 2>&1
  summary+=("parallel bench rc=$?")
  grep -E '^\||per-GPU|error' "$OUT/parallel.txt"
fi

if [ -n "$sampler" ]; then
  kill "$sampler" 2>/dev/null
  python3 scripts/clock_summary.py "$OUT/clocks.csv" >"$OUT/clocks.txt"
  summary+=("$(cat "$OUT/clocks.txt")")
fi

echo
[ -f "$OUT/ablation.txt" ] && { echo "== ablation.txt"; grep -E '^\||beats|device' "$OUT/ablation.txt"; }
for f in peers.txt peers_sustained.txt; do
  [ -f "$OUT/$f" ] && { echo "== $f"; grep -E '^\||^(device|regime|not run):|^- ' "$OUT/$f"; }
done
# flash3-bench's own tables only where there are no peers' tables, so that the printout stays short.
if [ ! -f "$OUT/peers.txt" ] && [ ! -f "$OUT/peers_sustained.txt" ]; then
  for f in bench.txt bench_bwd.txt; do [ -f "$OUT/$f" ] && { echo "== $f"; grep '^|' "$OUT/$f"; }; done
fi
[ -f "$OUT/ab.md" ] && { echo "== ab.md"; grep -E '\*\*$' "$OUT/ab.md"; }
for f in "$OUT"/features_*.md; do [ -f "$f" ] && { echo "== ${f##*/}"; grep -E '^\| (fwd|bwd)' "$f"; }; done
for f in bench_fp8.txt fp8_accuracy.txt quant_bandwidth.txt; do [ -f "$OUT/$f" ] && { echo "== $f"; grep -E '^\|' "$OUT/$f"; }; done
[ -f "$OUT/bench_bwd_det.txt" ] && { echo "== bench_bwd_det.txt (deterministic)"; grep '^| bwd' "$OUT/bench_bwd_det.txt"; }
echo "== summary"
printf '%s\n' "${summary[@]}"

# The device tool brings back a few files only: the logs travel as one
# archive (logs.tgz; a second call into the same $OUT adds logs2.tgz, ...).
archive=logs.tgz n=1
while [ -e "$OUT/$archive" ]; do n=$((n + 1)) archive=logs$n.tgz; done
(cd "$OUT" && tar -czf $archive --remove-files $(ls | grep -v -E '^logs[0-9]*\.tgz$'))
