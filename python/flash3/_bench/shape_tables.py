"""What the per-shape tables of decoding and MLA (decode_table.py,
mla_table.py) share: the methods their rows name, and the notes on the
shapes a method has no number for. Rows are {"batch", "cache", measure:
{method: value}, "not_run": {method: why}}.

Standard library only: the CPU tests and scripts/perf_report.py load the
tables without flash3's __init__ (which needs PyTorch).
"""


def methods_in(rows, measure, labels):
    """The methods of the rows, measured or not: flash3 first, then its
    variants by name, then the peers in labels' order."""
    names = []
    for r in rows:
        names += [n for n in list(r[measure]) + list(r["not_run"]) if n not in names]
    flash3 = sorted((n for n in names if n.startswith("flash3")), key=lambda n: (n != "flash3", n))
    return flash3 + [n for n in labels if n in names]


def format_notes(rows, labels):
    """Why a method has no number on a shape, once per distinct reason."""
    seen = {}
    for r in rows:
        for name, why in r["not_run"].items():
            seen.setdefault((name, why), []).append(f"{r['batch']}x{r['cache']}")
    return [f"n/a: {labels.get(n, n)} ({', '.join(s)}): {why}" for (n, why), s in seen.items()]
