"""The chunked prefill benchmark's pure parts (python -m flash3.benchmark
--prefill): its shapes, FLOP count, target and table. A chunk of a prompt's
queries attends, causally and aligned bottom-right, to a KV cache that ends
with the chunk's own keys; the same work through flash_attn_func (the plain
forward, seqlen_q the chunk's, seqlen_k the cache's) is the yardstick.

Standard library only, and no imports from the package: the CPU tests load
this file by its path.
"""
HEADS_KV, GROUP, HDIM = 8, 4, 128
CHUNKS = (512, 1024, 2048)
CACHES = (8192, 16384, 32768)
# Issue 35's target: the KV cache call's TFLOP/s over the plain forward's.
OVER_PLAIN = 0.9
LABELS = {"flash3": "flash3 KV cache", "flash3 paged 256": "flash3 paged 256", "plain": "flash_attn_func"}


def prefill_shapes(chunks=CHUNKS, caches=CACHES):
    """(chunk, cache) pairs, cache-major, without chunks longer than their cache."""
    return [(q, c) for c in caches for q in chunks if q <= c]


def visited_pairs(chunk, cache):
    """(query, key) pairs a bottom-right causal mask keeps: query i of the chunk sees cache - chunk + i + 1 keys."""
    return chunk * (cache - chunk) + chunk * (chunk + 1) // 2


def flops(batch, chunk, cache, heads_q=HEADS_KV * GROUP, hdim=HDIM):
    """Two GEMMs (QK^T and PV) of 2 * hdim FLOPs for every visited pair of every query head."""
    return 4 * batch * heads_q * hdim * visited_pairs(chunk, cache)


def targets(row):
    """{target: met} for one row: each KV cache method against the plain forward."""
    t = row["tflops"]
    if "plain" not in t:
        return {}
    return {f"{LABELS[n]} >= {OVER_PLAIN} x plain": t[n] >= OVER_PLAIN * t["plain"] for n in t if n != "plain"}


def format_table(rows):
    """Markdown: TFLOP/s per method, each KV cache method over the plain forward, the targets missed."""
    names = []
    for r in rows:
        names += [n for n in list(r["tflops"]) + list(r["not_run"]) if n not in names]
    names = sorted(names, key=lambda n: (n == "plain", n))
    ratios = [n for n in names if n != "plain"]
    lines = ["| chunk | cache | " + " | ".join(LABELS.get(n, n) for n in names) + " | "
             + "".join(f"{LABELS.get(n, n)} / plain | " for n in ratios) + "missed |",
             "|---|---|" + "---|" * (len(names) + len(ratios) + 1)]
    for r in rows:
        t = r["tflops"]
        cells = [f"{t[n]:.1f}" if n in t else "n/a" for n in names]
        cells += [f"{t[n] / t['plain']:.3f}" if n in t and "plain" in t else "n/a" for n in ratios]
        missed = [k for k, ok in targets(r).items() if not ok]
        lines.append(f"| {r['chunk']} | {r['cache']} | " + " | ".join(cells) + " | " + ("; ".join(missed) or "none")
                     + " |")
    return "\n".join(lines)


def format_notes(rows):
    """Why a method has no number on a shape."""
    return [f"n/a: {LABELS.get(n, n)} ({r['chunk']} x {r['cache']}): {why}" for r in rows for n, why in r["not_run"].items()]
