"""GPU timing: the median of CUDA-event-timed calls after a warm-up."""

import statistics


def median_ms(fn, reps=20, warmup=3, inner=1):
    """Median milliseconds of ``fn(i)`` (i = 0, 1, ...: lets callers rotate inputs), each call
    between two CUDA events on the default stream, after ``warmup`` untimed calls. With
    ``inner`` > 1, ``inner`` back-to-back calls go between the events and the time is divided
    by ``inner``: the cost of an op in a stream of ops (host work overlapping the GPU's), not
    of one call from an idle start."""
    from numba import cuda
    for i in range(warmup):
        fn(i)
    times = []
    for i in range(reps):
        start, stop = cuda.event(), cuda.event()
        start.record()
        for j in range(inner):
            fn(i * inner + j)
        stop.record()
        stop.synchronize()
        times.append(cuda.event_elapsed_time(start, stop) / inner)
    return statistics.median(times)
