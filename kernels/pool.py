"""Pooling, 2-D (as 3-D with a depth of 1) and 3-D, forward and backward.

Layouts, C-contiguous and passed flat: x (N, C, D, H, W), y (N, C, OD, OH, OW).
``geo`` packs the geometry as 15 int64: (D, H, W, OD, OH, OW, KD, KH, KW, SD, SH, SW, PD, PH, PW).
Along one dimension output o reads the inputs [o*s - p, o*s - p + k) clipped to [0, n): padding
never enters a maximum or a sum, and counts only in the divisor of AVG_INC (K = KD*KH*KW).
With p < k and n >= 1 (checked by the op) every window holds at least one input.

    MAX      y = max over the window; NaN propagates (the first NaN wins)
    AVG_INC  y = sum / K              AVG_EXC  y = sum / (inputs in the window)     SUM  y = sum

Backward, in gather form (one thread per input element, summing over the outputs whose windows
cover it, in a fixed order: deterministic, no atomics):

    MAX      dx[i] = sum of dy[o] over the outputs o whose arg-max is i
    AVG_*    dx[i] = sum of dy[o] / divisor(o)            SUM  dx[i] = sum of dy[o]

Tie rule: the arg-max of a window is its **first** maximum in scan order (depth, then height,
then width, i.e. the lowest address), or its first NaN when it holds one. The backward kernel
decides whether input i is the arg-max of output o from y: x[i] must equal y[o] (both NaN for
a NaN window) and no input of the window before i may equal it. To resolve ties the other way
(the last maximum), scan the inputs after i instead in ``_is_first``.

Thread mapping (both directions): x threads walk the positions of one plane (output plane
forward, input plane backward; grid-stride), so a warp reads and writes consecutive
addresses; the grid's y dimension walks the N*C planes (grid-stride, capped at launch so each
thread visits several). A thread decodes its position and clips its window (or finds its
covering outputs) once, and reuses them for every plane: no division in the loop over planes.
Indices are int64 throughout.

Memory traffic. Forward: y written once; every x element is read by ~(k/s)^d windows, but
neighbouring threads read the same lines, so DRAM sees x about once (the rest hits L1/L2).
Backward: dx written once; avg/sum read only dy, each element by ~(k/s)^d threads through the
cache (x and y untouched); max also reads x once and y with dy, plus a short re-scan of the
window (from cache) for the one candidate per output where x[i] equals y[o].
Accumulation in acc's type (float32 for float16 data, see kernels/__init__.py).
"""

from numba import cuda, float32

MAX, AVG_INC, AVG_EXC, SUM = 0, 1, 2, 3


@cuda.jit(device=True, inline=True)
def _span(o, s, p, k, n):
    """[lo, hi) of the inputs read by output coordinate o (its window clipped to [0, n))."""
    lo = o * s - p
    return max(lo, 0), min(lo + k, n)


@cuda.jit(device=True, inline=True)
def _covering(i, s, p, k, n_out):
    """[lo, hi) of the output coordinates whose windows contain input coordinate i:
    o*s - p <= i < o*s - p + k, i.e. (i + p - k + 1)/s <= o <= (i + p)/s."""
    q = i + p - k + 1
    lo = 0 if q <= 0 else (q + s - 1) // s
    return lo, min((i + p) // s + 1, n_out)


@cuda.jit(device=True, inline=True)
def _window(x, base, h_, w_, z0, z1, y0, y1, x0, x1, mode, ksize, zero):
    """The pooled value of the clipped window [z0, z1) x [y0, y1) x [x0, x1) of the plane at
    ``base``. (Loops are ``while`` loops here and below: Numba's ``range`` computes a trip count
    in 64-bit arithmetic and costs ~20 more registers per kernel.)"""
    m = x[base + (z0 * h_ + y0) * w_ + x0] + zero
    total = zero
    z = z0
    while z < z1:
        row = base + (z * h_ + y0) * w_
        yy = y0
        while yy < y1:
            xx = x0
            while xx < x1:
                v = x[row + xx] + zero
                if mode == MAX:
                    # strictly greater: the first maximum stays; a NaN replaces a number once
                    if v > m or (v != v and m == m):
                        m = v
                else:
                    total += v
                xx += 1
            row += w_
            yy += 1
        z += 1
    if mode == MAX:
        return m
    if mode == AVG_INC:
        return total / (zero + float32(ksize))
    if mode == AVG_EXC:
        return total / (zero + float32((z1 - z0) * (y1 - y0) * (x1 - x0)))
    return total


@cuda.jit
def pool_fwd_kernel(x, y, geo, planes, mode, acc):
    """y from x; planes = N*C. One thread per output element (see the module docstring)."""
    d_, h_, w_, od_, oh_, ow_, kd, kh, kw, sd, sh, sw, pd, ph, pw = geo
    zero = acc[0]
    ksize = kd * kh * kw
    opl, ipl, ohw = od_ * oh_ * ow_, d_ * h_ * w_, oh_ * ow_
    q = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    while q < opl:
        z0, z1 = _span(q // ohw, sd, pd, kd, d_)
        y0, y1 = _span((q % ohw) // ow_, sh, ph, kh, h_)
        x0, x1 = _span(q % ow_, sw, pw, kw, w_)
        pl = cuda.blockIdx.y
        while pl < planes:
            y[pl * opl + q] = _window(x, pl * ipl, h_, w_, z0, z1, y0, y1, x0, x1, mode, ksize,
                                      zero)
            pl += cuda.gridDim.y
        q += cuda.gridDim.x * cuda.blockDim.x


@cuda.jit(device=True, inline=True)
def _is_first(x, base, h_, w_, z0, z1, y0, y1, x0, x1, own, m, zero):
    """True when no input of the window before plane offset ``own`` (in scan order, which is
    address order) equals m (is NaN, for a NaN m)."""
    nan = m != m
    z = z0
    while z < z1:
        yy = y0
        while yy < y1:
            row = (z * h_ + yy) * w_
            xx = x0
            while xx < x1:
                if row + xx >= own:
                    return True
                v = x[base + row + xx] + zero
                if v == m or (nan and v != v):
                    return False
                xx += 1
            yy += 1
        z += 1
    return True


@cuda.jit(device=True, inline=True)
def _grad(x, y, dy, geo, base, ybase, iz, iy, ix, cover, mode, zero):
    """dx of the input at (iz, iy, ix) of the plane: the sum over the covering outputs
    (``cover`` = their ranges (oz0, oz1, oy0, oy1, ox0, ox1))."""
    d_, h_, w_, od_, oh_, ow_, kd, kh, kw, sd, sh, sw, pd, ph, pw = geo
    oz0, oz1, oy0, oy1, ox0, ox1 = cover
    own = (iz * h_ + iy) * w_ + ix
    v = zero
    if mode == MAX:
        v = x[base + own] + zero
    kf = zero + float32(kd * kh * kw)
    total = zero
    oz = oz0
    while oz < oz1:
        z0, z1 = _span(oz, sd, pd, kd, d_)
        oy = oy0
        while oy < oy1:
            y0, y1 = _span(oy, sh, ph, kh, h_)
            j = ybase + (oz * oh_ + oy) * ow_ + ox0
            ox = ox0
            while ox < ox1:
                if mode == MAX:
                    m = y[j] + zero
                    if v == m or (v != v and m != m):
                        x0, x1 = _span(ox, sw, pw, kw, w_)
                        if _is_first(x, base, h_, w_, z0, z1, y0, y1, x0, x1, own, m, zero):
                            total += dy[j]
                else:
                    g = dy[j] + zero
                    if mode == AVG_INC:
                        g = g / kf
                    elif mode == AVG_EXC:
                        x0, x1 = _span(ox, sw, pw, kw, w_)
                        g = g / (zero + float32((z1 - z0) * (y1 - y0) * (x1 - x0)))
                    total += g
                j += 1
                ox += 1
            oy += 1
        oz += 1
    return total


@cuda.jit
def pool_bwd_kernel(x, y, dy, dx, geo, planes, mode, acc):
    """dx from x, y, dy (avg/sum read only dy); planes = N*C. One thread per input element,
    gathering (see the module docstring)."""
    d_, h_, w_, od_, oh_, ow_, kd, kh, kw, sd, sh, sw, pd, ph, pw = geo
    zero = acc[0]
    opl, ipl, hw = od_ * oh_ * ow_, d_ * h_ * w_, h_ * w_
    i = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    while i < ipl:
        iz, iy, ix = i // hw, (i % hw) // w_, i % w_
        oz0, oz1 = _covering(iz, sd, pd, kd, od_)
        oy0, oy1 = _covering(iy, sh, ph, kh, oh_)
        ox0, ox1 = _covering(ix, sw, pw, kw, ow_)
        cover = (oz0, oz1, oy0, oy1, ox0, ox1)
        pl = cuda.blockIdx.y
        while pl < planes:
            dx[pl * ipl + i] = _grad(x, y, dy, geo, pl * ipl, pl * opl, iz, iy, ix, cover,
                                     mode, zero)
            pl += cuda.gridDim.y
        i += cuda.gridDim.x * cuda.blockDim.x


def SIGNATURES(t, acc):
    from numba import int64
    from numba.core.types import UniTuple
    a, z = t[::1], acc[::1]
    geo = UniTuple(int64, 15)
    return {"pool_fwd_kernel": (a, a, geo, int64, int64, z),
            "pool_bwd_kernel": (a, a, a, a, geo, int64, int64, z)}
