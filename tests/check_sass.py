#!/usr/bin/env python3
"""Checks the compiled attention kernels' machine code, without a GPU.

Every forward and backward kernel must use the Hopper paths the design relies
on: HGMMA (warpgroup MMA; QGMMA for the FP8 kernels), UTMALDG (TMA loads), USETMAXREG (setmaxnreg), and
TMA for its output (UTMASTG: the forward's O; UTMAREDG: the backward's dQ
reduce-add); and no
mainloop (an innermost loop that issues warpgroup MMAs, or, in the FP8
kernels, the V transpose's LDSM.T) may touch local memory (LDL/STL: register
spills or stack arrays), nor issue a 64 x 8 warpgroup MMA: that is CuTe's
atom selector falling back when a tile's width is not among the atoms it
offers (a 64 x 40 GEMM comes out as five 64 x 8 ones, and the loop fills
with the R2UR of their descriptors). Local memory outside the mainloops is
listed, so that it stays visible. The forward's ablation variant without warp specialization
has no producer warpgroup to give registers away: it needs no USETMAXREG. The
split-KV forward (fwd::SplitEpilogue) writes its float32 partials from
registers, not by TMA: it needs no UTMASTG, nor does MLA's kernel
(fwd/mla_kernel.h), which writes O from registers too.

The backward's kernels run as a chain of programmatic dependent launches
(src/common/dependent_launch.h): each one with a dependent should let it
start (PREEXIT, griddepcontrol.launch_dependents), and the postprocess and
the GQA sums must wait for the kernel before them (ACQBULK,
griddepcontrol.wait), or they race it: the sums wholly, the postprocess's
last CTA (its others, and the main kernel, wait on counters instead).
"""
import argparse
import os
import re
import subprocess
import sys

REQUIRED = {
    "forward_kernel": ("HGMMA", "UTMALDG", "UTMASTG", "USETMAXREG"),
    "backward_kernel": ("HGMMA", "UTMALDG", "UTMAREDG", "USETMAXREG"),
    "mla_kernel": ("HGMMA", "UTMALDG", "USETMAXREG"),
}


CHAIN = {
    "preprocess_kernel": ("PREEXIT",),
    "backward_kernel": ("PREEXIT",),
    "postprocess_dq_kernel": ("ACQBULK", "PREEXIT"),
    "sum_groups_kernel": ("ACQBULK",),
}


def chain_ops(name):
    """What a kernel of the backward's launch chain must contain (empty for other kernels)."""
    return next((ops for k, ops in CHAIN.items() if f"bwd{len(k)}{k}" in name), ())


def missing_chain_ops(name, body):
    """The launch-chain instructions a kernel of the chain lacks."""
    return [op for op in chain_ops(name) if op not in body]


def kind(name):
    """The REQUIRED key of a checked kernel, or None."""
    return next((k for k in REQUIRED if k in name), None)


def mma_op(name):
    """The warpgroup MMA of a kernel: QGMMA for FP8 (e4m3) inputs, else HGMMA."""
    return "QGMMA" if "float_e4m3" in name else "HGMMA"


def warp_specialized(name):
    """False for the forward's ablation kernel without a producer (fwd::KernelNoWS)."""
    return "KernelNoWS" not in name


def split_kv(name):
    """True for the split-KV forward kernels (fwd::SplitEpilogue), which store no O by TMA."""
    return "SplitEpilogue" in name


def required(name):
    ops = tuple(mma_op(name) if op == "HGMMA" else op for op in REQUIRED[kind(name)])
    ops = ops if warp_specialized(name) else tuple(op for op in ops if op != "USETMAXREG")
    return tuple(op for op in ops if op != "UTMASTG") if split_kv(name) else ops


def hot_ops(name):
    """What marks a mainloop: the warpgroup MMA, and FP8's V transpose."""
    return (mma_op(name), "LDSM.16.MT88") if mma_op(name) == "QGMMA" else (mma_op(name),)
LOCAL = re.compile(r"\b(LDL|STL)(\.|\s)")
NARROW_MMA = re.compile(r"\b[HQ]GMMA\.64x8x")
INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?);")
BRANCH = re.compile(r"\bBRA\s+(?:`\(\.L_x_\d+\)|0x([0-9a-f]+))")


def mainloops(body, ops=("HGMMA",)):
    """Address ranges of the innermost loops that issue one of `ops`.

    A loop is a backward branch [target, branch]; among the loops holding one
    of them, those holding no smaller such loop are the mainloops. The compiler
    moves the retry paths of barrier waits out of line: a forward branch jumps
    to them and they branch back to the instruction after it. Such a return is
    no loop.
    """
    code = [(int(a, 16), text) for a, text in INSTRUCTION.findall(body)]
    target_of = {}
    for addr, text in code:
        m = BRANCH.search(text)
        if m and m.group(1):
            target_of[addr] = int(m.group(1), 16)
    previous = {b: a for (a, _), (b, _) in zip(code, code[1:])}
    loops = []
    for addr, target in target_of.items():
        if target > addr:
            continue
        jump_out = target_of.get(previous.get(target, -1), -1)
        if target < jump_out <= addr:
            continue  # the return of an out-of-line path
        loops.append((target, addr))
    hot = [(lo, hi) for lo, hi in loops if any(lo <= a <= hi and any(op in t for op in ops) for a, t in code)]
    inner = [l for l in hot if not any(o != l and l[0] <= o[0] and o[1] <= l[1] for o in hot)]
    return code, inner


def run(tool, args, env):
    return subprocess.run([tool] + args, check=True, capture_output=True, text=True, env=env).stdout


def functions(sass):
    """Yields (name, body) for each function in cuobjdump -sass output."""
    parts = re.split(r"\n\s*Function : (\S+)\n", sass)
    for i in range(1, len(parts), 2):
        yield parts[i], parts[i + 1]


def narrow_mmas_in_mainloops(code, loops):
    """The 64 x 8 warpgroup MMAs inside the mainloops, as (address, text)."""
    return [(a, t) for a, t in code if NARROW_MMA.search(t) and any(lo <= a <= hi for lo, hi in loops)]


def check(objects, cuobjdump, nvdisasm):
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(nvdisasm) + os.pathsep + env.get("PATH", "")
    failures, notes, kernels = [], [], 0
    for obj in objects:
        usage = run(cuobjdump, ["-res-usage", obj], env)
        for name, stack, local in re.findall(r"Function (\S+):\s*REG:\d+ STACK:(\d+) SHARED:\d+ LOCAL:(\d+)", usage):
            if kind(name) and (stack != "0" or local != "0"):
                notes.append(f"{obj}: {name}: STACK:{stack} LOCAL:{local}")
        for name, body in functions(run(cuobjdump, ["-sass", obj], env)):
            missing = missing_chain_ops(name, body)
            if missing:
                failures.append(f"{obj}: {name}: no {', '.join(missing)} (the backward's launch chain)")
            if not kind(name):
                continue
            kernels += 1
            missing = [op for op in required(name) if op not in body]
            if missing:
                failures.append(f"{obj}: {name}: no {', '.join(missing)}")
            code, loops = mainloops(body, hot_ops(name))
            for op in hot_ops(name):
                if not any(op in t for lo, hi in loops for a, t in code if lo <= a <= hi):
                    failures.append(f"{obj}: {name}: no loop issuing {op} found")
            for addr, text in narrow_mmas_in_mainloops(code, loops):
                failures.append(f"{obj}: {name}: {text.strip()} at 0x{addr:x}: a 64 x 8 MMA in the mainloop")
            for addr, text in code:
                if LOCAL.search(text):
                    where = [l for l in loops if l[0] <= addr <= l[1]]
                    line = f"{obj}: {name}: {text.strip()} at 0x{addr:x}"
                    (failures if where else notes).append(line + (" in the mainloop" if where else " outside the mainloops"))
    return kernels, failures, notes


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cuobjdump", required=True)
    parser.add_argument("--nvdisasm", required=True)
    parser.add_argument("objects", nargs="+")
    args = parser.parse_args()
    kernels, failures, notes = check(args.objects, args.cuobjdump, args.nvdisasm)
    for n in notes:
        print("note", n)
    for f in failures:
        print("FAIL", f)
    print(f"checked {kernels} attention kernels in {len(args.objects)} objects: {len(failures)} problems")
    return 1 if failures or kernels == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
