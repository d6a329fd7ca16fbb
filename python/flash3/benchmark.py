"""flash3 beside its peers, every method timed the same way in one process.

  python -m flash3.benchmark                       the paper's sweep, fwd, bwd and fwd+bwd, idle gap before every sample
  python -m flash3.benchmark --sustained           the same under continuous load (at least 2 s per shape),
                                                   with each method's joules per call (the card's energy counter)
  python -m flash3.benchmark --overhead            host time per call, flash3 against SDPA (tiny shape; a decoding step)
  python -m flash3.benchmark --varlen              packed sequences (flash_attn_varlen_func) beside the fixed-length kernel
  python -m flash3.benchmark --hdim 192,192/128    V's head dim of its own (DeepSeek-V3's) beside the symmetric 192
  python -m flash3.benchmark --decode              decoding from a KV cache (GQA 32/8, head dim 128): GB/s of K and V,
                                                   contiguous, paged and with an append and rotary, beside SDPA's
  python -m flash3.benchmark --prefill             chunked prefill (a chunk of queries against a KV cache, causal):
                                                   TFLOP/s beside flash_attn_func on the same work
  python -m flash3.benchmark --mla                 MLA decoding (qv: 128 query heads, one latent KV head, 64 + 512):
                                                   TFLOP/s and TB/s, contiguous and paged, beside FlashMLA and FA3
                                                   where importable
  python -m flash3.benchmark --from-json a.json    the table, CSV and plot again from saved runs (no GPU)

Methods: flash3, SDPA's FlashAttention-2 and cuDNN backends, and
flash_attn_interface (FA3) and flash_attn (FA2) where importable. Timing
(flash3-bench's): an L2 flush before each sample, CUDA events around each
call, the median. Each method is checked against a float32 reference on
every shape before it is timed. A peer without a kernel for a shape is n/a.

The H100s run power-capped (700 W): after idle gaps they read several percent
faster than under continuous load, so the regime is part of every result, in
the JSON, the CSV, the table and the plot; runs of two regimes are never
merged. Under continuous load the cap makes speed a matter of energy: the
sustained regime also reads NVML's energy counter over a second of back-to-back
calls after the load, and the table gives each method's millijoules per call
and flash3's energy over each peer's. The C++ flash3-bench remains the main
benchmark.

Exit status: 0 ok, 1 a check failed (or flash3's host overhead exceeds
SDPA's), 2 no GPU or no torch.
"""
import argparse
import datetime
import json
import sys

from ._bench import decode, decode_table, mla, mla_table, overhead, prefill, prefill_table, sweep, varlen
from ._bench.device_info import Telemetry
from ._bench.methods import CHECK_HEADS, check, failure_reason, load_methods, make_inputs, recording_warnings, workload
from ._bench.plot import write_plot
from ._bench.timing import Timer


def int_list(text):
    return [int(x) for x in text.split(",")]


def head_dim_list(text):
    """Head dims: "64,128,192/128", an item D (Q, K and V's) or D/DV (V's head dim DV of its own)."""
    dims = []
    for item in text.split(","):
        d, _, dv = item.partition("/")
        dims.append(int(d) if not dv else (int(d), int(dv)))
    return dims


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m flash3.benchmark", description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n".join(__doc__.splitlines()[2:]))
    p.add_argument("--pass", dest="passes", choices=sweep.PASSES + ("all",), default="all")
    p.add_argument("--hdim", type=head_dim_list, default=[64, 128, 256],
                   help="head dims (default 64,128,256); D/DV: V's head dim DV of its own, as 192/128")
    p.add_argument("--seqlen", type=int_list, default=[512, 1024, 2048, 4096, 8192, 16384],
                   help="sequence lengths (default 512 ... 16384)")
    p.add_argument("--causal", choices=("0", "1", "both"), default="both")
    p.add_argument("--dtype", choices=("bf16", "fp16", "e4m3"), default="bf16",
                   help="e4m3: with --varlen --pass fwd (the FP8 sweep is flash3-bench --dtype e4m3's)")
    p.add_argument("--tokens", type=int, default=16384, help="batch = tokens / seqlen (the paper's 16k)")
    p.add_argument("--hidden", type=int, default=2048, help="heads = hidden / hdim (the paper's 2048)")
    p.add_argument("--methods", type=lambda s: s.split(","), default=list(sweep.METHODS),
                   help=f"comma-separated, from {','.join(sweep.METHODS)} (default: all; peers that do not "
                        "import are left out, saying why)")
    p.add_argument("--reps", type=int, default=10, help="timed samples per shape and method (median reported)")
    p.add_argument("--gap-ms", type=float, default=100.0, help="idle-gap regime: the GPU idle this long ...")
    p.add_argument("--gap-scope", choices=("sample", "shape"), default="sample",
                   help="... before every sample (default), or before each shape's samples (flash3-bench --gap-ms)")
    p.add_argument("--sustained", action="store_true", help="the continuous-load regime instead of idle gaps")
    p.add_argument("--load-s", type=float, default=2.0, help="--sustained: seconds of load before each shape's samples")
    p.add_argument("--no-check", dest="check", action="store_false", help="skip the reference checks")
    p.add_argument("--overhead", action="store_true", help="host time per call instead of the sweep")
    p.add_argument("--calls", type=int, default=10000, help="--overhead: calls per method and mode")
    p.add_argument("--varlen", action="store_true",
                   help="packed sequences instead of the sweep: equal lengths and a log-uniform mix of documents")
    p.add_argument("--decode", action="store_true",
                   help="the decoding sweep instead: one query a sequence against a full KV cache")
    p.add_argument("--decode-batch", type=int_list, default=list(decode_table.BATCHES),
                   help="--decode: batch sizes (default %(default)s)")
    p.add_argument("--decode-cache", type=int_list, default=list(decode_table.CACHES),
                   help="--decode: cache lengths (default %(default)s; shapes over 4M tokens are left out)")
    p.add_argument("--page-size", type=int_list, default=list(decode_table.PAGE_SIZES),
                   help="--decode: page sizes of the paged runs (default %(default)s)")
    p.add_argument("--prefill", action="store_true",
                   help="the chunked prefill sweep instead: a chunk of queries against a KV cache, causal")
    p.add_argument("--prefill-chunk", type=int_list, default=list(prefill_table.CHUNKS),
                   help="--prefill: chunk lengths (default %(default)s)")
    p.add_argument("--prefill-cache", type=int_list, default=list(prefill_table.CACHES),
                   help="--prefill: cache lengths, the chunk's keys included (default %(default)s)")
    p.add_argument("--mla", action="store_true",
                   help="the MLA decoding sweep instead: 128 query heads against one latent KV head")
    p.add_argument("--mla-batch", type=int_list, default=list(mla_table.BATCHES),
                   help="--mla: batch sizes (default %(default)s)")
    p.add_argument("--mla-cache", type=int_list, default=list(mla_table.CACHES),
                   help="--mla: cache lengths (default %(default)s)")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--csv", help="write the results here, one line per shape and method")
    p.add_argument("--plot", help="write a PNG here (paper Figure 5's layout; needs matplotlib)")
    p.add_argument("--from-json", nargs="+", metavar="FILE",
                   help="no measuring: print (and write) the results of saved runs of one regime")
    args = p.parse_args(argv)
    if args.dtype == "e4m3" and not (args.varlen and args.passes == "fwd"):
        p.error("--dtype e4m3: with --varlen --pass fwd only (the FP8 path is forward only; its sweep beside "
                "the 16-bit kernels is flash3-bench --dtype e4m3's)")
    unknown = [m for m in args.methods if m not in sweep.METHODS]
    if unknown:
        p.error(f"--methods: unknown {','.join(unknown)}; known: {','.join(sweep.METHODS)}")
    if args.varlen and not all(isinstance(d, int) for d in args.hdim):
        p.error("--hdim: --varlen takes head dims D (no V head dim of its own)")
    return args


def regime_of(args):
    if args.sustained:
        return {"name": "sustained", "load_s": args.load_s}
    return {"name": "gap", "gap_ms": args.gap_ms, "scope": args.gap_scope}


def print_table(table, notes):
    """A Markdown table after a blank line, then its notes, if any, after another."""
    print()
    print(table)
    if notes:
        print("\n" + "\n".join(notes))


def report(meta, results, args):
    print(sweep.format_header(meta))
    for name, why in meta.get("not_run", {}).items():
        print(f"not run: {sweep.METHODS[name]}: {why}")
    print_table(sweep.format_table(results), sweep.format_notes(results))
    if args.json:
        sweep.write_json(args.json, meta, results)
    if args.csv:
        sweep.write_csv(args.csv, meta, results)
    if args.plot:
        title = f"{meta.get('device', {}).get('name', 'GPU')}\n{sweep.regime_label(meta['regime'])}"
        why_not = write_plot(results, sweep.METHODS, title, args.plot)
        print(f"\nplot: {why_not or args.plot}", file=sys.stderr if why_not else sys.stdout)


def software(torch):
    versions = {"python": sys.version.split()[0], "torch": torch.__version__, "cuda": torch.version.cuda,
                "cudnn": torch.backends.cudnn.version()}
    for module in ("flash3", "flash_attn_interface", "flash_attn"):
        loaded = sys.modules.get(module)
        if loaded is not None:
            versions[module] = getattr(loaded, "__version__", "?")
    return versions


def describe_device(torch, telemetry):
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return {"name": props.name, "sms": props.multi_processor_count, "uuid": str(props.uuid),
            **telemetry.snapshot()}


def measure_one(torch, timer, method, shape, inputs, check_first):
    """The record of one method on one shape: checked, then timed."""
    with recording_warnings() as caught, method.context():
        try:
            stats, failure = check(torch, method, shape, inputs) if check_first else ({}, None)
            if failure:
                return sweep.failed_result(shape, method.name, failure, stats)
            samples, telemetry = timer.measure(workload(torch, method, shape, inputs))
            return sweep.ok_result(shape, method.name, samples, stats, telemetry)
        except Exception as e:  # no kernel for the shape, out of memory: the reason goes into the table's notes
            reason = failure_reason(caught, e)
            if method.name == "flash3":
                return sweep.failed_result(shape, method.name, reason)
            return sweep.na_result(shape, method.name, reason)


def run_sweep(torch, args):
    methods, missing = load_methods(torch, args.methods)
    if not methods:
        print(f"flash3.benchmark: none of the methods runs here: {missing}", file=sys.stderr)
        return 1
    telemetry = Telemetry(torch)
    timer = Timer(torch, regime_of(args), args.reps, telemetry)
    meta = {"tool": "python -m flash3.benchmark", "argv": sys.argv[1:],
            "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "regime": regime_of(args), "timer": timer.description(), "telemetry": telemetry.source,
            "check": (f"against a float32 reference on batch 0, heads 0-{CHECK_HEADS - 1}, every shape: "
                      "|x - ref| <= 2 |low - ref| + eps, low = the same reference in the inputs' precision")
            if args.check else "none (--no-check)",
            "device": describe_device(torch, telemetry), "software": software(torch),
            "methods": {name: sweep.METHODS[name] for name in methods}, "not_run": missing}
    passes = sweep.PASSES if args.passes == "all" else (args.passes,)
    causal = {"0": (False,), "1": (True,), "both": (False, True)}[args.causal]
    shapes = sweep.paper_sweep(passes, args.hdim, args.seqlen, causal, args.dtype, args.tokens, args.hidden)
    results = []
    for i, shape in enumerate(shapes):
        print(f"[{i + 1}/{len(shapes)}] {sweep.shape_label(shape)}", file=sys.stderr)
        inputs = make_inputs(torch, shape, seed=1000 + 17 * i)
        # Who goes first changes from shape to shape, so that no method always follows the same one.
        for method in sweep.rotated(list(methods.values()), i):
            results.append(measure_one(torch, timer, method, shape, inputs, args.check))
        del inputs
        torch.cuda.empty_cache()
    meta["device_end"] = telemetry.snapshot()
    report(meta, results, args)
    return 1 if any(r["status"] == "failed" for r in results) else 0


def run_overhead(torch, args):
    methods, missing = load_methods(torch, args.methods)
    results = overhead.measure(torch, methods, args.calls)
    verdicts = sweep.overhead_verdicts(results, overhead.VERDICT_MODES)
    device = describe_device(torch, Telemetry(torch))
    print(f"device: {device['name']}")
    print(f"host time per call, microseconds, median (p10-p90) of {args.calls} calls; shape {overhead.TINY}")
    for name, why in missing.items():
        print(f"not run: {sweep.METHODS[name]}: {why}")
    print()
    print(sweep.format_overhead(results, overhead.MODES))
    print()
    for mode in overhead.VERDICT_MODES:
        if mode not in verdicts:
            print(f"{mode}: no verdict, flash3 and SDPA FlashAttention-2 do not both have a time")
            continue
        print(f"{mode}: flash3 {results['flash3'][mode]['median_us']:.1f} us, SDPA FlashAttention-2 "
              f"{results['sdpa_flash'][mode]['median_us']:.1f} us: {'ok' if verdicts[mode] else 'flash3 SLOWER'}")
    # The decoding step, reported beside (issue 35's inference path; no verdict).
    decoding = overhead.measure_decode(torch, args.calls)
    print()
    print(sweep.format_overhead(decoding, (overhead.DECODE_MODE,)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"tool": "python -m flash3.benchmark --overhead", "device": device, "software": software(torch),
                       "shape": overhead.TINY, "calls": args.calls, "overhead": results, "verdicts": verdicts,
                       "decode_cache": overhead.DECODE_CACHE, "decode_overhead": decoding,
                       "not_run": missing}, f, indent=1)
    ok = len(verdicts) == len(overhead.VERDICT_MODES) and all(verdicts.values())
    return 0 if ok else 1


def run_varlen(torch, args):
    telemetry = Telemetry(torch)
    timer = Timer(torch, regime_of(args), args.reps, telemetry)
    print(f"device: {describe_device(torch, telemetry)['name']}; regime: {sweep.regime_label(regime_of(args))}; "
          f"timer: {timer.description()}")
    rows = varlen.run(torch, timer, args, sys.stderr)
    print(varlen.format_table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"tool": "python -m flash3.benchmark --varlen", "argv": sys.argv[1:],
                       "device": describe_device(torch, telemetry), "software": software(torch),
                       "regime": regime_of(args), "timer": timer.description(), "rows": rows}, f, indent=1)
    return 0


def run_table(torch, args, mode, about, run, format_table, format_notes):
    """One sweep of its own (--decode, --prefill): the device and regime, `about` (its shapes and measure),
    run(torch, timer, args, progress)'s rows as a table with its notes, and the JSON; returns the rows."""
    telemetry = Telemetry(torch)
    timer = Timer(torch, regime_of(args), args.reps, telemetry)
    device = describe_device(torch, telemetry)
    print(f"device: {device['name']}; regime: {sweep.regime_label(regime_of(args))}; timer: {timer.description()}")
    print(about)
    rows = run(torch, timer, args, sys.stderr)
    print_table(format_table(rows), format_notes(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"tool": f"python -m flash3.benchmark {mode}", "argv": sys.argv[1:], "device": device,
                       "software": software(torch), "regime": regime_of(args), "timer": timer.description(),
                       "rows": rows}, f, indent=1)
    return rows


def run_decode(torch, args):
    rows = run_table(torch, args, "--decode",
                     f"decoding: seqlen_q 1, {decode_table.HEADS_KV * decode_table.GROUP} query heads, "
                     f"{decode_table.HEADS_KV} KV heads, head dim {decode_table.HDIM}, bf16; GB/s of K and V read once",
                     decode.run, decode_table.format_table, decode_table.format_notes)
    return 1 if any(name.startswith("flash3") for r in rows for name in r["not_run"]) else 0


def run_prefill(torch, args):
    rows = run_table(torch, args, "--prefill",
                     f"chunked prefill: batch {prefill.BATCH}, {prefill_table.HEADS_KV * prefill_table.GROUP} query "
                     f"heads, {prefill_table.HEADS_KV} KV heads, head dim {prefill_table.HDIM}, bf16, causal "
                     "(bottom-right); TFLOP/s of the visited pairs",
                     prefill.run, prefill_table.format_table, prefill_table.format_notes)
    return 1 if any(r["not_run"] for r in rows) else 0


def run_mla(torch, args):
    rows = run_table(torch, args, "--mla",
                     f"MLA decoding: seqlen_q 1, {mla_table.HEADS_Q} query heads, {mla_table.HEADS_KV} latent KV head, "
                     f"head dims {mla_table.HDIM} + {mla_table.HDIM_V} (qv), bf16; TFLOP/s and TB/s of the cache "
                     "read once",
                     mla.run, mla_table.format_table, mla_table.format_notes)
    return 1 if any(name.startswith("flash3") for r in rows for name in r["not_run"]) else 0


def main(argv=None):
    args = parse_args(argv)
    if args.from_json:
        try:
            meta, results = sweep.merge_runs([sweep.read_json(path) for path in args.from_json])
        except ValueError as e:
            print(f"flash3.benchmark: {e}", file=sys.stderr)
            return 1
        report(meta, results, args)
        return 0
    try:
        import torch
    except ImportError as e:
        print(f"flash3.benchmark: needs PyTorch ({e})", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("flash3.benchmark: no CUDA device; the benchmark needs a Hopper GPU (H100/H200). "
              "--from-json prints saved results anywhere.", file=sys.stderr)
        return 2
    if args.overhead:
        return run_overhead(torch, args)
    if args.decode:
        return run_decode(torch, args)
    if args.prefill:
        return run_prefill(torch, args)
    if args.mla:
        return run_mla(torch, args)
    return run_varlen(torch, args) if args.varlen else run_sweep(torch, args)


if __name__ == "__main__":
    sys.exit(main())
