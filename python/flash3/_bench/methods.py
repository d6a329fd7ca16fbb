"""The attention methods the benchmark times, their workloads, and the check
of their results against a float32 reference.

Every method takes and returns [batch, seqlen, heads, head_dim] tensors (the
layout of flash3 and FlashAttention); SDPA gets [batch, heads, seqlen,
head_dim] views of the same memory, no copies. The sweep's sequence lengths
of Q and K are equal, so SDPA's top-left causal mask is flash3's
bottom-right one.
"""
import contextlib
import re
import statistics
import warnings

# The check covers batch 0 and the first CHECK_HEADS heads: the float32
# reference materializes seqlen^2 scores per head (1 GB a head at 16k, several
# such tensors in the backward).
CHECK_HEADS = 2


class Method:
    """call(q, k, v, causal) in the method's own layout: "bshd" ([batch, seqlen, heads, head_dim]) or
    "bhsd" (SDPA's); attention() takes and returns bshd either way."""

    def __init__(self, name, call, layout="bshd", context=contextlib.nullcontext):
        self.name = name
        self.call = call
        self.layout = layout
        self.context = context  # entered around every use: SDPA's backend choice

    def to_layout(self, *tensors):
        """bshd tensors as views in the method's layout."""
        return [x.transpose(1, 2) if self.layout == "bhsd" else x for x in tensors]

    def attention(self, q, k, v, causal):
        out = self.call(*self.to_layout(q, k, v), causal)
        return self.to_layout(out)[0]


def first(out):
    """Some FlashAttention releases return (out, softmax_lse): the output either way."""
    return out[0] if isinstance(out, tuple) else out


def _flash3(torch):
    import flash3
    return Method("flash3", lambda q, k, v, causal: flash3.flash_attn_func(q, k, v, causal=causal))


def _sdpa(name, backend_name):
    def load(torch):
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
        backend = getattr(SDPBackend, backend_name)
        return Method(name, lambda q, k, v, causal: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
                      "bhsd", lambda: sdpa_kernel([backend]))
    return load


def _fa3(torch):
    import flash_attn_interface
    return Method("fa3", lambda q, k, v, causal: first(flash_attn_interface.flash_attn_func(q, k, v, causal=causal)))


def _fa2(torch):
    from flash_attn import flash_attn_func
    return Method("fa2", lambda q, k, v, causal: first(flash_attn_func(q, k, v, causal=causal)))


LOADERS = {"flash3": _flash3, "sdpa_flash": _sdpa("sdpa_flash", "FLASH_ATTENTION"),
           "sdpa_cudnn": _sdpa("sdpa_cudnn", "CUDNN_ATTENTION"), "fa3": _fa3, "fa2": _fa2}


def load_methods(torch, names):
    """({name: Method} for those that load here, {name: why not} for peers that do not import).

    flash3's own import errors propagate: without it there is nothing to compare.
    """
    loaded, missing = {}, {}
    for name in names:
        try:
            loaded[name] = LOADERS[name](torch)
        except ImportError as e:
            if name == "flash3":
                raise
            missing[name] = f"not importable ({e})"
    return loaded, missing


# ---- workloads -----------------------------------------------------------------------------

def make_inputs(torch, shape, seed):
    """q, k, v ~ N(0, 1) (requiring grad for the backward passes) and dO, from a seeded generator; v and
    dO of V's head dim (hdim_v, where the shape has one of its own)."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[shape["dtype"]]
    size = (shape["batch"], shape["seqlen"], shape["heads"], shape["hdim"])
    size_v = size[:3] + (shape.get("hdim_v", shape["hdim"]),)
    grad = shape["pass"] != "fwd"
    q, k, v = (torch.randn(s, generator=gen, device="cuda", dtype=dtype).requires_grad_(grad)
               for s in (size, size, size_v))
    dout = torch.randn(size_v, generator=gen, device="cuda", dtype=dtype) if grad else None
    return q, k, v, dout


def workload(torch, method, shape, inputs):
    """The callable to time: the forward call, the backward of one kept forward, or both."""
    q, k, v, dout = inputs
    causal = shape["causal"]
    if shape["pass"] == "fwd":
        return lambda: method.attention(q, k, v, causal)
    if shape["pass"] == "fwd+bwd":
        return lambda: torch.autograd.grad(method.attention(q, k, v, causal), (q, k, v), dout)
    out = method.attention(q, k, v, causal)
    return lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)


# ---- the check --------------------------------------------------------------------------------

def low_precision_attention(torch, q, k, v, causal):
    """Standard attention on [b, s, h, d] in the inputs' dtype: S = Q K^T and O = P V rounded to it, the
    softmax in float32 and P rounded before P V; autograd gives its backward in the same precision."""
    q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    if causal:
        scores = scores.masked_fill(causal_mask(torch, scores), float("-inf"))
    p = torch.softmax(scores.float(), dim=-1).to(q.dtype)
    return (p @ v).transpose(1, 2)


def causal_mask(torch, scores):
    """True above the diagonal: equal sequence lengths, so top-left and bottom-right alignment agree."""
    return torch.ones(scores.shape[-2:], dtype=torch.bool, device=scores.device).triu(1)


def float32_attention(torch, q, k, v, dout, causal, o_for_delta=None):
    """[O], or [O, dQ, dK, dV] given dout, all float32 on [b, s, h, d].

    The backward is written out so that D = rowsum(dO o O) can come from
    o_for_delta, a kernel's rounded O, as flash3 and FlashAttention take it.
    """
    q, k, v = (x.float().transpose(1, 2) for x in (q, k, v))
    scale = q.shape[-1] ** -0.5
    scores = (q @ k.transpose(-1, -2)) * scale
    if causal:
        scores = scores.masked_fill(causal_mask(torch, scores), float("-inf"))
    p = torch.softmax(scores, dim=-1)
    o = p @ v
    if dout is None:
        return [o.transpose(1, 2)]
    do = dout.float().transpose(1, 2)
    o_used = o if o_for_delta is None else o_for_delta.float().transpose(1, 2)
    ds = p * (do @ v.transpose(-1, -2) - (do * o_used).sum(dim=-1, keepdim=True))
    grads = (ds @ k * scale, ds.transpose(-1, -2) @ q * scale, p.transpose(-1, -2) @ do)
    return [x.transpose(1, 2) for x in (o,) + grads]


def check(torch, method, shape, inputs):
    """({max_err, ref_err}, None or why it failed) for O, and dQ, dK, dV in the backward passes.

    flash3-bench's rule, per tensor: max |x - ref| <= 2 max |low - ref| + eps,
    ref the float32 reference and low the same attention in the inputs'
    precision. eps: 1e-5 for O; for a gradient, twice what taking D from the
    kernel's rounded O moves the reference, plus 1e-4 of its largest element
    and 1e-5 (flash3's reference::backward_epsilon).
    """
    q, k, v, dout = inputs
    causal, grad = shape["causal"], shape["pass"] != "fwd"
    part = (slice(0, 1), slice(None), slice(0, CHECK_HEADS))
    out = method.attention(q, k, v, causal)
    got = [out] + (list(torch.autograd.grad(out, (q, k, v), dout)) if grad else [])
    got = [x[part].detach() for x in got]
    q, k, v = (x[part].detach() for x in (q, k, v))
    dout = dout[part] if grad else None
    exact = float32_attention(torch, q, k, v, dout, causal)
    leaves = [x.clone().requires_grad_(grad) for x in (q, k, v)]
    low_out = low_precision_attention(torch, *leaves, causal)
    low = [low_out] + (list(torch.autograd.grad(low_out, leaves, dout)) if grad else [])
    eps = [1e-5]
    if grad:
        moved = float32_attention(torch, q, k, v, dout, causal, o_for_delta=got[0])
        eps += [2 * (m - r).abs().max().item() + 1e-4 * r.abs().max().item() + 1e-5
                for m, r in zip(moved[1:], exact[1:])]
    stats, failure = {"max_err": 0.0, "ref_err": 0.0}, None
    for name, x, r, lo, e in zip(("O", "dQ", "dK", "dV"), got, exact, low, eps):
        err = (x.float() - r).abs().max().item()
        base = (lo.float() - r).abs().max().item()
        stats["max_err"], stats["ref_err"] = max(stats["max_err"], err), max(stats["ref_err"], base)
        if failure is None and not torch.isfinite(x).all():
            failure = f"{name}: NaN or inf"
        elif failure is None and err > 2 * base + e:
            failure = f"{name}: max error {err:.2e} above 2x the same-precision reference's {base:.2e} + {e:.1e}"
    return stats, failure


def failure_reason(caught, error):
    """The error with the warnings raised beside it (SDPA states its reasons only in warnings), one line."""
    parts = [re.sub(r"\s*\(Triggered internally at [^)]*\)", "", str(w.message)) for w in caught]
    parts.append(f"{type(error).__name__}: {error}")
    unique = dict.fromkeys(" ".join(p.split()) for p in parts if p.strip())
    return "; ".join(unique)[:400]


@contextlib.contextmanager
def recording_warnings():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield caught


def timed(timer, make, check):
    """(samples, None): the sample times (ms) of the call make() returns, or
    (None, why) when it has none: check(fn) (None, or why the call's result
    is off; None: not checked) failed, or making or calling it raised (no
    kernel for the layout, not importable, out of memory)."""
    with recording_warnings() as caught:
        try:
            fn = make()
            failure = check(fn) if check else None
            if failure:
                return None, f"check failed: {failure}"
            return timer.measure(fn)[0], None
        except Exception as e:
            return None, failure_reason(caught, e)


def time_methods(torch, timer, methods, check, value):
    """({name: value(name, median ms)}, {name: why it has none}) of the (name, make) methods, each timed
    by timed() with the same check, the allocator's cache emptied after each."""
    got, not_run = {}, {}
    for name, make in methods:
        samples, why = timed(timer, make, check)
        if samples is None:
            not_run[name] = why
        else:
            got[name] = value(name, statistics.median(samples))
        torch.cuda.empty_cache()
    return got, not_run
