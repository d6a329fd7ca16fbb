#!/usr/bin/env python3
"""Checks the compiled forward kernels' machine code, without a GPU.

Every forward kernel must use the Hopper paths the design relies on: HGMMA
(warpgroup MMA), UTMALDG/UTMASTG (TMA), USETMAXREG (setmaxnreg); and none may
touch local memory (LDL/STL: register spills or stack arrays).
"""
import argparse
import os
import re
import subprocess
import sys

REQUIRED = ("HGMMA", "UTMALDG", "UTMASTG", "USETMAXREG")
FORBIDDEN = re.compile(r"\b(LDL|STL)(\.|\s)")


def run(tool, args, env):
    return subprocess.run([tool] + args, check=True, capture_output=True, text=True, env=env).stdout


def functions(sass):
    """Yields (name, body) for each function in cuobjdump -sass output."""
    parts = re.split(r"\n\s*Function : (\S+)\n", sass)
    for i in range(1, len(parts), 2):
        yield parts[i], parts[i + 1]


def check(objects, cuobjdump, nvdisasm):
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(nvdisasm) + os.pathsep + env.get("PATH", "")
    failures, kernels = [], 0
    for obj in objects:
        usage = run(cuobjdump, ["-res-usage", obj], env)
        for name, stack, local in re.findall(r"Function (\S+):\s*REG:\d+ STACK:(\d+) SHARED:\d+ LOCAL:(\d+)", usage):
            if "forward_kernel" in name and (stack != "0" or local != "0"):
                failures.append(f"{obj}: {name}: STACK:{stack} LOCAL:{local}")
        for name, body in functions(run(cuobjdump, ["-sass", obj], env)):
            if "forward_kernel" not in name:
                continue
            kernels += 1
            missing = [op for op in REQUIRED if op not in body]
            if missing:
                failures.append(f"{obj}: {name}: no {', '.join(missing)}")
            if FORBIDDEN.search(body):
                failures.append(f"{obj}: {name}: local memory access (LDL/STL)")
    return kernels, failures


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cuobjdump", required=True)
    parser.add_argument("--nvdisasm", required=True)
    parser.add_argument("objects", nargs="+")
    args = parser.parse_args()
    kernels, failures = check(args.objects, args.cuobjdump, args.nvdisasm)
    for f in failures:
        print("FAIL", f)
    print(f"checked {kernels} forward kernels in {len(args.objects)} objects: {len(failures)} problems")
    return 1 if failures or kernels == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
