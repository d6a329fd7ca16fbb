"""A small pre-norm transformer block whose attention is flash3's (GQA,
causal), for the tracing and compile tests."""
import torch

import flash3


class Block(torch.nn.Module):
    def __init__(self, dim=256, heads=4, heads_kv=2):
        super().__init__()
        self.heads, self.heads_kv, self.head_dim = heads, heads_kv, dim // heads
        self.norm1, self.norm2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
        self.qkv = torch.nn.Linear(dim, (heads + 2 * heads_kv) * self.head_dim, bias=False)
        self.proj = torch.nn.Linear(dim, dim, bias=False)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(), torch.nn.Linear(4 * dim, dim))

    def forward(self, x):
        b, t, _ = x.shape
        qkv = self.qkv(self.norm1(x)).view(b, t, self.heads + 2 * self.heads_kv, self.head_dim)
        q, k, v = qkv.split([self.heads, self.heads_kv, self.heads_kv], dim=2)
        x = x + self.proj(flash3.flash_attn_func(q, k, v, causal=True).reshape(b, t, -1))
        return x + self.mlp(self.norm2(x))
