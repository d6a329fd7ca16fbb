"""scripts/perf_report.py on small hand-made runs in the formats scripts/device_run.sh leaves (no GPU)."""
import importlib.util
import json
import os
import pathlib
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
cs = module("compare_sdpa", ROOT / "bench" / "compare_sdpa.py")

SEQLENS = (1024, 4096)


def flash3_json(entries):
    """flash3-bench's write_json: one object a line, numbers as a C++ stream prints them (6 digits)."""
    def num(x):
        return format(x, ".6g")
    lines = []
    for e in entries:
        lines.append(
            f'  {{"pass": "{e["pass"]}", "variant": "{e["variant"]}", "dtype": "{e["dtype"]}", "hdim": {e["hdim"]}, '
            f'"causal": {"true" if e["causal"] else "false"}, "batch": {e["batch"]}, "seqlen_q": {e["seqlen_q"]}, '
            f'"seqlen_k": {e["seqlen_k"]}, "heads_q": {e["heads_q"]}, "heads_kv": {e["heads_kv"]}, '
            f'"ms": {num(e["ms"])}, "tflops": {num(e["tflops"])}, "max_err": {num(e["max_err"])}, '
            f'"ref_err": {num(e["ref_err"])}, "ok": {"true" if e["ok"] else "false"}}}')
    return "[\n" + ",\n".join(lines) + "\n]\n"


def entry(pass_, dtype, hdim, causal, seqlen, tflops, variant="default", ok=True, max_err=1e-3, ref_err=2e-3):
    shape = {"pass": pass_, "variant": variant, "dtype": dtype, "hdim": hdim, "causal": causal,
             "batch": 16384 // seqlen, "seqlen_q": seqlen, "seqlen_k": seqlen, "heads_q": 2048 // hdim,
             "heads_kv": 2048 // hdim}
    ms = cs.shape_flops(shape) / (tflops * 1e12) * 1e3
    return dict(shape, ms=ms, tflops=tflops, max_err=max_err, ref_err=ref_err, ok=ok)


def fwd_tflops(hdim, causal, seqlen):
    """Round numbers that tell the cells apart: 100 per hdim step, 10 for the mask, 1 per seqlen step."""
    return 400.0 + hdim + (10 if causal else 0) + SEQLENS.index(seqlen)


def sweep(pass_, dtype, offset=0.0):
    out = []
    for hdim in (64, 128):
        for causal in (False, True):
            for seqlen in SEQLENS:
                out.append(entry(pass_, dtype, hdim, causal, seqlen, fwd_tflops(hdim, causal, seqlen) + offset))
    return out


FP8_ACCURACY = """device: NVIDIA H100 80GB HBM3 (sm_90, 132 SMs)

| hdim | method | RMSE of O | vs flash3 per-tensor | vs standard FP8 (paper's baseline) |
|---|---|---|---|---|
| 128 | bf16 | 3.10e-04 |  |  |
| 128 | e4m3 standard attention, per-tensor, fp16 softmax (paper's baseline) | 2.40e-02 |  | 1.00x lower |
| 128 | e4m3 per-tensor (flash3 baseline) | 2.00e-02 | 1.00x lower | 1.20x lower |
| 128 | e4m3 per-block + hadamard (flash3) | 8.70e-03 | 2.30x lower | 2.76x lower |
| 256 | e4m3 per-block (no incoherent processing) | FAIL: unsupported | | |
"""


def write_run(folder, fp8=True):
    """A whole scripts/device_run.sh $OUT: gpu.txt, the sweeps, the peers, the ablation, FP8 accuracy, clocks."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "gpu.txt").write_text("NVIDIA H100 80GB HBM3, 1755 MHz, 1980 MHz, 700.00 W, 580.159.04\n"
                                    "commit abc1234\n+dirty\ndate 2026-12-01 10:00 UTC\n"
                                    "command scripts/device_run.sh bench bwd fp8 ablation compare\n")
    fwd = sweep("fwd", "bf16")
    fwd.append(entry("fwd", "bf16", 128, False, 4096, 1.0, variant="no-pingpong"))  # not a default row: ignored
    bwd = sweep("bwd", "bf16", offset=-100.0)
    bwd[0] = dict(bwd[0], ok=False)  # hdim 64 no mask 1k fails its check: FAIL
    (folder / "bench.json").write_text(flash3_json(fwd))
    (folder / "bench_bwd.json").write_text(flash3_json(bwd))
    files = [fwd, bwd]
    if fp8:
        e4m3 = sweep("fwd", "e4m3", offset=300.0)
        (folder / "bench_fp8.json").write_text(flash3_json(e4m3))
        files.append(e4m3)
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
    # The peers as compare_sdpa.py writes them: its own grouping, cuDNN at 0.8 and FA2 at 0.5 of flash3,
    # cuDNN without a kernel for hdim 64 causal, SDPA's reason for e4m3.
    rows = cs.group_shapes([e for f in files for e in f])
    for row in rows:
        skip = cs.peer_skip_reason(row)
        if skip:
            row.update(fa2={"na": skip}, cudnn={"na": skip})
            continue
        if "ms" not in row["flash3"]:
            row.update(fa2={"na": "x"}, cudnn={"na": "x"})
            continue
        row["fa2"] = cs.measured(row, row["flash3"]["ms"] / 0.5)
        row["cudnn"] = (cs.measured(row, row["flash3"]["ms"] / 0.8) if (row["hdim"], row["causal"]) != (64, True)
                        else {"na": "No available kernel. Aborting execution."})
    header = {"device": "NVIDIA H100 80GB HBM3", "torch": "2.11.0+cu130", "cudnn": 91900,
              "date": "2026-12-01T10:05+00:00", "timer": "triton.testing.do_bench median"}
    (folder / "compare.json").write_text(json.dumps({**header, "rows": rows}, indent=1))
    (folder / "fp8_accuracy.txt").write_text(FP8_ACCURACY)
    (folder / "clocks.csv").write_text("".join(
        f"2026/12/01 10:00:0{i}.000, {mhz} MHz, {watts} W, 55, 0x0000000000000004\n"
        for i, (mhz, watts) in enumerate(((1980, 80.0), (1755, 650.0), (1980, 400.0)))))
    (folder / "bench.txt").write_text("not an input\n")
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
        args += ["--import", str(source)]
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
         "compare.json", "fp8_accuracy.txt", "clocks.txt"])
    assert (data / "clocks.txt").read_text().startswith("clocks under load (2 samples): SM 1755-1980 MHz")


def test_header(generated):
    md = generated[3]
    assert md.startswith("# flash3 performance\n")
    assert "| device | NVIDIA H100 80GB HBM3 (SM clock 1755 MHz at start, 1980 MHz max, power limit 700.00 W, " \
           "driver 580.159.04) |" in md
    assert "| date | 2026-12-01 10:00 UTC |" in md
    assert "| commit | abc1234 +dirty |" in md
    assert "| command | `scripts/device_run.sh bench bwd fp8 ablation compare` |" in md
    assert "PyTorch 2.11.0+cu130 SDPA" in md and "cuDNN 91900" in md
    assert "| clocks | clocks under load (2 samples)" in md
    assert "not in this run" not in md
    assert "[performance-log.md](performance-log.md)" in md
    assert "![TFLOP/s against sequence length, per method](performance.png)" in md


def section(md, title):
    start = md.index(f"\n## {title}\n")
    end = md.find("\n## ", start + 1)
    return md[start:end if end >= 0 else len(md)]


def test_one_table_per_pass_and_dtype_in_order(generated):
    md = generated[3]
    titles = [line for line in md.splitlines() if line.startswith("## ")]
    assert titles == ["## Forward, bf16", "## Forward, e4m3", "## Backward, bf16", "## Backward, deterministic mode",
                      "## Ablation (paper Table 2)", "## Accuracy"]


def test_forward_table_cells(generated):
    fwd = section(generated[3], "Forward, bf16")
    assert "TFLOP/s by sequence length (batch = 16384 / seqlen, heads = 2048 / hdim)." in fwd
    assert "| hdim | causal | method | 1k | 4k |" in fwd
    lines = fwd.splitlines()
    i = lines.index("| 128 | no | **flash3** | 528.0 | 529.0 |")
    assert lines[i + 1:i + 4] == ["|  |  | cuDNN | 422.4 | 423.2 |", "|  |  | FA2 | 264.0 | 264.5 |",
                                  "|  |  | flash3/cuDNN | 1.25 | 1.25 |"]
    # hdim 64 causal: cuDNN has no kernel, so n/a and no ratio; the reason is said once.
    i = lines.index("| 64 | yes | **flash3** | 474.0 | 475.0 |")
    assert lines[i + 1] == "|  |  | cuDNN | n/a | n/a |"
    assert lines[i + 3] == "|  |  | flash3/cuDNN | — | — |"
    assert "- cuDNN: no number on 2 shape(s): No available kernel. Aborting execution." in fwd
    assert "flash3 ahead of cuDNN on 6 of 8 shapes with seqlen ≥ 1k (flash3/cuDNN 1.25-1.25, " \
           "flash3/FA2 2.00-2.00 there)." in fwd
    assert "no-pingpong" not in fwd


def test_failed_shape_and_fp8_without_peers(generated):
    md = generated[3]
    bwd = section(md, "Backward, bf16")
    assert "| 64 | no | **flash3** | FAIL | 365.0 |" in bwd
    assert "- flash3: no number on 1 shape(s): failed its reference check" in bwd
    fp8 = section(md, "Forward, e4m3")
    assert "| 128 | no | **flash3** | 828.0 | 829.0 |" in fp8
    assert "cuDNN |" not in fp8 and "FA2 |" not in fp8 and "flash3/cuDNN" not in fp8
    assert "- cuDNN (left out): no number on 8 shape(s): SDPA has no e4m3 attention" in fp8


def test_deterministic_against_default(generated):
    det = section(generated[3], "Backward, deterministic mode")
    assert "| 128 | no | 4k | 373.0 | 429.0 | 0.87 |" in det


def test_ablation(generated):
    abl = section(generated[3], "Ablation (paper Table 2)")
    assert "fwd, bf16, batch 4, seqlen 8448, 16 heads, hdim 128, non-causal" in abl
    assert "| `default` | flash3, every technique on | 602.0 | 600.0-604.0 | 1.000 | 3 of 3 |" in abl
    assert "| `no-warp-specialization` | " in abl and "| 482.0 | 480.0-484.0 | 0.801 | 3 of 3 |" in abl
    rows = [line for line in abl.splitlines() if line.startswith("| `")]
    assert [r.split(" | ")[0] for r in rows] == ["| `default`", "| `no-pingpong`", "| `no-intra-wg-overlap`",
                                                 "| `no-persistent`", "| `no-warp-specialization`"]


def test_accuracy(generated):
    acc = section(generated[3], "Accuracy")
    assert "| fwd | bf16 | 128 | yes | 2 of 2 | 1.00e-03 | 2.00e-03 | 0.50 |" in acc
    assert "| bwd | bf16 | 64 | no | 1 of 2 |" in acc
    assert "| 128 | e4m3 per-block + hadamard (flash3) | 8.70e-03 | 2.30x lower | 2.76x lower |" in acc
    assert "| 128 | bf16 | 3.10e-04 |  |  |" in acc
    assert "| 256 | e4m3 per-block (no incoherent processing) | FAIL: unsupported |  |  |" in acc


def test_readme_block(generated):
    _, _, readme, _, _ = generated
    text = readme.read_text()
    assert text.startswith("# project\n\nintro\n\n" + pr.BEGIN + "\n")
    assert text.endswith(pr.END + "\n\n## Later\ntext\n")
    assert "old block" not in text
    assert "| pass | hdim | flash3 | cuDNN | FA2 | flash3 causal | cuDNN causal | FA2 causal |" in text
    assert "| forward, bf16 | 128 | 529.0 | 423.2 | 264.5 | 539.0 | 431.2 | 269.5 |" in text
    assert "| forward, e4m3 | 64 | 765.0 | n/a | n/a | 775.0 | n/a | n/a |" in text
    assert "- backward, bf16: flash3 ahead of cuDNN on 5 of 8 shapes" in text
    assert "[docs/performance.md](docs/performance.md)" in text
    assert "![TFLOP/s against sequence length, per method](docs/performance.png)" in text


def test_check_passes_then_catches_an_edit(generated):
    data, docs, readme, md, _ = generated
    args = [sys.executable, str(SCRIPT), str(data), "--out", str(docs / "performance.md"), "--plot",
            str(docs / "performance.png"), "--readme", str(readme), "--check"]
    assert subprocess.run(args, capture_output=True).returncode == 0
    (docs / "performance.md").write_text(md.replace("528.0", "999.0", 1))
    done = subprocess.run(args, capture_output=True, text=True)
    (docs / "performance.md").write_text(md)  # the module's other tests read it
    assert done.returncode == 1 and "999.0" in done.stderr


def test_import_replaces_an_earlier_run(tmp_path):
    first = write_run(tmp_path / "first")
    assert generate(tmp_path, first)[0].returncode == 0
    (tmp_path / "perf-data" / "notes.md").write_text("about the first run")
    second = write_run(tmp_path / "second", fp8=False)
    for name in ("fp8_accuracy.txt", "ablation.json"):
        (second / name).unlink()
    done, data, docs, _ = generate(tmp_path, second)
    assert done.returncode == 0, done.stderr
    assert not (data / "bench_fp8.json").exists() and not (data / "notes.md").exists()
    md = (docs / "performance.md").read_text()
    assert "| not in this run | `bench_fp8.json`, `ablation.json`, `fp8_accuracy.txt` |" in md
    assert "## Forward, e4m3" not in md
    assert "Not measured in this run (no ablation.json)." in md
    assert "Not measured in this run (no fp8_accuracy.txt)." in md


def test_notes_and_a_run_without_peers(tmp_path):
    run = write_run(tmp_path / "out", fp8=False)
    (run / "compare.json").unlink()
    assert generate(tmp_path, run)[0].returncode == 0
    (tmp_path / "perf-data" / "notes.md").write_text("Numbers from a **test**.")
    done, _, docs, _ = generate(tmp_path, None)
    assert done.returncode == 0, done.stderr
    md = (docs / "performance.md").read_text()
    assert "\nNumbers from a **test**.\n" in md
    fwd = section(md, "Forward, bf16")
    assert "cuDNN |" not in fwd and "- cuDNN (left out): no number on 8 shape(s): no compare.json" in fwd
    assert "flash3 ahead of cuDNN" not in fwd


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
