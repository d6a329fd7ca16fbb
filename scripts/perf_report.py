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
  bench.json, bench_bwd.json, bench_fp8.json   flash3-bench --json (the sweeps)
  bench_bwd_det.json flash3-bench --pass bwd --deterministic --json
  ablation.json      flash3-bench --ablation --json
  compare.json       bench/compare_sdpa.py --out-json (SDPA's FlashAttention-2 and cuDNN, same shapes, same run)
  fp8_accuracy.txt   flash3-bench --fp8-accuracy's table (paper Table 3)
  clocks.txt         scripts/clock_summary.py's line (--import makes it from clocks.csv)
  notes.md           anything said by hand about the run, shown under the header

Needs the standard library only, and matplotlib for the plot (without it the
plot is left as it is, saying so).
"""
import argparse
import difflib
import importlib.util
import json
import os
import pathlib
import statistics
import sys
import tarfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
DEFAULT_DATA = ROOT / "docs" / "perf-data"
BENCH_FILES = ("bench.json", "bench_bwd.json", "bench_fp8.json")
INPUT_FILES = ("gpu.txt",) + BENCH_FILES + ("bench_bwd_det.json", "ablation.json", "compare.json",
                                            "fp8_accuracy.txt", "clocks.txt")
SHAPE_KEYS = ("pass", "dtype", "hdim", "causal", "batch", "seqlen_q", "seqlen_k", "heads_q", "heads_kv")
PASS_ORDER = ("fwd", "bwd", "fwd+bwd")
PASS_NAMES = {"fwd": "Forward", "bwd": "Backward", "fwd+bwd": "Forward + backward"}
DTYPE_ORDER = ("bf16", "fp16", "e4m3")
# (key in compare.json's rows, name in the tables); flash3 first, then the paper's order of peers.
METHODS = (("flash3", "flash3"), ("cudnn", "cuDNN"), ("fa2", "FA2"))
LONG_SEQLEN = 1024  # the summaries count shapes at least this long, as compare_sdpa.py does
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

def import_run(source, data):
    """Replaces the run files in `data` with those of `source` (a logs.tgz or a folder); returns their names."""
    source = pathlib.Path(source)
    found = {}
    if source.is_dir():
        for name in INPUT_FILES + ("clocks.csv",):
            if (source / name).is_file():
                found[name] = (source / name).read_bytes()
    else:
        with tarfile.open(source) as tar:
            for member in tar.getmembers():
                name = pathlib.PurePosixPath(member.name).name
                if member.isfile() and name in INPUT_FILES + ("clocks.csv",) and name not in found:
                    found[name] = tar.extractfile(member).read()
    if "gpu.txt" not in found:
        raise SystemExit(f"perf_report: no gpu.txt in {source}: not a scripts/device_run.sh output")
    if "clocks.csv" in found and "clocks.txt" not in found:
        found["clocks.txt"] = (clock_summary().summarise(found["clocks.csv"].decode().splitlines()) + "\n").encode()
    found.pop("clocks.csv", None)
    data.mkdir(parents=True, exist_ok=True)
    # Files of an earlier run must not mix with this one's, nor its hand-written notes.
    for name in INPUT_FILES + ("notes.md",):
        (data / name).unlink(missing_ok=True)
    for name, content in found.items():
        (data / name).write_bytes(content)
    return sorted(found)


def clock_summary():
    spec = importlib.util.spec_from_file_location("clock_summary", ROOT / "scripts" / "clock_summary.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
    run = {"gpu": read_gpu(gpu), "bench": [], "bench_files": [], "compare": js("compare.json"),
           "det": js("bench_bwd_det.json") or [], "ablation": js("ablation.json")}
    for name in BENCH_FILES:
        entries = js(name)
        if entries is not None:
            run["bench"] += entries
            run["bench_files"].append(name)
    accuracy = text("fp8_accuracy.txt")
    run["fp8_accuracy"] = parse_fp8_accuracy(accuracy) if accuracy is not None else None
    run["clocks"] = (text("clocks.txt") or "").strip()
    run["notes"] = (text("notes.md") or "").strip()
    run["files"] = [name for name in INPUT_FILES if (data / name).is_file()]
    return run


# ---- the numbers ----------------------------------------------------------------

def shape_key(entry):
    return tuple(entry[k] for k in SHAPE_KEYS)


def sweep_rows(run):
    """One row per shape of the sweeps' default variant: flash3's median TFLOP/s and the peers from compare.json."""
    groups = {}
    for entry in run["bench"]:
        if entry.get("variant", "default") == "default":
            groups.setdefault(shape_key(entry), []).append(entry)
    peers = {}
    if run["compare"]:
        peers = {shape_key(r): r for r in run["compare"]["rows"]}
    rows = []
    for key, entries in groups.items():
        row = dict(zip(SHAPE_KEYS, key))
        ok = [e["tflops"] for e in entries if e.get("ok", True)]
        row["flash3"] = {"tflops": statistics.median(ok)} if ok else {"failed": "failed its reference check"}
        for name in ("cudnn", "fa2"):
            if run["compare"] is None:
                row[name] = {"na": "no compare.json: SDPA's backends did not run"}
            else:
                row[name] = peers.get(key, {}).get(name) or {"na": "not in compare.json"}
        row["checks"] = list(entries)
        rows.append(row)
    return rows


def tflops(result):
    return result.get("tflops") if result else None


def fmt(value, spec=".1f"):
    return NOT_MEASURED if value is None else format(value, spec)


def cell(result):
    if "failed" in result:
        return "FAIL"
    if "tflops" in result:
        return f"{result['tflops']:.1f}"
    return "n/a"


def ratio(row, peer):
    a, b = tflops(row["flash3"]), tflops(row[peer])
    return a / b if a and b else None


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
    """The table row a shape belongs to: head dim, mask, and the GQA ratio where there is one."""
    return (row["hdim"], row["causal"], row["heads_q"] // max(row["heads_kv"], 1))


def group_label(group, heads_column):
    hdim, causal, gqa = group
    return [str(hdim), "yes" if causal else "no"] + ([f"GQA {gqa}" if gqa != 1 else "MHA"] if heads_column else [])


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


def ratio_range(rows, peer):
    values = [ratio(r, peer) for r in long_rows(rows)]
    values = [v for v in values if v is not None]
    return (min(values), max(values)) if values else None


def summary_line(rows):
    compared = [r for r in long_rows(rows) if tflops(r["flash3"]) and tflops(r["cudnn"])]
    if not compared:
        return None
    wins = sum(ratio(r, "cudnn") > 1 for r in compared)
    line = f"flash3 ahead of cuDNN on {wins} of {len(long_rows(rows))} shapes with seqlen ≥ {seqlen_label(LONG_SEQLEN)}"
    parts = []
    for peer, name in (("cudnn", "cuDNN"), ("fa2", "FA2")):
        span = ratio_range(rows, peer)
        if span:
            parts.append(f"flash3/{name} {span[0]:.2f}-{span[1]:.2f}")
    return line + (f" ({', '.join(parts)} there)" if parts else "")


def reasons(rows, name):
    """Each distinct reason a method has no number, once, with its count."""
    counts = {}
    for r in rows:
        reason = r[name].get("na") or r[name].get("failed") or r[name].get("error")
        if reason:
            counts[reason] = counts.get(reason, 0) + 1
    return counts


# ---- Markdown -------------------------------------------------------------------------

def md_table(header, body):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in body]
    return "\n".join(lines)


def sweep_table(rows):
    """Rows: head dim x mask, one line per method and flash3/cuDNN; columns: sequence lengths."""
    columns = sorted({(r["seqlen_q"], r["seqlen_k"]) for r in rows})
    groups = {}
    for r in rows:
        groups.setdefault(row_group(r), {})[(r["seqlen_q"], r["seqlen_k"])] = r
    shown = [(key, name) for key, name in METHODS if key == "flash3" or any(tflops(r[key]) for r in rows)]
    gqa = any(g[2] != 1 for g in groups)
    header = ["hdim", "causal"] + (["heads"] if gqa else []) + ["method"] + [column_label(c) for c in columns]
    body = []
    for group in sorted(groups):
        label = group_label(group, gqa)
        lines = [(name, lambda r, key=key: cell(r[key])) for key, name in shown]
        if any(key == "cudnn" for key, _ in shown):
            lines.append(("flash3/cuDNN", lambda r: fmt(ratio(r, "cudnn"), ".2f")))
        for i, (name, show) in enumerate(lines):
            cells = [show(groups[group][c]) if c in groups[group] else NOT_MEASURED for c in columns]
            body.append((label if i == 0 else [""] * len(label)) + [name if i else f"**{name}**"] + cells)
    return md_table(header, body), [name for key, name in METHODS if (key, name) not in shown]


def sweep_section(key, rows):
    pass_, dtype = key
    table, missing = sweep_table(rows)
    out = [f"## {PASS_NAMES.get(pass_, pass_)}, {dtype}", ""]
    settings = shape_settings(rows)
    out += [f"TFLOP/s by sequence length{' (' + settings + ')' if settings else ''}.", "", table, ""]
    line = summary_line(rows)
    if line:
        out += [line + ".", ""]
    for key_, name in METHODS:
        for reason, n in reasons(rows, key_).items():
            out.append(f"- {name}{' (left out)' if name in missing else ''}: no number on {n} shape(s): {reason}")
    if out[-1].startswith("- "):
        out.append("")
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
            "`BackwardArgs::deterministic` (dQ bitwise the same across runs) against the default backward above.",
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
            groups.setdefault((r["hdim"], r["causal"]), []).extend(r["checks"])
        for (hdim, causal), entries in sorted(groups.items()):
            errs = [e for e in entries if "max_err" in e]
            worst = max(errs, key=lambda e: e["max_err"] / e["ref_err"] if e["ref_err"] else 0.0) if errs else None
            body.append([key[0], key[1], hdim, "yes" if causal else "no",
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


def describe_device(gpu, compare):
    name = gpu.get("name") or (compare or {}).get("device") or "not recorded"
    details = []
    if gpu.get("clock_sm"):
        details.append(f"SM clock {gpu['clock_sm']} at start, {gpu['clock_max_sm']} max")
    if gpu.get("power_limit"):
        details.append(f"power limit {gpu['power_limit']}")
    if gpu.get("driver"):
        details.append(f"driver {gpu['driver']}")
    return name + (f" ({', '.join(details)})" if details else "")


def header_section(run, data_label, plot_name):
    gpu, compare = run["gpu"], run["compare"]
    date = gpu.get("date") or (compare or {}).get("date") or "not recorded"
    info = [["device", describe_device(gpu, compare)], ["date", date],
            ["commit", gpu.get("commit", "not recorded")],
            ["command", f"`{gpu['command']}`" if gpu.get("command") else "not recorded"]]
    if compare:
        info.append(["peers", f"PyTorch {compare.get('torch')} SDPA, FLASH_ATTENTION (FlashAttention-2) and "
                              f"CUDNN_ATTENTION (cuDNN {compare.get('cudnn')}); timed by {compare.get('timer')}"])
    if run["clocks"]:
        info.append(["clocks", run["clocks"]])
    results = [n for n in INPUT_FILES if n not in ("gpu.txt", "clocks.txt")]
    info.append(["files", ", ".join(f"`{n}`" for n in results if n in run["files"]) or "none"])
    absent = [n for n in results if n not in run["files"]]
    if absent:
        info.append(["not in this run", ", ".join(f"`{n}`" for n in absent)])
    out = ["# flash3 performance", "",
           f"Generated by `scripts/perf_report.py` from one GPU run's files in `{data_label}/`; do not edit by",
           "hand. Regenerate with `python3 scripts/perf_report.py` (`--import OUT/logs.tgz` to take a new run of",
           "`scripts/device_run.sh`). How the numbers came to be, run by run: [performance-log.md](performance-log.md).",
           "", md_table(["", ""], info), ""]
    if run["notes"]:
        out += [run["notes"], ""]
    out += ["TFLOP/s = 4 · seqlen_q · seqlen_k · hdim · heads · batch (halved for causal, × 2.5 for the backward) /",
            "time, the FlashAttention papers' count, for every method. flash3's time is `flash3-bench`'s median over",
            "its timed calls, each after an L2 flush; every shape is checked against the reference before it is",
            "timed (see Accuracy). cuDNN and FA2 are PyTorch SDPA's backends on the same shapes in the same run",
            "(`bench/compare_sdpa.py`); n/a: the backend has no kernel for that shape.", ""]
    if plot_name:
        out += [f"![TFLOP/s against sequence length, per method]({plot_name})", ""]
    return out


def report(run, data_label, plot_name):
    rows = sweep_rows(run)
    out = header_section(run, data_label, plot_name)
    by_table = tables(rows)
    if not by_table:
        out += ["No sweep in this run (none of " + ", ".join(BENCH_FILES) + ").", ""]
    for key, table_rows in by_table.items():
        out += sweep_section(key, table_rows)
    out += deterministic_section(run, rows)
    out += ablation_section(run)
    out += accuracy_section(run, rows)
    return "\n".join(out).rstrip() + "\n"


def headline(run, doc_link, plot_link):
    """README's block: each pass and dtype at its longest sequence length, and the plot."""
    rows = sweep_rows(run)
    body, longest = [], set()
    for (pass_, dtype), table_rows in tables(rows).items():
        seqlen = max(r["seqlen_q"] for r in table_rows)
        longest.add(seqlen)
        at = {row_group(r): r for r in table_rows if r["seqlen_q"] == seqlen}
        for hdim in sorted({g[0] for g in at}):
            cells = [f"{PASS_NAMES.get(pass_, pass_).lower()}, {dtype}", hdim]
            for causal in (False, True):
                r = at.get((hdim, causal, 1))
                cells += [cell(r[key]) if r else NOT_MEASURED for key, _ in METHODS]
            body.append(cells)
    gpu = run["gpu"]
    date = gpu.get("date") or (run["compare"] or {}).get("date") or "date not recorded"
    settings = shape_settings(rows)
    out = [BEGIN,
           f"TFLOP/s at sequence length {', '.join(seqlen_label(s) for s in sorted(longest)) or NOT_MEASURED}"
           f"{' (' + settings + ')' if settings else ''},",
           f"{gpu.get('name', 'device not recorded')}, commit {gpu.get('commit', 'not recorded')}, {date}.",
           f"Every sequence length, the ablation and the accuracy: [{doc_link}]({doc_link}).", ""]
    header = ["pass", "hdim"] + [f"{name}{' causal' if causal else ''}" for causal in (False, True)
                                 for _, name in METHODS]
    out += [md_table(header, body), ""]
    for key, table_rows in tables(rows).items():
        line = summary_line(table_rows)
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

def write_plot(rows, path):
    """Paper Figure 5's layout: a panel per (pass, dtype, mask) and head dim, bars per method by seqlen.

    Returns None, or why no plot was written.
    """
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        return f"matplotlib not importable ({e})"
    panels = {}
    for (pass_, dtype), table_rows in tables(rows).items():
        for r in table_rows:
            hdim, causal, gqa = row_group(r)
            panels.setdefault((pass_, dtype, causal, gqa), {}).setdefault(hdim, []).append(r)
    if not panels:
        return "no sweep to plot"
    hdims = sorted({h for by_hdim in panels.values() for h in by_hdim})
    fig, axes = plt.subplots(len(panels), len(hdims), figsize=(4.2 * len(hdims), 2.7 * len(panels)), squeeze=False)
    colors = {"flash3": "#7b3294", "cudnn": "#e08214", "fa2": "#4393c3"}
    for i, ((pass_, dtype, causal, gqa), by_hdim) in enumerate(panels.items()):
        for j, hdim in enumerate(hdims):
            ax = axes[i][j]
            mine = by_hdim.get(hdim)
            if not mine:
                ax.axis("off")
                continue
            columns = sorted({(r["seqlen_q"], r["seqlen_k"]) for r in mine})
            at = {(r["seqlen_q"], r["seqlen_k"]): r for r in mine}
            shown = [(m, n) for m, n in METHODS if any(tflops(r[m]) for r in mine)]
            width = 0.8 / max(len(shown), 1)
            for k, (method, name) in enumerate(shown):
                xs = [x + (k - (len(shown) - 1) / 2) * width for x in range(len(columns))]
                ax.bar(xs, [tflops(at[c][method]) or 0 for c in columns], width, label=name, color=colors[method])
            ax.set_xticks(range(len(columns)))
            ax.set_xticklabels([column_label(c) for c in columns], fontsize=8)
            ax.tick_params(axis="y", labelsize=8)
            ax.set_ylim(bottom=0)
            ax.grid(axis="y", alpha=0.3)
            ax.set_axisbelow(True)
            ax.set_title(f"{PASS_NAMES.get(pass_, pass_)} {dtype}, hdim {hdim}, {'causal' if causal else 'no mask'}"
                         + (f", GQA {gqa}" if gqa != 1 else ""), fontsize=9)
            if j == 0:
                ax.set_ylabel("TFLOP/s", fontsize=8)
            if i == len(panels) - 1:
                ax.set_xlabel("sequence length", fontsize=8)
    handles = {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    fig.legend(list(handles.values()), list(handles), loc="upper center", ncol=len(handles), frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.4 / (2.7 * len(panels))))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90, metadata={"Software": None})
    plt.close(fig)
    return None


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
    parser.add_argument("--import", dest="source", type=pathlib.Path,
                        help="first replace the data folder's files with this run's (logs.tgz or a folder)")
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
    if args.source:
        names = import_run(args.source, args.data)
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
    why_not = "--no-plot" if args.no_plot else write_plot(sweep_rows(run), args.plot)
    if why_not:
        print(f"perf_report: no plot written: {why_not}", file=sys.stderr)
    print(f"perf_report: wrote {label_of(args.out)}" + ("" if why_not else f", {label_of(args.plot)}")
          + (f", {label_of(readme)}'s block" if readme else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
