"""The MLA decoding benchmark's pure parts (python -m flash3.benchmark --mla):
its shapes, FLOP and byte counts, targets and table (issue 35's sweep: one
token a sequence, 128 query heads against one latent KV head, the rotary
part's head dim 64 and the latent part's 512, bf16).

A call reads each cached key's 576 columns once and, with 128 query heads,
does 128 x (2 x 576 + 2 x 512) FLOPs per key: 242 per byte, near the H100's
ratio of tensor FLOPs to memory bandwidth, so both measures are reported.

Standard library only, and no imports from the package but its siblings: the
CPU tests and scripts/perf_report.py load it without flash3's __init__.
"""
from . import shape_tables

HEADS_Q, HEADS_KV, HDIM, HDIM_V = 128, 1, 64, 512
BATCHES = (64, 132)
CACHES = (4096, 8192, 16384, 32768)
PAGE_SIZE = 64
# Issue 35's targets: compute-bound shapes at least TFLOPS, memory-bound ones
# at least TBPS. A shape is compute-bound when reaching TFLOPS reads less
# than TBPS: FLOPs per byte above their ratio (128 query heads make 242).
TFLOPS, TBPS = 610, 2.95
RIDGE = TFLOPS / TBPS
LABELS = {"flash_mla": "FlashMLA", "fa3": "FA3"}
# Speculative decoding: flash3 on two causal tokens a sequence (the same
# cache; the tiles pack both tokens' rows), its TFLOP/s of its own pairs.
# Above the one-token call's TFLOP/s, two tokens cost less than twice one.
SPECULATIVE = "flash3 2 tokens"
TOKENS = {SPECULATIVE: 2}


def mla_shapes(batches=BATCHES, caches=CACHES):
    """(batch, cache) pairs of the sweep, batch-major."""
    return [(b, c) for b in batches for c in caches]


def flops(batch, cache, heads_q=HEADS_Q, seqlen_q=1):
    """S = q k^T + qv v^T (2 x 576 per pair) and O = P v (2 x 512) for every (query head, key) pair
    visited: seqlen_q causal tokens at the cache's end, token i seeing cache - seqlen_q + 1 + i keys."""
    pairs = seqlen_q * cache - seqlen_q * (seqlen_q - 1) // 2
    return batch * heads_q * pairs * 2 * (HDIM + HDIM_V + HDIM_V)


def kv_bytes(batch, cache, heads_kv=HEADS_KV):
    """The bytes of the cache (both parts, bf16) a call reads once."""
    return batch * cache * heads_kv * (HDIM + HDIM_V) * 2


def compute_bound(batch, cache):
    return flops(batch, cache) / kv_bytes(batch, cache) >= RIDGE


def tbps(row, name):
    """A method's TFLOP/s on a row as TB/s of the cache read once (its own tokens' FLOPs)."""
    return row["tflops"][name] * kv_bytes(row["batch"], row["cache"]) / flops(row["batch"], row["cache"],
                                                                              seqlen_q=TOKENS.get(name, 1))


def targets(row):
    """{target: met} of flash3's contiguous call on one row."""
    t = row["tflops"]
    if "flash3" not in t:
        return {}
    if compute_bound(row["batch"], row["cache"]):
        return {f">= {TFLOPS} TFLOP/s": t["flash3"] >= TFLOPS}
    return {f">= {TBPS} TB/s": tbps(row, "flash3") >= TBPS}


def format_table(rows):
    """Markdown: TFLOP/s and TB/s per method, and the targets each row misses."""
    names = shape_tables.methods_in(rows, "tflops", LABELS)
    lines = ["| batch | cache | " + " | ".join(f"{LABELS.get(n, n)} TFLOP/s | TB/s" for n in names) + " | missed |",
             "|---|---|" + "---|---|" * len(names) + "---|"]
    for r in rows:
        cells = [f"{r['tflops'][n]:.0f} | {tbps(r, n):.2f}" if n in r["tflops"] else "n/a | n/a" for n in names]
        missed = [t for t, ok in targets(r).items() if not ok]
        lines.append(f"| {r['batch']} | {r['cache']} | " + " | ".join(cells) + " | " + ("; ".join(missed) or "none")
                     + " |")
    return "\n".join(lines)


def format_notes(rows):
    """Why a method has no number on a shape, once per distinct reason."""
    return shape_tables.format_notes(rows, LABELS)
