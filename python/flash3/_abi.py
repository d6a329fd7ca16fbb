"""The C ABI of libflash3_c (include/flash3/flash3_c.h): ctypes mirrors of
flash3.h's argument structs, loading the library, checking the mirrors against
it, and turning a returned status into a Python exception.

Nothing here touches the library at import: load() opens it on first use, so
that the package imports (and traces, and checks its arguments) without it.
"""
import ctypes
import os
import struct
import threading

# Mirrors of flash3.h, field by field in declaration order. The enums
# (DType, ScaleGranularity) are int-sized enum classes and bool is one byte;
# load() checks every offset and size against the library before any call.


class TensorRef(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("batch_stride", ctypes.c_int64),
        ("seq_stride", ctypes.c_int64),
        ("head_stride", ctypes.c_int64),
        ("dim_stride", ctypes.c_int64),
    ]


class KernelOptions(ctypes.Structure):
    _fields_ = [
        ("pingpong", ctypes.c_bool),
        ("intra_warpgroup_overlap", ctypes.c_bool),
        ("persistent", ctypes.c_bool),
        ("warp_specialization", ctypes.c_bool),
    ]


class Fp8Scales(ctypes.Structure):
    _fields_ = [
        ("granularity", ctypes.c_int),
        ("q", ctypes.c_void_p),
        ("k", ctypes.c_void_p),
        ("v", ctypes.c_void_p),
        ("out_dtype", ctypes.c_int),
        ("q_per_kv_head", ctypes.c_bool),
    ]


class Varlen(ctypes.Structure):
    _fields_ = [
        ("cu_seqlens_q", ctypes.c_void_p),
        ("cu_seqlens_k", ctypes.c_void_p),
        ("seqused_q", ctypes.c_void_p),
        ("seqused_k", ctypes.c_void_p),
        ("total_q", ctypes.c_int64),
        ("total_k", ctypes.c_int64),
    ]


class KvAppend(ctypes.Structure):
    _fields_ = [
        ("k", TensorRef),
        ("v", TensorRef),
        ("seqlen_new", ctypes.c_int64),
        ("rotary_cos", ctypes.c_void_p),
        ("rotary_sin", ctypes.c_void_p),
        ("rotary_seqlen", ctypes.c_int64),
        ("rotary_dim", ctypes.c_int64),
        ("rotary_interleaved", ctypes.c_bool),
    ]


class KvCache(ctypes.Structure):
    _fields_ = [
        ("seqlens", ctypes.c_void_p),
        ("batch_idx", ctypes.c_void_p),
        ("leftpad", ctypes.c_void_p),
        ("batch_cache", ctypes.c_int64),
        ("num_splits", ctypes.c_int64),
        ("page_table", ctypes.c_void_p),
        ("page_table_stride", ctypes.c_int64),
        ("page_size", ctypes.c_int64),
        ("append", KvAppend),
        ("workspace", ctypes.c_void_p),
        ("workspace_bytes", ctypes.c_uint64),
    ]


_SIZES = [
    ("dtype", ctypes.c_int),
    ("batch", ctypes.c_int64),
    ("seqlen_q", ctypes.c_int64),
    ("seqlen_k", ctypes.c_int64),
    ("heads_q", ctypes.c_int64),
    ("heads_kv", ctypes.c_int64),
    ("head_dim", ctypes.c_int64),
]


class ForwardArgs(ctypes.Structure):
    _fields_ = _SIZES + [
        ("q", TensorRef),
        ("k", TensorRef),
        ("v", TensorRef),
        ("o", TensorRef),
        ("lse", ctypes.c_void_p),
        ("softmax_scale", ctypes.c_float),
        ("causal", ctypes.c_bool),
        ("window_left", ctypes.c_int64),
        ("window_right", ctypes.c_int64),
        ("softcap", ctypes.c_float),
        ("sinks", ctypes.c_void_p),
        ("fp8", Fp8Scales),
        ("varlen", Varlen),
        ("options", KernelOptions),
        ("tile_counter", ctypes.c_void_p),
        ("head_dim_v", ctypes.c_int64),
        ("kv_cache", KvCache),
        ("qv", TensorRef),
    ]


class BackwardArgs(ctypes.Structure):
    _fields_ = _SIZES + [
        ("q", TensorRef),
        ("k", TensorRef),
        ("v", TensorRef),
        ("o", TensorRef),
        ("dout", TensorRef),
        ("lse", ctypes.c_void_p),
        ("dq", TensorRef),
        ("dk", TensorRef),
        ("dv", TensorRef),
        ("softmax_scale", ctypes.c_float),
        ("causal", ctypes.c_bool),
        ("window_left", ctypes.c_int64),
        ("window_right", ctypes.c_int64),
        ("softcap", ctypes.c_float),
        ("sinks", ctypes.c_void_p),
        ("dsinks", ctypes.c_void_p),
        ("deterministic", ctypes.c_bool),
        ("varlen", Varlen),
        ("workspace", ctypes.c_void_p),
        ("head_dim_v", ctypes.c_int64),
    ]


class QuantizeArgs(ctypes.Structure):
    _fields_ = _SIZES + [
        ("q", TensorRef),
        ("k", TensorRef),
        ("v", TensorRef),
        ("q_out", TensorRef),
        ("k_out", TensorRef),
        ("v_out", TensorRef),
        ("granularity", ctypes.c_int),
        ("q_scale", ctypes.c_void_p),
        ("k_scale", ctypes.c_void_p),
        ("v_scale", ctypes.c_void_p),
        ("hadamard", ctypes.c_bool),
        ("seed", ctypes.c_uint64),
    ]


class CombineArgs(ctypes.Structure):
    _fields_ = [
        ("num_splits", ctypes.c_int64),
        ("batch", ctypes.c_int64),
        ("seqlen", ctypes.c_int64),
        ("heads", ctypes.c_int64),
        ("head_dim", ctypes.c_int64),
        ("o_partial", TensorRef),
        ("o_partial_split_stride", ctypes.c_int64),
        ("lse_partial", ctypes.c_void_p),
        ("lse_split_stride", ctypes.c_int64),
        ("lse_batch_stride", ctypes.c_int64),
        ("lse_seq_stride", ctypes.c_int64),
        ("lse_head_stride", ctypes.c_int64),
        ("out_dtype", ctypes.c_int),
        ("out", TensorRef),
        ("lse", ctypes.c_void_p),
        ("sinks", ctypes.c_void_p),
    ]


MIRRORS = (TensorRef, KernelOptions, Fp8Scales, Varlen, KvAppend, KvCache, ForwardArgs, BackwardArgs, QuantizeArgs,
           CombineArgs)

# flash3::DType and flash3::ScaleGranularity values.
BF16, FP16, E4M3, FP32 = 0, 1, 2, 3
PER_TENSOR, PER_HEAD, PER_BLOCK = 0, 1, 2

# FP8 scale blocks (query rows, key/value rows) per head dim: the forward
# kernel's FP8 tiles (src/fwd/tile_size.h). The fake implementations need them
# without the library; load() checks them against flash3_fp8_block_sizes.
FP8_BLOCK_SIZES = {64: (192, 128), 128: (128, 192), 256: (128, 96)}

_CODES = {ctypes.c_int: "i", ctypes.c_int64: "q", ctypes.c_uint64: "Q", ctypes.c_void_p: "Q", ctypes.c_float: "f",
          ctypes.c_bool: "?"}
assert ctypes.sizeof(ctypes.c_void_p) == 8, "flash3 runs on 64-bit hosts only"


def _leaves(cls, base=0):
    """(offset, ctypes type) of every scalar field, nested structs flattened,
    in declaration order."""
    for name, ctype in cls._fields_:
        offset = base + getattr(cls, name).offset
        if issubclass(ctype, ctypes.Structure):
            yield from _leaves(ctype, offset)
        else:
            yield offset, ctype


def packer(cls):
    """A struct.Struct that writes `cls`'s scalar fields, nested ones
    flattened, in declaration order, into an instance's memory (pack_into).
    One pack_into is several times faster than setting ctypes fields one by
    one, which matters at every attention call."""
    fmt, pos = "=", 0
    for offset, ctype in _leaves(cls):
        fmt += f"{offset - pos}x" * (offset > pos) + _CODES[ctype]
        pos = offset + ctypes.sizeof(ctype)
    fmt += f"{ctypes.sizeof(cls) - pos}x" * (ctypes.sizeof(cls) > pos)
    return struct.Struct(fmt)


LIBRARY_NAME = "libflash3_c.so"


class LibraryError(RuntimeError):
    """libflash3_c cannot be used: not built, not loadable, or built from a
    flash3.h that this package's mirrors do not match."""


def library_path():
    """FLASH3_LIBRARY if set, else libflash3_c.so in the package's folder."""
    return os.environ.get("FLASH3_LIBRARY") or os.path.join(os.path.dirname(os.path.abspath(__file__)), LIBRARY_NAME)


def _flat_fields(cls, prefix=""):
    """(dotted name, offset in `cls`) of every field, nested ones too, as
    flash3_abi_offset names them ("q.seq_stride")."""
    for name, ctype in cls._fields_:
        offset = getattr(cls, name).offset
        yield prefix + name, offset
        if issubclass(ctype, ctypes.Structure):
            for sub, sub_offset in _flat_fields(ctype, prefix + name + "."):
                yield sub, offset + sub_offset


def layout_mismatches(abi_offset):
    """Where the mirrors and `abi_offset(struct name, field)` (the library's
    flash3_abi_offset) disagree, in words; empty when they all agree."""
    problems = []
    for cls in MIRRORS:
        name = cls.__name__
        size = abi_offset(name.encode(), b"")
        if size != ctypes.sizeof(cls):
            problems.append(f"sizeof({name}): {size} in the library, {ctypes.sizeof(cls)} here")
        for field, offset in _flat_fields(cls):
            theirs = abi_offset(name.encode(), field.encode())
            if theirs != offset:
                problems.append(f"{name}.{field}: offset {theirs} in the library, {offset} here")
    return problems


class _Library:
    """The loaded library's entry points, with their C signatures."""

    def __init__(self, path):
        self.path = path
        cdll = ctypes.CDLL(path)
        msg = [ctypes.c_char_p, ctypes.c_size_t]

        def fn(name, restype, argtypes):
            f = getattr(cdll, name)
            f.restype, f.argtypes = restype, argtypes
            return f

        self.version = fn("flash3_version", ctypes.c_char_p, [])().decode()
        self.abi_offset = fn("flash3_abi_offset", ctypes.c_int64, [ctypes.c_char_p, ctypes.c_char_p])
        fwd, bwd, quant, comb = (ctypes.POINTER(s) for s in (ForwardArgs, BackwardArgs, QuantizeArgs, CombineArgs))
        self.forward = fn("flash3_forward", ctypes.c_int, [fwd, ctypes.c_void_p] + msg)
        self.backward = fn("flash3_backward", ctypes.c_int, [bwd, ctypes.c_void_p] + msg)
        self.quantize_fp8 = fn("flash3_quantize_fp8", ctypes.c_int, [quant, ctypes.c_void_p] + msg)
        self.combine = fn("flash3_combine", ctypes.c_int, [comb, ctypes.c_void_p] + msg)
        self.backward_workspace_size = fn(
            "flash3_backward_workspace_size", ctypes.c_int, [bwd, ctypes.POINTER(ctypes.c_size_t)] + msg)
        self.plan_kv_cache = fn(
            "flash3_plan_kv_cache", ctypes.c_int,
            [fwd, ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_size_t)] + msg)
        self.fp8_block_sizes = fn(
            "flash3_fp8_block_sizes", None,
            [ctypes.c_int64, ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_int64)])

    def block_size_mismatches(self):
        q, kv = ctypes.c_int64(), ctypes.c_int64()
        problems = []
        for head_dim, ours in FP8_BLOCK_SIZES.items():
            self.fp8_block_sizes(head_dim, ctypes.byref(q), ctypes.byref(kv))
            if (q.value, kv.value) != ours:
                problems.append(f"fp8_block_sizes({head_dim}): {(q.value, kv.value)} in the library, {ours} here")
        return problems


_loaded = None
_load_lock = threading.Lock()


def load():
    """The library, opened and checked once per process; LibraryError saying
    why when it cannot be used. A failure is not cached: building the library
    or setting FLASH3_LIBRARY lets a later call succeed."""
    global _loaded
    if _loaded is not None:
        return _loaded
    with _load_lock:
        if _loaded is not None:
            return _loaded
        path = library_path()
        if not os.path.exists(path):
            where = "FLASH3_LIBRARY" if os.environ.get("FLASH3_LIBRARY") else "the flash3 package"
            raise LibraryError(
                f"flash3: libflash3_c not built: {path} (from {where}) does not exist. Install flash3 with "
                "`pip install .` from a clone (needs nvcc 13 and PyTorch), or set FLASH3_LIBRARY to a built "
                "libflash3_c.so")
        try:
            lib = _Library(path)
        except (OSError, AttributeError) as e:
            raise LibraryError(f"flash3: cannot load libflash3_c from {path}: {e}") from e
        # A mirror that disagrees with the library would pass misread arguments
        # to the kernels: refuse to run instead.
        problems = layout_mismatches(lib.abi_offset) + lib.block_size_mismatches()
        if problems:
            raise LibraryError(
                f"flash3: {path} (version {lib.version}) was built from a flash3.h that this package does not "
                "match; rebuild the library and the package from one checkout. " + "; ".join(problems))
        _loaded = lib
        return lib


MESSAGE_BYTES = 1024
_tls = threading.local()


def message_buffer():
    """A per-thread buffer for the library's error messages, made once."""
    buf = getattr(_tls, "buf", None)
    if buf is None:
        buf = _tls.buf = ctypes.create_string_buffer(MESSAGE_BYTES)
    return buf


def raise_for_status(code, buf, what):
    """Status::Code as a Python exception: kInvalidArgument → ValueError,
    kUnsupported → NotImplementedError (a RuntimeError), kCudaError →
    RuntimeError. The message starts with the argument's name."""
    if code == 0:
        return
    message = f"flash3 {what}: {buf.value.decode(errors='replace')}"
    if code == 1:
        raise ValueError(message)
    if code == 2:
        raise NotImplementedError(message)
    raise RuntimeError(message if code == 3 else f"{message} (status {code})")
