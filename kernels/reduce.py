"""Sums over axes (sum, mean, sum_to): y[o] = scale * sum over r of x[offset(o) + offset(r)].

The ops describe x as two C-order walks, after merging adjacent axes that are reduced alike:
the kept axes (y's elements, in y's C order) and the reduced axes, each with x's element
strides.

geo = (nk, nr, kept_shape[MAXDIM], kept_strides[MAXDIM], red_shape[MAXDIM],
red_strides[MAXDIM]): 34 int64 (nk, nr >= 1: a walk of no axes is one axis of size 1).

Deterministic: no atomics; every output (or part of one) is summed in a fixed order by one
column of a block.
"""

from numba import cuda, uint64

from .bounds import inlined
from .common import REDUCE_SUM, block_reduce

MAXDIM = 8
K_SHAPE, K_STRIDES = 2, 2 + MAXDIM
R_SHAPE, R_STRIDES = 2 + 2 * MAXDIM, 2 + 3 * MAXDIM
GEO_LEN = 2 + 4 * MAXDIM


@inlined
def kept_offset(o, geo):
    """x's element offset of output o: o's C-order coordinates over the kept axes times
    their strides (one axis needs no division)."""
    off = 0
    for k in range(geo[0] - 1, 0, -1):
        n = geo[K_SHAPE + k]
        off += (o % n) * geo[K_STRIDES + k]
        o //= n
    return off + o * geo[K_STRIDES]


@inlined
def reduced_offset(r, geo):
    """The element offset of reduced position r (as kept_offset, over the reduced axes)."""
    off = 0
    for k in range(geo[1] - 1, 0, -1):
        n = geo[R_SHAPE + k]
        off += (r % n) * geo[R_STRIDES + k]
        r //= n
    return off + r * geo[R_STRIDES]


@cuda.jit(cache=True)
def reduce_fwd_kernel(x, y, scale, count, parts, geo, acc):
    """y[v] = scale * the sum of x over part p of output o's ``count`` reduced positions,
    v = o * parts + p: with parts = 1 the sums themselves; with parts > 1 the first pass of a
    two-pass sum (partial sums, then a second launch sums each output's ``parts``
    contiguous partials), for a few outputs over many elements. Part p covers reduced
    positions [p * chunk, (p + 1) * chunk), chunk = ceil(count / parts).

    Thread mapping: blocks of (bx, by) threads (by a power of two), threadIdx.x picks one of
    bx consecutive v, the by threads of its column stride over the part's positions
    (consecutive threads on consecutive positions: coalesced where the innermost reduced axis
    is contiguous), each summing its share in a fixed order in the accumulation type; then a
    shared-memory tree over the column (kernels/common.py block_reduce). Blocks walk the tiles
    of v grid-stride; every thread of a block takes the same trips (the tree has barriers).
    Deterministic: the order depends only on the shapes and the launch. Traffic: x read once,
    y written once."""
    red = cuda.shared.array(0, dtype=acc.dtype)       # bx * by elements, sized at launch
    zero = acc[0]
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    bx, by = cuda.blockDim.x, cuda.blockDim.y
    n_out = y.size
    chunk = (count + parts - 1) // parts
    tiles = (n_out + bx - 1) // bx
    for tile in range(cuda.blockIdx.x, tiles, cuda.gridDim.x):
        v = tile * bx + tx
        part = zero
        if v < n_out:
            o = v // parts
            lo = (v - o * parts) * chunk
            hi = min(lo + chunk, count)
            base = kept_offset(o, geo)
            for r in range(lo + ty, hi, by):
                part += x[uint64(base + reduced_offset(r, geo))] + zero
        total = block_reduce(red, part, REDUCE_SUM)
        if v < n_out and ty == 0:
            y[uint64(v)] = total * scale


def SIGNATURES(t, acc):
    from numba import int64
    from numba.core.types import UniTuple
    a, z = t[::1], acc[::1]
    return {"reduce_fwd_kernel": (a, a, acc, int64, int64, UniTuple(int64, GEO_LEN), z)}
