"""Launch sizes shared by the Numba convolution paths (ops/conv_numba.py, ops/conv_winograd.py)
and the split GEMMs of matmul and linear (ops/gemm_split.py): elementwise blocks, the GPU's
wave of GEMM blocks, the GEMM's block count, the split rule. Read at call time from the device
(cached by dnnkit/device.py)."""

import functools
import math

from .. import device
from . import gemm

# An H100's (and H200's) multiprocessors: the GPU the launch rules were measured on.
H100_SMS = 132
# The multiprocessor count the split rules assume on Numba's simulator: an H100's. The
# simulator's one multiprocessor would make every launch a full last wave, so the rules would
# never split there and the tests would not walk the split paths a GPU takes.
SIMULATED_SMS = H100_SMS
GEMM_BLOCKS_PER_SM = 2      # the GEMM's resident blocks per SM (kernels/gemm.py's tiles)


def elem_threads():
    """Threads per block of the elementwise kernels (im2col, col2im, partial sums, Winograd
    transforms): 256; 32 on the simulator, which runs a Python thread per CUDA thread."""
    return 32 if device.simulator() else 256


def columns_grid(cols, rows):
    """(grid, threads) of a kernel whose threads walk ``cols`` columns (positions, or (image,
    position) pairs) across x and ``rows`` (channels, planes) across y, grid-stride both: as
    many row blocks as make about 8 blocks per SM, each thread decoding its column once for
    every row it visits (im2col, col2im, the depthwise kernels)."""
    threads = elem_threads()
    xb = -(-cols // threads)
    return (xb, max(1, min(rows, -(-8 * sm_count() // xb)))), threads


def sm_count():
    """The device's multiprocessor count (SIMULATED_SMS on the simulator)."""
    return SIMULATED_SMS if device.simulator() else device.sm_count()


def wave_blocks():
    """GEMM blocks that run at once: one wave (264 on an H100 or H200, 132 SMs)."""
    return GEMM_BLOCKS_PER_SM * sm_count()


def gemm_blocks(m, n, batch):
    """Blocks of the GEMM's launch for an m x n product ``batch`` times (its tile
    configuration depends on the batch too: ops/gemm.py)."""
    return math.prod(gemm.launch_grid(m, n, batch)[1])


def fill_parts(m, n, groups, total, top):
    """The number of parts p (a divisor of ``total``, at most ``top``) of an m x n GEMM per
    group whose groups * p batch of blocks fills its last wave best (:func:`wave_blocks` per
    wave); ties within 0.02 go to more parts (shorter blocks balance better), and 1 unless a
    split fills 0.02 more. The split rule of the convolution's forward and filter gradient
    (ops/conv_numba.py) and of matmul and linear (ops/gemm_split.py); every call asks:
    remembered per shape (and per simulator/GPU and its wave, whose tiles and sizes differ)."""
    return _fill_parts_of(m, n, groups, total, top, device.simulator(), wave_blocks())


@functools.lru_cache(maxsize=1024)
def _fill_parts_of(m, n, groups, total, top, _simulator, wave):
    fills = {}
    for p in range(1, max(1, top) + 1):
        if total % p == 0:
            b = gemm_blocks(m, n, groups * p)
            fills[p] = b / (-(-b // wave) * wave)
    best = max(fills.values())
    if best <= fills[1] + 0.02:
        return 1
    return max(p for p, fill in fills.items() if fill >= best - 0.02)
