"""GPU timing: the median of CUDA-event-timed calls after a warm-up."""

import statistics


def median_ms(fn, reps=20, warmup=3):
    """Median milliseconds of ``fn(i)`` (i = 0, 1, ...: lets callers rotate inputs), each call
    between two CUDA events on the default stream, after ``warmup`` untimed calls."""
    from numba import cuda
    for i in range(warmup):
        fn(i)
    times = []
    for i in range(reps):
        start, stop = cuda.event(), cuda.event()
        start.record()
        fn(i)
        stop.record()
        stop.synchronize()
        times.append(cuda.event_elapsed_time(start, stop))
    return statistics.median(times)
