"""The variable-length benchmark (python -m flash3.benchmark --varlen): packed
sequences through flash_attn_varlen_func beside flash3's fixed-length kernel,
timed alike in one process.

  equal   every sequence of one length, the sweep's: the packed call against
          flash_attn_func on the same tokens as [batch, seqlen]
  mix     `tokens` tokens of documents of seeded log-uniform lengths in
          [MIX_LOW, MIX_HIGH]: TFLOP/s of their real FLOPs, against
          flash_attn_func at the token-weighted mean length (the same FLOPs);
          and the same documents through SDPA: cuDNN on the batch padded to
          the longest, and SDPA on a jagged nested tensor (not in e4m3: SDPA
          has no FP8 attention)

e4m3 (the forward only) quantizes the inputs with one scale per tensor.
"""
import statistics

from . import packing, sweep

MIX_LOW, MIX_HIGH, MIX_SEED = 128, 8192, 34


def _inputs(torch, tokens, heads, hdim, dtype, grad, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn(tokens, heads, hdim, generator=gen, device="cuda", dtype=torch.bfloat16).to(dtype)
               .requires_grad_(grad) for _ in range(3))
    dout = torch.randn(tokens, heads, hdim, generator=gen, device="cuda", dtype=dtype) if grad else None
    return q, k, v, dout


def _workload(torch, attention, pass_, q, k, v, dout):
    """What is timed: the forward, or the backward of one kept forward."""
    if pass_ == "fwd":
        return lambda: attention(q, k, v)
    out = attention(q, k, v)
    return lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)


def _tflops(timer, fn, flops):
    samples, _ = timer.measure(fn)
    ms = statistics.median(samples)
    return flops / ms / 1e9, ms


def _cudnn_packed(torch, lengths, causal):
    """SDPA under the cuDNN-only context on the packed documents: (on a
    jagged nested tensor, on the batch padded to its longest document). The
    padded call's output is not the packed one's (its padding is attended):
    it is timed for its cost, counted in the real FLOPs."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    offsets = torch.tensor(packing.cu_seqlens(lengths), device="cuda", dtype=torch.int64)

    def jagged(q, k, v):
        nt = [torch.nested.nested_tensor_from_jagged(t, offsets).transpose(1, 2) for t in (q, k, v)]
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return F.scaled_dot_product_attention(*nt, is_causal=causal).transpose(1, 2).values()

    longest = max(lengths)
    # The packed rows' places in the padded batch, to give O back packed (the
    # backward's dO is).
    rows = torch.cat([b * longest + torch.arange(n, device="cuda") for b, n in enumerate(lengths)])

    def padded(q, k, v):
        def pad(t):
            return torch.nested.nested_tensor_from_jagged(t, offsets).to_padded_tensor(0.0, (
                len(lengths), longest, t.shape[1], t.shape[2])).transpose(1, 2)
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            out = F.scaled_dot_product_attention(pad(q), pad(k), pad(v), is_causal=causal)
        return out.transpose(1, 2).flatten(0, 1)[rows]

    return jagged, padded


def run(torch, timer, args, out):
    """Prints the two tables; returns the rows (dicts) for the JSON."""
    import flash3
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "e4m3": torch.float8_e4m3fn}[args.dtype]
    passes = ("fwd", "bwd") if args.passes in ("all", "fwd+bwd") else (args.passes,)
    causal_list = {"0": (False,), "1": (True,), "both": (False, True)}[args.causal]
    rows = []
    # FP8: one descale per tensor, the same for both calls.
    one = torch.ones(1, device="cuda")
    scales = dict(q_descale=one, k_descale=one, v_descale=one) if args.dtype == "e4m3" else {}

    def varlen_call(lengths, causal):
        cu = torch.tensor(packing.cu_seqlens(lengths), dtype=torch.int32, device="cuda")
        longest = max(lengths)
        return lambda q, k, v: flash3.flash_attn_varlen_func(q, k, v, cu, cu, longest, longest, causal=causal,
                                                             **scales)

    def fixed_call(batch, seqlen, causal):
        return lambda q, k, v: flash3.flash_attn_func(*(t.view(batch, seqlen, *t.shape[1:]) for t in (q, k, v)),
                                                      causal=causal, **scales).flatten(0, 1)

    for hdim in args.hdim:
        heads = max(1, args.hidden // hdim)
        for causal in causal_list:
            for pass_ in passes:
                grad = pass_ != "fwd"
                for seqlen in args.seqlen:
                    batch = max(1, args.tokens // seqlen)
                    q, k, v, dout = _inputs(torch, batch * seqlen, heads, hdim, dtype, grad, seed=seqlen + hdim)
                    flops = sweep.attention_flops(pass_, hdim, causal, batch, seqlen, heads)
                    fixed, _ = _tflops(timer, _workload(torch, fixed_call(batch, seqlen, causal), pass_, q, k, v, dout),
                                       flops)
                    packed, _ = _tflops(timer, _workload(torch, varlen_call([seqlen] * batch, causal), pass_, q, k, v,
                                                         dout), flops)
                    rows.append({"workload": "equal", "pass": pass_, "dtype": args.dtype, "hdim": hdim,
                                 "causal": causal, "seqlen": seqlen,
                                 "batch": batch, "heads": heads, "fixed": fixed, "varlen": packed,
                                 "ratio": packed / fixed})
                    print(f"equal {pass_} hdim {hdim} causal {int(causal)} {batch} x {seqlen}: fixed {fixed:.1f}, "
                          f"varlen {packed:.1f}, {packed / fixed:.3f}", file=out, flush=True)
                lengths = packing.log_uniform_lengths(args.tokens, MIX_LOW, MIX_HIGH, MIX_SEED)
                mean = packing.token_weighted_mean(lengths)
                seqlen = max(128, int(round(mean / 128)) * 128)
                batch = max(1, args.tokens // seqlen)
                q, k, v, dout = _inputs(torch, sum(lengths), heads, hdim, dtype, grad, seed=7 + hdim)
                flops = packing.packed_flops(pass_, hdim, causal, heads, lengths)
                packed, _ = _tflops(timer, _workload(torch, varlen_call(lengths, causal), pass_, q, k, v, dout), flops)
                fq, fk, fv, fdout = _inputs(torch, batch * seqlen, heads, hdim, dtype, grad, seed=8 + hdim)
                fixed, _ = _tflops(timer, _workload(torch, fixed_call(batch, seqlen, causal), pass_, fq, fk, fv, fdout),
                                   sweep.attention_flops(pass_, hdim, causal, batch, seqlen, heads))
                # SDPA on the same batch both ways: which backend runs a nested
                # tensor under the cuDNN-only context is PyTorch's choice, the
                # padded one is cuDNN's kernel for certain.
                peers = dict.fromkeys(("jagged", "padded"), "SDPA has no FP8 attention")
                for name, call in zip(("jagged", "padded"), _cudnn_packed(torch, lengths, causal) if not scales else ()):
                    try:
                        peers[name], _ = _tflops(timer, _workload(torch, call, pass_, q, k, v, dout), flops)
                    except Exception as e:  # no kernel for this layout
                        peers[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
                rows.append({"workload": "mix", "pass": pass_, "dtype": args.dtype, "hdim": hdim, "causal": causal,
                             "documents": len(lengths),
                             "tokens": sum(lengths), "mean_length": mean, "fixed_seqlen": seqlen, "fixed_batch": batch,
                             "heads": heads, "fixed": fixed, "varlen": packed, "ratio": packed / fixed,
                             "sdpa_padded_cudnn": peers["padded"], "sdpa_jagged": peers["jagged"]})
                print(f"mix {pass_} hdim {hdim} causal {int(causal)}: {len(lengths)} documents, mean {mean:.0f}: "
                      f"varlen {packed:.1f}, fixed {batch} x {seqlen} {fixed:.1f}, {packed / fixed:.3f}; "
                      f"SDPA cuDNN padded {_num(peers['padded'])}, SDPA jagged {_num(peers['jagged'])}", file=out,
                      flush=True)
                del q, k, v, dout, fq, fk, fv, fdout
                torch.cuda.empty_cache()
    return rows


def _num(x):
    """A TFLOP/s, or n/a for a peer without a kernel (its reason in the JSON)."""
    return f"{x:.1f}" if isinstance(x, float) else "n/a"


def format_table(rows):
    """Markdown: the equal-length rows, then the mixes (SDPA on the same
    documents: cuDNN on the batch padded to its longest, its TFLOP/s of the
    real FLOPs; and on the jagged nested tensor)."""
    lines = ["| workload | pass | dtype | hdim | causal | shape | fixed TFLOP/s | varlen TFLOP/s | varlen/fixed "
             "| SDPA cuDNN padded | SDPA jagged |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["workload"] == "equal":
            shape, peers = f"{r['batch']} x {r['seqlen']}", " | "
        else:
            shape = (f"{r['documents']} documents, mean {r['mean_length']:.0f} "
                     f"(fixed {r['fixed_batch']} x {r['fixed_seqlen']})")
            peers = f"{_num(r['sdpa_padded_cudnn'])} | {_num(r['sdpa_jagged'])}"
        lines.append(f"| {r['workload']} | {r['pass']} | {r.get('dtype', 'bf16')} | {r['hdim']} | "
                     f"{'yes' if r['causal'] else 'no'} | {shape} | "
                     f"{r['fixed']:.1f} | {r['varlen']:.1f} | {r['ratio']:.3f} | {peers} |")
    return "\n".join(lines)
