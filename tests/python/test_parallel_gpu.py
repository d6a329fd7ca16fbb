"""flash3.parallel on GPUs: 2 (and 4, where there are) processes, one GPU
each, NCCL, flash3's kernels; outputs and gradients against single-GPU
flash3 on the whole sequence, ring and all-gather, causal and not, GQA,
packed documents; and
ranks that disagree on shapes get a ValueError. Skipped, saying why, without
two Hopper GPUs or the library.
"""
import os
import tempfile

import pytest

torch = pytest.importorskip("torch", reason="flash3.parallel needs PyTorch")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

import flash3  # noqa: E402
from flash3 import parallel  # noqa: E402

BF16 = torch.bfloat16


def _relative_error(got, want):
    return ((got.float() - want.float()).abs().max() / want.float().abs().max()).item()


def _worker(rank, world, init_file, results):
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{init_file}", rank=rank, world_size=world,
                           device_id=torch.device("cuda", rank))
    errors = {}
    for mode in parallel.MODES:
        for causal in (False, True):
            gen = torch.Generator(device="cuda").manual_seed(7)
            b, n, hq, hkv, d = 2, 2 * world * 320, 8, 2, 128
            q = torch.randn(b, n, hq, d, device="cuda", dtype=BF16, generator=gen)
            k, v = (torch.randn(b, n, hkv, d, device="cuda", dtype=BF16, generator=gen) for _ in range(2))
            dout = torch.randn(b, n, hq, d, device="cuda", dtype=BF16, generator=gen)
            shards = [parallel.zigzag_shard(t).clone().requires_grad_(True) for t in (q, k, v)]
            out = parallel.attention(*shards, causal=causal, mode=mode)
            out.backward(parallel.zigzag_shard(dout))
            got = [parallel.zigzag_unshard(t) for t in (out.detach(), *(s.grad for s in shards))]
            full = [t.clone().requires_grad_(True) for t in (q, k, v)]
            want_out = flash3.flash_attn_func(*full, causal=causal)
            want_out.backward(dout)
            want = [want_out.detach(), *(t.grad for t in full)]
            errors[(mode, causal)] = max(_relative_error(g, w) for g, w in zip(got, want))
    # Packed documents, each sharded zig-zag on its own.
    for mode, causal in ((m, c) for m in parallel.MODES for c in (False, True)):
        gen = torch.Generator(device="cuda").manual_seed(8)
        lengths = [2 * world * n for n in (300, 64, 900, 5)]
        cu = torch.tensor([0] + lengths, device="cuda").cumsum(0).to(torch.int32)
        total, hq, hkv, d = sum(lengths), 8, 2, 128
        q = torch.randn(total, hq, d, device="cuda", dtype=BF16, generator=gen)
        k, v = (torch.randn(total, hkv, d, device="cuda", dtype=BF16, generator=gen) for _ in range(2))
        dout = torch.randn(total, hq, d, device="cuda", dtype=BF16, generator=gen)
        shards = []
        for t in (q, k, v):
            shard, cu_local, longest = parallel.zigzag_shard_varlen(t, cu)
            shards.append(shard.clone().requires_grad_(True))
        out = parallel.attention_varlen(*shards, cu_local, longest, causal=causal, mode=mode)
        out.backward(parallel.zigzag_shard_varlen(dout, cu)[0])
        got = [parallel.zigzag_unshard_varlen(t, cu) for t in (out.detach(), *(s.grad for s in shards))]
        full = [t.clone().requires_grad_(True) for t in (q, k, v)]
        want_out = flash3.flash_attn_varlen_func(*full, cu, cu, max(lengths), max(lengths), causal=causal)
        want_out.backward(dout)
        want = [want_out.detach(), *(t.grad for t in full)]
        errors[("varlen " + mode, causal)] = max(_relative_error(g, w) for g, w in zip(got, want))
    # Ranks that disagree: rank 1 shards one chunk more.
    x = torch.zeros(1, 4 + 2 * rank, 2, 64, device="cuda", dtype=BF16)
    try:
        parallel.attention(x, x, x)
        errors["disagreement"] = "no error"
    except ValueError as e:
        errors["disagreement"] = str(e).split(":")[0]
    if rank == 0:
        results.put(errors)
    dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 4])
def test_context_parallel_equals_one_gpu(gpu, world):
    if torch.cuda.device_count() < world:
        pytest.skip(f"needs {world} GPUs, {torch.cuda.device_count()} here")
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(_worker, args=(world, os.path.join(tmp, "init"), results), nprocs=world, join=True,
                           start_method="spawn")
    errors = results.get(timeout=120)
    assert errors.pop("disagreement") == "group"
    # bf16 outputs and gradients: the blocks' merge and the float32
    # accumulators against one kernel over the whole sequence.
    bad = {case: e for case, e in errors.items() if not e < 2.0 ** -6}
    assert not bad, bad
