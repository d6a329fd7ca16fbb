#!/usr/bin/env python3
"""Generation with a small decoder on flash3's paged KV cache, beside the same loop on SDPA.

  python examples/generate.py                        # 256 new tokens for 32 prompts of 1024, both loops
  python examples/generate.py --batch 64 --tokens 128 --attention flash3

flash3 must be importable (installed, or PYTHONPATH=python with its library
built). The model is a GQA decoder with random bf16 weights (rotary
positions, 32 query heads and 8 KV heads of head dim 128 by default);
decoding is greedy. Both loops run the same weights on the same prompts:

  flash3   a paged cache (pages of --page-size tokens, in random order, a page
           table per sequence); each layer's call to flash_attn_with_kvcache
           appends the new keys and values in place, rotates them and the
           queries (rotary_cos / rotary_sin), and attends, the prompt in one
           causal call (prefill), then a token a step (split-KV and packed GQA
           chosen by flash3)
  sdpa     a contiguous cache [batch, heads_kv, capacity, head_dim] written by
           indexing, rotary in PyTorch, F.scaled_dot_product_attention on the
           filled part (enable_gqa; causal in the prefill), the backend
           PyTorch picks
  sdpa_flash  the same with SDPA held to its FlashAttention-2 backend: the
           backend PyTorch picks may build a plan per new key count (cuDNN's
           are built per shape), which a loop whose cache grows every step
           pays at every step

It reports tokens per second of the decoding steps (the prefill timed apart)
and how often the two loops chose the same token: random weights make some
logits near ties, which bf16 rounding may break either way, and a different
token changes everything after it, so agreement is counted up to each
sequence's first difference.
"""
import argparse
import contextlib
import dataclasses
import functools
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel


@dataclasses.dataclass
class Config:
    vocab: int = 4096
    dim: int = 2048
    layers: int = 4
    heads_q: int = 32
    heads_kv: int = 8
    head_dim: int = 128
    batch: int = 32
    prompt: int = 1024
    tokens: int = 256
    page_size: int = 64
    seed: int = 0


class Decoder(nn.Module):
    """Pre-norm GQA decoder blocks with rotary positions; the attention is a callable per layer."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        q_dim, kv_dim = cfg.heads_q * cfg.head_dim, cfg.heads_kv * cfg.head_dim
        self.embed = nn.Embedding(cfg.vocab, cfg.dim)
        self.blocks = nn.ModuleList(nn.ModuleDict({
            "norm1": nn.RMSNorm(cfg.dim), "qkv": nn.Linear(cfg.dim, q_dim + 2 * kv_dim, bias=False),
            "out": nn.Linear(q_dim, cfg.dim, bias=False), "norm2": nn.RMSNorm(cfg.dim),
            "up": nn.Linear(cfg.dim, 4 * cfg.dim, bias=False), "down": nn.Linear(4 * cfg.dim, cfg.dim, bias=False),
        }) for _ in range(cfg.layers))
        self.norm = nn.RMSNorm(cfg.dim)
        self.head = nn.Linear(cfg.dim, cfg.vocab, bias=False)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=p.shape[1] ** -0.5)

    def forward(self, tokens, attend):
        """Logits of the last position; attend(layer, q, k, v) gets [batch, n, heads, head_dim] q, k, v of
        the new positions (k and v not rotated) and returns the attention's output for them."""
        cfg = self.cfg
        x = self.embed(tokens)
        b, n = tokens.shape
        for layer, blk in enumerate(self.blocks):
            q, k, v = blk["qkv"](blk["norm1"](x)).split(
                [cfg.heads_q * cfg.head_dim, cfg.heads_kv * cfg.head_dim, cfg.heads_kv * cfg.head_dim], dim=-1)
            out = attend(layer, q.view(b, n, cfg.heads_q, cfg.head_dim), k.view(b, n, cfg.heads_kv, cfg.head_dim),
                         v.view(b, n, cfg.heads_kv, cfg.head_dim))
            x = x + blk["out"](out.reshape(b, n, -1))
            x = x + blk["down"](F.gelu(blk["up"](blk["norm2"](x))))
        return self.head(self.norm(x[:, -1]))


def rotary_tables(cfg, capacity, device):
    """cos and sin [capacity, head_dim / 2] (GPT-NeoX: dims i and i + head_dim / 2 rotate together)."""
    half = cfg.head_dim // 2
    angle = torch.arange(capacity, device=device, dtype=torch.float32)[:, None] * 10000.0 ** (
        -torch.arange(half, device=device, dtype=torch.float32) / half)
    return angle.cos().to(torch.bfloat16), angle.sin().to(torch.bfloat16)


def rotate(x, cos, sin):
    """x [b, n, h, d] rotated by the tables' rows for its positions (cos, sin [n, d / 2]), in float32."""
    half = cos.shape[-1]
    c, s = cos[None, :, None].float(), sin[None, :, None].float()
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    return torch.cat([x1 * c - x2 * s, x1 * s + x2 * c], -1).to(x.dtype)


class Flash3Cache:
    """A paged cache per layer, appended to and attended by flash_attn_with_kvcache."""

    def __init__(self, cfg, capacity, device):
        import flash3
        self.flash3 = flash3
        pages_per_seq = -(-capacity // cfg.page_size)
        pages = cfg.batch * pages_per_seq
        gen = torch.Generator().manual_seed(cfg.seed + 1)
        self.table = torch.randperm(pages, generator=gen).view(cfg.batch, pages_per_seq).to(device, torch.int32)
        shape = (pages, cfg.page_size, cfg.heads_kv, cfg.head_dim)
        self.k = [torch.zeros(shape, device=device, dtype=torch.bfloat16) for _ in range(cfg.layers)]
        self.v = [torch.zeros(shape, device=device, dtype=torch.bfloat16) for _ in range(cfg.layers)]
        self.cos, self.sin = rotary_tables(cfg, pages_per_seq * cfg.page_size, device)
        self.lens = torch.zeros(cfg.batch, dtype=torch.int32, device=device)

    def attend(self, layer, q, k, v):
        return self.flash3.flash_attn_with_kvcache(q, self.k[layer], self.v[layer], k=k, v=v, rotary_cos=self.cos,
                                                   rotary_sin=self.sin, cache_seqlens=self.lens,
                                                   page_table=self.table, causal=True, rotary_interleaved=False)

    def advance(self, n):
        self.lens += n


class SdpaCache:
    """A contiguous cache per layer in SDPA's layout; rotary in PyTorch; SDPA
    held to `backends` (None: PyTorch's pick)."""

    def __init__(self, cfg, capacity, device, backends=None):
        self.backends = backends
        shape = (cfg.batch, cfg.heads_kv, capacity, cfg.head_dim)
        self.k = [torch.zeros(shape, device=device, dtype=torch.bfloat16) for _ in range(cfg.layers)]
        self.v = [torch.zeros(shape, device=device, dtype=torch.bfloat16) for _ in range(cfg.layers)]
        self.cos, self.sin = rotary_tables(cfg, capacity, device)
        self.len = 0

    def attend(self, layer, q, k, v):
        n, end = q.shape[1], self.len + q.shape[1]
        cos, sin = self.cos[self.len:end], self.sin[self.len:end]
        self.k[layer][:, :, self.len:end] = rotate(k, cos, sin).transpose(1, 2)
        self.v[layer][:, :, self.len:end] = v.transpose(1, 2)
        with contextlib.nullcontext() if self.backends is None else sdpa_kernel(self.backends):
            out = F.scaled_dot_product_attention(rotate(q, cos, sin).transpose(1, 2), self.k[layer][:, :, :end],
                                                 self.v[layer][:, :, :end], is_causal=n > 1, enable_gqa=True)
        return out.transpose(1, 2)

    def advance(self, n):
        self.len += n


CACHES = {"flash3": Flash3Cache, "sdpa": SdpaCache,
          "sdpa_flash": functools.partial(SdpaCache, backends=[SDPBackend.FLASH_ATTENTION])}


@torch.inference_mode()
def generate(model, prompts, cache, new_tokens):
    """(tokens [batch, new_tokens], prefill seconds, decoding seconds, the prefill's logits)."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    logits = model(prompts, cache.attend)
    cache.advance(prompts.shape[1])
    first = logits.float()
    token = logits.argmax(-1)
    torch.cuda.synchronize()
    prefill = time.perf_counter() - start
    out = [token]
    start = time.perf_counter()
    for _ in range(new_tokens - 1):
        logits = model(token[:, None], cache.attend)
        cache.advance(1)
        token = logits.argmax(-1)
        out.append(token)
    torch.cuda.synchronize()
    return torch.stack(out, 1), prefill, time.perf_counter() - start, first


def agreement(a, b):
    """Tokens equal up to each sequence's first difference, over all tokens."""
    same = (a == b).int().cumprod(dim=1)
    return same.sum().item() / a.numel()


def run(cfg, names):
    torch.manual_seed(cfg.seed)
    device = torch.device("cuda")
    model = Decoder(cfg).to(device, torch.bfloat16).eval()
    prompts = torch.randint(cfg.vocab, (cfg.batch, cfg.prompt), generator=torch.Generator().manual_seed(cfg.seed))
    prompts = prompts.to(device)
    capacity = cfg.prompt + cfg.tokens
    results = {}
    for name in names:
        generate(model, prompts[:, :64], CACHES[name](cfg, capacity, device), 8)  # warm-up: kernels, allocator
        cache = CACHES[name](cfg, capacity, device)
        tokens, prefill, decode, first = generate(model, prompts, cache, cfg.tokens)
        results[name] = {"tokens": tokens, "prefill_s": prefill, "decode_s": decode, "first_logits": first,
                         "tokens_per_s": cfg.batch * (cfg.tokens - 1) / decode}
        del cache
        torch.cuda.empty_cache()
    return results


def main(argv=None):
    defaults = Config()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog="\n".join(__doc__.splitlines()[2:]),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    for field in dataclasses.fields(Config):
        p.add_argument("--" + field.name.replace("_", "-"), type=int, default=getattr(defaults, field.name))
    p.add_argument("--attention", nargs="+", choices=tuple(CACHES), default=list(CACHES))
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        p.exit(2, "generate.py: needs a CUDA GPU (flash3: Hopper)\n")
    cfg = Config(**{f.name: getattr(args, f.name) for f in dataclasses.fields(Config)})
    results = run(cfg, args.attention)
    print(f"{torch.cuda.get_device_name()}: {cfg.layers} layers, dim {cfg.dim}, {cfg.heads_q}/{cfg.heads_kv} heads "
          f"of {cfg.head_dim}, batch {cfg.batch}, prompt {cfg.prompt}, {cfg.tokens} new tokens, greedy")
    print("| attention | prefill ms | decoding tokens/s | ms per step |")
    print("|---|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {r['prefill_s'] * 1e3:.1f} | {r['tokens_per_s']:.0f} | "
              f"{r['decode_s'] * 1e3 / (cfg.tokens - 1):.2f} |")
    a = results.get("flash3")
    for name, b in results.items():
        if a is None or name == "flash3":
            continue
        diff = (a["first_logits"] - b["first_logits"]).abs().max().item()
        print(f"flash3 / {name} tokens per second: {a['tokens_per_s'] / b['tokens_per_s']:.2f}; "
              f"tokens agreeing (up to each sequence's first difference): {agreement(a['tokens'], b['tokens']):.3f}; "
              f"largest difference of the prefill's logits: {diff:.3g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
