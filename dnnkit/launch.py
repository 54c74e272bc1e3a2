"""Kernel launches.

Numba warns (NumbaPerformanceWarning) about every grid of fewer than 128 blocks. For a library
that warning is noise: small tensors need small grids, and the user cannot act on it. So small
launches build their launch configuration with that one warning silenced; large launches are
left alone (the filter change is process-wide while it lasts, so keep it short and rare).

Building a launch configuration (``kernel[grid, block, stream, shared]``) costs tens of
microseconds of host time in Numba; configurations are reusable, so they are cached by
(kernel, grid, block, stream, shared). The cache is bounded and simply emptied when full.
"""

import threading
import warnings

_QUIET_BELOW = 128
_CACHE_MAX = 1024
_cache = {}
_lock = threading.Lock()


def pow2_at_most(v, cap):
    """The smallest power of two >= v, but at most ``cap`` (block-dimension sizing)."""
    p = 1
    while p < v and p < cap:
        p *= 2
    return p


def _blocks(grid):
    if isinstance(grid, int):
        return grid
    n = 1
    for g in grid:
        n *= g
    return n


def launch(kernel, grid, block, stream, args, shared=0):
    """``kernel[grid, block, stream, shared](*args)`` without Numba's small-grid warning."""
    from .arrays import stream_pointer
    # By the raw stream handle: Numba hands out a new Stream object for the same stream.
    key = (id(kernel), grid, block, stream_pointer(stream), shared)
    configured = _cache.get(key)
    if configured is None:
        configured = _configure(kernel, grid, block, stream, shared)
        if configured is kernel:
            # Numba's simulator configures the kernel object in place and returns it: a cached
            # entry would replay whatever configuration was set last. Never cache those.
            configured(*args)
            return
        with _lock:
            if len(_cache) >= _CACHE_MAX:
                _cache.clear()
            _cache[key] = configured
    configured(*args)


def _configure(kernel, grid, block, stream, shared):
    if _blocks(grid) >= _QUIET_BELOW:
        return kernel[grid, block, stream, shared]
    with warnings.catch_warnings():
        # Matched by message alone: numba-cuda raises its own copy of NumbaPerformanceWarning
        # (not numba.core.errors'), wrapped in terminal colour codes, hence the leading ".*".
        warnings.filterwarnings("ignore", message=r".*Grid size \d+ will likely result in GPU "
                                "under-utilization")
        return kernel[grid, block, stream, shared]
