"""Local response normalization across channels, forward and backward.

Layout: x, y, dy, dx are C-contiguous (N, C, S) passed flat, S the product of the spatial
dims. ``geo`` packs four int64: (C, S, LB, LA), the window of channel c being the channels
[c - LB, c + LA] clipped to [0, C) (LB = (size - 1) // 2 and LA = size - 1 - LB: cuDNN's
lookBehind and lookAhead). ``alpha_n`` is alpha / size, ``beta`` and ``k`` as given, all three
in the accumulation type. With q(c) = k + alpha_n * sum over the window of c of x^2:

    forward   y[c] = x[c] * q(c)^-beta
    backward  dx[i] = dy[i] * q(i)^-beta
                      - 2 * beta * alpha_n * x[i] * sum_{j: i in window(j)} dy[j] * y[j] / q(j)

The outputs j whose window holds channel i are [i - LA, i + LB] (the window mirrored), clipped
to [0, C). Each window sum is taken afresh from x (no running sum that adds the entering
channel and subtracts the leaving one: a large x^2 leaving a window of small ones would leave
its rounding error behind), so every element's q is the same sum in the same order in both
directions. NaN propagates into every output whose window holds it.

Thread mapping: one thread per element (n, c, s), grid-stride; consecutive threads take
consecutive s, so each of a warp's loads (one per window channel, S elements apart) and its
store are coalesced. Forward: the thread loads the <= size channels of its window and its own
x. Backward: for each of the <= size outputs j in its mirrored window, the <= size channels of
j's window (up to size^2 loads), and dy[j], y[j]; q(i) is the sum of j = i. Neighbouring
channels of a column are read by several threads through the cache: DRAM sees x, y and dy
about once. Indices are int64, cast to uint64 where they index (no negative-index fix-up);
divisions are unsigned. Accumulation in acc's type (float32 for float16 and float32 data,
float64 for float64; see kernels/__init__.py).
"""

import math

from numba import cuda, float32, int64, uint64

from .bounds import inlined


@inlined
def _column(i, c_, s_):
    """(channel c, index of channel 0 of the column) of flat element i of (N, C, S)."""
    q = uint64(i) // uint64(s_)              # n * C + c
    c = int64(q % uint64(c_))
    return c, i - c * s_


@inlined
def _window_sum(x, base, s_, lo, hi, zero):
    """sum of x^2 over channels lo..hi (inclusive) of the column starting at ``base``."""
    t = zero
    cc = lo
    while cc <= hi:
        v = x[uint64(base + cc * s_)] + zero
        t += v * v
        cc += 1
    return t


@cuda.jit(cache=True)
def lrn_fwd_kernel(x, y, geo, alpha_n, beta, k, acc):
    """y = x * (k + alpha_n * window sum of x^2)^-beta, one element per thread (grid-stride).
    Traffic: reads x (each element by <= size threads, through the cache), writes y."""
    zero = acc[0]
    c_, s_, lb, la = geo[0], geo[1], geo[2], geo[3]
    i, step, n = cuda.grid(1), cuda.gridsize(1), x.size
    while i < n:
        c, base = _column(i, c_, s_)
        q = k + alpha_n * _window_sum(x, base, s_, max(c - lb, 0), min(c + la, c_ - 1), zero)
        y[uint64(i)] = (x[uint64(i)] + zero) * math.pow(q, -beta)
        i += step


@cuda.jit(cache=True)
def lrn_bwd_kernel(x, y, dy, dx, geo, alpha_n, beta, k, acc):
    """dx from x, y = lrn(x) and dy (module docstring), one element per thread (grid-stride).
    Traffic: reads x, y and dy (through the cache: each element by <= size threads, x by
    <= size^2), writes dx."""
    zero = acc[0]
    c_, s_, lb, la = geo[0], geo[1], geo[2], geo[3]
    i, step, n = cuda.grid(1), cuda.gridsize(1), x.size
    while i < n:
        c, base = _column(i, c_, s_)
        own = zero + float32(1)       # q(i); the loop below always reaches j = c
        t = zero
        j, jhi = max(c - la, 0), min(c + lb, c_ - 1)
        while j <= jhi:
            q = k + alpha_n * _window_sum(x, base, s_, max(j - lb, 0), min(j + la, c_ - 1),
                                          zero)
            if j == c:
                own = q
            o = uint64(base + j * s_)
            t += (dy[o] + zero) * (y[o] + zero) / q
            j += 1
        xi = x[uint64(i)] + zero
        dx[uint64(i)] = ((dy[uint64(i)] + zero) * math.pow(own, -beta)
                         - float32(2) * beta * alpha_n * xi * t)
        i += step


def SIGNATURES(t, acc):
    from numba.core.types import UniTuple
    a, z = t[::1], acc[::1]
    geo = UniTuple(int64, 4)
    return {"lrn_fwd_kernel": (a, a, geo, acc, acc, acc, z),
            "lrn_bwd_kernel": (a, a, a, a, geo, acc, acc, acc, z)}
