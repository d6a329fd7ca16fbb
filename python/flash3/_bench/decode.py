"""The decoding benchmark (python -m flash3.benchmark --decode): one new query
a sequence against a full KV cache, issue 35's sweep, flash3 beside SDPA's
backends (and FlashAttention-3's flash_attn_with_kvcache where importable),
timed alike in one process.

Decoding reads each key and value once and does little else, so the measure
is bandwidth: the bytes of K and V (batch x cache x heads_kv x head_dim x 2
tensors x 2 bytes) over the call's time. flash3 runs on the contiguous cache,
on paged copies of it (pages in random order), with an append of one new
token with rotary embedding (attending to the same number of keys) and on an
e4m3 copy (per-tensor descales; its GB/s counts its own, half as many,
bytes, and it is checked against its dequantized values); the peers
get the cache in their own layout ([batch, heads_kv, cache, head_dim] for
SDPA, enable_gqa). Every method is checked against a float32 reference on
batch entry 0 before it is timed.
"""
import statistics

from . import decode_table
from .methods import timed


def inputs(torch, batch, cache, heads_kv=decode_table.HEADS_KV, hdim=decode_table.HDIM, seed=0):
    """q [batch, 1, heads_q, hdim] and a full cache k, v [batch, cache, heads_kv, hdim], bf16, seeded."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    k, v = (torch.randn(batch, cache, heads_kv, hdim, generator=gen, device="cuda", dtype=torch.bfloat16)
            for _ in range(2))
    q = torch.randn(batch, 1, heads_kv * decode_table.GROUP, hdim, generator=gen, device="cuda",
                    dtype=torch.bfloat16)
    return q, k, v


def _paged(torch, k, v, page_size, seed):
    """k and v as pools of pages in a seeded random order, and the page table."""
    batch, cache = k.shape[:2]
    pages = batch * cache // page_size
    order = torch.randperm(pages, generator=torch.Generator().manual_seed(seed)).cuda()
    pool = []
    for t in (k, v):
        p = torch.empty((pages, page_size) + tuple(t.shape[2:]), device="cuda", dtype=t.dtype)
        p[order] = t.reshape(pages, page_size, *t.shape[2:])
        pool.append(p)
    return pool[0], pool[1], order.view(batch, cache // page_size).to(torch.int32)


def _reference(torch, q0, k0, v0):
    """float32 attention of entry 0's queries q0 [heads_q, d] over its cache k0, v0 [cache, heads_kv, d]:
    (exact, with S and P rounded to bfloat16, the precision the kernels work in)."""
    group = q0.shape[0] // k0.shape[1]
    k0, v0 = k0.repeat_interleave(group, 1), v0.repeat_interleave(group, 1)
    scale = q0.shape[-1] ** -0.5
    exact = torch.einsum("hd,shd->hs", q0.float(), k0.float()).mul(scale).softmax(-1)
    out = torch.einsum("hs,shd->hd", exact, v0.float())
    s = torch.einsum("hd,shd->hs", q0, k0).float().mul(scale)
    low = torch.einsum("hs,shd->hd", s.softmax(-1).to(q0.dtype), v0).float()
    return out, low


def _rotary_tables(torch, positions, rotary_dim, dtype):
    angle = torch.arange(positions, device="cuda")[:, None] * 10000.0 ** (
        -torch.arange(rotary_dim // 2, device="cuda") / (rotary_dim // 2))
    return angle.cos().to(dtype), angle.sin().to(dtype)


def _rotated(torch, x, cos, sin):
    """GPT-NeoX rotary (pairs (i, i + rotary_dim / 2)) of x [..., d] by one position's tables [rotary_dim / 2],
    in float32 and rounded once to x's dtype, as the append kernel does."""
    half = cos.shape[-1]
    x1, x2, c, s = x[..., :half].float(), x[..., half:2 * half].float(), cos.float(), sin.float()
    return torch.cat([x1 * c - x2 * s, x1 * s + x2 * c, x[..., 2 * half:].float()], -1).to(x.dtype)


def _e4m3(torch, x):
    """x quantized to e4m3 with one float32 descale (from its largest magnitude)."""
    descale = (x.abs().amax().float() / 448).clamp(min=1e-12).reshape(1)
    return (x.float() / descale).to(torch.float8_e4m3fn), descale


def _fp8_reference(torch, q0, k0, v0):
    """float32 attention of dequantized e4m3 inputs (entry 0's, as _reference takes them): exact, and with P
    rounded to e4m3 as the FP8 kernels' PV GEMM reads it."""
    group = q0.shape[0] // k0.shape[1]
    k0, v0 = k0.repeat_interleave(group, 1), v0.repeat_interleave(group, 1)
    s = torch.einsum("hd,shd->hs", q0, k0).mul(q0.shape[-1] ** -0.5)
    exact = torch.einsum("hs,shd->hd", s.softmax(-1), v0)
    low = torch.einsum("hs,shd->hd", s.softmax(-1).to(torch.float8_e4m3fn).float(), v0)
    return exact, low


def _checked(torch, fn, reference):
    """None, or why fn's entry 0 is off the reference (flash3-bench's rule: 2x the bf16 reference's error + 1e-5)."""
    out = fn()[0, 0].float()
    exact, low = reference
    if not torch.isfinite(out).all():
        return "O: NaN or inf"
    err, base = (out - exact).abs().max().item(), (low - exact).abs().max().item()
    return None if err <= 2 * base + 1e-5 else f"O: max error {err:.2e} above 2x bf16's {base:.2e} + 1e-5"


def methods_of(torch, q, k, v, page_sizes, seed):
    """(name, make, reference) triples: make() builds the method's inputs and returns its call (or raises: the
    method has no kernel here), lazily, so that one copy of the cache lives at a time; reference is entry 0's
    (exact, low) for the check. The append runs last: it writes the cache's last row."""
    import flash3
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    lens = torch.full((q.shape[0],), k.shape[1], dtype=torch.int32, device="cuda")
    plain = _reference(torch, q[0, 0], k[0], v[0])

    def contiguous():
        return lambda: flash3.flash_attn_with_kvcache(q, k, v, cache_seqlens=lens)

    def paged(page_size):
        def make():
            kp, vp, table = _paged(torch, k, v, page_size, seed)
            return lambda: flash3.flash_attn_with_kvcache(q, kp, vp, cache_seqlens=lens, page_table=table)
        return make

    def sdpa(backend):
        def make():
            qs, ks, vs = q.transpose(1, 2), k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()

            def call():
                with sdpa_kernel([backend]):
                    return F.scaled_dot_product_attention(qs, ks, vs, enable_gqa=True).transpose(1, 2)
            return call
        return make

    fp8 = {}

    def e4m3():
        (q8, qs), (k8, ks), (v8, vs) = (_e4m3(torch, t) for t in (q, k, v))
        fp8["reference"] = _fp8_reference(torch, q8[0, 0].float() * qs, k8[0].float() * ks, v8[0].float() * vs)
        return lambda: flash3.flash_attn_with_kvcache(q8, k8, v8, cache_seqlens=lens, q_descale=qs, k_descale=ks,
                                                      v_descale=vs)

    def fa3():
        import flash_attn_interface
        return lambda: flash_attn_interface.flash_attn_with_kvcache(q, k, v, cache_seqlens=lens)

    # The appended token is the cache's last row, rotated (GPT-NeoX) at its position, as is the query: the
    # same number of keys as the plain call, and that row written on every call.
    last = k.shape[1] - 1
    cos, sin = _rotary_tables(torch, k.shape[1], q.shape[-1], q.dtype)
    k_new, v_new = k[:, last:].clone(), v[:, last:].clone()
    k0 = k[0].clone()
    k0[last] = _rotated(torch, k_new[0, 0], cos[last], sin[last])
    appended = _reference(torch, _rotated(torch, q[0, 0], cos[last], sin[last]), k0, v[0])
    del k0

    def append_rotary():
        return lambda: flash3.flash_attn_with_kvcache(q, k, v, k=k_new, v=v_new, rotary_cos=cos, rotary_sin=sin,
                                                      cache_seqlens=lens - 1, rotary_interleaved=False)

    methods = [("flash3", contiguous, plain)]
    methods += [(f"flash3 paged {p}", paged(p), plain) for p in page_sizes]
    methods += [("sdpa_cudnn", sdpa(SDPBackend.CUDNN_ATTENTION), plain),
                ("sdpa_flash", sdpa(SDPBackend.FLASH_ATTENTION), plain), ("fa3", fa3, plain),
                (decode_table.FP8, e4m3, lambda: fp8["reference"]),
                ("flash3 append+rotary", append_rotary, appended)]
    return methods


def run(torch, timer, args, out):
    """Times the sweep; returns the rows (dicts: the shape, each method's GB/s or why it has none)."""
    rows = []
    shapes = decode_table.decode_shapes(args.decode_batch, args.decode_cache)
    for i, (batch, cache) in enumerate(shapes):
        q, k, v = inputs(torch, batch, cache, seed=100 + i)
        kv_bytes = decode_table.kv_bytes(batch, cache)
        row = {"batch": batch, "cache": cache, "heads_q": q.shape[2], "heads_kv": k.shape[2], "hdim": k.shape[3],
               "kv_bytes": kv_bytes, "gbps": {}, "not_run": {}}
        for name, make, reference in methods_of(torch, q, k, v, args.page_size, seed=i):
            def check(fn, reference=reference):
                return _checked(torch, fn, reference() if callable(reference) else reference)
            samples, why = timed(timer, make, check if args.check else None)
            if samples is None:
                row["not_run"][name] = why
            else:
                row["gbps"][name] = decode_table.kv_bytes(batch, cache, element=decode_table.element_bytes(name)) \
                    / statistics.median(samples) / 1e6
            torch.cuda.empty_cache()
        rows.append(row)
        print(f"[{i + 1}/{len(shapes)}] decode {batch} x {cache}: "
              + ", ".join(f"{n} {g:.0f}" for n, g in row["gbps"].items()), file=out, flush=True)
        del q, k, v
        torch.cuda.empty_cache()
    return rows
