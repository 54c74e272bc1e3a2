"""GPU timing: the median of CUDA-event-timed calls after a warm-up."""

import statistics

from .device import numba_cuda


def median_ms(fn, reps=20, warmup=3, inner=1):
    """Median milliseconds of ``fn(i)`` (i = 0, 1, ...: lets callers rotate inputs), each call
    between two CUDA events on the default stream, after ``warmup`` untimed calls. With
    ``inner`` > 1, ``inner`` back-to-back calls go between the events and the time is divided
    by ``inner``: the cost of an op in a stream of ops (host work overlapping the GPU's), not
    of one call from an idle start."""
    return median_ms_each({0: fn}, reps, warmup, inner)[0]


def median_ms_each(fns, reps=20, warmup=3, inner=1):
    """``{name: median_ms(fns[name], ...)}``, the samples interleaved: each of the ``reps``
    rounds times every function once, in turn. Drift of the machine over a run (the clocks,
    the host's load: a host-bound call's time moved 20% between runs of one report on an
    H100) then falls on every function alike, and the ratios between them, which is what a
    side-by-side comparison reads, stay put."""
    cuda = numba_cuda()
    for fn in fns.values():
        for i in range(warmup):
            fn(i)
    times = {name: [] for name in fns}
    for i in range(reps):
        for name, fn in fns.items():
            start, stop = cuda.event(), cuda.event()
            start.record()
            for j in range(inner):
                fn(i * inner + j)
            stop.record()
            stop.synchronize()
            times[name].append(start.elapsed_time(stop) / inner)
    return {name: statistics.median(t) for name, t in times.items()}
