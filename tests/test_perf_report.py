"""scripts/perf_report.py on small hand-made runs in the formats scripts/device_run.sh leaves (no GPU)."""
import importlib.util
import json
import os
import pathlib
import re
import subprocess
import sys
import tarfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "perf_report.py"


def module(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


pr = module("perf_report", SCRIPT)
sweep = module("flash3_bench_sweep", ROOT / "python" / "flash3" / "_bench" / "sweep.py")

SEQLENS = (1024, 4096)
GAP = {"name": "gap", "gap_ms": 50.0, "scope": "sample"}
SUSTAINED = {"name": "sustained", "load_s": 2.0}
GAP_TITLE = "flash3 beside its peers, idle gap: the GPU idle 50 ms before every sample"
SUSTAINED_TITLE = "flash3 beside its peers, sustained: each shape under continuous load for at least 2 s, then timed"
NO_KERNEL = "No available kernel. Aborting execution."
WRONG_DQ = "dQ: max error 1.2e-01 > 2 x 3.0e-02 + eps"


def flash3_json(entries):
    """flash3-bench's write_json: one object a line, numbers as a C++ stream prints them (6 digits)."""
    def num(x):
        return format(x, ".6g")
    lines = []
    for e in entries:
        lines.append(
            f'  {{"pass": "{e["pass"]}", "variant": "{e["variant"]}", "dtype": "{e["dtype"]}", "hdim": {e["hdim"]}, '
            f'"hdim_v": {e.get("hdim_v", e["hdim"])}, '
            f'"causal": {"true" if e["causal"] else "false"}, "batch": {e["batch"]}, "seqlen_q": {e["seqlen_q"]}, '
            f'"seqlen_k": {e["seqlen_k"]}, "heads_q": {e["heads_q"]}, "heads_kv": {e["heads_kv"]}, '
            f'"ms": {num(e["ms"])}, "tflops": {num(e["tflops"])}, "max_err": {num(e["max_err"])}, '
            f'"ref_err": {num(e["ref_err"])}, "ok": {"true" if e["ok"] else "false"}}}')
    return "[\n" + ",\n".join(lines) + "\n]\n"


def entry(pass_, dtype, hdim, causal, seqlen, tflops, variant="default", ok=True, max_err=1e-3, ref_err=2e-3):
    shape = {"pass": pass_, "variant": variant, "dtype": dtype, "hdim": hdim, "causal": causal,
             "batch": 16384 // seqlen, "seqlen_q": seqlen, "seqlen_k": seqlen, "heads_q": 2048 // hdim,
             "heads_kv": 2048 // hdim}
    ms = sweep.attention_flops(pass_, hdim, causal, shape["batch"], seqlen, shape["heads_q"]) / (tflops * 1e12) * 1e3
    return dict(shape, ms=ms, tflops=tflops, max_err=max_err, ref_err=ref_err, ok=ok)


def fwd_tflops(hdim, causal, seqlen):
    """Round numbers that tell the cells apart: 100 per hdim step, 10 for the mask, 1 per seqlen step."""
    return 400.0 + hdim + (10 if causal else 0) + SEQLENS.index(seqlen)


def bench_sweep(pass_, dtype, offset=0.0):
    out = []
    for hdim in (64, 128):
        for causal in (False, True):
            for seqlen in SEQLENS:
                out.append(entry(pass_, dtype, hdim, causal, seqlen, fwd_tflops(hdim, causal, seqlen) + offset))
    return out


def timed(shape, method, tflops):
    """The benchmark's record of a method that ran at the given TFLOP/s."""
    ms = sweep.shape_flops(shape) / (tflops * 1e12) * 1e3
    return sweep.ok_result(shape, method, [ms, ms * 1.01, ms * 0.99], {"max_err": 1e-3, "ref_err": 2e-3},
                           {"sm_mhz": 1980.0, "power_w": 500.0})


def peer_records(pass_, offset):
    """python -m flash3.benchmark's records: flash3 at fwd_tflops + offset, cuDNN at 0.8 and SDPA FA2 at 0.5 of it;
    cuDNN without a kernel for hdim 64 causal; flash3's backward wrong at hdim 64, no mask, 1k."""
    results = []
    for shape in sweep.paper_sweep((pass_,), (64, 128), SEQLENS):
        mine = fwd_tflops(shape["hdim"], shape["causal"], shape["seqlen"]) + offset
        if (pass_, shape["hdim"], shape["causal"], shape["seqlen"]) == ("bwd", 64, False, 1024):
            results.append(sweep.failed_result(shape, "flash3", WRONG_DQ, {"max_err": 0.12, "ref_err": 0.03}))
        else:
            results.append(timed(shape, "flash3", mine))
        if (shape["hdim"], shape["causal"]) == (64, True):
            results.append(sweep.na_result(shape, "sdpa_cudnn", NO_KERNEL))
        else:
            results.append(timed(shape, "sdpa_cudnn", mine * 0.8))
        results.append(timed(shape, "sdpa_flash", mine * 0.5))
    return results


def peers_meta(regime, date):
    """The meta of python -m flash3.benchmark --json, FA3 and FA2 not importable."""
    return {"tool": "python -m flash3.benchmark", "argv": ["--pass", "fwd"], "date": date, "regime": regime,
            "timer": "CUDA events around each call, a 256 MB write before each sample (L2 flush), median of 10 "
                     "samples after 3 warm-up calls",
            "check": "against a float32 reference on batch 0, heads 0-1, every shape",
            "device": {"name": "NVIDIA H100 80GB HBM3", "sms": 132},
            "software": {"python": "3.11.9", "torch": "2.11.0+cu130", "cuda": "13.0", "cudnn": 91900},
            "methods": {m: sweep.METHODS[m] for m in ("flash3", "sdpa_flash", "sdpa_cudnn")},
            "not_run": {"fa3": "No module named 'flash_attn_interface'", "fa2": "No module named 'flash_attn'"}}


def write_peers(folder, name, regime, passes, offset, date="2026-12-01T10:20:00+00:00"):
    """As device_run.sh's stages compare and sustained: a file per pass."""
    for pass_ in passes:
        sweep.write_json(folder / f"{name}_{pass_}.json", peers_meta(regime, date), peer_records(pass_, offset))


FP8_ACCURACY = """device: NVIDIA H100 80GB HBM3 (sm_90, 132 SMs)

| hdim | method | RMSE of O | vs flash3 per-tensor | vs standard FP8 (paper's baseline) |
|---|---|---|---|---|
| 128 | bf16 | 3.10e-04 |  |  |
| 128 | e4m3 standard attention, per-tensor, fp16 softmax (paper's baseline) | 2.40e-02 |  | 1.00x lower |
| 128 | e4m3 per-tensor (flash3 baseline) | 2.00e-02 | 1.00x lower | 1.20x lower |
| 128 | e4m3 per-block + hadamard (flash3) | 8.70e-03 | 2.30x lower | 2.76x lower |
| 256 | e4m3 per-block (no incoherent processing) | FAIL: unsupported | | |
"""


def write_run(folder, fp8=True, peers=True):
    """A whole scripts/device_run.sh $OUT: gpu.txt, the sweeps, the peers in both regimes, the ablation, FP8
    accuracy, clocks."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "gpu.txt").write_text("NVIDIA H100 80GB HBM3, 1755 MHz, 1980 MHz, 700.00 W, 580.159.04\n"
                                    "commit abc1234\n+dirty\ndate 2026-12-01 10:00 UTC\n"
                                    "command scripts/device_run.sh bench bwd fp8 ablation compare sustained\n")
    fwd = bench_sweep("fwd", "bf16")
    fwd.append(entry("fwd", "bf16", 128, False, 4096, 1.0, variant="no-pingpong"))  # not a default row: ignored
    bwd = bench_sweep("bwd", "bf16", offset=-100.0)
    bwd[0] = dict(bwd[0], ok=False)  # hdim 64 no mask 1k fails its check: FAIL
    (folder / "bench.json").write_text(flash3_json(fwd))
    (folder / "bench_bwd.json").write_text(flash3_json(bwd))
    # The stage pair: 192 and 192/128, the forward non-causal.
    pair = [entry("fwd", "bf16", 192, False, seqlen, 700.0 + SEQLENS.index(seqlen)) for seqlen in SEQLENS]
    pair += [dict(entry("fwd", "bf16", 192, False, seqlen, 650.0 + SEQLENS.index(seqlen)), hdim_v=128)
             for seqlen in SEQLENS]
    (folder / "bench_pair.json").write_text(flash3_json(pair))
    (folder / "bench_pair_bwd.json").write_text(flash3_json([dict(e, **{"pass": "bwd"}) for e in pair]))
    if fp8:
        (folder / "bench_fp8.json").write_text(flash3_json(bench_sweep("fwd", "e4m3", offset=300.0)))
    det = [entry("bwd", "bf16", 128, False, 4096, fwd_tflops(128, False, 4096) - 100.0 - 56.0,
                 variant="deterministic")]
    (folder / "bench_bwd_det.json").write_text(flash3_json(det))
    ablation = []
    for round_ in range(3):
        for variant, t in (("default", 600.0), ("no-pingpong", 580.0), ("no-intra-wg-overlap", 510.0),
                           ("no-persistent", 590.0), ("no-warp-specialization", 480.0)):
            e = entry("fwd", "bf16", 128, False, 1024, t + 2 * round_, variant=variant)
            ablation.append(dict(e, batch=4, seqlen_q=8448, seqlen_k=8448, heads_q=16, heads_kv=16))
    (folder / "ablation.json").write_text(flash3_json(ablation))
    if peers:
        # Idle gaps: flash3 2 TFLOP/s above flash3-bench; sustained: 20 below, the forward only (a later call
        # would bring the backward).
        write_peers(folder, "peers", GAP, ("fwd",), 2.0, date="2026-12-01T10:05:00+00:00")
        write_peers(folder, "peers", GAP, ("bwd",), -98.0, date="2026-12-01T10:09:00+00:00")
        write_peers(folder, "peers_sustained", SUSTAINED, ("fwd",), -20.0)
    (folder / "fp8_accuracy.txt").write_text(FP8_ACCURACY)
    (folder / "varlen.json").write_text(json.dumps({
        "tool": "python -m flash3.benchmark --varlen", "regime": {"name": "gap", "gap_ms": 50.0, "scope": "sample"},
        "timer": "CUDA events", "rows": [
            {"workload": "equal", "pass": "bwd", "hdim": 128, "causal": True, "seqlen": 512, "batch": 32,
             "heads": 16, "fixed": 200.0, "varlen": 180.0, "ratio": 0.9},
            {"workload": "mix", "pass": "fwd", "hdim": 128, "causal": False, "documents": 5, "tokens": 16384,
             "mean_length": 4124.6, "fixed_seqlen": 4096, "fixed_batch": 4, "heads": 16, "fixed": 700.0,
             "varlen": 665.0, "ratio": 0.95, "sdpa_padded_cudnn": 250.0, "sdpa_jagged": 7.5}]}))
    (folder / "varlen_fp8.json").write_text(json.dumps({
        "tool": "python -m flash3.benchmark --varlen", "regime": {"name": "gap", "gap_ms": 50.0, "scope": "sample"},
        "timer": "CUDA events", "rows": [
            {"workload": "mix", "pass": "fwd", "dtype": "e4m3", "hdim": 128, "causal": True, "documents": 5,
             "tokens": 16384, "mean_length": 4124.6, "fixed_seqlen": 4096, "fixed_batch": 4, "heads": 16,
             "fixed": 900.0, "varlen": 855.0, "ratio": 0.95, "sdpa_padded_cudnn": "SDPA has no FP8 attention",
             "sdpa_jagged": "SDPA has no FP8 attention"}]}))
    (folder / "decode.json").write_text(json.dumps({
        "tool": "python -m flash3.benchmark --decode", "regime": {"name": "gap", "gap_ms": 50.0, "scope": "sample"},
        "timer": "CUDA events", "rows": [
            {"batch": 8, "cache": 131072, "heads_q": 32, "heads_kv": 8, "hdim": 128, "kv_bytes": 4294967296,
             "gbps": {"flash3": 3066.0, "flash3 paged 16": 3031.0, "sdpa_cudnn": 3081.0},
             "not_run": {"fa3": "ModuleNotFoundError: No module named 'flash_attn_interface'"}}]}))
    (folder / "prefill.json").write_text(json.dumps({
        "tool": "python -m flash3.benchmark --prefill", "regime": {"name": "gap", "gap_ms": 50.0, "scope": "sample"},
        "timer": "CUDA events", "rows": [
            {"batch": 1, "chunk": 1024, "cache": 16384, "heads_q": 32, "heads_kv": 8, "hdim": 128, "flops": 1,
             "tflops": {"flash3": 540.0, "flash3 paged 256": 530.0, "plain": 560.0}, "not_run": {}}]}))
    (folder / "mla.json").write_text(json.dumps({
        "tool": "python -m flash3.benchmark --mla", "regime": {"name": "gap", "gap_ms": 50.0, "scope": "sample"},
        "timer": "CUDA events", "rows": [
            {"batch": 64, "cache": 8192, "heads_q": 128, "heads_kv": 1, "hdim": 64, "hdim_v": 512, "flops": 1,
             "kv_bytes": 1, "tflops": {"flash3": 620.0, "flash3 paged 64": 600.0},
             "not_run": {"flash_mla": "ModuleNotFoundError: No module named 'flash_mla'"}}]}))
    (folder / "clocks.csv").write_text("".join(
        f"2026/12/01 10:00:0{i}.000, {mhz} MHz, {watts} W, 55, 0x0000000000000004\n"
        for i, (mhz, watts) in enumerate(((1980, 80.0), (1755, 650.0), (1980, 400.0)))))
    (folder / "bench.txt").write_text("not an input\n")
    (folder / "peers.txt").write_text("not an input\n")
    return folder


def make_logs_tgz(folder, path):
    """As device_run.sh: the files of $OUT, top level, in one archive."""
    with tarfile.open(path, "w:gz") as tar:
        for f in sorted(folder.iterdir()):
            tar.add(f, arcname=f.name)
    return path


def generate(tmp_path, source, *extra, env=None, plot=False):
    data, docs = tmp_path / "perf-data", tmp_path / "docs"
    readme = tmp_path / "README.md"
    if not readme.exists():
        readme.write_text(f"# project\n\nintro\n\n{pr.BEGIN}\nold block\n{pr.END}\n\n## Later\ntext\n")
    args = [sys.executable, str(SCRIPT), str(data), "--out", str(docs / "performance.md"),
            "--plot", str(docs / "performance.png"), "--readme", str(readme)]
    if source is not None:
        for each in source if isinstance(source, list) else [source]:
            args += ["--import", str(each)]
    if not plot:
        args.append("--no-plot")
    done = subprocess.run(args + list(extra), capture_output=True, text=True, env=env)
    return done, data, docs, readme


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("generated")
    run = write_run(tmp_path / "out")
    done, data, docs, readme = generate(tmp_path, make_logs_tgz(run, tmp_path / "logs.tgz"))
    assert done.returncode == 0, done.stderr
    return data, docs, readme, (docs / "performance.md").read_text(), done


def test_import_keeps_the_inputs_only_and_summarises_the_clocks(generated):
    data, _, _, _, _ = generated
    assert sorted(p.name for p in data.iterdir()) == sorted(
        ["gpu.txt", "bench.json", "bench_bwd.json", "bench_fp8.json", "bench_bwd_det.json", "ablation.json",
         "peers_fwd.json", "peers_bwd.json", "peers_sustained_fwd.json", "fp8_accuracy.txt", "clocks.txt",
         "varlen.json", "varlen_fp8.json", "bench_pair.json", "bench_pair_bwd.json", "decode.json", "prefill.json",
         "mla.json"])
    assert (data / "clocks.txt").read_text().startswith("clocks under load (2 samples): SM 1755-1980 MHz")


def test_header(generated):
    md = generated[3]
    assert md.startswith("# flash3 performance\n")
    assert "| device | NVIDIA H100 80GB HBM3 (SM clock 1755 MHz at start, 1980 MHz max, power limit 700.00 W, " \
           "driver 580.159.04) |" in md
    assert "| date | 2026-12-01 10:00 UTC |" in md
    assert "| commit | abc1234 +dirty |" in md
    assert "| command | `scripts/device_run.sh bench bwd fp8 ablation compare sustained` |" in md
    assert "| files | `peers_bwd.json`, `peers_fwd.json`, `peers_sustained_fwd.json`, `bench.json`," in md
    assert "| clocks | clocks under load (2 samples)" in md
    assert "not in this run" not in md and "compare.json" not in md
    assert "[performance-log.md](performance-log.md)" in md
    assert "![TFLOP/s against sequence length, per method](performance.png)" in md
    assert "Plotted: python -m flash3.benchmark, idle gap: the GPU idle 50 ms before every sample." in md


def section(md, title):
    """From a heading to the next one of its level or above."""
    level = len(title.split(" ")[0])
    start = md.index(f"\n{title}\n")
    ends = (start + 1 + m.start() for m in re.finditer(r"\n(#+) ", md[start + 1:]) if len(m.group(1)) <= level)
    return md[start:next(ends, len(md))]


def test_a_section_per_regime_then_flash3_bench_each_with_a_table_per_pass_and_dtype(generated):
    md = generated[3]
    titles = [line for line in md.splitlines() if line.startswith("## ") or line.startswith("### ")]
    assert titles == [f"## {GAP_TITLE}", "### Forward, bf16", "### Backward, bf16",
                      f"## {SUSTAINED_TITLE}", "### Forward, bf16",
                      "## flash3-bench, the C++ benchmark", "### Forward, bf16", "### Forward, e4m3",
                      "### Backward, bf16",
                      "## Backward, deterministic mode", "## Ablation (paper Table 2)", "## Packed sequences (varlen)",
                      "## Decoding from a KV cache", "## Chunked prefill", "## MLA decoding", "## Accuracy",
                      "### FP8 (paper Table 3)"]


def test_idle_gap_forward_table(generated):
    gap = section(generated[3], f"## {GAP_TITLE}")
    assert "Every method timed the same way, in one process, by `python -m flash3.benchmark`." in gap
    assert "- regime: idle gap: the GPU idle 50 ms before every sample" in gap
    assert "- software: PyTorch 2.11.0+cu130, CUDA 13.0, cuDNN 91900" in gap
    # The two calls' files merge into one section.
    assert "- files: `peers_bwd.json`, `peers_fwd.json` " \
           "(2026-12-01T10:05:00+00:00 to 2026-12-01T10:09:00+00:00)" in gap
    assert "- not run: flash_attn_interface (FA3): No module named 'flash_attn_interface'" in gap
    fwd = section(gap, "### Forward, bf16")
    assert "TFLOP/s by sequence length (batch = 16384 / seqlen, heads = 2048 / hdim)." in fwd
    assert "| hdim | causal | method | 1k | 4k |" in fwd
    lines = fwd.splitlines()
    i = lines.index("| 128 | no | **flash3 (flash_attn_func)** | 530.0 | 531.0 |")
    assert lines[i + 1:i + 4] == ["|  |  | SDPA cuDNN | 424.0 | 424.8 |",
                                  "|  |  | SDPA FlashAttention-2 | 265.0 | 265.5 |",
                                  "|  |  | flash3/cuDNN | 1.25 | 1.25 |"]
    # hdim 64 causal: cuDNN has no kernel, so n/a and no ratio; the reason is said once.
    i = lines.index("| 64 | yes | **flash3 (flash_attn_func)** | 476.0 | 477.0 |")
    assert lines[i + 1] == "|  |  | SDPA cuDNN | n/a | n/a |"
    assert lines[i + 3] == "|  |  | flash3/cuDNN | — | — |"
    assert f"- SDPA cuDNN: no number on 2 shape(s): {NO_KERNEL}" in fwd
    assert "flash3 ahead of cuDNN on 6 of 8 shapes with seqlen ≥ 1k (flash3/cuDNN 1.25-1.25, " \
           "flash3/SDPA FA2 2.00-2.00 there)." in fwd
    assert "FA3" not in fwd and "flash_attn (FA2)" not in fwd


def test_failed_flash3_row(generated):
    bwd = section(section(generated[3], f"## {GAP_TITLE}"), "### Backward, bf16")
    lines = bwd.splitlines()
    i = lines.index("| 64 | no | **flash3 (flash_attn_func)** | FAIL | 367.0 |")
    assert lines[i + 3] == "|  |  | flash3/cuDNN | — | 1.25 |"
    assert f"- flash3 (flash_attn_func): no number on 1 shape(s): {WRONG_DQ}" in bwd
    assert "flash3 ahead of cuDNN on 5 of 8 shapes" in bwd


def test_sustained_section_stands_alone(generated):
    md = generated[3]
    sustained = section(md, f"## {SUSTAINED_TITLE}")
    assert "- regime: sustained: each shape under continuous load for at least 2 s, then timed" in sustained
    assert "- files: `peers_sustained_fwd.json` (2026-12-01T10:20:00+00:00)" in sustained
    assert "| 128 | no | **flash3 (flash_attn_func)** | 508.0 | 509.0 |" in sustained
    assert "530.0" not in sustained and "Backward" not in sustained
    assert "508.0" not in section(md, f"## {GAP_TITLE}")


def test_sustained_energy_line(tmp_path):
    # The sustained regime's records carry joules per call: a line of flash3's energy over cuDNN's.
    run = write_run(tmp_path / "out", peers=False)
    records = peer_records("fwd", -20.0)
    for r in records:
        if r["status"] == "ok":
            r["joules"] = {"flash3": 0.008, "sdpa_cudnn": 0.010, "sdpa_flash": 0.02}[r["method"]]
    sweep.write_json(run / "peers_sustained_fwd.json", peers_meta(SUSTAINED, "2026-12-01T10:20:00+00:00"), records)
    done, _, docs, _ = generate(tmp_path, make_logs_tgz(run, tmp_path / "logs.tgz"))
    assert done.returncode == 0, done.stderr
    sustained = section((docs / "performance.md").read_text(), f"## {SUSTAINED_TITLE}")
    assert "|  |  | flash3 J / cuDNN J | 0.80 | 0.80 |" in sustained


def test_flash3_bench_section_has_no_peers(generated):
    bench = section(generated[3], "## flash3-bench, the C++ benchmark")
    assert "continuous load (each shape timed right after the one before, no idle gap)" in bench
    fwd = section(bench, "### Forward, bf16")
    lines = fwd.splitlines()
    i = lines.index("| 128 | no | **flash3** | 528.0 | 529.0 |")
    assert lines[i + 1].startswith("| 128 | yes | **flash3** |")
    assert "SDPA" not in bench and "cuDNN" not in bench and "no-pingpong" not in bench
    assert "| 64 | no | **flash3** | FAIL | 365.0 |" in section(bench, "### Backward, bf16")
    assert "- flash3: no number on 1 shape(s): failed its reference check" in bench
    assert "| 128 | no | **flash3** | 828.0 | 829.0 |" in section(bench, "### Forward, e4m3")


def test_deterministic_against_default(generated):
    det = section(generated[3], "## Backward, deterministic mode")
    assert "| 128 | no | 4k | 373.0 | 429.0 | 0.87 |" in det


def test_ablation(generated):
    abl = section(generated[3], "## Ablation (paper Table 2)")
    assert "fwd, bf16, batch 4, seqlen 8448, 16 heads, hdim 128, non-causal" in abl
    assert "| `default` | flash3, every technique on | 602.0 | 600.0-604.0 | 1.000 | 3 of 3 |" in abl
    assert "| `no-warp-specialization` | " in abl and "| 482.0 | 480.0-484.0 | 0.801 | 3 of 3 |" in abl
    rows = [line for line in abl.splitlines() if line.startswith("| `")]
    assert [r.split(" | ")[0] for r in rows] == ["| `default`", "| `no-pingpong`", "| `no-intra-wg-overlap`",
                                                 "| `no-persistent`", "| `no-warp-specialization`"]


def test_varlen(generated):
    packed = section(generated[3], "## Packed sequences (varlen)")
    assert "- regime: idle gap: the GPU idle 50 ms before every sample" in packed
    assert "| equal | bwd | bf16 | 128 | yes | 32 x 512 | 200.0 | 180.0 | 0.900 | — | — |" in packed
    assert ("| mix | fwd | bf16 | 128 | no | 5 documents, 16384 tokens, mean 4125 (fixed 4 x 4k) | 700.0 | 665.0 "
            "| 0.950 | 250.0 | 7.5 |") in packed
    assert ("| mix | fwd | e4m3 | 128 | yes | 5 documents, 16384 tokens, mean 4125 (fixed 4 x 4k) | 900.0 | 855.0 "
            "| 0.950 | n/a | n/a |") in packed


def test_mla(generated):
    mla = section(generated[3], "## MLA decoding")
    assert "- regime: idle gap: the GPU idle 50 ms before every sample" in mla
    ratio = 64 * 8192 * 576 * 2 / (64 * 8192 * 128 * 2 * (64 + 512 + 512))
    assert f"| 64 | 8192 | 620 | {620 * ratio:.2f} | 600 | {600 * ratio:.2f} | n/a | n/a | none |" in mla
    assert "n/a: FlashMLA (64x8192): ModuleNotFoundError: No module named 'flash_mla'" in mla


def test_prefill(generated):
    prefill = section(generated[3], "## Chunked prefill")
    assert "- regime: idle gap: the GPU idle 50 ms before every sample" in prefill
    assert "| 1024 | 16384 | 540.0 | 530.0 | 560.0 | 0.964 | 0.946 | none |" in prefill


def test_decode(generated):
    decode = section(generated[3], "## Decoding from a KV cache")
    assert "- regime: idle gap: the GPU idle 50 ms before every sample" in decode
    assert "| batch | cache | flash3 | flash3 paged 16 | SDPA cuDNN | FA3 | flash3 / cuDNN | missed |" in decode
    assert ("| 8 | 131072 | 3066 | 3031 | 3081 | n/a | 0.995 | >= 1.02 x cuDNN |") in decode
    assert "n/a: FA3 (8x131072): ModuleNotFoundError: No module named 'flash_attn_interface'" in decode


def test_value_head_dim_of_its_own_is_a_row_of_its_own(generated):
    # The stage pair's rows: 192 and 192/128 apart, each with its own numbers and checks, 192/128 after 192.
    md = generated[3]
    for title in ("### Forward, bf16", "### Backward, bf16"):
        rows = [line for line in section(section(md, "## flash3-bench, the C++ benchmark"), title).splitlines()
                if line.startswith("| 192")]
        assert rows == ["| 192 | no | **flash3** | 700.0 | 701.0 |", "| 192/128 | no | **flash3** | 650.0 | 651.0 |"]
    assert "| fwd | bf16 | 192/128 | no | 2 of 2 |" in section(md, "## Accuracy")


def test_accuracy(generated):
    acc = section(generated[3], "## Accuracy")
    assert "| fwd | bf16 | 128 | yes | 2 of 2 | 1.00e-03 | 2.00e-03 | 0.50 |" in acc
    assert "| bwd | bf16 | 64 | no | 1 of 2 |" in acc
    assert "| 128 | e4m3 per-block + hadamard (flash3) | 8.70e-03 | 2.30x lower | 2.76x lower |" in acc
    assert "| 128 | bf16 | 3.10e-04 |  |  |" in acc
    assert "| 256 | e4m3 per-block (no incoherent processing) | FAIL: unsupported |  |  |" in acc


def test_readme_block_from_the_idle_gap_peers(generated):
    _, _, readme, _, _ = generated
    text = readme.read_text()
    assert text.startswith("# project\n\nintro\n\n" + pr.BEGIN + "\n")
    assert text.endswith(pr.END + "\n\n## Later\ntext\n")
    assert "old block" not in text
    assert "timed by python -m flash3.benchmark, idle gap: the GPU idle 50 ms before every sample;" in text
    assert "| pass | hdim | flash3 | cuDNN | SDPA FA2 | flash3 causal | cuDNN causal | SDPA FA2 causal |" in text
    assert "| forward, bf16 | 128 | 531.0 | 424.8 | 265.5 | 541.0 | 432.8 | 270.5 |" in text
    assert "| forward, bf16 | 64 | 467.0 | 373.6 | 233.5 | 477.0 | n/a | 238.5 |" in text
    assert "e4m3" not in text and "509.0" not in text  # neither flash3-bench's sweep nor the sustained one
    assert "- backward, bf16: flash3 ahead of cuDNN on 5 of 8 shapes" in text
    assert "[docs/performance.md](docs/performance.md)" in text
    assert "![TFLOP/s against sequence length, per method](docs/performance.png)" in text


def test_check_passes_then_catches_an_edit(generated):
    data, docs, readme, md, _ = generated
    args = [sys.executable, str(SCRIPT), str(data), "--out", str(docs / "performance.md"), "--plot",
            str(docs / "performance.png"), "--readme", str(readme), "--check"]
    assert subprocess.run(args, capture_output=True).returncode == 0
    (docs / "performance.md").write_text(md.replace("530.0", "999.0", 1))
    done = subprocess.run(args, capture_output=True, text=True)
    (docs / "performance.md").write_text(md)  # the module's other tests read it
    assert done.returncode == 1 and "999.0" in done.stderr


def test_import_replaces_an_earlier_run(tmp_path):
    first = write_run(tmp_path / "first")
    assert generate(tmp_path, first)[0].returncode == 0
    (tmp_path / "perf-data" / "notes.md").write_text("about the first run")
    second = write_run(tmp_path / "second", fp8=False, peers=False)
    for name in ("fp8_accuracy.txt", "ablation.json"):
        (second / name).unlink()
    done, data, docs, _ = generate(tmp_path, second)
    assert done.returncode == 0, done.stderr
    assert not (data / "bench_fp8.json").exists() and not (data / "notes.md").exists()
    assert not list(data.glob("peers*"))
    md = (docs / "performance.md").read_text()
    assert "| not in this run | `peers*.json`, `bench_fp8.json`, `ablation.json`, `fp8_accuracy.txt` |" in md
    assert "### Forward, e4m3" not in md
    assert "Not measured in this run (no ablation.json)." in md
    assert "Not measured in this run (no fp8_accuracy.txt)." in md


def test_import_of_several_calls(tmp_path):
    """A sweep split over calls: each call's logs.tgz, the first one's gpu.txt."""
    first = write_run(tmp_path / "first")
    second = tmp_path / "second"
    second.mkdir()
    (second / "gpu.txt").write_text("NVIDIA H200, 1980 MHz, 1980 MHz, 700.00 W, 580.1\ncommit def5678\n")
    write_peers(second, "peers_sustained", SUSTAINED, ("bwd",), -120.0, date="2026-12-01T11:00:00+00:00")
    done, data, docs, _ = generate(tmp_path, [make_logs_tgz(first, tmp_path / "first.tgz"),
                                              make_logs_tgz(second, tmp_path / "second.tgz")])
    assert done.returncode == 0, done.stderr
    assert (data / "gpu.txt").read_text().startswith("NVIDIA H100")
    sustained = section((docs / "performance.md").read_text(), f"## {SUSTAINED_TITLE}")
    assert "- files: `peers_sustained_bwd.json`, `peers_sustained_fwd.json` " \
           "(2026-12-01T10:20:00+00:00 to 2026-12-01T11:00:00+00:00)" in sustained
    assert "### Forward, bf16" in sustained and "### Backward, bf16" in sustained


def test_two_gap_lengths_are_two_sections(tmp_path):
    run = write_run(tmp_path / "out")
    write_peers(run, "peers_long_gap", dict(GAP, gap_ms=300.0), ("fwd",), 9.0)
    done, _, docs, readme = generate(tmp_path, run)
    assert done.returncode == 0, done.stderr
    titles = [line for line in (docs / "performance.md").read_text().splitlines() if line.startswith("## ")]
    assert titles[:3] == [f"## {GAP_TITLE}", "## flash3 beside its peers, idle gap: the GPU idle 300 ms before "
                          "every sample", f"## {SUSTAINED_TITLE}"]
    assert "537.0" not in section((docs / "performance.md").read_text(), f"## {GAP_TITLE}")
    assert "idle 50 ms" in readme.read_text()


def test_notes_and_a_run_without_peers(tmp_path):
    run = write_run(tmp_path / "out", fp8=False, peers=False)
    assert generate(tmp_path, run)[0].returncode == 0
    (tmp_path / "perf-data" / "notes.md").write_text("Numbers from a **test**.")
    done, _, docs, readme = generate(tmp_path, None)
    assert done.returncode == 0, done.stderr
    md = (docs / "performance.md").read_text()
    assert "\nNumbers from a **test**.\n" in md
    assert "\n## flash3 beside its peers\n\nNot measured in this run (no `peers*.json`).\n" in md
    assert "flash3 ahead of cuDNN" not in md
    assert "Plotted: flash3-bench, continuous load" in md
    # The headline falls back on flash3-bench's sweep, saying so.
    text = readme.read_text()
    assert "timed by flash3-bench, continuous load (each shape timed right after the one before, no idle gap);" in text
    assert "| pass | hdim | flash3 | flash3 causal |" in text
    assert "| forward, bf16 | 128 | 529.0 | 539.0 |" in text


def test_compare_json_of_an_earlier_run_stands_in_for_the_peers(tmp_path):
    run = write_run(tmp_path / "out", peers=False)
    shape = {"pass": "fwd", "dtype": "bf16", "hdim": 128, "causal": False, "batch": 4, "seqlen_q": 4096,
             "seqlen_k": 4096, "heads_q": 16, "heads_kv": 16}
    rows = [dict(shape, flash3={"ms": 1.0, "tflops": 529.0}, fa2={"ms": 2.0, "tflops": 264.5},
                 cudnn={"ms": 1.25, "tflops": 423.2}),
            dict(shape, dtype="e4m3", flash3={"ms": 1.0, "tflops": 829.0}, fa2={"na": "SDPA has no e4m3"},
                 cudnn={"na": "SDPA has no e4m3"})]
    (run / "compare.json").write_text(json.dumps({"torch": "2.11.0+cu130", "cudnn": 91900, "date": "2026-11-27",
                                                  "timer": "triton.testing.do_bench median", "rows": rows}))
    done, _, docs, readme = generate(tmp_path, run)
    assert done.returncode == 0, done.stderr
    md = (docs / "performance.md").read_text()
    peers = section(md, "## flash3 beside its peers, SDPA's backends timed in a separate process")
    assert "- SDPA's timer: triton.testing.do_bench median" in peers
    assert "| 128 | no | **flash3 (flash3-bench)** | 529.0 |" in peers
    assert "|  |  | SDPA cuDNN | 423.2 |" in peers and "|  |  | flash3/cuDNN | 1.25 |" in peers
    assert "e4m3" not in peers
    assert "| not in this run | `peers*.json` |" in md
    # The README's block shows these peers until a run brings peers*.json.
    block = readme.read_text()
    assert "timed by flash3-bench, and SDPA's backends in a separate process;" in block
    assert "| pass | hdim | flash3 | cuDNN | SDPA FA2 | flash3 causal |" in block


def test_readme_without_markers_is_an_error(tmp_path):
    (tmp_path / "README.md").write_text("# no markers\n")
    done = generate(tmp_path, write_run(tmp_path / "out"))[0]
    assert done.returncode != 0 and "perf:begin" in done.stderr


def test_not_a_run(tmp_path):
    (tmp_path / "empty").mkdir()
    done = generate(tmp_path, tmp_path / "empty")[0]
    assert done.returncode != 0 and "no gpu.txt" in done.stderr


def test_plot_is_written(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed: the plot is optional")
    done, _, docs, _ = generate(tmp_path, write_run(tmp_path / "out"), plot=True)
    assert done.returncode == 0, done.stderr
    assert (docs / "performance.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "performance.png" in done.stdout


def test_plot_is_the_idle_gap_peers_titled_with_the_regime(tmp_path, monkeypatch):
    write_run(tmp_path / "out")
    pr.import_run([tmp_path / "out"], tmp_path / "data")
    drawn = {}
    monkeypatch.setattr(pr, "write_plot", lambda section, title, path: drawn.update(section=section, title=title))
    pr.plot(pr.load(tmp_path / "data"), tmp_path / "plot.png")
    assert drawn["title"] == ("NVIDIA H100 80GB HBM3: python -m flash3.benchmark, idle gap: the GPU idle 50 ms "
                              "before every sample")
    assert [key for key, _ in drawn["section"]["methods"]][:3] == ["flash3", "sdpa_cudnn", "sdpa_flash"]


def test_without_matplotlib_the_markdown_is_still_written(tmp_path):
    # A matplotlib that cannot be imported, ahead of any installed one.
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "matplotlib.py").write_text("raise ImportError('no matplotlib here')\n")
    env = dict(os.environ, PYTHONPATH=str(fake))
    done, _, docs, _ = generate(tmp_path, write_run(tmp_path / "out"), env=env, plot=True)
    assert done.returncode == 0, done.stderr
    assert "no plot written: matplotlib not importable" in done.stderr
    assert not (docs / "performance.png").exists()
    assert (docs / "performance.md").read_text().startswith("# flash3 performance")


def test_fp8_accuracy_parser_ignores_other_lines():
    rows = pr.parse_fp8_accuracy("quantize_fp8: ...\n| hdim | seqlen |\n" + FP8_ACCURACY)
    assert len(rows) == 5
    assert rows[0] == {"hdim": 128, "method": "bf16", "vs_per_tensor": "", "vs_standard": "", "rmse": 3.1e-4}
    assert rows[-1]["failed"] == "FAIL: unsupported"


def test_gpu_txt_without_the_new_lines():
    info = pr.read_gpu("NVIDIA H200, 1980 MHz, 1980 MHz, 700.00 W, 580.1\ncommit 1234567\n")
    assert info["name"] == "NVIDIA H200" and info["commit"] == "1234567" and "date" not in info


def test_committed_report_is_current():
    """docs/performance.md and README.md's block are what docs/perf-data gives: they cannot drift."""
    if not (ROOT / "docs" / "perf-data" / "gpu.txt").is_file():
        pytest.skip("no docs/perf-data in this tree")
    done = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
