"""Timing with CUDA events: warm-up, then >= 30 runs, median and p10/p90, with the L2 flushed
before each run (a 256 MiB memset) or left warm."""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import numpy as np

FLUSH_BYTES = 256 * 2**20


def _cp():
    import cupy
    return cupy


class L2Flusher:
    def __init__(self, nbytes: int = FLUSH_BYTES):
        cp = _cp()
        self.buf = cp.empty((nbytes,), dtype=cp.uint8)
        self.n = 0

    def __call__(self, stream):
        cp = _cp()
        self.n += 1
        cp.cuda.runtime.memsetAsync(self.buf.data.ptr, self.n & 0xFF, self.buf.nbytes, stream.ptr)


@dataclass
class Timing:
    median_s: float
    p10_s: float
    p90_s: float
    min_s: float
    runs: int
    host_s: float = 0.0     # median host time of run(): the launches' issue
    samples_s: tuple = ()   # every run's GPU time and host time, in order
    host_samples_s: tuple = ()

    @staticmethod
    def of(samples: list[float], host: list[float] | None = None) -> "Timing":
        a = np.asarray(samples)
        return Timing(float(np.median(a)), float(np.percentile(a, 10)), float(np.percentile(a, 90)),
                      float(a.min()), len(samples), float(np.median(host)) if host else 0.0,
                      tuple(samples), tuple(host or ()))


def time_runs(run, pre, after, stream, runs: int = 30, warmup: int = 3, flush: L2Flusher | None = None,
              poison_every: bool = True, host_start: bool = False, each=None) -> Timing:
    """`pre()` (poison, reset) and the flush happen before the start event; `after()` checks
    each run (raising on a pipeline error) after the end event.

    host_start: the host waits for the flush before it records the start event, so that it
    starts issuing with the GPU. Eager launches need it: their model is the host's issue
    timeline from an idle GPU, and behind the flush (a 256 MiB memset, ~91 us on an H100) the
    host would issue a run's first calls early, how many of them depending on the machine's
    host speed (dlrm-top-mlp's cuBLAS baseline: 249 us measured so, 345 from an idle GPU with
    339 us of host issue; bench/eager_probe.py). A CUDA graph or a single kernel is timed from
    the GPU's start either way."""
    cp = _cp()
    start, end = cp.cuda.Event(), cp.cuda.Event()
    for _ in range(warmup):
        pre(poison_every)
        run(stream)
        stream.synchronize()
        after()
    samples, host = [], []
    for _ in range(runs):
        pre(poison_every)
        if flush is not None:
            flush(stream)
        if host_start:
            stream.synchronize()
        start.record(stream)
        t0 = time.perf_counter()
        run(stream)
        host.append(time.perf_counter() - t0)
        end.record(stream)
        end.synchronize()
        after()
        samples.append(cp.cuda.get_elapsed_time(start, end) * 1e-3)
        if each is not None:    # each(seconds) after every timed run, its checks done
            each(samples[-1])
    return Timing.of(samples, host)


def outside_span_s(v, elapsed_s: float) -> float | None:
    """A persistent kernel's time outside its workers' span in a run timed `elapsed_s` by CUDA
    events (time_runs' `each`): less the first worker's start to the last worker's end
    (%globaltimer, `placement["kernel_begin_ns"/"kernel_end_ns"]`), what remains is its launch,
    first CTA start, last CTA exit and the end event. None where the variant records no span."""
    pl = getattr(v, "placement", None) or {}
    if "kernel_end_ns" not in pl:
        return None
    return elapsed_s - (pl["kernel_end_ns"] - pl["kernel_begin_ns"]) * 1e-9


def median(xs):
    return statistics.median(xs)
