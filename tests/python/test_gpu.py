"""flash3's Python package on a Hopper GPU with libflash3_c built; each test
skips, saying why, elsewhere ("no CUDA device", "libflash3_c not built ...").

Accuracy follows the C++ tests' rule (tests/gpu_test_util.h): against a
float64 reference (written out in PyTorch), flash3's max error is at most twice
that of a straightforward implementation in the same precision, plus a small
epsilon; the LSE within 1e-3 relative. FP8 is compared with the attention of
its dequantized inputs.
"""
import collections
import contextlib
import math
import random

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (flash3's Python package needs it)")


import flash3  # noqa: E402
from flash3 import _abi, interface  # noqa: E402
from transformer_block import Block  # noqa: E402

BF16, FP16, E4M3 = torch.bfloat16, torch.float16, torch.float8_e4m3fn


# ---- references -------------------------------------------------------------


def visible(seqlen_q, seqlen_k, causal, device, window=(-1, -1)):
    """[seqlen_q, seqlen_k] bool: whether query i sees key j (causal: j <= i +
    g, g = seqlen_k - seqlen_q, bottom-right aligned as in FlashAttention; a
    window (left, right): i + g - left <= j <= i + g + right, -1 unbounded)."""
    i = torch.arange(seqlen_q, device=device)[:, None]
    j = torch.arange(seqlen_k, device=device)[None, :]
    left, right = window[0], 0 if causal else window[1]
    seen = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=device)
    if right >= 0:
        seen &= j <= i + seqlen_k - seqlen_q + right
    if left >= 0:
        seen &= j >= i + seqlen_k - seqlen_q - left
    return seen


def _heads_first(q, k, v):
    """[batch, heads, seqlen, head_dim] views, K and V repeated over each
    group of query heads (GQA/MQA)."""
    group = q.shape[2] // k.shape[2]
    return (q.transpose(1, 2), k.repeat_interleave(group, 2).transpose(1, 2),
            v.repeat_interleave(group, 2).transpose(1, 2))


def _with_sinks(scores, sinks):
    """The scores with each head's sink as one more column."""
    b, h, sq, _ = scores.shape
    return torch.cat([scores, sinks.to(scores.dtype)[None, :, None, None].expand(b, h, sq, 1)], -1)


def _capped(scores, softcap):
    """Softcapping: softcap * tanh(scores / softcap); 0 is off."""
    return softcap * torch.tanh(scores / softcap) if softcap else scores


def reference(q, k, v, causal, scale, sinks=None, window=(-1, -1), softcap=0.0):
    """(out, lse) in float64, differentiable. A row that sees no key gives
    zeros (gradient zero) and an LSE of +inf, as flash3. With sinks, each
    head's sink joins the softmax as a column without a value (a row that
    sees no key then has its sink as LSE)."""
    qt, kt, vt = _heads_first(q.double(), k.double(), v.double())
    mask = visible(q.shape[1], k.shape[1], causal, q.device, window)
    scores = _capped((qt @ kt.transpose(-1, -2)) * scale, softcap)
    if sinks is not None:
        scores = _with_sinks(scores.masked_fill(~mask, -math.inf), sinks.double())
        lse = scores.logsumexp(-1)
        return (torch.exp(scores - lse[..., None])[..., :-1] @ vt).transpose(1, 2), lse
    empty = ~mask.any(-1)
    # An all-masked row would be NaN: it sees every key here, then is zeroed.
    scores = scores.masked_fill(~(mask | empty[:, None]), -math.inf)
    out = (torch.softmax(scores, -1) @ vt).masked_fill(empty[:, None], 0)
    return out.transpose(1, 2), scores.logsumexp(-1).masked_fill(empty, math.inf)


def straightforward(q, k, v, causal, scale, sinks=None, window=(-1, -1), softcap=0.0):
    """The attention as a plain implementation in q's dtype computes it (S,
    the capped S and P rounded to the dtype, the softmax in float32): the
    yardstick of the tolerance. Differentiable."""
    qt, kt, vt = _heads_first(q, k, v)
    s = _capped((qt @ kt.transpose(-1, -2)) * scale, softcap).float()
    s = s.masked_fill(~visible(q.shape[1], k.shape[1], causal, q.device, window), -math.inf)
    if sinks is not None:
        s = _with_sinks(s, sinks)
    p = torch.softmax(s, -1).nan_to_num(0.0)
    p = (p if sinks is None else p[..., :-1]).to(q.dtype)
    return (p @ vt).transpose(1, 2)


def max_err(x, ref):
    return (x.double() - ref.double()).abs().max().item() if x.numel() else 0.0


def check_output(name, got, ref, low):
    err, low_err = max_err(got, ref), max_err(low, ref)
    assert err <= 2 * low_err + 1e-5, f"{name}: flash3's max error {err:.3g}, a straightforward one's {low_err:.3g}"


def d_shift(q, k, out, ref_out, ref_lse, dout, causal, scale, window=(-1, -1), softcap=0.0):
    """Bounds of how far dQ and dK move from the float64 reference when D =
    rowsum(dO o O) is taken from flash3's rounded O, as every fused backward
    takes it: dS_ij moves by P_ij |delta D_i| at most (softcapping's slope is
    at most 1). Matters where a row's few keys carry all of P."""
    qt, kt, _ = _heads_first(q.double(), k.double(), k.double())
    scores = _capped((qt @ kt.transpose(-1, -2)) * scale, softcap)
    scores = scores.masked_fill(~visible(q.shape[1], k.shape[1], causal, q.device, window), -math.inf)
    p = torch.exp(scores - ref_lse.detach()[..., None]).nan_to_num(0.0)
    delta = (dout.double() * (out.double() - ref_out.detach())).sum(-1).transpose(1, 2).abs()
    moved = p * delta[..., None]
    dq = (moved @ kt.abs()) * scale
    group = q.shape[2] // k.shape[2]
    dk = ((moved.transpose(-1, -2) @ qt.abs()) * scale).unflatten(1, (k.shape[2], group)).sum(2)
    return dq.max().item() if dq.numel() else 0.0, dk.max().item() if dk.numel() else 0.0


def check_gradient(name, got, ref, low, slack=0.0):
    # Beyond twice the straightforward error: the rounding of the reference to
    # the dtype, and 1e-4 of the largest gradient (float32 accumulation), as
    # the C++ backward test's epsilon.
    # The rounding is taken at 0.3 at least (as FlashAttention's tests): a
    # gradient that cancels to zero exactly (one key: dS = P (dP - D) = 0) is
    # float32 noise in any kernel that computes dP and D apart.
    err, low_err = max_err(got, ref), max_err(low, ref)
    rounding = max_err((ref + 0.3).to(got.dtype).double() - 0.3, ref)
    bound = 2 * low_err + rounding + 1e-4 * ref.abs().max().item() + 1e-5 + slack
    assert err <= bound, f"{name}: flash3's max error {err:.3g}, bound {bound:.3g} (straightforward {low_err:.3g})"


def check_lse(lse, ref, slack=0.0):
    assert lse.dtype == torch.float32 and lse.shape == ref.shape
    inf = torch.isinf(ref)
    assert torch.equal(torch.isinf(lse), inf) and bool((lse[inf] > 0).all()), "LSE: +inf exactly where no key is seen"
    diff = (lse.double() - ref)[~inf].abs()
    bound = (1e-3 * ref[~inf].abs().clamp(min=1.0) + slack)
    assert bool((diff <= bound).all()), f"LSE: max error {diff.max().item():.3g}"


# ---- inputs -----------------------------------------------------------------

LAYOUTS = ("contiguous", "heads-first", "padded")


def make(shape, dtype, layout, device="cuda"):
    """A random [batch, seqlen, heads, head_dim] leaf in one of the layouts
    the kernels read in place: dense; a transposed [batch, heads, seqlen,
    head_dim] (SDPA's); a slice of a wider buffer (more heads, longer rows)."""
    b, s, h, d = shape
    if layout == "contiguous":
        t = torch.randn(b, s, h, d, device=device, dtype=dtype)
    elif layout == "heads-first":
        t = torch.randn(b, h, s, d, device=device, dtype=dtype).transpose(1, 2)
    else:
        t = torch.randn(b, s, h + 2, d + 64, device=device, dtype=dtype)[:, :, 1:h + 1, :d]
    return t.requires_grad_()


def seeded(*key):
    """A random.Random fixed by the test's key (str seeds are stable across
    runs), and torch's generator seeded from it."""
    rng = random.Random("flash3 " + " ".join(map(str, key)))
    torch.manual_seed(rng.randrange(2 ** 31))
    return rng


def random_case(rng, head_dim):
    heads_kv = rng.choice([1, 2, 3])
    seqlen_q = rng.choice([1, 2, 63, 64, 65, 127, 129, 192, 255, rng.randint(1, 700)])
    seqlen_k = seqlen_q if rng.random() < 0.3 else rng.choice([1, 7, 64, 128, 191, 256, rng.randint(1, 700)])
    return dict(batch=rng.randint(1, 3), seqlen_q=seqlen_q, seqlen_k=seqlen_k, heads_kv=heads_kv,
                heads_q=heads_kv * rng.choice([1, 2, 4]), head_dim=head_dim,
                layouts=[rng.choice(LAYOUTS) for _ in range(4)], scale=rng.choice([None, 0.5 / math.sqrt(head_dim)]))


# ---- forward and backward against float64 SDPA -------------------------------


def run_case(dtype, causal, c):
    b, sq, sk, hq, hkv, d = c["batch"], c["seqlen_q"], c["seqlen_k"], c["heads_q"], c["heads_kv"], c["head_dim"]
    dv = c.get("head_dim_v", d)  # V's, O's, dO's
    q = make((b, sq, hq, d), dtype, c["layouts"][0])
    k = make((b, sk, hkv, d), dtype, c["layouts"][1])
    v = make((b, sk, hkv, dv), dtype, c["layouts"][2])
    scale = c["scale"] if c["scale"] is not None else d ** -0.5
    # Sinks around the scores' own size, some above every score of a row.
    sinks = (2 * torch.randn(hq, device="cuda")).requires_grad_() if c.get("sinks") else None
    inputs = (q, k, v) if sinks is None else (q, k, v, sinks)
    window, softcap = c.get("window", (-1, -1)), c.get("softcap", 0.0)
    out, lse = flash3.flash_attn_func(q, k, v, softmax_scale=c["scale"], causal=causal, return_attn_probs=True,
                                      sinks=sinks, window_size=window, softcap=softcap)
    dout = make((b, sq, hq, dv), dtype, c["layouts"][3]).detach()
    grads = torch.autograd.grad(out, inputs, dout)

    refs = [t.detach().double().requires_grad_() for t in inputs]
    ref_out, ref_lse = reference(*refs[:3], causal, scale, *refs[3:], window=window, softcap=softcap)
    ref_grads = torch.autograd.grad(ref_out, refs, dout.double())
    lows = [t.detach().clone().requires_grad_() for t in inputs]
    low_out = straightforward(*lows[:3], causal, scale, *lows[3:], window=window, softcap=softcap)
    low_grads = torch.autograd.grad(low_out, lows, dout)

    assert out.dtype == dtype and out.shape == (b, sq, hq, dv)
    check_output(f"out {c}", out, ref_out, low_out)
    check_lse(lse, ref_lse)
    if sinks is not None:
        check_sink_gradient(c, grads[3], sinks, dout, out, lse, ref_out, ref_grads[3])
    for name, x, g, r, lo in zip(("dq", "dk", "dv"), inputs, grads, ref_grads, low_grads):
        assert g.dtype == x.dtype and g.shape == x.shape
        check_gradient(f"{name} {c}", g, r, lo)


def check_sink_gradient(c, got, sinks, dout, out, lse, ref_out, ref):
    """The sinks' gradient, -sum_i P_sink,i D_i with D_i = rowsum(dO_i o O_i),
    taken (as every fused backward takes D) from the kernel's own rounded O:
    exact on flash3's O and LSE, and off the float64 one by at most what O's
    error, checked against its own bound, moves each D_i."""
    p_sink = torch.exp(sinks.detach().double()[None, :, None] - lse.double())  # [b, hq, sq]
    d_own = (dout.double() * out.double()).sum(-1).transpose(1, 2)
    own = -(p_sink * d_own).sum((0, 2))
    scale = (p_sink * d_own.abs()).sum((0, 2))
    assert got.dtype == torch.float32 and got.shape == sinks.shape
    assert bool(((got.double() - own).abs() <= 1e-5 * scale + 1e-6).all()), f"dsinks {c}: {got} against {own}"
    d_err = (dout.double().abs() * (out.double() - ref_out.detach()).abs()).sum(-1).transpose(1, 2)
    bound = (p_sink * d_err).sum((0, 2)) * 1.001 + 1e-5 * scale + 1e-6
    assert bool(((got.double() - ref).abs() <= bound).all()), f"dsinks {c}: {got} against {ref}, bound {bound}"


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", interface.HEAD_DIMS)
@pytest.mark.parametrize("dtype", [BF16, FP16], ids=["bf16", "fp16"])
def test_against_float64_sdpa(gpu, dtype, head_dim, causal):
    rng = seeded(dtype, head_dim, causal)
    for _ in range(3):
        run_case(dtype, causal, random_case(rng, head_dim))


@pytest.mark.parametrize("case,text", [
    (dict(k_dtype=FP16), "k: dtype must be q's"),
    (dict(q_dtype=torch.float32, k_dtype=torch.float32, v_dtype=torch.float32), "q: dtype torch.float32"),
    (dict(k_batch=3), "k: batch must be q's"),
    (dict(v_seqlen=71), "v: shape must be k's"),
    (dict(head_dim=80), "q: head_dim 80 is not supported"),
    (dict(heads_kv=3), "k: its heads (3) must divide q's (8)"),
    (dict(k_device="cpu"), "k: must be on q's device"),
], ids=["k dtype", "float32", "k batch", "v shape", "head dim", "gqa", "k on the cpu"])
def test_bad_cuda_tensors_are_named(gpu, case, text):
    # Plain CUDA tensors take flash_attn_func's one-expression check first:
    # anything it lets through would reach the library unnamed.
    d, hkv = case.get("head_dim", 128), case.get("heads_kv", 2)
    q = torch.zeros(2, 100, 8, d, device=gpu, dtype=case.get("q_dtype", BF16))
    k = torch.zeros(case.get("k_batch", 2), 70, hkv, d, device=case.get("k_device", gpu),
                    dtype=case.get("k_dtype", BF16))
    v = torch.zeros(2, case.get("v_seqlen", 70), hkv, d, device=gpu, dtype=case.get("v_dtype", BF16))
    with pytest.raises(ValueError) as info:
        flash3.flash_attn_func(q, k, v)
    assert text in str(info.value)


def test_inference_call_without_lse_gives_the_same_output(gpu):
    # No gradient and no LSE asked for: the kernel writes none (lse nullptr),
    # and O is bitwise the one of the call that asks for it.
    torch.manual_seed(21)
    q, k, v = (torch.randn(2, 300, h, 128, device=gpu, dtype=BF16) for h in (8, 2, 2))
    with torch.no_grad():
        out = flash3.flash_attn_func(q, k, v, causal=True)
        ref, lse = flash3.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert torch.equal(out, ref) and lse.shape == (2, 8, 300)


def test_queries_that_see_no_key(gpu):
    # Causal with more queries than keys: the first rows see nothing (zeros, +inf LSE).
    torch.manual_seed(3)
    run_case(BF16, True, dict(batch=2, seqlen_q=300, seqlen_k=20, heads_q=4, heads_kv=2, head_dim=128,
                              layouts=["contiguous"] * 4, scale=None))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", interface.HEAD_DIMS)
def test_sinks_against_float64(gpu, head_dim, causal):
    rng = seeded("sinks", head_dim, causal)
    for dtype in (BF16, FP16):
        run_case(dtype, causal, dict(random_case(rng, head_dim), sinks=True))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", interface.HEAD_DIMS)
def test_windows_against_float64(gpu, head_dim, causal):
    rng = seeded("windows", head_dim, causal)
    for dtype in (BF16, FP16):
        for window in ((0, 0), (rng.randint(1, 200), rng.choice([-1, 0, rng.randint(1, 100)])),
                       (-1, rng.randint(0, 300))):
            run_case(dtype, causal, dict(random_case(rng, head_dim), window=window, sinks=rng.random() < 0.3))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", interface.HEAD_DIMS)
def test_softcap_against_float64(gpu, head_dim, causal):
    # Caps that bend the scores (scale 2/sqrt(d): scores of a few units) and
    # that barely do, with windows, sinks and rows that see no key.
    rng = seeded("softcap", head_dim, causal)
    for dtype in (BF16, FP16):
        for softcap in (1.0, rng.uniform(2.0, 10.0), 50.0):
            window = rng.choice([(-1, -1), (rng.randint(0, 200), rng.choice([-1, rng.randint(0, 100)]))])
            run_case(dtype, causal, dict(random_case(rng, head_dim), scale=2 / math.sqrt(head_dim), softcap=softcap,
                                         window=window, sinks=rng.random() < 0.3))


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dims", interface.HEAD_DIM_PAIRS, ids=lambda p: f"{p[0]}-{p[1]}")
@pytest.mark.parametrize("dtype", [BF16, FP16], ids=["bf16", "fp16"])
def test_value_head_dim_against_float64(gpu, dtype, head_dims, causal):
    # V's head dim of its own (192 / 128): plain, sinks, a window, softcap; GQA
    # and the layouts from random_case; then packed sequences.
    d, dv = head_dims
    rng = seeded("head_dim_v", dtype, d, dv, causal)
    for extra in ({}, {"sinks": True}, {"window": (rng.randint(1, 200), rng.choice([-1, rng.randint(0, 100)]))},
                  {"softcap": 5.0, "scale": 2 / math.sqrt(d)}):
        run_case(dtype, causal, {**random_case(rng, d), "head_dim_v": dv, **extra})
    run_varlen_case(dtype, causal, d, rng, head_dim_v=dv)
    run_varlen_case(dtype, causal, d, rng, seqused=True, sinks=True, head_dim_v=dv)


# ---- packed sequences (flash_attn_varlen_func) ----------------------------------


def varlen_lengths(rng, batch):
    """Sequence lengths with the awkward ones: empty, a single row, shorter
    than a tile, one past a tile, and random ones up to 700."""
    return [rng.choice([0, 1, 5, 63, 64, 65, 129, rng.randint(1, 700), rng.randint(1, 700)]) for _ in range(batch)]


PackedBatch = collections.namedtuple(
    "PackedBatch", "batch heads_q heads_kv lens_q lens_k used_q used_k cu_q cu_k total_q total_k")


def random_packed_batch(rng, seqused):
    """A random packed batch's layout: 1-5 sequences of varlen_lengths (the
    keys' lengths the queries' or drawn apart), GQA or not, the rows that take
    part (all, or random seqused), and rows past the last sequence (total_q
    and total_k need not be the sums)."""
    batch = rng.randint(1, 6)
    heads_kv = rng.choice([1, 2])
    heads_q = heads_kv * rng.choice([1, 3])
    lens_q = varlen_lengths(rng, batch)
    lens_k = lens_q if rng.random() < 0.4 else varlen_lengths(rng, batch)
    used_q = [rng.randint(0, n) for n in lens_q] if seqused else lens_q
    used_k = [rng.randint(0, n) for n in lens_k] if seqused else lens_k
    cu_q = [0] + [sum(lens_q[:i + 1]) for i in range(batch)]
    cu_k = [0] + [sum(lens_k[:i + 1]) for i in range(batch)]
    total_q, total_k = cu_q[-1] + rng.choice([0, 3]), cu_k[-1] + rng.choice([0, 5])
    return PackedBatch(batch, heads_q, heads_kv, lens_q, lens_k, used_q, used_k, cu_q, cu_k, total_q, total_k)


def run_varlen_case(dtype, causal, head_dim, rng, seqused=False, sinks=False, window=(-1, -1), softcap=0.0,
                    head_dim_v=None):
    batch, hq, heads_kv, lens_q, lens_k, used_q, used_k, cu_q, cu_k, total_q, total_k = random_packed_batch(
        rng, seqused)
    d = head_dim
    dv = d if head_dim_v is None else head_dim_v
    q = torch.randn(total_q, hq, d, device="cuda", dtype=dtype, requires_grad=True)
    k = torch.randn(total_k, heads_kv, d, device="cuda", dtype=dtype, requires_grad=True)
    v = torch.randn(total_k, heads_kv, dv, device="cuda", dtype=dtype, requires_grad=True)
    sink_t = (2 * torch.randn(hq, device="cuda")).requires_grad_() if sinks else None
    i32 = dict(dtype=torch.int32, device="cuda")
    used = dict(seqused_q=torch.tensor(used_q, **i32), seqused_k=torch.tensor(used_k, **i32)) if seqused else {}
    scale = d ** -0.5
    out, lse = flash3.flash_attn_varlen_func(q, k, v, torch.tensor(cu_q, **i32), torch.tensor(cu_k, **i32),
                                             max(lens_q), max(lens_k), causal=causal, window_size=window,
                                             softcap=softcap, sinks=sink_t, return_attn_probs=True, **used)
    assert out.shape == (total_q, hq, dv) and lse.shape == (hq, total_q)
    dout = torch.randn_like(out)
    inputs = (q, k, v) if sink_t is None else (q, k, v, sink_t)
    grads = torch.autograd.grad(out, inputs, dout)
    case = dict(lens_q=lens_q, lens_k=lens_k, used_q=used_q, used_k=used_k, heads=(hq, heads_kv), causal=causal,
                window=window, softcap=softcap, sinks=sinks, head_dims=(d, dv))
    own_dsinks = torch.zeros(hq, dtype=torch.float64, device="cuda")
    for b in range(batch):
        rows = slice(cu_q[b], cu_q[b] + used_q[b])
        keys = slice(cu_k[b], cu_k[b] + used_k[b])
        seq = [t.detach()[s][None] for t, s in ((q, rows), (k, keys), (v, keys))]
        extra = [] if sink_t is None else [sink_t.detach()]
        refs = [t.double().requires_grad_() for t in seq + extra]
        ref_out, ref_lse = reference(*refs[:3], causal, scale, *refs[3:], window=window, softcap=softcap)
        lows = [t.clone().requires_grad_() for t in seq + extra]
        low_out = straightforward(*lows[:3], causal, scale, *lows[3:], window=window, softcap=softcap)
        g_out = dout[rows][None]
        ref_grads = torch.autograd.grad(ref_out, refs, g_out.double(), allow_unused=True)
        low_grads = torch.autograd.grad(low_out, lows, g_out, allow_unused=True)
        check_output(f"out {case} sequence {b}", out[rows][None], ref_out, low_out)
        check_lse(lse[:, rows][None], ref_lse)
        shifts = d_shift(*seq[:2], out.detach()[rows][None], ref_out, ref_lse, g_out, causal, scale, window, softcap)
        for name, g, s_, r, lo, shift in zip(("dq", "dk", "dv"), grads, (rows, keys, keys), ref_grads, low_grads,
                                             (*shifts, 0.0)):
            if r is not None and g[s_].numel():
                check_gradient(f"{name} {case} sequence {b}", g[s_][None], r, lo, slack=2 * shift)
        # Rows of a sequence past its seqused take no part: no gradient.
        for name, g, start, stop in (("dq", grads[0], cu_q[b] + used_q[b], cu_q[b + 1]),
                                     ("dk", grads[1], cu_k[b] + used_k[b], cu_k[b + 1]),
                                     ("dv", grads[2], cu_k[b] + used_k[b], cu_k[b + 1])):
            assert not bool(g[start:stop].any()), f"{name} {case} sequence {b}: rows past seqused not zero"
        if sink_t is not None and used_q[b]:
            p_sink = torch.exp(sink_t.detach().double()[:, None] - lse[:, rows].double())  # [hq, rows]
            d_own = (dout[rows].double() * out[rows].double()).sum(-1).T
            own_dsinks -= (p_sink * d_own).sum(-1)
    if sink_t is not None:
        assert bool(((grads[3].double() - own_dsinks).abs() <= 1e-4 * own_dsinks.abs().clamp(min=1)).all()), (
            f"dsinks {case}: {grads[3]} against {own_dsinks}")


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", interface.HEAD_DIMS)
def test_varlen_against_float64(gpu, head_dim, causal):
    rng = seeded("varlen", head_dim, causal)
    for dtype in (BF16, FP16):
        run_varlen_case(dtype, causal, head_dim, rng)
        run_varlen_case(dtype, causal, head_dim, rng, seqused=True)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_varlen_with_window_softcap_and_sinks(gpu, head_dim, causal):
    rng = seeded("varlen features", head_dim, causal)
    for window, softcap, sinks in (((rng.randint(0, 100), rng.choice([-1, 0, 20])), 0.0, False),
                                   ((-1, -1), 10.0, False), ((-1, -1), 0.0, True),
                                   ((rng.randint(0, 100), -1), 5.0, True)):
        run_varlen_case(BF16, causal, head_dim, rng, seqused=rng.random() < 0.5, sinks=sinks, window=window,
                        softcap=softcap)


def test_varlen_equals_flash_attn_func_on_equal_lengths(gpu):
    # Sequences all of one length: the packed call is the batched one.
    torch.manual_seed(8)
    b, s, hq, hkv, d = 3, 333, 8, 2, 128
    q, k, v = (torch.randn(b, s, h, d, device=gpu, dtype=BF16) for h in (hq, hkv, hkv))
    cu = torch.arange(0, (b + 1) * s, s, dtype=torch.int32, device=gpu)
    with torch.no_grad():
        out, lse = flash3.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
        packed_out, packed_lse = flash3.flash_attn_varlen_func(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1),
                                                               cu, cu, s, s, causal=True, return_attn_probs=True)
    assert torch.equal(packed_out.view(b, s, hq, d), out)
    assert torch.equal(packed_lse.view(hq, b, s).transpose(0, 1), lse)


def test_sinks_of_rows_that_see_no_key(gpu):
    # Causal with more queries than keys: the first rows see only their sink
    # (zeros, the sink as LSE, nothing added to its gradient).
    torch.manual_seed(6)
    run_case(BF16, True, dict(batch=2, seqlen_q=300, seqlen_k=20, heads_q=4, heads_kv=2, head_dim=128,
                              layouts=["contiguous"] * 4, scale=None, sinks=True))


def test_sinks_gradient_is_bitwise_reproducible(gpu):
    torch.manual_seed(8)
    q, k, v = (torch.randn(2, 700, h, 128, device=gpu, dtype=BF16, requires_grad=True) for h in (8, 2, 2))
    sinks = torch.randn(8, device=gpu, requires_grad=True)
    out = flash3.flash_attn_func(q, k, v, causal=True, sinks=sinks)
    dout = torch.randn_like(out)
    first = torch.autograd.grad(out, sinks, dout, retain_graph=True)[0]
    assert torch.equal(first, torch.autograd.grad(out, sinks, dout)[0])


def test_packed_qkv_is_flash_attn_func_on_its_views(gpu):
    torch.manual_seed(4)
    for packed, num_heads_q in ((torch.randn(2, 257, 3, 4, 128, device=gpu, dtype=BF16), None),
                                (torch.randn(2, 257, 8 + 2 * 2, 128, device=gpu, dtype=BF16), 8)):
        qkv = packed.requires_grad_()
        out = flash3.flash_attn_qkvpacked_func(qkv, causal=True, deterministic=True, num_heads_q=num_heads_q)
        dout = torch.randn_like(out)
        (dqkv,) = torch.autograd.grad(out, qkv, dout)
        views = qkv.unbind(2) if qkv.dim() == 5 else qkv.split([8, 2, 2], dim=2)
        q, k, v = (t.detach().clone().requires_grad_() for t in views)
        expected = flash3.flash_attn_func(q, k, v, causal=True, deterministic=True)
        grads = torch.autograd.grad(expected, (q, k, v), dout)
        assert torch.equal(out, expected)
        assert torch.equal(dqkv, torch.stack(grads, 2) if qkv.dim() == 5 else torch.cat(grads, 2))


# ---- FP8 --------------------------------------------------------------------


def dequantize(x8, scale, block):
    """float64 values of an e4m3 tensor with its scales in flash3's layout."""
    x = x8.double()
    if scale.dim() == 1:
        return x * scale.double()
    if scale.dim() == 2:
        return x * scale.double()[:, None, :, None]
    rows = torch.arange(x.shape[1], device=x.device) // block
    return x * scale.double()[:, :, rows].permute(0, 2, 1)[..., None]


def straightforward_fp8(q, k, v, causal, scale, out_dtype, sinks=None, window=(-1, -1)):
    """Attention of dequantized inputs with P rounded to e4m3 and O to
    out_dtype, in float32: the FP8 tolerance's yardstick."""
    qt, kt, vt = _heads_first(q.float(), k.float(), v.float())
    s = (qt @ kt.transpose(-1, -2)) * scale
    s = s.masked_fill(~visible(q.shape[1], k.shape[1], causal, q.device, window), -math.inf)
    if sinks is not None:
        s = _with_sinks(s, sinks)
    p = torch.softmax(s, -1).nan_to_num(0.0)
    p = (p if sinks is None else p[..., :-1]).to(E4M3).float()
    return (p @ vt).transpose(1, 2).to(out_dtype)


def fp8_lse_slack(qd, kd, head_dim, scale):
    """The LSE's slack of FP8 inputs: FP8 WGMMA accumulates with about 14
    mantissa bits, so S = QK^T carries up to 2^-13 of sum |q_c k_c| per
    k-step of 32 (the C++ FP8 test's slack), bounded by |q| max_j |k_j|.
    [batch, heads_q, seqlen_q]."""
    accumulation = (head_dim / 32) * 2.0 ** -13 * scale
    # A zero row joins the key norms: a sequence may have no key.
    k_norm = torch.nn.functional.pad(kd.norm(dim=-1), (0, 0, 0, 1))
    k_max = k_norm.amax(dim=1).repeat_interleave(qd.shape[2] // kd.shape[2], 1)  # [b, hq]
    return accumulation * qd.norm(dim=-1).transpose(1, 2) * k_max[:, :, None]


@pytest.mark.parametrize("granularity", ["tensor", "head", "block"])
@pytest.mark.parametrize("head_dim", interface.FP8_HEAD_DIMS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_fp8_against_dequantized_reference(gpu, granularity, head_dim, causal):
    rng = random.Random(f"flash3 fp8 {granularity} {head_dim} {causal}")
    torch.manual_seed(rng.randrange(2 ** 31))
    block_q, block_kv = _abi.FP8_BLOCK_SIZES[head_dim]
    for b, sq, sk, hq, hkv in ((2, 1, 1, 4, 4), (1, 113, 300, 8, 2), (2, 255, 255, 4, 1), (1, 700, 129, 2, 2)):
        # Magnitudes that change from row to row, so that per-block scales differ.
        q, k, v = (torch.randn(b, s, h, head_dim, device=gpu) * torch.exp(torch.randn(b, s, 1, 1, device=gpu))
                   for s, h in ((sq, hq), (sk, hkv), (sk, hkv)))
        q, k, v = q.to(BF16), k.to(BF16), v.to(BF16)
        hadamard, out_dtype = rng.random() < 0.5, rng.choice([BF16, FP16])
        sinks = 2 * torch.randn(hq, device=gpu) if rng.random() < 0.5 else None
        q8, k8, v8, qs, ks, vs = flash3.quantize_fp8(q, k, v, granularity=granularity, hadamard=hadamard,
                                                     seed=rng.randrange(2 ** 63))
        out, lse = flash3.flash_attn_func(q8, k8, v8, causal=causal, q_descale=qs, k_descale=ks, v_descale=vs,
                                          return_attn_probs=True, out_dtype=out_dtype, sinks=sinks)
        qd, kd, vd = dequantize(q8, qs, block_q), dequantize(k8, ks, block_kv), dequantize(v8, vs, block_kv)
        scale = head_dim ** -0.5
        ref_out, ref_lse = reference(qd, kd, vd, causal, scale, sinks)
        case = f"b{b} sq{sq} sk{sk} h{hq}/{hkv} hadamard={hadamard} {out_dtype} sinks={sinks is not None}"
        assert out.dtype == out_dtype
        check_output(f"fp8 out {case}", out, ref_out,
                     straightforward_fp8(qd, kd, vd, causal, scale, out_dtype, sinks))
        slack = fp8_lse_slack(qd, kd, head_dim, scale)
        check_lse(lse, ref_lse, slack[~torch.isinf(ref_lse)])


@pytest.mark.parametrize("granularity", ["tensor", "head", "block"])
def test_quantize_fp8_rounds_within_e4m3(gpu, granularity):
    torch.manual_seed(5)
    q, k, v = (torch.randn(2, s, h, 128, device=gpu, dtype=BF16) * 3 for s, h in ((333, 8), (250, 2), (250, 2)))
    outs = flash3.quantize_fp8(q, k, v, granularity=granularity)
    block_q, block_kv = _abi.FP8_BLOCK_SIZES[128]
    for x, x8, scale, block in zip((q, k, v), outs[:3], outs[3:], (block_q, block_kv, block_kv)):
        deq, ones = dequantize(x8, scale, block), dequantize(torch.ones_like(x8), scale, block)
        # e4m3: 3 mantissa bits (half an ulp is 2^-4 relative), subnormals below 2^-6 (ulp 2^-9).
        assert bool(((deq - x.double()).abs() <= x.double().abs() * 2 ** -4 + ones * 2 ** -10).all())
        assert bool((scale > 0).all()) and bool(torch.isfinite(scale).all())


def packed_scales(granularity, batch, heads, lengths, used, block, device, heads_given=None):
    """Random descales of packed sequences in flash3's layouts (batch the
    sequences, blocks of the longest one): positive, and NaN for the blocks
    wholly past a sequence's used rows, which the kernel must not read.
    heads_given: a per-head Q descale in FlashAttention-3's (batch, heads_kv)."""
    if granularity == "tensor":
        return torch.rand(1, device=device) + 0.5
    if granularity == "head":
        return torch.rand(batch, heads_given or heads, device=device) + 0.5
    blocks = max(-(-n // block) for n in lengths)
    scale = torch.rand(batch, heads, blocks, device=device) + 0.5
    for b, n in enumerate(used):
        scale[b, :, -(-n // block):] = math.nan
    return scale


def dequantize_sequence(x8, scale, b, first, used, block):
    """float64 [1, used, heads, head_dim] of sequence b's first `used` rows
    (from packed row `first`) with its descales in the packed layout."""
    x = x8[first:first + used].double()
    if scale.dim() == 2:  # per head; FlashAttention-3's (batch, heads_kv) shared by each group
        scale = scale[b].repeat_interleave(x.shape[1] // scale.shape[1])[:, None]
    elif scale.dim() == 3:  # per block, counted from the sequence's first row
        scale = scale[b][:, torch.arange(used, device=x.device) // block].T[..., None]
    return (x * scale.double())[None]


@pytest.mark.parametrize("granularity", ["tensor", "head", "block"])
@pytest.mark.parametrize("head_dim", interface.FP8_HEAD_DIMS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_varlen_fp8_against_dequantized_reference(gpu, granularity, head_dim, causal):
    # Each packed sequence against the attention of its own dequantized rows.
    rng = seeded("varlen fp8", granularity, head_dim, causal)
    block_q, block_kv = _abi.FP8_BLOCK_SIZES[head_dim]
    i32 = dict(dtype=torch.int32, device=gpu)
    for window, seqused in (((-1, -1), False), ((-1, -1), True),
                            ((rng.randint(0, 100), rng.choice([-1, 0, 20])), rng.random() < 0.5)):
        batch, hq, heads_kv, lens_q, lens_k, used_q, used_k, cu_q, cu_k, total_q, total_k = random_packed_batch(
            rng, seqused)
        q8, k8, v8 = (torch.randn(n, h, head_dim, device=gpu).to(E4M3)
                      for n, h in ((total_q, hq), (total_k, heads_kv), (total_k, heads_kv)))
        fa3_q = granularity == "head" and rng.random() < 0.5 and hq != heads_kv
        qs = packed_scales(granularity, batch, hq, lens_q, used_q, block_q, gpu, heads_kv if fa3_q else None)
        ks, vs = (packed_scales(granularity, batch, heads_kv, lens_k, used_k, block_kv, gpu) for _ in range(2))
        used = dict(seqused_q=torch.tensor(used_q, **i32), seqused_k=torch.tensor(used_k, **i32)) if seqused else {}
        out, lse = flash3.flash_attn_varlen_func(q8, k8, v8, torch.tensor(cu_q, **i32), torch.tensor(cu_k, **i32),
                                                 max(lens_q), max(lens_k), causal=causal, q_descale=qs, k_descale=ks,
                                                 v_descale=vs, window_size=window, return_attn_probs=True, **used)
        assert (out.shape, out.dtype, lse.shape) == (q8.shape, BF16, (hq, total_q))
        scale = head_dim ** -0.5
        case = dict(lens_q=lens_q, lens_k=lens_k, used_q=used_q, used_k=used_k, heads=(hq, heads_kv),
                    window=window, fa3_q=fa3_q)
        for b in range(batch):
            if used_q[b] == 0:
                continue
            rows = slice(cu_q[b], cu_q[b] + used_q[b])
            qd = dequantize_sequence(q8, qs, b, cu_q[b], used_q[b], block_q)
            kd, vd = (dequantize_sequence(t, s_, b, cu_k[b], used_k[b], block_kv) for t, s_ in ((k8, ks), (v8, vs)))
            ref_out, ref_lse = reference(qd, kd, vd, causal, scale, window=window)
            check_output(f"varlen fp8 out {case} sequence {b}", out[rows][None], ref_out,
                         straightforward_fp8(qd, kd, vd, causal, scale, BF16, window=window))
            slack = fp8_lse_slack(qd, kd, head_dim, scale)
            check_lse(lse[:, rows][None], ref_lse, slack[~torch.isinf(ref_lse)])


def test_varlen_fp8_equals_flash_attn_func_on_equal_lengths(gpu):
    # Sequences all of one length: the packed call is the batched one, its
    # per-block descales the batched call's own.
    torch.manual_seed(9)
    b, s, hq, hkv, d = 3, 333, 8, 2, 128
    q, k, v = (torch.randn(b, s, h, d, device=gpu, dtype=BF16) for h in (hq, hkv, hkv))
    q8, k8, v8, qs, ks, vs = flash3.quantize_fp8(q, k, v, granularity="block")
    cu = torch.arange(0, (b + 1) * s, s, dtype=torch.int32, device=gpu)
    for causal in (False, True):
        out, lse = flash3.flash_attn_func(q8, k8, v8, causal=causal, q_descale=qs, k_descale=ks, v_descale=vs,
                                          return_attn_probs=True)
        packed_out, packed_lse = flash3.flash_attn_varlen_func(q8.flatten(0, 1), k8.flatten(0, 1), v8.flatten(0, 1),
                                                               cu, cu, s, s, causal=causal, q_descale=qs,
                                                               k_descale=ks, v_descale=vs, return_attn_probs=True)
        assert torch.equal(packed_out.view(b, s, hq, d), out)
        assert torch.equal(packed_lse.view(hq, b, s).transpose(0, 1), lse)


def test_fa3_descale_shapes(gpu):
    torch.manual_seed(6)
    b, hq, hkv = 2, 8, 2
    q, k, v = (torch.randn(b, 200, h, 128, device=gpu, dtype=BF16) for h in (hq, hkv, hkv))
    q8, k8, v8, qs, ks, vs = flash3.quantize_fp8(q, k, v, granularity="tensor")
    per_tensor = flash3.flash_attn_func(q8, k8, v8, q_descale=qs, k_descale=ks, v_descale=vs)
    # FlashAttention-3 takes (batch, heads_kv) descales, Q's shared by each group of query heads.
    fa3 = flash3.flash_attn_func(q8, k8, v8, q_descale=qs.expand(b, hkv), k_descale=ks.expand(b, hkv),
                                 v_descale=vs.expand(b, hkv))
    torch.testing.assert_close(fa3, per_tensor, rtol=1e-2, atol=1e-3)
    ones = flash3.flash_attn_func(q8, k8, v8)  # absent descales are 1, as in FlashAttention-3
    unit = torch.ones(1, device=gpu)
    assert torch.equal(ones, flash3.flash_attn_func(q8, k8, v8, q_descale=unit, k_descale=unit, v_descale=unit))


# ---- layouts, copies and paths --------------------------------------------------


def test_strided_head_dim_is_copied(gpu):
    torch.manual_seed(7)
    q = torch.randn(2, 100, 128, 4, device=gpu, dtype=BF16).transpose(2, 3)  # head dim of stride 4
    k = torch.randn(2, 90, 4, 128, device=gpu, dtype=BF16)
    assert q.stride(-1) != 1
    assert torch.equal(flash3.flash_attn_func(q, k, k), flash3.flash_attn_func(q.contiguous(), k, k))


def test_broadcast_gradient_is_read(gpu):
    # out.sum() hands the backward a dO of all-zero strides, which TMA cannot read: copied.
    torch.manual_seed(8)
    q, k, v = (torch.randn(2, 130, h, 64, device=gpu, dtype=FP16, requires_grad=True) for h in (4, 2, 2))
    out = flash3.flash_attn_func(q, k, v, causal=True, deterministic=True)
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    out = flash3.flash_attn_func(q, k, v, causal=True, deterministic=True)
    expected = torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    assert all(torch.equal(g, e) for g, e in zip(grads, expected))


def test_operator_and_eager_path_agree(gpu):
    torch.manual_seed(9)
    q, k, v = (torch.randn(1, 513, h, 96, device=gpu, dtype=BF16, requires_grad=True) for h in (6, 3, 3))
    out, lse = flash3.flash_attn_func(q, k, v, causal=True, return_attn_probs=True, deterministic=True)
    op_out, op_lse = torch.ops.flash3.fwd(q, k, v, None, None, None, 96 ** -0.5, True, True, BF16)
    assert torch.equal(out, op_out) and torch.equal(lse, op_lse)
    dout = torch.randn_like(out)
    assert all(torch.equal(a, b) for a, b in zip(torch.autograd.grad(out, (q, k, v), dout),
                                                 torch.autograd.grad(op_out, (q, k, v), dout)))


def test_misaligned_stride_is_a_value_error_naming_it(gpu):
    q = torch.randn(1, 64, 2, 129, device=gpu, dtype=BF16)[..., :128]  # head stride 129 elements: not 16 bytes
    with pytest.raises(ValueError, match=r"flash3 forward: q\."):
        flash3.flash_attn_func(q, q, q)


def test_empty_sizes(gpu):
    q = torch.randn(0, 10, 2, 64, device=gpu, dtype=BF16)
    assert flash3.flash_attn_func(q, q, q).shape == q.shape
    q = torch.randn(1, 10, 2, 64, device=gpu, dtype=BF16, requires_grad=True)
    k = torch.randn(1, 0, 2, 64, device=gpu, dtype=BF16, requires_grad=True)
    out, lse = flash3.flash_attn_func(q, k, k, return_attn_probs=True)
    assert bool((out == 0).all()) and bool(torch.isposinf(lse).all())  # no key: zeros and +inf
    dq, dk = torch.autograd.grad(out, (q, k), torch.randn_like(out))
    assert bool((dq == 0).all()) and dk.shape == k.shape


def test_side_stream(gpu):
    torch.manual_seed(10)
    q = torch.randn(2, 300, 4, 128, device=gpu, dtype=BF16)
    expected = flash3.flash_attn_func(q, q, q, causal=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out = flash3.flash_attn_func(q, q, q, causal=True)
    torch.cuda.current_stream().wait_stream(side)
    assert torch.equal(out, expected)


def test_each_gpu_of_the_process(gpu):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    torch.manual_seed(11)
    q = torch.randn(2, 300, 4, 128, dtype=BF16, requires_grad=True)
    results = []
    for index in range(torch.cuda.device_count()):
        x = q.detach().to(f"cuda:{index}").requires_grad_()
        torch.cuda.set_device(0)  # a device other than the tensors' is current: the call switches to theirs
        out = flash3.flash_attn_func(x, x, x, causal=True, deterministic=True)
        (dx,) = torch.autograd.grad(out, x, torch.ones_like(out))
        assert torch.cuda.current_device() == 0 and out.device == x.device
        results.append((out.cpu(), dx.cpu()))
    assert all(torch.equal(r[0], results[0][0]) and torch.equal(r[1], results[0][1]) for r in results)


# ---- determinism, graphs, compile, memory ------------------------------------------


@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_deterministic_backward_is_bitwise_reproducible(gpu, head_dim, causal):
    torch.manual_seed(12)
    q, k, v = (torch.randn(2, 1000, h, head_dim, device=gpu, dtype=BF16, requires_grad=True) for h in (8, 2, 2))
    dout = torch.randn(2, 1000, 8, head_dim, device=gpu, dtype=BF16)
    runs = []
    for _ in range(3):
        out = flash3.flash_attn_func(q, k, v, causal=causal, deterministic=True)
        runs.append(torch.autograd.grad(out, (q, k, v), dout))
    for run in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(run, runs[0]))


def test_cuda_graph_capture_and_replay(gpu):
    # Enough tiles that the persistent forward claims them from its counter.
    torch.manual_seed(13)
    q, k, v = (torch.randn(4, 2048, h, 128, device=gpu, dtype=BF16, requires_grad=True) for h in (16, 4, 4))
    dout = torch.randn(4, 2048, 16, 128, device=gpu, dtype=BF16)
    inputs = [t.detach().clone() for t in (q, k, v)]
    x = torch.randn(2, 500, 8, 64, device=gpu, dtype=BF16)

    def step():
        out = flash3.flash_attn_func(q, k, v, causal=True, deterministic=True)
        q8, k8, v8, qs, ks, vs = flash3.quantize_fp8(x, x[:, :, :2], x[:, :, :2], granularity="block")
        fp8 = flash3.flash_attn_func(q8, k8, v8, q_descale=qs, k_descale=ks, v_descale=vs)
        return (out, fp8, *torch.autograd.grad(out, (q, k, v), dout))

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = step()
    for trial in range(3):
        with torch.no_grad():
            for t, base in zip((q, k, v), inputs):
                t.copy_(base * (trial + 1))
            x.copy_(torch.randn_like(x))
        graph.replay()
        expected = step()
        for name, got, want in zip(("out", "fp8", "dq", "dk", "dv"), static, expected):
            assert torch.equal(got, want), f"replay {trial}: {name} differs from an eager call"


def _block(seed):
    torch.manual_seed(seed)
    return Block(dim=512, heads=8, heads_kv=2).to(device="cuda", dtype=BF16)


def test_compile_fullgraph_transformer_block(gpu):
    torch._dynamo.reset()
    block = _block(14)
    x = torch.randn(2, 257, 512, device=gpu, dtype=BF16, requires_grad=True)
    compiled = torch.compile(block, fullgraph=True)
    y, y_eager = compiled(x), block(x)
    torch.testing.assert_close(y, y_eager, rtol=2e-2, atol=2e-2)
    dy = torch.randn_like(y)
    g, g_eager = torch.autograd.grad(y, x, dy)[0], torch.autograd.grad(y_eager, x, dy)[0]
    torch.testing.assert_close(g, g_eager, rtol=5e-2, atol=5e-2)


def test_compile_reduce_overhead_captures_graphs(gpu):
    torch._dynamo.reset()
    block = _block(15)
    compiled = torch.compile(block, fullgraph=True, mode="reduce-overhead")
    with torch.no_grad():
        for _ in range(4):
            x = torch.randn(2, 257, 512, device=gpu, dtype=BF16)
            torch.testing.assert_close(compiled(x).clone(), block(x), rtol=2e-2, atol=2e-2)


def _op_cases(device):
    torch.manual_seed(16)
    q, k, v = (torch.randn(2, s, h, 128, device=device, dtype=BF16, requires_grad=True)
               for s, h in ((129, 4), (200, 2), (200, 2)))
    d = [t.detach() for t in (q, k, v)]
    out, lse = torch.ops.flash3.fwd(*d, None, None, None, 128 ** -0.5, True, True, BF16)
    q8, k8, v8, qs, ks, vs = torch.ops.flash3.quantize_fp8(*d, _abi.PER_BLOCK, False, 0)
    sinks = torch.randn(4, device=device, requires_grad=True)
    out_s, lse_s = torch.ops.flash3.fwd(*d, None, None, None, 128 ** -0.5, False, False, BF16, sinks.detach())
    return [
        ("fwd", torch.ops.flash3.fwd.default, (q, k, v, None, None, None, 128 ** -0.5, True, True, BF16)),
        ("fwd fp8", torch.ops.flash3.fwd.default, (q8, k8, v8, qs, ks, vs, 128 ** -0.5, False, False, FP16)),
        ("bwd", torch.ops.flash3.bwd.default, (torch.randn_like(out), *d, out, lse, 128 ** -0.5, True, True)),
        ("fwd sinks", torch.ops.flash3.fwd.default,
         (q, k, v, None, None, None, 128 ** -0.5, False, False, BF16, sinks)),
        ("bwd sinks", torch.ops.flash3.bwd.default,
         (torch.randn_like(out_s), *d, out_s, lse_s, 128 ** -0.5, False, True, sinks.detach())),
        ("quantize", torch.ops.flash3.quantize_fp8.default, (*d, _abi.PER_HEAD, True, 3)),
        *_varlen_op_cases(device),
    ]


def _varlen_op_cases(device):
    # Three sequences, the middle one empty, keys past seqused (opcheck
    # compares whole outputs: no query rows the kernels leave unwritten).
    cu_q = torch.tensor([0, 100, 100, 229], dtype=torch.int32, device=device)
    cu_k = torch.tensor([0, 77, 77, 277], dtype=torch.int32, device=device)
    used = torch.tensor([70, 0, 200], dtype=torch.int32, device=device)
    q, k, v = (torch.randn(s, h, 64, device=device, dtype=BF16, requires_grad=True)
               for s, h in ((229, 4), (277, 2), (277, 2)))
    d = [t.detach() for t in (q, k, v)]
    sizes = (cu_q, cu_k, None, used, 129, 200, 0.125)
    out, lse = torch.ops.flash3.varlen_fwd(*d, *sizes, True, False)
    return [
        ("varlen fwd", torch.ops.flash3.varlen_fwd.default, (q, k, v, *sizes, True, False)),
        ("varlen bwd", torch.ops.flash3.varlen_bwd.default, (torch.randn_like(out), *d, out, lse, *sizes, True, True)),
    ]


@pytest.mark.parametrize("index", range(8), ids=["fwd", "fwd-fp8", "bwd", "fwd-sinks", "bwd-sinks", "quantize",
                                                 "varlen-fwd", "varlen-bwd"])
def test_opcheck(gpu, index):
    name, op, args = _op_cases(gpu)[index]
    tests = ["test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic"]
    if name == "fwd fp8":
        # opcheck's schema test compares float8 inputs with arithmetic PyTorch
        # has no CUDA kernel for on Float8_e4m3fn: checked bit for bit here instead.
        tests.remove("test_schema")
        before = [t.view(torch.uint8).clone() for t in args[:3]]
        op(*args)
        assert all(torch.equal(t.view(torch.uint8), b) for t, b in zip(args[:3], before)), "FP8 inputs mutated"
    torch.library.opcheck(op, args, test_utils=tests)


def test_no_memory_growth_over_1000_calls(gpu):
    torch.manual_seed(17)
    q, k, v = (torch.randn(2, 300, h, 64, device=gpu, dtype=BF16, requires_grad=True) for h in (4, 2, 2))
    dout = torch.randn(2, 300, 4, 64, device=gpu, dtype=BF16)

    def step():
        out = flash3.flash_attn_func(q, k, v, causal=True)
        torch.autograd.grad(out, (q, k, v), dout)
        q8, k8, v8, qs, ks, vs = flash3.quantize_fp8(q, k, v)
        flash3.flash_attn_func(q8, k8, v8, q_descale=qs, k_descale=ks, v_descale=vs)

    for _ in range(10):
        step()
    torch.cuda.synchronize()
    allocated = torch.cuda.memory_allocated()
    for _ in range(1000):
        step()
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == allocated


# ---- KV cache (decoding) ------------------------------------------------------


def _cache_case(seqlens, seqlen_q=1, max_len=1024, hq=8, hkv=2, d=128, dtype=BF16, extra=0, permute=False,
                pad=False, seed=0):
    """q, the caches (batch + extra entries, every row finite), and the index
    tensors: cache_batch_idx reversed with permute, leftpads with pad."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    batch = len(seqlens)
    q = torch.randn(batch, seqlen_q, hq, d, device="cuda", dtype=dtype, generator=g)
    k_cache = torch.randn(batch + extra, max_len, hkv, d, device="cuda", dtype=dtype, generator=g)
    v_cache = torch.randn(batch + extra, max_len, hkv, d, device="cuda", dtype=dtype, generator=g)
    lens = torch.tensor(seqlens, dtype=torch.int32, device="cuda")
    idx = torch.arange(batch + extra - 1, extra - 1, -1, dtype=torch.int32, device="cuda") if permute else None
    leftpad = (torch.tensor([min(n, 13 * b % 37) for b, n in enumerate(seqlens)], dtype=torch.int32, device="cuda")
               if pad else None)
    return q, k_cache, v_cache, lens, idx, leftpad


def _check_kv_cache(q, k_cache, v_cache, lens, idx, leftpad, causal=False, window=(-1, -1), softcap=0.0,
                    sinks=None, num_splits=0):
    out, lse = flash3.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens, cache_batch_idx=idx,
                                              cache_leftpad=leftpad, causal=causal, window_size=window,
                                              softcap=softcap, num_splits=num_splits, return_softmax_lse=True,
                                              sinks=sinks)
    scale = q.shape[-1] ** -0.5
    for b in range(q.shape[0]):
        row = b if idx is None else int(idx[b])
        first = 0 if leftpad is None else int(leftpad[b])
        last = max(int(lens[b]), first)
        kb, vb = k_cache[row:row + 1, first:last], v_cache[row:row + 1, first:last]
        ref, ref_lse = reference(q[b:b + 1], kb, vb, causal, scale, sinks, window, softcap)
        low = straightforward(q[b:b + 1], kb, vb, causal, scale, sinks, window, softcap)
        check_output(f"out[{b}]", out[b:b + 1], ref, low)
        check_lse(lse[b:b + 1], ref_lse)
    return out, lse


_CACHE_LENS = [0, 1, 63, 127, 128, 129, 1000, 1024]


@pytest.mark.parametrize("num_splits", [1, 4])
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_kvcache_without_lse_gives_the_same_output(gpu, paged, num_splits):
    # An eager call that does not ask for the LSE passes none (the kernels, split or not, write none):
    # O bitwise the one of the call that asks for it.
    torch.manual_seed(35)
    q = torch.randn(3, 1, 8, 128, device=gpu, dtype=BF16)
    k, v = (torch.randn(3, 512, 2, 128, device=gpu, dtype=BF16) for _ in range(2))
    lens = torch.tensor([1, 300, 512], dtype=torch.int32, device=gpu)
    extra = {}
    if paged:
        k, v = k.view(24, 64, 2, 128), v.view(24, 64, 2, 128)
        extra["page_table"] = torch.randperm(24, device=gpu).int().view(3, 8)
    kw = dict(cache_seqlens=lens, num_splits=num_splits, **extra)
    out = flash3.flash_attn_with_kvcache(q, k, v, **kw)
    ref, lse = flash3.flash_attn_with_kvcache(q, k, v, return_softmax_lse=True, **kw)
    assert torch.equal(out, ref) and lse.shape == (3, 8, 1)


@pytest.mark.parametrize("case,text", [
    (dict(k_dtype=FP16), "k_cache: dtype must be q's"),
    (dict(q_dtype=torch.float32, k_dtype=torch.float32, v_dtype=torch.float32), "q: dtype torch.float32"),
    (dict(v_seqlen=71), "v_cache: shape must be k_cache's"),
    (dict(head_dim=80), "q: head_dim 80 is not supported"),
    (dict(heads_kv=3), "k_cache: its heads (3) must divide q's (8)"),
    (dict(k_device="cpu"), "k_cache: must be on q's device"),
], ids=["k dtype", "float32", "v shape", "head dim", "gqa", "k on the cpu"])
def test_bad_cuda_kvcache_tensors_are_named(gpu, case, text):
    # Plain CUDA tensors take the KV cache's one-expression check first: anything it lets through would
    # reach the library unnamed. A cache of more entries than q's batch is valid (cache_batch_idx).
    d, hkv = case.get("head_dim", 128), case.get("heads_kv", 2)
    q = torch.zeros(2, 1, 8, d, device=gpu, dtype=case.get("q_dtype", BF16))
    k = torch.zeros(3, 70, hkv, d, device=case.get("k_device", gpu), dtype=case.get("k_dtype", BF16))
    v = torch.zeros(3, case.get("v_seqlen", 70), hkv, d, device=gpu, dtype=case.get("v_dtype", BF16))
    with pytest.raises(ValueError) as info:
        flash3.flash_attn_with_kvcache(q, k, v)
    assert text in str(info.value)
    good = torch.zeros(3, 70, 2, 128, device=gpu, dtype=BF16)
    assert flash3.flash_attn_with_kvcache(torch.zeros(2, 1, 8, 128, device=gpu, dtype=BF16), good, good).shape == \
        (2, 1, 8, 128)


@pytest.mark.parametrize("num_splits", [1, 0, 4])
def test_kvcache_decoding(gpu, num_splits):
    _check_kv_cache(*_cache_case(_CACHE_LENS, seed=num_splits), num_splits=num_splits)


@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("permute,pad", [(True, False), (False, True), (True, True)])
def test_kvcache_batch_idx_and_leftpad(gpu, permute, pad, num_splits):
    _check_kv_cache(*_cache_case(_CACHE_LENS, max_len=1024, extra=3, permute=permute, pad=pad), num_splits=num_splits)


@pytest.mark.parametrize("num_splits", [1, 5])
@pytest.mark.parametrize("seqlen_q", [1, 5, 200])
@pytest.mark.parametrize("causal,window", [(True, (-1, -1)), (False, (150, -1)), (True, (64, -1)), (False, (30, 10))])
def test_kvcache_causal_and_windows(gpu, seqlen_q, causal, window, num_splits):
    case = _cache_case([seqlen_q, seqlen_q + 1, 300, 1024, 777], seqlen_q=seqlen_q, pad=True, seed=seqlen_q)
    _check_kv_cache(*case, causal=causal, window=window, num_splits=num_splits)


@pytest.mark.parametrize("num_splits", [1, 6])
def test_kvcache_gqa_softcap_sinks(gpu, num_splits):
    _check_kv_cache(*_cache_case(_CACHE_LENS, hq=32, hkv=8), num_splits=num_splits)
    _check_kv_cache(*_cache_case(_CACHE_LENS, hq=4, hkv=1, dtype=FP16), softcap=20.0, num_splits=num_splits)
    sinks = torch.randn(8, device="cuda") * 2
    _check_kv_cache(*_cache_case(_CACHE_LENS), causal=True, sinks=sinks, num_splits=num_splits)
    _check_kv_cache(*_cache_case([0, 0, 0], seqlen_q=2, max_len=256), sinks=sinks, num_splits=num_splits)


def _e4m3(x, scale_shape):
    """x quantized to e4m3 with float32 descales of scale_shape: (1,), or
    (batch, n) with n heads of x or fewer (each scale serving a group of
    consecutive heads), from each group's largest magnitude."""
    b, _, h, _ = x.shape
    if scale_shape == (1,):
        amax = x.abs().amax().reshape(1)
    else:
        amax = x.abs().reshape(b, -1, scale_shape[1], h // scale_shape[1], x.shape[-1]).amax(dim=(1, 3, 4))
    descale = (amax.float() / 448).clamp(min=1e-12)
    full = descale if scale_shape == (1,) else descale.repeat_interleave(h // scale_shape[1], 1)[:, None, :, None]
    return (x.float() / full).to(E4M3), descale


def _check_fp8_cache(seqlens, seqlen_q=1, hq=32, hkv=8, d=128, q_scales="tensor", kv_scales="tensor", causal=False,
                     num_splits=0, page_size=0, seed=0):
    """An FP8 cache against the float64 reference on its dequantized values:
    q_scales "tensor", "kv_head" ((batch, heads_kv), FlashAttention-3's) or
    "head" ((batch, heads_q)); kv_scales "tensor" or "kv_head"; a paged
    copy of the cache in shuffled pages with page_size."""
    q, k_cache, v_cache, lens, _, _ = _cache_case(seqlens, seqlen_q=seqlen_q, max_len=1024, hq=hq, hkv=hkv, d=d,
                                                  seed=seed)
    batch = q.shape[0]
    shapes = {"tensor": (1,), "kv_head": (batch, hkv), "head": (batch, hq)}
    q8, qs = _e4m3(q, shapes[q_scales])
    k8, ks = _e4m3(k_cache, shapes[kv_scales])
    v8, vs = _e4m3(v_cache, shapes[kv_scales])
    kwargs = dict(cache_seqlens=lens, causal=causal, num_splits=num_splits, return_softmax_lse=True,
                  q_descale=qs, k_descale=ks, v_descale=vs)
    if page_size:
        pages = k8.shape[1] // page_size
        order = torch.randperm(batch * pages, generator=torch.Generator().manual_seed(seed)).cuda()
        k_pool, v_pool = (torch.empty((batch * pages, page_size) + t.shape[2:], dtype=E4M3, device="cuda")
                          for t in (k8, v8))
        k_pool.view(torch.uint8)[order] = k8.view(torch.uint8).reshape(batch * pages, page_size, hkv, d)
        v_pool.view(torch.uint8)[order] = v8.view(torch.uint8).reshape(batch * pages, page_size, hkv, d)
        out, lse = flash3.flash_attn_with_kvcache(q8, k_pool, v_pool, page_table=order.view(batch, pages).int(),
                                                  **kwargs)
    else:
        out, lse = flash3.flash_attn_with_kvcache(q8, k8, v8, **kwargs)
    assert out.dtype == BF16
    scale = d ** -0.5

    def dequantized(x8, descale, b, rows):
        x = x8[b:b + 1, :rows].double()
        if descale.dim() == 1:
            return x * descale.double()
        return x * descale[b].double().repeat_interleave(x.shape[2] // descale.shape[1])[None, None, :, None]

    for b in range(batch):
        n = int(lens[b])
        qd, kd, vd = dequantized(q8, qs, b, seqlen_q), dequantized(k8, ks, b, n), dequantized(v8, vs, b, n)
        ref, ref_lse = reference(qd, kd, vd, causal, scale)
        check_output(f"fp8 cache out[{b}] q {q_scales} kv {kv_scales}", out[b:b + 1], ref,
                     straightforward_fp8(qd, kd, vd, causal, scale, BF16))
        check_lse(lse[b:b + 1], ref_lse, fp8_lse_slack(qd, kd, d, scale)[~torch.isinf(ref_lse)])


@pytest.mark.parametrize("num_splits", [1, 0, 4])
@pytest.mark.parametrize("q_scales,kv_scales", [("tensor", "tensor"), ("kv_head", "kv_head"), ("head", "tensor"),
                                                ("tensor", "kv_head")])
def test_fp8_kvcache_decoding(gpu, q_scales, kv_scales, num_splits):
    """Decoding packs GQA with per-tensor and per-KV-head Q descales, not with per-query-head ones."""
    _check_fp8_cache(_CACHE_LENS, q_scales=q_scales, kv_scales=kv_scales, num_splits=num_splits)


@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("page_size", [0, 64])
def test_fp8_kvcache_causal_chunks_and_pages(gpu, page_size, num_splits):
    _check_fp8_cache([5, 6, 300, 1024, 777], seqlen_q=5, causal=True, hq=8, hkv=2, q_scales="kv_head",
                     kv_scales="kv_head", page_size=page_size, num_splits=num_splits, seed=page_size)
    _check_fp8_cache(_CACHE_LENS, page_size=page_size, num_splits=num_splits, seed=1)


@pytest.mark.parametrize("head_dim", interface.FP8_HEAD_DIMS)
def test_fp8_kvcache_head_dims(gpu, head_dim):
    with _skip_unless_built():
        _check_fp8_cache(_CACHE_LENS, seqlen_q=2, hq=8, hkv=2, d=head_dim, causal=True, q_scales="kv_head",
                         kv_scales="kv_head")


def test_fp8_kvcache_append_copies_rows(gpu):
    """Appended e4m3 rows land in the cache as they are, and are attended to."""
    q, k_cache, v_cache, lens, _, _ = _cache_case([0, 5, 200], seqlen_q=1, max_len=256, hq=8, hkv=2)
    q8, qs = _e4m3(q, (1,))
    k8, ks = _e4m3(k_cache, (1,))
    v8, vs = _e4m3(v_cache, (1,))
    k_new, v_new = k8[:, -3:].clone(), v8[:, -3:].clone()
    before_k, before_v = k8.clone(), v8.clone()
    out = flash3.flash_attn_with_kvcache(q8, k8, v8, k_new, v_new, cache_seqlens=lens, q_descale=qs, k_descale=ks,
                                         v_descale=vs)
    for b, n in enumerate([0, 5, 200]):
        want_k, want_v = before_k[b].clone(), before_v[b].clone()
        want_k[n:n + 3], want_v[n:n + 3] = k_new[b], v_new[b]
        assert torch.equal(k8[b].view(torch.uint8), want_k.view(torch.uint8))
        assert torch.equal(v8[b].view(torch.uint8), want_v.view(torch.uint8))
        kd, vd = k8[b:b + 1, :n + 3].double() * ks.double(), v8[b:b + 1, :n + 3].double() * vs.double()
        qd = q8[b:b + 1].double() * qs.double()
        ref, _ = reference(qd, kd, vd, False, 128 ** -0.5)
        check_output(f"fp8 append out[{b}]", out[b:b + 1], ref, straightforward_fp8(qd, kd, vd, False, 128 ** -0.5,
                                                                                      BF16))


@contextlib.contextmanager
def _skip_unless_built():
    """Skips a case whose kernels a narrowed build (FLASH3_HEAD_DIMS,
    FLASH3_DTYPES) left out, with the library's reason."""
    try:
        yield
    except NotImplementedError as e:
        if "not compiled into this build" not in str(e):
            raise
        pytest.skip(str(e))


@pytest.mark.parametrize("head_dim", interface.HEAD_DIMS)
def test_kvcache_head_dims(gpu, head_dim):
    with _skip_unless_built():
        _check_kv_cache(*_cache_case(_CACHE_LENS, seqlen_q=2, d=head_dim), causal=True, num_splits=0)


def test_kvcache_eager_append_bumps_the_caches_versions(gpu):
    """The eager path (no dispatcher) marks the caches it appends to as changed, as the operator does."""
    q, k_cache, v_cache, lens, _, _ = _cache_case([3, 10], max_len=64)
    before = (k_cache._version, v_cache._version)
    flash3.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens)
    assert (k_cache._version, v_cache._version) == before
    flash3.flash_attn_with_kvcache(q, k_cache, v_cache, k_cache[:, :1].clone(), v_cache[:, :1].clone(),
                                   cache_seqlens=lens)
    assert k_cache._version > before[0] and v_cache._version > before[1]


def test_kvcache_split_equals_unsplit(gpu):
    """Each split rounds P to bfloat16 against its own running max, so O
    differs by that rounding (2^-9 of each term), then by O's own: within
    2^-6 of the larger of the element and its row's RMS (an element near
    zero by cancellation keeps its row's error); the LSE within float32
    rounding. 64 and 128 splits leave the short entries' last splits
    without a key."""
    q, k_cache, v_cache, lens, _, _ = _cache_case([2000, 1, 0, 4096, 129], seqlen_q=3, max_len=4096)
    call = lambda s: flash3.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens, causal=True,  # noqa: E731
                                                    num_splits=s, return_softmax_lse=True)
    out, lse = call(1)
    for splits in (2, 7, 64, 128):
        o_s, lse_s = call(splits)
        rms = out.float().pow(2).mean(dim=-1, keepdim=True).sqrt()
        tol = torch.maximum(out.float().abs(), rms).clamp(min=1e-3) * 2.0 ** -6
        assert bool(((o_s.float() - out.float()).abs() <= tol).all()), splits
        assert torch.equal(torch.isinf(lse_s), torch.isinf(lse)), splits
        finite = ~torch.isinf(lse)
        assert torch.allclose(lse_s[finite], lse[finite], rtol=1e-5, atol=1e-5), splits


def test_kvcache_int_and_absent_seqlens(gpu):
    q, k_cache, v_cache, _, _, _ = _cache_case([5, 5], max_len=300)
    whole = flash3.flash_attn_with_kvcache(q, k_cache, v_cache, num_splits=1)
    ref = flash3.flash_attn_func(q, k_cache[:2], v_cache[:2])
    assert torch.equal(whole, ref)
    part = flash3.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=100, num_splits=1)
    assert torch.equal(part, flash3.flash_attn_func(q, k_cache[:2, :100], v_cache[:2, :100]))


def _decode_graph(q, k_cache, v_cache, lens, k, v, cos, sin, **kwargs):
    """A CUDA graph of one decoding step (append and rotary, GQA, split-KV),
    and its output tensor."""
    call = lambda: flash3.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, rotary_cos=cos,  # noqa: E731
                                                  rotary_sin=sin, cache_seqlens=lens, causal=True, **kwargs)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        call()  # warm-up outside the capture, as PyTorch asks
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call()
    return graph, out


@pytest.mark.parametrize("planned", [False, True])
def test_kvcache_graph_capture_replays_with_new_lengths(gpu, planned):
    """Decoding steps captured once and replayed with cache_seqlens advanced
    in place: each replay equals the eager call on the same cache, with
    get_scheduler_metadata's plan (fixed memory) or the graph pool's scratch."""
    batch, max_len, hq, hkv, d = 3, 2048, 16, 2, 128
    q, k_cache, v_cache, lens, _, _ = _cache_case([100, 700, 1500], max_len=max_len, hq=hq, hkv=hkv, d=d)
    g = torch.Generator(device="cuda").manual_seed(5)
    k = torch.randn(batch, 1, hkv, d, device="cuda", dtype=BF16, generator=g)
    v = torch.randn(batch, 1, hkv, d, device="cuda", dtype=BF16, generator=g)
    angle = torch.arange(max_len, device="cuda")[:, None] * 10000.0 ** (-torch.arange(32, device="cuda") / 32)
    cos, sin = angle.cos().to(BF16), angle.sin().to(BF16)
    kwargs = {}
    if planned:
        kwargs["scheduler_metadata"] = flash3.get_scheduler_metadata(
            batch, 1, max_len, hq, hkv, d, lens, max_seqlen_k_new=1, causal=True)
        assert kwargs["scheduler_metadata"].shape[0] > 1  # 6 tiles on the GPU's SMs: split
    k_eager, v_eager = k_cache.clone(), v_cache.clone()
    graph, out = _decode_graph(q, k_cache, v_cache, lens, k, v, cos, sin, **kwargs)
    # The warm-up appended once (the capture ran nothing): the same on the eager copies.
    flash3.flash_attn_with_kvcache(q, k_eager, v_eager, k, v, rotary_cos=cos, rotary_sin=sin, cache_seqlens=lens,
                                   causal=True, **kwargs)
    for step in range(4):
        lens += 1 + 37 * step
        k.normal_(generator=g)
        v.normal_(generator=g)
        graph.replay()
        expected = flash3.flash_attn_with_kvcache(q, k_eager, v_eager, k, v, rotary_cos=cos, rotary_sin=sin,
                                                  cache_seqlens=lens, causal=True, **kwargs)
        torch.cuda.synchronize()
        assert torch.equal(out, expected), step
        assert torch.equal(k_cache, k_eager) and torch.equal(v_cache, v_eager), step
        if step == 0:
            allocated = torch.cuda.memory_allocated()  # holding one step's expected output
    assert torch.cuda.memory_allocated() == allocated


def test_kvcache_scheduler_metadata(gpu):
    """The plan's split count is the call's own choice (the same bits), and
    a call larger than its plan, or given another split count, is refused."""
    q, k_cache, v_cache, lens, _, _ = _cache_case([100, 4000], max_len=4096, hq=32, hkv=8)
    plan = flash3.get_scheduler_metadata(2, 1, 4096, 32, 8, 128, lens)
    assert plan.dtype == torch.uint8 and plan.dim() == 2 and plan.device == q.device
    chosen = flash3.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens)
    planned = flash3.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens, scheduler_metadata=plan)
    assert torch.equal(chosen, planned)
    explicit = flash3.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens, num_splits=plan.shape[0])
    assert torch.equal(explicit, planned)
    with pytest.raises(ValueError, match="num_splits"):
        flash3.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens, scheduler_metadata=plan,
                                       num_splits=plan.shape[0] + 1)
    small = flash3.get_scheduler_metadata(1, 1, 4096, 32, 8, 128, lens[:1], num_splits=plan.shape[0])
    with pytest.raises(ValueError, match="kv_cache.workspace_bytes"):
        flash3.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens, scheduler_metadata=small)
    k, v = k_cache[:2, :1].clone(), v_cache[:2, :1].clone()
    with pytest.raises(ValueError, match="kv_cache.workspace_bytes"):  # planned without new keys
        flash3.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=lens, scheduler_metadata=plan)


# ---- flash_attn_combine ---------------------------------------------------------


def _combine_reference(o_partial, lse_partial):
    """float64 O and LSE [batch, seqlen, heads]: a part whose LSE is -inf
    weighs nothing (whatever its O holds); a row no part saw is O 0, LSE +inf."""
    lse = torch.logsumexp(lse_partial.double(), dim=0)
    w = torch.exp(lse_partial.double() - lse).nan_to_num(nan=0.0)
    out = (w[..., None] * o_partial.double().nan_to_num(nan=0.0)).sum(0)
    return out, torch.where(torch.isneginf(lse), torch.full_like(lse, math.inf), lse)


@pytest.mark.parametrize("splits", [1, 3, 16, 128])
@pytest.mark.parametrize("out_dtype", [torch.float32, BF16, FP16])
def test_combine_against_float64(gpu, splits, out_dtype):
    g = torch.Generator(device="cuda").manual_seed(splits)
    b, sq, h, d = 2, 7, 5, 128
    o = torch.randn(splits, b, sq, h, d, device="cuda", generator=g)
    lse = torch.randn(splits, b, sq, h, device="cuda", generator=g) * 3
    lse[0, 0, 0] = -math.inf  # a part with no key for these rows: its O is not read as a number
    o[0, 0, 0] = math.nan
    lse[:, 1, 2, 3] = -math.inf  # a row no part saw
    out, lse_out = flash3.flash_attn_combine(o, lse, out_dtype=out_dtype)
    ref, ref_lse = _combine_reference(o, lse)
    assert out.dtype == out_dtype and lse_out.shape == (b, sq, h)
    ulp = {torch.float32: 2.0 ** -20, BF16: 2.0 ** -7, FP16: 2.0 ** -10}[out_dtype]
    assert torch.allclose(out.double(), ref, rtol=ulp, atol=ulp), (out.double() - ref).abs().max()
    assert torch.equal(torch.isinf(lse_out), torch.isinf(ref_lse))
    assert torch.allclose(lse_out.double(), ref_lse, rtol=1e-6, atol=1e-6)
    assert torch.all(out[1, 2, 3] == 0)


def test_combine_layouts_and_head_dims(gpu):
    """FlashAttention-3's own partial layouts (the LSE's seqlen contiguous, O
    permuted), a head dim that is no multiple of 8, and a strided out."""
    g = torch.Generator(device="cuda").manual_seed(9)
    splits, b, sq, h = 4, 3, 9, 6
    lse = (torch.randn(splits, b, h, sq, device="cuda", generator=g) * 2).transpose(2, 3)
    for d in (64, 60, 4):
        o = torch.randn(splits, b, h, sq, d, device="cuda", generator=g).transpose(2, 3)
        ref, ref_lse = _combine_reference(o, lse)
        out, lse_out = flash3.flash_attn_combine(o, lse)
        assert torch.allclose(out.double(), ref, rtol=2.0 ** -20, atol=2.0 ** -20), d
        assert torch.allclose(lse_out.double(), ref_lse, rtol=1e-6, atol=1e-6), d
        wide = torch.zeros(b, sq, h, d + 8, device="cuda", dtype=BF16)
        out, _ = flash3.flash_attn_combine(o, lse, out=wide[..., :d])
        assert torch.allclose(out.double(), ref, rtol=2.0 ** -7, atol=2.0 ** -7), d
        assert torch.all(wide[..., d:] == 0), d


def test_combine_merges_attention_over_key_halves(gpu):
    """Attention over two halves of the keys, combined, is attention over all
    of them: the bf16 partials' rounding apart."""
    g = torch.Generator(device="cuda").manual_seed(4)
    q, k, v = (torch.randn(2, 300, 8, 128, device="cuda", dtype=BF16, generator=g) for _ in range(3))
    whole, whole_lse = flash3.flash_attn_func(q, k, v, return_attn_probs=True)
    parts = [flash3.flash_attn_func(q, k[:, s], v[:, s], return_attn_probs=True)
             for s in (slice(0, 170), slice(170, 300))]
    o = torch.stack([p[0].float() for p in parts])
    lse = torch.stack([p[1].transpose(1, 2) for p in parts])
    out, lse_out = flash3.flash_attn_combine(o, lse, out_dtype=BF16)
    assert torch.allclose(out.float(), whole.float(), rtol=2.0 ** -6, atol=2.0 ** -7)
    assert torch.allclose(lse_out, whole_lse.transpose(1, 2), rtol=1e-5, atol=1e-5)


# ---- Paged KV cache -------------------------------------------------------------


def _paged_case(seqlens, page_size, max_pages, seqlen_q=1, hq=8, hkv=2, d=128, dtype=BF16, spare=5, seed=0):
    """q, the page pools, the page_table and cache_seqlens: each entry's pages
    scattered over the pool in random order, and the plain caches [batch,
    max_pages * page_size, ...] they stand for. Every row the kernel must not
    read (pages no entry owns, rows past the 16-row group of an entry's last
    key) is NaN, which would show in the output."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    batch = len(seqlens)
    owned = [-(-n // page_size) for n in seqlens]
    pages = sum(owned) + spare
    order = torch.randperm(pages, generator=torch.Generator().manual_seed(seed)).tolist()
    table = torch.full((batch, max_pages), -1, dtype=torch.int32)
    nan = torch.full((pages, page_size, hkv, d), float("nan"), device="cuda", dtype=dtype)
    k_pool, v_pool = nan.clone(), nan.clone()
    plain_k = torch.zeros(batch, max_pages * page_size, hkv, d, device="cuda", dtype=dtype)
    plain_v = torch.zeros_like(plain_k)
    for b, n in enumerate(seqlens):
        table[b, :owned[b]] = torch.tensor(order[:owned[b]], dtype=torch.int32)
        order = order[owned[b]:]
        rows = min(-(-n // 16) * 16, owned[b] * page_size)
        for j0 in range(0, rows, page_size):
            page, count = int(table[b, j0 // page_size]), min(page_size, rows - j0)
            k_pool[page, :count] = torch.randn(count, hkv, d, device="cuda", dtype=dtype, generator=g)
            v_pool[page, :count] = torch.randn(count, hkv, d, device="cuda", dtype=dtype, generator=g)
            keys = min(count, n - j0)
            if keys > 0:
                plain_k[b, j0:j0 + keys] = k_pool[page, :keys]
                plain_v[b, j0:j0 + keys] = v_pool[page, :keys]
    q = torch.randn(batch, seqlen_q, hq, d, device="cuda", dtype=dtype, generator=g)
    lens = torch.tensor(seqlens, dtype=torch.int32, device="cuda")
    return q, k_pool, v_pool, table.cuda(), lens, plain_k, plain_v


def _check_paged(case, causal=False, window=(-1, -1), num_splits=0):
    q, k_pool, v_pool, table, lens, plain_k, plain_v = case
    out, lse = flash3.flash_attn_with_kvcache(q, k_pool, v_pool, cache_seqlens=lens, page_table=table, causal=causal,
                                              window_size=window, num_splits=num_splits, return_softmax_lse=True)
    scale = q.shape[-1] ** -0.5
    for b in range(q.shape[0]):
        n = int(lens[b])
        kb, vb = plain_k[b:b + 1, :n], plain_v[b:b + 1, :n]
        ref, ref_lse = reference(q[b:b + 1], kb, vb, causal, scale, None, window, 0.0)
        low = straightforward(q[b:b + 1], kb, vb, causal, scale, None, window, 0.0)
        check_output(f"out[{b}]", out[b:b + 1], ref, low)
        check_lse(lse[b:b + 1], ref_lse)
    # The same call on the plain caches.
    plain = flash3.flash_attn_with_kvcache(q, plain_k, plain_v, cache_seqlens=lens, causal=causal, window_size=window,
                                           num_splits=num_splits)
    assert torch.equal(out, plain)


def _page_edges(page_size, max_pages):
    return [0, 1, 15, 16, 17, page_size - 1, page_size, page_size + 1, 3 * page_size, max_pages * page_size]


@pytest.mark.parametrize("num_splits", [1, 0, 3])
@pytest.mark.parametrize("page_size", [16, 48, 64, 256])
def test_paged_kvcache_page_sizes(gpu, page_size, num_splits):
    max_pages = 2048 // page_size
    _check_paged(_paged_case(_page_edges(page_size, max_pages), page_size, max_pages, seed=page_size),
                 num_splits=num_splits)


@pytest.mark.parametrize("num_splits", [1, 4])
@pytest.mark.parametrize("seqlen_q", [1, 7, 130])
def test_paged_kvcache_causal_windows_gqa(gpu, seqlen_q, num_splits):
    lens = [seqlen_q, 300, 1024, 513]
    _check_paged(_paged_case(lens, 16, 64, seqlen_q=seqlen_q), causal=True, num_splits=num_splits)
    _check_paged(_paged_case(lens, 64, 20, seqlen_q=seqlen_q, hq=32, hkv=4), window=(100, -1), num_splits=num_splits)
    _check_paged(_paged_case(lens, 256, 4, seqlen_q=seqlen_q, hkv=1, dtype=FP16), causal=True, num_splits=num_splits)


@pytest.mark.parametrize("head_dim", interface.HEAD_DIMS)
def test_paged_kvcache_head_dims(gpu, head_dim):
    with _skip_unless_built():
        _check_paged(_paged_case(_page_edges(32, 40), 32, 40, seqlen_q=2, d=head_dim), causal=True)


# ---- Appending to the KV cache (k, v, rotary) -------------------------------------


def _rotate(x, cos, sin, interleaved):
    """x [..., d] in float32 rotated over its first rotary_dim = 2 *
    cos.shape[-1] dims by the angles cos, sin [..., rotary_dim / 2]: pairs
    (2i, 2i + 1) interleaved, else (i, i + rotary_dim / 2); the rest stays."""
    rd = 2 * cos.shape[-1]
    rot, rest = x[..., :rd], x[..., rd:]
    if interleaved:
        x0, x1 = rot[..., 0::2], rot[..., 1::2]
        out = torch.stack((x0 * cos - x1 * sin, x1 * cos + x0 * sin), dim=-1).flatten(-2)
    else:
        x0, x1 = rot.chunk(2, dim=-1)
        out = torch.cat((x0 * cos - x1 * sin, x1 * cos + x0 * sin), dim=-1)
    return torch.cat((out, rest), dim=-1)


def _rotary_tables(seqlen_ro, rotary_dim, dtype):
    freq = 10000.0 ** (-torch.arange(0, rotary_dim, 2, dtype=torch.float64, device="cuda") / rotary_dim)
    angle = torch.arange(seqlen_ro, dtype=torch.float64, device="cuda")[:, None] * freq
    return angle.cos().to(dtype), angle.sin().to(dtype)


def _scattered_pages(seqlens, seqlen_new, page_size, capacity, seed):
    """(pages, table): a pool of pages for entries of seqlens + seqlen_new keys, each entry's pages
    in random order, 3 spare, and the int32 [batch, capacity // page_size] table (-1 past an entry's)."""
    batch = len(seqlens)
    owned = [-(-(n + seqlen_new) // page_size) for n in seqlens]
    pages = sum(owned) + 3
    order = torch.randperm(pages, generator=torch.Generator().manual_seed(seed)).tolist()
    table = torch.full((batch, capacity // page_size), -1, dtype=torch.int32)
    for b in range(batch):
        table[b, :owned[b]] = torch.tensor(order[:owned[b]], dtype=torch.int32)
        order = order[owned[b]:]
    return pages, table


def _check_append(seqlens, seqlen_new, seqlen_q=1, capacity=512, page_size=0, hq=8, hkv=2, d=128, dtype=BF16,
                  rotary_dim=0, interleaved=True, causal=False, window=(-1, -1), permute=False, pad=False,
                  num_splits=0, seed=0):
    """Appends seqlen_new rows per entry to a contiguous cache (page_size 0)
    or a paged one, then checks: every cache element but the appended rows
    unchanged, those rows the new keys (rotated within an ulp) and values,
    cache_seqlens and q unchanged, and the output against the references
    over each entry's keys read back from the cache, with q rotated here."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    batch = len(seqlens)
    rnd = lambda *shape: torch.randn(*shape, device="cuda", dtype=dtype, generator=g)  # noqa: E731
    if page_size:
        pages, table = _scattered_pages(seqlens, seqlen_new, page_size, capacity, seed)
        k_cache, v_cache = rnd(pages, page_size, hkv, d), rnd(pages, page_size, hkv, d)
        row_of = lambda b, j: int(table[b, j // page_size]) * page_size + j % page_size  # noqa: E731
        extra = dict(page_table=table.cuda())
    else:
        k_cache, v_cache = rnd(batch + 2, capacity, hkv, d), rnd(batch + 2, capacity, hkv, d)
        entry = list(range(batch + 1, 1, -1)) if permute else list(range(batch))
        row_of = lambda b, j: entry[b] * capacity + j  # noqa: E731
        extra = dict(cache_batch_idx=torch.tensor(entry, dtype=torch.int32, device="cuda") if permute else None,
                     cache_leftpad=torch.tensor([min(n, 13 * b % 37) for b, n in enumerate(seqlens)],
                                                dtype=torch.int32, device="cuda") if pad else None)
    q, k, v = rnd(batch, seqlen_q, hq, d), rnd(batch, seqlen_new, hkv, d), rnd(batch, seqlen_new, hkv, d)
    lens = torch.tensor(seqlens, dtype=torch.int32, device="cuda")
    if rotary_dim:
        cos, sin = _rotary_tables(capacity, rotary_dim, dtype)
        extra.update(rotary_cos=cos, rotary_sin=sin, rotary_interleaved=interleaved)
    before_k, before_v, before_q, before_lens = k_cache.clone(), v_cache.clone(), q.clone(), lens.clone()
    out, lse = flash3.flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=lens, causal=causal,
                                              window_size=window, num_splits=num_splits, return_softmax_lse=True,
                                              **extra)
    assert torch.equal(lens, before_lens) and torch.equal(q, before_q)

    rows = [[row_of(b, seqlens[b] + j) for j in range(seqlen_new)] for b in range(batch)]
    positions = lens[:, None].long() + torch.arange(seqlen_new, device="cuda")
    want_k = k.float()
    if rotary_dim:
        want_k = _rotate(want_k, cos.float()[positions][:, :, None], sin.float()[positions][:, :, None], interleaved)
    want_k = want_k.to(dtype)
    flat = lambda t: t.reshape(-1, hkv, d)  # noqa: E731
    fresh = torch.zeros(flat(k_cache).shape[0], dtype=torch.bool, device="cuda")
    fresh[torch.tensor(sum(rows, []), device="cuda")] = True
    assert torch.equal(flat(k_cache)[~fresh], flat(before_k)[~fresh]), "K cache rows not appended changed"
    assert torch.equal(flat(v_cache)[~fresh], flat(before_v)[~fresh]), "V cache rows not appended changed"
    got_k = torch.stack([flat(k_cache)[r] for r in rows])
    got_v = torch.stack([flat(v_cache)[r] for r in rows])
    assert torch.equal(got_v, v)
    ulp = want_k.float().abs().clamp(min=1.0) * (2.0 ** -7 if dtype == BF16 else 2.0 ** -10)
    assert bool(((got_k.float() - want_k.float()).abs() <= ulp).all()), "appended keys"

    per_row = causal or window != (-1, -1)
    q_pos = lens[:, None].long() + (torch.arange(seqlen_q, device="cuda") if per_row else 0)
    q_ref = q
    if rotary_dim:
        q_ref = _rotate(q.float(), cos.float()[q_pos][:, :, None], sin.float()[q_pos][:, :, None],
                        interleaved).to(dtype)
    scale = d ** -0.5
    for b in range(batch):
        first = int(extra["cache_leftpad"][b]) if extra.get("cache_leftpad") is not None else 0
        keys = [row_of(b, j) for j in range(first, seqlens[b] + seqlen_new)]
        kb, vb = flat(k_cache)[keys][None], flat(v_cache)[keys][None]
        ref, ref_lse = reference(q_ref[b:b + 1], kb, vb, causal, scale, None, window, 0.0)
        low = straightforward(q_ref[b:b + 1], kb, vb, causal, scale, None, window, 0.0)
        check_output(f"out[{b}]", out[b:b + 1], ref, low)
        check_lse(lse[b:b + 1], ref_lse)


@pytest.mark.parametrize("num_splits", [1, 0, 3])
@pytest.mark.parametrize("seqlen_new", [1, 5, 130])
def test_append_kvcache_contiguous(gpu, seqlen_new, num_splits):
    _check_append([0, 1, 127, 128, 300, 512 - seqlen_new], seqlen_new, num_splits=num_splits, seed=seqlen_new)


@pytest.mark.parametrize("num_splits", [1, 4])
@pytest.mark.parametrize("permute,pad", [(True, False), (False, True), (True, True)])
def test_append_kvcache_batch_idx_leftpad_causal(gpu, permute, pad, num_splits):
    _check_append([0, 20, 40, 200, 509], 3, seqlen_q=3, causal=True, permute=permute, pad=pad, num_splits=num_splits)


@pytest.mark.parametrize("num_splits", [1, 0])
@pytest.mark.parametrize("seqlen_new", [1, 3, 17])
@pytest.mark.parametrize("page_size", [16, 64, 256])
def test_append_paged_kvcache_across_pages(gpu, page_size, seqlen_new, num_splits):
    lens = [0, page_size - 1, page_size, page_size + 1, 2 * page_size - seqlen_new, 1024 - seqlen_new]
    _check_append(lens, seqlen_new, capacity=1024, page_size=page_size, num_splits=num_splits, seed=page_size)


@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("rotary_dim", [128, 64, 16])
def test_append_kvcache_rotary(gpu, rotary_dim, interleaved, num_splits):
    lens = [0, 15, 64, 333]
    common = dict(rotary_dim=rotary_dim, interleaved=interleaved, num_splits=num_splits)
    _check_append(lens, 4, seqlen_q=4, **common)
    _check_append(lens, 4, seqlen_q=4, page_size=16, causal=True, **common)
    _check_append(lens, 2, seqlen_q=2, hq=32, hkv=4, pad=True, window=(50, -1), **common)


@pytest.mark.parametrize("head_dim", interface.HEAD_DIMS)
def test_append_kvcache_head_dims_fp16_mqa(gpu, head_dim):
    with _skip_unless_built():
        _check_append([0, 31, 400], 2, page_size=32, d=head_dim, rotary_dim=32, interleaved=True)
        _check_append([0, 100, 250], 5, seqlen_q=5, hq=16, hkv=1, d=head_dim, dtype=FP16, rotary_dim=32,
                      causal=True)


# ---- MLA (qv) -------------------------------------------------------------------


def _check_mla(seqlens, seqlen_q=1, hq=16, hkv=1, capacity=1024, page_size=0, seqlen_new=0, rotary_dim=0,
               causal=False, window=(-1, -1), wide=False, pad=False, num_splits=0, seed=0):
    """MLA's call (qv) against the float64 reference of attention with the
    rotary and latent parts concatenated (q|qv against k|v, values v), over
    each entry's keys read back from the cache. The cache is contiguous
    (page_size 0; wide: one [.., 576] tensor, latent then rotary, as
    FlashMLA's, given as its two views) or paged (pages scattered in random
    order); seqlen_new rows appended first (rotary_dim: the new keys and q
    rotated, checked here on the rotated values)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    d, dv = interface.MLA_HEAD_DIMS
    batch = len(seqlens)
    rnd = lambda *shape: torch.randn(*shape, device="cuda", dtype=BF16, generator=g)  # noqa: E731
    extra = {}
    if page_size:
        entries, table = _scattered_pages(seqlens, seqlen_new, page_size, capacity, seed)
        rows_per_entry = page_size
        row_of = lambda b, j: int(table[b, j // page_size]) * page_size + j % page_size  # noqa: E731
        extra["page_table"] = table.cuda()
    else:
        entries, rows_per_entry = batch, capacity
        row_of = lambda b, j: b * capacity + j  # noqa: E731
        if pad:
            extra["cache_leftpad"] = torch.tensor([min(n, 13 * b % 37) for b, n in enumerate(seqlens)],
                                                  dtype=torch.int32, device="cuda")
    if wide:
        cache = rnd(entries, rows_per_entry, hkv, dv + d)
        v_cache, k_cache = cache[..., :dv], cache[..., dv:]
    else:
        k_cache, v_cache = rnd(entries, rows_per_entry, hkv, d), rnd(entries, rows_per_entry, hkv, dv)
    q, qv = rnd(batch, seqlen_q, hq, d), rnd(batch, seqlen_q, hq, dv)
    lens = torch.tensor(seqlens, dtype=torch.int32, device="cuda")
    new = ()
    if seqlen_new:
        new = (rnd(batch, seqlen_new, hkv, d), rnd(batch, seqlen_new, hkv, dv))
    if rotary_dim:
        cos, sin = _rotary_tables(capacity, rotary_dim, BF16)
        extra.update(rotary_cos=cos, rotary_sin=sin, rotary_interleaved=False)
    out, lse = flash3.flash_attn_with_kvcache(q, k_cache, v_cache, *new, qv=qv, cache_seqlens=lens, causal=causal,
                                              window_size=window, num_splits=num_splits, return_softmax_lse=True,
                                              **extra)
    assert out.shape == (batch, seqlen_q, hq, dv) and out.dtype == BF16
    if seqlen_new:
        rows = torch.tensor([[row_of(b, seqlens[b] + j) for j in range(seqlen_new)] for b in range(batch)],
                            device="cuda")
        assert torch.equal(v_cache.reshape(-1, hkv, dv)[rows], new[1]), "appended latent rows"
    q_ref = q
    if rotary_dim:
        per_row = causal or window != (-1, -1)
        pos = lens[:, None].long() + (torch.arange(seqlen_q, device="cuda") if per_row else 0)
        q_ref = _rotate(q.float(), cos.float()[pos][:, :, None], sin.float()[pos][:, :, None], False).to(BF16)
    scale = (d + dv) ** -0.5
    for b in range(batch):
        first = int(extra["cache_leftpad"][b]) if "cache_leftpad" in extra else 0
        keys = torch.tensor([row_of(b, j) for j in range(first, seqlens[b] + seqlen_new)], dtype=torch.long,
                            device="cuda")
        kb, vb = k_cache.reshape(-1, hkv, d)[keys][None], v_cache.reshape(-1, hkv, dv)[keys][None]
        qb, kcat = torch.cat((q_ref[b:b + 1], qv[b:b + 1]), -1), torch.cat((kb, vb), -1)
        ref, ref_lse = reference(qb, kcat, vb, causal, scale, None, window, 0.0)
        low = straightforward(qb, kcat, vb, causal, scale, None, window, 0.0)
        check_output(f"out[{b}]", out[b:b + 1], ref, low)
        check_lse(lse[b:b + 1], ref_lse)


@pytest.mark.parametrize("num_splits", [1, 0, 3])
@pytest.mark.parametrize("hq", [16, 128])
def test_mla_decoding(gpu, hq, num_splits):
    _check_mla(_CACHE_LENS, hq=hq, num_splits=num_splits, seed=hq)
    _check_mla([5, 700], hq=hq, wide=True, pad=True, num_splits=num_splits)


@pytest.mark.parametrize("num_splits", [1, 4])
@pytest.mark.parametrize("page_size", [16, 64])
def test_mla_paged(gpu, page_size, num_splits):
    _check_mla(_page_edges(page_size, 1024 // page_size), page_size=page_size, num_splits=num_splits, seed=page_size)


@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize("heads", [(8, 1), (12, 2)])
@pytest.mark.parametrize("seqlen_q,causal,window", [(2, True, (-1, -1)), (70, True, (-1, -1)), (3, False, (40, -1))])
def test_mla_query_rows_and_masks(gpu, seqlen_q, causal, window, heads, num_splits):
    """Several query positions packed with the heads as a tile's rows: groups of 8 (a tile holds 8 positions)
    and 6 (positions straddle tiles), the causal mask and a window by each row's position."""
    hq, hkv = heads
    _check_mla([seqlen_q, 100, 1000], seqlen_q=seqlen_q, hq=hq, hkv=hkv, causal=causal, window=window,
               num_splits=num_splits)


@pytest.mark.parametrize("num_splits", [1, 0])
def test_mla_speculative_decoding(gpu, num_splits):
    """Two tokens of 128 heads (DeepSeek's multi-token prediction): four tiles of one position each."""
    _check_mla([2, 63, 1000, 1024], seqlen_q=2, hq=128, causal=True, num_splits=num_splits)


@pytest.mark.parametrize("num_splits", [1, 3])
def test_mla_append_with_rotary(gpu, num_splits):
    _check_mla([0, 63, 500], seqlen_new=1, rotary_dim=64, num_splits=num_splits)
    _check_mla([0, 63, 500], seqlen_q=2, seqlen_new=2, rotary_dim=32, page_size=64, causal=True,
               num_splits=num_splits)
