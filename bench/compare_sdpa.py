#!/usr/bin/env python3
"""Compares flash3 with PyTorch SDPA's FlashAttention-2 and cuDNN backends.

Reads the JSON written by `flash3-bench --json`, times both SDPA backends on
every shape in it (default variant only: ablations have no peer), and prints a
markdown table of TFLOP/s and flash3's speedups.

  compare_sdpa.py --flash3-json bench.json [bench_bwd.json ...] [--out-json merged.json]
  compare_sdpa.py --self-test      # pure parts only: no torch, no GPU

torch and triton are imported lazily so that --self-test runs anywhere.
"""
import argparse
import datetime
import json
import re
import statistics
import sys
import warnings

SHAPE_KEYS = ("pass", "dtype", "hdim", "causal", "batch", "seqlen_q", "seqlen_k", "heads_q", "heads_kv")
PEERS = ("fa2", "cudnn")
LONG_SEQLEN = 1024  # the summary counts only shapes at least this long
# SDPA warnings that carry no reason: headers, and the backends sdpa_kernel turned off.
WARNING_NOISE = ("not used because:", "has been runtime disabled.")


# ---- pure parts: no torch ---------------------------------------------------

def attention_flops(pass_, hdim, causal, batch, seqlen_q, seqlen_k, heads_q):
    """The FlashAttention papers' count: 4 s_q s_k d h b, half when causal, x2.5 for bwd, x3.5 for fwd+bwd."""
    flops = 4 * seqlen_q * seqlen_k * hdim * heads_q * batch
    if causal:
        flops //= 2
    return {"fwd": flops, "bwd": flops * 5 // 2, "fwd+bwd": flops * 7 // 2}[pass_]


def shape_flops(shape):
    return attention_flops(shape["pass"], shape["hdim"], shape["causal"], shape["batch"],
                           shape["seqlen_q"], shape["seqlen_k"], shape["heads_q"])


def measured(shape, ms):
    return {"ms": ms, "tflops": shape_flops(shape) / (ms * 1e-3) / 1e12}


def group_shapes(entries):
    """One row per distinct shape of the default variant, in first-seen order.

    flash3's time is the median over repeated runs of a shape; its TFLOP/s is
    recomputed from that time with attention_flops so every column uses the
    same formula and the ratios are exact time ratios.
    """
    groups = {}
    for entry in entries:
        if entry.get("variant", "default") == "default":
            groups.setdefault(tuple(entry[k] for k in SHAPE_KEYS), []).append(entry)
    rows = []
    for key, runs in groups.items():
        shape = dict(zip(SHAPE_KEYS, key))
        ok_ms = [r["ms"] for r in runs if r.get("ok", True)]
        if ok_ms:
            shape["flash3"] = measured(shape, statistics.median(ok_ms))
        else:
            shape["flash3"] = {"failed": runs[0].get("error") or "failed its reference check"}
        rows.append(shape)
    return rows


def peer_skip_reason(shape):
    """Why SDPA cannot run this shape comparably, or None."""
    if shape["dtype"] not in ("bf16", "fp16"):
        return (f"SDPA has no {shape['dtype']} attention (PyTorch exposes no cuDNN FP8 attention; "
                "flash3's e4m3 rows stand alone)")
    if shape["causal"] and shape["seqlen_q"] != shape["seqlen_k"]:
        return "SDPA's causal mask is top-left aligned, flash3's bottom-right"
    if shape["heads_q"] % shape["heads_kv"]:
        return "heads_q is not a multiple of heads_kv"
    return None


def failure_reason(warning_messages, error):
    """Why a backend refused: SDPA's "No available kernel" explains itself only in warnings."""
    parts = [re.sub(r"\s*\(Triggered internally at [^)]*\)", "", m).strip() for m in warning_messages]
    parts = [p for p in parts if p and not p.endswith(WARNING_NOISE)] + [str(error)]
    return " ".join(" ".join(parts).split())[:300]


def usable(result):
    return "tflops" in result


def cell(result):
    if "failed" in result:
        return "FAIL"
    return f"{result['tflops']:.1f}" if usable(result) else "n/a"


def speedup(row, peer):
    if usable(row["flash3"]) and usable(row[peer]):
        return f"{row['flash3']['tflops'] / row[peer]['tflops']:.2f}"
    return "n/a"


def pair(a, b):
    return str(a) if a == b else f"{a}/{b}"


def format_table(rows):
    lines = ["| pass | dtype | hdim | causal | batch | seqlen | heads | flash3 TFLOP/s | fa2 TFLOP/s "
             "| cudnn TFLOP/s | flash3/fa2 | flash3/cudnn |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        cells = [r["pass"], r["dtype"], r["hdim"], "yes" if r["causal"] else "no", r["batch"],
                 pair(r["seqlen_q"], r["seqlen_k"]), pair(r["heads_q"], r["heads_kv"]),
                 cell(r["flash3"]), cell(r["fa2"]), cell(r["cudnn"]), speedup(r, "fa2"), speedup(r, "cudnn")]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def format_notes(rows):
    """Each distinct n/a or failure reason once, with how many shapes it hit."""
    counts = {}
    for r in rows:
        for name in ("flash3",) + PEERS:
            reason = r[name].get("na") or r[name].get("failed")
            if reason:
                key = (name, cell(r[name]), reason)
                counts[key] = counts.get(key, 0) + 1
    return [f"- {name} {status} on {n} shape(s): {reason}" for (name, status, reason), n in counts.items()]


def format_summary(rows):
    long_rows = [r for r in rows if min(r["seqlen_q"], r["seqlen_k"]) >= LONG_SEQLEN]
    compared = [r for r in long_rows if usable(r["flash3"]) and usable(r["cudnn"])]
    wins = sum(r["flash3"]["tflops"] > r["cudnn"]["tflops"] for r in compared)
    line = f"flash3 beats cuDNN on {wins} of {len(long_rows)} shapes with seqlen >= {LONG_SEQLEN}"
    missing = len(long_rows) - len(compared)
    return line + (f" ({missing} without both numbers)" if missing else "")


# ---- GPU parts: torch, optional triton --------------------------------------

def make_timer(torch):
    """Returns (name, fn -> median ms): triton's do_bench, else CUDA events."""
    try:
        from triton.testing import do_bench
    except ImportError:
        return "CUDA events, median of 50 after 10 warm-up", lambda fn: time_with_events(torch, fn)
    return ("triton.testing.do_bench median",
            lambda fn: do_bench(fn, warmup=25, rep=100, return_mode="median"))


def time_with_events(torch, fn, warmup=10, runs=50):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def make_inputs(torch, shape, requires_grad):
    """Random normal q, k, v as [b, h, s, d] views of BSHD memory, like flash3's."""
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[shape["dtype"]]

    def one(seqlen, heads):
        x = torch.randn(shape["batch"], seqlen, heads, shape["hdim"], device="cuda", dtype=dtype)
        return x.transpose(1, 2).requires_grad_(requires_grad)

    return (one(shape["seqlen_q"], shape["heads_q"]), one(shape["seqlen_k"], shape["heads_kv"]),
            one(shape["seqlen_k"], shape["heads_kv"]))


def sdpa_workload(torch, shape):
    """The callable to time: the SDPA call (fwd), only its backward (bwd), or both."""
    import torch.nn.functional as F
    q, k, v = make_inputs(torch, shape, shape["pass"] != "fwd")
    # Passed only for GQA so that a torch without enable_gqa still runs MHA.
    gqa = {"enable_gqa": True} if shape["heads_kv"] != shape["heads_q"] else {}

    def forward():
        return F.scaled_dot_product_attention(q, k, v, is_causal=shape["causal"], **gqa)

    if shape["pass"] == "fwd":
        return forward
    out = forward()
    grad_out = torch.randn_like(out)
    if shape["pass"] == "fwd+bwd":
        return lambda: torch.autograd.grad(forward(), (q, k, v), grad_out)
    return lambda: torch.autograd.grad(out, (q, k, v), grad_out, retain_graph=True)


def time_peer(torch, timer, shape, backend):
    """Times one SDPA backend on one shape; any error becomes n/a with its reason."""
    from torch.nn.attention import sdpa_kernel
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with sdpa_kernel([backend]):
                return measured(shape, timer(sdpa_workload(torch, shape)))
        except Exception as e:  # unsupported shape/dtype, OOM, missing enable_gqa: all n/a
            return {"na": failure_reason([str(w.message) for w in caught], e)}
        finally:
            torch.cuda.empty_cache()


def measure_peers(torch, timer, rows):
    from torch.nn.attention import SDPBackend
    backends = {"fa2": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
    for i, row in enumerate(rows):
        print(f"[{i + 1}/{len(rows)}] {row['pass']} {row['dtype']} hdim {row['hdim']} causal {row['causal']} "
              f"seqlen {pair(row['seqlen_q'], row['seqlen_k'])} batch {row['batch']}", file=sys.stderr)
        skip = peer_skip_reason(row)
        for name, backend in backends.items():
            torch.manual_seed(1000 + i)
            row[name] = {"na": skip} if skip else time_peer(torch, timer, row, backend)


def compare(args):
    import torch
    if not torch.cuda.is_available():
        print("compare_sdpa: no CUDA device; SDPA peers need one (try --self-test)", file=sys.stderr)
        return 2
    entries = []
    for path in args.flash3_json:
        with open(path) as f:
            entries += json.load(f)
    rows = group_shapes(entries)
    timer_name, timer = make_timer(torch)
    measure_peers(torch, timer, rows)
    header = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "cudnn": torch.backends.cudnn.version(),
              "date": datetime.datetime.now().astimezone().isoformat(timespec="minutes"), "timer": timer_name}
    print(f"device: {header['device']} | torch {header['torch']} | cuDNN {header['cudnn']} | {header['date']}")
    print(f"timer: {timer_name}; TFLOP/s = 4*sq*sk*d*h*b, /2 causal, x2.5 bwd\n")
    print(format_table(rows))
    print("\n".join([""] + format_notes(rows) + ["", format_summary(rows)]))
    if args.out_json:
        with open(args.out_json, "w") as f:
            json.dump({**header, "rows": rows}, f, indent=1)
    return 0


# ---- self-test ----------------------------------------------------------------

def expect(cond, what):
    # Not `assert`: python -O would silently pass the self-test.
    if not cond:
        raise AssertionError(what)


def self_test():
    expect(attention_flops("fwd", 128, False, 4, 4096, 4096, 16) == 4 * 4096 * 4096 * 128 * 16 * 4, "fwd flops")
    expect(attention_flops("fwd", 128, True, 4, 4096, 4096, 16) * 2 == attention_flops("fwd", 128, False, 4, 4096,
                                                                                         4096, 16), "causal halves")
    expect(attention_flops("bwd", 64, False, 1, 1024, 1024, 8) * 2 == attention_flops("fwd", 64, False, 1, 1024,
                                                                                        1024, 8) * 5, "bwd x2.5")
    expect(attention_flops("fwd+bwd", 64, False, 1, 1024, 1024, 8) * 2 == attention_flops("fwd", 64, False, 1, 1024,
                                                                                            1024, 8) * 7, "x3.5")
    base = {"pass": "fwd", "dtype": "bf16", "hdim": 128, "causal": False, "batch": 1, "seqlen_q": 2048,
            "seqlen_k": 2048, "heads_q": 16, "heads_kv": 16, "ok": True, "variant": "default"}
    ms = attention_flops("fwd", 128, False, 1, 2048, 2048, 16) / 500e12 * 1e3  # 500 TFLOP/s
    entries = [dict(base, ms=ms), dict(base, ms=ms / 2, variant="no-pingpong"),
               dict(base, seqlen_q=512, seqlen_k=512, ms=1.0, ok=False)]
    rows = group_shapes(entries)
    expect(len(rows) == 2, "ablation variant ignored")
    rows[0].update(fa2=measured(rows[0], ms * 1.25), cudnn=measured(rows[0], ms * 0.8))
    rows[1].update(fa2={"na": "unsupported"}, cudnn={"na": "unsupported"})
    table = format_table(rows)
    expect("| fwd | bf16 | 128 | no | 1 | 2048 | 16 | 500.0 | 400.0 | 625.0 | 1.25 | 0.80 |" in table, table)
    expect("| 512 | 16 | FAIL | n/a | n/a | n/a | n/a |" in table, table)
    expect(format_summary(rows) == "flash3 beats cuDNN on 0 of 1 shapes with seqlen >= 1024", format_summary(rows))
    print("compare_sdpa self-test: ok")
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flash3-json", nargs="+", help="results written by flash3-bench --json (one or more files)")
    parser.add_argument("--out-json", help="also write the merged results here")
    parser.add_argument("--self-test", action="store_true", help="check the pure parts; needs no torch or GPU")
    args = parser.parse_args(argv)
    if args.self_test:
        return self_test()
    if not args.flash3_json:
        parser.error("--flash3-json is required")
    return compare(args)


if __name__ == "__main__":
    sys.exit(main())
