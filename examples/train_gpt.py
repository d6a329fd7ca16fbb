#!/usr/bin/env python3
"""A small GPT trained on synthetic data, with the attention function pluggable.

  python examples/train_gpt.py --steps 200               # flash3, then SDPA, from the same seed
  python examples/train_gpt.py --attention sdpa flash3   # any of them, in any order

flash3 must be importable (installed, or PYTHONPATH=python with its library
built). The data (make_dataset) are Markov chains whose topic only attention
can find, so the loss falls as far as attention learns to look. Every run
sees the same initial weights and the same batches; only the attention
function differs. Weights are float32, the forward runs under bf16 autocast,
the optimizer is AdamW. tests/python/test_train_gpt.py compares the runs.
"""
import argparse
import dataclasses
import math
import time

import torch
import torch.nn.functional as F
from torch import nn


@dataclasses.dataclass
class Config:
    vocab: int = 128
    dim: int = 512
    layers: int = 4
    heads: int = 4  # head dim 128
    seqlen: int = 1024
    batch: int = 8
    steps: int = 200
    lr: float = 2e-3
    warmup: int = 20
    topics: int = 8  # data: Markov chains, one per sequence
    marker_every: int = 32  # data: the topic's marker token recurs this often
    branching: int = 4  # data: successors per token in a chain
    seed: int = 0


# ---- attention: q, k, v and the result are [batch, seqlen, heads, head_dim], causal ----

def sdpa_attention(q, k, v):
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
    return out.transpose(1, 2)


def flash3_attention(q, k, v):
    import flash3  # imported here so that SDPA runs need no flash3 library
    return flash3.flash_attn_func(q, k, v, causal=True)


ATTENTION = {"flash3": flash3_attention, "sdpa": sdpa_attention}


# ---- data ---------------------------------------------------------------------------

def make_dataset(cfg, steps):
    """[steps, batch, seqlen + 1] tokens from a seeded generator, on the CPU.

    Each sequence belongs to one of cfg.topics topics and repeats its marker
    token (one of the vocabulary's last cfg.topics ids) every
    cfg.marker_every positions, from position 0. Between markers it follows
    the topic's Markov chain over the other tokens: from token x to
    perm[topic, j][x] with probability weight[topic, j], j < cfg.branching.
    Each chain visits all tokens equally often (its rows are mixtures of
    permutations with the same weights), so neither the previous token nor
    the mix of tokens seen tells the topic: attention to a marker does. With
    it the loss falls to the weights' entropy (under ln(branching)); without
    it, to the entropy of the topics' mixture (at most ln(topics * branching)).
    Markers are many and near, so attention finds them gradually: the loss
    falls smoothly, without the plateau of tasks that need a chain of heads.
    """
    gen = torch.Generator().manual_seed(cfg.seed)
    states, successors, weights = chains(cfg, gen)
    cumulative = weights.cumsum(dim=-1)
    n = steps * cfg.batch
    topic = torch.randint(cfg.topics, (n,), generator=gen)
    is_marker = torch.arange(cfg.seqlen + 1) % cfg.marker_every == 0
    chain = torch.empty(n, int((~is_marker).sum()), dtype=torch.long)
    chain[:, 0] = torch.randint(states, (n,), generator=gen)
    draws = torch.rand(chain.shape, generator=gen)
    for t in range(1, chain.shape[1]):
        # The first successor whose cumulative probability reaches the draw (clamped: rounding).
        pick = (cumulative[topic] < draws[:, t:t + 1]).sum(dim=1).clamp(max=cfg.branching - 1)
        chain[:, t] = successors[topic, chain[:, t - 1], pick]
    tokens = torch.empty(n, cfg.seqlen + 1, dtype=torch.long)
    tokens[:, is_marker] = (states + topic)[:, None]
    tokens[:, ~is_marker] = chain
    return tokens.view(steps, cfg.batch, cfg.seqlen + 1)


def chains(cfg, gen):
    """The topics' chains: (number of chain tokens, successors [topic, x, j], weights [topic, j])."""
    states = cfg.vocab - cfg.topics
    perms = torch.stack([torch.randperm(states, generator=gen) for _ in range(cfg.topics * cfg.branching)])
    weights = torch.softmax(torch.randn(cfg.topics, cfg.branching, generator=gen), dim=-1)
    return states, perms.view(cfg.topics, cfg.branching, states).transpose(1, 2), weights


def entropies(cfg):
    """The loss floors of make_dataset's chain tokens in nats: (knowing the topic, knowing only the previous token)."""
    states, successors, weights = chains(cfg, torch.Generator().manual_seed(cfg.seed))
    known = -(weights * weights.log()).sum(dim=1).mean()
    mix = torch.zeros(states, states)
    for t in range(cfg.topics):
        for j in range(cfg.branching):
            mix[torch.arange(states), successors[t, :, j]] += weights[t, j] / cfg.topics
    unknown = -(mix * mix.clamp_min(1e-30).log()).sum(dim=1).mean()
    return known.item(), unknown.item()


# ---- model ----------------------------------------------------------------------------

def rotary_tables(seqlen, head_dim, device):
    """cos and sin of rotary position embeddings, [seqlen, 1, head_dim / 2]: relative offsets come easily."""
    inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(seqlen, device=device, dtype=torch.float32), inv_freq)
    return angles.cos()[:, None, :], angles.sin()[:, None, :]


def rotate(x, cos, sin):
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).to(x.dtype)


class Block(nn.Module):
    def __init__(self, cfg, attention):
        super().__init__()
        self.heads = cfg.heads
        self.attention = attention
        self.norm1 = nn.LayerNorm(cfg.dim)
        self.qkv = nn.Linear(cfg.dim, 3 * cfg.dim, bias=False)
        self.proj = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.norm2 = nn.LayerNorm(cfg.dim)
        self.mlp = nn.Sequential(nn.Linear(cfg.dim, 4 * cfg.dim, bias=False), nn.GELU(),
                                 nn.Linear(4 * cfg.dim, cfg.dim, bias=False))

    def forward(self, x, cos, sin):
        b, s, dim = x.shape
        # q, k, v stay strided views of the projection: the [b, s, h, d] layout callers pass.
        q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, dim // self.heads).unbind(dim=2)
        x = x + self.proj(self.attention(rotate(q, cos, sin), rotate(k, cos, sin), v).reshape(b, s, dim))
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    def __init__(self, cfg, attention):
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab, cfg.dim)
        self.blocks = nn.ModuleList(Block(cfg, attention) for _ in range(cfg.layers))
        self.norm = nn.LayerNorm(cfg.dim)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                # GPT-2's init: residual outputs scaled down so the stream's variance stays put with depth.
                deep = name.endswith("proj.weight") or name.endswith("mlp.2.weight")
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * cfg.layers) if deep else 0.02)
        self.rotary = rotary_tables(cfg.seqlen, cfg.dim // cfg.heads, "cpu")

    def forward(self, tokens):
        cos, sin = (t.to(tokens.device) for t in self.rotary)
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, cos, sin)
        return self.norm(x) @ self.embed.weight.t()  # tied output embedding


# ---- training ---------------------------------------------------------------------------

def train(attention, cfg, data, device, log=None):
    """Trains from cfg.seed on data ([steps, batch, seqlen + 1]); returns the loss per step and tokens/s.

    tokens/s counts the steps after the first 10 (allocator and kernel warm-up).
    """
    torch.manual_seed(cfg.seed)
    model = GPT(cfg, attention).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.1)
    schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: lr_factor(cfg, step))
    data = data.to(device)
    warm_steps = min(10, cfg.steps - 1)
    losses = []
    for step in range(cfg.steps):
        if step == warm_steps:
            synchronize(device)
            start = time.perf_counter()
        batch = data[step]
        with torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16):
            logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        schedule.step()
        losses.append(loss.detach())
        if log and (step % 20 == 0 or step == cfg.steps - 1):
            log(f"step {step:4d} loss {loss.item():.4f}")
    synchronize(device)
    elapsed = time.perf_counter() - start
    return {"losses": [x.item() for x in losses],
            "tokens_per_s": (cfg.steps - warm_steps) * cfg.batch * cfg.seqlen / elapsed}


def lr_factor(cfg, step):
    """Linear warm-up over cfg.warmup steps, then a cosine from 1 that would reach 0.1 at step cfg.steps."""
    if step < cfg.warmup:
        return (step + 1) / cfg.warmup
    progress = min(1.0, (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup))
    return 0.1 + 0.45 * (1 + math.cos(math.pi * progress))


def synchronize(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


# ---- comparing two runs -------------------------------------------------------------------

def smooth(losses, window):
    """Trailing moving average: step i averages steps max(0, i - window + 1) .. i."""
    out, total = [], 0.0
    for i, x in enumerate(losses):
        total += x
        if i >= window:
            total -= losses[i - window]
        out.append(total / min(i + 1, window))
    return out


def compare_runs(a, b, last=50, window=10):
    """Statistics of two loss curves of equal length: smoothed over `window` steps, the last `last` steps."""
    sa, sb = smooth(a, window), smooth(b, window)
    tail = list(zip(sa[-last:], sb[-last:]))
    return {"initial": (a[0], b[0]),
            "final": (sa[-1], sb[-1]),
            "mean_abs_diff": sum(abs(x - y) for x, y in tail) / len(tail),
            "max_abs_diff": max(abs(x - y) for x, y in tail)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=Config.steps)
    parser.add_argument("--attention", nargs="+", choices=sorted(ATTENTION), default=["flash3", "sdpa"],
                        help="attention functions, each trained from the same seed (default: flash3 sdpa)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--seed", type=int, default=Config.seed)
    args = parser.parse_args(argv)
    cfg = Config(steps=args.steps, seed=args.seed)
    data = make_dataset(cfg, cfg.steps)
    runs = {}
    for name in args.attention:
        print(f"== {name}")
        runs[name] = train(ATTENTION[name], cfg, data, args.device, log=print)
        print(f"{name}: {runs[name]['tokens_per_s']:,.0f} tokens/s")
    if len(runs) == 2:
        (name_a, a), (name_b, b) = runs.items()
        stats = compare_runs(a["losses"], b["losses"])
        print(f"{name_a} vs {name_b}: initial loss {stats['initial'][0]:.4f} / {stats['initial'][1]:.4f}, "
              f"final (smoothed) {stats['final'][0]:.4f} / {stats['final'][1]:.4f}, last 50 steps' smoothed "
              f"difference mean {stats['mean_abs_diff']:.4f}, max {stats['max_abs_diff']:.4f}")


if __name__ == "__main__":
    main()
