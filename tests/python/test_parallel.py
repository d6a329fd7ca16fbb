"""flash3.parallel (context parallelism) without GPUs: the ring's and the
all-gather's steps, merges, gradient accumulators and zig-zag sharding, run
over 2 and 4 CPU processes (gloo) with float64 reference kernels in place of
flash3's, against attention over the whole sequence and its autograd
gradients; and the entry point's argument checks. The GPU test (NCCL,
flash3's kernels, 2 GPUs) is in test_gpu.py.
"""
import os
import tempfile

import pytest

torch = pytest.importorskip("torch", reason="flash3.parallel needs PyTorch")
dist = pytest.importorskip("torch.distributed", reason="flash3.parallel needs torch.distributed")
mp = pytest.importorskip("torch.multiprocessing")

from flash3 import parallel  # noqa: E402

if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)


def reference_attention(q, k, v, causal, scale):
    """O and the LSE ([batch, heads, seqlen_q]) of q [b, sq, h, d] over k, v
    [b, sk, hkv, d], the causal mask aligned bottom-right."""
    group = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(group, 2), v.repeat_interleave(group, 2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if causal:
        sq, sk = q.shape[1], k.shape[1]
        seen = torch.arange(sk)[None, :] <= torch.arange(sq)[:, None] + (sk - sq)
        s = s.masked_fill(~seen, -torch.inf)
    lse = torch.logsumexp(s, dim=-1)
    return torch.einsum("bhqk,bkhd->bqhd", torch.exp(s - lse[..., None]), v), lse


class ReferenceKernels:
    """flash3's block kernels' contract in float64: the forward's (out, lse),
    the backward's (dq, dk, dv) from the merged out and lse."""

    def forward(self, q, k, v, causal, scale):
        return reference_attention(q, k, v, causal, scale)

    def backward(self, dout, q, k, v, out, lse, causal, scale):
        group = q.shape[2] // k.shape[2]
        ke, ve = k.repeat_interleave(group, 2), v.repeat_interleave(group, 2)
        s = torch.einsum("bqhd,bkhd->bhqk", q, ke) * scale
        if causal:
            sq, sk = q.shape[1], k.shape[1]
            seen = torch.arange(sk)[None, :] <= torch.arange(sq)[:, None] + (sk - sq)
            s = s.masked_fill(~seen, -torch.inf)
        p = torch.exp(s - lse[..., None])
        dv = torch.einsum("bhqk,bqhd->bkhd", p, dout)
        dp = torch.einsum("bqhd,bkhd->bhqk", dout, ve)
        delta = (dout * out).sum(-1).transpose(1, 2)[..., None]
        ds = p * (dp - delta)
        dq = torch.einsum("bhqk,bkhd->bqhd", ds, ke) * scale
        dk = torch.einsum("bhqk,bqhd->bkhd", ds, q) * scale
        b, sk, hkv, d = k.shape
        return dq, dk.view(b, sk, hkv, group, d).sum(3), dv.view(b, sk, hkv, group, d).sum(3)


    def forward_varlen(self, q, k, v, cu_q, cu_k, max_q, max_k, seqused_k, causal, scale):
        out = torch.zeros_like(q)
        lse = torch.full((q.shape[1], q.shape[0]), -torch.inf, dtype=q.dtype)
        for b, (qs, ks) in enumerate(self._sequences(cu_q, cu_k, seqused_k)):
            o, l_b = reference_attention(q[qs][None], k[ks][None], v[ks][None], causal, scale)
            out[qs], lse[:, qs] = o[0], l_b[0]
        return out, lse

    def backward_varlen(self, dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, seqused_k, causal, scale):
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        for qs, ks in self._sequences(cu_q, cu_k, seqused_k):
            grads = self.backward(dout[qs][None], q[qs][None], k[ks][None], v[ks][None], out[qs][None],
                                  lse[:, qs][None], causal, scale)
            dq[qs], dk[ks], dv[ks] = (g[0] for g in grads)
        return dq, dk, dv

    @staticmethod
    def _sequences(cu_q, cu_k, seqused_k):
        """Each sequence's query rows and key rows (its first seqused_k)."""
        for b in range(cu_q.shape[0] - 1):
            used = int(cu_k[b + 1] - cu_k[b]) if seqused_k is None else int(seqused_k[b])
            yield slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b]) + used)


CASES = [(mode, causal, heads) for mode in parallel.MODES for causal in (False, True) for heads in ((4, 4), (4, 2))]


def _worker(rank, world, init_file, results):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    torch.manual_seed(0)
    errors = {}
    for mode, causal, (hq, hkv) in CASES:
        chunk, d, b = 5, 8, 2
        n = 2 * world * chunk
        q = torch.randn(b, n, hq, d, dtype=torch.float64)
        k, v = (torch.randn(b, n, hkv, d, dtype=torch.float64) for _ in range(2))
        dout = torch.randn(b, n, hq, d, dtype=torch.float64)
        scale = d ** -0.5
        shards = [parallel.zigzag_shard(t, None).clone().requires_grad_(True) for t in (q, k, v)]
        out = parallel._ContextParallelAttention.apply(*shards, None, causal, scale, mode, ReferenceKernels())
        out.backward(parallel.zigzag_shard(dout, None))
        got = [parallel.zigzag_unshard(t, None) for t in (out.detach(), *(s.grad for s in shards))]
        full = [t.clone().requires_grad_(True) for t in (q, k, v)]
        ref_out, _ = reference_attention(*full, causal, scale)
        ref_out.backward(dout)
        want = [ref_out.detach(), *(t.grad for t in full)]
        errors[(mode, causal, hq, hkv)] = max((g - w).abs().max().item() for g, w in zip(got, want))
    # Packed documents, each sharded zig-zag on its own.
    for mode, causal in ((m, c) for m in parallel.MODES for c in (False, True)):
        lengths = [4 * world, 2 * world, 6 * world, 2 * world]
        cu = torch.tensor([0] + lengths).cumsum(0).to(torch.int32)
        total, hq, hkv, d = sum(lengths), 4, 2, 8
        q = torch.randn(total, hq, d, dtype=torch.float64)
        k, v = (torch.randn(total, hkv, d, dtype=torch.float64) for _ in range(2))
        dout = torch.randn(total, hq, d, dtype=torch.float64)
        scale = d ** -0.5
        shards, cu_local, longest = [], None, 0
        for t in (q, k, v):
            shard, cu_local, longest = parallel.zigzag_shard_varlen(t, cu)
            shards.append(shard.clone().requires_grad_(True))
        out = parallel._ContextParallelVarlen.apply(*shards, cu_local, longest, None, causal, scale, mode,
                                                    ReferenceKernels())
        out.backward(parallel.zigzag_shard_varlen(dout, cu)[0])
        got = [parallel.zigzag_unshard_varlen(t, cu) for t in (out.detach(), *(s.grad for s in shards))]
        full = [t.clone().requires_grad_(True) for t in (q, k, v)]
        ref_out = torch.cat([reference_attention(full[0][a:b][None], full[1][a:b][None], full[2][a:b][None],
                                                 causal, scale)[0][0] for a, b in zip(cu[:-1], cu[1:])])
        ref_out.backward(dout)
        want = [ref_out.detach(), *(t.grad for t in full)]
        errors[("varlen " + mode, causal, hq, hkv)] = max((g - w).abs().max().item() for g, w in zip(got, want))
    if rank == 0:
        results.put(errors)
    dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 4])
def test_context_parallel_equals_whole_sequence(world):
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(_worker, args=(world, os.path.join(tmp, "init"), results), nprocs=world, join=True,
                           start_method="spawn")
    errors = results.get(timeout=60)
    assert set(errors) == ({(m, c, hq, hkv) for m, c, (hq, hkv) in CASES}
                           | {("varlen " + m, c, 4, 2) for m in parallel.MODES for c in (False, True)})
    bad = {case: e for case, e in errors.items() if not e < 1e-10}
    assert not bad, bad


def test_zigzag_order():
    assert parallel._zigzag_order(2) == [0, 3, 1, 2]
    assert parallel._zigzag_order(4) == [0, 7, 1, 6, 2, 5, 3, 4]


def test_ring_blocks_cover_the_causal_mask_once():
    """Over a rank's steps, each (query, key) pair the causal mask admits is
    attended exactly once, and no other."""
    world, chunk = 4, 3
    order = parallel._zigzag_order(world)
    part = {"all": slice(None), "first": slice(0, chunk), "second": slice(chunk, None)}
    for rank in range(world):
        seen = torch.zeros(2 * chunk, 2 * world * chunk, dtype=torch.int64)
        for step in range(world):
            source = (rank - step) % world
            rows, keys, causal = parallel._ring_block(rank, world, step, True)
            key_positions = torch.cat([torch.arange(c * chunk, (c + 1) * chunk)
                                       for c in order[2 * source:2 * source + 2]])[part[keys]]
            query_rows = list(range(2 * chunk))[part[rows]]
            for local, i in enumerate(query_rows):
                for j, position in enumerate(key_positions.tolist()):
                    # The causal mask aligned bottom-right over the block's rows and keys.
                    if not causal or j <= local + len(key_positions) - len(query_rows):
                        seen[i, position] += 1
        positions = torch.cat([torch.arange(c * chunk, (c + 1) * chunk) for c in order[2 * rank:2 * rank + 2]])
        allowed = (torch.arange(2 * world * chunk)[None, :] <= positions[:, None]).long()
        assert torch.equal(seen, allowed), rank


def test_zigzag_varlen_shards_each_document(monkeypatch):
    """Two ranks' shards of documents of 4, 8 and 4 tokens, and back."""
    cu = torch.tensor([0, 4, 12, 16], dtype=torch.int32)
    x = torch.arange(16)
    expected = {0: [0, 3, 4, 5, 10, 11, 12, 15], 1: [1, 2, 6, 7, 8, 9, 13, 14]}
    shards = {}
    for rank, rows in expected.items():
        monkeypatch.setattr(parallel, "_group_size_rank", lambda group, rank=rank: (2, rank))
        shards[rank], local_cu, longest = parallel.zigzag_shard_varlen(x, cu)
        assert shards[rank].tolist() == rows
        assert local_cu.tolist() == [0, 2, 6, 8] and local_cu.dtype == torch.int32 and longest == 4
    monkeypatch.setattr(parallel, "_all_gather", lambda t, group: [shards[0], shards[1]])
    assert torch.equal(parallel.zigzag_unshard_varlen(shards[0], cu), x)
    with pytest.raises(ValueError, match="cu_seqlens: every document's length must divide into 2 x 2"):
        parallel.zigzag_shard_varlen(x[:6], torch.tensor([0, 6], dtype=torch.int32))


def test_attention_refuses_without_an_nccl_group():
    q = torch.zeros(1, 4, 2, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="mode: must be one of"):
        parallel.attention(q, q, q, mode="tree")
    if not dist.is_initialized():
        with pytest.raises(ValueError, match="group: torch.distributed is not initialised"):
            parallel.attention(q, q, q)
