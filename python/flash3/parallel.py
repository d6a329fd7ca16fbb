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

Packed documents (attention_varlen, zigzag_shard_varlen) shard each document
on its own and take either mode. flash3's forward and backward kernels run
each block; a block's backward takes the merged O and LSE, so that its P is
the final softmax's. docs/design.md says more.
"""
import torch
import torch.distributed as dist

from . import _ops, interface

__all__ = ["attention", "attention_varlen", "zigzag_shard", "zigzag_unshard", "zigzag_shard_varlen",
           "zigzag_unshard_varlen"]

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


def _in_positions(x, group, dim):
    """Every rank's zig-zag shard of x gathered, in the sequence's order."""
    world, _ = _group_size_rank(group)
    gathered = torch.cat(_all_gather(x.contiguous(), group), dim=dim).chunk(2 * world, dim=dim)
    natural = [None] * (2 * world)
    for i, position in enumerate(_zigzag_order(world)):
        natural[position] = gathered[i]
    return torch.cat(natural, dim=dim)


def zigzag_unshard(x, group=None, dim=1):
    """The full-sequence tensor from every rank's zig-zag shard (an all-gather)."""
    return _in_positions(x, group, dim)


def _document_bounds(cu_seqlens):
    """(start, length) of each document, read on the host: the sharding
    helpers run where a batch is built, before the GPU work."""
    bounds = [int(x) for x in cu_seqlens.tolist()]
    return [(a, b - a) for a, b in zip(bounds[:-1], bounds[1:])]


def zigzag_shard_varlen(x, cu_seqlens, group=None):
    """This rank's shard of packed documents x [tokens, ...] (cu_seqlens
    int32 [documents + 1] of the whole documents): each document's chunks r
    and 2W - 1 - r of its 2W equal chunks, one document after another.
    Returns (shard, the shard's cu_seqlens on x's device, its max_seqlen),
    attention_varlen's arguments."""
    world, rank = _group_size_rank(group)
    documents = _document_bounds(cu_seqlens)
    uneven = [n for _, n in documents if n % (2 * world)]
    if uneven:
        raise ValueError(f"cu_seqlens: every document's length must divide into 2 x {world} equal chunks (pad "
                         f"them); these do not: {uneven[:4]}")
    pieces, local = [], []
    for start, n in documents:
        c = n // (2 * world)
        mirror = 2 * world - 1 - rank
        pieces += [x[start + rank * c:start + (rank + 1) * c], x[start + mirror * c:start + (mirror + 1) * c]]
        local.append(2 * c)
    bounds = torch.tensor([0] + local, dtype=torch.int64).cumsum(0).to(device=x.device, dtype=torch.int32)
    return (torch.cat(pieces) if pieces else x[:0]), bounds, max(local, default=0)


def zigzag_unshard_varlen(x, cu_seqlens, group=None):
    """The packed documents from every rank's zigzag_shard_varlen shard (an
    all-gather); cu_seqlens those of the whole documents."""
    world, _ = _group_size_rank(group)
    parts = _all_gather(x.contiguous(), group)
    pieces, local_start = [], 0
    for _, n in _document_bounds(cu_seqlens):
        c = n // (2 * world)
        chunks = [None] * (2 * world)
        for r, part in enumerate(parts):
            chunks[r] = part[local_start:local_start + c]
            chunks[2 * world - 1 - r] = part[local_start + c:local_start + 2 * c]
        pieces += chunks
        local_start += 2 * c
    return torch.cat(pieces) if pieces else x[:0]


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

    def forward_varlen(self, q, k, v, cu_q, cu_k, max_q, max_k, seqused_k, causal, scale):
        """Packed sequences: (out [tokens, heads, d], lse [heads, tokens])."""
        return _ops.varlen_fwd(q, k, v, cu_q, cu_k, None, seqused_k, max_q, max_k, scale, causal, self.deterministic)

    def backward_varlen(self, dout, q, k, v, out, lse, cu_q, cu_k, max_q, max_k, seqused_k, causal, scale):
        dq, dk, dv, _ = _ops.varlen_bwd(dout, q, k, v, out, lse.contiguous(), cu_q, cu_k, None, seqused_k, max_q,
                                        max_k, scale, causal, self.deterministic)
        return dq, dk, dv


def _wide(t):
    """t in the accumulators' precision: float32 at least."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


def _merge(out, lse, block_out, block_lse, lse_to_rows):
    """Running O (float32 at least) and LSE merged with a block's through
    their LSEs; None: no block yet. lse_to_rows views an LSE in O's row
    order, with a trailing dim for the head dim."""
    if out is None:
        return _wide(block_out), _wide(block_lse)
    total = torch.logaddexp(lse, block_lse)
    weight = lambda x: lse_to_rows(torch.exp(x - total).nan_to_num(nan=0.0))  # noqa: E731
    return out * weight(lse) + _wide(block_out) * weight(block_lse), total


# ---- ring ------------------------------------------------------------------------
#
# The ring's steps are the same for fixed-length and packed shards; a layout
# says which rows of this rank's queries attend to which keys of the block it
# holds at a step (rank - step's shard), and runs the kernels on them. Under
# a causal mask, zig-zag: step 0 is the shard against itself (causal over the
# two chunks as concatenated); a block from a lower rank is seen whole by both
# chunks through its first chunk only; one from a higher rank is seen whole by
# the second chunk only. Without one, every query sees every key.


def _ring_block(rank, world, step, causal):
    """(query rows, key rows, causal), each "all", "first" or "second" (chunk)."""
    if not causal:
        return "all", "all", False
    source = (rank - step) % world
    if step == 0:
        return "all", "all", True
    if source < rank:
        return "all", "first", False
    return "second", "all", False


class _Dense:
    """Shards [batch, 2 * chunk, heads, d], LSE [batch, heads, seqlen]."""

    def __init__(self, q, kernels, scale):
        chunk = q.shape[1] // 2
        self.slices = {"all": slice(None), "first": slice(0, chunk), "second": slice(chunk, None)}
        self.kernels, self.scale = kernels, scale

    def rows(self, t, part):
        return t[:, self.slices[part]]

    def lse_rows(self, lse, part):
        return lse[:, :, self.slices[part]]

    def set_rows(self, t, lse, part, value, value_lse):
        t[:, self.slices[part]], lse[:, :, self.slices[part]] = value, value_lse

    @staticmethod
    def lse_to_rows(lse):
        return lse.transpose(1, 2).unsqueeze(-1)

    def forward(self, q, k, v, rows, keys, causal):
        keys = self.slices[keys]
        return self.kernels.forward(q, k[:, keys], v[:, keys], causal, self.scale)

    def backward(self, dout, q, k, v, out, lse, rows, keys, causal):
        """dq, and dk, dv of the `keys` rows."""
        part = self.slices[keys]
        return self.kernels.backward(dout, q, k[:, part], v[:, part], out, lse, causal, self.scale)

    def add_rows(self, acc, part, grad):
        acc[:, self.slices[part]] += grad

    def add_keys(self, acc, part, grad):
        acc[:, self.slices[part]] += grad

    # All-gather: the gathered sequence in positions' order, [batch, 2W chunks, ...].

    def new_lse(self, q):
        return q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.promote_types(q.dtype, torch.float32))

    @staticmethod
    def gather(x, group):
        return _in_positions(x, group, 1)

    def scatter(self, x, group):
        """Each rank's sum of x (the gathered sequence's gradient on every
        rank), back in its zig-zag shard."""
        world, _ = _group_size_rank(group)
        chunks, order = x.chunk(2 * world, dim=1), _zigzag_order(world)
        parts = [torch.cat([chunks[order[2 * r]], chunks[order[2 * r + 1]]], dim=1).contiguous()
                 for r in range(world)]
        return _reduce_scatter(parts, group)

    def local_calls(self, rank, world, causal):
        """(query rows, gathered key rows, causal) of each of this rank's calls."""
        if not causal:
            return [("all", slice(None), False)]
        chunk = self.slices["first"].stop
        return [("first", slice(0, (rank + 1) * chunk), True), ("second", slice(0, (2 * world - rank) * chunk), True)]

    def forward_gathered(self, q, k_all, v_all, rows, keys, causal):
        return self.kernels.forward(q, k_all[:, keys], v_all[:, keys], causal, self.scale)

    def backward_gathered(self, dout, q, k_all, v_all, out, lse, rows, keys, causal):
        return self.kernels.backward(dout, q, k_all[:, keys], v_all[:, keys], out, lse, causal, self.scale)

    @staticmethod
    def add_gathered_keys(acc, keys, grad):
        acc[:, keys] += grad


class _Packed:
    """Shards [tokens, heads, d] of packed documents, each document sharded
    zig-zag on its own (its local tokens its chunk r, then its chunk
    2W - 1 - r), cu_seqlens the local documents' bounds; LSE [heads, tokens].
    A document's first keys are reached through seqused_k (no copy), a chunk's
    query rows through a gather whose index is built on the device (its size,
    half the shard's tokens, is known on the host: no synchronisation)."""

    def __init__(self, q, cu_seqlens, max_seqlen, kernels, scale, world):
        tokens, device = q.shape[0], q.device
        half = (cu_seqlens[1:] - cu_seqlens[:-1]) // 2
        self.cu, self.max, self.half, self.world = cu_seqlens, max_seqlen, half.to(torch.int32), world
        self.cu_half = torch.cat([half.new_zeros(1), half.cumsum(0)]).to(torch.int32)
        # Each shard token's document, place in it and chunk (first or second).
        document = torch.repeat_interleave(torch.arange(half.shape[0], device=device), 2 * half, output_size=tokens)
        place = torch.arange(tokens, device=device) - cu_seqlens[:-1].long()[document]
        chunk_size = half.long()[document]
        second = place >= chunk_size
        self.index = {"first": torch.nonzero(~second).flatten(), "second": torch.nonzero(second).flatten()}
        # All-gather: shard token t of rank r goes to this position of the
        # gathered documents (each whole, in turn: the shards' bounds times W).
        within = place - second.long() * chunk_size
        starts = world * cu_seqlens[:-1].long()[document]
        self.gathered = torch.cat([starts + torch.where(second, 2 * world - 1 - r, r) * chunk_size + within
                                   for r in range(world)])
        self.kernels, self.scale = kernels, scale

    def rows(self, t, part):
        return t if part == "all" else t.index_select(0, self.index[part])

    def lse_rows(self, lse, part):
        return lse if part == "all" else lse.index_select(1, self.index[part])

    def set_rows(self, t, lse, part, value, value_lse):
        if part == "all":
            t.copy_(value)
            lse.copy_(value_lse)
        else:
            t.index_copy_(0, self.index[part], value.to(t.dtype))
            lse.index_copy_(1, self.index[part], value_lse.to(lse.dtype))

    @staticmethod
    def lse_to_rows(lse):
        return lse.transpose(0, 1).unsqueeze(-1)

    def _bounds(self, rows, keys):
        cu_q, max_q = (self.cu, self.max) if rows == "all" else (self.cu_half, self.max // 2)
        return cu_q, self.cu, max_q, self.max, self.half if keys == "first" else None

    def forward(self, q, k, v, rows, keys, causal):
        return self.kernels.forward_varlen(q, k, v, *self._bounds(rows, keys), causal, self.scale)

    def backward(self, dout, q, k, v, out, lse, rows, keys, causal):
        """dq, and dk, dv of the whole block (zero past seqused_k)."""
        return self.kernels.backward_varlen(dout, q, k, v, out, lse, *self._bounds(rows, keys), causal, self.scale)

    def add_rows(self, acc, part, grad):
        if part == "all":
            acc += grad
        else:
            acc.index_add_(0, self.index[part], grad.to(acc.dtype))

    @staticmethod
    def add_keys(acc, part, grad):
        acc += grad

    # All-gather: the gathered documents, each whole, [W x tokens, ...].

    def new_lse(self, q):
        return q.new_empty((q.shape[1], q.shape[0]), dtype=torch.promote_types(q.dtype, torch.float32))

    def gather(self, x, group):
        parts = torch.cat(_all_gather(x.contiguous(), group))
        return torch.empty_like(parts).index_copy_(0, self.gathered, parts)

    def scatter(self, x, group):
        return _reduce_scatter(list(x.index_select(0, self.gathered).chunk(self.world)), group)

    def local_calls(self, rank, world, causal):
        """(query rows, gathered keys: each document's first `keys` chunks,
        None all, causal) of each of this rank's calls."""
        if not causal:
            return [("all", None, False)]
        return [("first", rank + 1, True), ("second", 2 * world - rank, True)]

    def _gathered_bounds(self, rows, keys):
        cu_q, max_q = (self.cu, self.max) if rows == "all" else (self.cu_half, self.max // 2)
        used = None if keys is None else (keys * self.half).to(torch.int32)
        return cu_q, self.world * self.cu, max_q, self.world * self.max, used

    def forward_gathered(self, q, k_all, v_all, rows, keys, causal):
        bounds = self._gathered_bounds(rows, keys)
        return self.kernels.forward_varlen(q, k_all, v_all, *bounds, causal, self.scale)

    def backward_gathered(self, dout, q, k_all, v_all, out, lse, rows, keys, causal):
        return self.kernels.backward_varlen(dout, q, k_all, v_all, out, lse, *self._gathered_bounds(rows, keys),
                                            causal, self.scale)

    @staticmethod
    def add_gathered_keys(acc, keys, grad):
        acc += grad


def _ring_forward(q, k, v, group, causal, layout):
    world, rank = _group_size_rank(group)
    ring = _Ring(group)
    out = lse = None
    k_cur, v_cur = k, v
    for step in range(world):
        wait = ring.shift([k_cur, v_cur]) if step + 1 < world else None
        rows, keys, block_causal = _ring_block(rank, world, step, causal)
        block_out, block_lse = layout.forward(layout.rows(q, rows), k_cur, v_cur, rows, keys, block_causal)
        if out is None:  # step 0: every row
            out, lse = _merge(None, None, block_out, block_lse, layout.lse_to_rows)
        else:
            merged = _merge(layout.rows(out, rows), layout.lse_rows(lse, rows), block_out, block_lse,
                            layout.lse_to_rows)
            layout.set_rows(out, lse, rows, *merged)
        if wait is not None:
            k_cur, v_cur = wait()
    return out.to(q.dtype), lse


def _ring_backward(dout, q, k, v, out, lse, group, causal, layout):
    world, rank = _group_size_rank(group)
    ring = _Ring(group)
    dq = _wide(torch.zeros_like(q))
    k_cur, v_cur = k, v
    wait_grad = None
    for step in range(world):
        wait_kv = ring.shift([k_cur, v_cur]) if step + 1 < world else None
        rows, keys, block_causal = _ring_block(rank, world, step, causal)
        block_dq, block_dk, block_dv = layout.backward(
            layout.rows(dout, rows), layout.rows(q, rows), k_cur, v_cur, layout.rows(out, rows),
            layout.lse_rows(lse, rows), rows, keys, block_causal)
        layout.add_rows(dq, rows, block_dq)
        # The accumulators of this block's K and V: the previous ranks' sums
        # (none at step 0, where the block is this rank's own), plus this one.
        dk_acc, dv_acc = wait_grad() if wait_grad is not None else (_wide(torch.zeros_like(k_cur)),
                                                                     _wide(torch.zeros_like(v_cur)))
        layout.add_keys(dk_acc, keys, block_dk)
        layout.add_keys(dv_acc, keys, block_dv)
        # On to the next rank, which holds this block at the next step; the
        # last step's sums go to the block's owner.
        wait_grad = ring.shift([dk_acc, dv_acc]) if world > 1 else (lambda acc=(dk_acc, dv_acc): acc)
        if wait_kv is not None:
            k_cur, v_cur = wait_kv()
    dk, dv = wait_grad()
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


# ---- all-gather --------------------------------------------------------------------
#
# K and V gathered once into positions' order; each of this rank's local
# chunks attends to the keys up to its chunk's end (under a causal mask
# aligned bottom-right, query i of chunk j sees keys up to j * chunk + i), or
# every query to every key; dK and dV of the gathered sequence are
# reduce-scattered back to the shards. The layouts' gather, scatter and calls.


def _allgather_forward(q, k, v, group, causal, layout):
    world, rank = _group_size_rank(group)
    k_all, v_all = layout.gather(k, group), layout.gather(v, group)
    out, lse = torch.empty_like(q), layout.new_lse(q)
    for rows, keys, block_causal in layout.local_calls(rank, world, causal):
        layout.set_rows(out, lse, rows, *layout.forward_gathered(layout.rows(q, rows), k_all, v_all, rows, keys,
                                                                 block_causal))
    return out, lse


def _allgather_backward(dout, q, k, v, out, lse, group, causal, layout):
    world, rank = _group_size_rank(group)
    k_all, v_all = layout.gather(k, group), layout.gather(v, group)
    dq = _wide(torch.zeros_like(q))
    dk_all, dv_all = _wide(torch.zeros_like(k_all)), _wide(torch.zeros_like(v_all))
    for rows, keys, block_causal in layout.local_calls(rank, world, causal):
        block_dq, block_dk, block_dv = layout.backward_gathered(
            layout.rows(dout, rows), layout.rows(q, rows), k_all, v_all, layout.rows(out, rows),
            layout.lse_rows(lse, rows), rows, keys, block_causal)
        layout.add_rows(dq, rows, block_dq)
        layout.add_gathered_keys(dk_all, keys, block_dk)
        layout.add_gathered_keys(dv_all, keys, block_dv)
    return (dq.to(q.dtype), layout.scatter(dk_all, group).to(k.dtype), layout.scatter(dv_all, group).to(v.dtype))


class _ContextParallelAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, group, causal, scale, mode, kernels):
        passes = _ring_forward if mode == "ring" else _allgather_forward
        out, lse = passes(q, k, v, group, causal, _Dense(q, kernels, scale))
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.args = group, causal, scale, mode, kernels
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        group, causal, scale, mode, kernels = ctx.args
        passes = _ring_backward if mode == "ring" else _allgather_backward
        grads = passes(dout.contiguous(), q, k, v, out, lse, group, causal, _Dense(q, kernels, scale))
        return (*grads, None, None, None, None, None)


class _ContextParallelVarlen(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, cu_seqlens, max_seqlen, group, causal, scale, mode, kernels):
        layout = _Packed(q, cu_seqlens, max_seqlen, kernels, scale, dist.get_world_size(group))
        out, lse = (_ring_forward if mode == "ring" else _allgather_forward)(q, k, v, group, causal, layout)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.args, ctx.layout = (group, causal, mode), layout
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        group, causal, mode = ctx.args
        passes = _ring_backward if mode == "ring" else _allgather_backward
        grads = passes(dout.contiguous(), q, k, v, out, lse, group, causal, ctx.layout)
        return (*grads, None, None, None, None, None, None, None)


# ---- the entry point -------------------------------------------------------------


def _check_agreement(q, k, v, group, causal, scale, mode, documents=0):
    """Every rank's shapes, dtype and options equal to this rank's: one small
    all-gather."""
    mine = torch.tensor([q.dim(), *q.shape, *k.shape, *v.shape, _ops.DTYPES.get(q.dtype, -1), int(causal),
                         MODES.index(mode), int(scale * 2 ** 20), documents], dtype=torch.int64, device=q.device)
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
    _check_group(group)
    interface._check_qkv(q, k, v, interface._OUT_DTYPES)
    if q.shape[1] % 2 != 0 or k.shape[1] != q.shape[1]:
        raise ValueError(f"q: a zig-zag shard holds two equal chunks of queries, keys and values: q's and k's "
                         f"seqlen must be equal and even, got {q.shape[1]} and {k.shape[1]}")
    scale = _checked_options(q, causal, deterministic, softmax_scale)
    if check:
        _check_agreement(q, k, v, group, causal, scale, mode)
    return _ContextParallelAttention.apply(q, k, v, group, causal, scale, mode, Flash3Kernels(deterministic))


def attention_varlen(q, k, v, cu_seqlens, max_seqlen, group=None, causal=False, softmax_scale=None, mode="ring",
                     deterministic=False, check=True):
    """attention() over packed documents, each document sharded
    zig-zag on its own (zigzag_shard_varlen): q, k, v [tokens, heads,
    head_dim] this rank's packed shards, cu_seqlens (int32 [documents + 1],
    on the GPU) and max_seqlen this rank's (each local document is its chunk
    r, then its chunk 2W - 1 - r, of equal lengths). Every rank's documents
    have the same local lengths; a document's keys are only its own. The
    contents of cu_seqlens are trusted, as flash_attn_varlen_func's."""
    if mode not in MODES:
        raise ValueError(f"mode: must be one of {MODES}, got {mode!r}")
    _check_group(group)
    interface._check_qkv(q, k, v, interface._OUT_DTYPES, dims=3)
    if k.shape[0] != q.shape[0] or q.shape[0] % 2 != 0:
        raise ValueError(f"q: a packed zig-zag shard holds two equal chunks of each document: q's and k's tokens "
                         f"must be equal and even, got {q.shape[0]} and {k.shape[0]}")
    cu_seqlens = interface._checked_index_tensor("cu_seqlens", cu_seqlens, None, q.device)
    if isinstance(max_seqlen, bool) or not isinstance(max_seqlen, int) or max_seqlen < 0 or max_seqlen % 2:
        raise ValueError(f"max_seqlen: must be an even int >= 0 (a local document is two equal chunks), "
                         f"got {max_seqlen!r}")
    scale = _checked_options(q, causal, deterministic, softmax_scale)
    if check:
        _check_agreement(q, k, v, group, causal, scale, mode, cu_seqlens.shape[0])
    return _ContextParallelVarlen.apply(q, k, v, cu_seqlens, max_seqlen, group, causal, scale, mode,
                                        Flash3Kernels(deterministic))


def _check_group(group):
    if not dist.is_available() or not dist.is_initialized():
        raise ValueError("group: torch.distributed is not initialised (dist.init_process_group(\"nccl\"))")
    if dist.get_backend(group) != "nccl":
        raise ValueError(f"group: flash3.parallel runs on NCCL process groups, got backend "
                         f"{dist.get_backend(group)!r}")


def _checked_options(q, causal, deterministic, softmax_scale):
    if q.device.type != "cuda":
        raise ValueError(f"q: must be on this rank's GPU, got {q.device}")
    if not isinstance(causal, bool):
        raise ValueError(f"causal: must be a bool, got {causal!r}")
    if not isinstance(deterministic, bool):
        raise ValueError(f"deterministic: must be a bool, got {deterministic!r}")
    return interface._checked_scale(softmax_scale, q)

