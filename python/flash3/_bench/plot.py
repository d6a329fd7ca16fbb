"""The benchmark's plot, laid out as the FlashAttention-3 paper's Figure 5: a
panel per (pass, mask) and head dim, TFLOP/s bars per method at each
sequence length, the device and the regime in the title. scripts/perf_report.py
draws docs/performance.png with it too.

Takes result records (sweep.py's) and the method labels; needs matplotlib
only, imported when called, and nothing of the package, so that the CPU tests
load it by its path.
"""
COLORS = ("#7b3294", "#e08214", "#4393c3", "#5aae61", "#bababa")
PASS_TITLES = {"fwd": "Forward", "bwd": "Backward", "fwd+bwd": "Forward + backward"}


def seqlen_label(n):
    return f"{n // 1024}k" if n % 1024 == 0 else str(n)


def write_plot(results, labels, title, path):
    """Writes the PNG, `title` above the panels; returns None, or why no plot was written."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        return f"matplotlib not importable ({e})"
    timed = [r for r in results if r["status"] == "ok"]
    if not timed:
        return "no timed result to plot"
    methods = [m for m in labels if any(r["method"] == m for r in timed)]
    color = dict(zip(labels, COLORS))
    rows = sorted({(r["pass"], r["dtype"], r["causal"]) for r in timed},
                  key=lambda row: (list(PASS_TITLES).index(row[0]), row[1], row[2]))
    # A panel per head dims (Q's, V's): 192/128 beside 192.
    hdims = sorted({(r["hdim"], r.get("hdim_v", r["hdim"])) for r in timed}, key=lambda h: (h[0], -h[1]))
    header_in = 0.65  # inches above the panels: title (two lines) and legend
    height = 2.8 * len(rows) + header_in
    fig, axes = plt.subplots(len(rows), len(hdims), figsize=(max(4.2 * len(hdims), 7.0), height), squeeze=False)
    for i, (pass_, dtype, causal) in enumerate(rows):
        for j, (hdim, hdim_v) in enumerate(hdims):
            ax = axes[i][j]
            panel = [r for r in timed if (r["pass"], r["dtype"], r["causal"], r["hdim"], r.get("hdim_v", r["hdim"]))
                     == (pass_, dtype, causal, hdim, hdim_v)]
            if not panel:
                ax.axis("off")
                continue
            seqlens = sorted({r["seqlen"] for r in panel})
            shown = [m for m in methods if any(r["method"] == m for r in panel)]
            width = 0.8 / len(shown)
            for k, method in enumerate(shown):
                tflops = {r["seqlen"]: r["tflops"] for r in panel if r["method"] == method}
                xs = [x + (k - (len(shown) - 1) / 2) * width for x in range(len(seqlens))]
                bars = ax.bar(xs, [tflops.get(s, 0.0) for s in seqlens], width, label=labels[method],
                              color=color[method])
                ax.bar_label(bars, labels=[f"{tflops[s]:.0f}" if s in tflops else "" for s in seqlens],
                             fontsize=5, rotation=90, padding=1)
            ax.set_xticks(range(len(seqlens)), [seqlen_label(s) for s in seqlens], fontsize=8)
            ax.tick_params(axis="y", labelsize=8)
            ax.set_ylim(0, ax.get_ylim()[1] * 1.12)  # room for the bar labels
            ax.grid(axis="y", alpha=0.3)
            ax.set_axisbelow(True)
            ax.set_title(f"{PASS_TITLES[pass_]} {dtype}, head dim {hdim if hdim_v == hdim else f'{hdim}/{hdim_v}'}, {'causal' if causal else 'no mask'}",
                         fontsize=9)
            if j == 0:
                ax.set_ylabel("TFLOP/s", fontsize=8)
            if i == len(rows) - 1:
                ax.set_xlabel("sequence length", fontsize=8)
    handles = {}
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    fig.suptitle(title, fontsize=9, y=1 - 0.05 / height)
    fig.legend(list(handles.values()), list(handles), loc="upper center", ncol=len(handles), frameon=False,
               bbox_to_anchor=(0.5, 1 - 0.4 / height), fontsize=8)
    fig.tight_layout()
    fig.subplots_adjust(top=1 - (header_in + 0.3) / height)  # 0.3 in: the first row's panel titles
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)
    return None
