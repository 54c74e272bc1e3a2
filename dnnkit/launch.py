"""Kernel launches.

Numba warns (NumbaPerformanceWarning) about every grid of fewer than 128 blocks. For a library
that warning is noise: small tensors need small grids, and the user cannot act on it. So small
launches build their launch configuration with that one warning silenced; large launches are
left alone (the filter change is process-wide while it lasts, so keep it short and rare).
"""

import warnings

_QUIET_BELOW = 128


def _blocks(grid):
    if isinstance(grid, int):
        return grid
    n = 1
    for g in grid:
        n *= g
    return n


def launch(kernel, grid, block, stream, args, shared=0):
    """``kernel[grid, block, stream, shared](*args)`` without Numba's small-grid warning."""
    if _blocks(grid) >= _QUIET_BELOW:
        kernel[grid, block, stream, shared](*args)
        return
    with warnings.catch_warnings():
        # Matched by message alone: numba-cuda raises its own copy of NumbaPerformanceWarning
        # (not numba.core.errors'), wrapped in terminal colour codes, hence the leading ".*".
        warnings.filterwarnings("ignore", message=r".*Grid size \d+ will likely result in GPU "
                                "under-utilization")
        configured = kernel[grid, block, stream, shared]
    configured(*args)
