#!/usr/bin/env python3
"""Writes docs/performance.md, docs/performance.png and README.md's headline from one GPU run.

A run's files (scripts/device_run.sh leaves them in $OUT/logs.tgz) are kept in
docs/perf-data/, so that the report is generated from committed data and can be
checked against it:

  perf_report.py --import OUT/logs.tgz   # replace docs/perf-data/ with that run's files, then write the report
  perf_report.py                         # write the report from docs/perf-data/
  perf_report.py --check                 # exit 1 where docs/performance.md or README.md's block differ from it

The data folder holds (all but gpu.txt optional):
  gpu.txt            nvidia-smi's "name, clocks.sm, clocks.max.sm, power.limit, driver_version" line,
                     then "commit ...", "date ...", "command ..." lines
  peers*.json        python -m flash3.benchmark --json: flash3 beside its peers, every method timed the same way
                     in one process; a file per pass and regime (device_run.sh's stage compare writes
                     peers_<pass>.json, its stage sustained peers_sustained_<pass>.json); the files of one
                     regime make one section, those of two regimes never share a table
  bench.json, bench_bwd.json, bench_fp8.json   flash3-bench --json (its own sweeps, flash3 alone)
  bench_bwd_det.json flash3-bench --pass bwd --deterministic --json
  ablation.json      flash3-bench --ablation --json
  fp8_accuracy.txt   flash3-bench --fp8-accuracy's table (paper Table 3)
  varlen.json, varlen_fp8.json   python -m flash3.benchmark --varlen --json (16-bit; --dtype e4m3 --pass fwd):
                     packed sequences against the fixed-length kernel, in one regime
  decode.json        python -m flash3.benchmark --decode --json: decoding from a KV cache, GB/s of K and V,
                     flash3 (contiguous, paged, appending with rotary) beside SDPA's backends, one process
  prefill.json       python -m flash3.benchmark --prefill --json: chunked prefill against a KV cache, TFLOP/s
                     beside flash_attn_func on the same work, one process
  mla.json           python -m flash3.benchmark --mla --json: MLA decoding (qv), TFLOP/s and TB/s, contiguous and
                     paged, beside FlashMLA and FA3 where importable, one process
  clocks.txt         scripts/clock_summary.py's line (--import makes it from clocks.csv)
  notes.md           anything said by hand about the run, shown under the header
  compare.json       runs from before peers*.json: SDPA's backends timed in a separate process beside
                     flash3-bench's times; read only where there is no peers*.json

A sweep split over several calls (a sustained one outlasts a call) is imported
from all of them at once, `--import A/logs.tgz --import B/logs.tgz`; where two
hold a file of the same name, the first one's is kept.

Needs the standard library only, the benchmark's python/flash3/_bench/sweep.py and plot.py
(read by their paths: the regimes, their labels, merging, the figure), and matplotlib for
the plot (without it the plot is left as it is, saying so).
"""
import argparse
import difflib
import fnmatch
import importlib.util
import json
import os
import pathlib
import statistics
import sys
import tarfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
DEFAULT_DATA = ROOT / "docs" / "perf-data"
# bench_pair*.json: the stage pair's 192 and 192/128 rows, in the same tables as the sweep's.
BENCH_FILES = ("bench.json", "bench_bwd.json", "bench_pair.json", "bench_pair_bwd.json", "bench_fp8.json")
VARLEN_FILES = ("varlen.json", "varlen_fp8.json")
DECODE_FILE = "decode.json"
PREFILL_FILE = "prefill.json"
MLA_FILE = "mla.json"
PEERS_GLOB = "peers*.json"
SEPARATE_PEERS = "compare.json"
INPUT_FILES = ("gpu.txt",) + BENCH_FILES + ("bench_bwd_det.json", "ablation.json", SEPARATE_PEERS,
                                            "fp8_accuracy.txt", "clocks.txt") + VARLEN_FILES + (
                                                DECODE_FILE, PREFILL_FILE, MLA_FILE)
# hdim_v: V's head dim (hdim where a file has none), so that 192 / 128 is a row of its own beside 192.
SHAPE_KEYS = ("pass", "dtype", "hdim", "hdim_v", "causal", "batch", "seqlen_q", "seqlen_k", "heads_q", "heads_kv")
PASS_ORDER = ("fwd", "bwd", "fwd+bwd")
PASS_NAMES = {"fwd": "Forward", "bwd": "Backward", "fwd+bwd": "Forward + backward"}
DTYPE_ORDER = ("bf16", "fp16", "e4m3")
CUDNN = "sdpa_cudnn"
# The benchmark's method keys in the tables' order: flash3, cuDNN (the strongest peer, the one of the ratio
# line and the summaries), then the others.
PEER_ORDER = ("flash3", CUDNN, "sdpa_flash", "fa3", "fa2")
SHORT_NAMES = {"flash3": "flash3", CUDNN: "cuDNN", "sdpa_flash": "SDPA FA2", "fa3": "FA3", "fa2": "FA2"}
LONG_SEQLEN = 1024  # the summaries count only shapes at least this long
# flash3-bench's sweeps as device_run.sh runs them: no --gap-ms nor --load-ms.
BENCH_REGIME = "continuous load (each shape timed right after the one before, no idle gap)"
ABLATIONS = {
    "default": "flash3, every technique on",
    "no-pingpong": "no pingpong: the consumer warpgroups' GEMMs not ordered by named barriers (§3.1)",
    "no-intra-wg-overlap": "no intra-warpgroup overlap: softmax after QK^T, not under the next one (§3.2, Algorithm 2)",
    "no-persistent": "not persistent: one CTA per tile instead of one per SM",
    "no-warp-specialization": "no warp specialization: no producer warpgroup loading for the consumers (Algorithm 1)",
}
BEGIN, END = "<!-- perf:begin -->", "<!-- perf:end -->"
NOT_MEASURED = "—"


# ---- reading a run ------------------------------------------------------------

def is_run_file(name):
    """What --import takes: the inputs, and clocks.csv (summarised into clocks.txt)."""
    return name in INPUT_FILES + ("clocks.csv",) or fnmatch.fnmatchcase(name, PEERS_GLOB)


def run_files(source):
    """[(name, content)] of the run files in a logs.tgz or a folder, first-seen first."""
    if source.is_dir():
        return [(p.name, p.read_bytes()) for p in sorted(source.iterdir()) if p.is_file() and is_run_file(p.name)]
    with tarfile.open(source) as tar:
        return [(pathlib.PurePosixPath(m.name).name, tar.extractfile(m).read()) for m in tar.getmembers()
                if m.isfile() and is_run_file(pathlib.PurePosixPath(m.name).name)]


def import_run(sources, data):
    """Replaces the run files in `data` with those of `sources` (logs.tgz files or folders); returns their names.

    Where two sources hold a file of the same name, the first one's is kept.
    """
    found = {}
    for source in sources:
        for name, content in run_files(pathlib.Path(source)):
            found.setdefault(name, content)
    if "gpu.txt" not in found:
        raise SystemExit(f"perf_report: no gpu.txt in {', '.join(map(str, sources))}: "
                         "not a scripts/device_run.sh output")
    if "clocks.csv" in found and "clocks.txt" not in found:
        found["clocks.txt"] = (clock_summary().summarise(found["clocks.csv"].decode().splitlines()) + "\n").encode()
    found.pop("clocks.csv", None)
    data.mkdir(parents=True, exist_ok=True)
    # Files of an earlier run must not mix with this one's, nor its hand-written notes.
    for name in INPUT_FILES + ("notes.md",):
        (data / name).unlink(missing_ok=True)
    for path in data.glob(PEERS_GLOB):
        path.unlink()
    for name, content in found.items():
        (data / name).write_bytes(content)
    return sorted(found)


def module_at(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def bench_module(name):
    """A module of the benchmark's python/flash3/_bench/, inside a package of
    its own so that it may import its siblings: flash3's own __init__ needs
    PyTorch, which the report does not."""
    if "flash3_bench_pkg" not in sys.modules:
        folder = ROOT / "python" / "flash3" / "_bench"
        spec = importlib.util.spec_from_file_location("flash3_bench_pkg", folder / "__init__.py",
                                                      submodule_search_locations=[str(folder)])
        package = importlib.util.module_from_spec(spec)
        sys.modules["flash3_bench_pkg"] = package
        spec.loader.exec_module(package)
    return importlib.import_module(f"flash3_bench_pkg.{name}")


def clock_summary():
    return module_at("clock_summary", ROOT / "scripts" / "clock_summary.py")


# The benchmark's pure parts (standard library only): its regimes, their labels, and how runs merge.
sweep = bench_module("sweep")
figure = bench_module("plot")
decode_table = bench_module("decode_table")
prefill_table = bench_module("prefill_table")
mla_table = bench_module("mla_table")


def read_gpu(text):
    """gpu.txt: nvidia-smi's CSV line, then "key value" lines (a "+dirty" line belongs to the commit)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    info = {}
    fields = [f.strip() for f in lines[0].split(",")] if lines else []
    if len(fields) == 5:
        info.update(zip(("name", "clock_sm", "clock_max_sm", "power_limit", "driver"), fields))
    elif lines:
        info["name"] = lines[0]
    last = None
    for line in lines[1:]:
        if line.startswith("+") and last == "commit":
            info["commit"] += " " + line
            continue
        key, _, value = line.partition(" ")
        info[key] = value.strip()
        last = key
    return info


def parse_fp8_accuracy(text):
    """The rows of --fp8-accuracy's table: hdim, method, RMSE (or the failure), the two ratio cells."""
    rows, in_table = [], False
    for line in text.splitlines():
        if line.startswith("| hdim | method | RMSE of O"):
            in_table = True
            continue
        if not in_table or not line.startswith("|") or line.startswith("|---"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        cells += [""] * (5 - len(cells))
        row = {"hdim": int(cells[0]), "method": cells[1], "vs_per_tensor": cells[3], "vs_standard": cells[4]}
        try:
            row["rmse"] = float(cells[2])
        except ValueError:
            row["failed"] = cells[2]
        rows.append(row)
    return rows


def load(data):
    """Everything the report needs from the data folder."""
    def text(name):
        path = data / name
        return path.read_text() if path.is_file() else None

    def js(name):
        content = text(name)
        return json.loads(content) if content is not None else None

    gpu = text("gpu.txt")
    if gpu is None:
        raise SystemExit(f"perf_report: {data / 'gpu.txt'} is missing (import a run with --import)")
    peers = sorted(data.glob(PEERS_GLOB))
    run = {"gpu": read_gpu(gpu), "bench": [], "separate_peers": js(SEPARATE_PEERS),
           "peers": [(path.name,) + sweep.read_json(path) for path in peers],
           "det": js("bench_bwd_det.json") or [], "ablation": js("ablation.json")}
    # The packed sequences' files, one table: the first one's regime and timer, every file's rows.
    varlen = [js(name) for name in VARLEN_FILES if js(name)]
    run["varlen"] = dict(varlen[0], rows=[r for v in varlen for r in v["rows"]]) if varlen else None
    run["decode"] = js(DECODE_FILE)
    run["prefill"] = js(PREFILL_FILE)
    run["mla"] = js(MLA_FILE)
    for name in BENCH_FILES:
        run["bench"] += js(name) or []
    accuracy = text("fp8_accuracy.txt")
    run["fp8_accuracy"] = parse_fp8_accuracy(accuracy) if accuracy is not None else None
    run["clocks"] = (text("clocks.txt") or "").strip()
    run["notes"] = (text("notes.md") or "").strip()
    run["files"] = [path.name for path in peers] + [name for name in INPUT_FILES if (data / name).is_file()]
    return run


# ---- the numbers ----------------------------------------------------------------
#
# A row is one shape (SHAPE_KEYS) with an outcome per method key: {"tflops": x}, {"na": why} (the method has
# no kernel for it) or {"failed": why}. A section holds the rows timed in one regime, never more: its title, a
# label naming its tool and regime (for the headline and the plot), its methods as (key, name), and the
# Markdown lines that say how it was timed.

def shape_key(entry):
    return tuple(entry.get(k, entry["hdim"]) if k == "hdim_v" else entry[k] for k in SHAPE_KEYS)


def hdim_label(hdim, hdim_v):
    """A head dim as the tables print it: 128, or 192/128 where V's is its own."""
    return str(hdim) if hdim_v == hdim else f"{hdim}/{hdim_v}"


def bench_rows(entries):
    """One row per shape of flash3-bench's default variant: flash3's median TFLOP/s, and its checks."""
    groups = {}
    for entry in entries:
        if entry.get("variant", "default") == "default":
            groups.setdefault(shape_key(entry), []).append(entry)
    rows = []
    for key, checks in groups.items():
        ok = [e["tflops"] for e in checks if e.get("ok", True)]
        rows.append(dict(zip(SHAPE_KEYS, key), checks=list(checks),
                         flash3={"tflops": statistics.median(ok)} if ok else {"failed": "failed its reference check"}))
    return rows


def outcome(record):
    """A benchmark record's outcome, as the rows hold it."""
    if record["status"] == "ok":
        # joules: per call, the sustained regime's (the card's energy counter).
        return {"tflops": record["tflops"], **({"joules": record["joules"]} if "joules" in record else {})}
    return {record["status"]: record.get("note") or record["status"]}


def peer_rows(results):
    """One row per shape of python -m flash3.benchmark's records (its shapes have seqlen_q = seqlen_k, MHA)."""
    rows = {}
    for r in results:
        shape = {"pass": r["pass"], "dtype": r["dtype"], "hdim": r["hdim"], "hdim_v": r.get("hdim_v", r["hdim"]),
                 "causal": r["causal"],
                 "batch": r["batch"], "seqlen_q": r["seqlen"], "seqlen_k": r["seqlen"], "heads_q": r["heads"],
                 "heads_kv": r["heads"]}
        rows.setdefault(shape_key(shape), shape)[r["method"]] = outcome(r)
    return list(rows.values())


def bench_section(run):
    """flash3-bench's own sweeps: flash3 alone, in the C++ benchmark's regime."""
    about = ["flash3 alone, timed by the C++ benchmark `flash3-bench` (the main benchmark): the median over its timed",
             "calls, each after an L2 flush; every shape is checked against the float32 GPU reference before it is",
             "timed (see Accuracy). Its regime, as `scripts/device_run.sh` runs it, is no other section's:",
             f"{BENCH_REGIME}."]
    return {"title": "flash3-bench, the C++ benchmark", "label": f"flash3-bench, {BENCH_REGIME}",
            "methods": (("flash3", "flash3"),), "rows": bench_rows(run["bench"]), "about": about}


def regime_section(files):
    """The peers*.json files of one regime, [(name, meta, results)], as one section."""
    meta, results = sweep.merge_runs([(m, r) for _, m, r in files])
    regime = sweep.regime_label(meta["regime"])
    timed = {r["method"] for r in results}
    not_run = {key: why for _, m, _ in files for key, why in m.get("not_run", {}).items() if key not in timed}
    soft = meta.get("software", {})
    versions = [f"PyTorch {soft.get('torch')}, CUDA {soft.get('cuda')}, cuDNN {soft.get('cudnn')}"]
    versions += [f"{name} {soft[name]}" for name in ("flash_attn_interface", "flash_attn") if name in soft]
    dates = sorted({m.get("date", "date not recorded") for _, m, _ in files})
    about = ["Every method timed the same way, in one process, by `python -m flash3.benchmark`.", "",
             f"- regime: {regime}",
             f"- timer: {meta.get('timer', 'not recorded')}",
             f"- checks: {meta.get('check', 'not recorded')}",
             f"- software: {'; '.join(versions)}",
             f"- files: {', '.join(f'`{name}`' for name, _, _ in files)} "
             f"({' to '.join([dates[0], dates[-1]] if len(dates) > 1 else dates)})"]
    about += [f"- not run: {sweep.METHODS.get(key, key)}: {why}" for key, why in not_run.items()]
    methods = (("flash3", "flash3 (flash_attn_func)"),) + tuple((k, sweep.METHODS[k]) for k in PEER_ORDER[1:])
    return {"title": f"flash3 beside its peers, {regime}", "label": f"python -m flash3.benchmark, {regime}",
            "regime": meta["regime"]["name"], "methods": methods, "rows": peer_rows(results), "about": about}


def separate_section(compare):
    """compare.json, from runs before peers*.json: flash3-bench's times beside SDPA's from a separate process."""
    # SDPA has no FP8 attention: flash3-bench's section holds the e4m3 rows.
    rows = [dict(zip(SHAPE_KEYS, shape_key(r)), flash3=r["flash3"], sdpa_cudnn=r["cudnn"], sdpa_flash=r["fa2"])
            for r in compare["rows"] if r["dtype"] != "e4m3"]
    about = ["From `compare.json`, written before `python -m flash3.benchmark` timed every method in one process:",
             "flash3's times are flash3-bench's (in its regime, below), and SDPA's backends were timed after them in",
             "a separate process: two processes, two timers, two regimes.", "",
             f"- SDPA's timer: {compare.get('timer')}",
             f"- software: PyTorch {compare.get('torch')}, cuDNN {compare.get('cudnn')}",
             f"- date: {compare.get('date')}"]
    return {"title": "flash3 beside its peers, SDPA's backends timed in a separate process",
            "label": "flash3-bench, and SDPA's backends in a separate process", "regime": "separate",
            "methods": (("flash3", "flash3 (flash3-bench)"), (CUDNN, sweep.METHODS[CUDNN]),
                        ("sdpa_flash", sweep.METHODS["sdpa_flash"])),
            "rows": rows, "about": about}


def peer_sections(run):
    """A section per regime of the peers*.json files, idle gaps first, shortest first; compare.json's where there
    are none."""
    by_regime = {}
    for name, meta, results in run["peers"]:
        by_regime.setdefault(sweep.regime_label(meta["regime"]), []).append((name, meta, results))
    def order_of(label):
        regime = by_regime[label][0][1]["regime"]
        return regime["name"] != "gap", regime.get("gap_ms", 0.0), label
    order = sorted(by_regime, key=order_of)
    if order:
        return [regime_section(by_regime[label]) for label in order]
    return [separate_section(run["separate_peers"])] if run["separate_peers"] else []


def headline_section(run):
    """The README's block and the plot: the idle-gap peers where measured, else compare.json's (runs before
    peers*.json), else flash3-bench's sweep."""
    peers = [s for s in peer_sections(run) if s["regime"] in ("gap", "separate")]
    return peers[0] if peers else bench_section(run)


def tflops(result):
    return result.get("tflops") if result else None


def fmt(value, spec=".1f"):
    return NOT_MEASURED if value is None else format(value, spec)


def cell(result):
    if result is None:
        return NOT_MEASURED
    if "failed" in result:
        return "FAIL"
    if "tflops" in result:
        return f"{result['tflops']:.1f}"
    return "n/a"


def ratio(row, peer):
    a, b = tflops(row.get("flash3")), tflops(row.get(peer))
    return a / b if a and b else None


def energy_ratio(row, peer):
    """flash3's joules per call over the peer's, where both have them."""
    a, b = (row.get(key) or {} for key in ("flash3", peer))
    return a["joules"] / b["joules"] if a.get("joules") and b.get("joules") else None


def seqlen_label(n):
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


def column_label(column):
    q, k = column
    return seqlen_label(q) if q == k else f"{seqlen_label(q)}/{seqlen_label(k)}"


def tables(rows):
    """{(pass, dtype): rows}, in the order fwd, bwd, fwd+bwd and bf16, fp16, e4m3."""
    out = {}
    for row in rows:
        out.setdefault((row["pass"], row["dtype"]), []).append(row)

    def order(key):
        p, d = key
        return (PASS_ORDER.index(p) if p in PASS_ORDER else len(PASS_ORDER),
                DTYPE_ORDER.index(d) if d in DTYPE_ORDER else len(DTYPE_ORDER), key)
    return {k: out[k] for k in sorted(out, key=order)}


def row_group(row):
    """The table row a shape belongs to: head dims, mask, and the GQA ratio where there is one."""
    return (row["hdim"], row["hdim_v"], row["causal"], row["heads_q"] // max(row["heads_kv"], 1))


def group_order(group):
    """Head dim, then V's largest first: 192 before 192/128."""
    return (group[0], -group[1]) + tuple(group[2:])


def group_label(group, heads_column):
    hdim, hdim_v, causal, gqa = group
    return [hdim_label(hdim, hdim_v), "yes" if causal else "no"] + ([f"GQA {gqa}" if gqa != 1 else "MHA"] if heads_column else [])


def long_rows(rows):
    return [r for r in rows if min(r["seqlen_q"], r["seqlen_k"]) >= LONG_SEQLEN]


def shape_settings(rows):
    """The sweep's rule for batch and heads, when one holds for every row (the paper's 16k tokens, hidden 2048)."""
    tokens = {r["batch"] * r["seqlen_q"] for r in rows}
    hidden = {r["heads_q"] * r["hdim"] for r in rows}
    parts = []
    if len(tokens) == 1:
        parts.append(f"batch = {tokens.pop()} / seqlen")
    if len(hidden) == 1:
        parts.append(f"heads = {hidden.pop()} / hdim")
    return ", ".join(parts)


def shown_methods(rows, methods):
    """flash3, and the peers with a number somewhere in rows."""
    return [(key, name) for key, name in methods if key == "flash3" or any(tflops(r.get(key)) for r in rows)]


def ratio_range(rows, peer):
    values = [ratio(r, peer) for r in long_rows(rows)]
    values = [v for v in values if v is not None]
    return (min(values), max(values)) if values else None


def summary_line(rows, methods):
    compared = [r for r in long_rows(rows) if ratio(r, CUDNN) is not None]
    if not compared:
        return None
    wins = sum(ratio(r, CUDNN) > 1 for r in compared)
    line = f"flash3 ahead of cuDNN on {wins} of {len(long_rows(rows))} shapes with seqlen ≥ {seqlen_label(LONG_SEQLEN)}"
    parts = []
    for peer, _ in methods:
        span = ratio_range(rows, peer) if peer != "flash3" else None
        if span:
            parts.append(f"flash3/{SHORT_NAMES[peer]} {span[0]:.2f}-{span[1]:.2f}")
    return line + (f" ({', '.join(parts)} there)" if parts else "")


def reasons(rows, name):
    """Each distinct reason a method has no number, once, with its count."""
    counts = {}
    for r in rows:
        result = r.get(name) or {}
        reason = result.get("na") or result.get("failed")
        if reason:
            counts[reason] = counts.get(reason, 0) + 1
    return counts


# ---- Markdown -------------------------------------------------------------------------

def md_table(header, body):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in body]
    return "\n".join(lines)


def sweep_table(rows, methods):
    """Rows: head dim x mask, one line per method and flash3/cuDNN; columns: sequence lengths."""
    columns = sorted({(r["seqlen_q"], r["seqlen_k"]) for r in rows})
    groups = {}
    for r in rows:
        groups.setdefault(row_group(r), {})[(r["seqlen_q"], r["seqlen_k"])] = r
    shown = shown_methods(rows, methods)
    gqa = any(g[3] != 1 for g in groups)
    header = ["hdim", "causal"] + (["heads"] if gqa else []) + ["method"] + [column_label(c) for c in columns]
    body = []
    for group in sorted(groups, key=group_order):
        label = group_label(group, gqa)
        lines = [(name, lambda r, key=key: cell(r.get(key))) for key, name in shown]
        if any(key == CUDNN for key, _ in shown):
            lines.append(("flash3/cuDNN", lambda r: fmt(ratio(r, CUDNN), ".2f")))
            if any(energy_ratio(r, CUDNN) for r in groups[group].values()):
                lines.append(("flash3 J / cuDNN J", lambda r: fmt(energy_ratio(r, CUDNN), ".2f")))
        for i, (name, show) in enumerate(lines):
            cells = [show(groups[group][c]) if c in groups[group] else NOT_MEASURED for c in columns]
            body.append((label if i == 0 else [""] * len(label)) + [name if i else f"**{name}**"] + cells)
    return md_table(header, body), [name for key, name in methods if (key, name) not in shown]


def table_section(key, rows, methods):
    pass_, dtype = key
    table, missing = sweep_table(rows, methods)
    out = [f"### {PASS_NAMES.get(pass_, pass_)}, {dtype}", ""]
    settings = shape_settings(rows)
    out += [f"TFLOP/s by sequence length{' (' + settings + ')' if settings else ''}.", "", table, ""]
    line = summary_line(rows, methods)
    if line:
        out += [line + ".", ""]
    for key_, name in methods:
        for reason, n in reasons(rows, key_).items():
            out.append(f"- {name}{' (left out)' if name in missing else ''}: no number on {n} shape(s): {reason}")
    if out[-1].startswith("- "):
        out.append("")
    return out


def section_lines(section):
    """A section's heading, how it was timed, and a table per (pass, dtype)."""
    out = [f"## {section['title']}", ""] + section["about"] + [""]
    by_table = tables(section["rows"])
    if not by_table:
        out += ["Not measured in this run.", ""]
    for key, rows in by_table.items():
        out += table_section(key, rows, section["methods"])
    return out


def deterministic_section(run, rows):
    det = [e for e in run["det"] if e.get("variant") == "deterministic"]
    if not det:
        return []
    default = {shape_key(r): r for r in rows}
    body = []
    for e in sorted(det, key=lambda e: (e["hdim"], e["causal"], e["seqlen_q"])):
        base = tflops(default.get(shape_key(e), {}).get("flash3"))
        own = e["tflops"] if e.get("ok", True) else None
        body.append([e["hdim"], "yes" if e["causal"] else "no", column_label((e["seqlen_q"], e["seqlen_k"])),
                     fmt(own) if own is not None else "FAIL", fmt(base),
                     fmt(own / base if own and base else None, ".2f")])
    header = ["hdim", "causal", "seqlen", "deterministic TFLOP/s", "default TFLOP/s", "ratio"]
    return ["## Backward, deterministic mode", "",
            "`BackwardArgs::deterministic` (dQ bitwise the same across runs) against flash3-bench's default backward",
            "above, in its regime.",
            "", md_table(header, body), ""]


def ablation_section(run):
    out = ["## Ablation (paper Table 2)", ""]
    entries = run["ablation"]
    if not entries:
        return out + ["Not measured in this run (no ablation.json).", ""]
    by_variant = {}
    for e in entries:
        by_variant.setdefault(e["variant"], []).append(e)
    first = entries[0]
    out += [f"{first['pass']}, {first['dtype']}, batch {first['batch']}, seqlen {first['seqlen_q']}, "
            f"{first['heads_q']} heads, hdim {first['hdim']}, {'causal' if first['causal'] else 'non-causal'}; "
            "the variants interleaved in rounds, the median of each variant's rounds.", ""]
    base = statistics.median(e["tflops"] for e in by_variant.get("default", [first]))
    body = []
    for variant, runs in by_variant.items():
        values = sorted(e["tflops"] for e in runs)
        median = statistics.median(values)
        ok = sum(e.get("ok", True) for e in runs)
        body.append([f"`{variant}`", ABLATIONS.get(variant, ""), f"{median:.1f}",
                     f"{values[0]:.1f}-{values[-1]:.1f}" if len(values) > 1 else NOT_MEASURED,
                     f"{median / base:.3f}", f"{ok} of {len(runs)}"])
    header = ["variant", "what is off", "TFLOP/s", "rounds' range", "vs default", "checks ok"]
    return out + [md_table(header, body), ""]


def varlen_section(run):
    """Packed sequences (flash_attn_varlen_func) against flash_attn_func on the same tokens, one process."""
    out = ["## Packed sequences (varlen)", ""]
    varlen = run["varlen"]
    if not varlen:
        return out + ["Not measured in this run (no varlen.json).", ""]
    out += ["`python -m flash3.benchmark --varlen`: `flash_attn_varlen_func` on packed sequences against",
            "`flash_attn_func` on the same tokens as a fixed-length batch, TFLOP/s of the real FLOPs (each",
            "sequence's own). Equal lengths: the batch packed. The mix: documents of seeded lengths",
            "log-uniform in [128, 8192] packed to 16k tokens, against the fixed-length kernel at their",
            "token-weighted mean length, and through SDPA's cuDNN backend on the batch padded to its longest",
            "document and SDPA on a jagged nested tensor.", "",
            f"- regime: {sweep.regime_label(varlen['regime'])}",
            f"- timer: {varlen.get('timer', 'not recorded')}", ""]
    body = []
    for r in varlen["rows"]:
        if r["workload"] == "equal":
            shape = f"{r['batch']} x {seqlen_label(r['seqlen'])}"
        else:
            shape = (f"{r['documents']} documents, {r['tokens']} tokens, mean {r['mean_length']:.0f} "
                     f"(fixed {r['fixed_batch']} x {seqlen_label(r['fixed_seqlen'])})")
        # A peer that did not run holds its reason instead of a number.
        peers = [fmt(x) if not isinstance(x, str) else "n/a" for x in (r.get("sdpa_padded_cudnn"), r.get("sdpa_jagged"))]
        body.append([r["workload"], r["pass"], r.get("dtype", "bf16"), r["hdim"], "yes" if r["causal"] else "no",
                     shape, fmt(r.get("fixed")), fmt(r.get("varlen")), fmt(r.get("ratio"), ".3f")] + peers)
    header = ["workload", "pass", "dtype", "hdim", "causal", "shape", "fixed", "varlen", "varlen / fixed",
              "SDPA cuDNN, padded", "SDPA, jagged"]
    return out + [md_table(header, body), ""]


def sweep_section(title, data, file_name, about, table):
    """A sweep of its own (decode, prefill): `about` (what it measures), its regime and timer, and its table
    module's table and notes of the run's rows."""
    out = [f"## {title}", ""]
    if not data:
        return out + [f"Not measured in this run (no {file_name}).", ""]
    out += about + ["", f"- regime: {sweep.regime_label(data['regime'])}",
                    f"- timer: {data.get('timer', 'not recorded')}", "", table.format_table(data["rows"]), ""]
    notes = table.format_notes(data["rows"])
    return out + (notes + [""] if notes else [])


def decode_section(run):
    """Decoding from a KV cache (issue 35's sweep): GB/s of K and V, flash3 beside SDPA's backends, one process."""
    return sweep_section("Decoding from a KV cache", run["decode"], DECODE_FILE, [
        "`python -m flash3.benchmark --decode`: one query a sequence against a full cache, "
        f"{decode_table.HEADS_KV * decode_table.GROUP} query heads and {decode_table.HEADS_KV} KV heads, "
        f"head dim {decode_table.HDIM}, bf16;",
        "GB/s of K and V read once (the bytes of both tensors over the call's time). flash3 on the contiguous",
        "cache, on paged copies of it (pages in random order), appending one token with rotary embedding and on",
        "an e4m3 copy (GB/s of its own bytes); SDPA's backends on the cache in their own layout (`enable_gqa`).",
        "Each method is checked against a float32 reference first; a method without a number says why below the",
        "table. The last column names the targets of issue 35 the row misses."], decode_table)


def prefill_section(run):
    """Chunked prefill (issue 35): a chunk of queries against a KV cache, TFLOP/s beside flash_attn_func."""
    return sweep_section("Chunked prefill", run.get("prefill"), PREFILL_FILE, [
        "`python -m flash3.benchmark --prefill`: a chunk of a prompt's queries against a KV cache that ends",
        f"with the chunk's keys, causal (bottom-right), batch 1, {prefill_table.HEADS_KV * prefill_table.GROUP} "
        f"query heads and {prefill_table.HEADS_KV} KV heads, head dim {prefill_table.HDIM}, bf16; TFLOP/s of the",
        "visited (query, key) pairs, the KV cache call (contiguous and paged) beside `flash_attn_func` on the",
        "same tensors (the same work). The last column names the targets of issue 35 the row misses."],
        prefill_table)


def mla_section(run):
    """MLA decoding (issue 35): 128 query heads against one latent KV head, TFLOP/s and TB/s."""
    return sweep_section("MLA decoding", run.get("mla"), MLA_FILE, [
        "`python -m flash3.benchmark --mla`: one token a sequence, "
        f"{mla_table.HEADS_Q} query heads against {mla_table.HEADS_KV} latent KV head, head dims {mla_table.HDIM} "
        f"(rotary: q, k) and {mla_table.HDIM_V} (latent: qv, v, O), bf16, through `flash_attn_with_kvcache(qv=)`;",
        "TFLOP/s of S = q k^T + qv v^T and O = P v, and TB/s of the cache read once, on the contiguous cache and a",
        "paged copy (pages of 64 in random order), beside FlashMLA and FA3 where importable. The last column names",
        "the targets of issue 35 the row misses."], mla_table)


def accuracy_section(run, rows):
    out = ["## Accuracy", "",
           "Each timed shape is first checked against the float32 GPU reference: flash3's largest error must be",
           "at most twice that of a straightforward implementation in the same precision (plus a small epsilon),",
           "with no NaN in an output poisoned beforehand.", ""]
    body, counts = [], []
    for key, table_rows in tables(rows).items():
        checks = [e for r in table_rows for e in r["checks"]]
        counts.append(f"{PASS_NAMES.get(key[0], key[0]).lower()} {key[1]} {sum(e.get('ok', True) for e in checks)} "
                      f"of {len(checks)}")
        groups = {}
        for r in table_rows:
            groups.setdefault((r["hdim"], r["hdim_v"], r["causal"]), []).extend(r["checks"])
        for (hdim, hdim_v, causal), entries in sorted(groups.items(), key=lambda item: group_order(item[0])):
            errs = [e for e in entries if "max_err" in e]
            worst = max(errs, key=lambda e: e["max_err"] / e["ref_err"] if e["ref_err"] else 0.0) if errs else None
            body.append([key[0], key[1], hdim_label(hdim, hdim_v), "yes" if causal else "no",
                         f"{sum(e.get('ok', True) for e in entries)} of {len(entries)}",
                         fmt(max(e["max_err"] for e in errs), ".2e") if errs else NOT_MEASURED,
                         fmt(max(e["ref_err"] for e in errs), ".2e") if errs else NOT_MEASURED,
                         fmt(worst["max_err"] / worst["ref_err"] if worst and worst["ref_err"] else None, ".2f")])
    if body and not any("max_err" in e for r in rows for e in r["checks"]):
        out += [f"Checks ok: {', '.join(counts)} (this data holds no per-shape errors).", ""]
    elif body:
        header = ["pass", "dtype", "hdim", "causal", "checks ok", "flash3 max error", "same-precision max error",
                  "worst ratio"]
        out += ["Over every sequence length of the sweeps (backward: the largest of dQ, dK and dV):", "",
                md_table(header, body), ""]
    acc = run["fp8_accuracy"]
    out += ["### FP8 (paper Table 3)", ""]
    if acc is None:
        return out + ["Not measured in this run (no fp8_accuracy.txt).", ""]
    out += ["RMSE of O against the float32 reference on inputs with outliers, N(0, 1) + N(0, 100) · Bernoulli(0.001)",
            "(`flash3-bench --fp8-accuracy`).", ""]
    body = [[r["hdim"], r["method"], fmt(r["rmse"], ".2e") if "rmse" in r else r["failed"],
             r["vs_per_tensor"], r["vs_standard"]] for r in acc]
    header = ["hdim", "method", "RMSE of O", "vs flash3 per-tensor", "vs standard FP8 (paper's baseline)"]
    return out + [md_table(header, body), ""]


def describe_device(gpu):
    details = []
    if gpu.get("clock_sm"):
        details.append(f"SM clock {gpu['clock_sm']} at start, {gpu['clock_max_sm']} max")
    if gpu.get("power_limit"):
        details.append(f"power limit {gpu['power_limit']}")
    if gpu.get("driver"):
        details.append(f"driver {gpu['driver']}")
    return gpu.get("name", "not recorded") + (f" ({', '.join(details)})" if details else "")


def header_section(run, data_label, plot_name, plotted):
    gpu = run["gpu"]
    info = [["device", describe_device(gpu)], ["date", gpu.get("date", "not recorded")],
            ["commit", gpu.get("commit", "not recorded")],
            ["command", f"`{gpu['command']}`" if gpu.get("command") else "not recorded"]]
    if run["clocks"]:
        info.append(["clocks", run["clocks"]])
    results = [n for n in run["files"] if n not in ("gpu.txt", "clocks.txt")]
    info.append(["files", ", ".join(f"`{n}`" for n in results) or "none"])
    # compare.json stands in for peers*.json, from runs before them: absent, it is no gap in a run.
    absent = [] if run["peers"] else [PEERS_GLOB]
    absent += [n for n in INPUT_FILES if n not in run["files"] + ["gpu.txt", "clocks.txt", SEPARATE_PEERS]]
    if absent:
        info.append(["not in this run", ", ".join(f"`{n}`" for n in absent)])
    out = ["# flash3 performance", "",
           f"Generated by `scripts/perf_report.py` from one GPU run's files in `{data_label}/`; do not edit by",
           "hand. Regenerate with `python3 scripts/perf_report.py` (`--import OUT/logs.tgz` to take a new run of",
           "`scripts/device_run.sh`, once per call of a run over several). How the numbers came to be, run by run:",
           "[performance-log.md](performance-log.md).",
           "", md_table(["", ""], info), ""]
    if run["notes"]:
        out += [run["notes"], ""]
    out += ["TFLOP/s = 4 · seqlen_q · seqlen_k · hdim · heads · batch (halved for causal, × 2.5 for the backward,",
            "× 3.5 for forward + backward) / time, the FlashAttention papers' count, for every method. The",
            "power-capped card runs several percent faster after idle gaps than under continuous load, so each",
            "section holds the numbers of one regime, named in its heading, and numbers compare within a section",
            "only. n/a: the method has no kernel for that shape.", ""]
    if plot_name:
        out += [f"![TFLOP/s against sequence length, per method]({plot_name})", "", f"Plotted: {plotted}.", ""]
    return out


def report(run, data_label, plot_name):
    bench = bench_section(run)
    out = header_section(run, data_label, plot_name, headline_section(run)["label"])
    peers = peer_sections(run)
    if not peers:
        out += ["## flash3 beside its peers", "", f"Not measured in this run (no `{PEERS_GLOB}`).", ""]
    for section in peers + [bench]:
        out += section_lines(section)
    out += deterministic_section(run, bench["rows"])
    out += ablation_section(run)
    out += varlen_section(run)
    out += decode_section(run)
    out += prefill_section(run)
    out += mla_section(run)
    out += accuracy_section(run, bench["rows"])
    return "\n".join(out).rstrip() + "\n"


def headline(run, doc_link, plot_link):
    """README's block: each pass and dtype at its longest sequence length, and the plot."""
    section = headline_section(run)
    rows = section["rows"]
    shown = shown_methods(rows, section["methods"])
    body, longest = [], set()
    for (pass_, dtype), table_rows in tables(rows).items():
        seqlen = max(r["seqlen_q"] for r in table_rows)
        longest.add(seqlen)
        at = {row_group(r): r for r in table_rows if r["seqlen_q"] == seqlen}
        for hdim, hdim_v in sorted({g[:2] for g in at}, key=group_order):
            cells = [f"{PASS_NAMES.get(pass_, pass_).lower()}, {dtype}", hdim_label(hdim, hdim_v)]
            for causal in (False, True):
                r = at.get((hdim, hdim_v, causal, 1))
                cells += [cell(r.get(key)) if r else NOT_MEASURED for key, _ in shown]
            body.append(cells)
    gpu = run["gpu"]
    settings = shape_settings(rows)
    out = [BEGIN,
           f"TFLOP/s at sequence length {', '.join(seqlen_label(s) for s in sorted(longest)) or NOT_MEASURED}"
           f"{' (' + settings + ')' if settings else ''},", f"timed by {section['label']};",
           f"{gpu.get('name', 'device not recorded')}, commit {gpu.get('commit', 'not recorded')}, "
           f"{gpu.get('date', 'date not recorded')}.",
           f"Every sequence length, every regime, the ablation and the accuracy: [{doc_link}]({doc_link}).", ""]
    header = ["pass", "hdim"] + [f"{SHORT_NAMES[key]}{' causal' if causal else ''}" for causal in (False, True)
                                 for key, _ in shown]
    out += [md_table(header, body), ""]
    for key, table_rows in tables(rows).items():
        line = summary_line(table_rows, section["methods"])
        if line:
            out.append(f"- {PASS_NAMES.get(key[0], key[0]).lower()}, {key[1]}: {line}.")
    if out[-1].startswith("- "):
        out.append("")
    if plot_link:
        out += [f"![TFLOP/s against sequence length, per method]({plot_link})", ""]
    out.append(END)
    return "\n".join(out)


def replace_block(text, block):
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise SystemExit(f"perf_report: the README has no {BEGIN} ... {END} block")
    return text[:start] + block + text[end + len(END):]


# ---- the plot ---------------------------------------------------------------------------

def write_plot(section, title, path):
    """Paper Figure 5's layout, drawn by the benchmark's own plot (python/flash3/_bench/plot.py) from the
    section's rows, seqlen_q along the axis. Returns None, or why no plot was written."""
    records = [{"pass": r["pass"], "dtype": r["dtype"], "causal": r["causal"], "hdim": r["hdim"],
                "hdim_v": r["hdim_v"], "seqlen": r["seqlen_q"], "method": key, "status": "ok", "tflops": tflops(r.get(key))}
               for r in section["rows"] for key, _ in section["methods"] if tflops(r.get(key))]
    path.parent.mkdir(parents=True, exist_ok=True)
    return figure.write_plot(records, dict(section["methods"]), title, path)


# ---- main -------------------------------------------------------------------------------

def label_of(path):
    try:
        return path.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return path.as_posix()


def outputs(run, data, out, plot, readme):
    """The report's Markdown and, with a README, its new text."""
    plot_in_doc = os.path.relpath(plot, out.parent) if plot else None
    md = report(run, label_of(data), plot_in_doc)
    new_readme = None
    if readme:
        block = headline(run, os.path.relpath(out, readme.parent),
                         os.path.relpath(plot, readme.parent) if plot else None)
        new_readme = replace_block(readme.read_text(), block)
    return md, new_readme


def plot(run, path):
    """The headline's section as a plot, titled with the device, the tool and the regime."""
    section = headline_section(run)
    return write_plot(section, f"{run['gpu'].get('name', 'device not recorded')}: {section['label']}", path)


def differs(path, expected):
    actual = path.read_text() if path.is_file() else ""
    if actual == expected:
        return False
    diff = difflib.unified_diff(actual.splitlines(), expected.splitlines(), str(path), "generated", lineterm="")
    print("\n".join(list(diff)[:40]), file=sys.stderr)
    return True


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", nargs="?", type=pathlib.Path, default=DEFAULT_DATA,
                        help="the run's files (default docs/perf-data)")
    parser.add_argument("--import", dest="sources", type=pathlib.Path, action="append", metavar="SOURCE",
                        help="first replace the data folder's files with this run's (a logs.tgz or a folder; once "
                             "per call of a run split over calls: where two hold a file of the same name, the "
                             "first one's)")
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "docs" / "performance.md")
    parser.add_argument("--plot", type=pathlib.Path, default=ROOT / "docs" / "performance.png")
    parser.add_argument("--readme", type=pathlib.Path, default=ROOT / "README.md",
                        help="rewrite the block between " + BEGIN + " and " + END)
    parser.add_argument("--no-readme", action="store_true", help="leave the README alone")
    parser.add_argument("--no-plot", action="store_true", help="leave the plot alone")
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 where the Markdown or the README's block differ from the data")
    args = parser.parse_args(argv)
    readme = None if args.no_readme else args.readme
    if args.sources:
        names = import_run(args.sources, args.data)
        print(f"perf_report: {label_of(args.data)}/ now holds {', '.join(names)}")
    run = load(args.data)
    md, new_readme = outputs(run, args.data, args.out, args.plot, readme)
    if args.check:
        stale = differs(args.out, md) | (readme is not None and differs(readme, new_readme))
        print("perf_report: " + ("out of date; run scripts/perf_report.py" if stale else "up to date"),
              file=sys.stderr)
        return 1 if stale else 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(md)
    if readme:
        readme.write_text(new_readme)
    why_not = "--no-plot" if args.no_plot else plot(run, args.plot)
    if why_not:
        print(f"perf_report: no plot written: {why_not}", file=sys.stderr)
    print(f"perf_report: wrote {label_of(args.out)}" + ("" if why_not else f", {label_of(args.plot)}")
          + (f", {label_of(readme)}'s block" if readme else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
