"""A few small packed (varlen) calls for compute-sanitizer's racecheck, whose
run over the full varlen tests outlasts a device call: both passes in bf16
(causal, a window, softcap with sinks, GQA, seqused, empty and partial
sequences) and the FP8 forward (where V's head dim is Q's). Exits non-zero on
a NaN in what it checks.

    compute-sanitizer --tool racecheck python3 scripts/sanitize_varlen.py [head dim (D or D/DV) ...]
"""
import sys

import torch

import flash3

lengths = [300, 0, 1, 129, 700, 77]
cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
total, longest = sum(lengths), max(lengths)
seqused = torch.tensor([min(n, 250) for n in lengths], dtype=torch.int32, device="cuda")
gen = torch.Generator(device="cuda").manual_seed(37)
cases = [
    dict(causal=True),
    dict(window_size=(90, 30)),
    dict(causal=True, softcap=2.0, sinks=True),
    dict(causal=False, seqused=True),
]


def head_dims(arg):
    """(Q's, V's) head dims of "D" or "D/DV"."""
    d, _, dv = arg.partition("/")
    return int(d), int(dv or d)


for d, dv in [head_dims(a) for a in sys.argv[1:]] or [(h, h) for h in (64, 128, 256)]:
    for case in cases:
        q = torch.randn(total, 4, d, device="cuda", dtype=torch.bfloat16, generator=gen, requires_grad=True)
        k = torch.randn(total, 2, d, device="cuda", dtype=torch.bfloat16, generator=gen, requires_grad=True)
        v = torch.randn(total, 2, dv, device="cuda", dtype=torch.bfloat16, generator=gen, requires_grad=True)
        sinks = torch.randn(4, device="cuda", generator=gen, requires_grad=True) if case.get("sinks") else None
        used = seqused if case.get("seqused") else None
        out = flash3.flash_attn_varlen_func(q, k, v, cu, cu, longest, longest, seqused_q=used, seqused_k=used,
                                            causal=case.get("causal", False),
                                            window_size=case.get("window_size", (-1, -1)),
                                            softcap=case.get("softcap", 0.0), sinks=sinks)
        out.float().square().sum().backward()
        assert not q.grad.isnan().any(), (d, case)
    if dv != d:
        continue
    q8, k8, v8 = (torch.randn(total, h, d, device="cuda", generator=gen).to(torch.float8_e4m3fn) for h in (4, 2, 2))
    one = torch.ones(1, device="cuda")
    out = flash3.flash_attn_varlen_func(q8, k8, v8, cu, cu, longest, longest, causal=True, q_descale=one,
                                        k_descale=one, v_descale=one)
    assert not out.float().isnan().any(), d
torch.cuda.synchronize()
print("sanitize_varlen: done")
