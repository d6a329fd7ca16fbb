"""flash3's public functions, with FlashAttention-3's names, argument order and
defaults (hopper/flash_attn_interface.py), so that swapping the import is the
whole migration.

Every argument is checked here, in Python, before any library call: a bad one
raises ValueError naming it (NotImplementedError for FlashAttention-3 features
flash3 does not have), on any machine, with or without the library or a GPU.
Tensors are [batch, seqlen, heads, head_dim] on one CUDA device (or the meta
device, for shape inference); any strides the kernels accept, a head dim of
stride other than 1 being copied to a contiguous one first (as FlashAttention-3
does). The call runs on the tensors' device and PyTorch's current stream.
"""
import math
import numbers

import torch

from . import _abi, _ops

HEAD_DIMS = (64, 96, 128, 192, 256)
FP8_HEAD_DIMS = tuple(_abi.FP8_BLOCK_SIZES)
# (q and k's head dim, v's) where v's is its own (DeepSeek-V3's 192 / 128):
# bfloat16 and float16, both passes.
HEAD_DIM_PAIRS = ((192, 128),)
# MLA's (qv): the rotary part's head dim (q, k_cache) and the latent part's (qv, v_cache, out).
MLA_HEAD_DIMS = (64, 512)
_E4M3 = torch.float8_e4m3fn
_OUT_DTYPES = (torch.bfloat16, torch.float16)
_KV_DTYPES = _OUT_DTYPES + (_E4M3,)  # a KV cache's (and its q's)


def _not_supported(**values_and_defaults):
    """NotImplementedError for a FlashAttention-3 argument that flash3 does
    not support yet, given anything but its default."""
    for name, (value, default) in values_and_defaults.items():
        if value is default:
            continue
        if value is None or default is None or value != default:
            raise NotImplementedError(
                f"{name}: flash3 does not support {name}={value!r} (only the default {default!r})")


_LAYOUTS = {4: "[batch, seqlen, heads, head_dim]", 3: "[total_tokens, heads, head_dim] (packed sequences)"}


def _check_tensor(name, t, dims=4):
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != dims:
        raise ValueError(f"{name}: must have {dims} dims {_LAYOUTS[dims]}, got shape {tuple(t.shape)}")


def _plainly_valid(q, k, v, dtypes, head_dims, same_batch=True):
    """Whether q, k, v pass every check of _check_qkv (or, with k and v a KV
    cache, whose batch is its own: same_batch False, _check_kv_cache's),
    tested in one expression over plain CUDA tensors: the per-call cost of
    the common case. False sends them through the checks that name what is
    wrong."""
    if not (type(q) is torch.Tensor and type(k) is torch.Tensor and type(v) is torch.Tensor):
        return False
    qs, ks = q.shape, k.shape
    dtype = q.dtype
    return (len(qs) == 4 and len(ks) == 4 and v.shape == ks and dtype in dtypes and k.dtype == dtype
            and v.dtype == dtype and q.is_cuda and k.device == q.device and v.device == q.device
            and (ks[0] == qs[0] or not same_batch) and ks[3] == qs[3]
            and qs[3] in (head_dims or (FP8_HEAD_DIMS if dtype == _E4M3 else HEAD_DIMS))
            and ks[2] != 0 and qs[2] % ks[2] == 0 and qs[2] != 0)


def _check_qkv(q, k, v, dtypes, head_dims=None, dims=4):
    """Devices, dtypes, shapes, head dims and GQA of q, k, v; head_dims None:
    those of q's dtype, and v's own head dim of HEAD_DIM_PAIRS in 16 bits
    (given head_dims, v's is q's); dims 3: packed sequences, whose batch is
    not a mode."""
    if dims == 4 and _plainly_valid(q, k, v, dtypes, head_dims):
        return
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_tensor(name, t, dims)
    if q.device.type not in ("cuda", "meta"):
        raise ValueError(f"q: must be a CUDA tensor (flash3 runs on Hopper GPUs), got device {q.device}")
    for name, t in (("k", k), ("v", v)):
        if t.device != q.device:
            raise ValueError(f"{name}: must be on q's device {q.device}, got {t.device}")
    if q.dtype not in dtypes:
        raise ValueError(f"q: dtype {q.dtype} is not supported: flash3 takes "
                         + ", ".join(str(d) for d in dtypes))
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype:
            raise ValueError(f"{name}: dtype must be q's ({q.dtype}), got {t.dtype}")
    if dims == 4 and k.shape[0] != q.shape[0]:
        raise ValueError(f"k: batch must be q's ({q.shape[0]}), got {k.shape[0]}")
    pairs = HEAD_DIM_PAIRS if head_dims is None and q.dtype != _E4M3 else ()
    if head_dims is None:
        head_dims = FP8_HEAD_DIMS if q.dtype == _E4M3 else HEAD_DIMS
    _check_heads_and_dims(q, k, v, ("k", "v"), head_dims, pairs)


def _check_heads_and_dims(q, k, v, names, head_dims, pairs):
    """k's and v's shapes against q's (their last two modes heads and head
    dim): k's head dim q's, v's shape k's but for its head dim, q's head dim
    in head_dims, v's q's or a pair's, k's heads dividing q's."""
    heads_q, head_dim = q.shape[-2:]
    if k.shape[-1] != head_dim:
        raise ValueError(f"{names[0]}: head_dim must be q's ({head_dim}), got {k.shape[-1]}")
    if v.shape[:-1] != k.shape[:-1]:
        raise ValueError(f"{names[1]}: shape must be {names[0]}'s {tuple(k.shape)} (but for its head dim), "
                         f"got {tuple(v.shape)}")
    if head_dim not in head_dims:
        raise ValueError(f"q: head_dim {head_dim} is not supported{' with FP8' if head_dims is FP8_HEAD_DIMS else ''}: "
                         f"flash3 has {', '.join(map(str, head_dims))}")
    head_dim_v = v.shape[-1]
    if head_dim_v != head_dim and (head_dim, head_dim_v) not in pairs:
        own = " or ".join(f"{dv} with q's {d}" for d, dv in pairs)
        raise ValueError(f"{names[1]}: head_dim must be q's ({head_dim}){', or ' + own if own else ''}, "
                         f"got {head_dim_v}")
    heads_kv = k.shape[-2]
    if heads_q == 0 or heads_kv == 0 or heads_q % heads_kv != 0:
        raise ValueError(f"{names[0]}: its heads ({heads_kv}) must divide q's ({heads_q}): MHA, GQA or MQA")


def _scale_granularity(name, t, device, shapes):
    """The granularity of one descale tensor (None: absent), from its shape;
    `shapes` maps each granularity to the shapes it may have."""
    if t is None:
        return None
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: must be a torch.Tensor or None, got {type(t).__name__}")
    if t.dtype != torch.float32:
        raise ValueError(f"{name}: must be float32, got {t.dtype}")
    if t.device != device:
        raise ValueError(f"{name}: must be on q's device {device}, got {t.device}")
    if t.dim() <= 1 and t.numel() == 1:
        return _abi.PER_TENSOR
    shape = tuple(t.shape)
    for granularity in (_abi.PER_HEAD, _abi.PER_BLOCK):
        if shape in shapes[granularity]:
            return granularity
    per_block = f", or per block {shapes[_abi.PER_BLOCK][0]} (flash3.quantize_fp8 writes them)" \
        if shapes[_abi.PER_BLOCK] else " (a KV cache has no per-block descales)"
    raise ValueError(f"{name}: shape {shape} is none of the descale layouts: one value (shape (1,)), per head "
                     f"{' or '.join(map(str, shapes[_abi.PER_HEAD]))}{per_block}")


def _fp8_scales(device, sizes, q_descale, k_descale, v_descale):
    """The three descales in flash3's layouts, at the finest granularity any of
    them has: the coarser ones (and ones for an absent one, as in
    FlashAttention-3) broadcast to it. A (batch, heads_kv) Q descale, as
    FlashAttention-3 takes it, serves every query head of its group. sizes:
    (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim); packed
    sequences' batch is the number of sequences, their seqlens the longest's."""
    batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim = sizes
    block_q, block_kv = _abi.FP8_BLOCK_SIZES[head_dim]
    q_shapes = {_abi.PER_HEAD: [(batch, heads_kv), (batch, heads_q)] if heads_q != heads_kv else [(batch, heads_q)],
                _abi.PER_BLOCK: [_ops.scale_shape(_abi.PER_BLOCK, batch, heads_q, seqlen_q, block_q)]}
    kv_shapes = {_abi.PER_HEAD: [(batch, heads_kv)],
                 _abi.PER_BLOCK: [_ops.scale_shape(_abi.PER_BLOCK, batch, heads_kv, seqlen_k, block_kv)]}
    given = [(t, _scale_granularity(name, t, device, shapes), heads, seqlen, block)
             for name, t, shapes, heads, seqlen, block in (
                 ("q_descale", q_descale, q_shapes, heads_q, seqlen_q, block_q),
                 ("k_descale", k_descale, kv_shapes, heads_kv, seqlen_k, block_kv),
                 ("v_descale", v_descale, kv_shapes, heads_kv, seqlen_k, block_kv))]
    target = max((g for _, g, *_ in given if g is not None), default=_abi.PER_TENSOR)
    scales = []
    for t, g, heads, seqlen, block in given:
        if t is None:
            t, g = torch.ones(1, dtype=torch.float32, device=device), _abi.PER_TENSOR
        if target == _abi.PER_TENSOR:
            t = t.reshape(1)
        else:
            if g == _abi.PER_TENSOR:
                t = t.reshape(1, 1)
            elif g == _abi.PER_HEAD and t.shape[1] != heads:
                t = t.repeat_interleave(heads // t.shape[1], dim=1)
            if target == _abi.PER_BLOCK and g != _abi.PER_BLOCK:
                t = t.unsqueeze(-1)
            t = t.expand(_ops.scale_shape(target, batch, heads, seqlen, block))
        scales.append(t.contiguous())
    return scales


_SINK_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _checked_sinks(sinks, q, heads_dim=2):
    """The sinks as the kernels read them (float32, one per query head,
    dense), converted differentiably; None stays None. Their values live on
    the device and are not read here: they must be finite."""
    if sinks is None:
        return None
    if not isinstance(sinks, torch.Tensor):
        raise ValueError(f"sinks: must be a torch.Tensor or None, got {type(sinks).__name__}")
    heads = q.shape[heads_dim]
    if tuple(sinks.shape) != (heads,):
        raise ValueError(f"sinks: must have shape ({heads},), one logit per query head, got {tuple(sinks.shape)}")
    if sinks.dtype not in _SINK_DTYPES:
        raise ValueError(f"sinks: must be torch.float32, torch.bfloat16 or torch.float16, got {sinks.dtype}")
    if sinks.device != q.device:
        raise ValueError(f"sinks: must be on q's device {q.device}, got {sinks.device}")
    return sinks.float().contiguous()


_NO_WINDOW = (-1, -1)


def _checked_window(window_size, causal):
    """FlashAttention's window_size as the library takes it: (left, right),
    ints >= -1, -1 unbounded; causal makes right 0, as FlashAttention-3 does."""
    if not (isinstance(window_size, (tuple, list)) and len(window_size) == 2
            and all(isinstance(x, numbers.Integral) and not isinstance(x, bool) for x in window_size)):
        raise ValueError(f"window_size: must be a pair of ints (left, right), -1 for unbounded, got {window_size!r}")
    left, right = (int(x) for x in window_size)
    if left < -1 or right < -1:
        raise ValueError(f"window_size: each bound must be -1 (unbounded) or >= 0, got {tuple(window_size)!r}")
    return left, 0 if causal else right


def _checked_softcap(softcap):
    """softcap as a float: 0 (off) or finite and positive."""
    if isinstance(softcap, bool) or not isinstance(softcap, numbers.Real) or not (
            math.isfinite(softcap) and softcap >= 0):
        raise ValueError(f"softcap: must be a finite number >= 0 (0 is off), got {softcap!r}")
    return float(softcap)


def _mask(window_size, causal, softcap):
    """The mask policy's scalars (window_left, window_right, softcap)."""
    if type(window_size) is tuple and window_size == _NO_WINDOW and type(softcap) is float and softcap == 0.0:
        return _ops._NO_MASK
    return (*_checked_window(window_size, causal), _checked_softcap(softcap))


def _checked_scale(softmax_scale, q):
    """softmax_scale as a float; None is 1/sqrt(head_dim)."""
    if softmax_scale is None:
        return q.shape[-1] ** -0.5
    # 0 would select the default in the library: refused, as any value that
    # would not scale the scores as asked.
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, numbers.Real) or not (
            math.isfinite(softmax_scale) and softmax_scale > 0):
        raise ValueError(f"softmax_scale: must be a finite positive number or None "
                         f"(1/sqrt(head_dim)), got {softmax_scale!r}")
    return float(softmax_scale)


def _check_fp8_forward(q, k, v, mask):
    """What the FP8 forward lacks: a backward pass, and softcapping."""
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        raise NotImplementedError("q: FP8 (float8_e4m3fn) attention has no backward pass in flash3: "
                                  "call it on tensors that do not require grad, or under torch.no_grad()")
    if mask[2] != 0.0:
        raise NotImplementedError("softcap: the FP8 (float8_e4m3fn) forward has no softcapping in flash3")


def _check_no_descales(q, q_descale, k_descale, v_descale):
    for name, t in (("q_descale", q_descale), ("k_descale", k_descale), ("v_descale", v_descale)):
        if t is not None:
            raise ValueError(f"{name}: descales are for float8_e4m3fn inputs; q is {q.dtype}")


def _attend(q, k, v, softmax_scale, causal, q_descale, k_descale, v_descale, deterministic, return_attn_probs,
            out_dtype, sinks, window_size, softcap):
    """flash_attn_func and flash_attn_qkvpacked_func past their own arguments."""
    _check_qkv(q, k, v, _ops.DTYPES)
    sinks = _checked_sinks(sinks, q)
    mask = _mask(window_size, causal, softcap)
    softmax_scale = _checked_scale(softmax_scale, q)
    if q.dtype == _E4M3:
        if out_dtype is None:
            out_dtype = torch.bfloat16
        elif out_dtype not in _OUT_DTYPES:
            raise ValueError(f"out_dtype: FP8 attention writes torch.bfloat16 or torch.float16, got {out_dtype}")
        _check_fp8_forward(q, k, v, mask)
        (batch, seqlen_q, heads_q, head_dim), (seqlen_k, heads_kv) = q.shape, k.shape[1:3]
        scales = _fp8_scales(q.device, (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim), q_descale,
                             k_descale, v_descale)
    else:
        _check_no_descales(q, q_descale, k_descale, v_descale)
        if out_dtype is not None and out_dtype != q.dtype:
            raise ValueError(f"out_dtype: {q.dtype} inputs give a {q.dtype} output, got {out_dtype}")
        out_dtype = q.dtype
        scales = (None, None, None)
    out, lse = _ops.attention(q, k, v, *scales, softmax_scale, bool(causal), bool(deterministic), out_dtype,
                              bool(return_attn_probs), sinks, mask)
    return (out, lse) if return_attn_probs else out


def flash_attn_func(q, k, v, softmax_scale=None, causal=False, qv=None, q_descale=None, k_descale=None,
                    v_descale=None, window_size=(-1, -1), attention_chunk=0, softcap=0.0, num_splits=1,
                    pack_gqa=None, deterministic=False, sm_margin=0, return_attn_probs=False, *, out_dtype=None,
                    sinks=None):
    """softmax(softmax_scale * q k^T [causal mask]) v, as FlashAttention-3's.

    q, k: [batch, seqlen_q / seqlen_k, heads_q / heads_kv, head_dim]; v:
    [batch, seqlen_k, heads_kv, head_dim_v], head_dim_v = head_dim or, with
    head_dim 192 in bfloat16 and float16, 128 (DeepSeek-V3's); heads_kv
    dividing heads_q (MHA, GQA, MQA); torch.bfloat16 or
    torch.float16 (differentiable), or torch.float8_e4m3fn with float32
    descales (forward only): shape (1,) per tensor, (batch, heads_kv) per head
    as FlashAttention-3 takes them (or (batch, heads_q) for q), or the per-block
    layouts of flash3.quantize_fp8; absent ones are 1. Head dims 64, 96, 128,
    192, 256 (FP8: 64, 128, 256). The causal mask is aligned to the bottom
    right corner. softmax_scale None is 1/sqrt(head_dim). deterministic makes
    the backward pass bitwise reproducible.

    Returns out [batch, seqlen_q, heads_q, head_dim_v] (q's dtype; FP8:
    out_dtype, torch.bfloat16 by default), and with return_attn_probs
    (out, lse), lse the float32 [batch, heads_q, seqlen_q] log-sum-exp of
    each row's scaled scores.

    sinks: attention sinks (as in gpt-oss), a [heads_q] tensor of logits
    (float32, bfloat16 or float16; finite), one per query head, that join
    each row's softmax denominator without a value; differentiable. A row
    that sees no key then gives zeros and an LSE of its sink.

    window_size = (left, right): a sliding window aligned as the causal mask,
    query i seeing key j only if i + g - left <= j <= i + g + right (g =
    seqlen_k - seqlen_q), -1 for an unbounded side; causal makes right 0.

    softcap > 0 caps the scaled scores s (Gemma 2): softcap * tanh(s /
    softcap) before the mask and the softmax; 0 is off. The LSE is that of
    the capped scores.

    qv, attention_chunk, num_splits, pack_gqa and sm_margin are
    FlashAttention-3's; any value but the default raises
    NotImplementedError. out_dtype and sinks are flash3's own.
    """
    if not (qv is None and pack_gqa is None and type(attention_chunk) is int and attention_chunk == 0
            and type(num_splits) is int and num_splits == 1 and type(sm_margin) is int and sm_margin == 0):
        _not_supported(qv=(qv, None), attention_chunk=(attention_chunk, 0), num_splits=(num_splits, 1),
                       pack_gqa=(pack_gqa, None), sm_margin=(sm_margin, 0))
    return _attend(q, k, v, softmax_scale, causal, q_descale, k_descale, v_descale, deterministic,
                   return_attn_probs, out_dtype, sinks, window_size, softcap)


def _checked_index_tensor(name, t, length, device):
    """An int32 vector of the given length (None: any length) on q's device,
    made contiguous."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.int32:
        raise ValueError(f"{name}: must be torch.int32, got {t.dtype}")
    if t.dim() != 1 or (length is not None and t.shape[0] != length):
        want = "batch + 1" if length is None else f"({length},)"
        raise ValueError(f"{name}: must be a vector of shape {want}, got shape {tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name}: must be on q's device {device}, got {t.device}")
    return t.contiguous()


def _checked_max_seqlen(name, n):
    if isinstance(n, bool) or not isinstance(n, (numbers.Integral, torch.SymInt)) or n < 0:
        raise ValueError(f"{name}: must be an int >= 0 (the longest sequence's length), got {n!r}")
    return n


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, seqused_q=None,
                           seqused_k=None, softmax_scale=None, causal=False, qv=None, q_descale=None, k_descale=None,
                           v_descale=None, window_size=(-1, -1), attention_chunk=0, softcap=0.0, num_splits=1,
                           pack_gqa=None, deterministic=False, sm_margin=0, return_attn_probs=False, *, sinks=None):
    """flash_attn_func over packed sequences of different lengths (variable
    length), as FlashAttention-3's.

    q: [total_q, heads_q, head_dim], k: [total_k, heads_kv, head_dim], v:
    [total_k, heads_kv, head_dim_v] (head dims as in flash_attn_func), the
    batch's sequences one after the other: sequence b's queries are rows
    cu_seqlens_q[b] .. cu_seqlens_q[b + 1] - 1, its keys and values rows
    cu_seqlens_k[b] .. cu_seqlens_k[b + 1] - 1. cu_seqlens_q and cu_seqlens_k:
    int32 [batch + 1] on q's device. max_seqlen_q, max_seqlen_k: ints, the
    longest sequence's lengths. seqused_q, seqused_k (optional, int32
    [batch]): only the first seqused[b] rows of sequence b take part; query
    rows past them are left unwritten in out and lse, and every row past
    them gets a zero gradient. Rows past cu_seqlens_*[batch] belong to no
    sequence and are written by neither pass (out, lse, nor gradients).

    The device arrays are trusted, not read here (that would synchronize with
    the GPU): cu_seqlens_* must start at 0, not decrease, and end at most at
    total_q / total_k; no sequence may be longer than max_seqlen_*; seqused
    may not exceed its sequence's packed length. Anything else is undefined.
    The forward reads the keys and values of a sequence's last block whole,
    past its seqused_k (their scores masked): those rows must be finite.

    Each sequence is masked on its own: causal (bottom-right aligned),
    window_size, softcap and sinks as in flash_attn_func. bfloat16 and
    float16, differentiable in q, k, v and sinks; or torch.float8_e4m3fn
    (forward only, no softcap) with float32 descales per sequence, batch
    being the number of sequences: shape (1,) per tensor, (batch, heads_kv)
    per head as FlashAttention-3 takes them (or (batch, heads_q) for q), or
    per block (batch, heads, ceil(max_seqlen / block)), blocks of the rows
    of quantize_fp8's granularity "block" counted from each sequence's own
    first row (those past a sequence's rows are not read); absent ones are 1.

    Returns out [total_q, heads_q, head_dim_v] (q's dtype; FP8: torch.bfloat16)
    and with return_attn_probs (out, lse), lse the float32 [heads_q, total_q]
    log-sum-exp of each row.
    """
    if not (qv is None and pack_gqa is None and type(attention_chunk) is int and attention_chunk == 0
            and type(num_splits) is int and num_splits == 1 and type(sm_margin) is int and sm_margin == 0):
        _not_supported(qv=(qv, None), attention_chunk=(attention_chunk, 0), num_splits=(num_splits, 1),
                       pack_gqa=(pack_gqa, None), sm_margin=(sm_margin, 0))
    _check_qkv(q, k, v, _ops.DTYPES, dims=3)
    cu_seqlens_q = _checked_index_tensor("cu_seqlens_q", cu_seqlens_q, None, q.device)
    if cu_seqlens_q.shape[0] < 1:
        raise ValueError("cu_seqlens_q: must have batch + 1 >= 1 entries, got shape (0,)")
    batch = cu_seqlens_q.shape[0] - 1
    cu_seqlens_k = _checked_index_tensor("cu_seqlens_k", cu_seqlens_k, batch + 1, q.device)
    if seqused_q is not None:
        seqused_q = _checked_index_tensor("seqused_q", seqused_q, batch, q.device)
    if seqused_k is not None:
        seqused_k = _checked_index_tensor("seqused_k", seqused_k, batch, q.device)
    max_seqlen_q = _checked_max_seqlen("max_seqlen_q", max_seqlen_q)
    max_seqlen_k = _checked_max_seqlen("max_seqlen_k", max_seqlen_k)
    sinks = _checked_sinks(sinks, q, heads_dim=1)
    mask = _mask(window_size, causal, softcap)
    softmax_scale = _checked_scale(softmax_scale, q)
    if q.dtype == _E4M3:
        _check_fp8_forward(q, k, v, mask)
        (heads_q, head_dim), heads_kv = q.shape[1:], k.shape[1]
        scales = _fp8_scales(q.device, (batch, max_seqlen_q, max_seqlen_k, heads_q, heads_kv, head_dim), q_descale,
                             k_descale, v_descale)
    else:
        _check_no_descales(q, q_descale, k_descale, v_descale)
        scales = (None, None, None)
    out, lse = _ops.varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k,
                               softmax_scale, bool(causal), bool(deterministic), sinks, *mask, *scales)
    return (out, lse) if return_attn_probs else out


def _check_kv_cache(q, k_cache, v_cache, qv=None):
    """Devices, dtypes, shapes, head dims and GQA of q against the caches:
    q [batch, seqlen_q, heads_q, head_dim], the caches [batch_cache, max_len,
    heads_kv, head_dim (v: its head dim)], bfloat16, float16 or
    float8_e4m3fn (FP8's head dims, no V head dim of its own); with qv
    (MLA), qv [batch, seqlen_q, heads_q, v's head dim], bfloat16, at MLA's
    head dims."""
    if qv is None and _plainly_valid(q, k_cache, v_cache, _KV_DTYPES, None, same_batch=False):
        return
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        _check_tensor(name, t)
    if qv is not None:
        _check_mla(q, k_cache, v_cache, qv)
        return
    if q.device.type not in ("cuda", "meta"):
        raise ValueError(f"q: must be a CUDA tensor (flash3 runs on Hopper GPUs), got device {q.device}")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.device != q.device:
            raise ValueError(f"{name}: must be on q's device {q.device}, got {t.device}")
        if t.dtype != q.dtype:
            raise ValueError(f"{name}: dtype must be q's ({q.dtype}), got {t.dtype}")
    if q.dtype not in _KV_DTYPES:
        raise ValueError(f"q: dtype {q.dtype} is not supported with a KV cache: flash3 takes torch.bfloat16, "
                         "torch.float16 or torch.float8_e4m3fn")
    if q.dtype == torch.float8_e4m3fn:
        _check_heads_and_dims(q, k_cache, v_cache, ("k_cache", "v_cache"), FP8_HEAD_DIMS, ())
    else:
        _check_heads_and_dims(q, k_cache, v_cache, ("k_cache", "v_cache"), HEAD_DIMS, HEAD_DIM_PAIRS)


def _check_mla(q, k_cache, v_cache, qv):
    """MLA's call (qv): bfloat16 tensors on q's device, q and k_cache of the
    rotary part's head dim, v_cache and qv of the latent part's, qv of q's
    batch, rows and heads."""
    _check_tensor("qv", qv)
    d, dv = MLA_HEAD_DIMS
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("qv", qv)):
        if t.device != q.device:
            raise ValueError(f"{name}: must be on q's device {q.device}, got {t.device}")
        if t.dtype != torch.bfloat16:
            raise ValueError(f"{name}: MLA (qv) runs in torch.bfloat16, got {t.dtype}")
    if q.device.type not in ("cuda", "meta"):
        raise ValueError(f"q: must be a CUDA tensor (flash3 runs on Hopper GPUs), got device {q.device}")
    for name, t, want in (("q", q, d), ("k_cache", k_cache, d), ("v_cache", v_cache, dv), ("qv", qv, dv)):
        if t.shape[-1] != want:
            raise ValueError(f"{name}: MLA (qv) takes head dim {d} for q and k_cache and {dv} for v_cache and qv; "
                             f"{name} has {t.shape[-1]}")
    if qv.shape[:3] != q.shape[:3]:
        raise ValueError(f"qv: must be [batch, seqlen_q, heads_q, {dv}] as q {tuple(q.shape[:3])}, got "
                         f"{tuple(qv.shape)}")
    if v_cache.shape[:3] != k_cache.shape[:3]:
        raise ValueError(f"v_cache: must match k_cache's first three dims {tuple(k_cache.shape[:3])}, got "
                         f"{tuple(v_cache.shape)}")
    heads_q, heads_kv = q.shape[2], k_cache.shape[2]
    if heads_kv == 0 or heads_q % heads_kv != 0:
        raise ValueError(f"k_cache: its heads ({heads_kv}) must divide q's ({heads_q})")


def _kvcache_fp8_scales(q, k_cache, q_descale, k_descale, v_descale):
    """An FP8 cache's descales in flash3's layouts: per tensor (one value) or
    per head ((batch, heads_kv), FlashAttention-3's, for all three; Q's also
    (batch, heads_q)), the coarser ones (and absent ones) broadcast to the
    finest. A KV cache has no per-block form. Q's per KV head stay so, which
    lets decoding pack each GQA group's query heads into one tile."""
    batch, heads_q, heads_kv = q.shape[0], q.shape[2], k_cache.shape[2]
    q_heads = [(batch, heads_kv), (batch, heads_q)] if heads_q != heads_kv else [(batch, heads_q)]
    given = [(t, _scale_granularity(name, t, q.device, {_abi.PER_HEAD: shapes, _abi.PER_BLOCK: ()}))
             for name, t, shapes in (("q_descale", q_descale, q_heads), ("k_descale", k_descale, [(batch, heads_kv)]),
                                     ("v_descale", v_descale, [(batch, heads_kv)]))]
    per_head = any(g == _abi.PER_HEAD for _, g in given)
    scales = []
    for t, g in given:
        if t is None:
            t = torch.ones(1, dtype=torch.float32, device=q.device)
        if per_head and g != _abi.PER_HEAD:
            t = t.reshape(1, 1).expand(batch, heads_kv)
        scales.append(t.reshape(1) if not per_head else t.contiguous())
    return scales


def _checked_cache_seqlens(cache_seqlens, batch, max_len, device):
    """cache_seqlens as the kernels read it: int32 [batch] on q's device; an
    int (every entry's length) or None (the whole cache) made into one."""
    if type(cache_seqlens) is torch.Tensor:  # the common case first: an ABC's isinstance costs a microsecond
        return _checked_index_tensor("cache_seqlens", cache_seqlens, batch, device)
    if cache_seqlens is None or (isinstance(cache_seqlens, numbers.Integral) and not isinstance(cache_seqlens, bool)):
        n = max_len if cache_seqlens is None else int(cache_seqlens)
        if not 0 <= n <= max_len:
            raise ValueError(f"cache_seqlens: must be in [0, {max_len}] (k_cache's rows), got {n}")
        return torch.full((batch,), n, dtype=torch.int32, device=device)
    return _checked_index_tensor("cache_seqlens", cache_seqlens, batch, device)


_PAGE_ROWS = 16  # a paged cache's pages are whole 16-row TMA boxes (src/common/kv_cache.h)


def _checked_page_table(page_table, batch, k_cache, device):
    """page_table as the kernels read it: int32 [batch, max_pages_per_seq] on
    q's device, columns contiguous; k_cache's page_size a multiple of 16."""
    if not isinstance(page_table, torch.Tensor):
        raise ValueError(f"page_table: must be a torch.Tensor, got {type(page_table).__name__}")
    if page_table.dtype != torch.int32:
        raise ValueError(f"page_table: must be torch.int32, got {page_table.dtype}")
    if page_table.dim() != 2 or page_table.shape[0] != batch or page_table.shape[1] == 0:
        raise ValueError(f"page_table: must have shape (batch, max_pages_per_seq) = ({batch}, n >= 1), "
                         f"got shape {tuple(page_table.shape)}")
    if page_table.device != device:
        raise ValueError(f"page_table: must be on q's device {device}, got {page_table.device}")
    page_size = k_cache.shape[1]
    if page_size == 0 or page_size % _PAGE_ROWS != 0:
        raise ValueError(f"page_size: k_cache's dim 1 with a page_table, its pages' rows, must be a positive multiple "
                         f"of {_PAGE_ROWS}, got {page_size}")
    return page_table if page_table.stride(1) == 1 else page_table.contiguous()


def _check_append(q, k_cache, v_cache, k, v, max_len):
    """k and v, the rows to append: both or neither, [batch, seqlen_new,
    heads_kv, head_dim] (v: v_cache's head dim) in the caches' dtype, on q's
    device, seqlen_new in [1, max_len]."""
    if (k is None) != (v is None):
        given, missing = ("k", "v") if v is None else ("v", "k")
        raise ValueError(f"{missing}: None, but {given} given: appending to the cache takes both")
    if k is None:
        return
    for name, cache in (("k_cache", k_cache), ("v_cache", v_cache)):
        if cache.stride(-1) != 1:
            raise ValueError(f"{name}: appending k and v writes it in place: its head dim must be contiguous "
                             f"(stride 1), got stride {cache.stride(-1)}")
    batch, heads_kv = q.shape[0], k_cache.shape[2]
    for name, t, cache in (("k", k, k_cache), ("v", v, v_cache)):
        _check_tensor(name, t)
        if t.device != q.device:
            raise ValueError(f"{name}: must be on q's device {q.device}, got {t.device}")
        if t.dtype != q.dtype:
            raise ValueError(f"{name}: dtype must be the caches' ({q.dtype}), got {t.dtype}")
        want = (batch, k.shape[1], heads_kv, cache.shape[-1])
        if tuple(t.shape) != want:
            raise ValueError(f"{name}: must have shape (batch, seqlen_new, heads_kv, head_dim) = {want}, "
                             f"got {tuple(t.shape)}")
    if not 1 <= k.shape[1] <= max_len:
        raise ValueError(f"k: seqlen_new (dim 1) must be in [1, {max_len}] (an entry's capacity), got {k.shape[1]}")


def _checked_rotary(q, k, rotary_cos, rotary_sin, rotary_interleaved, max_len):
    """rotary_cos and rotary_sin: both or neither, only with k and v, [seqlen_ro,
    rotary_dim / 2] in q's dtype on q's device, rotary_dim a multiple of 16 up
    to head_dim, seqlen_ro covering an entry's capacity (as FlashAttention)."""
    if not isinstance(rotary_interleaved, bool):
        raise ValueError(f"rotary_interleaved: must be a bool, got {rotary_interleaved!r}")
    if (rotary_cos is None) != (rotary_sin is None):
        given, missing = ("rotary_cos", "rotary_sin") if rotary_sin is None else ("rotary_sin", "rotary_cos")
        raise ValueError(f"{missing}: None, but {given} given: rotary embedding takes both")
    if rotary_cos is None:
        return None
    if k is None:
        raise ValueError("rotary_cos: rotary embedding rotates the appended keys: it needs k and v")
    for name, t in (("rotary_cos", rotary_cos), ("rotary_sin", rotary_sin)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name}: must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 2:
            raise ValueError(f"{name}: must have 2 dims (seqlen_ro, rotary_dim / 2), got shape {tuple(t.shape)}")
        if t.device != q.device:
            raise ValueError(f"{name}: must be on q's device {q.device}, got {t.device}")
        if t.dtype != q.dtype:
            raise ValueError(f"{name}: dtype must be q's ({q.dtype}), as FlashAttention, got {t.dtype}")
    if rotary_sin.shape != rotary_cos.shape:
        raise ValueError(f"rotary_sin: shape must be rotary_cos's {tuple(rotary_cos.shape)}, "
                         f"got {tuple(rotary_sin.shape)}")
    seqlen_ro, rotary_dim = rotary_cos.shape[0], 2 * rotary_cos.shape[1]
    if rotary_dim == 0 or rotary_dim % 16 != 0 or rotary_dim > q.shape[-1]:
        raise ValueError(f"rotary_cos: rotary_dim (twice dim 1) must be a positive multiple of 16 up to head_dim "
                         f"({q.shape[-1]}), got {rotary_dim}")
    if seqlen_ro < max_len:
        raise ValueError(f"rotary_cos: seqlen_ro (dim 0) must cover every position of an entry, at least {max_len}, "
                         f"got {seqlen_ro}")
    return rotary_cos, rotary_sin, rotary_interleaved


def _checked_num_splits(num_splits):
    if type(num_splits) is int and 0 <= num_splits <= 128:  # the common call, without the ABC checks below
        return num_splits
    if isinstance(num_splits, bool) or not isinstance(num_splits, numbers.Integral) or not 0 <= num_splits <= 128:
        raise ValueError(f"num_splits: must be an int in [0, 128] (0: chosen by flash3, 1: no split), "
                         f"got {num_splits!r}")
    return int(num_splits)


def _positive_int(name, n, least=1):
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < least:
        raise ValueError(f"{name}: must be an int >= {least}, got {n!r}")
    return int(n)


def get_scheduler_metadata(batch_size, max_seqlen_q, max_seqlen_k, num_heads_q, num_heads_kv, headdim,
                           cache_seqlens, qkv_dtype=torch.bfloat16, headdim_v=None, cu_seqlens_q=None,
                           cu_seqlens_k_new=None, cache_leftpad=None, page_size=None, max_seqlen_k_new=0,
                           causal=False, window_size=(-1, -1), attention_chunk=0, has_softcap=False, num_splits=0,
                           pack_gqa=None, sm_margin=0):
    """The plan of flash_attn_with_kvcache calls of these sizes, made ahead
    (FlashAttention-3's signature): pass it as their scheduler_metadata.

    It is the calls' scratch memory (split-KV's partial outputs, an append's
    lengths and rotated q), allocated here once, with the number of splits
    chosen now (num_splits 0: flash3's choice for max_seqlen_k keys on this
    GPU) as its leading dim. A call given it allocates nothing and splits the
    same way at every cache length, so that it can be captured in a CUDA graph
    and replayed with new cache_seqlens in fixed memory. Calls that share it
    must not run at the same time (one stream, or one graph at a time). A
    call larger than the plan (more batch entries, query rows or heads, new
    keys when max_seqlen_k_new was 0) raises ValueError naming
    kv_cache.workspace_bytes. The planned split
    count assumes no sinks (FlashAttention-3 has none); calls with sinks run
    with it too.

    cache_seqlens: int32 [batch_size] on the calls' GPU (read for its device
    only). cu_seqlens_q, cu_seqlens_k_new, attention_chunk, pack_gqa and
    sm_margin are FlashAttention-3's; any value but the default raises
    NotImplementedError. cache_leftpad, page_size and has_softcap do not
    change the plan. An FP8 plan (qkv_dtype torch.float8_e4m3fn) is made for
    descales per tensor or per KV head, as FlashAttention-3's."""
    _not_supported(cu_seqlens_q=(cu_seqlens_q, None), cu_seqlens_k_new=(cu_seqlens_k_new, None),
                   attention_chunk=(attention_chunk, 0), pack_gqa=(pack_gqa, None), sm_margin=(sm_margin, 0))
    batch = _positive_int("batch_size", batch_size, 0)
    if not isinstance(cache_seqlens, torch.Tensor) or not cache_seqlens.is_cuda:
        got = "a CPU tensor" if isinstance(cache_seqlens, torch.Tensor) else type(cache_seqlens).__name__
        raise ValueError(f"cache_seqlens: must be a CUDA tensor (int32 [batch_size]), got {got}")
    cache_seqlens = _checked_index_tensor("cache_seqlens", cache_seqlens, batch, cache_seqlens.device)
    if qkv_dtype not in (torch.bfloat16, torch.float16, torch.float8_e4m3fn):
        raise ValueError(f"qkv_dtype: must be torch.bfloat16, torch.float16 or torch.float8_e4m3fn, got {qkv_dtype}")
    headdim_v = headdim if headdim_v is None else headdim_v
    sizes = [_positive_int(name, n, least) for name, n, least in (
        ("max_seqlen_q", max_seqlen_q, 1), ("max_seqlen_k", max_seqlen_k, 1), ("num_heads_q", num_heads_q, 1),
        ("num_heads_kv", num_heads_kv, 1), ("headdim", headdim, 1), ("headdim_v", headdim_v, 1),
        ("max_seqlen_k_new", max_seqlen_k_new, 0))]
    seqlen_q, seqlen_k, heads_q, heads_kv, d, dv, seqlen_new = sizes
    mask = (*_checked_window(window_size, causal), 0.0)
    with torch.cuda.device(cache_seqlens.device):
        splits, nbytes = _ops.plan_kv_cache(cache_seqlens, qkv_dtype, batch, seqlen_q, seqlen_k, heads_q, heads_kv,
                                            d, dv, bool(causal), mask, _checked_num_splits(num_splits), seqlen_new)
    # At least a byte a split, so that its pointer is never null (null: "allocate").
    return torch.empty((splits, max(1, -(-nbytes // splits))), dtype=torch.uint8, device=cache_seqlens.device)


def _checked_scheduler_metadata(scheduler_metadata, num_splits, device):
    """(num_splits, workspace) of a call given get_scheduler_metadata's plan."""
    m = scheduler_metadata
    if not (isinstance(m, torch.Tensor) and m.dtype == torch.uint8 and m.dim() == 2 and m.is_contiguous()
            and m.numel() > 0):
        raise ValueError("scheduler_metadata: must be what get_scheduler_metadata returned (a contiguous uint8 "
                         f"[num_splits, n] tensor), got {type(m).__name__ if not isinstance(m, torch.Tensor) else m}")
    if m.device != device:
        raise ValueError(f"scheduler_metadata: must be on q's device {device}, got {m.device}")
    if num_splits not in (0, m.shape[0]):
        raise ValueError(f"num_splits: {num_splits}, but scheduler_metadata was planned for {m.shape[0]} "
                         "(pass 0 or the same)")
    return m.shape[0], m


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, qv=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, page_table=None,
                            cu_seqlens_q=None, cu_seqlens_k_new=None, max_seqlen_q=None, rotary_seqlens=None,
                            q_descale=None, k_descale=None, v_descale=None, softmax_scale=None, causal=False,
                            window_size=(-1, -1), attention_chunk=0, softcap=0.0, rotary_interleaved=True,
                            scheduler_metadata=None, num_splits=0, pack_gqa=None, sm_margin=0,
                            return_softmax_lse=False, *, sinks=None):
    """Attention of q against a KV cache (decoding), as FlashAttention-3's.

    q: [batch, seqlen_q, heads_q, head_dim], seqlen_q from 1; k_cache:
    [batch_cache, max_len, heads_kv, head_dim], v_cache: [batch_cache,
    max_len, heads_kv, head_dim_v] (head dims as in flash_attn_func);
    torch.bfloat16 or torch.float16. Batch entry b attends to rows
    cache_leftpad[b] .. cache_seqlens[b] - 1 of cache entry
    cache_batch_idx[b]: cache_seqlens (int32 [batch], or an int for every
    entry; None: max_len), cache_batch_idx (int32 [batch], None: entry b),
    cache_leftpad (int32 [batch], None: 0). The causal mask and window_size
    are aligned to the bottom right of each entry's keys (query i sees keys up
    to cache_seqlens[b] - seqlen_q + i); softcap and sinks as in
    flash_attn_func.

    Paged cache: with page_table (int32 [batch, max_pages_per_seq]), k_cache
    and v_cache are a pool of pages, [num_pages, page_size, heads_kv,
    head_dim], page_size a multiple of 16, and key j of entry b is row
    j % page_size of page page_table[b, j // page_size]; an entry holds up to
    max_pages_per_seq * page_size keys (cache_seqlens None: all of them).
    Only the table's columns that hold an entry's keys are read; a page
    outside [0, num_pages) reads as zeros. No cache_batch_idx and no
    cache_leftpad with a page_table (as FlashAttention).

    Appending (k and v, [batch, seqlen_new, heads_kv, head_dim], v's with
    v_cache's head dim): key j of entry b is written into the caches, in
    place, at key cache_seqlens[b] + j of its entry (or through page_table),
    before the attention, which then sees cache_seqlens[b] + seqlen_new keys.
    No other cache row is written, and cache_seqlens is not changed (as
    FlashAttention): the caller advances it.

    Rotary embedding (with k and v): rotary_cos and rotary_sin [seqlen_ro,
    rotary_dim / 2] in q's dtype, rotary_dim a multiple of 16 up to head_dim,
    seqlen_ro at least an entry's capacity. The first rotary_dim dims of
    the new keys are rotated at positions cache_seqlens[b] + j before they
    are stored, and those of q (read, not changed) at cache_seqlens[b] + i
    for query row i with causal or a window, else at cache_seqlens[b].
    rotary_interleaved: pairs (2i, 2i + 1) (GPT-J), else (i, i + rotary_dim
    / 2) (GPT-NeoX).

    The index tensors live on the device and are trusted, not read here:
    0 <= cache_leftpad[b], cache_seqlens[b] <= max_len (with k:
    cache_seqlens[b] + seqlen_new <= max_len), 0 <= cache_batch_idx[b] <
    batch_cache; anything else is undefined. The cache's rows past the last
    key up to the end of its last key block are read (their scores masked):
    they must be finite (a zero-initialised cache is). Without k the caches
    are not changed.

    num_splits: split-KV over the keys when batch x heads x query blocks
    cannot fill the GPU; 0 lets flash3 choose, 1 never splits, up to 128.
    scheduler_metadata: get_scheduler_metadata's plan, the call's scratch
    memory and split count made ahead (CUDA graphs with fixed memory);
    without it the call allocates its scratch on the stream (under CUDA graph
    capture, from the graph's pool).

    Returns out [batch, seqlen_q, heads_q, head_dim_v] (q's dtype), and with
    return_softmax_lse (out, lse), lse the float32 [batch, heads_q, seqlen_q]
    log-sum-exp of each row (+inf for a row that sees no key, without sinks).
    Not differentiable (inference).

    FP8 cache: q, k_cache, v_cache (and k, v) torch.float8_e4m3fn, FP8's head
    dims; q_descale, k_descale, v_descale float32, one value (per tensor) or
    (batch, heads_kv) per batch entry and KV head as FlashAttention-3's (Q's
    also (batch, heads_q)), indexed by q's batch entry; absent ones are 1.
    out is torch.bfloat16. No rotary and no softcap with FP8 (ValueError).
    Decoding packs each GQA group's query heads into one tile unless Q's
    descales are per query head.

    MLA (multi-head latent attention, DeepSeek-V2/V3, absorbed form), as
    FlashAttention-3's qv: qv [batch, seqlen_q, heads_q, 512] the queries'
    latent part, q [.., 64] their rotary part, v_cache [.., 512] the latent
    cache and k_cache [.., 64] its rotary keys (a FlashMLA-style cache of 576
    columns is the views cache[..., :512] and cache[..., 512:]); scores
    softmax_scale * (q k^T + qv v^T), softmax_scale None being 1/sqrt(576);
    out [.., 512]. torch.bfloat16; the cache's forms, appends (k of 64, v of
    512; rotary of q and k), splits, causal and window as above; no softcap
    and no sinks (ValueError).

    rotary_seqlens, cu_seqlens_q, cu_seqlens_k_new, max_seqlen_q,
    attention_chunk, pack_gqa and sm_margin are FlashAttention-3's; any value
    but the default raises NotImplementedError.
    """
    if not (rotary_seqlens is None and cu_seqlens_q is None and cu_seqlens_k_new is None and max_seqlen_q is None
            and pack_gqa is None and type(attention_chunk) is int and attention_chunk == 0 and type(sm_margin) is int
            and sm_margin == 0):
        _not_supported(rotary_seqlens=(rotary_seqlens, None), cu_seqlens_q=(cu_seqlens_q, None),
                       cu_seqlens_k_new=(cu_seqlens_k_new, None), max_seqlen_q=(max_seqlen_q, None),
                       attention_chunk=(attention_chunk, 0), pack_gqa=(pack_gqa, None), sm_margin=(sm_margin, 0))
    _check_kv_cache(q, k_cache, v_cache, qv)
    if qv is not None:
        if softcap:
            raise ValueError("softcap: MLA (qv) has no softcapping")
        if sinks is not None:
            raise ValueError("sinks: MLA (qv) has no attention sinks")
    fp8 = q.dtype == torch.float8_e4m3fn
    if fp8:
        scales = _kvcache_fp8_scales(q, k_cache, q_descale, k_descale, v_descale)
        if rotary_cos is not None or rotary_sin is not None:
            raise ValueError("rotary_cos: an FP8 (float8_e4m3fn) cache takes appended rows as they are, "
                             "without rotary embedding")
        if softcap:
            raise ValueError("softcap: the FP8 (float8_e4m3fn) forward has none")
    else:
        _check_no_descales(q, q_descale, k_descale, v_descale)
        scales = (None, None, None)
    batch, max_len = q.shape[0], k_cache.shape[1]
    if page_table is not None:
        page_table = _checked_page_table(page_table, batch, k_cache, q.device)
        max_len = page_table.shape[1] * k_cache.shape[1]
        for name, given in (("cache_batch_idx", cache_batch_idx), ("cache_leftpad", cache_leftpad)):
            if given is not None:
                raise ValueError(f"{name}: a paged cache (page_table) takes none, as FlashAttention")
    _check_append(q, k_cache, v_cache, k, v, max_len)
    rotary = _checked_rotary(q, k, rotary_cos, rotary_sin, rotary_interleaved, max_len)
    if k is not None and cache_seqlens is None:
        raise ValueError("cache_seqlens: needed with k and v (the new rows go after each entry's cache_seqlens)")
    if k is not None and isinstance(cache_seqlens, numbers.Integral) and cache_seqlens + k.shape[1] > max_len:
        raise ValueError(f"cache_seqlens: {cache_seqlens} plus k's {k.shape[1]} new rows pass an entry's capacity "
                         f"{max_len}")
    cache_seqlens = _checked_cache_seqlens(cache_seqlens, batch, max_len, q.device)
    if cache_batch_idx is not None:
        cache_batch_idx = _checked_index_tensor("cache_batch_idx", cache_batch_idx, batch, q.device)
    elif page_table is None and k_cache.shape[0] < batch:
        raise ValueError(f"k_cache: without cache_batch_idx entry b reads cache entry b, so its batch "
                         f"({k_cache.shape[0]}) must be at least q's ({batch})")
    if cache_leftpad is not None:
        cache_leftpad = _checked_index_tensor("cache_leftpad", cache_leftpad, batch, q.device)
    num_splits, workspace = _checked_num_splits(num_splits), None
    if scheduler_metadata is not None:
        num_splits, workspace = _checked_scheduler_metadata(scheduler_metadata, num_splits, q.device)
    sinks = _checked_sinks(sinks, q)
    mask = _mask(window_size, causal, softcap)
    # MLA's scores span both parts' head dims.
    softmax_scale = _checked_scale(softmax_scale, q) if qv is None or softmax_scale is not None else sum(
        MLA_HEAD_DIMS) ** -0.5
    cos, sin, interleaved = rotary or (None, None, False)
    out, lse = _ops.kvcache(q, k_cache, v_cache, cache_seqlens, cache_batch_idx, cache_leftpad, softmax_scale,
                            bool(causal), num_splits, workspace, sinks, *mask, page_table, k, v, cos, sin,
                            interleaved, *scales, qv, with_lse=bool(return_softmax_lse))
    return (out, lse) if return_softmax_lse else out


def _vector_readable(t):
    """Whether the combine kernel reads or writes t in 16-byte vectors as it
    lies: a 16-byte aligned base, a contiguous last dim, the others' strides
    multiples of 16 bytes."""
    return t.stride(-1) == 1 and t.data_ptr() % 16 == 0 and all(
        n <= 1 or (st * t.element_size()) % 16 == 0 for n, st in zip(t.shape[:-1], t.stride()[:-1]))


def flash_attn_combine(out_partial, lse_partial, out=None, out_dtype=None):
    """Partial attentions combined, as FlashAttention-3's: the outputs of
    num_splits attentions of the same queries over disjoint parts of the keys
    (split-KV, context parallelism), each normalised by its own softmax sum.

    out_partial: float32 [num_splits, batch, seqlen, heads, head_dim], its
    last dim contiguous; lse_partial: float32 [num_splits, batch, seqlen,
    heads], each part's natural-log LSE (-inf where a part had no key for the
    row); num_splits 1 to 128. out_dtype: torch.float32 (the default),
    torch.bfloat16 or torch.float16; out, if given, [batch, seqlen, heads,
    head_dim] of that dtype, its last dim contiguous, is written and returned.

    Returns (out, lse): out = sum_s exp(lse_s - lse) out_s, lse = log sum_s
    exp(lse_s), float32 [batch, seqlen, heads] (a transposed view of [batch,
    heads, seqlen], as FlashAttention-3's); a row no part saw a key for gets
    out 0 and lse +inf. Not differentiable.
    """
    for name, t, dims in (("out_partial", out_partial, 5), ("lse_partial", lse_partial, 4)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name}: must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype != torch.float32:
            raise ValueError(f"{name}: must be torch.float32, got {t.dtype}")
        if t.dim() != dims:
            raise ValueError(f"{name}: must have {dims} dims, got shape {tuple(t.shape)}")
    if out_partial.device.type not in ("cuda", "meta"):
        raise ValueError(f"out_partial: must be a CUDA tensor (flash3 runs on Hopper GPUs), got {out_partial.device}")
    if lse_partial.device != out_partial.device:
        raise ValueError(f"lse_partial: must be on out_partial's device {out_partial.device}, got {lse_partial.device}")
    splits, b, sq, h, d = out_partial.shape
    if tuple(lse_partial.shape) != (splits, b, sq, h):
        raise ValueError(f"lse_partial: must have shape (num_splits, batch, seqlen, heads) = {(splits, b, sq, h)}, "
                         f"got {tuple(lse_partial.shape)}")
    if not 1 <= splits <= 128:
        raise ValueError(f"out_partial: num_splits (dim 0) must be in [1, 128], got {splits}")
    if d == 0 or h == 0:
        raise ValueError(f"out_partial: heads and head_dim must be positive, got shape {tuple(out_partial.shape)}")
    if out_partial.stride(-1) != 1:
        raise ValueError("out_partial: its last dim (head_dim) must be contiguous (stride 1)")
    if out is not None:
        if not isinstance(out, torch.Tensor):
            raise ValueError(f"out: must be a torch.Tensor, got {type(out).__name__}")
        if out_dtype is not None and out.dtype != out_dtype:
            raise ValueError(f"out: dtype must be out_dtype ({out_dtype}), got {out.dtype}")
        if tuple(out.shape) != (b, sq, h, d) or out.device != out_partial.device or out.stride(-1) != 1:
            raise ValueError(f"out: must have shape (batch, seqlen, heads, head_dim) = {(b, sq, h, d)} on "
                             f"{out_partial.device}, last dim contiguous; got {tuple(out.shape)} on {out.device}")
        out_dtype = out.dtype
    out_dtype = torch.float32 if out_dtype is None else out_dtype
    if out_dtype not in _ops.COMBINE_OUT_DTYPES:
        raise ValueError(f"out_dtype: must be torch.float32, torch.bfloat16 or torch.float16, got {out_dtype}")
    # The kernel moves 16-byte vectors: a head dim that is not a multiple of
    # 8, or strides that are not multiples of 16 bytes, go through copies.
    padded = d + (-d) % 8
    if padded != d or (out_partial.device.type == "cuda" and not _vector_readable(out_partial)):
        out_partial = torch.nn.functional.pad(out_partial, (0, padded - d))
    target = out
    if out is None or padded != d or (out.device.type == "cuda" and not _vector_readable(out)):
        target = out_partial.new_empty((b, sq, h, padded), dtype=out_dtype)
    lse = _ops.combine(out_partial, lse_partial, target)
    if target is not out:
        if out is None:
            out = target[..., :d]
        else:
            out.copy_(target[..., :d])
    return out, lse.transpose(1, 2)


def flash_attn_qkvpacked_func(qkv, softmax_scale=None, causal=False, q_descale=None, k_descale=None, v_descale=None,
                              window_size=(-1, -1), attention_chunk=0, softcap=0.0, deterministic=False,
                              num_heads_q=None, sm_margin=0, return_attn_probs=False, *, out_dtype=None, sinks=None):
    """flash_attn_func on one packed tensor, read in place (no copy):
    qkv [batch, seqlen, 3, heads, head_dim], or [batch, seqlen, heads_q + 2 *
    heads_kv, head_dim] with num_heads_q (GQA/MQA), Q's heads first, then K's,
    then V's. Its gradient is one tensor of qkv's shape. window_size, softcap
    and sinks as in flash_attn_func."""
    _not_supported(attention_chunk=(attention_chunk, 0), sm_margin=(sm_margin, 0))
    if not isinstance(qkv, torch.Tensor):
        raise ValueError(f"qkv: must be a torch.Tensor, got {type(qkv).__name__}")
    if qkv.dim() == 5:
        if qkv.shape[2] != 3:
            raise ValueError(f"qkv: a 5-dim qkv is [batch, seqlen, 3, heads, head_dim], got shape {tuple(qkv.shape)}")
        if num_heads_q is not None and num_heads_q != qkv.shape[3]:
            raise ValueError(f"num_heads_q: a 5-dim qkv has {qkv.shape[3]} heads, got num_heads_q={num_heads_q}")
        q, k, v = qkv.unbind(2)
    elif qkv.dim() == 4:
        if num_heads_q is None:
            raise ValueError("num_heads_q: needed with a 4-dim qkv [batch, seqlen, heads_q + 2 * heads_kv, head_dim]")
        heads_kv = (qkv.shape[2] - num_heads_q) // 2
        if num_heads_q < 1 or heads_kv < 1 or num_heads_q + 2 * heads_kv != qkv.shape[2]:
            raise ValueError(f"num_heads_q: qkv's {qkv.shape[2]} heads are not num_heads_q={num_heads_q} "
                             "plus twice a positive heads_kv")
        q, k, v = qkv.split([num_heads_q, heads_kv, heads_kv], dim=2)
    else:
        raise ValueError(f"qkv: must have 5 dims [batch, seqlen, 3, heads, head_dim] or 4 with num_heads_q, "
                         f"got shape {tuple(qkv.shape)}")
    return _attend(q, k, v, softmax_scale, causal, q_descale, k_descale, v_descale, deterministic,
                   return_attn_probs, out_dtype, sinks, window_size, softcap)


def quantize_fp8(q, k, v, granularity="block", hadamard=False, seed=0):
    """q, k, v (torch.bfloat16 or torch.float16, as for flash_attn_func, head
    dim 64, 128 or 256) to float8_e4m3fn, with their float32 descales:
    (q8, k8, v8, q_scale, k_scale, v_scale), a stored value x standing for
    x * scale. granularity: "tensor" (scales of shape (1,)), "head" ([batch,
    heads]) or "block" ([batch, heads, blocks], blocks of whole kernel tiles).
    hadamard: Q and K are first rotated by the same random orthogonal matrix
    (signs from seed), which spreads outliers before rounding and leaves
    attention unchanged. flash_attn_func takes the results as they are."""
    _check_qkv(q, k, v, _OUT_DTYPES, FP8_HEAD_DIMS)
    if granularity not in _ops.GRANULARITIES:
        raise ValueError(f"granularity: must be one of {', '.join(map(repr, _ops.GRANULARITIES))}, "
                         f"got {granularity!r}")
    if not isinstance(hadamard, bool):
        raise ValueError(f"hadamard: must be a bool, got {hadamard!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2 ** 63:
        raise ValueError(f"seed: must be an int in [0, 2**63), got {seed!r}")
    # Rounding has no gradient: detached, so that autograd asks for none.
    return _ops.quantize(q.detach(), k.detach(), v.detach(), _ops.GRANULARITIES[granularity], hadamard, seed)
