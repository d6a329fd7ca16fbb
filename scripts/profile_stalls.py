#!/usr/bin/env python3
"""Summarises ncu's per-instruction warp-stall sampling of one kernel.

  ncu --kernel-name regex:forward_kernel --launch-skip 2 --launch-count 1 \\
      --section WarpStateStats --section SourceCounters -o prof <command>
  ncu --import prof.ncu-rep --page source --csv --print-source sass > prof.csv
  scripts/profile_stalls.py prof.csv

Prints the samples by opcode and the hottest instructions with their
leading stall reasons, so that one can tell whose wait dominates (the
producer's, a transposer's or a consumer's code).
"""
import collections
import csv
import sys


def main(path):
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    header_at = next(i for i, r in enumerate(rows) if any("Warp Stall Sampling (All Samples)" in c for c in r))
    header, body = rows[header_at], rows[header_at + 1:]
    col = {name: i for i, name in enumerate(header)}
    total_col = next(i for i, c in enumerate(header) if c.startswith("Warp Stall Sampling (All Samples)"))
    source_col = col.get("Source", 1)
    address_col = col.get("Address", 0)
    stall_cols = [(i, c) for i, c in enumerate(header) if c.startswith("stall_") and "not_issued" not in c]

    def num(r, i):
        try:
            return float(r[i].replace(",", ""))
        except (ValueError, IndexError):
            return 0.0

    total = sum(num(r, total_col) for r in body) or 1.0
    by_op = collections.Counter()
    for r in body:
        op = r[source_col].split()[0] if r[source_col].split() else "?"
        if op.startswith("@"):
            op = r[source_col].split()[1]
        by_op[op.split(".")[0]] += num(r, total_col)
    print(f"samples: {total:.0f}")
    print("by opcode:", ", ".join(f"{op} {100 * n / total:.1f}%" for op, n in by_op.most_common(14)))
    print("hottest instructions:")
    for r in sorted(body, key=lambda r: -num(r, total_col))[:40]:
        reasons = sorted(((num(r, i), c) for i, c in stall_cols), reverse=True)[:3]
        why = ", ".join(f"{c[6:]} {100 * n / max(num(r, total_col), 1):.0f}%" for n, c in reasons if n > 0)
        print(f"  {r[address_col]:>8} {100 * num(r, total_col) / total:5.1f}%  {r[source_col][:60]:60}  {why}")


if __name__ == "__main__":
    main(sys.argv[1])
