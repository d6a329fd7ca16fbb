"""The benchmark's pure parts: the paper's sweep, FLOP counts, result records,
tables, and JSON / CSV files.

Standard library only, and no imports from the package: the CPU tests load
this file by its path, without torch, a GPU or flash3's library.
"""
import csv
import json
import statistics

PASSES = ("fwd", "bwd", "fwd+bwd")
SHAPE_KEYS = ("pass", "dtype", "hdim", "causal", "batch", "seqlen", "heads")
# A shape with V's head dim of its own (hdim Q and K's) also has "hdim_v".
OPTIONAL_SHAPE_KEYS = ("hdim_v",)
# Every method the benchmark knows, in the order of its tables and plots; the
# peers after flash3 run only where importable.
METHODS = {
    "flash3": "flash3",
    "sdpa_flash": "SDPA FlashAttention-2",
    "sdpa_cudnn": "SDPA cuDNN",
    "fa3": "flash_attn_interface (FA3)",
    "fa2": "flash_attn (FA2)",
}
CSV_FIELDS = SHAPE_KEYS + OPTIONAL_SHAPE_KEYS + ("method", "status", "ms", "tflops", "max_err", "ref_err", "sm_mhz",
                                                "power_w", "joules", "regime", "note")
CSV_TYPES = {"hdim": int, "hdim_v": int, "batch": int, "seqlen": int, "heads": int, "ms": float, "tflops": float,
             "max_err": float, "ref_err": float, "sm_mhz": float, "power_w": float, "joules": float}


# ---- the sweep ------------------------------------------------------------------------

def paper_sweep(passes=PASSES, head_dims=(64, 128, 256), seqlens=(512, 1024, 2048, 4096, 8192, 16384),
                causal=(False, True), dtype="bf16", tokens=16384, hidden=2048):
    """The FlashAttention-3 paper's shapes: batch = tokens / seqlen, heads = hidden / hdim.

    A head dim is an int, or a (Q and K's, V's) pair for V's head dim of its
    own (heads = hidden / Q's). flash3-bench's order: head dim, then mask,
    then seqlen; the passes of a shape follow each other.
    """
    shapes = []
    for dims in head_dims:
        d, dv = (dims, dims) if isinstance(dims, int) else dims
        for c in causal:
            for s in seqlens:
                for p in passes:
                    shape = {"pass": p, "dtype": dtype, "hdim": d, "causal": c, "batch": max(1, tokens // s),
                             "seqlen": s, "heads": max(1, hidden // d)}
                    shapes.append(shape if dv == d else {**shape, "hdim_v": dv})
    return shapes


def attention_flops(pass_, hdim, causal, batch, seqlen, heads, hdim_v=None):
    """The FlashAttention papers' count, from the GEMMs: the forward's two
    (Q K^T over hdim, P V over hdim_v, None: hdim) 2 s^2 (d + dv) h b, the
    backward's five 2 s^2 (3 d + 2 dv) h b, half when causal; with dv = d,
    4 s^2 d h b, x2.5 for bwd, x3.5 for fwd+bwd."""
    dv = hdim if hdim_v is None else hdim_v
    fwd = 2 * seqlen * seqlen * (hdim + dv) * heads * batch
    bwd = 2 * seqlen * seqlen * (3 * hdim + 2 * dv) * heads * batch
    flops = {"fwd": fwd, "bwd": bwd, "fwd+bwd": fwd + bwd}[pass_]
    return flops // 2 if causal else flops


def shape_flops(shape):
    return attention_flops(shape["pass"], shape["hdim"], shape["causal"], shape["batch"], shape["seqlen"],
                           shape["heads"], shape.get("hdim_v"))


def shape_of(record):
    return {k: record[k] for k in SHAPE_KEYS + OPTIONAL_SHAPE_KEYS if k in record}


def hdim_label(shape):
    """The head dim as the tables show it: "128", or "192/128" with V's of its own."""
    dv = shape.get("hdim_v", shape["hdim"])
    return f"{shape['hdim']}" if dv == shape["hdim"] else f"{shape['hdim']}/{dv}"


def rotated(items, turn):
    """items starting at position turn (mod len): who goes first changes from shape to shape."""
    turn %= len(items)
    return list(items[turn:]) + list(items[:turn])


# ---- result records: one per (shape, method) ---------------------------------------------

def ok_result(shape, method, samples_ms, check=None, telemetry=None):
    ms = statistics.median(samples_ms)
    return {**shape_of(shape), "method": method, "status": "ok", "ms": ms,
            "tflops": shape_flops(shape) / (ms * 1e-3) / 1e12, "samples_ms": list(samples_ms),
            **(check or {}), **(telemetry or {})}


def na_result(shape, method, reason):
    """The method has no kernel for the shape (or is not there): not a failure."""
    return {**shape_of(shape), "method": method, "status": "na", "note": reason}


def failed_result(shape, method, reason, check=None):
    """Wrong results, or flash3 refused a shape of its own sweep."""
    return {**shape_of(shape), "method": method, "status": "failed", "note": reason, **(check or {})}


def regime_label(regime):
    if regime["name"] == "sustained":
        return f"sustained: each shape under continuous load for at least {regime['load_s']:g} s, then timed"
    scope = "every sample" if regime["scope"] == "sample" else "each shape's samples"
    return f"idle gap: the GPU idle {regime['gap_ms']:g} ms before {scope}"


def merge_runs(runs):
    """One (meta, results) from several runs of one regime; runs of different regimes never mix.

    The power-capped card runs several percent faster after idle gaps than
    under continuous load, so a table across regimes would compare the card's
    clock, not the kernels.
    """
    regimes = {json.dumps(meta["regime"], sort_keys=True) for meta, _ in runs}
    if len(regimes) > 1:
        raise ValueError("runs of different regimes cannot be compared: "
                         + "; ".join(regime_label(json.loads(r)) for r in sorted(regimes)))
    meta = dict(runs[0][0])
    return meta, [r for _, results in runs for r in results]


# ---- tables ---------------------------------------------------------------------------

def cell(record):
    if record is None:
        return ""
    if record["status"] == "ok":
        return f"{record['tflops']:.1f}"
    return "n/a" if record["status"] == "na" else "FAIL"


def methods_in(results):
    present = {r["method"] for r in results}
    return [m for m in METHODS if m in present]


def by_shape(results):
    """{shape tuple: {method: record}}, shapes in first-seen order."""
    table = {}
    for r in results:
        table.setdefault(tuple(r.get(k) for k in SHAPE_KEYS + OPTIONAL_SHAPE_KEYS), {})[r["method"]] = r
    return table


def ratio(a, b, key="tflops"):
    if a and b and a["status"] == "ok" and b["status"] == "ok" and a.get(key) and b.get(key):
        return f"{a[key] / b[key]:.2f}"
    return "n/a"


def energy_cell(record):
    """Millijoules per call (the sustained regime's), or blank."""
    return f"{record['joules'] * 1e3:.2f}" if record and record.get("joules") is not None else ""


def format_table(results):
    """A markdown table: TFLOP/s per method, then flash3's speedup over each peer; where the records
    have energy (the sustained regime), each method's mJ per call and flash3's energy over each peer's."""
    methods = methods_in(results)
    peers = [m for m in methods if m != "flash3"] if "flash3" in methods else []
    energy = any(r.get("joules") is not None for r in results)
    header = (["pass", "dtype", "hdim", "causal", "batch", "seqlen", "heads"] + [METHODS[m] for m in methods]
              + [f"flash3 / {METHODS[m]}" for m in peers])
    if energy:
        header += [f"{METHODS[m]} mJ/call" for m in methods] + [f"flash3 J / {METHODS[m]} J" for m in peers]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for key, row in by_shape(results).items():
        shape = {k: v for k, v in zip(SHAPE_KEYS + OPTIONAL_SHAPE_KEYS, key) if v is not None}
        cells = [shape["pass"], shape["dtype"], hdim_label(shape), "yes" if shape["causal"] else "no", shape["batch"],
                 shape["seqlen"], shape["heads"]]
        cells += [cell(row.get(m)) for m in methods]
        cells += [ratio(row.get("flash3"), row.get(m)) for m in peers]
        if energy:
            cells += [energy_cell(row.get(m)) for m in methods]
            cells += [ratio(row.get("flash3"), row.get(m), "joules") for m in peers]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def shape_label(shape):
    return (f"{shape['pass']} {shape['dtype']} hdim {hdim_label(shape)}{' causal' if shape['causal'] else ''} "
            f"seqlen {shape['seqlen']} batch {shape['batch']} heads {shape['heads']}")


def format_notes(results):
    """Each failure with its shape; each distinct n/a reason once, with the number of shapes it hit."""
    failures = [f"- {METHODS.get(r['method'], r['method'])} FAIL, {shape_label(r)}: {r.get('note', '')}"
                for r in results if r["status"] == "failed"]
    counts = {}
    for r in results:
        if r["status"] == "na":
            key = (r["method"], r.get("note", ""))
            counts[key] = counts.get(key, 0) + 1
    return failures + [f"- {METHODS.get(m, m)} n/a on {n} shape(s): {note}" for (m, note), n in counts.items()]


def format_header(meta):
    device = meta.get("device", {})
    clocks = ", ".join(f"{k} {device[k]}" for k in ("sm_mhz", "max_sm_mhz", "power_w", "power_limit_w")
                       if device.get(k) is not None)
    return "\n".join([
        f"device: {device.get('name', '?')}" + (f" ({clocks})" if clocks else ""),
        f"regime: {regime_label(meta['regime'])}",
        f"timer: {meta.get('timer', '?')}",
        "TFLOP/s = 4 * seqlen^2 * hdim * heads * batch, /2 causal, x2.5 bwd, x3.5 fwd+bwd "
        "(V's head dim dv of its own: 2 * seqlen^2 * (hdim + dv) fwd, 2 * seqlen^2 * (3 hdim + 2 dv) bwd)",
    ])


# ---- files ------------------------------------------------------------------------------

def write_json(path, meta, results):
    with open(path, "w") as f:
        json.dump({**meta, "results": results}, f, indent=1)


def read_json(path):
    with open(path) as f:
        data = json.load(f)
    results = data.pop("results")
    return data, results


def write_csv(path, meta, results):
    """One line per (shape, method) with its run's regime: a row never loses which regime it was timed in."""
    regime = regime_label(meta["regime"])
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        writer.writeheader()
        for r in results:
            writer.writerow({**r, "regime": regime})


def read_csv(path):
    """The rows of write_csv, typed back (empty cells left out)."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    out = []
    for row in rows:
        record = {}
        for key, value in row.items():
            if value == "":
                continue
            if key == "causal":
                record[key] = value == "True"
            else:
                record[key] = CSV_TYPES.get(key, str)(value)
        out.append(record)
    return out


# ---- host overhead ------------------------------------------------------------------------

def overhead_verdicts(overhead, modes):
    """Whether flash3's median host time is at most SDPA FlashAttention-2's, for each mode both have."""
    verdicts = {}
    for mode in modes:
        mine = overhead.get("flash3", {}).get(mode)
        theirs = overhead.get("sdpa_flash", {}).get(mode)
        if mine and theirs:
            verdicts[mode] = mine["median_us"] <= theirs["median_us"]
    return verdicts


def format_overhead(overhead, modes):
    """A markdown table of median (p10-p90) host microseconds per call, per method and mode; then why n/a."""
    lines = ["| method | " + " | ".join(modes) + " |", "|" + "---|" * (len(modes) + 1)]
    notes = []
    for method in [m for m in METHODS if m in overhead]:
        times = overhead[method]
        cells = [f"{times[mode]['median_us']:.1f} ({times[mode]['p10_us']:.1f}-{times[mode]['p90_us']:.1f})"
                 if mode in times else "n/a" for mode in modes]
        lines.append(f"| {METHODS[method]} | " + " | ".join(cells) + " |")
        if "na" in times:
            notes.append(f"- {METHODS[method]} n/a: {times['na']}")
    return "\n".join(lines + ([""] + notes if notes else []))
