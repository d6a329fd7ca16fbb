#!/usr/bin/env python3
"""flash3 through Python (flash_attn_func, `python -m flash3.benchmark
--methods flash3`) against flash3-bench on the same shapes, timed in the same
regime in one call: per shape both TFLOP/s and their ratio, and a last line
with the ratios' range and how many lie outside the tolerance.

  scripts/match_table.py --bench bench_fwd.json [bench_bwd.json ...] --python py_fwd.json [py_bwd.json ...]
                         [--tolerance 0.01]
"""
import argparse
import json
import statistics
import sys


def hdim_label(record):
    hdim, hdim_v = record["hdim"], record.get("hdim_v", record["hdim"])
    return str(hdim) if hdim_v == hdim else f"{hdim}/{hdim_v}"


def row_order(key):
    """Pass, dtype, head dim (192 before 192/128), mask, seqlen."""
    hdim, _, hdim_v = key[2].partition("/")
    return key[:2] + (int(hdim), -int(hdim_v or hdim)) + key[3:]


def bench_rows(paths):
    """{(pass, dtype, hdim, causal, seqlen): tflops} from flash3-bench --json files; hdim is "192/128"
    where V's head dim is its own."""
    rows = {}
    for path in paths:
        with open(path) as f:
            for r in json.load(f):
                if r["tflops"] > 0:
                    rows[(r["pass"], r["dtype"], hdim_label(r), bool(r["causal"]), r["seqlen_q"])] = r["tflops"]
    return rows


def python_rows(paths, method="flash3"):
    """The same from python -m flash3.benchmark --json files (the method's rows that ran)."""
    rows = {}
    for path in paths:
        with open(path) as f:
            for r in json.load(f)["results"]:
                if r["method"] == method and r["status"] == "ok":
                    rows[(r["pass"], r["dtype"], hdim_label(r), bool(r["causal"]), r["seqlen"])] = r["tflops"]
    return rows


def table(bench, python, tolerance):
    lines = ["| pass | dtype | hdim | causal | seqlen | flash3-bench | flash_attn_func | ratio |",
             "|---|---|---|---|---|---|---|---|"]
    ratios, outside = [], 0
    for key in sorted(set(bench) & set(python), key=row_order):
        ratio = python[key] / bench[key]
        ratios.append(ratio)
        flag = "" if abs(ratio - 1) <= tolerance else " **"
        outside += bool(flag)
        p, dt, h, c, s = key
        lines.append(f"| {p} | {dt} | {h} | {'yes' if c else 'no'} | {s} | {bench[key]:.1f} | {python[key]:.1f} "
                     f"| {ratio:.3f}{flag} |")
    missing = len(set(bench) ^ set(python))
    if ratios:
        lines.append("")
        lines.append(f"flash_attn_func/flash3-bench: {len(ratios)} shapes, ratio {min(ratios):.3f}-{max(ratios):.3f}, "
                     f"median {statistics.median(ratios):.3f}; {outside} outside ±{tolerance * 100:g}%"
                     + (f"; {missing} shapes in one only" if missing else ""))
    return "\n".join(lines), outside + missing


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bench", nargs="+", required=True)
    parser.add_argument("--python", nargs="+", required=True)
    parser.add_argument("--tolerance", type=float, default=0.01)
    args = parser.parse_args(argv)
    text, bad = table(bench_rows(args.bench), python_rows(args.python), args.tolerance)
    print(text)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
