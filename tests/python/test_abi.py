"""flash3's ctypes mirrors of flash3.h and the C ABI plumbing, on the CPU
(no library, no GPU): the mirrors' fields against the header's text, the
structs the operators fill, the layout check, library loading and the status
to exception mapping."""
import ctypes
import os
import re

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (flash3's Python package needs it)")

import flash3  # noqa: E402
from flash3 import _abi, _ops, interface  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HEADER = os.path.join(REPO, "include", "flash3", "flash3.h")

# A C++ member's type, as the header spells it, to the ctypes type that mirrors it.
_CTYPES = {"int64_t": ctypes.c_int64, "uint64_t": ctypes.c_uint64, "size_t": ctypes.c_size_t, "bool": ctypes.c_bool,
           "float": ctypes.c_float, "DType": ctypes.c_int, "ScaleGranularity": ctypes.c_int, "Pointer": ctypes.c_void_p,
           "ConstTensor": _abi.TensorRef, "MutableTensor": _abi.TensorRef, "Fp8Scales": _abi.Fp8Scales,
           "KernelOptions": _abi.KernelOptions, "Varlen": _abi.Varlen,
           "KvCache": _abi.KvCache, "KvAppend": _abi.KvAppend}


def _strip_comments(text):
    return re.sub(r"/\*.*?\*/", "", re.sub(r"//[^\n]*", "", text), flags=re.S)


def header_structs():
    """{struct name: [(member, C++ type)]} of flash3.h's structs, members in
    declaration order ("ConstTensor q, k, v;" gives three)."""
    text = _strip_comments(open(HEADER).read())
    structs = {}
    for m in re.finditer(r"\bstruct\s+(\w+)\s*\{", text):
        depth, end = 1, m.end()
        while depth:
            depth += {"{": 1, "}": -1}.get(text[end], 0)
            end += 1
        members = []
        for statement in text[m.end():end - 1].split(";"):
            declaration = statement.split("=")[0].strip()
            if not declaration:
                continue
            first, *more = [part.strip() for part in declaration.split(",")]
            tokens = re.findall(r"[\w:]+|\*", first)
            ctype = " ".join(tokens[:-1])
            members += [(name, ctype) for name in [tokens[-1]] + more]
        structs[m.group(1)] = members
    return structs


def header_enum(name):
    body = re.search(r"enum\s+class\s+" + name + r"\s*\{([^}]*)\}", _strip_comments(open(HEADER).read())).group(1)
    return [e.strip() for e in body.split(",") if e.strip()]


def _mirror_type(cxx_type):
    return ctypes.c_void_p if "*" in cxx_type else _CTYPES[cxx_type]


@pytest.mark.parametrize("mirror", _abi.MIRRORS, ids=lambda m: m.__name__)
def test_mirror_matches_header(mirror):
    header = [(name, _mirror_type(t)) for name, t in header_structs()[mirror.__name__]]
    ours = list(mirror._fields_)
    assert ours == header


def test_enums_match_header():
    assert header_enum("DType") == ["kBF16", "kFP16", "kE4M3", "kFP32"]
    assert (_abi.BF16, _abi.FP16, _abi.E4M3, _abi.FP32) == (0, 1, 2, 3)
    assert header_enum("ScaleGranularity") == ["kPerTensor", "kPerHead", "kPerBlock"]
    assert (_abi.PER_TENSOR, _abi.PER_HEAD, _abi.PER_BLOCK) == (0, 1, 2)


def test_head_dims_match_the_library_sources():
    rows = re.findall(r"^FLASH3_HEAD_DIM\((\d+),\s*(true|false)\)", open(
        os.path.join(REPO, "src", "common", "head_dims.inc")).read(), flags=re.M)
    assert interface.HEAD_DIMS == tuple(int(d) for d, _ in rows)
    assert interface.FP8_HEAD_DIMS == tuple(int(d) for d, fp8 in rows if fp8 == "true")
    pairs = re.findall(r"^FLASH3_HEAD_DIM_PAIR\((\d+),\s*(\d+)\)", open(
        os.path.join(REPO, "src", "common", "head_dims.inc")).read(), flags=re.M)
    assert interface.HEAD_DIM_PAIRS == tuple((int(d), int(dv)) for d, dv in pairs)


def test_packer_covers_every_byte():
    for mirror in _abi.MIRRORS:
        assert _abi.packer(mirror).size == ctypes.sizeof(mirror), mirror.__name__


def _sizes(a):
    return (a.dtype, a.batch, a.seqlen_q, a.seqlen_k, a.heads_q, a.heads_kv, a.head_dim)


def _ref_matches(ref, t):
    return (ref.data, ref.batch_stride, ref.seq_stride, ref.head_stride, ref.dim_stride) == (t.data_ptr(), *t.stride())


def test_forward_args_by_field_name():
    q = torch.empty(2, 5, 6, 64, dtype=torch.bfloat16)
    k = torch.empty(2, 3, 7, 64, dtype=torch.bfloat16).transpose(1, 2)  # [2, 7, 3, 64], strided
    v = torch.empty(2, 7, 3, 64, dtype=torch.bfloat16)
    out, lse = torch.empty_like(q), torch.empty(2, 6, 5)
    counter = torch.zeros(1, dtype=torch.int32)
    a = _ops.forward_args(q, k, v, out, lse, (None, None, None), 0.25, True, counter)
    assert _sizes(a) == (_abi.BF16, 2, 5, 7, 6, 3, 64)
    for ref, t in ((a.q, q), (a.k, k), (a.v, v), (a.o, out)):
        assert _ref_matches(ref, t)
    assert (a.lse, a.softmax_scale, a.causal, a.tile_counter) == (lse.data_ptr(), 0.25, True, counter.data_ptr())
    assert (a.fp8.granularity, a.fp8.q, a.fp8.k, a.fp8.v) == (0, None, None, None)
    assert (a.options.pingpong, a.options.intra_warpgroup_overlap, a.options.persistent,
            a.options.warp_specialization) == (True, True, True, True)
    assert a.head_dim_v == 64

    # V's head dim of its own: V and O of 128 columns beside Q and K's 192.
    q192, k192 = torch.empty(2, 5, 6, 192, dtype=torch.bfloat16), torch.empty(2, 7, 3, 192, dtype=torch.bfloat16)
    v128, out128 = torch.empty(2, 7, 3, 128, dtype=torch.bfloat16), torch.empty(2, 5, 6, 128, dtype=torch.bfloat16)
    a = _ops.forward_args(q192, k192, v128, out128, lse, (None, None, None), 0.25, False, None)
    assert (a.head_dim, a.head_dim_v) == (192, 128)
    assert _ref_matches(a.v, v128) and _ref_matches(a.o, out128)

    q8, k8 = q.to(torch.float8_e4m3fn), k.to(torch.float8_e4m3fn)
    scales = [torch.ones(2, h, 1) for h in (6, 3, 3)]
    a = _ops.forward_args(q8, k8, k8, out.half(), lse, scales, 0.5, False, counter)
    assert (a.dtype, a.fp8.granularity, a.fp8.out_dtype) == (_abi.E4M3, _abi.PER_BLOCK, _abi.FP16)
    assert (a.fp8.q, a.fp8.k, a.fp8.v) == tuple(s.data_ptr() for s in scales)


def _packed_ref_matches(ref, t):
    return (ref.data, ref.batch_stride, ref.seq_stride, ref.head_stride, ref.dim_stride) == (t.data_ptr(), 0,
                                                                                                *t.stride())


def _varlen_inputs():
    q, k = torch.empty(30, 6, 64, dtype=torch.bfloat16), torch.empty(50, 3, 64, dtype=torch.bfloat16)
    cu_q, cu_k = torch.tensor([0, 10, 30], dtype=torch.int32), torch.tensor([0, 20, 48], dtype=torch.int32)
    used_k = torch.tensor([20, 25], dtype=torch.int32)
    return q, k, (cu_q, cu_k, None, used_k, 20, 28)


def test_varlen_forward_args_by_field_name():
    q, k, varlen = _varlen_inputs()
    out, lse = torch.empty_like(q), torch.empty(6, 30)
    a = _ops.varlen_forward_args(q, k, k, out, lse, 0.25, True, None, varlen)
    assert _sizes(a) == (_abi.BF16, 2, 20, 28, 6, 3, 64)
    for ref, t in ((a.q, q), (a.k, k), (a.v, k), (a.o, out)):
        assert _packed_ref_matches(ref, t)
    assert (a.varlen.cu_seqlens_q, a.varlen.cu_seqlens_k, a.varlen.seqused_q, a.varlen.seqused_k) == (
        varlen[0].data_ptr(), varlen[1].data_ptr(), None, varlen[3].data_ptr())
    assert (a.varlen.total_q, a.varlen.total_k, a.lse, a.causal, a.tile_counter) == (30, 50, lse.data_ptr(), True,
                                                                                    None)
    assert (a.fp8.granularity, a.fp8.q, a.fp8.k, a.fp8.v) == (0, None, None, None)

    # FP8: per-head scales of the 2 sequences, O in bf16.
    q8, k8 = q.to(torch.float8_e4m3fn), k.to(torch.float8_e4m3fn)
    scales = [torch.ones(2, h) for h in (6, 3, 3)]
    a = _ops.varlen_forward_args(q8, k8, k8, out, lse, 0.25, True, None, varlen, scales=scales)
    assert (a.dtype, a.batch, a.fp8.granularity, a.fp8.out_dtype) == (_abi.E4M3, 2, _abi.PER_HEAD, _abi.BF16)
    assert (a.fp8.q, a.fp8.k, a.fp8.v) == tuple(s.data_ptr() for s in scales)
    assert _packed_ref_matches(a.q, q8) and _packed_ref_matches(a.o, out)


def test_varlen_backward_args_by_field_name():
    q, k, varlen = _varlen_inputs()
    out, lse, dq, dk = torch.empty_like(q), torch.empty(6, 30), torch.empty_like(q), torch.empty_like(k)
    sinks, dsinks = torch.empty(6), torch.empty(6)
    a = _ops.varlen_backward_args(q, q, k, k, out, lse, dq, dk, dk, 0.5, False, True, varlen, sinks, dsinks,
                                  (7, -1, 30.0))
    assert _sizes(a) == (_abi.BF16, 2, 20, 28, 6, 3, 64)
    for ref, t in ((a.q, q), (a.k, k), (a.v, k), (a.o, out), (a.dout, q), (a.dq, dq), (a.dk, dk), (a.dv, dk)):
        assert _packed_ref_matches(ref, t)
    assert (a.varlen.cu_seqlens_q, a.varlen.seqused_k, a.varlen.total_q, a.varlen.total_k) == (
        varlen[0].data_ptr(), varlen[3].data_ptr(), 30, 50)
    assert (a.window_left, a.window_right, a.softcap, a.deterministic) == (7, -1, 30.0, True)
    assert (a.sinks, a.dsinks, a.workspace, a.head_dim_v) == (sinks.data_ptr(), dsinks.data_ptr(), None, 64)


def test_backward_args_by_field_name():
    q, dout = torch.empty(1, 4, 8, 128, dtype=torch.float16), torch.empty(1, 4, 8, 128, dtype=torch.float16)
    k, v = torch.empty(1, 6, 2, 128, dtype=torch.float16), torch.empty(1, 6, 2, 128, dtype=torch.float16)
    out, lse = torch.empty_like(q), torch.empty(1, 8, 4)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    a = _ops.backward_args(dout, q, k, v, out, lse, dq, dk, dv, 0.125, False, True)
    assert _sizes(a) == (_abi.FP16, 1, 4, 6, 8, 2, 128)
    for ref, t in ((a.q, q), (a.k, k), (a.v, v), (a.o, out), (a.dout, dout), (a.dq, dq), (a.dk, dk), (a.dv, dv)):
        assert _ref_matches(ref, t)
    assert (a.lse, a.softmax_scale, a.causal, a.deterministic) == (lse.data_ptr(), 0.125, False, True)
    assert a.workspace is None  # set by the operator once backward_workspace_size is known
    assert a.head_dim_v == 128
    # V's head dim of its own: V, O, dO and dV of 64 columns beside Q and K's 128 (as the pair 192 / 128).
    v64, out64 = torch.empty(1, 6, 2, 64, dtype=torch.float16), torch.empty(1, 4, 8, 64, dtype=torch.float16)
    a = _ops.backward_args(out64, q, k, v64, out64, lse, dq, dk, torch.empty_like(v64), 0.125, False, True)
    assert (a.head_dim, a.head_dim_v) == (128, 64)
    assert _ref_matches(a.v, v64) and _ref_matches(a.dout, out64)


def test_quantize_args_by_field_name():
    q = torch.empty(1, 4, 8, 256, dtype=torch.bfloat16)
    k, v = torch.empty(1, 6, 2, 256, dtype=torch.bfloat16), torch.empty(1, 6, 2, 256, dtype=torch.bfloat16)
    outs = _ops._quantize_outputs(q, k, v, _abi.PER_HEAD)
    a = _ops.quantize_args(q, k, v, outs, _abi.PER_HEAD, True, 2 ** 63 - 1)
    assert _sizes(a) == (_abi.BF16, 1, 4, 6, 8, 2, 256)
    for ref, t in ((a.q, q), (a.k, k), (a.v, v), (a.q_out, outs[0]), (a.k_out, outs[1]), (a.v_out, outs[2])):
        assert _ref_matches(ref, t)
    assert (a.granularity, a.q_scale, a.k_scale, a.v_scale, a.hadamard, a.seed) == (
        _abi.PER_HEAD, outs[3].data_ptr(), outs[4].data_ptr(), outs[5].data_ptr(), True, 2 ** 63 - 1)


def _offsets_of_mirrors():
    table = {}
    for mirror in _abi.MIRRORS:
        table[(mirror.__name__, "")] = ctypes.sizeof(mirror)
        table.update({(mirror.__name__, f): o for f, o in _abi._flat_fields(mirror)})
    return table


def test_layout_check_agrees_with_itself_and_names_a_drifted_field():
    table = _offsets_of_mirrors()
    assert ("ForwardArgs", "q.seq_stride") in table and ("BackwardArgs", "dv.data") in table

    def lookup(overrides):
        return lambda s, f: overrides.get((s.decode(), f.decode()), table.get((s.decode(), f.decode()), -1))

    assert _abi.layout_mismatches(lookup({})) == []
    problems = _abi.layout_mismatches(lookup({("ForwardArgs", "tile_counter"): -1, ("Fp8Scales", ""): 32}))
    assert any("ForwardArgs.tile_counter: offset -1 in the library" in p for p in problems)
    assert any("sizeof(Fp8Scales): 32 in the library" in p for p in problems)
    assert len(problems) == 2


def test_load_says_why_without_a_library(tmp_path, monkeypatch):
    monkeypatch.setattr(_abi, "_loaded", None)
    missing = tmp_path / "libflash3_c.so"
    monkeypatch.setenv("FLASH3_LIBRARY", str(missing))
    with pytest.raises(flash3.LibraryError, match="not built.*FLASH3_LIBRARY"):
        _abi.load()
    missing.write_text("not a shared library")
    with pytest.raises(flash3.LibraryError, match="cannot load libflash3_c"):
        _abi.load()
    monkeypatch.delenv("FLASH3_LIBRARY")
    assert _abi.library_path() == os.path.join(os.path.dirname(flash3.__file__), "libflash3_c.so")


def test_status_codes_become_exceptions():
    buf = ctypes.create_string_buffer(b"q.seq_stride: must be a multiple of 8 elements", _abi.MESSAGE_BYTES)
    _abi.raise_for_status(0, buf, "forward")
    for code, exception in ((1, ValueError), (2, NotImplementedError), (3, RuntimeError), (7, RuntimeError)):
        with pytest.raises(exception, match="flash3 forward: q.seq_stride: must be"):
            _abi.raise_for_status(code, buf, "forward")
    assert issubclass(NotImplementedError, RuntimeError)  # kUnsupported is a RuntimeError too


def test_kvcache_forward_args_by_field_name():
    q = torch.empty(2, 3, 8, 64, dtype=torch.bfloat16)
    k = torch.empty(5, 100, 2, 64, dtype=torch.bfloat16)
    v = torch.empty(5, 100, 2, 64, dtype=torch.bfloat16)
    out, lse = torch.empty_like(q), torch.empty(2, 8, 3)
    lens, idx, pad = (torch.zeros(2, dtype=torch.int32) for _ in range(3))
    a = _ops.kvcache_forward_args(q, k, v, out, lse, 0.5, True, None, (lens, idx, pad, 7), None, (10, 0, 2.0))
    assert _sizes(a) == (_abi.BF16, 2, 3, 100, 8, 2, 64)
    for ref, t in ((a.q, q), (a.k, k), (a.v, v), (a.o, out)):
        assert _ref_matches(ref, t)
    assert (a.lse, a.softmax_scale, a.causal, a.window_left, a.window_right, a.softcap) == (
        lse.data_ptr(), 0.5, True, 10, 0, 2.0)
    assert (a.kv_cache.seqlens, a.kv_cache.batch_idx, a.kv_cache.leftpad) == (
        lens.data_ptr(), idx.data_ptr(), pad.data_ptr())
    assert (a.kv_cache.batch_cache, a.kv_cache.num_splits, a.varlen.cu_seqlens_q) == (5, 7, None)
    assert (a.kv_cache.workspace, a.kv_cache.workspace_bytes) == (None, 0)
    workspace = torch.empty(7, 96, dtype=torch.uint8)
    a = _ops.kvcache_forward_args(q, k, v, out, None, 0.5, False, None, (lens, None, None, 1), workspace=workspace)
    assert (a.kv_cache.batch_idx, a.kv_cache.leftpad, a.lse) == (None, None, None)
    assert (a.kv_cache.workspace, a.kv_cache.workspace_bytes) == (workspace.data_ptr(), 7 * 96)


def test_paged_kvcache_forward_args_by_field_name():
    q = torch.empty(2, 1, 8, 128, dtype=torch.bfloat16)
    pool = torch.empty(7, 32, 2, 128, dtype=torch.bfloat16)
    table = torch.zeros(2, 9, dtype=torch.int32)[:, :6]  # a row stride of 9
    lens = torch.zeros(2, dtype=torch.int32)
    a = _ops.kvcache_forward_args(q, pool, pool, torch.empty_like(q), None, 0.5, True, None, (lens, None, None, 0),
                                  None, (-1, 0, 0.0), table)
    assert (a.seqlen_k, a.kv_cache.batch_cache, a.k.batch_stride, a.k.seq_stride) == (6 * 32, 7, 32 * 256, 256)
    assert (a.kv_cache.page_table, a.kv_cache.page_table_stride, a.kv_cache.page_size) == (table.data_ptr(), 9, 32)
    a = _ops.kvcache_forward_args(q, pool, pool, torch.empty_like(q), None, 0.5, True, None, (lens, None, None, 0))
    assert (a.seqlen_k, a.kv_cache.page_table, a.kv_cache.page_table_stride, a.kv_cache.page_size) == (32, None, 0, 0)


def test_calls_without_a_cache_leave_it_unset():
    q = torch.empty(2, 5, 6, 64, dtype=torch.bfloat16)
    k = torch.empty(2, 7, 3, 64, dtype=torch.bfloat16)
    a = _ops.forward_args(q, k, k, torch.empty_like(q), None, (None, None, None), 0.25, False, None)
    assert (a.kv_cache.seqlens, a.kv_cache.batch_cache, a.kv_cache.num_splits) == (None, 0, 1)
    assert (a.kv_cache.page_table, a.kv_cache.page_table_stride, a.kv_cache.page_size) == (None, 0, 0)
