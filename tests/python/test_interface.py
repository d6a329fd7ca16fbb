"""flash3's Python API on the CPU, without the library or a GPU: argument
errors (raised in Python, before any library call), the outputs' shapes,
dtypes and strides from the fake implementations (meta and fake CUDA
tensors), FP8 descale layouts, torch.library.opcheck on meta tensors, and
torch.compile / make_fx tracing with no graph break."""
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (flash3's Python package needs it)")

import flash3  # noqa: E402
from flash3 import _abi, _ops, interface  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402
from transformer_block import Block  # noqa: E402

BF16, FP16, E4M3 = torch.bfloat16, torch.float16, torch.float8_e4m3fn


def meta(*shape, dtype=BF16, requires_grad=False):
    return torch.empty(*shape, dtype=dtype, device="meta", requires_grad=requires_grad)


def qkv(b=2, sq=100, sk=70, hq=8, hkv=2, d=128, dtype=BF16, requires_grad=False, dv=None):
    """q, k, v on meta; v of head dim dv (None: d)."""
    return (meta(b, sq, hq, d, dtype=dtype, requires_grad=requires_grad),
            meta(b, sk, hkv, d, dtype=dtype, requires_grad=requires_grad),
            meta(b, sk, hkv, d if dv is None else dv, dtype=dtype, requires_grad=requires_grad))


# ---- argument errors --------------------------------------------------------


def packed(total_q=300, total_k=250, hq=8, hkv=2, d=128, batch=3, dtype=BF16, requires_grad=False, dv=None):
    """Packed q, k, v ([total, heads, head_dim]; v's dv, None: d) and cu_seqlens_q/k on meta."""
    return (meta(total_q, hq, d, dtype=dtype, requires_grad=requires_grad),
            meta(total_k, hkv, d, dtype=dtype, requires_grad=requires_grad),
            meta(total_k, hkv, d if dv is None else dv, dtype=dtype, requires_grad=requires_grad),
            meta(batch + 1, dtype=torch.int32), meta(batch + 1, dtype=torch.int32))


def _bad_varlen_calls():
    q, k, v, cu_q, cu_k = packed()
    f = flash3.flash_attn_varlen_func
    i32 = torch.int32

    def call(**changes):
        a = dict(q=q, k=k, v=v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=120, max_seqlen_k=100)
        a.update(changes)
        return lambda: f(**a)

    return [
        ("varlen 4 dims", call(q=meta(2, 150, 8, 128)), ValueError, "q: must have 3 dims [total_tokens"),
        ("varlen k dims", call(k=meta(1, 250, 2, 128)), ValueError, "k: must have 3 dims"),
        ("varlen float32", call(q=meta(300, 8, 128, dtype=torch.float32)), ValueError, "q: dtype torch.float32"),
        ("varlen head dim", call(k=meta(250, 2, 64), v=meta(250, 2, 64)), ValueError, "k: head_dim must be q's"),
        ("varlen gqa", call(k=meta(250, 3, 128), v=meta(250, 3, 128)), ValueError, "k: its heads (3)"),
        ("varlen v shape", call(v=meta(251, 2, 128)), ValueError, "v: shape must be k's"),
        ("varlen v head dim", call(v=meta(250, 2, 64)), ValueError, "v: head_dim must be q's (128)"),
        ("varlen cpu", call(q=torch.empty(300, 8, 128, dtype=BF16)), ValueError, "q: must be a CUDA tensor"),
        ("cu_seqlens_q type", call(cu_seqlens_q=[0, 100, 300]), ValueError, "cu_seqlens_q: must be a torch.Tensor"),
        ("cu_seqlens_q dtype", call(cu_seqlens_q=meta(4, dtype=torch.int64)), ValueError,
         "cu_seqlens_q: must be torch.int32"),
        ("cu_seqlens_q 2 dims", call(cu_seqlens_q=meta(4, 1, dtype=i32)), ValueError, "cu_seqlens_q: must be a vector"),
        ("cu_seqlens_q empty", call(cu_seqlens_q=meta(0, dtype=i32)), ValueError, "cu_seqlens_q: must have batch + 1"),
        ("cu_seqlens_q device", call(cu_seqlens_q=torch.zeros(4, dtype=i32)), ValueError,
         "cu_seqlens_q: must be on q's device"),
        ("cu_seqlens_k length", call(cu_seqlens_k=meta(5, dtype=i32)), ValueError,
         "cu_seqlens_k: must be a vector of shape (4,)"),
        ("cu_seqlens_k dtype", call(cu_seqlens_k=meta(4, dtype=torch.float32)), ValueError,
         "cu_seqlens_k: must be torch.int32"),
        ("seqused_q length", call(seqused_q=meta(4, dtype=i32)), ValueError, "seqused_q: must be a vector of shape (3,)"),
        ("seqused_k dtype", call(seqused_k=meta(3, dtype=torch.int64)), ValueError, "seqused_k: must be torch.int32"),
        ("max_seqlen_q negative", call(max_seqlen_q=-1), ValueError, "max_seqlen_q: must be an int >= 0"),
        ("max_seqlen_k float", call(max_seqlen_k=100.0), ValueError, "max_seqlen_k: must be an int >= 0"),
        ("max_seqlen_k none", call(max_seqlen_k=None), ValueError, "max_seqlen_k: must be an int >= 0"),
        ("varlen sinks shape", call(sinks=meta(2)), ValueError, "sinks: must have shape (8,)"),
        ("varlen window", call(window_size=(-2, 0)), ValueError, "window_size: each bound"),
        ("varlen softcap", call(softcap=float("nan")), ValueError, "softcap: must be a finite number"),
        ("varlen scale", call(softmax_scale=0.0), ValueError, "softmax_scale"),
        ("varlen descale", call(q_descale=meta(1, dtype=torch.float32)), ValueError, "q_descale: descales are for"),
        ("varlen num_splits", call(num_splits=2), NotImplementedError, "num_splits"),
        *_bad_varlen_fp8_calls(),
    ]


def _bad_varlen_fp8_calls():
    """Packed FP8: descales per sequence (batch 3 here, not the packed tensor's
    one entry) and per block of the longest sequence (max_seqlen 120 / 100)."""
    q8, k8, v8, cu_q, cu_k = packed(dtype=E4M3)
    f = flash3.flash_attn_varlen_func
    block_q = _abi.FP8_BLOCK_SIZES[128][0]

    def call(**changes):
        a = dict(q=q8, k=k8, v=v8, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=120, max_seqlen_k=100)
        a.update(changes)
        return lambda: f(**a)

    def scale(*shape, dtype=torch.float32):
        return meta(*shape, dtype=dtype)

    return [
        ("varlen fp8 k dtype", call(k=packed()[1]), ValueError, "k: dtype must be q's"),
        ("varlen fp8 head dim", call(q=meta(300, 8, 96, dtype=E4M3), k=meta(250, 2, 96, dtype=E4M3),
                                     v=meta(250, 2, 96, dtype=E4M3)), ValueError, "q: head_dim 96 is not supported"),
        ("varlen fp8 grad", call(q=meta(300, 8, 128, dtype=E4M3, requires_grad=True)), NotImplementedError, "q: FP8"),
        ("varlen fp8 softcap", call(softcap=30.0), NotImplementedError, "softcap: the FP8"),
        ("varlen fp8 descale dtype", call(q_descale=scale(1, dtype=torch.float64)), ValueError,
         "q_descale: must be float32"),
        ("varlen fp8 descale type", call(k_descale=2.0), ValueError, "k_descale: must be a torch.Tensor"),
        ("varlen fp8 descale device", call(v_descale=torch.ones(1)), ValueError, "v_descale: must be on q's"),
        # One batch entry (the packed tensors'), not the 3 sequences.
        ("varlen fp8 head batch", call(k_descale=scale(1, 2)), ValueError,
         "k_descale: shape (1, 2) is none of the descale layouts"),
        ("varlen fp8 head count", call(v_descale=scale(3, 8)), ValueError, "v_descale: shape (3, 8)"),
        # Blocks of the packed rows (300), not of the longest sequence (120).
        ("varlen fp8 blocks of total", call(q_descale=scale(3, 8, -(-300 // block_q))), ValueError,
         f"q_descale: shape (3, 8, {-(-300 // block_q)}) is none of the descale layouts"),
        # One block of block_kv (192) keys holds the longest sequence's 100.
        ("varlen fp8 blocks of k", call(k_descale=scale(3, 2, 2)), ValueError, "k_descale: shape (3, 2, 2)"),
    ]


def _bad_calls():
    q, k, v = qkv()
    q8, k8, v8 = qkv(dtype=E4M3)
    f = flash3.flash_attn_func
    one = torch.ones(1, device="meta")
    return [
        # (id, call, exception, text the message contains)
        ("cpu", lambda: f(torch.empty(2, 100, 8, 128, dtype=BF16), k, v), ValueError, "q: must be a CUDA tensor"),
        ("float32", lambda: f(meta(2, 100, 8, 128, dtype=torch.float32), meta(2, 70, 2, 128, dtype=torch.float32),
                              meta(2, 70, 2, 128, dtype=torch.float32)), ValueError, "q: dtype torch.float32"),
        ("not a tensor", lambda: f(3, k, v), ValueError, "q: must be a torch.Tensor"),
        ("3 dims", lambda: f(meta(100, 8, 128), k, v), ValueError, "q: must have 4 dims"),
        ("k device", lambda: f(q, torch.empty(2, 70, 2, 128, dtype=BF16), v), ValueError, "k: must be on q's device"),
        ("k dtype", lambda: f(q, meta(2, 70, 2, 128, dtype=FP16), v), ValueError, "k: dtype must be q's"),
        ("k batch", lambda: f(q, meta(3, 70, 2, 128), meta(3, 70, 2, 128)), ValueError, "k: batch must be q's"),
        ("k head dim", lambda: f(q, meta(2, 70, 2, 64), meta(2, 70, 2, 64)), ValueError, "k: head_dim must be q's"),
        ("v shape", lambda: f(q, k, meta(2, 71, 2, 128)), ValueError, "v: shape must be k's"),
        ("v head dim", lambda: f(q, k, meta(2, 70, 2, 64)), ValueError, "v: head_dim must be q's (128)"),
        ("v head dim of 192", lambda: f(*qkv(d=192, dv=64)), ValueError, "v: head_dim must be q's (192), or 128"),
        ("v head dim 192 / 256", lambda: f(*qkv(d=192, dv=256)), ValueError, "v: head_dim must be q's (192)"),
        ("fp8 v head dim", lambda: f(*qkv(d=128, dv=64, dtype=E4M3)), ValueError,
         "v: head_dim must be q's (128)"),
        ("quantize v head dim", lambda: flash3.quantize_fp8(*qkv(d=128, dv=64)), ValueError,
         "v: head_dim must be q's (128)"),
        ("head dim", lambda: f(*qkv(d=80)), ValueError, "q: head_dim 80 is not supported"),
        ("fp8 head dim", lambda: f(*qkv(d=96, dtype=E4M3)), ValueError, "q: head_dim 96 is not supported with FP8"),
        ("gqa", lambda: f(*qkv(hq=8, hkv=3)), ValueError, "k: its heads (3) must divide q's (8)"),
        ("scale negative", lambda: f(q, k, v, softmax_scale=-1.0), ValueError, "softmax_scale"),
        ("scale zero", lambda: f(q, k, v, softmax_scale=0.0), ValueError, "softmax_scale"),
        ("scale nan", lambda: f(q, k, v, softmax_scale=float("nan")), ValueError, "softmax_scale"),
        ("scale str", lambda: f(q, k, v, softmax_scale="0.1"), ValueError, "softmax_scale"),
        ("descale on bf16", lambda: f(q, k, v, q_descale=one), ValueError, "q_descale: descales are for"),
        ("out_dtype bf16", lambda: f(q, k, v, out_dtype=FP16), ValueError, "out_dtype"),
        ("out_dtype fp8", lambda: f(q8, k8, v8, out_dtype=torch.float32), ValueError, "out_dtype"),
        ("descale dtype", lambda: f(q8, k8, v8, k_descale=torch.ones(1, device="meta", dtype=torch.float64)),
         ValueError, "k_descale: must be float32"),
        ("descale device", lambda: f(q8, k8, v8, v_descale=torch.ones(1)), ValueError, "v_descale: must be on q's"),
        ("descale shape", lambda: f(q8, k8, v8, v_descale=torch.ones(2, 8, device="meta")), ValueError,
         "v_descale: shape (2, 8) is none of the descale layouts"),
        ("descale blocks", lambda: f(q8, k8, v8, q_descale=torch.ones(2, 8, 7, device="meta")), ValueError,
         "q_descale: shape (2, 8, 7)"),
        ("descale type", lambda: f(q8, k8, v8, q_descale=1.0), ValueError, "q_descale: must be a torch.Tensor"),
        ("fp8 grad", lambda: f(*qkv(dtype=E4M3, requires_grad=True)), NotImplementedError, "q: FP8"),
        ("qv", lambda: f(q, k, v, qv=q), NotImplementedError, "qv"),
        ("window_size type", lambda: f(q, k, v, window_size=128), ValueError, "window_size: must be a pair"),
        ("window_size length", lambda: f(q, k, v, window_size=(1, 2, 3)), ValueError, "window_size: must be a pair"),
        ("window_size float", lambda: f(q, k, v, window_size=(1.5, 0)), ValueError, "window_size: must be a pair"),
        ("window_size below -1", lambda: f(q, k, v, window_size=(-2, 0)), ValueError, "window_size: each bound"),
        ("attention_chunk", lambda: f(q, k, v, attention_chunk=64), NotImplementedError, "attention_chunk"),
        ("softcap negative", lambda: f(q, k, v, softcap=-1.0), ValueError, "softcap: must be a finite number"),
        ("softcap nan", lambda: f(q, k, v, softcap=float("nan")), ValueError, "softcap: must be a finite number"),
        ("softcap inf", lambda: f(q, k, v, softcap=float("inf")), ValueError, "softcap: must be a finite number"),
        ("softcap type", lambda: f(q, k, v, softcap="30"), ValueError, "softcap: must be a finite number"),
        ("softcap bool", lambda: f(q, k, v, softcap=True), ValueError, "softcap: must be a finite number"),
        ("softcap fp8", lambda: f(q8, k8, v8, softcap=30.0), NotImplementedError, "softcap: the FP8"),
        ("num_splits", lambda: f(q, k, v, num_splits=0), NotImplementedError, "num_splits"),
        ("pack_gqa", lambda: f(q, k, v, pack_gqa=True), NotImplementedError, "pack_gqa"),
        ("sm_margin", lambda: f(q, k, v, sm_margin=8), NotImplementedError, "sm_margin"),
        ("packed dims", lambda: flash3.flash_attn_qkvpacked_func(meta(2, 100, 128)), ValueError, "qkv: must have"),
        ("packed 3", lambda: flash3.flash_attn_qkvpacked_func(meta(2, 100, 4, 8, 128)), ValueError,
         "qkv: a 5-dim qkv is [batch, seqlen, 3, heads, head_dim]"),
        ("packed heads", lambda: flash3.flash_attn_qkvpacked_func(meta(2, 100, 3, 8, 128), num_heads_q=4),
         ValueError, "num_heads_q: a 5-dim qkv has 8 heads"),
        ("packed no heads", lambda: flash3.flash_attn_qkvpacked_func(meta(2, 100, 12, 128)), ValueError,
         "num_heads_q: needed"),
        ("packed odd", lambda: flash3.flash_attn_qkvpacked_func(meta(2, 100, 11, 128), num_heads_q=8), ValueError,
         "num_heads_q: qkv's 11 heads"),
        ("packed softcap", lambda: flash3.flash_attn_qkvpacked_func(meta(2, 100, 3, 8, 128), softcap=-1.0),
         ValueError, "softcap: must be a finite number"),
        ("packed not tensor", lambda: flash3.flash_attn_qkvpacked_func(None), ValueError, "qkv: must be a"),
        ("sinks type", lambda: f(q, k, v, sinks=[0.0] * 8), ValueError, "sinks: must be a torch.Tensor"),
        ("sinks shape", lambda: f(q, k, v, sinks=meta(2)), ValueError, "sinks: must have shape (8,)"),
        ("sinks per kv head", lambda: f(q, k, v, sinks=meta(2, 8)), ValueError, "sinks: must have shape (8,)"),
        ("sinks dtype", lambda: f(q, k, v, sinks=meta(8, dtype=torch.float64)), ValueError,
         "sinks: must be torch.float32"),
        ("sinks device", lambda: f(q, k, v, sinks=torch.zeros(8)), ValueError, "sinks: must be on q's device"),
        *_bad_varlen_calls(),
        ("quantize dtype", lambda: flash3.quantize_fp8(q8, k8, v8), ValueError, "q: dtype torch.float8_e4m3fn"),
        ("quantize head dim", lambda: flash3.quantize_fp8(*qkv(d=96)), ValueError, "q: head_dim 96"),
        ("quantize granularity", lambda: flash3.quantize_fp8(q, k, v, granularity="row"), ValueError,
         "granularity: must be one of"),
        ("quantize hadamard", lambda: flash3.quantize_fp8(q, k, v, hadamard=1), ValueError, "hadamard"),
        ("quantize seed", lambda: flash3.quantize_fp8(q, k, v, seed=-1), ValueError, "seed"),
        ("quantize seed big", lambda: flash3.quantize_fp8(q, k, v, seed=2 ** 63), ValueError, "seed"),
        ("quantize cpu", lambda: flash3.quantize_fp8(*(torch.empty(t.shape, dtype=BF16) for t in (q, k, v))),
         ValueError, "q: must be a CUDA tensor"),
    ]


_BAD = _bad_calls()


def expect_named(call, exception, text, monkeypatch):
    """call() raises exception saying text; the checks run in Python before
    the library: a load fails the test."""
    monkeypatch.setattr(_abi, "load", lambda: pytest.fail("the library was asked for"))
    with pytest.raises(exception) as info:
        call()
    assert text in str(info.value)


@pytest.mark.parametrize("call,exception,text", [c[1:] for c in _BAD], ids=[c[0] for c in _BAD])
def test_bad_argument_is_named(call, exception, text, monkeypatch):
    expect_named(call, exception, text, monkeypatch)


def test_default_fa3_arguments_are_accepted():
    q, k, v = qkv()
    out = flash3.flash_attn_func(q, k, v, None, False, None, None, None, None, [-1, -1], 0, 0.0, 1, None, False, 0,
                                 False)
    assert out.shape == q.shape


# ---- outputs of the fake implementations ------------------------------------


@pytest.mark.parametrize("d", interface.HEAD_DIMS)
@pytest.mark.parametrize("dtype", [BF16, FP16])
def test_forward_backward_shapes_on_meta(d, dtype):
    q, k, v = qkv(b=3, sq=77, sk=131, hq=6, hkv=2, d=d, dtype=dtype, requires_grad=True)
    out, lse = flash3.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert (out.shape, out.dtype, out.stride()) == (q.shape, dtype, (77 * 6 * d, 6 * d, d, 1))
    assert (lse.shape, lse.dtype, lse.stride()) == ((3, 6, 77), torch.float32, (6 * 77, 77, 1))
    assert out.requires_grad and not lse.requires_grad  # no gradient flows through the LSE
    out.sum().backward()
    for t in (q, k, v):
        assert (t.grad.shape, t.grad.dtype, t.grad.stride()) == (t.shape, dtype, t.contiguous().stride())


@pytest.mark.parametrize("d,dv", interface.HEAD_DIM_PAIRS)
@pytest.mark.parametrize("dtype", [BF16, FP16])
def test_value_head_dim_shapes_on_meta(d, dv, dtype):
    # O and dV have V's head dim; dQ and dK Q's; the scale is 1/sqrt(Q's).
    q, k, v = qkv(b=3, sq=77, sk=131, hq=6, hkv=2, d=d, dv=dv, dtype=dtype, requires_grad=True)
    out, lse = flash3.flash_attn_func(q, k, v, causal=True, window_size=(40, 0), softcap=30.0,
                                      return_attn_probs=True)
    assert (out.shape, out.dtype, out.stride()) == ((3, 77, 6, dv), dtype, (77 * 6 * dv, 6 * dv, dv, 1))
    assert (lse.shape, lse.dtype) == ((3, 6, 77), torch.float32)
    out.sum().backward()
    for t in (q, k, v):
        assert (t.grad.shape, t.grad.dtype, t.grad.stride()) == (t.shape, dtype, t.contiguous().stride())
    q, k, v, cu_q, cu_k = packed(total_q=301, total_k=257, hq=6, hkv=2, d=d, dv=dv, batch=4, dtype=dtype,
                                 requires_grad=True)
    out = flash3.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 120, 99, causal=True)
    assert (out.shape, out.stride()) == ((301, 6, dv), (6 * dv, dv, 1))
    out.sum().backward()
    for t in (q, k, v):
        assert t.grad.shape == t.shape


@pytest.mark.parametrize("with_seqused", [False, True], ids=["cu_seqlens", "seqused"])
def test_varlen_shapes_on_meta(with_seqused):
    q, k, v, cu_q, cu_k = packed(total_q=301, total_k=257, hq=6, hkv=2, d=64, batch=4, requires_grad=True)
    sinks = meta(6, dtype=torch.float32, requires_grad=True)
    used = dict(seqused_q=meta(4, dtype=torch.int32), seqused_k=meta(4, dtype=torch.int32)) if with_seqused else {}
    out, lse = flash3.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 120, 99, causal=True, return_attn_probs=True,
                                             window_size=(50, 0), softcap=20.0, sinks=sinks, **used)
    assert (out.shape, out.dtype, out.stride()) == ((301, 6, 64), BF16, (6 * 64, 64, 1))
    assert (lse.shape, lse.dtype, lse.stride()) == ((6, 301), torch.float32, (301, 1))
    assert out.requires_grad and not lse.requires_grad
    out.sum().backward()
    for t in (q, k, v):
        assert (t.grad.shape, t.grad.dtype) == (t.shape, BF16)
    assert sinks.grad.shape == (6,)


def test_varlen_default_fa3_arguments_are_accepted():
    q, k, v, cu_q, cu_k = packed()
    out = flash3.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 120, 100, None, None, None, False, None, None, None,
                                        None, [-1, -1], 0, 0.0, 1, None, False, 0, False)
    assert out.shape == q.shape


@pytest.mark.parametrize("granularity", ["tensor", "head", "block"])
@pytest.mark.parametrize("d", interface.FP8_HEAD_DIMS)
def test_varlen_fp8_shapes_on_meta(granularity, d):
    # 4 sequences, the longest 120 query and 99 key rows; GQA.
    q8, k8, v8, cu_q, cu_k = packed(total_q=301, total_k=257, hq=6, hkv=2, d=d, batch=4, dtype=E4M3)
    block_q, block_kv = _abi.FP8_BLOCK_SIZES[d]
    shapes = {"tensor": [(1,), (1,)], "head": [(4, 2), (4, 2)],  # FlashAttention-3's (batch, heads_kv) for Q too
              "block": [(4, 6, -(-120 // block_q)), (4, 2, -(-99 // block_kv))]}[granularity]
    qs, ks, vs = (meta(*shape, dtype=torch.float32) for shape in (shapes[0], shapes[1], shapes[1]))
    out, lse = flash3.flash_attn_varlen_func(q8, k8, v8, cu_q, cu_k, 120, 99, causal=True, q_descale=qs,
                                             k_descale=ks, v_descale=vs, window_size=(50, 0), return_attn_probs=True)
    assert (out.shape, out.dtype, out.stride()) == ((301, 6, d), BF16, (6 * d, d, 1))
    assert (lse.shape, lse.dtype) == ((6, 301), torch.float32)
    assert flash3.flash_attn_varlen_func(q8, k8, v8, cu_q, cu_k, 120, 99).dtype == BF16  # descales absent: 1


@pytest.mark.parametrize("dtype", [torch.float32, BF16])
def test_sinks_gradient_on_meta(dtype):
    q, k, v = qkv(b=2, sq=77, sk=131, hq=6, hkv=2, d=128, requires_grad=True)
    sinks = meta(6, dtype=dtype, requires_grad=True)
    out, lse = flash3.flash_attn_func(q, k, v, causal=True, return_attn_probs=True, sinks=sinks)
    assert out.shape == q.shape and lse.shape == (2, 6, 77)
    out.sum().backward()
    assert (sinks.grad.shape, sinks.grad.dtype) == ((6,), dtype)


def test_strided_inputs_give_contiguous_outputs_on_meta():
    base = meta(2, 8, 100, 64, requires_grad=True)  # [batch, heads, seqlen, head_dim], as SDPA takes it
    q = k = v = base.transpose(1, 2)
    out = flash3.flash_attn_func(q, k, v)
    assert out.shape == (2, 100, 8, 64) and out.is_contiguous()
    out.sum().backward()
    assert base.grad.shape == base.shape


@pytest.mark.parametrize("layout", ["5-dim", "4-dim"])
def test_qkvpacked_shapes_on_meta(layout):
    if layout == "5-dim":
        qkv_ = meta(2, 50, 3, 4, 128, requires_grad=True)
        out = flash3.flash_attn_qkvpacked_func(qkv_, causal=True)
        assert out.shape == (2, 50, 4, 128)
    else:
        qkv_ = meta(2, 50, 8 + 2 * 2, 128, requires_grad=True)
        out, lse = flash3.flash_attn_qkvpacked_func(qkv_, num_heads_q=8, return_attn_probs=True)
        assert out.shape == (2, 50, 8, 128) and lse.shape == (2, 8, 50)
    out.sum().backward()
    assert qkv_.grad.shape == qkv_.shape


@pytest.mark.parametrize("granularity", ["tensor", "head", "block"])
@pytest.mark.parametrize("d", interface.FP8_HEAD_DIMS)
def test_quantize_then_fp8_attention_on_meta(granularity, d):
    q, k, v = qkv(b=2, sq=300, sk=1000, hq=8, hkv=2, d=d, requires_grad=True)
    q8, k8, v8, qs, ks, vs = flash3.quantize_fp8(q, k, v, granularity=granularity, hadamard=True, seed=5)
    assert all(t.dtype == E4M3 and not t.requires_grad for t in (q8, k8, v8))
    assert (q8.shape, k8.shape, v8.shape) == (q.shape, k.shape, v.shape)
    block_q, block_kv = _abi.FP8_BLOCK_SIZES[d]
    expected = {"tensor": [(1,), (1,)], "head": [(2, 8), (2, 2)],
                "block": [(2, 8, -(-300 // block_q)), (2, 2, -(-1000 // block_kv))]}[granularity]
    assert (qs.shape, ks.shape, vs.shape) == (expected[0], expected[1], expected[1])
    assert all(s.dtype == torch.float32 for s in (qs, ks, vs))
    out = flash3.flash_attn_func(q8, k8, v8, q_descale=qs, k_descale=ks, v_descale=vs)
    assert (out.shape, out.dtype) == (q.shape, BF16)
    out = flash3.flash_attn_func(q8, k8, v8, q_descale=qs, k_descale=ks, v_descale=vs, out_dtype=FP16)
    assert out.dtype == FP16


def test_fake_cuda_tensors_take_the_operator():
    with FakeTensorMode():
        q = torch.empty(2, 100, 8, 128, device="cuda", dtype=BF16)
        k = torch.empty(2, 70, 2, 128, device="cuda", dtype=BF16)
        assert not _ops._eager(q, k, k)
        out, lse = flash3.flash_attn_func(q, k, k, causal=True, return_attn_probs=True)
        assert (out.device.type, out.shape, lse.shape) == ("cuda", q.shape, (2, 8, 100))
        outs = flash3.quantize_fp8(q, k, k, granularity="head")
        assert [tuple(t.shape) for t in outs[3:]] == [(2, 8), (2, 2), (2, 2)]


# ---- FP8 descale layouts (values, on CPU tensors) ----------------------------


def test_fa3_descales_map_to_flash3_layouts():
    b, hq, hkv = 2, 6, 2
    cpu = torch.device("cpu")
    q_fa3 = torch.arange(b * hkv, dtype=torch.float32).reshape(b, hkv) + 1  # FlashAttention-3: (batch, heads_kv)
    kd = torch.full((b, hkv), 2.0)
    sizes = (b, 10, 700, hq, hkv, 64)
    qs, ks, vs = interface._fp8_scales(cpu, sizes, q_fa3, kd, None)
    assert torch.equal(qs, q_fa3.repeat_interleave(hq // hkv, dim=1))  # each query head takes its group's
    assert torch.equal(ks, kd) and torch.equal(vs, torch.ones(b, hkv)) and qs.is_contiguous()

    per_block_k = torch.rand(b, hkv, -(-700 // _abi.FP8_BLOCK_SIZES[64][1]))
    qs, ks, vs = interface._fp8_scales(cpu, sizes, torch.tensor([3.0]), per_block_k, torch.tensor(0.5))
    assert qs.shape == (b, hq, 1) and torch.equal(qs, torch.full((b, hq, 1), 3.0))
    assert torch.equal(ks, per_block_k) and torch.equal(vs, torch.full_like(per_block_k, 0.5))

    qs, ks, vs = interface._fp8_scales(cpu, sizes, None, None, None)
    assert all(torch.equal(s, torch.ones(1)) for s in (qs, ks, vs))

    expanded = torch.tensor([4.0]).expand(b, hkv)  # a per-tensor scale in FlashAttention-3's shape
    qs, ks, vs = interface._fp8_scales(cpu, sizes, expanded, expanded, expanded)
    assert qs.shape == (b, hq) and bool((qs == 4).all()) and ks.is_contiguous()


# ---- torch.library.opcheck, on meta tensors ---------------------------------


def _op_cases():
    q, k, v = qkv(b=2, sq=65, sk=130, hq=4, hkv=2, d=64, requires_grad=True)
    q8, k8, v8 = (t.detach().to(E4M3) for t in (q, k, v))
    scales = [meta(2, 4, 1, dtype=torch.float32), meta(2, 2, 2, dtype=torch.float32),
              meta(2, 2, 2, dtype=torch.float32)]
    lse = meta(2, 4, 65, dtype=torch.float32)
    d = [t.detach() for t in (q, k, v)]
    return [
        ("fwd", torch.ops.flash3.fwd.default, (q, k, v, None, None, None, 0.125, True, False, BF16)),
        ("fwd fp8", torch.ops.flash3.fwd.default, (q8, k8, v8, *scales, 0.125, False, False, FP16)),
        ("bwd", torch.ops.flash3.bwd.default, (d[0], *d, d[0], lse, 0.125, True, True)),
        ("fwd window", torch.ops.flash3.fwd.default, (q, k, v, None, None, None, 0.125, False, False, BF16, None, 40, 3)),
        ("bwd window", torch.ops.flash3.bwd.default, (d[0], *d, d[0], lse, 0.125, False, True, None, 40, 3)),
        ("fwd softcap", torch.ops.flash3.fwd.default,
         (q, k, v, None, None, None, 0.125, True, False, BF16, None, -1, 0, 30.0)),
        ("bwd softcap", torch.ops.flash3.bwd.default, (d[0], *d, d[0], lse, 0.125, True, False, None, -1, 0, 30.0)),
        ("fwd sinks", torch.ops.flash3.fwd.default,
         (q, k, v, None, None, None, 0.125, True, False, BF16, meta(4, dtype=torch.float32, requires_grad=True))),
        ("bwd sinks", torch.ops.flash3.bwd.default,
         (d[0], *d, d[0], lse, 0.125, False, False, meta(4, dtype=torch.float32))),
        ("quantize", torch.ops.flash3.quantize_fp8.default, (*d, _abi.PER_BLOCK, True, 1)),
        *_value_head_dim_op_cases(),
        *_varlen_op_cases(),
    ]


def _value_head_dim_op_cases():
    """V's head dim of its own: O, dO and dV of 128 columns beside Q and K's 192."""
    q, k, v = qkv(b=2, sq=65, sk=130, hq=4, hkv=2, d=192, dv=128, requires_grad=True)
    lse = meta(2, 4, 65, dtype=torch.float32)
    d = [t.detach() for t in (q, k, v)]
    out = meta(2, 65, 4, 128)
    qp, kp, vp, cu_q, cu_k = packed(total_q=130, total_k=100, hq=4, hkv=2, d=192, dv=128, batch=3,
                                    requires_grad=True)
    dp = [t.detach() for t in (qp, kp, vp)]
    out_p, lse_p = meta(130, 4, 128), meta(4, 130, dtype=torch.float32)
    return [
        ("fwd dv", torch.ops.flash3.fwd.default, (q, k, v, None, None, None, 0.125, True, False, BF16)),
        ("bwd dv", torch.ops.flash3.bwd.default, (out, *d, out, lse, 0.125, True, False)),
        ("varlen fwd dv", torch.ops.flash3.varlen_fwd.default,
         (qp, kp, vp, cu_q, cu_k, None, None, 60, 50, 0.125, True, False)),
        ("varlen bwd dv", torch.ops.flash3.varlen_bwd.default,
         (out_p, *dp, out_p, lse_p, cu_q, cu_k, None, None, 60, 50, 0.125, True, False)),
    ]


def _varlen_op_cases():
    q, k, v, cu_q, cu_k = packed(total_q=130, total_k=100, hq=4, hkv=2, d=64, batch=3, requires_grad=True)
    used = meta(3, dtype=torch.int32)
    lse = meta(4, 130, dtype=torch.float32)
    d = [t.detach() for t in (q, k, v)]
    sinks = meta(4, dtype=torch.float32, requires_grad=True)
    q8, k8, v8 = (t.detach().to(E4M3) for t in (q, k, v))
    # Per block, of 3 sequences: the longest 60 query rows, 50 keys.
    scales = [meta(3, 4, 1, dtype=torch.float32), meta(3, 2, 1, dtype=torch.float32),
              meta(3, 2, 1, dtype=torch.float32)]
    return [
        ("varlen fwd", torch.ops.flash3.varlen_fwd.default,
         (q, k, v, cu_q, cu_k, None, None, 60, 50, 0.125, True, False)),
        ("varlen fwd all", torch.ops.flash3.varlen_fwd.default,
         (q, k, v, cu_q, cu_k, used, used, 60, 50, 0.125, False, True, sinks, 30, 4, 15.0)),
        ("varlen fwd fp8", torch.ops.flash3.varlen_fwd.default,
         (q8, k8, v8, cu_q, cu_k, None, used, 60, 50, 0.125, True, False, None, -1, 0, 0.0, *scales)),
        ("varlen bwd", torch.ops.flash3.varlen_bwd.default,
         (d[0], *d, d[0], lse, cu_q, cu_k, None, used, 60, 50, 0.125, True, True)),
        ("varlen bwd sinks", torch.ops.flash3.varlen_bwd.default,
         (d[0], *d, d[0], lse, cu_q, cu_k, None, None, 60, 50, 0.125, False, False, sinks.detach(), -1, -1, 30.0)),
    ]


@pytest.mark.parametrize("op,args", [c[1:] for c in _op_cases()], ids=[c[0] for c in _op_cases()])
def test_opcheck_on_meta(op, args):
    torch.library.opcheck(op, args)


# ---- tracing ----------------------------------------------------------------


def test_compile_fullgraph_on_meta():
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    block = Block().to(device="meta", dtype=BF16)
    x = meta(2, 33, 256, requires_grad=True)
    y = torch.compile(block, backend=backend, fullgraph=True)(x)
    y.sum().backward()
    assert y.shape == x.shape and x.grad.shape == x.shape
    assert len(graphs) == 1
    assert any(n.target is torch.ops.flash3.fwd.default for n in graphs[0].graph.nodes)


def test_compile_aot_eager_on_meta_with_backward():
    torch._dynamo.reset()
    block = Block().to(device="meta", dtype=BF16)
    x = meta(2, 33, 256, requires_grad=True)
    torch.compile(block, backend="aot_eager", fullgraph=True, dynamic=True)(x).sum().backward()
    assert x.grad.shape == x.shape


def test_compile_fullgraph_varlen_on_meta():
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    q, k, v, cu_q, cu_k = packed(requires_grad=True)

    def step(q, k, v, cu_q, cu_k):
        return flash3.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 120, 100, causal=True).float().square().sum()

    torch.compile(step, backend=backend, fullgraph=True)(q, k, v, cu_q, cu_k).backward()
    assert q.grad.shape == q.shape and len(graphs) == 1
    assert any(n.target is torch.ops.flash3.varlen_fwd.default for n in graphs[0].graph.nodes)


def test_make_fx_records_the_operators():
    from torch.fx.experimental.proxy_tensor import make_fx

    def step(q, k, v):
        out = flash3.flash_attn_func(q, k, v, causal=True)
        return torch.autograd.grad(out.sum(), (q, k, v))

    gm = make_fx(step, tracing_mode="fake")(*qkv(requires_grad=True))
    targets = {n.target for n in gm.graph.nodes}
    assert torch.ops.flash3.fwd.default in targets and torch.ops.flash3.bwd.default in targets


# ---- KV cache (decoding) ------------------------------------------------------


def cache(b=2, sq=1, batch_cache=3, max_len=300, hq=8, hkv=2, d=128, dtype=BF16, dv=None):
    """q, k_cache, v_cache and cache_seqlens on meta."""
    return (meta(b, sq, hq, d, dtype=dtype), meta(batch_cache, max_len, hkv, d, dtype=dtype),
            meta(batch_cache, max_len, hkv, d if dv is None else dv, dtype=dtype), meta(b, dtype=torch.int32))


def _bad_kvcache_calls():
    q, kc, vc, lens = cache()
    f = flash3.flash_attn_with_kvcache
    i32 = torch.int32
    later = [(name, {name: value}) for name, value in (
        ("cu_seqlens_q", meta(3, dtype=i32)), ("max_seqlen_q", 1), ("rotary_seqlens", meta(2, dtype=i32)),
        ("attention_chunk", 64), ("pack_gqa", True), ("sm_margin", 4))]
    plan = meta(4, 64, dtype=torch.uint8)
    return [
        *[(f"kvcache {name}", lambda kw=kw: f(q, kc, vc, cache_seqlens=lens, **kw), NotImplementedError, f"{name}:")
          for name, kw in later],
        ("kvcache q dims", lambda: f(meta(2, 8, 128), kc, vc), ValueError, "q: must have 4 dims"),
        ("kvcache k dims", lambda: f(q, meta(3, 300, 256), vc), ValueError, "k_cache: must have 4 dims"),
        ("kvcache dtype", lambda: f(*cache(dtype=torch.float32)[:3]), ValueError, "q: dtype torch.float32"),
        ("kvcache descale", lambda: f(q, kc, vc, q_descale=meta(1, dtype=torch.float32)), ValueError,
         "q_descale: descales are for float8_e4m3fn inputs"),
        ("kvcache fp8 block descale", lambda: f(*cache(dtype=E4M3)[:3], k_descale=meta(2, 2, 3, dtype=torch.float32)),
         ValueError, "k_descale: shape (2, 2, 3) is none of the descale layouts"),
        ("kvcache fp8 head dim", lambda: f(*cache(dtype=E4M3, d=96)[:3]), ValueError, "q: head_dim 96"),
        ("kvcache fp8 rotary", lambda: f(*cache(dtype=E4M3)[:3], meta(2, 1, 2, 128, dtype=E4M3),
                                         meta(2, 1, 2, 128, dtype=E4M3), rotary_cos=meta(300, 64),
                                         rotary_sin=meta(300, 64), cache_seqlens=0), ValueError, "rotary_cos: an FP8"),
        ("kvcache fp8 softcap", lambda: f(*cache(dtype=E4M3)[:3], softcap=10.0), ValueError, "softcap: the FP8"),
        ("kvcache k dtype", lambda: f(q, kc.half(), vc), ValueError, "k_cache: dtype must be q's"),
        ("kvcache head dim", lambda: f(*cache(d=80)[:3]), ValueError, "q: head_dim 80"),
        ("kvcache k head dim", lambda: f(q, meta(3, 300, 2, 64), vc), ValueError, "k_cache: head_dim must be q's"),
        ("kvcache v shape", lambda: f(q, kc, meta(3, 299, 2, 128)), ValueError, "v_cache: shape must be k_cache's"),
        ("kvcache v head dim", lambda: f(q, kc, meta(3, 300, 2, 64)), ValueError, "v_cache: head_dim must be"),
        ("kvcache gqa", lambda: f(q, meta(3, 300, 3, 128), meta(3, 300, 3, 128)), ValueError,
         "k_cache: its heads (3)"),
        ("kvcache device", lambda: f(q, torch.empty(3, 300, 2, 128, dtype=BF16), vc), ValueError,
         "k_cache: must be on q's device"),
        ("kvcache seqlens dtype", lambda: f(q, kc, vc, cache_seqlens=meta(2, dtype=torch.int64)), ValueError,
         "cache_seqlens: must be torch.int32"),
        ("kvcache seqlens shape", lambda: f(q, kc, vc, cache_seqlens=meta(3, dtype=i32)), ValueError,
         "cache_seqlens: must be a vector of shape (2,)"),
        ("kvcache seqlens int", lambda: f(q, kc, vc, cache_seqlens=301), ValueError, "cache_seqlens: must be in"),
        ("kvcache batch idx", lambda: f(q, kc, vc, cache_batch_idx=meta(2, dtype=torch.int64)), ValueError,
         "cache_batch_idx: must be torch.int32"),
        ("kvcache leftpad", lambda: f(q, kc, vc, cache_leftpad=meta(5, dtype=i32)), ValueError, "cache_leftpad:"),
        ("kvcache small cache", lambda: f(meta(4, 1, 8, 128), kc, vc), ValueError,
         "k_cache: without cache_batch_idx"),
        ("kvcache splits", lambda: f(q, kc, vc, num_splits=129), ValueError, "num_splits: must be an int in [0, 128]"),
        ("kvcache splits type", lambda: f(q, kc, vc, num_splits=True), ValueError, "num_splits"),
        ("kvcache metadata dtype", lambda: f(q, kc, vc, scheduler_metadata=meta(8)), ValueError,
         "scheduler_metadata: must be what get_scheduler_metadata returned"),
        ("kvcache metadata dims", lambda: f(q, kc, vc, scheduler_metadata=meta(8, dtype=torch.uint8)), ValueError,
         "scheduler_metadata: must be"),
        ("kvcache metadata device", lambda: f(q, kc, vc, scheduler_metadata=torch.empty(4, 64, dtype=torch.uint8)),
         ValueError, "scheduler_metadata: must be on q's device"),
        ("kvcache metadata splits", lambda: f(q, kc, vc, scheduler_metadata=plan, num_splits=3), ValueError,
         "num_splits: 3, but scheduler_metadata was planned for 4"),
        ("kvcache window", lambda: f(q, kc, vc, window_size=(-2, 0)), ValueError, "window_size"),
        ("kvcache softcap", lambda: f(q, kc, vc, softcap=-1.0), ValueError, "softcap"),
        ("kvcache scale", lambda: f(q, kc, vc, softmax_scale=0.0), ValueError, "softmax_scale"),
        ("kvcache sinks", lambda: f(q, kc, vc, sinks=meta(2)), ValueError, "sinks: must have shape (8,)"),
        *_bad_paged_calls(),
        *_bad_append_calls(),
        *_bad_mla_calls(),
    ]


def mla(b=2, sq=1, hq=16, hkv=1, max_len=300, dtype=BF16):
    """q, k_cache, v_cache, qv of an MLA call on meta (the rotary part 64, the latent 512)."""
    return (meta(b, sq, hq, 64, dtype=dtype), meta(3, max_len, hkv, 64, dtype=dtype),
            meta(3, max_len, hkv, 512, dtype=dtype), meta(b, sq, hq, 512, dtype=dtype))


def _bad_mla_calls():
    q, kc, vc, qv = mla()
    f = flash3.flash_attn_with_kvcache
    return [
        ("mla dtype", lambda: f(*mla(dtype=torch.float16)[:3], qv=mla(dtype=torch.float16)[3]), ValueError,
         "q: MLA (qv) runs in torch.bfloat16"),
        ("mla qv dtype", lambda: f(q, kc, vc, qv=qv.half()), ValueError, "qv: MLA (qv) runs in torch.bfloat16"),
        ("mla q head dim", lambda: f(meta(2, 1, 16, 128), kc, vc, qv=qv), ValueError, "q: MLA (qv) takes head dim 64"),
        ("mla v head dim", lambda: f(q, kc, meta(3, 300, 1, 256), qv=qv), ValueError, "v_cache: MLA (qv) takes"),
        ("mla qv shape", lambda: f(q, kc, vc, qv=meta(2, 1, 8, 512)), ValueError, "qv: must be [batch"),
        ("mla qv dims", lambda: f(q, kc, vc, qv=meta(2, 16, 512)), ValueError, "qv: must have 4 dims"),
        ("mla v rows", lambda: f(q, kc, meta(3, 299, 1, 512), qv=qv), ValueError, "v_cache: must match k_cache"),
        ("mla gqa", lambda: f(meta(2, 1, 15, 64), meta(3, 300, 2, 64), meta(3, 300, 2, 512),
                              qv=meta(2, 1, 15, 512)), ValueError, "k_cache: its heads (2) must divide"),
        ("mla softcap", lambda: f(q, kc, vc, qv=qv, softcap=5.0), ValueError, "softcap: MLA (qv)"),
        ("mla sinks", lambda: f(q, kc, vc, qv=qv, sinks=meta(16, dtype=torch.float32)), ValueError, "sinks: MLA (qv)"),
        ("mla device", lambda: f(q, kc, vc, qv=torch.empty(2, 1, 16, 512, dtype=BF16)), ValueError,
         "qv: must be on q's device"),
    ]


def paged(b=2, pages=10, page_size=64, max_pages=5, hkv=2, d=128, dtype=BF16):
    """q, the page pools k_cache and v_cache, and the page_table on meta."""
    pool = meta(pages, page_size, hkv, d, dtype=dtype)
    return meta(b, 1, 8, d, dtype=dtype), pool, pool.clone(), meta(b, max_pages, dtype=torch.int32)


def _bad_paged_calls():
    q, kc, vc, table = paged()
    f = flash3.flash_attn_with_kvcache
    i32 = torch.int32
    return [
        ("paged table dtype", lambda: f(q, kc, vc, page_table=meta(2, 5, dtype=torch.int64)), ValueError,
         "page_table: must be torch.int32"),
        ("paged table dims", lambda: f(q, kc, vc, page_table=meta(10, dtype=i32)), ValueError,
         "page_table: must have shape (batch, max_pages_per_seq) = (2, n >= 1)"),
        ("paged table batch", lambda: f(q, kc, vc, page_table=meta(3, 5, dtype=i32)), ValueError, "page_table:"),
        ("paged table empty", lambda: f(q, kc, vc, page_table=meta(2, 0, dtype=i32)), ValueError, "page_table:"),
        ("paged table device", lambda: f(q, kc, vc, page_table=torch.zeros(2, 5, dtype=i32)), ValueError,
         "page_table: must be on q's device"),
        ("paged table type", lambda: f(q, kc, vc, page_table=[[0, 1]]), ValueError, "page_table: must be a torch"),
        *[(f"paged page_size {ps}", lambda ps=ps: f(*paged(page_size=ps)[:3], page_table=table), ValueError,
           f"page_size: k_cache's dim 1 with a page_table, its pages' rows, must be a positive multiple of 16, got {ps}")
          for ps in (8, 24, 100)],
        ("paged batch idx", lambda: f(q, kc, vc, page_table=table, cache_batch_idx=meta(2, dtype=i32)), ValueError,
         "cache_batch_idx: a paged cache"),
        ("paged leftpad", lambda: f(q, kc, vc, page_table=table, cache_leftpad=meta(2, dtype=i32)), ValueError,
         "cache_leftpad: a paged cache"),
        ("paged seqlens", lambda: f(q, kc, vc, page_table=table, cache_seqlens=321), ValueError,
         "cache_seqlens: must be in [0, 320]"),
    ]


def _bad_append_calls():
    q, kc, vc, lens = cache()
    f = flash3.flash_attn_with_kvcache
    new = meta(2, 3, 2, 128)
    cos = meta(300, 32)

    def call(**kw):
        args = dict(k=new, v=new, cache_seqlens=lens, rotary_cos=cos, rotary_sin=cos)
        args.update(kw)
        return lambda: f(q, kc, vc, **args)

    return [
        ("append v missing", call(v=None), ValueError, "v: None, but k given"),
        ("append k missing", call(k=None), ValueError, "k: None, but v given"),
        ("append k dims", call(k=meta(2, 3, 256)), ValueError, "k: must have 4 dims"),
        ("append k dtype", call(k=new.half()), ValueError, "k: dtype must be the caches'"),
        ("append k device", call(k=torch.empty(2, 3, 2, 128, dtype=BF16)), ValueError, "k: must be on q's device"),
        ("append k heads", call(k=meta(2, 3, 4, 128)), ValueError, "k: must have shape"),
        ("append k batch", call(k=meta(3, 3, 2, 128)), ValueError, "k: must have shape"),
        ("append v rows", call(v=meta(2, 4, 2, 128)), ValueError, "v: must have shape"),
        ("append v head dim", call(v=meta(2, 3, 2, 64)), ValueError, "v: must have shape"),
        ("append empty", call(k=meta(2, 0, 2, 128), v=meta(2, 0, 2, 128)), ValueError, "k: seqlen_new"),
        ("append too long", call(k=meta(2, 301, 2, 128), v=meta(2, 301, 2, 128)), ValueError, "k: seqlen_new"),
        ("append strided cache", lambda: f(q, meta(3, 300, 2, 256)[..., ::2], vc, k=new, v=new, cache_seqlens=lens),
         ValueError, "k_cache: appending k and v writes it in place"),
        ("append no seqlens", call(cache_seqlens=None), ValueError, "cache_seqlens: needed with k and v"),
        ("append seqlens int", call(cache_seqlens=298), ValueError, "cache_seqlens: 298 plus k's 3 new rows"),
        ("rotary sin missing", call(rotary_sin=None), ValueError, "rotary_sin: None, but rotary_cos given"),
        ("rotary cos missing", call(rotary_cos=None), ValueError, "rotary_cos: None, but rotary_sin given"),
        ("rotary without k", call(k=None, v=None), ValueError, "rotary_cos: rotary embedding rotates"),
        ("rotary dims", call(rotary_cos=meta(300)), ValueError, "rotary_cos: must have 2 dims"),
        ("rotary dtype", call(rotary_sin=meta(300, 32, dtype=torch.float32)), ValueError,
         "rotary_sin: dtype must be q's"),
        ("rotary device", call(rotary_cos=torch.empty(300, 32, dtype=BF16)), ValueError,
         "rotary_cos: must be on q's device"),
        ("rotary type", call(rotary_sin=[[1.0]]), ValueError, "rotary_sin: must be a torch.Tensor"),
        ("rotary shapes", call(rotary_sin=meta(300, 16)), ValueError, "rotary_sin: shape must be rotary_cos's"),
        *[(f"rotary dim {2 * n}", call(rotary_cos=meta(300, n), rotary_sin=meta(300, n)), ValueError,
           f"rotary_cos: rotary_dim (twice dim 1) must be a positive multiple of 16 up to head_dim (128), got {2 * n}")
          for n in (0, 4, 12, 72)],
        ("rotary seqlen", call(rotary_cos=meta(299, 32), rotary_sin=meta(299, 32)), ValueError,
         "rotary_cos: seqlen_ro (dim 0) must cover every position of an entry, at least 300"),
        ("rotary interleaved", call(rotary_interleaved=1), ValueError, "rotary_interleaved: must be a bool"),
    ]


_BAD_KVCACHE = _bad_kvcache_calls()


@pytest.mark.parametrize("call,exception,text", [c[1:] for c in _BAD_KVCACHE], ids=[c[0] for c in _BAD_KVCACHE])
def test_bad_kvcache_argument_is_named(call, exception, text, monkeypatch):
    expect_named(call, exception, text, monkeypatch)


@pytest.mark.parametrize("sq", [1, 7])
@pytest.mark.parametrize("dims", [(128, None), (192, 128), (64, None)])
def test_kvcache_shapes_on_meta(sq, dims):
    d, dv = dims
    q, kc, vc, lens = cache(sq=sq, d=d, dv=dv)
    out = flash3.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens)
    assert out.shape == (2, sq, 8, dv or d) and out.dtype == BF16
    out, lse = flash3.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=5, cache_batch_idx=meta(2, dtype=torch.int32),
                                              cache_leftpad=meta(2, dtype=torch.int32), causal=True,
                                              window_size=(10, 0), softcap=5.0, num_splits=3,
                                              return_softmax_lse=True, sinks=meta(8, dtype=torch.float32))
    assert out.shape == (2, sq, 8, dv or d) and lse.shape == (2, 8, sq) and lse.dtype == torch.float32


@pytest.mark.parametrize("sq", [1, 3])
def test_mla_kvcache_shapes_on_meta(sq):
    """MLA (qv): O has the latent part's 512 columns; appends of k (64) and v (512), pages, splits."""
    q, kc, vc, qv = mla(sq=sq)
    out, lse = flash3.flash_attn_with_kvcache(q, kc, vc, qv=qv, cache_seqlens=7, return_softmax_lse=True)
    assert out.shape == (2, sq, 16, 512) and out.dtype == BF16 and lse.shape == (2, 16, sq)
    out = flash3.flash_attn_with_kvcache(q, kc, vc, meta(2, 2, 1, 64), meta(2, 2, 1, 512), qv=qv,
                                         rotary_cos=meta(300, 32), rotary_sin=meta(300, 32), cache_seqlens=5,
                                         causal=True, num_splits=4)
    assert out.shape == (2, sq, 16, 512)
    pool_k, pool_v = meta(10, 64, 1, 64), meta(10, 64, 1, 512)
    out = flash3.flash_attn_with_kvcache(q, pool_k, pool_v, qv=qv, page_table=meta(2, 5, dtype=torch.int32))
    assert out.shape == (2, sq, 16, 512)


@pytest.mark.parametrize("descales", ["none", "tensor", "kv_head", "head"])
def test_fp8_kvcache_shapes_on_meta(descales):
    """An FP8 cache writes a bfloat16 O; its descales: one value or (batch, heads_kv) (Q's also (batch, heads_q))."""
    q, kc, vc, lens = cache(dtype=E4M3)
    f32 = torch.float32
    given = {"none": {}, "tensor": dict(q_descale=meta(1, dtype=f32), v_descale=meta(1, dtype=f32)),
             "kv_head": dict(q_descale=meta(2, 2, dtype=f32), k_descale=meta(2, 2, dtype=f32)),
             "head": dict(q_descale=meta(2, 8, dtype=f32), v_descale=meta(1, dtype=f32))}[descales]
    out, lse = flash3.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, return_softmax_lse=True, **given)
    assert out.shape == (2, 1, 8, 128) and out.dtype == BF16 and lse.shape == (2, 8, 1)
    out = flash3.flash_attn_with_kvcache(q, kc, vc, meta(2, 1, 2, 128, dtype=E4M3), meta(2, 1, 2, 128, dtype=E4M3),
                                         cache_seqlens=lens, causal=True, **given)
    assert out.dtype == BF16


@pytest.mark.parametrize("page_size", [16, 64, 256])
def test_paged_kvcache_shapes_on_meta(page_size):
    q, kc, vc, table = paged(page_size=page_size, pages=3)  # fewer pages than table slots: entries may share
    out, lse = flash3.flash_attn_with_kvcache(q, kc, vc, page_table=table, cache_seqlens=7, causal=True,
                                              num_splits=0, return_softmax_lse=True)
    assert out.shape == q.shape and lse.shape == (2, 8, 1)
    # A table sliced out of a wider one keeps its row stride.
    out = flash3.flash_attn_with_kvcache(q, kc, vc, page_table=meta(2, 9, dtype=torch.int32)[:, 2:7])
    assert out.shape == q.shape


@pytest.mark.parametrize("rotary", [False, True])
def test_append_kvcache_shapes_on_meta(rotary):
    q, kc, vc, lens = cache(sq=4, d=192, dv=128)
    new_k, new_v = meta(2, 4, 2, 192), meta(2, 4, 2, 128)
    tables = dict(rotary_cos=meta(300, 48), rotary_sin=meta(300, 48), rotary_interleaved=False) if rotary else {}
    out, lse = flash3.flash_attn_with_kvcache(q, kc, vc, new_k, new_v, cache_seqlens=lens, causal=True,
                                              return_softmax_lse=True, **tables)
    assert out.shape == (2, 4, 8, 128) and lse.shape == (2, 8, 4)
    q, kc, vc, table = paged()
    out = flash3.flash_attn_with_kvcache(q, kc, vc, meta(2, 1, 2, 128), meta(2, 1, 2, 128), cache_seqlens=319,
                                         page_table=table, **({**tables, "rotary_cos": meta(320, 8),
                                                                "rotary_sin": meta(320, 8)} if rotary else {}))
    assert out.shape == q.shape


def test_kvcache_eager_path_passes_the_schema_and_bumps_appended_caches(monkeypatch):
    """The eager path (no dispatcher) hands the implementation the operator's arguments in the schema's order,
    then whether the LSE is wanted, and marks the caches changed when new keys are appended (checked on CPU
    tensors, the implementation replaced by a recorder)."""
    calls = []

    def record(*args):
        calls.append(args)
        return args[0], None

    monkeypatch.setattr(_ops, "_eager", lambda q, k, v: True)
    monkeypatch.setattr(_ops, "_kvcache_forward", record)
    q, kc, vc = torch.zeros(2, 1, 8, 128, dtype=BF16), torch.zeros(3, 300, 2, 128, dtype=BF16), \
        torch.zeros(3, 300, 2, 128, dtype=BF16)
    schema = list(_ops.kvcache_fwd._opoverload._schema.arguments)
    names = [a.name for a in schema]
    rest = [None] * (len(names) - 3)
    before = (kc._version, vc._version)
    _ops.kvcache(q, kc, vc, *rest)
    assert (kc._version, vc._version) == before and len(calls[-1]) == len(names) + 1 and calls[-1][-1] is True
    rest[names.index("k") - 3] = torch.zeros(2, 1, 2, 128, dtype=BF16)
    _ops.kvcache(q, kc, vc, *rest, with_lse=False)
    assert kc._version > before[0] and vc._version > before[1] and calls[-1][-1] is False


def test_kvcache_default_fa3_arguments_are_accepted():
    q, kc, vc, lens = cache()
    out = flash3.flash_attn_with_kvcache(q, kc, vc, None, None, None, None, None, lens, None, None, None, None, None,
                                         None, None, None, None, None, None, False, (-1, -1), 0, 0.0, True, None, 0,
                                         None, 0, False)
    assert out.shape == q.shape


def test_kvcache_scheduler_metadata_on_meta():
    q, kc, vc, lens = cache()
    for splits in (0, 4):
        out = flash3.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, num_splits=splits,
                                             scheduler_metadata=meta(4, 64, dtype=torch.uint8))
        assert out.shape == q.shape


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(cu_seqlens_q=meta(3, dtype=torch.int32)), NotImplementedError, "cu_seqlens_q"),
    (dict(attention_chunk=8), NotImplementedError, "attention_chunk"),
    (dict(pack_gqa=False), NotImplementedError, "pack_gqa"),
    (dict(cache_seqlens=meta(2, dtype=torch.int32)), ValueError, "cache_seqlens: must be a CUDA tensor"),
    (dict(cache_seqlens=[5, 5]), ValueError, "cache_seqlens: must be a CUDA tensor"),
])
def test_get_scheduler_metadata_bad_arguments(kwargs, error, match):
    args = dict(batch_size=2, max_seqlen_q=1, max_seqlen_k=300, num_heads_q=8, num_heads_kv=2, headdim=128,
                cache_seqlens=meta(2, dtype=torch.int32))
    with pytest.raises(error, match=match):
        flash3.get_scheduler_metadata(**{**args, **kwargs})


def test_kvcache_opcheck_on_meta():
    q, kc, vc, lens = cache()
    idx = meta(2, dtype=torch.int32)
    torch.library.opcheck(torch.ops.flash3.kvcache_fwd.default, (q, kc, vc, lens, None, None, 0.125, False, 0, None))
    torch.library.opcheck(torch.ops.flash3.kvcache_fwd.default,
                          (q, kc, vc, lens, idx, idx, 0.125, True, 4, meta(4, 100, dtype=torch.uint8),
                           meta(8, dtype=torch.float32), 10, 0, 3.0))
    q, kc, vc, table = paged()
    torch.library.opcheck(torch.ops.flash3.kvcache_fwd.default,
                          (q, kc, vc, lens, None, None, 0.125, True, 0, None, None, -1, 0, 0.0, table))
    new, cos = meta(2, 1, 2, 128), meta(320, 32)
    torch.library.opcheck(torch.ops.flash3.kvcache_fwd.default,
                          (q, kc, vc, lens, None, None, 0.125, True, 0, None, None, -1, 0, 0.0, table, new, new, cos,
                           cos, True))
    q, kc, vc, qv = mla()  # MLA: qv last, O of v_cache's 512 columns
    torch.library.opcheck(torch.ops.flash3.kvcache_fwd.default,
                          (q, kc, vc, lens, None, None, 0.04, False, 0, None, None, -1, -1, 0.0, None, None, None,
                           None, None, False, None, None, None, qv))


def test_kvcache_compile_fullgraph_on_meta():
    q, kc, vc, lens = cache()
    fn = torch.compile(lambda q, kc, vc, lens: flash3.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens,
                                                                              causal=True),
                       fullgraph=True, backend="eager")
    assert fn(q, kc, vc, lens).shape == q.shape


# ---- flash_attn_combine --------------------------------------------------------


def partials(splits=3, b=2, sq=5, h=4, d=128):
    """out_partial and lse_partial on meta, FlashAttention-3's layouts."""
    return meta(splits, b, sq, h, d, dtype=torch.float32), meta(splits, b, sq, h, dtype=torch.float32)


@pytest.mark.parametrize("d", [128, 60])
@pytest.mark.parametrize("out_dtype", [None, torch.float32, BF16, torch.float16])
def test_combine_shapes_on_meta(d, out_dtype):
    o, lse = partials(d=d)
    out, lse_out = flash3.flash_attn_combine(o, lse, out_dtype=out_dtype)
    assert out.shape == (2, 5, 4, d) and out.dtype == (out_dtype or torch.float32)
    assert lse_out.shape == (2, 5, 4) and lse_out.dtype == torch.float32
    given = meta(2, 5, 4, d, dtype=BF16)
    out, _ = flash3.flash_attn_combine(o, lse, out=given)
    assert out is given


def test_combine_opcheck_and_compile_on_meta():
    o, lse = partials()
    torch.library.opcheck(torch.ops.flash3.combine.default, (o, lse, meta(2, 5, 4, 128, dtype=BF16)))
    fn = torch.compile(lambda o, lse: flash3.flash_attn_combine(o, lse, out_dtype=BF16), fullgraph=True,
                       backend="eager")
    out, lse_out = fn(o, lse)
    assert out.shape == (2, 5, 4, 128) and lse_out.shape == (2, 5, 4)


def _bad_combine_calls():
    o, lse = partials()
    f = flash3.flash_attn_combine
    return [
        ("combine partial type", lambda: f([1.0], lse), ValueError, "out_partial: must be a torch.Tensor"),
        ("combine partial dtype", lambda: f(o.bfloat16(), lse), ValueError, "out_partial: must be torch.float32"),
        ("combine partial dims", lambda: f(o[0], lse), ValueError, "out_partial: must have 5 dims"),
        ("combine lse dtype", lambda: f(o, lse.half()), ValueError, "lse_partial: must be torch.float32"),
        ("combine lse shape", lambda: f(o, meta(3, 2, 5, 3, dtype=torch.float32)), ValueError,
         "lse_partial: must have shape (num_splits, batch, seqlen, heads) = (3, 2, 5, 4)"),
        ("combine cpu", lambda: f(torch.zeros(3, 2, 5, 4, 8), torch.zeros(3, 2, 5, 4)), ValueError,
         "out_partial: must be a CUDA tensor"),
        ("combine lse device", lambda: f(o, torch.zeros(3, 2, 5, 4)), ValueError,
         "lse_partial: must be on out_partial's device"),
        ("combine splits", lambda: f(*partials(splits=129)), ValueError, "num_splits (dim 0) must be in [1, 128]"),
        ("combine strided", lambda: f(o.transpose(3, 4), meta(3, 2, 5, 128, dtype=torch.float32)), ValueError,
         "out_partial: its last dim (head_dim) must be contiguous"),
        ("combine out dtype", lambda: f(o, lse, out_dtype=torch.float64), ValueError, "out_dtype: must be"),
        ("combine out vs dtype", lambda: f(o, lse, out=meta(2, 5, 4, 128, dtype=BF16), out_dtype=torch.float16),
         ValueError, "out: dtype must be out_dtype"),
        ("combine out shape", lambda: f(o, lse, out=meta(2, 5, 4, 64, dtype=BF16)), ValueError,
         "out: must have shape (batch, seqlen, heads, head_dim) = (2, 5, 4, 128)"),
    ]


_BAD_COMBINE = _bad_combine_calls()


@pytest.mark.parametrize("call,exception,text", [c[1:] for c in _BAD_COMBINE], ids=[c[0] for c in _BAD_COMBINE])
def test_bad_combine_argument_is_named(call, exception, text, monkeypatch):
    expect_named(call, exception, text, monkeypatch)
