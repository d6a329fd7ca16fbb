"""The chunked prefill benchmark (python -m flash3.benchmark --prefill): a
chunk of a prompt's queries against a KV cache that ends with the chunk's own
keys, causal, aligned bottom-right, GQA 32 / 8, head dim 128, bf16, batch 1
(prefill_table.py: shapes, FLOPs, target). flash3's KV cache call (contiguous
and paged) beside flash_attn_func on the same tensors, the same work, timed
alike in one process; each checked against a float32 reference on the first
KV head's query heads before it is timed.
"""
from . import prefill_table
from .decode import _paged
from .methods import time_methods

BATCH, PAGE_SIZE, ROWS = 1, 256, 256


def _inputs(torch, chunk, cache, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(BATCH, chunk, prefill_table.HEADS_KV * prefill_table.GROUP, prefill_table.HDIM,
                    generator=gen, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(BATCH, cache, prefill_table.HEADS_KV, prefill_table.HDIM, generator=gen, device="cuda",
                        dtype=torch.bfloat16) for _ in range(2))
    return q, k, v


def _checked(torch, out, q, k, v):
    """None, or why out's first KV head's query heads are off the float32 reference (flash3-bench's rule: 2x the
    error of the same attention with S and P rounded to bfloat16, + 1e-5), computed ROWS queries at a time."""
    chunk, cache, group = q.shape[1], k.shape[1], prefill_table.GROUP
    scale = q.shape[-1] ** -0.5
    k0, v0 = k[0, :, 0], v[0, :, 0]
    err = base = 0.0
    for r in range(0, chunk, ROWS):
        qb = q[0, r:r + ROWS, :group].transpose(0, 1)  # [group, rows, d]
        # Query r + i sees keys up to cache - chunk + r + i.
        visible = torch.arange(cache, device="cuda")[None, :] <= (
            cache - chunk + r + torch.arange(qb.shape[1], device="cuda")[:, None])
        s = torch.einsum("hqd,kd->hqk", qb.float(), k0.float()).mul(scale).masked_fill(~visible, float("-inf"))
        exact = torch.einsum("hqk,kd->hqd", s.softmax(-1), v0.float())
        s = torch.einsum("hqd,kd->hqk", qb, k0).float().mul(scale).masked_fill(~visible, float("-inf"))
        low = torch.einsum("hqk,kd->hqd", s.softmax(-1).to(q.dtype), v0).float()
        got = out[0, r:r + ROWS, :group].transpose(0, 1).float()
        if not torch.isfinite(got).all():
            return "O: NaN or inf"
        err = max(err, (got - exact).abs().max().item())
        base = max(base, (low - exact).abs().max().item())
    return None if err <= 2 * base + 1e-5 else f"O: max error {err:.2e} above 2x bf16's {base:.2e} + 1e-5"


def _check_of(torch, q, k, v):
    """The check of a method's call on these inputs (timed's)."""
    return lambda fn: _checked(torch, fn(), q, k, v)


def _methods(torch, q, k, v, seed):
    """(name, make) pairs: make() builds the method's inputs and returns its call, lazily (one paged copy at a
    time)."""
    import flash3
    lens = torch.full((q.shape[0],), k.shape[1], dtype=torch.int32, device="cuda")

    def contiguous():
        return lambda: flash3.flash_attn_with_kvcache(q, k, v, cache_seqlens=lens, causal=True)

    def paged():
        kp, vp, table = _paged(torch, k, v, PAGE_SIZE, seed)
        return lambda: flash3.flash_attn_with_kvcache(q, kp, vp, cache_seqlens=lens, page_table=table, causal=True)

    def plain():
        return lambda: flash3.flash_attn_func(q, k, v, causal=True)

    return [("flash3", contiguous), (f"flash3 paged {PAGE_SIZE}", paged), ("plain", plain)]


def run(torch, timer, args, out):
    """Times the sweep; returns the rows (dicts: the shape, each method's TFLOP/s or why it has none)."""
    rows = []
    shapes = prefill_table.prefill_shapes(args.prefill_chunk, args.prefill_cache)
    for i, (chunk, cache) in enumerate(shapes):
        q, k, v = _inputs(torch, chunk, cache, seed=200 + i)
        flops = prefill_table.flops(BATCH, chunk, cache)
        tflops, not_run = time_methods(torch, timer, _methods(torch, q, k, v, seed=i),
                                       _check_of(torch, q, k, v) if args.check else None, lambda _, ms: flops / ms / 1e9)
        row = {"batch": BATCH, "chunk": chunk, "cache": cache, "heads_q": q.shape[2], "heads_kv": k.shape[2],
               "hdim": k.shape[3], "flops": flops, "tflops": tflops, "not_run": not_run}
        rows.append(row)
        print(f"[{i + 1}/{len(shapes)}] prefill {chunk} against {cache}: "
              + ", ".join(f"{n} {t:.1f}" for n, t in row["tflops"].items()), file=out, flush=True)
        del q, k, v
        torch.cuda.empty_cache()
    return rows
