"""The decoding benchmark's pure parts: its shapes, byte count, targets and
table (issue 35's sweep: seqlen_q 1, GQA 32 / 8, head dim 128, bf16).

Standard library only, and no imports from the package but its siblings: the
CPU tests and scripts/perf_report.py load it without flash3's __init__.
"""
from . import shape_tables

HEADS_KV, GROUP, HDIM = 8, 4, 128
BATCHES = (1, 8, 32, 64, 128)
CACHES = (1024, 4096, 8192, 32768, 131072)
# Shapes whose cache (both tensors, bf16) passes 16 GiB are left out: with a
# paged copy and SDPA's own layout beside it they would not fit the card.
MAX_TOKENS = 4 << 20
PAGE_SIZES = (16, 64, 256)
# Issue 35's targets: KV bytes per second over SDPA cuDNN's on every shape,
# in TB/s where each sequence's cache is at least LONG, for batch 1 at the
# longest cache, and paged or appending with rotary within 5% of the plain call.
OVER_CUDNN, LONG, LONG_TBPS, SINGLE_TBPS, WITHIN = 1.02, 8192, 2.95, 2.9, 0.95
LABELS = {"sdpa_cudnn": "SDPA cuDNN", "sdpa_flash": "SDPA FlashAttention-2", "fa3": "FA3"}
# flash3 on an e4m3 copy of the cache: its GB/s count its own bytes, one per
# element; not held to the paged and appending runs' "within 5% of plain".
FP8 = "flash3 e4m3"


def element_bytes(method):
    return 1 if method == FP8 else 2


def decode_shapes(batches=BATCHES, caches=CACHES):
    """(batch, cache) pairs of the sweep, batch-major, without those over MAX_TOKENS."""
    return [(b, c) for b in batches for c in caches if b * c <= MAX_TOKENS]


def kv_bytes(batch, cache, heads_kv=HEADS_KV, hdim=HDIM, element=2):
    """The bytes of K and V a call reads once."""
    return 2 * batch * cache * heads_kv * hdim * element


def targets(row):
    """{target: met} for one row (those its methods' numbers allow)."""
    g, met = row["gbps"], {}
    if "flash3" not in g:
        return met
    if "sdpa_cudnn" in g:
        met[f">= {OVER_CUDNN} x cuDNN"] = g["flash3"] >= OVER_CUDNN * g["sdpa_cudnn"]
    if row["cache"] >= LONG:
        met[f">= {LONG_TBPS} TB/s"] = g["flash3"] >= LONG_TBPS * 1e3
    if row["batch"] == 1 and row["cache"] == max(CACHES):
        met[f"batch 1 >= {SINGLE_TBPS} TB/s"] = g["flash3"] >= SINGLE_TBPS * 1e3
    for name, value in g.items():
        if name.startswith("flash3 ") and name != FP8:
            met[f"{name[7:]} >= {WITHIN} x plain"] = value >= WITHIN * g["flash3"]
    return met


def format_table(rows):
    """Markdown: GB/s of K and V per method, flash3 over cuDNN, and the targets each row misses."""
    names = shape_tables.methods_in(rows, "gbps", LABELS)
    lines = ["| batch | cache | " + " | ".join(LABELS.get(n, n) for n in names) + " | flash3 / cuDNN | missed |",
             "|---|---|" + "---|" * (len(names) + 2)]
    for r in rows:
        cells = [f"{r['gbps'][n]:.0f}" if n in r["gbps"] else "n/a" for n in names]
        g = r["gbps"]
        ratio = f"{g['flash3'] / g['sdpa_cudnn']:.3f}" if "flash3" in g and "sdpa_cudnn" in g else "n/a"
        missed = [t for t, ok in targets(r).items() if not ok]
        lines.append(f"| {r['batch']} | {r['cache']} | " + " | ".join(cells) + f" | {ratio} | "
                     + ("; ".join(missed) or "none") + " |")
    return "\n".join(lines)


def format_notes(rows):
    """Why a method has no number on a shape, once per distinct reason."""
    return shape_tables.format_notes(rows, LABELS)
