"""Attention over a sequence sharded across GPUs (context parallelism), on
torch.distributed with NCCL, forward and backward.

    import flash3.parallel as cp
    q, k, v = (cp.zigzag_shard(t, group) for t in (q_full, k_full, v_full))  # [batch, 2 * chunk, heads, d]
    out = cp.attention(q, k, v, group, causal=True)                           # this rank's rows of O
    out_full = cp.zigzag_unshard(out, group)

Each of the group's W ranks holds two of the sequence's 2W chunks, chunk r
and chunk 2W - 1 - r (zig-zag), so that under a causal mask every rank has
the same work. Two modes:

  ring       K and V circulate: at step t rank r attends its queries to the
             keys of rank r - t while the next block travels (NCCL's
             point-to-point transfers on their own stream, overlapped with
             the kernel); the blocks' outputs merge through their LSEs. The
             backward circulates K and V again with float32 dK and dV
             accumulators that arrive back at their owners.
  allgather  K and V are gathered once (as Llama 3's training did with GQA,
             where they are small), each local chunk attends to the keys up
             to its end, and dK, dV are reduce-scattered back to their owners.

flash3's forward and backward kernels run each block; a block's backward
takes the merged O and LSE, so that its P is the final softmax's.
"""
import torch
import torch.distributed as dist

from . import _ops, interface

__all__ = ["attention", "zigzag_shard", "zigzag_unshard"]

MODES = ("ring", "allgather")


# ---- sharding --------------------------------------------------------------


def _group_size_rank(group):
    return dist.get_world_size(group), dist.get_rank(group)


def zigzag_shard(x, group=None, dim=1):
    """This rank's shard of a full-sequence tensor: chunks r and 2W - 1 - r of
    its 2W equal chunks along dim (the sequence's length a multiple of 2W)."""
    world, rank = _group_size_rank(group)
    if x.shape[dim] % (2 * world) != 0:
        raise ValueError(f"x: its sequence dim ({dim}, length {x.shape[dim]}) must divide into 2 x {world} "
                         "equal chunks (two a rank)")
    chunks = x.chunk(2 * world, dim=dim)
    return torch.cat([chunks[rank], chunks[2 * world - 1 - rank]], dim=dim)


def _zigzag_order(world):
    """The chunks of the ranks' shards, concatenated in rank order, as
    positions in the full sequence."""
    return [c for r in range(world) for c in (r, 2 * world - 1 - r)]


def zigzag_unshard(x, group=None, dim=1):
    """The full-sequence tensor from every rank's zig-zag shard (an all-gather)."""
    world, _ = _group_size_rank(group)
    gathered = torch.cat(_all_gather(x.contiguous(), group), dim=dim).chunk(2 * world, dim=dim)
    natural = [None] * (2 * world)
    for i, position in enumerate(_zigzag_order(world)):
        natural[position] = gathered[i]
    return torch.cat(natural, dim=dim)


# ---- communication -----------------------------------------------------------


def _all_gather(x, group):
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, x, group=group)
    return parts


def _reduce_scatter(parts, group):
    """The sum over ranks of parts[rank] (one tensor per rank)."""
    if dist.get_backend(group) == "nccl":
        out = torch.empty_like(parts[0])
        dist.reduce_scatter(out, parts, group=group)
        return out
    # Gloo (the CPU tests) has no reduce-scatter.
    total = torch.stack(parts)
    dist.all_reduce(total, group=group)
    return total[dist.get_rank(group)]


class _Ring:
    """Transfers to the next rank of the group and from the previous one."""

    def __init__(self, group):
        self.group = group
        world, rank = _group_size_rank(group)
        self.next = dist.get_global_rank(group, (rank + 1) % world) if group is not None else (rank + 1) % world
        self.prev = dist.get_global_rank(group, (rank - 1) % world) if group is not None else (rank - 1) % world

    def shift(self, tensors):
        """Starts sending `tensors` to the next rank and receiving the previous
        rank's into new buffers; returns the buffers and a wait()."""
        received = [torch.empty_like(t) for t in tensors]
        ops = [dist.P2POp(dist.isend, t, self.next, self.group) for t in tensors]
        ops += [dist.P2POp(dist.irecv, r, self.prev, self.group) for r in received]
        requests = dist.batch_isend_irecv(ops)

        def wait():
            for request in requests:
                request.wait()
            return received
        return wait


# ---- the kernels of a block --------------------------------------------------


class Flash3Kernels:
    """A block's attention on flash3's kernels: forward (out, lse [batch,
    heads, seqlen] float32) and backward (dq, dk, dv) given the merged out and
    lse."""

    def __init__(self, deterministic=False):
        self.deterministic = deterministic

    def forward(self, q, k, v, causal, scale):
        return _ops.fwd(q, k, v, None, None, None, scale, causal, self.deterministic, q.dtype)

    def backward(self, dout, q, k, v, out, lse, causal, scale):
        dq, dk, dv, _ = _ops.bwd(dout, q, k, v, out, lse.contiguous(), scale, causal, self.deterministic)
        return dq, dk, dv


def _wide(t):
    """t in the accumulators' precision: float32 at least."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


def _merge(out, lse, block_out, block_lse):
    """Running O ([batch, seqlen, heads, d], float32 at least) and LSE
    ([batch, heads, seqlen]) merged with a block's through their LSEs; None:
    no block yet."""
    if out is None:
        return _wide(block_out), _wide(block_lse)
    total = torch.logaddexp(lse, block_lse)
    weight = lambda x: torch.exp(x - total).nan_to_num(nan=0.0).transpose(1, 2).unsqueeze(-1)  # noqa: E731
    return out * weight(lse) + _wide(block_out) * weight(block_lse), total


# ---- ring ------------------------------------------------------------------------


def _ring_blocks(rank, world, step, causal, chunk):
    """Which rows of this rank's queries attend to which keys of the block it
    holds at `step` (rank - step's shard), zig-zag: (query rows, key rows,
    causal) or None for no work. Step 0 is the shard against itself (causal
    over the two chunks as concatenated); a block from a lower rank is seen
    whole by both chunks through its first chunk only; one from a higher rank
    is seen whole by the second chunk only."""
    everything = slice(None)
    if not causal:
        return everything, everything, False
    source = (rank - step) % world
    if step == 0:
        return everything, everything, True
    if source < rank:
        return everything, slice(0, chunk), False
    return slice(chunk, None), everything, False


def _ring_forward(q, k, v, group, causal, scale, kernels):
    world, rank = _group_size_rank(group)
    ring, chunk = _Ring(group), q.shape[1] // 2
    out = lse = None
    k_cur, v_cur = k, v
    for step in range(world):
        wait = ring.shift([k_cur, v_cur]) if step + 1 < world else None
        rows, keys, block_causal = _ring_blocks(rank, world, step, causal, chunk)
        block_out, block_lse = kernels.forward(q[:, rows], k_cur[:, keys], v_cur[:, keys], block_causal, scale)
        if out is None:
            out, lse = _merge(None, None, block_out, block_lse)
        else:
            out[:, rows], lse[:, :, rows] = _merge(out[:, rows], lse[:, :, rows], block_out, block_lse)
        if wait is not None:
            k_cur, v_cur = wait()
    return out.to(q.dtype), lse


def _ring_backward(dout, q, k, v, out, lse, group, causal, scale, kernels):
    world, rank = _group_size_rank(group)
    ring, chunk = _Ring(group), q.shape[1] // 2
    dq = _wide(torch.zeros_like(q))
    k_cur, v_cur = k, v
    wait_grad = None
    for step in range(world):
        wait_kv = ring.shift([k_cur, v_cur]) if step + 1 < world else None
        rows, keys, block_causal = _ring_blocks(rank, world, step, causal, chunk)
        block_dq, block_dk, block_dv = kernels.backward(dout[:, rows], q[:, rows], k_cur[:, keys], v_cur[:, keys],
                                                        out[:, rows], lse[:, :, rows], block_causal, scale)
        dq[:, rows] += block_dq
        # The accumulators of this block's K and V: the previous ranks' sums
        # (none at step 0, where the block is this rank's own), plus this one.
        dk_acc, dv_acc = wait_grad() if wait_grad is not None else (_wide(torch.zeros_like(k_cur)),
                                                                     _wide(torch.zeros_like(v_cur)))
        dk_acc[:, keys] += block_dk
        dv_acc[:, keys] += block_dv
        # On to the next rank, which holds this block at the next step; the
        # last step's sums go to the block's owner.
        wait_grad = ring.shift([dk_acc, dv_acc]) if world > 1 else (lambda acc=(dk_acc, dv_acc): acc)
        if wait_kv is not None:
            k_cur, v_cur = wait_kv()
    dk, dv = wait_grad()
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


# ---- all-gather --------------------------------------------------------------------


def _gathered(x, group, causal):
    """Every rank's shard of x along the sequence: in natural order when causal
    (the mask reads positions), else in rank order (attention over all keys
    does not depend on their order)."""
    world, _ = _group_size_rank(group)
    parts = torch.cat(_all_gather(x.contiguous(), group), dim=1)
    if not causal:
        return parts
    chunks = parts.chunk(2 * world, dim=1)
    natural = [None] * (2 * world)
    for i, position in enumerate(_zigzag_order(world)):
        natural[position] = chunks[i]
    return torch.cat(natural, dim=1)


def _local_chunks(rank, world, chunk, causal):
    """(query rows, key rows in the gathered sequence, causal) of each of this
    rank's attention calls: one over every key, or under a causal mask one a
    local chunk, over the keys up to its chunk's end (the mask aligned
    bottom-right: query i of chunk j sees keys up to j * chunk + i)."""
    if not causal:
        return [(slice(None), slice(None), False)]
    return [(slice(0, chunk), slice(0, (rank + 1) * chunk), True),
            (slice(chunk, None), slice(0, (2 * world - rank) * chunk), True)]


def _allgather_forward(q, k, v, group, causal, scale, kernels):
    world, rank = _group_size_rank(group)
    k_all, v_all = _gathered(k, group, causal), _gathered(v, group, causal)
    out = torch.empty_like(q)
    lse = q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.promote_types(q.dtype, torch.float32))
    for rows, keys, block_causal in _local_chunks(rank, world, q.shape[1] // 2, causal):
        out[:, rows], lse[:, :, rows] = kernels.forward(q[:, rows], k_all[:, keys], v_all[:, keys], block_causal,
                                                        scale)
    return out, lse


def _scattered(x, group, causal):
    """Each rank's sum of x (the gathered sequence's gradient on every rank),
    back in its zig-zag shard."""
    world, _ = _group_size_rank(group)
    chunks = x.chunk(2 * world, dim=1)
    if causal:
        order = _zigzag_order(world)
        parts = [torch.cat([chunks[order[2 * r]], chunks[order[2 * r + 1]]], dim=1).contiguous()
                 for r in range(world)]
    else:
        parts = [torch.cat(chunks[2 * r:2 * r + 2], dim=1).contiguous() for r in range(world)]
    return _reduce_scatter(parts, group)


def _allgather_backward(dout, q, k, v, out, lse, group, causal, scale, kernels):
    world, rank = _group_size_rank(group)
    k_all, v_all = _gathered(k, group, causal), _gathered(v, group, causal)
    dq = torch.empty_like(q)
    dk_all, dv_all = _wide(torch.zeros_like(k_all)), _wide(torch.zeros_like(v_all))
    for rows, keys, block_causal in _local_chunks(rank, world, q.shape[1] // 2, causal):
        dq[:, rows], block_dk, block_dv = kernels.backward(dout[:, rows], q[:, rows], k_all[:, keys],
                                                           v_all[:, keys], out[:, rows], lse[:, :, rows],
                                                           block_causal, scale)
        dk_all[:, keys] += block_dk
        dv_all[:, keys] += block_dv
    return dq, _scattered(dk_all, group, causal).to(k.dtype), _scattered(dv_all, group, causal).to(v.dtype)


_PASSES = {"ring": (_ring_forward, _ring_backward), "allgather": (_allgather_forward, _allgather_backward)}


class _ContextParallelAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, group, causal, scale, mode, kernels):
        out, lse = _PASSES[mode][0](q, k, v, group, causal, scale, kernels)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.args = group, causal, scale, mode, kernels
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        group, causal, scale, mode, kernels = ctx.args
        dq, dk, dv = _PASSES[mode][1](dout.contiguous(), q, k, v, out, lse, group, causal, scale, kernels)
        return dq, dk, dv, None, None, None, None, None


# ---- the entry point -------------------------------------------------------------


def _check_agreement(q, k, v, group, causal, scale, mode):
    """Every rank's shapes, dtype and options equal to this rank's: one small
    all-gather."""
    mine = torch.tensor([*q.shape, *k.shape, *v.shape, _ops.DTYPES.get(q.dtype, -1), int(causal),
                         MODES.index(mode), int(scale * 2 ** 20)], dtype=torch.int64, device=q.device)
    every = torch.stack(_all_gather(mine, group))
    if not bool((every == mine).all()):
        raise ValueError("group: the ranks disagree on q, k or v's shapes or dtype, causal, softmax_scale or mode "
                         f"(this rank's q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}, {q.dtype})")


def attention(q, k, v, group=None, causal=False, softmax_scale=None, mode="ring", deterministic=False,
              check=True):
    """Attention of this rank's queries over the whole sharded sequence.

    q, k, v: this rank's zig-zag shards (zigzag_shard) of [batch, seqlen,
    heads, head_dim] tensors, [batch, 2 * chunk, heads_q or heads_kv,
    head_dim], on this rank's GPU, as flash_attn_func takes them (bf16 or
    fp16, GQA/MQA); group: an NCCL process group (None: the default one).
    Returns this rank's rows of O, differentiable (dQ, dK, dV of this rank's
    shards). mode: "ring" or "allgather" (see the module's text). check:
    first compare every rank's shapes and options (one small all-gather),
    raising ValueError when they differ."""
    if mode not in MODES:
        raise ValueError(f"mode: must be one of {MODES}, got {mode!r}")
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError("group: torch.distributed is not initialised (dist.init_process_group(\"nccl\"))")
    if dist.get_backend(group) != "nccl":
        raise ValueError(f"group: flash3.parallel runs on NCCL process groups, got backend "
                         f"{dist.get_backend(group)!r}")
    interface._check_qkv(q, k, v, interface._OUT_DTYPES)
    if q.device.type != "cuda":
        raise ValueError(f"q: must be on this rank's GPU, got {q.device}")
    if q.shape[1] % 2 != 0 or k.shape[1] != q.shape[1]:
        raise ValueError(f"q: a zig-zag shard holds two equal chunks of queries, keys and values: q's and k's "
                         f"seqlen must be equal and even, got {q.shape[1]} and {k.shape[1]}")
    if not isinstance(causal, bool):
        raise ValueError(f"causal: must be a bool, got {causal!r}")
    if not isinstance(deterministic, bool):
        raise ValueError(f"deterministic: must be a bool, got {deterministic!r}")
    scale = interface._checked_scale(softmax_scale, q)
    if check:
        _check_agreement(q, k, v, group, causal, scale, mode)
    return _ContextParallelAttention.apply(q, k, v, group, causal, scale, mode, Flash3Kernels(deterministic))

