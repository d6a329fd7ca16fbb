#!/usr/bin/env python3
"""Summarises nvidia-smi samples taken while the benchmarks ran.

The lent H100s run power-capped on the long shapes (the SM clock drops under
load, throttle reason 0x4: the power cap), which moves a shape's TFLOP/s
between calls; the summary goes beside the tables it qualifies.
Input: CSV lines of timestamp, clocks.sm, power.draw, temperature.gpu,
clocks_throttle_reasons.active (nvidia-smi --format=csv,noheader).
"""
import collections
import statistics
import sys


def summarise(lines, busy_watts=200.0):
    """One line: the SM clock, power and throttle reasons over the samples drawing more than busy_watts."""
    busy = []
    for line in lines:
        fields = [f.strip() for f in line.split(",")]
        if len(fields) < 5:
            continue
        try:
            mhz, watts, temp = int(fields[1].split()[0]), float(fields[2].split()[0]), int(fields[3])
        except ValueError:
            continue
        if watts > busy_watts:
            busy.append((mhz, watts, temp, fields[4]))
    if not busy:
        return "clocks: no sample under load"
    mhz = sorted(b[0] for b in busy)
    reasons = collections.Counter(b[3] for b in busy).most_common(3)
    return (f"clocks under load ({len(busy)} samples): SM {mhz[0]}-{mhz[-1]} MHz, median {statistics.median(mhz):.0f}; "
            f"power median {statistics.median(b[1] for b in busy):.0f} W; temperature max {max(b[2] for b in busy)} C; "
            f"throttle reasons {', '.join(f'{r} x{n}' for r, n in reasons)}")


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        print(summarise(f.readlines()))
