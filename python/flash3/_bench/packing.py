"""Packed batches for the variable-length benchmark: documents' lengths, their
FLOPs and the fixed-length shape they are measured against.

Standard library only: the CPU tests load it without torch or the library.
"""
import math
import random

from .sweep import attention_flops


def log_uniform_lengths(tokens, low, high, seed):
    """Document lengths, log-uniform in [low, high] from a seeded generator,
    until they hold `tokens` tokens (the last one cut to fit)."""
    rng = random.Random(seed)
    lengths = []
    while sum(lengths) < tokens:
        n = int(round(math.exp(rng.uniform(math.log(low), math.log(high)))))
        lengths.append(min(n, tokens - sum(lengths)))
    return lengths


def packed_flops(pass_, hdim, causal, heads, lengths):
    """The real FLOPs of a packed batch: each document's own attention, the
    papers' count (no padding, no work across documents)."""
    return sum(attention_flops(pass_, hdim, causal, 1, n, heads) for n in lengths)


def token_weighted_mean(lengths):
    """The length a token's document has on average: sum n^2 / sum n, the
    length whose fixed-length batch of the same tokens does the same FLOPs."""
    return sum(n * n for n in lengths) / sum(lengths)


def cu_seqlens(lengths):
    """The prefix sums FlashAttention's varlen functions take."""
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return out
