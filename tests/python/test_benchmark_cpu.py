"""The parts of `python -m flash3.benchmark` that need no GPU: the sweep, FLOP
counts, records, tables, JSON / CSV files, the plot, and the command line
without a GPU.

sweep.py and plot.py are loaded by their paths, and the command line runs with
a bare `flash3` package object in front of python/flash3/: nothing here needs
flash3's library or the package's __init__ (which loads it).
"""
import contextlib
import importlib
import importlib.util
import pathlib
import subprocess
import sys
import types

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "python" / "flash3"


def load(name):
    spec = importlib.util.spec_from_file_location(f"flash3_bench_{name}", PACKAGE / "_bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# A module of _bench that imports its siblings, inside a package of its own
# (flash3's own __init__ needs PyTorch), as scripts/perf_report.py loads them.
def _perf_report():
    spec = importlib.util.spec_from_file_location("perf_report", ROOT / "scripts" / "perf_report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


load_in_package = _perf_report().bench_module


sweep = load("sweep")
plot = load("plot")
overhead = load_in_package("overhead")
decode_table = load_in_package("decode_table")
prefill_table = load("prefill_table")
mla_table = load_in_package("mla_table")
methods_mod = load_in_package("methods")

GAP = {"name": "gap", "gap_ms": 100.0, "scope": "sample"}
SUSTAINED = {"name": "sustained", "load_s": 2.0}
SHAPE = {"pass": "fwd", "dtype": "bf16", "hdim": 128, "causal": False, "batch": 1, "seqlen": 16384, "heads": 16}


def shape(**changes):
    return dict(SHAPE, **changes)


def ms_at(tflops, s):
    """The time at which shape s runs at the given TFLOP/s."""
    return sweep.shape_flops(s) / (tflops * 1e12) * 1e3


def run_cli(*args):
    """python -m flash3.benchmark ARGS, with flash3 a bare package object (its __init__ not run)."""
    code = ("import runpy, sys, types; pkg = types.ModuleType('flash3'); pkg.__path__ = [sys.argv[1]]; "
            "sys.modules['flash3'] = pkg; sys.argv = ['flash3.benchmark'] + sys.argv[2:]; "
            "runpy.run_module('flash3.benchmark', run_name='__main__', alter_sys=True)")
    return subprocess.run([sys.executable, "-c", code, str(PACKAGE), *args], capture_output=True, text=True,
                          timeout=120)


# ---- FLOPs and the sweep ------------------------------------------------------------------

def test_flops_are_the_papers_count():
    full = 4 * 16384 ** 2 * 128 * 16 * 1
    assert sweep.attention_flops("fwd", 128, False, 1, 16384, 16) == full
    assert sweep.attention_flops("fwd", 128, True, 1, 16384, 16) == full // 2
    assert sweep.attention_flops("bwd", 128, False, 1, 16384, 16) == full * 5 // 2
    assert sweep.attention_flops("fwd+bwd", 128, True, 1, 16384, 16) == full * 7 // 4
    assert sweep.shape_flops(shape(**{"pass": "bwd", "causal": True})) == full * 5 // 4


def test_flops_with_a_value_head_dim_of_its_own():
    # From the GEMMs: forward Q K^T over d and P V over dv; the backward's
    # five, three over d (S, dQ, dK) and two over dv (dP, dV).
    s2 = 4096 ** 2 * 10 * 2
    assert sweep.attention_flops("fwd", 192, False, 2, 4096, 10, 128) == 2 * s2 * (192 + 128)
    assert sweep.attention_flops("bwd", 192, False, 2, 4096, 10, 128) == 2 * s2 * (3 * 192 + 2 * 128)
    assert sweep.attention_flops("fwd+bwd", 192, True, 2, 4096, 10, 128) == s2 * (192 + 128 + 3 * 192 + 2 * 128)
    assert sweep.attention_flops("bwd", 192, False, 2, 4096, 10, 192) == sweep.attention_flops(
        "bwd", 192, False, 2, 4096, 10)
    pair = shape(hdim=192, hdim_v=128, heads=10, seqlen=4096, batch=2)
    assert sweep.shape_flops(pair) == 2 * s2 * (192 + 128)


def test_paper_sweep_takes_a_value_head_dim_of_its_own():
    shapes = sweep.paper_sweep(("fwd",), (192, (192, 128)), (4096,), (False,))
    assert shapes == [{"pass": "fwd", "dtype": "bf16", "hdim": 192, "causal": False, "batch": 4, "seqlen": 4096,
                       "heads": 10},
                      {"pass": "fwd", "dtype": "bf16", "hdim": 192, "causal": False, "batch": 4, "seqlen": 4096,
                       "heads": 10, "hdim_v": 128}]
    results = [sweep.ok_result(s, "flash3", [ms_at(600, s)]) for s in shapes]
    lines = sweep.format_table(results).splitlines()
    assert lines[2].startswith("| fwd | bf16 | 192 | no | 4 | 4096 | 10 | 600.0 |")
    assert lines[3].startswith("| fwd | bf16 | 192/128 | no | 4 | 4096 | 10 | 600.0 |")
    assert sweep.shape_label(shapes[1]) == "fwd bf16 hdim 192/128 seqlen 4096 batch 4 heads 10"


def test_paper_sweep_keeps_tokens_and_hidden_fixed():
    shapes = sweep.paper_sweep()
    assert len(shapes) == 3 * 2 * 6 * 3
    assert all(s["batch"] * s["seqlen"] == 16384 and s["heads"] * s["hdim"] == 2048 for s in shapes)
    # flash3-bench's order: head dim, mask, seqlen; a shape's passes together.
    assert [(s["hdim"], s["causal"], s["seqlen"], s["pass"]) for s in shapes[:4]] == [
        (64, False, 512, "fwd"), (64, False, 512, "bwd"), (64, False, 512, "fwd+bwd"), (64, False, 1024, "fwd")]
    assert shapes[-1] == {"pass": "fwd+bwd", "dtype": "bf16", "hdim": 256, "causal": True, "batch": 1,
                          "seqlen": 16384, "heads": 8}


def test_sweep_options_and_floors():
    shapes = sweep.paper_sweep(("bwd",), (64,), (32768,), (True,), "fp16", tokens=16384, hidden=32)
    assert shapes == [{"pass": "bwd", "dtype": "fp16", "hdim": 64, "causal": True, "batch": 1, "seqlen": 32768,
                       "heads": 1}]


def test_rotated_changes_who_goes_first():
    assert sweep.rotated(["a", "b", "c"], 0) == ["a", "b", "c"]
    assert sweep.rotated(["a", "b", "c"], 4) == ["b", "c", "a"]


# ---- records and tables ---------------------------------------------------------------------

def test_ok_result_reports_the_median():
    s = shape()
    r = sweep.ok_result(s, "flash3", [ms_at(500, s), ms_at(400, s), ms_at(600, s)], {"max_err": 1e-3, "ref_err": 1e-3},
                        {"sm_mhz": 1980.0, "power_w": 650.0})
    assert r["status"] == "ok" and r["ms"] == ms_at(500, s)
    assert r["tflops"] == pytest.approx(500)
    assert r["samples_ms"] == [ms_at(500, s), ms_at(400, s), ms_at(600, s)]
    assert r["sm_mhz"] == 1980.0 and r["max_err"] == 1e-3


def sample_results():
    a, b = shape(), shape(seqlen=512, batch=32)
    return [
        sweep.ok_result(a, "flash3", [ms_at(500, a)]),
        sweep.ok_result(a, "sdpa_flash", [ms_at(400, a)]),
        sweep.na_result(a, "sdpa_cudnn", "No available kernel"),
        sweep.failed_result(b, "flash3", "O: max error 1.0e-01 above 2x the same-precision reference's 1.0e-03"),
        sweep.ok_result(b, "sdpa_flash", [ms_at(250, b)]),
        sweep.na_result(b, "sdpa_cudnn", "No available kernel"),
    ]


def test_table_has_tflops_and_speedups():
    table = sweep.format_table(sample_results())
    lines = table.splitlines()
    assert lines[0] == ("| pass | dtype | hdim | causal | batch | seqlen | heads | flash3 | SDPA FlashAttention-2 "
                        "| SDPA cuDNN | flash3 / SDPA FlashAttention-2 | flash3 / SDPA cuDNN |")
    assert lines[2] == "| fwd | bf16 | 128 | no | 1 | 16384 | 16 | 500.0 | 400.0 | n/a | 1.25 | n/a |"
    assert lines[3] == "| fwd | bf16 | 128 | no | 32 | 512 | 16 | FAIL | 250.0 | n/a | n/a | n/a |"


def test_table_with_energy_adds_millijoules_and_flash3s_share():
    # The sustained regime's records carry joules per call: a column per method, and flash3's over each peer's.
    a = shape()
    results = [sweep.ok_result(a, "flash3", [ms_at(500, a)], None, {"joules": 0.012}),
               sweep.ok_result(a, "sdpa_cudnn", [ms_at(450, a)], None, {"joules": 0.015}),
               sweep.na_result(a, "sdpa_flash", "No available kernel")]
    lines = sweep.format_table(results).splitlines()
    assert lines[0].endswith("| flash3 mJ/call | SDPA FlashAttention-2 mJ/call | SDPA cuDNN mJ/call "
                             "| flash3 J / SDPA FlashAttention-2 J | flash3 J / SDPA cuDNN J |")
    assert lines[2].endswith("| 500.0 | n/a | 450.0 | n/a | 1.11 | 12.00 |  | 15.00 | n/a | 0.80 |")
    assert "mJ/call" not in sweep.format_table(sample_results())


class FakeEvent:
    def record(self):
        pass

    def synchronize(self):
        pass


class FakeTorch:
    """What Timer's load and energy window use of torch, on no GPU."""
    uint8 = "uint8"

    def __init__(self):
        self.cuda = types.SimpleNamespace(Event=FakeEvent, synchronize=lambda: None)

    @staticmethod
    def empty(n, dtype, device):
        return types.SimpleNamespace(zero_=lambda: None)


class FakeCounter:
    """An energy counter that grows 7 mJ a call, or none."""
    def __init__(self, present=True):
        self.present, self.mj = present, 1000

    def energy_mj(self):
        return self.mj if self.present else None


def test_energy_window_gives_joules_per_call(monkeypatch):
    timing = load("timing")
    monkeypatch.setattr(timing, "ENERGY_S", 0.05)
    counter = FakeCounter()
    timer = timing.Timer(FakeTorch(), SUSTAINED, 3, counter)

    def call():
        counter.mj += 7
    energy = timer._energy(call)
    assert energy["joules"] == pytest.approx(0.007)
    assert "energy counter" in timer.description()
    assert timing.Timer(FakeTorch(), SUSTAINED, 3, FakeCounter(present=False))._energy(call) == {}
    assert "energy" not in timing.Timer(FakeTorch(), GAP, 3, counter).description()


def test_table_without_flash3_has_no_speedups():
    results = [r for r in sample_results() if r["method"] != "flash3"]
    assert "flash3 /" not in sweep.format_table(results)


def test_notes_list_failures_and_count_na_reasons():
    notes = sweep.format_notes(sample_results())
    assert notes == [
        "- flash3 FAIL, fwd bf16 hdim 128 seqlen 512 batch 32 heads 16: O: max error 1.0e-01 above 2x the "
        "same-precision reference's 1.0e-03",
        "- SDPA cuDNN n/a on 2 shape(s): No available kernel",
    ]


def test_regime_labels_and_header():
    assert sweep.regime_label(GAP) == "idle gap: the GPU idle 100 ms before every sample"
    assert "each shape's samples" in sweep.regime_label(dict(GAP, scope="shape"))
    assert sweep.regime_label(SUSTAINED).startswith("sustained: each shape under continuous load for at least 2 s")
    device = {"name": "NVIDIA H100 80GB HBM3", "sm_mhz": 1980.0, "power_limit_w": 700.0}
    header = sweep.format_header({"regime": SUSTAINED, "timer": "CUDA events", "device": device})
    assert header.splitlines()[0] == "device: NVIDIA H100 80GB HBM3 (sm_mhz 1980.0, power_limit_w 700.0)"
    assert "regime: sustained" in header


# ---- files ---------------------------------------------------------------------------------

def test_json_round_trip(tmp_path):
    meta = {"regime": GAP, "device": {"name": "GPU"}, "timer": "t"}
    sweep.write_json(tmp_path / "r.json", meta, sample_results())
    assert sweep.read_json(tmp_path / "r.json") == (meta, sample_results())


def test_csv_round_trip_keeps_the_regime(tmp_path):
    results = sample_results()
    sweep.write_csv(tmp_path / "r.csv", {"regime": SUSTAINED}, results)
    rows = sweep.read_csv(tmp_path / "r.csv")
    assert len(rows) == len(results)
    for row, r in zip(rows, results):
        assert row["regime"] == sweep.regime_label(SUSTAINED)
        assert {k: v for k, v in row.items() if k != "regime"} == {k: r[k] for k in sweep.CSV_FIELDS if k in r}


def test_runs_of_one_regime_merge_and_of_two_never():
    a = ({"regime": GAP, "device": {"name": "x"}}, sample_results()[:3])
    b = ({"regime": dict(GAP), "device": {"name": "x"}}, sample_results()[3:])
    meta, results = sweep.merge_runs([a, b])
    assert meta["regime"] == GAP and results == sample_results()
    with pytest.raises(ValueError, match="different regimes"):
        sweep.merge_runs([a, ({"regime": SUSTAINED}, [])])
    with pytest.raises(ValueError):
        sweep.merge_runs([a, ({"regime": dict(GAP, gap_ms=300.0)}, [])])


# ---- host overhead -----------------------------------------------------------------------------

def test_overhead_methods_take_turns():
    # After the warm-up, each job runs BLOCK timed calls in turn, each on its
    # own setup's result, with a synchronization (untimed) after every turn.
    events = []
    torch = types.SimpleNamespace(cuda=types.SimpleNamespace(synchronize=lambda: events.append("sync")))
    jobs = {name: (contextlib.nullcontext, lambda arg, name=name: events.append((name, arg)), lambda name=name: name + "'s")
            for name in ("a", "b")}
    times = overhead.interleaved_times(torch, jobs, 2 * overhead.BLOCK)
    warmup = [(n, n + "'s") for n in ("a", "b") for _ in range(overhead.WARMUP_CALLS)] + ["sync"]
    turn = [("a", "a's")] * overhead.BLOCK + ["sync"] + [("b", "b's")] * overhead.BLOCK + ["sync"]
    assert events == warmup + 2 * turn
    assert set(times) == {"a", "b"}
    assert all(set(t) == {"median_us", "p10_us", "p90_us"} and t["p10_us"] <= t["median_us"] <= t["p90_us"]
               for t in times.values())


def test_overhead_decoding_step(monkeypatch):
    # The decode sweep's one-call methods on its smallest shape: a method
    # whose call raises is n/a with the reason, the others timed; the sweep's
    # other methods (paged, FP8, append) are not made.
    made, calls = [], []

    def maker(name, fails=False):
        def make():
            made.append(name)
            if fails:
                raise ModuleNotFoundError("No module named 'flash_attn_interface'")
            return lambda: calls.append(name)
        return make

    fake_decode = types.SimpleNamespace(
        inputs=lambda torch, batch, cache: (batch, cache, None),
        methods_of=lambda torch, q, k, v, pages, seed: [
            ("flash3", maker("flash3"), None), ("flash3 paged 64", maker("paged"), None),
            ("sdpa_flash", maker("sdpa_flash"), None), ("fa3", maker("fa3", fails=True), None)])
    monkeypatch.setattr(overhead, "decode", fake_decode)
    torch = types.SimpleNamespace(cuda=types.SimpleNamespace(synchronize=lambda: None))
    results = overhead.measure_decode(torch, overhead.BLOCK)
    assert made == ["flash3", "sdpa_flash", "fa3"]
    assert results["fa3"] == {"na": "ModuleNotFoundError: No module named 'flash_attn_interface'"}
    assert set(results["flash3"]) == set(results["sdpa_flash"]) == {overhead.DECODE_MODE}
    assert calls.count("flash3") == 1 + overhead.WARMUP_CALLS + overhead.BLOCK
    table = sweep.format_overhead(results, (overhead.DECODE_MODE,))
    assert table.splitlines()[0] == f"| method | {overhead.DECODE_MODE} |"


def test_overhead_verdict_and_table():
    times = {"flash3": {"fwd": {"median_us": 9.0, "p10_us": 8.5, "p90_us": 10.0},
                        "grad": {"median_us": 14.0, "p10_us": 13.0, "p90_us": 15.0}},
             "sdpa_flash": {"fwd": {"median_us": 11.0, "p10_us": 10.0, "p90_us": 12.0},
                            "grad": {"median_us": 13.0, "p10_us": 12.0, "p90_us": 14.0}},
             "sdpa_cudnn": {"na": "No available kernel"}}
    assert sweep.overhead_verdicts(times, ("fwd", "grad", "bwd")) == {"fwd": True, "grad": False}
    table = sweep.format_overhead(times, ("fwd", "grad"))
    assert "| flash3 | 9.0 (8.5-10.0) | 14.0 (13.0-15.0) |" in table
    assert "| SDPA cuDNN | n/a | n/a |" in table
    assert table.endswith("\n\n- SDPA cuDNN n/a: No available kernel")


# ---- the plot ----------------------------------------------------------------------------------

def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib", reason="the plot needs matplotlib")
    results = [sweep.ok_result(shape(**{"pass": p, "causal": c, "hdim": d, "seqlen": n, "heads": 2048 // d,
                                        "batch": 16384 // n}), m, [1.0])
               for p in ("fwd", "bwd") for c in (False, True) for d in (64, 128) for n in (512, 16384)
               for m in ("flash3", "sdpa_flash")]
    results.append(sweep.na_result(shape(), "sdpa_cudnn", "no kernel"))
    path = tmp_path / "fig.png"
    assert plot.write_plot(results, sweep.METHODS, "GPU\nregime", path) is None
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_timed_results_says_why(tmp_path):
    pytest.importorskip("matplotlib", reason="the plot needs matplotlib")
    why = plot.write_plot([sweep.na_result(shape(), "fa2", "x")], sweep.METHODS, "regime", tmp_path / "f.png")
    assert why == "no timed result to plot"


# ---- the command line -------------------------------------------------------------------------

def test_cli_renders_saved_runs(tmp_path):
    sweep.write_json(tmp_path / "a.json", {"regime": GAP, "timer": "t", "device": {"name": "GPU"}}, sample_results())
    out = run_cli("--from-json", str(tmp_path / "a.json"), "--csv", str(tmp_path / "a.csv"))
    assert out.returncode == 0, out.stderr
    assert "regime: idle gap: the GPU idle 100 ms before every sample" in out.stdout
    assert "| fwd | bf16 | 128 | no | 1 | 16384 | 16 | 500.0 | 400.0 | n/a | 1.25 | n/a |" in out.stdout
    assert len(sweep.read_csv(tmp_path / "a.csv")) == len(sample_results())


def test_cli_refuses_to_merge_regimes(tmp_path):
    sweep.write_json(tmp_path / "a.json", {"regime": GAP}, sample_results())
    sweep.write_json(tmp_path / "b.json", {"regime": SUSTAINED}, sample_results())
    out = run_cli("--from-json", str(tmp_path / "a.json"), str(tmp_path / "b.json"))
    assert out.returncode == 1
    assert "runs of different regimes cannot be compared" in out.stderr


def test_cli_head_dims_take_a_value_head_dim(tmp_path):
    # "192/128" in --hdim: V's head dim of its own, kept through the JSON and CSV files.
    out = run_cli("--varlen", "--hdim", "128,192/128")
    assert out.returncode == 2 and "--varlen takes head dims D" in out.stderr
    shapes = sweep.paper_sweep(("bwd",), ((192, 128),), (2048,), (True,))
    sweep.write_json(tmp_path / "p.json", {"regime": GAP}, [sweep.ok_result(shapes[0], "flash3", [1.0])])
    out = run_cli("--from-json", str(tmp_path / "p.json"), "--csv", str(tmp_path / "p.csv"))
    assert out.returncode == 0, out.stderr
    assert "| bwd | bf16 | 192/128 | yes | 8 | 2048 | 10 |" in out.stdout
    assert sweep.read_csv(tmp_path / "p.csv")[0]["hdim_v"] == 128


def test_cli_rejects_unknown_methods():
    out = run_cli("--methods", "flash3,xformers")
    assert out.returncode == 2 and "unknown xformers" in out.stderr


@pytest.mark.parametrize("mode", [[], ["--overhead"], ["--sustained", "--pass", "fwd"]])
def test_cli_without_gpu_exits_2(mode):
    torch = pytest.importorskip("torch", reason="the GPU check goes through torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    out = run_cli(*mode)
    assert out.returncode == 2
    assert "no CUDA device" in out.stderr and "Traceback" not in out.stderr


# ---- the variable-length benchmark's batches -------------------------------------------------

def test_log_uniform_documents_fill_the_tokens_in_range():
    packing = load_in_package("packing")
    lengths = packing.log_uniform_lengths(16384, 128, 8192, 34)
    assert sum(lengths) == 16384 and all(1 <= n <= 8192 for n in lengths[:-1])
    assert lengths == packing.log_uniform_lengths(16384, 128, 8192, 34)  # seeded
    assert packing.cu_seqlens([3, 0, 5]) == [0, 3, 3, 8]


def test_packed_flops_are_the_documents_own():
    packing = load_in_package("packing")
    sweep = load("sweep")
    lengths = [1000, 3000]
    assert packing.packed_flops("fwd", 128, False, 16, lengths) == sum(
        sweep.attention_flops("fwd", 128, False, 1, n, 16) for n in lengths)
    # The token-weighted mean length: a fixed batch of it does the same FLOPs.
    mean = packing.token_weighted_mean(lengths)
    assert mean == (1000 ** 2 + 3000 ** 2) / 4000
    assert packing.packed_flops("bwd", 64, True, 8, lengths) == pytest.approx(
        sweep.attention_flops("bwd", 64, True, 1, 1, 8) * mean * sum(lengths), rel=1e-12)


@pytest.mark.parametrize("args", [["--dtype", "e4m3"], ["--dtype", "e4m3", "--varlen"],
                                  ["--dtype", "e4m3", "--varlen", "--pass", "bwd"]])
def test_cli_takes_e4m3_for_the_packed_forward_only(args):
    out = run_cli(*args)
    assert out.returncode == 2 and "--dtype e4m3: with --varlen --pass fwd only" in out.stderr


def test_varlen_table_names_the_dtype_and_peers_without_a_kernel():
    varlen = load_in_package("varlen")
    rows = [{"workload": "mix", "pass": "fwd", "dtype": "e4m3", "hdim": 128, "causal": True, "documents": 5,
             "tokens": 16384, "mean_length": 4124.6, "fixed_seqlen": 4096, "fixed_batch": 4, "heads": 16,
             "fixed": 900.0, "varlen": 855.0, "ratio": 0.95, "sdpa_padded_cudnn": "SDPA has no FP8 attention",
             "sdpa_jagged": "SDPA has no FP8 attention"}]
    assert ("| mix | fwd | e4m3 | 128 | yes | 5 documents, mean 4125 (fixed 4 x 4096) | 900.0 | 855.0 | 0.950 "
            "| n/a | n/a |") in varlen.format_table(rows)


# ---- the decode sweep --------------------------------------------------------------------

def test_decode_shapes_keep_the_issues_anchors_under_the_token_cap():
    shapes = decode_table.decode_shapes()
    assert {(1, 131072), (8, 32768), (64, 4096)} <= set(shapes)
    assert all(b * c <= decode_table.MAX_TOKENS for b, c in shapes)
    assert (64, 131072) not in shapes and (128, 131072) not in shapes
    assert decode_table.decode_shapes([2], [16, 32]) == [(2, 16), (2, 32)]


def test_decode_bytes_are_both_tensors_once():
    # 8 x 32k tokens, 8 KV heads of 128 bf16 elements, K and V.
    assert decode_table.kv_bytes(8, 32768) == 2 * 8 * 32768 * 8 * 128 * 2


def decode_row(batch, cache, **gbps):
    return {"batch": batch, "cache": cache, "gbps": {k.replace("_", " ") if k.startswith("flash3_") else k: v
                                                     for k, v in gbps.items()}, "not_run": {}}


def test_decode_targets_per_row():
    long = decode_row(8, 32768, flash3=3000.0, sdpa_cudnn=2938.0, flash3_paged_16=2800.0)
    assert decode_table.targets(long) == {">= 1.02 x cuDNN": True, ">= 2.95 TB/s": True,
                                          "paged 16 >= 0.95 x plain": False}
    short = decode_row(64, 4096, flash3=2900.0, sdpa_cudnn=2958.0)
    assert decode_table.targets(short) == {">= 1.02 x cuDNN": False}
    # The e4m3 cache's GB/s count its own bytes: no "within 5% of plain".
    assert decode_table.targets(decode_row(64, 4096, flash3=2900.0, flash3_e4m3=2000.0)) == {}
    assert decode_table.element_bytes(decode_table.FP8) == 1 and decode_table.element_bytes("flash3") == 2
    single = decode_row(1, 131072, flash3=2900.0)
    assert decode_table.targets(single) == {">= 2.95 TB/s": False, "batch 1 >= 2.9 TB/s": True}
    assert decode_table.targets(decode_row(1, 1024, sdpa_cudnn=900.0)) == {}


def test_decode_table_and_notes():
    rows = [decode_row(1, 131072, flash3=2604.0, sdpa_cudnn=2769.0, flash3_paged_16=2589.0),
            dict(decode_row(8, 4096, flash3=1949.0), not_run={"sdpa_cudnn": "no kernel", "fa3": "not importable"})]
    rows[0]["not_run"] = {"fa3": "not importable"}
    table = decode_table.format_table(rows).splitlines()
    assert table[0] == "| batch | cache | flash3 | flash3 paged 16 | SDPA cuDNN | FA3 | flash3 / cuDNN | missed |"
    assert table[2] == ("| 1 | 131072 | 2604 | 2589 | 2769 | n/a | 0.940 | >= 1.02 x cuDNN; >= 2.95 TB/s; "
                        "batch 1 >= 2.9 TB/s |")
    assert table[3] == "| 8 | 4096 | 1949 | n/a | n/a | n/a | n/a | none |"
    assert decode_table.format_notes(rows) == ["n/a: FA3 (1x131072, 8x4096): not importable",
                                               "n/a: SDPA cuDNN (8x4096): no kernel"]


# ---- timing one method ------------------------------------------------------------------

class FakeTimer:
    def __init__(self):
        self.measured = []

    def measure(self, fn):
        self.measured.append(fn)
        return [3.0, 1.0, 2.0], {}


def test_timed_returns_the_samples_or_why_there_are_none():
    timer = FakeTimer()
    call = lambda: "out"  # noqa: E731
    assert methods_mod.timed(timer, lambda: call, None) == ([3.0, 1.0, 2.0], None)
    assert methods_mod.timed(timer, lambda: call, lambda fn: None if fn() == "out" else "wrong") == ([3.0, 1.0, 2.0], None)
    assert timer.measured == [call, call]
    # A failed check is reported and the call is not timed.
    assert methods_mod.timed(timer, lambda: call, lambda fn: "O: max error 1") == (None, "check failed: O: max error 1")
    assert len(timer.measured) == 2

    def no_kernel():
        raise NotImplementedError("head_dim: 80 is not supported")
    assert methods_mod.timed(timer, no_kernel, None) == (None, "NotImplementedError: head_dim: 80 is not supported")
    assert len(timer.measured) == 2


# ---- the chunked prefill sweep -----------------------------------------------------------

def test_prefill_shapes_keep_chunks_within_their_cache():
    shapes = prefill_table.prefill_shapes()
    assert (2048, 32768) in shapes and (512, 8192) in shapes
    assert prefill_table.prefill_shapes([512, 4096], [2048]) == [(512, 2048)]


def test_prefill_flops_count_the_bottom_right_causal_pairs():
    # A chunk of 3 queries at the end of 5 keys sees 3, 4 and 5 keys.
    assert prefill_table.visited_pairs(3, 5) == 12
    # The chunk the whole cache: the causal triangle with its diagonal.
    assert prefill_table.visited_pairs(4, 4) == 10
    assert prefill_table.flops(1, 3, 5, heads_q=2, hdim=8) == 4 * 2 * 8 * 12


def test_prefill_targets_and_table():
    rows = [{"chunk": 512, "cache": 8192, "tflops": {"flash3": 450.0, "flash3 paged 256": 400.0, "plain": 480.0},
             "not_run": {}},
            {"chunk": 2048, "cache": 32768, "tflops": {"flash3": 600.0}, "not_run": {"plain": "out of memory"}}]
    assert prefill_table.targets(rows[0]) == {"flash3 KV cache >= 0.9 x plain": True,
                                              "flash3 paged 256 >= 0.9 x plain": False}
    assert prefill_table.targets(rows[1]) == {}
    table = prefill_table.format_table(rows).splitlines()
    assert table[0] == ("| chunk | cache | flash3 KV cache | flash3 paged 256 | flash_attn_func | "
                        "flash3 KV cache / plain | flash3 paged 256 / plain | missed |")
    assert table[2] == "| 512 | 8192 | 450.0 | 400.0 | 480.0 | 0.938 | 0.833 | flash3 paged 256 >= 0.9 x plain |"
    assert table[3] == "| 2048 | 32768 | 600.0 | n/a | n/a | n/a | n/a | none |"
    assert prefill_table.format_notes(rows) == ["n/a: flash_attn_func (2048 x 32768): out of memory"]


def test_time_methods_value_of_each_method():
    # value(name, median ms) of each method that ran (its own work: MLA's two tokens count their pairs);
    # a method whose making raises has its reason instead.
    def fails():
        raise RuntimeError("no kernel")

    torch = types.SimpleNamespace(cuda=types.SimpleNamespace(empty_cache=lambda: None))
    got, not_run = methods_mod.time_methods(torch, FakeTimer(), [("a", lambda: lambda: None), ("b", fails)], None,
                                            lambda name, ms: (name, ms))
    assert got == {"a": ("a", 2.0)} and not_run == {"b": "RuntimeError: no kernel"}


# ---- the MLA sweep -------------------------------------------------------------------------


def test_mla_counts_and_targets():
    assert mla_table.mla_shapes([64], [4096, 8192]) == [(64, 4096), (64, 8192)]
    # Per (query head, key): S over 64 + 512 columns, O over 512; the cache read once, 576 bf16 columns a key.
    assert mla_table.flops(2, 10, heads_q=3) == 2 * 10 * 3 * 2 * (64 + 512 + 512)
    assert mla_table.kv_bytes(2, 10) == 2 * 10 * 576 * 2
    assert mla_table.compute_bound(64, 4096)  # 128 heads: 242 FLOPs a byte
    row = {"batch": 64, "cache": 4096, "tflops": {"flash3": 600.0, "flash3 paged 64": 590.0}, "not_run": {}}
    assert mla_table.targets(row) == {">= 610 TFLOP/s": False}
    row["tflops"]["flash3"] = 650.0
    assert mla_table.targets(row) == {">= 610 TFLOP/s": True}
    rows = [row, {"batch": 132, "cache": 8192, "tflops": {}, "not_run": {"flash3": "no kernel", "fa3": "no module"}}]
    table = mla_table.format_table(rows).splitlines()
    assert table[0] == ("| batch | cache | flash3 TFLOP/s | TB/s | flash3 paged 64 TFLOP/s | TB/s | FA3 TFLOP/s | TB/s "
                        "| missed |")
    ratio = mla_table.kv_bytes(64, 4096) / mla_table.flops(64, 4096)
    assert table[2] == f"| 64 | 4096 | 650 | {650 * ratio:.2f} | 590 | {590 * ratio:.2f} | n/a | n/a | none |"
    assert table[3] == "| 132 | 8192 | n/a | n/a | n/a | n/a | n/a | n/a | none |"
    assert mla_table.format_notes(rows) == ["n/a: flash3 (132x8192): no kernel", "n/a: FA3 (132x8192): no module"]


def test_mla_speculative_tokens():
    # Two causal tokens: the first sees one key fewer; TB/s of the same cache over twice the FLOPs.
    assert mla_table.flops(2, 10, heads_q=3, seqlen_q=2) == 2 * 3 * (10 + 9) * 2 * (64 + 512 + 512)
    row = {"batch": 64, "cache": 4096, "tflops": {"flash3": 600.0, mla_table.SPECULATIVE: 900.0}, "not_run": {}}
    # The same bytes over 4096 + 4095 pairs a head against 4096: 900 TFLOP/s of two tokens reads the
    # cache 1.5 x 4096 / 8191 times as fast as 600 of one.
    assert mla_table.tbps(row, "flash3") == pytest.approx(600.0 * (576 * 2) / (128 * 2 * 1088))
    assert mla_table.tbps(row, mla_table.SPECULATIVE) == pytest.approx(
        mla_table.tbps(row, "flash3") * 1.5 * 4096 / 8191)
    table = mla_table.format_table([row]).splitlines()
    assert table[0].startswith("| batch | cache | flash3 TFLOP/s | TB/s | flash3 2 tokens TFLOP/s | TB/s |")
    assert mla_table.targets(row) == {">= 610 TFLOP/s": False}


def test_cli_names_the_decode_sweep_and_its_options():
    done = run_cli("--help")
    assert done.returncode == 0, done.stderr
    for option in ("--decode ", "--decode-batch", "--decode-cache", "--page-size", "--prefill ", "--prefill-chunk",
                   "--prefill-cache", "--mla ", "--mla-batch", "--mla-cache"):
        assert option in done.stdout

