#!/usr/bin/env python3
"""Interleaved A/B of two flash3-bench builds: per shape, each build's median
TFLOP/s over the rounds, and their ratio.

Input: files <build>_<sweep>_<round>[_<part>...].json (flash3-bench --json)
in one folder, e.g. base_fwd_1.json and new_fwd_1_128_0.json. Prints one
Markdown table per sweep and a last line with the ratios' range and how many
rows lie outside the tolerance.
  scripts/ab_table.py DIR [--a base] [--b new] [--tolerance 0.015]
"""
import argparse
import collections
import json
import pathlib
import re
import statistics
import sys

NAME = re.compile(r"^(?P<build>[a-z0-9]+)_(?P<sweep>[a-z0-9]+)_(?P<round>\d+)(_[a-z0-9]+)*\.json$")


def shape_key(row):
    return (row["pass"], row["dtype"], row["hdim"], row["causal"], row["seqlen_q"])


def collect(folder):
    """{sweep: {build: {shape: [tflops per round]}}}"""
    data = collections.defaultdict(lambda: collections.defaultdict(lambda: collections.defaultdict(list)))
    for path in sorted(pathlib.Path(folder).iterdir()):
        m = NAME.match(path.name)
        if not m:
            continue
        for row in json.loads(path.read_text() or "[]"):
            data[m["sweep"]][m["build"]][shape_key(row)].append(row["tflops"])
    return data


def spread(values):
    """A build's own rounds: max/min - 1, the noise an A/A comparison would show."""
    return max(values) / min(values) - 1 if min(values) > 0 else float("nan")


def table(data, a, b, tolerance):
    lines, ratios, spreads, outside = [], [], [], 0
    for sweep, builds in sorted(data.items()):
        lines += [f"### {sweep}", "", f"| pass | dtype | hdim | causal | seqlen | {a} | {b} | {b}/{a} "
                  f"| {a} spread | {b} spread |", "|---|---|---|---|---|---|---|---|---|---|"]
        for shape in sorted(set(builds[a]) & set(builds[b])):
            ma, mb = statistics.median(builds[a][shape]), statistics.median(builds[b][shape])
            ratio = mb / ma if ma > 0 else float("nan")
            ratios.append(ratio)
            sa, sb = spread(builds[a][shape]), spread(builds[b][shape])
            spreads += [sa, sb]
            flag = "" if abs(ratio - 1) <= tolerance else " **"
            outside += bool(flag)
            p, dt, h, c, s = shape
            lines.append(f"| {p} | {dt} | {h} | {'yes' if c else 'no'} | {s} | {ma:.1f} | {mb:.1f} | {ratio:.3f}{flag} "
                         f"| {sa * 100:.1f}% | {sb * 100:.1f}% |")
        lines.append("")
    if ratios:
        lines.append(f"{b}/{a}: {len(ratios)} rows, ratio {min(ratios):.3f}-{max(ratios):.3f}, median "
                     f"{statistics.median(ratios):.3f}; {outside} outside ±{tolerance * 100:.1f}%; a build's own "
                     f"rounds spread up to {max(spreads) * 100:.1f}% (median {statistics.median(spreads) * 100:.1f}%)")
    return "\n".join(lines), outside


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder")
    parser.add_argument("--a", default="base")
    parser.add_argument("--b", default="new")
    parser.add_argument("--tolerance", type=float, default=0.015)
    args = parser.parse_args(argv)
    text, _ = table(collect(args.folder), args.a, args.b, args.tolerance)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
