"""flash3's PyTorch operators: flash3::fwd, flash3::bwd, flash3::quantize_fp8,
the packed (varlen), KV cache and combine ones (torch.library custom ops with
fake implementations, fwd differentiable through bwd), and the eager fast
path that calls the same implementations.

The implementations take tensors already checked by interface.py, fill
flash3.h's structs from their pointers and (element) strides, and call the C
ABI on PyTorch's current stream of the tensors' device. Every output is
allocated here, contiguous, by the caching allocator, so that the real and the
fake implementations agree on shapes and strides and CUDA graphs capture them.
"""
import ctypes
import functools
from typing import Optional, Tuple

import torch
from torch import Tensor
from torch.utils._python_dispatch import _get_current_dispatch_mode

from . import _abi

DTYPES = {torch.bfloat16: _abi.BF16, torch.float16: _abi.FP16, torch.float8_e4m3fn: _abi.E4M3}
COMBINE_OUT_DTYPES = {torch.float32: _abi.FP32, torch.bfloat16: _abi.BF16, torch.float16: _abi.FP16}
GRANULARITIES = {"tensor": _abi.PER_TENSOR, "head": _abi.PER_HEAD, "block": _abi.PER_BLOCK}
# A scale tensor's rank says its granularity: (1,) or a scalar per tensor,
# [batch, heads] per head, [batch, heads, blocks] per block.
_GRANULARITY_OF_RANK = {0: _abi.PER_TENSOR, 1: _abi.PER_TENSOR, 2: _abi.PER_HEAD, 3: _abi.PER_BLOCK}

_byref = ctypes.byref
# The current cudaStream_t as an int, without making a Stream object (as
# inductor's generated code gets it); the current device and capture state
# without torch.cuda's Python wrappers (a CUDA tensor exists: CUDA is set up).
_raw_stream = torch._C._cuda_getCurrentRawStream
_current_device = torch._C._cuda_getDevice
_capturing = torch._C._cuda_isCurrentStreamCapturing
# Each struct is filled by one pack_into of its scalar fields in declaration
# order (flash3.h's; test_abi.py checks the *_args builders below by name).
_pack_forward = _abi.packer(_abi.ForwardArgs).pack_into
_pack_backward = _abi.packer(_abi.BackwardArgs).pack_into
_pack_quantize = _abi.packer(_abi.QuantizeArgs).pack_into
_pack_combine = _abi.packer(_abi.CombineArgs).pack_into
_ALL_ON = (True, True, True, True)  # KernelOptions: flash3.h's defaults
_NO_FP8 = (0, 0, 0, 0, 0, False)  # Fp8Scales of a bf16/fp16 call
_NO_VARLEN = (0, 0, 0, 0, 0, 0)  # Varlen of a fixed-length batch
_NO_TENSOR = (0, 0, 0, 0, 1)  # a TensorRef left unset (flash3.h's defaults)
_NO_APPEND = (*_NO_TENSOR, *_NO_TENSOR, 0, 0, 0, 0, 0, False)  # KvAppend of a call that appends nothing
_NO_KV_CACHE = (0, 0, 0, 0, 1, 0, 0, 0, *_NO_APPEND, 0, 0)  # KvCache of a call without one (num_splits 1)
# The mask policy's scalars, (window_left, window_right, softcap) in
# flash3.h's order: no window, no softcap.
_NO_MASK = (-1, -1, 0.0)


def _ref(t):
    """A TensorRef's fields: data, then the batch, seq, head and dim strides."""
    return (t.data_ptr(), *t.stride())


def _head_dim_contiguous(t):
    """t, or a contiguous copy when its head dim is strided (the kernels need
    stride 1 there, and FlashAttention-3 copies such inputs too)."""
    return t if t.stride(-1) == 1 else t.contiguous()


def _kernel_readable(t):
    """t, or a contiguous copy when TMA cannot read it: autograd hands the
    backward a dO of any layout (an expanded or broadcast gradient has zero
    strides), which the caller does not choose. TMA needs a 16-byte aligned
    base, a contiguous head dim and, for each mode of more than one index, a
    positive stride of a multiple of 16 bytes."""
    e = t.element_size()
    ok = t.stride(-1) == 1 and t.data_ptr() % 16 == 0 and all(
        n <= 1 or (s > 0 and s * e % 16 == 0) for n, s in zip(t.shape[:3], t.stride()[:3]))
    return t if ok else t.clone(memory_format=torch.contiguous_format)


def _on_tensor_device(impl):
    """Runs impl with its first tensor's device current (the library checks
    and launches on the current device), switching only when it is not."""
    @functools.wraps(impl)
    def wrapper(*args):
        index = args[0].get_device()
        if _current_device() == index:
            return impl(*args)
        with torch.cuda.device(index):
            return impl(*args)
    return wrapper


def _run(entry, args, stream, what):
    buf = _abi.message_buffer()
    _abi.raise_for_status(entry(_byref(args), stream, buf, _abi.MESSAGE_BYTES), buf, what)


# The forward's persistent scheduler claims tiles from a zeroed int32 counter
# that every launch leaves zero. Eager calls pass none and get flash3's own,
# one per stream, outside PyTorch's allocator: torch.compile's CUDA-graph
# warm-up runs eagerly with its allocations routed to the graph's pool, which
# must hold no tensor that outlives the call. Under capture each launch gets
# its own from the caching allocator (the graph's pool), zeroed by a node of
# the graph, so that graphs replayed concurrently never share one.
def _tile_counter(device_index):
    if _capturing():
        return torch.zeros(1, dtype=torch.int32, device=device_index)
    return None


# ---- outputs: shared by the real and the fake implementations --------------


def _forward_outputs(q, v, out_dtype, with_lse=True):
    """O ([batch, seqlen_q, heads_q, v's head dim]) and the LSE."""
    b, sq, hq, _ = q.shape
    return (q.new_empty((b, sq, hq, v.shape[-1]), dtype=out_dtype),
            q.new_empty((b, hq, sq), dtype=torch.float32) if with_lse else None)


def _fixed_out_dtype(q):
    """O's dtype where the kernels write one only (packed sequences, KV caches): q's, or bfloat16 for FP8."""
    return torch.bfloat16 if q.dtype == torch.float8_e4m3fn else q.dtype


def _varlen_outputs(q, v):
    """Packed sequences' O ([total_q, heads, v's head dim]; FP8's in
    bfloat16, the one O its packed kernels write) and LSE ([heads, total_q])."""
    total_q, hq, _ = q.shape
    out_dtype = _fixed_out_dtype(q)
    return (q.new_empty((total_q, hq, v.shape[-1]), dtype=out_dtype),
            q.new_empty((hq, total_q), dtype=torch.float32))


def _backward_outputs(q, k, v, sinks):
    """dQ, dK, dV and dsinks: (0,)-shaped without sinks (an operator's
    outputs are tensors)."""
    return (q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape),
            q.new_empty((0,) if sinks is None else sinks.shape, dtype=torch.float32))


def scale_shape(granularity, batch, heads, seqlen, block):
    """The shape of one tensor's FP8 scales in flash3's layouts."""
    if granularity == _abi.PER_TENSOR:
        return (1,)
    if granularity == _abi.PER_HEAD:
        return (batch, heads)
    return (batch, heads, (seqlen + block - 1) // block)


def _quantize_outputs(q, k, v, granularity):
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    # The head dim picks the kernel: specializing a symbolic one is what the kernels do anyway.
    block_q, block_kv = _abi.FP8_BLOCK_SIZES[int(d)]
    e4m3 = torch.float8_e4m3fn
    return (q.new_empty(q.shape, dtype=e4m3), k.new_empty(k.shape, dtype=e4m3), v.new_empty(v.shape, dtype=e4m3),
            q.new_empty(scale_shape(granularity, b, hq, sq, block_q), dtype=torch.float32),
            k.new_empty(scale_shape(granularity, b, hkv, sk, block_kv), dtype=torch.float32),
            v.new_empty(scale_shape(granularity, b, hkv, sk, block_kv), dtype=torch.float32))


# ---- the structs, from tensors (any device: test_abi.py fills them on the CPU)


def _fp8_fields(scales, out):
    """The Fp8Scales struct's fields of an FP8 call's (q, k, v) scales: per
    head, Q's [batch, heads_kv] (fewer heads than O's) are per KV head."""
    q_scale, k_scale, v_scale = scales
    granularity = _GRANULARITY_OF_RANK[q_scale.dim()]
    per_kv_head = granularity == _abi.PER_HEAD and q_scale.shape[1] != out.shape[-2]
    return (granularity, q_scale.data_ptr(), k_scale.data_ptr(), v_scale.data_ptr(), DTYPES[out.dtype], per_kv_head)


def forward_args(q, k, v, out, lse, scales, softmax_scale, causal, counter, sinks=None, mask=_NO_MASK):
    args = _abi.ForwardArgs()
    fp8 = _NO_FP8 if scales[0] is None else _fp8_fields(scales, out)
    b, sq, hq, d = q.shape
    ks = k.shape
    # The TensorRefs spelled out (data, then strides): a helper call per
    # tensor is a measurable part of a tiny call's host time.
    _pack_forward(args, 0, DTYPES[q.dtype], b, sq, ks[1], hq, ks[2], d, q.data_ptr(), *q.stride(), k.data_ptr(),
                  *k.stride(), v.data_ptr(), *v.stride(), out.data_ptr(), *out.stride(),
                  0 if lse is None else lse.data_ptr(), softmax_scale, causal, *mask,
                  0 if sinks is None else sinks.data_ptr(), *fp8, *_NO_VARLEN, *_ALL_ON,
                  0 if counter is None else counter.data_ptr(), v.shape[-1], *_NO_KV_CACHE, *_NO_TENSOR)
    return args


def backward_args(dout, q, k, v, out, lse, dq, dk, dv, softmax_scale, causal, deterministic, sinks=None,
                  dsinks=None, mask=_NO_MASK):
    """BackwardArgs without a workspace (set once its size is known)."""
    args = _abi.BackwardArgs()
    b, sq, hq, d = q.shape
    _pack_backward(args, 0, DTYPES[q.dtype], b, sq, k.shape[1], hq, k.shape[2], d, *_ref(q), *_ref(k), *_ref(v),
                   *_ref(out), *_ref(dout), lse.data_ptr(), *_ref(dq), *_ref(dk), *_ref(dv), softmax_scale, causal,
                   *mask, 0 if sinks is None else sinks.data_ptr(), 0 if dsinks is None else dsinks.data_ptr(),
                   deterministic, *_NO_VARLEN, 0, v.shape[-1])
    return args


def _packed_ref(t):
    """A packed [total, heads, head_dim] tensor's TensorRef fields: its one
    batch entry has no stride."""
    return (t.data_ptr(), 0, *t.stride())


def _varlen_fields(q, k, varlen):
    """The sizes (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim) and
    the Varlen struct's fields of packed sequences; varlen is (cu_seqlens_q,
    cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k)."""
    cu_q, cu_k, used_q, used_k, max_q, max_k = varlen
    sizes = (cu_q.shape[0] - 1, max_q, max_k, q.shape[1], k.shape[1], q.shape[2])
    fields = (cu_q.data_ptr(), cu_k.data_ptr(), 0 if used_q is None else used_q.data_ptr(),
              0 if used_k is None else used_k.data_ptr(), q.shape[0], k.shape[0])
    return sizes, fields


def varlen_forward_args(q, k, v, out, lse, softmax_scale, causal, counter, varlen, sinks=None, mask=_NO_MASK,
                        scales=(None, None, None)):
    """ForwardArgs of packed sequences ([total, heads, head_dim] tensors);
    scales: FP8's (q, k, v) descales, or Nones."""
    args = _abi.ForwardArgs()
    sizes, fields = _varlen_fields(q, k, varlen)
    fp8 = _NO_FP8 if scales[0] is None else _fp8_fields(scales, out)
    _pack_forward(args, 0, DTYPES[q.dtype], *sizes, *_packed_ref(q), *_packed_ref(k), *_packed_ref(v),
                  *_packed_ref(out), 0 if lse is None else lse.data_ptr(), softmax_scale, causal, *mask,
                  0 if sinks is None else sinks.data_ptr(), *fp8, *fields, *_ALL_ON,
                  0 if counter is None else counter.data_ptr(), v.shape[-1], *_NO_KV_CACHE, *_NO_TENSOR)
    return args


def varlen_backward_args(dout, q, k, v, out, lse, dq, dk, dv, softmax_scale, causal, deterministic, varlen,
                         sinks=None, dsinks=None, mask=_NO_MASK):
    """BackwardArgs of packed sequences, without a workspace."""
    args = _abi.BackwardArgs()
    sizes, fields = _varlen_fields(q, k, varlen)
    _pack_backward(args, 0, DTYPES[q.dtype], *sizes, *_packed_ref(q), *_packed_ref(k), *_packed_ref(v),
                   *_packed_ref(out), *_packed_ref(dout), lse.data_ptr(), *_packed_ref(dq), *_packed_ref(dk),
                   *_packed_ref(dv), softmax_scale, causal, *mask, 0 if sinks is None else sinks.data_ptr(),
                   0 if dsinks is None else dsinks.data_ptr(), deterministic, *fields, 0, v.shape[-1])
    return args


def quantize_args(q, k, v, outs, granularity, hadamard, seed):
    q8, k8, v8, q_scale, k_scale, v_scale = outs
    args = _abi.QuantizeArgs()
    b, sq, hq, d = q.shape
    _pack_quantize(args, 0, DTYPES[q.dtype], b, sq, k.shape[1], hq, k.shape[2], d, *_ref(q), *_ref(k), *_ref(v),
                   *_ref(q8), *_ref(k8), *_ref(v8), granularity, q_scale.data_ptr(), k_scale.data_ptr(),
                   v_scale.data_ptr(), hadamard, seed)
    return args


# ---- the implementations on CUDA tensors -----------------------------------
# Outputs, workspace and tile counter come from the caching allocator on the
# tensors' device and its current stream, the launch's: it orders their reuse
# after the launch, and a graph capture owns them.


@_on_tensor_device
def _forward(q, k, v, scales, softmax_scale, causal, out_dtype, with_lse, sinks=None, mask=_NO_MASK):
    """(out, lse) on the tensors' device and current stream; lse None
    without with_lse (the kernel then writes none)."""
    lib = _abi.load()
    if q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1:
        q, k, v = _head_dim_contiguous(q), _head_dim_contiguous(k), _head_dim_contiguous(v)
    out, lse = _forward_outputs(q, v, out_dtype, with_lse)
    index = q.get_device()
    counter = _tile_counter(index)
    _run(lib.forward, forward_args(q, k, v, out, lse, scales, softmax_scale, causal, counter, sinks, mask),
         _raw_stream(index), "forward")
    return out, lse


@_on_tensor_device
def _varlen_forward(q, k, v, varlen, softmax_scale, causal, sinks, mask, scales):
    lib = _abi.load()
    q, k, v = _head_dim_contiguous(q), _head_dim_contiguous(k), _head_dim_contiguous(v)
    out, lse = _varlen_outputs(q, v)
    index = q.get_device()
    counter = _tile_counter(index)
    _run(lib.forward,
         varlen_forward_args(q, k, v, out, lse, softmax_scale, causal, counter, varlen, sinks, mask, scales),
         _raw_stream(index), "forward")
    return out, lse


def _forward_impl(q: Tensor, k: Tensor, v: Tensor, q_scale: Optional[Tensor], k_scale: Optional[Tensor],
                  v_scale: Optional[Tensor], softmax_scale: float, causal: bool, deterministic: bool,
                  out_dtype: torch.dtype, sinks: Optional[Tensor] = None, window_left: int = -1,
                  window_right: int = -1, softcap: float = 0.0) -> Tuple[Tensor, Tensor]:
    # `deterministic` is the backward's mode: an input here so that autograd
    # (setup_context) sees it; the forward is deterministic anyway.
    return _forward(q, k, v, (q_scale, k_scale, v_scale), softmax_scale, causal, out_dtype, True, sinks,
                    (window_left, window_right, softcap))


@_on_tensor_device
def _backward_impl(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, softmax_scale: float,
                   causal: bool, deterministic: bool, sinks: Optional[Tensor] = None, window_left: int = -1,
                   window_right: int = -1, softcap: float = 0.0) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    lib = _abi.load()
    q, k, v = _head_dim_contiguous(q), _head_dim_contiguous(k), _head_dim_contiguous(v)
    dout, out = _kernel_readable(dout), _head_dim_contiguous(out)
    dq, dk, dv, dsinks = _backward_outputs(q, k, v, sinks)
    args = backward_args(dout, q, k, v, out, lse, dq, dk, dv, softmax_scale, causal, deterministic, sinks,
                         None if sinks is None else dsinks, (window_left, window_right, softcap))
    _launch_backward(lib, args, q.device)
    return dq, dk, dv, dsinks


def _launch_backward(lib, args, device):
    """The backward's launch with its workspace from the caching allocator."""
    size = ctypes.c_size_t()
    buf = _abi.message_buffer()
    _abi.raise_for_status(lib.backward_workspace_size(_byref(args), _byref(size), buf, _abi.MESSAGE_BYTES), buf,
                          "backward")
    if size.value:
        workspace = torch.empty(size.value, dtype=torch.uint8, device=device)  # alive until the launch
        args.workspace = workspace.data_ptr()
    _run(lib.backward, args, _raw_stream(device.index), "backward")


@_on_tensor_device
def _quantize_impl(q: Tensor, k: Tensor, v: Tensor, granularity: int, hadamard: bool,
                   seed: int) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    lib = _abi.load()
    q, k, v = _head_dim_contiguous(q), _head_dim_contiguous(k), _head_dim_contiguous(v)
    outs = _quantize_outputs(q, k, v, granularity)
    _run(lib.quantize_fp8, quantize_args(q, k, v, outs, granularity, hadamard, seed), _raw_stream(q.device.index),
         "quantize_fp8")
    return outs


# ---- the torch.library operators -------------------------------------------

fwd = torch.library.custom_op("flash3::fwd", _forward_impl, mutates_args=(), device_types="cuda")
bwd = torch.library.custom_op("flash3::bwd", _backward_impl, mutates_args=(), device_types="cuda")
quantize_fp8 = torch.library.custom_op("flash3::quantize_fp8", _quantize_impl, mutates_args=(), device_types="cuda")


@fwd.register_fake
def _forward_fake(q, k, v, q_scale, k_scale, v_scale, softmax_scale, causal, deterministic, out_dtype, sinks=None,
                  window_left=-1, window_right=-1, softcap=0.0):
    return _forward_outputs(q, v, out_dtype)


@bwd.register_fake
def _backward_fake(dout, q, k, v, out, lse, softmax_scale, causal, deterministic, sinks=None, window_left=-1,
                   window_right=-1, softcap=0.0):
    return _backward_outputs(q, k, v, sinks)


@quantize_fp8.register_fake
def _quantize_fake(q, k, v, granularity, hadamard, seed):
    return _quantize_outputs(q, k, v, granularity)


def _save(ctx, q, k, v, out, lse, sinks, softmax_scale, causal, deterministic, mask, lse_is_output=True):
    ctx.save_for_backward(q, k, v, out, lse, sinks)
    ctx.softmax_scale, ctx.causal, ctx.deterministic, ctx.mask = softmax_scale, causal, deterministic, mask
    if lse_is_output:
        # The backward kernel gives no gradient through the LSE: using it in
        # a loss raises instead of silently dropping that term.
        ctx.mark_non_differentiable(lse)


def _refuse_fp8_backward(q):
    if q.dtype == torch.float8_e4m3fn:
        raise NotImplementedError("flash3: the backward pass takes bfloat16 or float16 inputs; the FP8 "
                                  "(float8_e4m3fn) path is forward only")


def _gradients(ctx, dout, backward):
    """dQ, dK, dV and the sinks' gradient (None without sinks)."""
    q, k, v, out, lse, sinks = ctx.saved_tensors
    _refuse_fp8_backward(q)
    dq, dk, dv, dsinks = backward(dout, q, k, v, out, lse, ctx.softmax_scale, ctx.causal, ctx.deterministic, sinks,
                                  *ctx.mask)
    return dq, dk, dv, None if sinks is None else dsinks


def _fwd_setup_context(ctx, inputs, output):
    q, k, v, _, _, _, softmax_scale, causal, deterministic, _, sinks, *mask = inputs
    _save(ctx, q, k, v, output[0], output[1], sinks, softmax_scale, causal, deterministic, tuple(mask))


def _fwd_backward(ctx, dout, dlse):
    dq, dk, dv, dsinks = _gradients(ctx, dout, bwd)
    return (dq, dk, dv) + (None,) * 7 + (dsinks, None, None, None)


fwd.register_autograd(_fwd_backward, setup_context=_fwd_setup_context)


class _EagerAttention(torch.autograd.Function):
    """flash3::fwd's autograd without the dispatcher: the same implementations
    called directly, for eager calls on plain CUDA tensors (the custom op's
    Python dispatch costs several times SDPA's per-call overhead). The
    arguments past the differentiable ones come as one tuple, and the LSE is
    an output only when the caller asked for it: each argument and output
    costs host time."""

    @staticmethod
    def forward(ctx, q, k, v, sinks, rest):
        scales, softmax_scale, causal, deterministic, out_dtype, with_lse, mask = rest
        out, lse = _forward(q, k, v, scales, softmax_scale, causal, out_dtype, True, sinks, mask)
        _save(ctx, q, k, v, out, lse, sinks, softmax_scale, causal, deterministic, mask, lse_is_output=with_lse)
        return (out, lse) if with_lse else out

    @staticmethod
    def backward(ctx, dout, *dlse):
        return _gradients(ctx, dout, _backward_impl) + (None,)


# Function.apply's Python wrapper only unwraps functorch's dead wrappers, and
# only outside functorch transforms; _eager excludes those, and q, k, v are
# unwrapped here as it would: the wrapper is a third of the call's autograd cost.
_eager_apply = torch._C._FunctionBase.__dict__["apply"].__get__(None, _EagerAttention)
_unwrap_if_dead = torch._C._functorch.unwrap_if_dead


def _eager(q, k, v):
    """Whether this call may bypass the dispatcher: not traced (torch.compile,
    make_fx, fake or other dispatch modes, functorch transforms) and plain
    CUDA tensors."""
    return (not torch.compiler.is_compiling() and q.is_cuda and type(q) is Tensor and type(k) is Tensor
            and type(v) is Tensor and _get_current_dispatch_mode() is None
            and not torch._C._are_functorch_transforms_active())


def attention(q, k, v, q_scale, k_scale, v_scale, softmax_scale, causal, deterministic, out_dtype, with_lse=True,
              sinks=None, mask=_NO_MASK):
    """(out, lse) of checked arguments, differentiable in q, k, v and sinks.
    Without with_lse the LSE may be left out (None) where nothing else needs
    it: an eager call without gradients, the common inference call,
    allocates and writes no LSE."""
    if _eager(q, k, v):
        scales = (q_scale, k_scale, v_scale)
        if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad
                                        or (sinks is not None and sinks.requires_grad)):
            result = _eager_apply(_unwrap_if_dead(q), _unwrap_if_dead(k), _unwrap_if_dead(v),
                                  None if sinks is None else _unwrap_if_dead(sinks),
                                  (scales, softmax_scale, causal, deterministic, out_dtype, with_lse, mask))
            return result if with_lse else (result, None)
        return _forward(q, k, v, scales, softmax_scale, causal, out_dtype, with_lse, sinks, mask)
    return fwd(q, k, v, q_scale, k_scale, v_scale, softmax_scale, causal, deterministic, out_dtype, sinks, *mask)


# ---- packed sequences (varlen) ----------------------------------------------
# Their own operators, always through the dispatcher: the eager fast path
# above is for the tiny fixed-length calls whose host time it measures.


def _varlen_forward_impl(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
                         seqused_q: Optional[Tensor], seqused_k: Optional[Tensor], max_seqlen_q: int,
                         max_seqlen_k: int, softmax_scale: float, causal: bool, deterministic: bool,
                         sinks: Optional[Tensor] = None, window_left: int = -1, window_right: int = -1,
                         softcap: float = 0.0, q_scale: Optional[Tensor] = None, k_scale: Optional[Tensor] = None,
                         v_scale: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    # The FP8 descales last, with defaults: a bf16/fp16 call leaves them out.
    return _varlen_forward(q, k, v, (cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k),
                           softmax_scale, causal, sinks, (window_left, window_right, softcap),
                           (q_scale, k_scale, v_scale))


@_on_tensor_device
def _varlen_backward_impl(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                          cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, seqused_q: Optional[Tensor],
                          seqused_k: Optional[Tensor], max_seqlen_q: int, max_seqlen_k: int, softmax_scale: float,
                          causal: bool, deterministic: bool, sinks: Optional[Tensor] = None, window_left: int = -1,
                          window_right: int = -1, softcap: float = 0.0) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    varlen = (cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k)
    lib = _abi.load()
    q, k, v = _head_dim_contiguous(q), _head_dim_contiguous(k), _head_dim_contiguous(v)
    dout, out = _kernel_readable(dout), _head_dim_contiguous(out)
    dq, dk, dv, dsinks = _backward_outputs(q, k, v, sinks)
    args = varlen_backward_args(dout, q, k, v, out, lse, dq, dk, dv, softmax_scale, causal, deterministic, varlen,
                                sinks, None if sinks is None else dsinks, (window_left, window_right, softcap))
    _launch_backward(lib, args, q.device)
    return dq, dk, dv, dsinks


varlen_fwd = torch.library.custom_op("flash3::varlen_fwd", _varlen_forward_impl, mutates_args=(),
                                     device_types="cuda")
varlen_bwd = torch.library.custom_op("flash3::varlen_bwd", _varlen_backward_impl, mutates_args=(),
                                     device_types="cuda")


@varlen_fwd.register_fake
def _varlen_forward_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q, max_seqlen_k,
                         softmax_scale, causal, deterministic, sinks=None, window_left=-1, window_right=-1,
                         softcap=0.0, q_scale=None, k_scale=None, v_scale=None):
    return _varlen_outputs(q, v)


@varlen_bwd.register_fake
def _varlen_backward_fake(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q,
                          max_seqlen_k, softmax_scale, causal, deterministic, sinks=None, window_left=-1,
                          window_right=-1, softcap=0.0):
    return _backward_outputs(q, k, v, sinks)


def _varlen_fwd_setup_context(ctx, inputs, output):
    # The FP8 descales, last, take no part in the backward.
    (q, k, v, cu_q, cu_k, used_q, used_k, max_q, max_k, softmax_scale, causal, deterministic, sinks, *mask, _, _,
     _) = inputs
    ctx.save_for_backward(q, k, v, output[0], output[1], sinks, cu_q, cu_k, used_q, used_k)
    ctx.max_seqlens, ctx.softmax_scale, ctx.causal, ctx.deterministic = (max_q, max_k), softmax_scale, causal, deterministic
    ctx.mask = tuple(mask)
    ctx.mark_non_differentiable(output[1])


def _varlen_fwd_backward(ctx, dout, dlse):
    q, k, v, out, lse, sinks, cu_q, cu_k, used_q, used_k = ctx.saved_tensors
    _refuse_fp8_backward(q)
    dq, dk, dv, dsinks = varlen_bwd(dout, q, k, v, out, lse, cu_q, cu_k, used_q, used_k, *ctx.max_seqlens,
                                    ctx.softmax_scale, ctx.causal, ctx.deterministic, sinks, *ctx.mask)
    return (dq, dk, dv) + (None,) * 9 + (None if sinks is None else dsinks,) + (None,) * 6


varlen_fwd.register_autograd(_varlen_fwd_backward, setup_context=_varlen_fwd_setup_context)


# ---- KV cache (decoding) ------------------------------------------------------
# Its own operator, forward only (inference): O and the LSE from q against the
# caches, which it changes only where k and v are appended (in place, hence
# mutates_args).


def _index_ptr(t):
    return 0 if t is None else t.data_ptr()


def _append_fields(append):
    """KvAppend's fields of append = (k, v, rotary_cos, rotary_sin,
    rotary_interleaved), the tables None without rotary; None: no append."""
    if append is None:
        return _NO_APPEND
    k, v, cos, sin, interleaved = append
    rotary = (0, 0, 0, 0, False) if cos is None else (cos.data_ptr(), sin.data_ptr(), cos.shape[0],
                                                      2 * cos.shape[1], interleaved)
    return (*_ref(k), *_ref(v), k.shape[1], *rotary)


def kvcache_forward_args(q, k_cache, v_cache, out, lse, softmax_scale, causal, counter, cache, sinks=None,
                         mask=_NO_MASK, page_table=None, append=None, workspace=None, scales=(None, None, None),
                         qv=None):
    """ForwardArgs of a KV cache call; cache is (cache_seqlens, cache_batch_idx,
    cache_leftpad, num_splits), the index tensors int32 [batch] or None;
    page_table int32 [batch, max_pages_per_seq] (columns contiguous) makes the
    caches a pool of pages [num_pages, page_size, ...]; append as
    _append_fields takes it; workspace a uint8 tensor the call's scratch
    lives in (None: the library allocates it on the stream); scales an FP8
    cache's (q, k, v) descales, or Nones; qv MLA's latent queries, or None."""
    seqlens, batch_idx, leftpad, num_splits = cache
    args = _abi.ForwardArgs()
    b, sq, hq, d = q.shape
    ks = k_cache.shape
    if page_table is None:
        capacity, paged = ks[1], (0, 0, 0)
    else:
        capacity, paged = page_table.shape[1] * ks[1], (page_table.data_ptr(), page_table.stride(0), ks[1])
    _pack_forward(args, 0, DTYPES[q.dtype], b, sq, capacity, hq, ks[2], d, *_ref(q), *_ref(k_cache), *_ref(v_cache),
                  *_ref(out), 0 if lse is None else lse.data_ptr(), softmax_scale, causal, *mask,
                  _index_ptr(sinks), *(_NO_FP8 if scales[0] is None else _fp8_fields(scales, out)), *_NO_VARLEN,
                  *_ALL_ON, _index_ptr(counter), v_cache.shape[-1], seqlens.data_ptr(), _index_ptr(batch_idx), _index_ptr(leftpad), ks[0], num_splits, *paged,
                  *_append_fields(append), *((0, 0) if workspace is None else (workspace.data_ptr(), workspace.numel())),
                  *(_NO_TENSOR if qv is None else _ref(qv)))
    return args


def plan_kv_cache(cache_seqlens, dtype, batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, head_dim_v, causal,
                  mask, num_splits, seqlen_new, sinks=False, fp8=_NO_FP8):
    """flash3::plan_kv_cache of a KV cache call of these sizes, the other
    tensors not needed: (num_splits, workspace bytes) on the current device.
    fp8: the call's Fp8Scales fields (whether its decoding packs GQA)."""
    lib = _abi.load()
    args = _abi.ForwardArgs()
    append = (*_NO_TENSOR, *_NO_TENSOR, seqlen_new, 0, 0, 0, 0, False)
    _pack_forward(args, 0, DTYPES[dtype], batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, *_NO_TENSOR,
                  *_NO_TENSOR, *_NO_TENSOR, *_NO_TENSOR, 0, 0.0, causal, *mask, int(sinks), *fp8, *_NO_VARLEN,
                  *_ALL_ON, 0, head_dim_v, cache_seqlens.data_ptr(), 0, 0, 1, num_splits, 0, 0, 0, *append, 0, 0,
                  *_NO_TENSOR)
    splits, nbytes = ctypes.c_int64(), ctypes.c_size_t()
    buf = _abi.message_buffer()
    _abi.raise_for_status(lib.plan_kv_cache(_byref(args), _byref(splits), _byref(nbytes), buf, _abi.MESSAGE_BYTES),
                          buf, "plan_kv_cache")
    return splits.value, nbytes.value


def _dense_aligned(t):
    """t, or a contiguous copy when it is not contiguous or not 16-byte
    aligned (the rotary tables are read as 16-byte vectors of whole rows)."""
    return t if t.is_contiguous() and t.data_ptr() % 16 == 0 else t.clone(memory_format=torch.contiguous_format)


@_on_tensor_device
def _kvcache_forward(q, k_cache, v_cache, cache_seqlens, cache_batch_idx, cache_leftpad, softmax_scale, causal,
                     num_splits, workspace, sinks, window_left, window_right, softcap, page_table, k, v, rotary_cos,
                     rotary_sin, rotary_interleaved, q_descale, k_descale, v_descale, qv, with_lse):
    """(out, lse) of the KV cache call, lse None without with_lse (the
    kernels then write none: an eager decoding call that does not ask for it
    allocates none)."""
    lib = _abi.load()
    # An append writes the caches in place: the interface refuses a strided
    # head dim then, so that these are the caller's tensors, not copies.
    q, k_cache, v_cache = _head_dim_contiguous(q), _head_dim_contiguous(k_cache), _head_dim_contiguous(v_cache)
    if qv is not None:
        qv = _head_dim_contiguous(qv)
    append = None
    if k is not None:
        if rotary_cos is not None:
            rotary_cos, rotary_sin = _dense_aligned(rotary_cos), _dense_aligned(rotary_sin)
        append = (_kernel_readable(k), _kernel_readable(v), rotary_cos, rotary_sin, rotary_interleaved)
    out, lse = _forward_outputs(q, v_cache, _fixed_out_dtype(q), with_lse)
    scales = (q_descale, k_descale, v_descale)
    index = q.get_device()
    counter = _tile_counter(index)
    mask = (window_left, window_right, softcap)
    if workspace is None and _capturing():
        # The scratch from the graph's pool, as every allocation under capture.
        capacity = k_cache.shape[1] * (1 if page_table is None else page_table.shape[1])
        _, nbytes = plan_kv_cache(cache_seqlens, q.dtype, q.shape[0], q.shape[1], capacity, q.shape[2],
                                  k_cache.shape[2], q.shape[3], v_cache.shape[3], causal, mask, num_splits,
                                  0 if k is None else k.shape[1], sinks is not None,
                                  _NO_FP8 if q_descale is None else _fp8_fields(scales, out))
        workspace = torch.empty(nbytes, dtype=torch.uint8, device=index) if nbytes else None
    _run(lib.forward,
         kvcache_forward_args(q, k_cache, v_cache, out, lse, softmax_scale, causal, counter,
                              (cache_seqlens, cache_batch_idx, cache_leftpad, num_splits), sinks,
                              mask, page_table, append, workspace, scales, qv),
         _raw_stream(index), "forward")
    return out, lse


def _kvcache_forward_impl(q: Tensor, k_cache: Tensor, v_cache: Tensor, cache_seqlens: Tensor,
                          cache_batch_idx: Optional[Tensor], cache_leftpad: Optional[Tensor], softmax_scale: float,
                          causal: bool, num_splits: int, workspace: Optional[Tensor],
                          sinks: Optional[Tensor] = None, window_left: int = -1,
                          window_right: int = -1, softcap: float = 0.0,
                          page_table: Optional[Tensor] = None, k: Optional[Tensor] = None,
                          v: Optional[Tensor] = None, rotary_cos: Optional[Tensor] = None,
                          rotary_sin: Optional[Tensor] = None, rotary_interleaved: bool = False,
                          q_descale: Optional[Tensor] = None, k_descale: Optional[Tensor] = None,
                          v_descale: Optional[Tensor] = None, qv: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    return _kvcache_forward(q, k_cache, v_cache, cache_seqlens, cache_batch_idx, cache_leftpad, softmax_scale,
                            causal, num_splits, workspace, sinks, window_left, window_right, softcap, page_table, k,
                            v, rotary_cos, rotary_sin, rotary_interleaved, q_descale, k_descale, v_descale, qv, True)


kvcache_fwd = torch.library.custom_op("flash3::kvcache_fwd", _kvcache_forward_impl,
                                      mutates_args=("k_cache", "v_cache"), device_types="cuda")


def kvcache(q, k_cache, v_cache, *rest, with_lse=True):
    """flash3::kvcache_fwd of checked arguments (its schema's order, every
    one given); an eager call on plain CUDA tensors runs the implementation
    without the dispatcher, as attention() does (decoding calls are tiny and
    many), with no LSE unless with_lse (None in its place), bumping the
    caches' version counters itself when it appends to them (the dispatcher
    does so for an operator's mutated arguments)."""
    if _eager(q, k_cache, v_cache):
        result = _kvcache_forward(q, k_cache, v_cache, *rest, with_lse)
        if rest[_KVCACHE_K_NEW] is not None:
            for cache in (k_cache, v_cache):
                torch.autograd.graph.increment_version(cache)
        return result
    return kvcache_fwd(q, k_cache, v_cache, *rest)


# Where the new keys (k) lie in kvcache's *rest: after cache_seqlens,
# cache_batch_idx, cache_leftpad, softmax_scale, causal, num_splits,
# workspace, sinks, window_left, window_right, softcap and page_table.
_KVCACHE_K_NEW = 12


@kvcache_fwd.register_fake
def _kvcache_forward_fake(q, k_cache, v_cache, cache_seqlens, cache_batch_idx, cache_leftpad, softmax_scale, causal,
                          num_splits, workspace, sinks=None, window_left=-1, window_right=-1, softcap=0.0, page_table=None,
                          k=None, v=None, rotary_cos=None, rotary_sin=None, rotary_interleaved=False, q_descale=None,
                          k_descale=None, v_descale=None, qv=None):
    return _forward_outputs(q, v_cache, _fixed_out_dtype(q))


# ---- combine (flash_attn_combine) ----------------------------------------------


def combine_args(out_partial, lse_partial, out, lse):
    """CombineArgs of the partials out_partial [splits, batch, seqlen, heads,
    head_dim] and lse_partial [splits, batch, seqlen, heads] (float32) into
    out [batch, seqlen, heads, head_dim] and lse [batch, heads, seqlen]."""
    args = _abi.CombineArgs()
    splits, b, sq, h, d = out_partial.shape
    o_split, *o_strides = out_partial.stride()
    _pack_combine(args, 0, splits, b, sq, h, d, out_partial.data_ptr(), *o_strides, o_split, lse_partial.data_ptr(),
                  *lse_partial.stride(), COMBINE_OUT_DTYPES[out.dtype], *_ref(out), lse.data_ptr(), 0)
    return args


@_on_tensor_device
def _combine_impl(out_partial: Tensor, lse_partial: Tensor, out: Tensor) -> Tensor:
    lib = _abi.load()
    b, sq, h = out.shape[:3]
    lse = out.new_empty((b, h, sq), dtype=torch.float32)
    _run(lib.combine, combine_args(out_partial, lse_partial, out, lse), _raw_stream(out.get_device()), "combine")
    return lse


combine = torch.library.custom_op("flash3::combine", _combine_impl, mutates_args=("out",), device_types="cuda")


@combine.register_fake
def _combine_fake(out_partial, lse_partial, out):
    b, sq, h = out.shape[:3]
    return out.new_empty((b, h, sq), dtype=torch.float32)


def quantize(q, k, v, granularity, hadamard, seed):
    if _eager(q, k, v):
        return _quantize_impl(q, k, v, granularity, hadamard, seed)
    return quantize_fp8(q, k, v, granularity, hadamard, seed)
