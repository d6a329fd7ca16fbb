"""Times a callable on the GPU the same way for every method, as flash3-bench
times flash3: before each sample a 256 MB write flushes the L2, CUDA events
bracket the call, and the median of the samples is reported.

The host never makes a sample wait for it: each sample is queued behind GPU
work (the previous sample, the load, or a spin of HOLD_CYCLES), so the events time
the call on the GPU, not the host's submission of it.

Regimes (the power-capped card's clock follows its recent load):
  {"name": "gap", "gap_ms": G, "scope": "sample"}  the GPU idle G ms before every sample
  {"name": "gap", "gap_ms": G, "scope": "shape"}   idle G ms, then the shape's samples back to back
                                                   (flash3-bench --gap-ms G)
  {"name": "sustained", "load_s": S}               each shape run back to back for S seconds
                                                   (with the flushes), then ENERGY_S seconds more
                                                   without them, whose energy per call the card's
                                                   counter gives (joules), then its samples
"""
import collections
import time

FLUSH_BYTES = 256 << 20  # flash3-bench's: five times an H100's L2
# The spin before a sample after an idle gap, flash3-bench's: about 2 ms at
# full clock and longer while the clock rises from idle, so that the sample
# starts queued (far above the host's time to queue one) and at full clock.
# Counted in cycles, not calibrated: a rate measured at a low clock makes
# the spin too short for either.
HOLD_CYCLES = 4_000_000
WARMUP_CALLS = 3
LOAD_QUEUE_DEPTH = 8  # calls the host may run ahead of the GPU while loading it
# The sustained regime's energy window: the card's energy counter, read before
# and after this long a run of back-to-back calls, gives joules per call (the
# counter updates every few tens of ms: a second keeps its steps small). No
# flushes there, whose writes would count as the call's.
ENERGY_S = 1.0


class Timer:
    def __init__(self, torch, regime, reps, telemetry):
        self.torch = torch
        self.regime = regime
        self.reps = reps
        self.telemetry = telemetry
        self.flush_buffer = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")

    def description(self):
        energy = (f"; joules per call from the card's energy counter over {ENERGY_S:g} s of calls back to back "
                  "(no flushes), after the load" if self.regime["name"] == "sustained" else "")
        return (f"CUDA events around each call, a {FLUSH_BYTES >> 20} MB write before each sample (L2 flush), "
                f"median of {self.reps} samples after {WARMUP_CALLS} warm-up calls{energy}")

    def _event(self):
        return self.torch.cuda.Event(enable_timing=True)

    def _hold(self):
        self.torch.cuda._sleep(HOLD_CYCLES)

    def _idle(self):
        self.torch.cuda.synchronize()
        time.sleep(self.regime["gap_ms"] / 1e3)

    def _sample(self, fn):
        start, end = self._event(), self._event()
        self.flush_buffer.zero_()
        start.record()
        fn()
        end.record()
        return start, end

    def _load(self, fn, seconds, flush=True):
        """Runs fn (each call after a flush, as the samples, unless not flush) back to back for at least
        `seconds` of GPU time; returns the number of calls."""
        deadline = time.perf_counter() + seconds
        marks = collections.deque()
        calls = 0
        while time.perf_counter() < deadline:
            if flush:
                self.flush_buffer.zero_()
            fn()
            calls += 1
            mark = self.torch.cuda.Event()
            mark.record()
            marks.append(mark)
            # Waiting only on a call LOAD_QUEUE_DEPTH back keeps the GPU's queue from ever running dry.
            if len(marks) > LOAD_QUEUE_DEPTH:
                marks.popleft().synchronize()
        return calls

    def _energy(self, fn):
        """{"joules": energy per call} over ENERGY_S seconds of fn back to back, or {} without a counter."""
        self.torch.cuda.synchronize()
        start = self.telemetry.energy_mj()
        if start is None:
            return {}
        calls = self._load(fn, ENERGY_S, flush=False)
        self.torch.cuda.synchronize()
        end = self.telemetry.energy_mj()
        return {"joules": (end - start) / 1e3 / calls} if end is not None and calls else {}

    def measure(self, fn):
        """The sample times of fn in ms, and the telemetry read while the last samples ran (with the
        sustained regime's joules per call)."""
        for _ in range(WARMUP_CALLS):
            fn()
        energy = {}
        if self.regime["name"] == "sustained":
            self._load(fn, self.regime["load_s"])
            energy = self._energy(fn)
            events = [self._sample(fn) for _ in range(self.reps)]
        elif self.regime["scope"] == "shape":
            self._idle()
            self._hold()
            events = [self._sample(fn) for _ in range(self.reps)]
        else:
            events = []
            for _ in range(self.reps):
                self._idle()
                self._hold()
                events.append(self._sample(fn))
        telemetry = {**self.telemetry.sample(), **energy}
        self.torch.cuda.synchronize()
        return [start.elapsed_time(end) for start, end in events], telemetry
