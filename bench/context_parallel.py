#!/usr/bin/env python3
"""Context parallelism's speed (issue 37): flash3.parallel's attention over a
sequence sharded on N GPUs against flash3 on one GPU, forward + backward.

    python3 bench/context_parallel.py --gpus 2 [--seqlen 131072 --heads 16 --head-dim 128 --causal 1]

One process a GPU (NCCL, NVLink multicast left off). Each mode (ring,
all-gather) is timed whole, then with its transfers replaced by nothing
(compute alone) and with its kernels replaced by nothing (transfers alone):
exposed communication = whole - compute alone, hidden = transfers alone -
exposed. Per-GPU TFLOP/s counts the paper's FLOPs (4 n^2 d h a forward,
halved when causal; the backward 2.5 times that) divided by N; the one-GPU
rows run the whole sequence, and a sequence of n / sqrt(N) tokens (the same
work as a GPU's share). Times are the median over --reps calls of the slowest
rank, wall clock between barriers after a synchronize (a call lasts tens of
milliseconds or more). Inputs are N(0, 1), checked against one GPU first.
"""
import argparse
import math
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import flash3
from flash3 import parallel

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # multicast off: see the device notes


def _flops(n, heads, d, causal, batch=1):
    forward = 4 * n * n * d * heads * batch / (2 if causal else 1)
    return forward * 3.5  # forward and backward (2.5 times the forward)


def _timed(fn, reps, world):
    """Median over reps of the slowest rank's seconds for fn()."""
    for _ in range(2):
        fn()
    samples = []
    for _ in range(reps):
        torch.cuda.synchronize()
        dist.barrier()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        mine = torch.tensor([time.perf_counter() - start], device="cuda")
        every = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(every, mine)
        samples.append(max(t.item() for t in every))
    return statistics.median(samples)


class _NoKernels:
    """Kernels that compute nothing: the transfers alone."""

    def forward(self, q, k, v, causal, scale):
        return (torch.zeros_like(q), q.new_zeros((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32))

    def backward(self, dout, q, k, v, out, lse, causal, scale):
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)


def _step(q, k, v, dout, causal, mode, kernels):
    shards = [t.detach().requires_grad_(True) for t in (q, k, v)]
    out = parallel._ContextParallelAttention.apply(*shards, None, causal, q.shape[-1] ** -0.5, mode, kernels)
    out.backward(dout)


def _worker(rank, world, init_file, args, results):
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=rank, world_size=world,
                           device_id=torch.device("cuda", rank))
    gen = torch.Generator(device="cuda").manual_seed(0)
    n, h, d, causal = args.seqlen, args.heads, args.head_dim, bool(args.causal)
    full = [torch.randn(1, n, h, d, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(4)]
    q, k, v, dout = (parallel.zigzag_shard(t) for t in full)
    rows = {}
    # Checked against one GPU on the whole sequence first (the output).
    got = parallel.zigzag_unshard(parallel.attention(q, k, v, causal=causal))
    want = flash3.flash_attn_func(*full[:3], causal=causal)
    error = ((got.float() - want.float()).abs().max() / want.float().abs().max()).item()
    del got, want
    work = _flops(n, h, d, causal) / world
    kernels = parallel.Flash3Kernels()
    shift = parallel._Ring.shift
    for mode in parallel.MODES:
        whole = _timed(lambda: _step(q, k, v, dout, causal, mode, kernels), args.reps, world)
        parallel._Ring.shift = lambda self, tensors: (lambda: list(tensors))  # noqa: E731
        gather, scatter = parallel._Dense.gather, parallel._Dense.scatter
        parallel._Dense.gather = lambda self, x, group: torch.cat([x] * world, dim=1)
        parallel._Dense.scatter = lambda self, x, group: x[:, :q.shape[1]].contiguous()
        compute = _timed(lambda: _step(q, k, v, dout, causal, mode, kernels), args.reps, world)
        parallel._Ring.shift, parallel._Dense.gather, parallel._Dense.scatter = shift, gather, scatter
        transfers = _timed(lambda: _step(q, k, v, dout, causal, mode, _NoKernels()), args.reps, world)
        exposed = max(whole - compute, 0.0)
        rows[mode] = {"ms": whole * 1e3, "tflops": work / whole / 1e12, "compute_ms": compute * 1e3,
                      "transfers_ms": transfers * 1e3, "exposed_ms": exposed * 1e3,
                      "hidden_ms": max(transfers - exposed, 0.0) * 1e3}
    if rank == 0:
        # One GPU: the whole sequence, and a GPU's share of the work.
        share = int(n / math.sqrt(world)) // 256 * 256
        for name, length in (("one GPU, whole sequence", n), ("one GPU, a GPU's share", share)):
            x = [t[:, :length] for t in full]
            seconds = _timed_local(lambda x=x: _one_gpu_step(x, causal), args.reps)
            rows[name] = {"ms": seconds * 1e3, "tflops": _flops(length, h, d, causal) / seconds / 1e12,
                          "seqlen": length}
        results.put({"error": error, "rows": rows})
    dist.barrier()
    dist.destroy_process_group()


def _one_gpu_step(x, causal):
    q, k, v = (t.detach().requires_grad_(True) for t in x[:3])
    flash3.flash_attn_func(q, k, v, causal=causal).backward(x[3])


def _timed_local(fn, reps):
    for _ in range(2):
        fn()
    samples = []
    for _ in range(reps):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gpus", type=int, default=torch.cuda.device_count())
    p.add_argument("--seqlen", type=int, default=131072)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--causal", type=int, default=1)
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args()
    if args.gpus < 2 or torch.cuda.device_count() < args.gpus:
        p.exit(2, f"context_parallel.py: needs --gpus >= 2 GPUs, {torch.cuda.device_count()} here\n")
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(_worker, args=(args.gpus, os.path.join(tmp, "init"), args, results), nprocs=args.gpus,
                           join=True, start_method="spawn")
    r = results.get()
    print(f"{torch.cuda.get_device_name()} x {args.gpus}: seqlen {args.seqlen}, {args.heads} heads of "
          f"{args.head_dim}, {'causal' if args.causal else 'full'}, forward + backward, bf16; output against one "
          f"GPU: max relative error {r['error']:.2e}")
    print("| run | ms | TFLOP/s per GPU | compute alone ms | transfers alone ms | exposed ms | hidden ms |")
    print("|---|---|---|---|---|---|---|")
    for name, row in r["rows"].items():
        extra = [f"{row[key]:.1f}" if key in row else "" for key in ("compute_ms", "transfers_ms", "exposed_ms",
                                                                     "hidden_ms")]
        print(f"| {name} | {row['ms']:.1f} | {row['tflops']:.1f} | " + " | ".join(extra) + " |")
    share = r["rows"]["one GPU, a GPU's share"]["tflops"]
    for mode in parallel.MODES:
        print(f"{mode}: per-GPU TFLOP/s over one GPU's at a GPU's share: {r['rows'][mode]['tflops'] / share:.3f}")


if __name__ == "__main__":
    main()
