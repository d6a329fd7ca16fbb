"""The MLA decoding benchmark (python -m flash3.benchmark --mla): one token a
sequence, 128 query heads against one latent KV head (mla_table.py: shapes,
counts, targets). flash3's flash_attn_with_kvcache with qv on the contiguous
cache, on a paged copy (pages of 64 in random order) and with two causal
tokens a sequence (speculative decoding; its last token checked), beside FlashMLA
(flash_mla) and FlashAttention-3's qv where importable, timed alike in one
process; each checked against a float32 reference on batch entry 0 first.
"""
from . import mla_table
from .decode import _paged
from .methods import time_methods


def _inputs(torch, batch, cache, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    rnd = lambda *shape: torch.randn(*shape, generator=gen, device="cuda", dtype=torch.bfloat16)  # noqa: E731
    q, qv = rnd(batch, 1, mla_table.HEADS_Q, mla_table.HDIM), rnd(batch, 1, mla_table.HEADS_Q, mla_table.HDIM_V)
    k, v = rnd(batch, cache, mla_table.HEADS_KV, mla_table.HDIM), rnd(batch, cache, mla_table.HEADS_KV,
                                                                        mla_table.HDIM_V)
    return q, qv, k, v


def _reference(torch, q, qv, k, v):
    """Entry 0's float32 attention (exact, and with S and P rounded to bfloat16): O [heads, 512]."""
    qc, kc = torch.cat((q[0, 0], qv[0, 0]), -1), torch.cat((k[0, :, 0], v[0, :, 0]), -1)
    scale = qc.shape[-1] ** -0.5
    exact = (qc.float() @ kc.float().T * scale).softmax(-1) @ v[0, :, 0].float()
    low = ((qc @ kc.T).float() * scale).softmax(-1).to(q.dtype) @ v[0, :, 0]
    return exact, low.float()


def _checked(torch, out, reference):
    """None, or why entry 0 is off the reference (flash3-bench's rule: 2x the bf16 reference's error + 1e-5)."""
    got, (exact, low) = out[0, 0].float(), reference
    if not torch.isfinite(got).all():
        return "O: NaN or inf"
    err, base = (got - exact).abs().max().item(), (low - exact).abs().max().item()
    return None if err <= 2 * base + 1e-5 else f"O: max error {err:.2e} above 2x bf16's {base:.2e} + 1e-5"


def _methods(torch, q, qv, k, v, seed):
    """(name, make) pairs: make() builds the method's inputs and returns its call (or raises: no kernel here)."""
    import flash3
    lens = torch.full((q.shape[0],), k.shape[1], dtype=torch.int32, device="cuda")

    def contiguous():
        return lambda: flash3.flash_attn_with_kvcache(q, k, v, qv=qv, cache_seqlens=lens)

    def paged():
        kp, vp, table = _paged(torch, k, v, mla_table.PAGE_SIZE, seed)
        return lambda: flash3.flash_attn_with_kvcache(q, kp, vp, qv=qv, cache_seqlens=lens, page_table=table)

    def flash_mla():
        import flash_mla
        kp, vp, table = _paged(torch, k, v, mla_table.PAGE_SIZE, seed)
        cache = torch.cat((vp, kp), -1)  # FlashMLA's layout: latent, then rotary
        q576 = torch.cat((qv, q), -1)
        meta, splits = flash_mla.get_mla_metadata(lens, q.shape[2] // k.shape[2], k.shape[2])
        return lambda: flash_mla.flash_mla_with_kvcache(q576, cache, table, lens, mla_table.HDIM_V, meta, splits)[0]

    def fa3():
        import flash_attn_interface
        return lambda: flash_attn_interface.flash_attn_with_kvcache(q, k, v, qv=qv, cache_seqlens=lens)

    def two_tokens():
        # A new token before each sequence's query: the query is the last token, seeing every key.
        gen = torch.Generator(device="cuda").manual_seed(seed)
        q2, qv2 = (torch.cat((torch.randn(t.shape, generator=gen, device="cuda", dtype=t.dtype), t), 1)
                   for t in (q, qv))
        return lambda: flash3.flash_attn_with_kvcache(q2, k, v, qv=qv2, cache_seqlens=lens, causal=True)[:, 1:]

    return [("flash3", contiguous), (f"flash3 paged {mla_table.PAGE_SIZE}", paged), ("flash_mla", flash_mla),
            ("fa3", fa3), (mla_table.SPECULATIVE, two_tokens)]


def run(torch, timer, args, out):
    """Times the sweep; returns the rows (dicts: the shape, each method's TFLOP/s or why it has none)."""
    rows = []
    shapes = mla_table.mla_shapes(args.mla_batch, args.mla_cache)
    for i, (batch, cache) in enumerate(shapes):
        q, qv, k, v = _inputs(torch, batch, cache, seed=300 + i)
        reference = _reference(torch, q, qv, k, v)
        flops = mla_table.flops(batch, cache)
        check = (lambda fn: _checked(torch, fn(), reference)) if args.check else None
        tflops, not_run = time_methods(
            torch, timer, _methods(torch, q, qv, k, v, seed=i), check,
            lambda name, ms: mla_table.flops(batch, cache, seqlen_q=mla_table.TOKENS.get(name, 1)) / ms / 1e9)
        rows.append({"batch": batch, "cache": cache, "heads_q": q.shape[2], "heads_kv": k.shape[2],
                     "hdim": k.shape[3], "hdim_v": v.shape[3], "flops": flops,
                     "kv_bytes": mla_table.kv_bytes(batch, cache), "tflops": tflops, "not_run": not_run})
        print(f"[{i + 1}/{len(shapes)}] MLA {batch} x {cache}: " + ", ".join(f"{n} {t:.0f}" for n, t in tflops.items()),
              file=out, flush=True)
        del q, qv, k, v
        torch.cuda.empty_cache()
    return rows
