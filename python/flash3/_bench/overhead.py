"""Host overhead per call: the time from the Python call to its return, on a
tiny shape, so that what is measured is the Python and launch path, not the
GPU. The median of `calls` calls per method and mode. Besides the forward's
modes, a decoding step: the decode sweep's smallest shape (decode.py), flash3's
flash_attn_with_kvcache beside SDPA's backends on it.
"""
import contextlib
import gc
import statistics
import time

from . import decode
from .methods import failure_reason, recording_warnings

TINY = {"batch": 1, "seqlen": 128, "heads": 8, "hdim": 128, "dtype": "bf16", "causal": False}
MODES = ("fwd", "fwd, inputs requiring grad", "bwd (autograd.grad)")
# The requirement is on the forward call; the backward through autograd is reported beside it.
VERDICT_MODES = MODES[:2]
# A decoding step (seqlen_q 1, GQA 32 / 8, head dim 128, a full cache of DECODE_CACHE keys), and the
# methods of the decode sweep that have one call per step.
DECODE_CACHE = 1024
DECODE_MODE = f"decode step (1 x {DECODE_CACHE} KV cache)"
DECODE_METHODS = ("flash3", "sdpa_flash", "sdpa_cudnn", "fa3")
WARMUP_CALLS = 200
# The methods and modes take turns, BLOCK calls each, with a synchronization
# after each turn (untimed) that keeps the GPU's queue from filling, where a
# launch would wait for the GPU. Taking turns gives every method the same
# host conditions: a shared machine's host time per call drifts from minute
# to minute, which timing one method after the other would charge to
# whichever ran in the slow minute.
BLOCK = 100


def _summary(samples):
    deciles = statistics.quantiles(samples, n=10)
    return {"median_us": statistics.median(samples) / 1e3, "p10_us": deciles[0] / 1e3, "p90_us": deciles[-1] / 1e3}


def interleaved_times(torch, jobs, calls):
    """{key: {median_us, p10_us, p90_us}} of each job (context, timed, setup):
    timed(setup()) with only timed timed, the jobs in turns of BLOCK calls,
    `calls` calls each; the garbage collector off meanwhile."""
    for context, timed, setup in jobs.values():
        with context():
            for _ in range(WARMUP_CALLS):
                timed(setup())
    torch.cuda.synchronize()
    samples = {key: [] for key in jobs}
    gc.collect()
    gc.disable()
    try:
        for _ in range(max(1, calls // BLOCK)):
            for key, (context, timed, setup) in jobs.items():
                times = samples[key]
                with context():
                    for _ in range(BLOCK):
                        arg = setup()
                        start = time.perf_counter_ns()
                        timed(arg)
                        times.append(time.perf_counter_ns() - start)
                torch.cuda.synchronize()
    finally:
        gc.enable()
    return {key: _summary(times) for key, times in samples.items()}


def tiny_inputs(torch, method, requires_grad):
    """Contiguous q, k, v of the tiny shape in the method's own layout, as its callers hold them."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    b, s, h, d = TINY["batch"], TINY["seqlen"], TINY["heads"], TINY["hdim"]
    size = (b, h, s, d) if method.layout == "bhsd" else (b, s, h, d)
    return [torch.randn(size, generator=gen, device="cuda", dtype=torch.bfloat16).requires_grad_(requires_grad)
            for _ in range(3)]


def method_jobs(torch, method):
    """{mode: (timed, setup)} of one method."""
    causal = TINY["causal"]
    q, k, v = tiny_inputs(torch, method, False)
    qg, kg, vg = tiny_inputs(torch, method, True)
    dout = torch.randn_like(q)
    none = lambda: None  # noqa: E731
    return {
        MODES[0]: (lambda _: method.call(q, k, v, causal), none),
        MODES[1]: (lambda _: method.call(qg, kg, vg, causal), none),
        MODES[2]: (lambda out: torch.autograd.grad(out, (qg, kg, vg), dout), lambda: method.call(qg, kg, vg, causal)),
    }


def measure(torch, methods, calls):
    """{method: {mode: times}}, or {method: {"na": why}} where a method cannot
    run the tiny shape (found by one trial call of each mode)."""
    results, jobs = {}, {}
    for name, method in methods.items():
        with recording_warnings() as caught, method.context():
            try:
                modes = method_jobs(torch, method)
                for timed, setup in modes.values():
                    timed(setup())
            except Exception as e:  # no kernel for the tiny shape: reported as n/a with the reason
                results[name] = {"na": failure_reason(caught, e)}
                continue
        results[name] = {}
        for mode, (timed, setup) in modes.items():
            jobs[(name, mode)] = (method.context, timed, setup)
    for (name, mode), times in interleaved_times(torch, jobs, calls).items():
        results[name][mode] = times
    return results


def measure_decode(torch, calls):
    """{method: {DECODE_MODE: times}}, or {method: {"na": why}}, of the decode
    sweep's methods on one decoding step."""
    q, k, v = decode.inputs(torch, 1, DECODE_CACHE)
    results, jobs = {}, {}
    for name, make, _ in decode.methods_of(torch, q, k, v, (), seed=0):
        if name not in DECODE_METHODS:
            continue
        with recording_warnings() as caught:
            try:
                call = make()
                call()
            except Exception as e:  # not importable, or no kernel: reported as n/a with the reason
                results[name] = {"na": failure_reason(caught, e)}
                continue
        results[name] = {}
        jobs[(name, DECODE_MODE)] = (contextlib.nullcontext, lambda _, call=call: call(), lambda: None)
    for (name, mode), times in interleaved_times(torch, jobs, calls).items():
        results[name][mode] = times
    return results
