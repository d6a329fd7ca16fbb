"""Host overhead per call: the time from the Python call to its return, on a
tiny shape, so that what is measured is the Python and launch path, not the
GPU. The median of `calls` calls per method and mode.
"""
import gc
import statistics
import time

from .methods import failure_reason, recording_warnings

TINY = {"batch": 1, "seqlen": 128, "heads": 8, "hdim": 128, "dtype": "bf16", "causal": False}
MODES = ("fwd", "fwd, inputs requiring grad", "bwd (autograd.grad)")
# The requirement is on the forward call; the backward through autograd is reported beside it.
VERDICT_MODES = MODES[:2]
WARMUP_CALLS = 200
# A synchronization every SYNC_EVERY calls (outside the timed spans) keeps the
# GPU's queue from filling, where a launch would wait for the GPU.
SYNC_EVERY = 100


def host_times(torch, calls, timed, setup=lambda: None):
    """{median_us, p10_us, p90_us} of timed(setup()), timing only timed; the garbage collector off meanwhile."""
    for _ in range(WARMUP_CALLS):
        timed(setup())
    torch.cuda.synchronize()
    gc.collect()
    gc.disable()
    try:
        samples = []
        for i in range(calls):
            arg = setup()
            start = time.perf_counter_ns()
            timed(arg)
            samples.append(time.perf_counter_ns() - start)
            if i % SYNC_EVERY == SYNC_EVERY - 1:
                torch.cuda.synchronize()
    finally:
        gc.enable()
    deciles = statistics.quantiles(samples, n=10)
    return {"median_us": statistics.median(samples) / 1e3, "p10_us": deciles[0] / 1e3, "p90_us": deciles[-1] / 1e3}


def tiny_inputs(torch, method, requires_grad):
    """Contiguous q, k, v of the tiny shape in the method's own layout, as its callers hold them."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    b, s, h, d = TINY["batch"], TINY["seqlen"], TINY["heads"], TINY["hdim"]
    size = (b, h, s, d) if method.layout == "bhsd" else (b, s, h, d)
    return [torch.randn(size, generator=gen, device="cuda", dtype=torch.bfloat16).requires_grad_(requires_grad)
            for _ in range(3)]


def measure_method(torch, method, calls):
    """{mode: times} for one method, or {"na": why} where it cannot run the tiny shape."""
    causal = TINY["causal"]
    q, k, v = tiny_inputs(torch, method, False)
    qg, kg, vg = tiny_inputs(torch, method, True)
    dout = torch.randn_like(q)
    with recording_warnings() as caught, method.context():
        try:
            return {
                MODES[0]: host_times(torch, calls, lambda _: method.call(q, k, v, causal)),
                MODES[1]: host_times(torch, calls, lambda _: method.call(qg, kg, vg, causal)),
                MODES[2]: host_times(torch, calls, lambda out: torch.autograd.grad(out, (qg, kg, vg), dout),
                                     setup=lambda: method.call(qg, kg, vg, causal)),
            }
        except Exception as e:  # no kernel for the tiny shape: reported as n/a with the reason
            return {"na": failure_reason(caught, e)}


def measure(torch, methods, calls):
    return {name: measure_method(torch, method, calls) for name, method in methods.items()}
