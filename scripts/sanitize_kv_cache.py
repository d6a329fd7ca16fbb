"""A few small KV cache calls for compute-sanitizer (memcheck, racecheck,
synccheck): decoding packed and not, causal chunks, contiguous and paged
caches (pages of 16 and 64 in a shuffled order), 1 to 3 splits, cache_batch_idx
and leftpad, appends with and without rotary; bf16, and an e4m3 cache with
per-tensor and per-head descales; MLA's calls (qv) alike. Exits non-zero on a
NaN in an output.

    compute-sanitizer --tool racecheck python3 scripts/sanitize_kv_cache.py [head dim ...]
"""
import sys

import torch

import flash3

E4M3 = torch.float8_e4m3fn
CAPACITY = 256
gen = torch.Generator(device="cuda").manual_seed(35)
# (batch, seqlen_q, heads_q, heads_kv, cache lengths, num_splits, page size, FP8 Q descale shape or None)
cases = [
    (3, 1, 8, 2, [0, 77, 250], 0, 0, None),
    (3, 1, 8, 2, [5, 130, 256], 3, 64, None),
    (2, 5, 8, 2, [5, 200], 2, 16, None),
    (3, 1, 8, 2, [0, 77, 250], 0, 0, (1,)),
    (3, 1, 8, 2, [5, 130, 256], 3, 64, (3, 2)),
    (2, 5, 8, 2, [5, 200], 2, 16, (2, 8)),
    (2, 5, 4, 4, [17, 256], 1, 0, (1,)),
]


def tensor(*shape, fp8):
    x = torch.randn(*shape, device="cuda", generator=gen)
    return x.to(E4M3) if fp8 else x.to(torch.bfloat16)


for d in [int(a) for a in sys.argv[1:]] or [64, 128, 256]:
    for batch, sq, hq, hkv, lens, splits, page, q_scale in cases:
        fp8 = q_scale is not None
        q, k, v = tensor(batch, sq, hq, d, fp8=fp8), tensor(batch, CAPACITY, hkv, d, fp8=fp8), \
            tensor(batch, CAPACITY, hkv, d, fp8=fp8)
        seqlens = torch.tensor(lens, dtype=torch.int32, device="cuda")
        kw = dict(causal=True, num_splits=splits)
        if fp8:
            one = torch.ones(1, device="cuda")
            kw.update(q_descale=torch.rand(q_scale, device="cuda", generator=gen) + 0.5, k_descale=one, v_descale=one)
        if page:
            pages = batch * CAPACITY // page
            table = torch.randperm(pages, device="cuda", generator=gen).int().view(batch, CAPACITY // page)
            out = flash3.flash_attn_with_kvcache(q, k.view(pages, page, hkv, d), v.view(pages, page, hkv, d),
                                                 cache_seqlens=seqlens, page_table=table, **kw)
        else:
            # Entries read in reverse order from a leftpad on, then an append (rotated in bf16).
            idx = torch.arange(batch - 1, -1, -1, dtype=torch.int32, device="cuda")
            pad = torch.tensor([min(n, 3) for n in lens], dtype=torch.int32, device="cuda")
            out = flash3.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens, cache_batch_idx=idx,
                                                 cache_leftpad=pad, **kw)
            assert not out.float().isnan().any(), (d, lens, fp8)
            new_k, new_v = tensor(batch, 2, hkv, d, fp8=fp8), tensor(batch, 2, hkv, d, fp8=fp8)
            rotary = {}
            if not fp8:
                angle = torch.arange(CAPACITY, device="cuda")[:, None] * 0.01 * torch.arange(d // 2, device="cuda")
                rotary = dict(rotary_cos=angle.cos().bfloat16(), rotary_sin=angle.sin().bfloat16())
            out = flash3.flash_attn_with_kvcache(q, k, v, new_k, new_v, cache_seqlens=seqlens.clamp(max=CAPACITY - 2),
                                                 **rotary, **kw)
        assert not out.float().isnan().any(), (d, lens, fp8)
# MLA (qv): 64 rotary and 512 latent columns, packed decoding (16 heads on
# one KV head), causal chunks of 3 rows, pages of 64, splits, an append with
# rotary.
for batch, sq, hq, lens, splits, page in [(3, 1, 16, [0, 77, 250], 0, 0), (2, 1, 16, [5, 256], 3, 64),
                                          (2, 3, 4, [3, 200], 2, 0)]:
    q, qv = tensor(batch, sq, hq, 64, fp8=False), tensor(batch, sq, hq, 512, fp8=False)
    k, v = tensor(batch, CAPACITY, 1, 64, fp8=False), tensor(batch, CAPACITY, 1, 512, fp8=False)
    seqlens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    kw = dict(qv=qv, causal=True, num_splits=splits)
    if page:
        pages = batch * CAPACITY // page
        table = torch.randperm(pages, device="cuda", generator=gen).int().view(batch, CAPACITY // page)
        out = flash3.flash_attn_with_kvcache(q, k.view(pages, page, 1, 64), v.view(pages, page, 1, 512),
                                             cache_seqlens=seqlens, page_table=table, **kw)
    else:
        angle = torch.arange(CAPACITY, device="cuda")[:, None] * 0.01 * torch.arange(32, device="cuda")
        out = flash3.flash_attn_with_kvcache(q, k, v, tensor(batch, 1, 1, 64, fp8=False),
                                             tensor(batch, 1, 1, 512, fp8=False), rotary_cos=angle.cos().bfloat16(),
                                             rotary_sin=angle.sin().bfloat16(),
                                             cache_seqlens=seqlens.clamp(max=CAPACITY - 1), **kw)
    assert not out.float().isnan().any(), ("mla", lens)
torch.cuda.synchronize()
print("sanitize_kv_cache: done")
