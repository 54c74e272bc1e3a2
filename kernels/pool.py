"""Pooling, 2-D (as 3-D with a depth of 1) and 3-D, forward and backward.

Layouts, C-contiguous and passed flat: x (N, C, D, H, W), y (N, C, OD, OH, OW).
``geo`` packs the geometry as 15 int64: (D, H, W, OD, OH, OW, KD, KH, KW, SD, SH, SW, PD, PH, PW);
the window and stride in it must be the ones the kernels were built for.
Along one dimension output o reads the inputs [o*s - p, o*s - p + k) clipped to [0, n): padding
never enters a maximum or a sum, and counts only in the divisor of AVG_INC (K = KD*KH*KW).
The output sizes in ``geo`` are the op's (floor or ceil mode, ops/pool_args.py); every window
starts before n (checked by the op), so each holds at least one input.

    MAX      y = max over the window; NaN propagates (the first NaN wins)
    AVG_INC  y = sum / K              AVG_EXC  y = sum / (inputs in the window)     SUM  y = sum

In ceil mode the last window may reach past the padded input, n + p: kernels built with
``clip`` divide AVG_INC by the window's extent clipped there instead of K, per dimension
min(o*s - p + k, n + p) - (o*s - p) (PyTorch's and Caffe's divisor: the padding counts, the
overhang past it does not). Without an overhang that is K, so only such geometries use them.

Backward, in gather form (one thread per input element, summing over the outputs whose windows
cover it, in a fixed order: deterministic, no atomics):

    MAX      dx[i] = sum of dy[o] over the outputs o whose arg-max is i
    AVG_*    dx[i] = sum of dy[o] / divisor(o)            SUM  dx[i] = sum of dy[o]

Tie rule: the arg-max of a window is its **first** maximum in scan order (depth, then height,
then width, i.e. the lowest address), or its first NaN when it holds one. MAX backward is two
kernels: ``argmax`` writes, per output, the tap index of its arg-max ((a*KH + b)*KW + c, one
byte when the window has at most 255 taps), recomputed from x with the forward's rule; the
gather kernel then adds dy[o] to input i when o's code names i's tap. (Deciding it from y
instead, "x[i] == y[o] and no earlier tap equals it", makes a quarter of the lanes of every
warp re-scan a window while the others wait: 2.1 ms against cuDNN's 0.37 on an H200 at
64x64x112x112 3/2/1.) To resolve ties the other way (the last maximum), take ``>=`` in
``argmax``.

Specialisation. ``pool_kernels(mode, window, stride)`` builds the kernels of one mode, window
and stride, all compile-time constants (made on first use and kept): the window loops have
constant trip counts, so they unroll; divisions by a stride become multiplications; the
mode's other branches are not compiled. (Measured on an H200: average backward 0.31 ms at
64x64x112x112 3/2/1, against 0.86 with the window and stride as run-time values.)

Loads first. A window's taps (and a gather's candidate outputs) are loaded before the first
of them is compared: each at its coordinates clamped into the plane, so every load is in
bounds and unconditional, then masked by whether the tap is inside; the folds use ``&`` and
``|``, never ``and``/``or``, whose short-circuits are branches on the loaded value. A load
behind a branch on the previous tap's compare waits for it (SASS: 9 dependent round trips per
3x3 window). H100, 64x64x112x112 3/2/1 float32, kernel time: max forward 0.141 ms loading
first against 0.234 with a branch per tap (cuDNN 0.224), max backward 0.403 against 0.683
(cuDNN 0.419).

Thread mapping (both directions): x threads walk the positions of one plane (output plane
forward, input plane backward; grid-stride), so a warp reads and writes consecutive
addresses; the grid's y dimension walks the N*C planes (grid-stride, capped at launch so each
thread visits several). A thread decodes its position and clips its window (or finds its
covering outputs) once, and reuses them for every plane: no division in the loop over planes.
Indices are int64 throughout, cast to uint64 where they index (no negative-index
wraparound).

Memory traffic. Forward: y written once; every x element is read by ~(k/s)^d windows, but
neighbouring threads read the same lines, so DRAM sees x about once (the rest hits L1/L2).
Backward: dx written once; avg/sum read only dy, each element by ~(k/s)^d threads through the
cache (x and y untouched); max reads x once more (argmax, as the forward) and writes and reads
one code byte per output.
Accumulation in acc's type (float32 for float16 data, see kernels/__init__.py).
"""

import functools
import math

from numba import boolean, cuda, float32, int64, uint64

from .bounds import inlined
from .common import UNROLL, load4

MAX, AVG_INC, AVG_EXC, SUM = 0, 1, 2, 3
MODE_NAMES = {MAX: "max", AVG_INC: "avginc", AVG_EXC: "avgexc", SUM: "sum"}


@inlined
def _count(lo, k, n):
    """Inputs of [lo, lo + k) inside [0, n)."""
    return min(lo + k, n) - max(lo, 0)


@inlined
def _span(lo, k, n, p):
    """Positions of [lo, lo + k) before the padded end n + p (lo >= -p): AVG_INC's divisor
    along one dimension when the window may overhang (``clip``)."""
    return min(lo + k, n + p) - lo


@inlined
def _clamped(z, y, x, d, h, w):
    """The in-plane index of (z, y, x) clamped into a d x h x w plane, as uint64 (no
    negative-index wraparound): an always-valid address for a load masked afterwards."""
    return uint64((min(max(z, 0), d - 1) * h + min(max(y, 0), h - 1)) * w + min(max(x, 0), w - 1))


@cuda.jit(device=True, inline=True)   # LLVM's inlining (bounds.inlined) changed the code
def _walk(g, n, planes, flat):
    """(position, first plane, end plane, plane step) of thread index g. Planes of n >= 128
    positions: g is the position, planes along the grid's y. Smaller planes (``flat``; e.g.
    global pooling, one output per plane): g walks (plane, position) pairs, one plane each,
    so a block is not left with n busy threads."""
    if flat:
        return g % n, g // n, g // n + 1, 1
    return g, cuda.blockIdx.y, planes, cuda.gridDim.y


def _walker(per_window, SD, SH, SW):
    """A device function ``f(x, out, geo, planes, flat, zero)`` setting
    out[o] = per_window(x, plane base, d, h, w, z0, y0, x0, pd, ph, pw, zero) for every output
    o (window corner (z0, y0, x0) from the strides SD, SH, SW), one plane per trip."""

    @inlined
    def walk(x, out, geo, planes, flat, zero):
        d_, h_, w_, od_, oh_, ow_ = geo[0], geo[1], geo[2], geo[3], geo[4], geo[5]
        pd, ph, pw = geo[12], geo[13], geo[14]
        opl, ipl, ohw = od_ * oh_ * ow_, d_ * h_ * w_, oh_ * ow_
        g = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        while g < (planes * opl if flat else opl):
            q, pl, pend, pstep = _walk(g, opl, planes, flat)
            z0 = (q // ohw) * SD - pd
            y0 = ((q % ohw) // ow_) * SH - ph
            x0 = (q % ow_) * SW - pw
            while pl < pend:
                o = uint64(pl * opl + q)
                out[o] = per_window(x, pl * ipl, d_, h_, w_, z0, y0, x0, pd, ph, pw, zero)
                pl += pstep
            g += cuda.gridDim.x * cuda.blockDim.x

    return walk


@functools.lru_cache(maxsize=None)
def pool_kernels(mode, window, stride, clip=False):
    """(forward, argmax, backward, repair) kernels for ``mode`` (MAX, AVG_INC, AVG_EXC, SUM),
    ``window`` and ``stride`` (3-tuples, depth first; a 2-D pooling has depth 1). ``clip``:
    AVG_INC divides by the window clipped at the padded end (ceil mode's overhang; the
    module docstring); the other modes ignore it."""
    CLIP = bool(clip) and mode == AVG_INC
    KD, KH, KW = (int(v) for v in window)
    SD, SH, SW = (int(v) for v in stride)
    KSIZE = KD * KH * KW
    # outputs covering one input along a dimension: at most ceil(K / S)
    CD, CH, CW = -(-KD // SD), -(-KH // SH), -(-KW // SW)
    NC = CD * CH * CW

    # Loads first. A window's taps (a gather's candidates) are loaded in chunks of up to 32
    # into registers, every load of a chunk before the first compare, each at its coordinates
    # clamped into the plane (always in bounds; uint64 indices skip Numba's negative-index
    # wraparound) and masked after the load. (A load behind ``if inside:``, or a fold on
    # ``and``/``or`` short-circuits, branches on the previous tap's value and holds the next
    # load back until it lands: one memory round trip per tap.) Larger windows stream in
    # chunks of 8: an unrolled chunk, a loop over chunks.
    CHUNK = KSIZE if KSIZE <= 32 else 8
    SPAN = CHUNK * -(-KSIZE // CHUNK)
    GCHUNK = NC if NC <= 32 else 8
    GSPAN = GCHUNK * -(-NC // GCHUNK)

    @inlined
    def fold(x, base, d_, h_, w_, z0, y0, x0, zero):
        """(max, arg-max tap, sum) over the window at (z0, y0, x0) (unclipped corner) of the
        plane at ``base``, taps in scan order. The arg-max is the first maximum, or the first
        NaN (the max is the value there; -inf for a window of -inf); the tap index is
        (a*KH + b)*KW + c. Unused results compile away."""
        vals = cuda.local.array(CHUNK, x.dtype)
        ins = cuda.local.array(CHUNK, boolean)
        m = zero - float32(math.inf)
        total = zero
        best = -1
        for k0 in range(0, SPAN, CHUNK):
            for i in range(CHUNK):
                k = k0 + i
                z, yy, xx = z0 + k // (KH * KW), y0 + (k // KW) % KH, x0 + k % KW
                vals[i] = x[uint64(base) + _clamped(z, yy, xx, d_, h_, w_)]
                ins[i] = ((k < KSIZE) & (z >= 0) & (z < d_) & (yy >= 0) & (yy < h_)
                          & (xx >= 0) & (xx < w_))
            for i in range(CHUNK):
                v = vals[i] + zero
                # & and |, not and/or: no branch on the loaded value
                take = ins[i] & ((best < 0) | (v > m) | ((v != v) & (m == m)))
                m = v if take else m
                best = k0 + i if take else best
                if mode != MAX:
                    # MAX never reads the sum. On the GPU it compiles away; the simulator
                    # runs it, and a window holding both +inf and -inf made NumPy warn
                    # "invalid value encountered in scalar add" for a sum nobody reads
                    total += v if ins[i] else zero
        return m, best, total

    @inlined
    def window_value(x, base, d_, h_, w_, z0, y0, x0, pd, ph, pw, zero):
        """The pooled value of the window at (z0, y0, x0) of the plane at ``base`` (padding
        pd, ph, pw)."""
        m, _, total = fold(x, base, d_, h_, w_, z0, y0, x0, zero)
        if mode == MAX:
            return m
        if mode == AVG_INC:
            if CLIP:
                return total / (zero + float32(_span(z0, KD, d_, pd) * _span(y0, KH, h_, ph)
                                               * _span(x0, KW, w_, pw)))
            return total / (zero + float32(KSIZE))
        if mode == AVG_EXC:
            return total / (zero + float32(_count(z0, KD, d_) * _count(y0, KH, h_)
                                           * _count(x0, KW, w_)))
        return total

    @inlined
    def window_argmax(x, base, d_, h_, w_, z0, y0, x0, pd, ph, pw, zero):
        """The tap index of the window's arg-max (the forward's rule, ``fold``)."""
        return fold(x, base, d_, h_, w_, z0, y0, x0, zero)[1]

    value_walker = _walker(window_value, SD, SH, SW)
    argmax_walker = _walker(window_argmax, SD, SH, SW)

    @cuda.jit(cache=True)
    def forward(x, y, geo, planes, flat, acc):
        """y from x; planes = N*C. One thread per output position of a plane (grid-stride
        along x), planes along the grid's y, or (plane, position) pairs for small planes
        (see the module docstring and ``_walk``)."""
        value_walker(x, y, geo, planes, flat, acc[0])

    @inlined
    def refold(x, y, o, geo, zero):
        """y[o] = the value of output o's window again (o flat over y), from x."""
        h_, w_, oh_, ow_ = geo[1], geo[2], geo[4], geo[5]
        ohw = oh_ * ow_
        opl, ipl = geo[3] * ohw, geo[0] * h_ * w_
        pl = o // opl
        q = o - pl * opl
        y[uint64(o)] = window_value(x, pl * ipl, geo[0], h_, w_, (q // ohw) * SD - geo[12],
                                    ((q % ohw) // ow_) * SH - geo[13], (q % ow_) * SW - geo[14],
                                    geo[12], geo[13], geo[14], zero)

    @cuda.jit(cache=True)
    def repair(x, y, geo, lowest, acc):
        """MAX after cuDNN: cuDNN's maximum starts from the lowest finite value of the type,
        so a window of -inf (padding aside) gives that value, not IEEE's -inf. Where y holds
        it (``lowest``, in acc's type), y = the window's maximum again, from x.
        Thread mapping: flat over y, grid-stride, UNROLL outputs a grid stride apart per trip
        with their loads issued together (kernels/common.py ``load4``): a walk over planes
        keeps one load in flight per thread and takes 53 us for y's 51 MB on an H100 (a third
        of copy bandwidth). Traffic: reads y; reads x and writes y only around such outputs."""
        zero = acc[0]
        i, step, n = cuda.grid(1), cuda.gridsize(1), y.size
        while i + 3 * step < n:
            v = load4(y, i, step, True, zero)
            for k in range(UNROLL):
                if v[k] <= lowest:
                    refold(x, y, i + k * step, geo, zero)
            i += UNROLL * step
        while i < n:
            if y[uint64(i)] + zero <= lowest:
                refold(x, y, i, geo, zero)
            i += step

    @cuda.jit(cache=True)
    def argmax(x, codes, geo, planes, flat, acc):
        """codes[o] = the tap index of output o's arg-max (``window_argmax``). Thread mapping
        as ``forward``."""
        argmax_walker(x, codes, geo, planes, flat, acc[0])

    @inlined
    def gradient(codes, dy, geo, ybase, iz, iy, ix, zero):
        """dx of the input at (iz, iy, ix) of the plane: the sum over the outputs covering it
        (MAX: only those whose arg-max code is this input's tap in their window). Candidate k
        of the NC = CD x CH x CW outputs that may cover it lies (k // (CH*CW), k // CW % CH,
        k % CW) below the highest one per dimension, o <= (i + p) / s. Loads as ``fold``."""
        d_, h_, w_, od_, oh_, ow_ = geo[0], geo[1], geo[2], geo[3], geo[4], geo[5]
        pd, ph, pw = geo[12], geo[13], geo[14]
        # i + p >= 0: unsigned division by the constant stride (no floor fix-up)
        hz = int64(uint64(iz + pd) // uint64(SD))
        hy = int64(uint64(iy + ph) // uint64(SH))
        hx = int64(uint64(ix + pw) // uint64(SW))
        gv = cuda.local.array(GCHUNK, dy.dtype)
        cv = cuda.local.array(GCHUNK, codes.dtype)
        total = zero
        for k0 in range(0, GSPAN, GCHUNK):
            for i in range(GCHUNK):
                k = k0 + i
                oz, oy, ox = hz - k // (CH * CW), hy - (k // CW) % CH, hx - k % CW
                j = uint64(ybase) + _clamped(oz, oy, ox, od_, oh_, ow_)
                gv[i] = dy[j]
                if mode == MAX:
                    cv[i] = codes[j]
            for i in range(GCHUNK):
                k = k0 + i
                oz, oy, ox = hz - k // (CH * CW), hy - (k // CW) % CH, hx - k % CW
                z0, y0, x0 = oz * SD - pd, oy * SH - ph, ox * SW - pw
                valid = ((k < NC) & (oz >= 0) & (z0 + KD > iz) & (oy >= 0) & (y0 + KH > iy)
                         & (ox >= 0) & (x0 + KW > ix) & (oz < od_) & (oy < oh_) & (ox < ow_))
                g = gv[i] + zero
                if mode == MAX:
                    valid &= cv[i] == ((iz - z0) * KH + (iy - y0)) * KW + (ix - x0)
                elif mode == AVG_INC:
                    if CLIP:
                        # a discarded candidate's span may be <= 0: divide by >= 1
                        g = g / (zero + float32(max(_span(z0, KD, d_, pd) * _span(y0, KH, h_, ph)
                                                    * _span(x0, KW, w_, pw), 1)))
                    else:
                        g = g / (zero + float32(KSIZE))
                elif mode == AVG_EXC:
                    # a discarded candidate's window may count 0 inputs: divide by >= 1
                    g = g / (zero + float32(max(_count(z0, KD, d_) * _count(y0, KH, h_)
                                                * _count(x0, KW, w_), 1)))
                total += g if valid else zero
        return total

    @cuda.jit(cache=True)
    def backward(codes, dy, dx, geo, planes, flat, acc):
        """dx from dy and, for MAX, the arg-max codes of ``argmax`` (the average modes pass
        any array as ``codes``); planes = N*C. One thread per input position of a plane,
        gathering (see the module docstring)."""
        d_, h_, w_, od_, oh_, ow_ = geo[0], geo[1], geo[2], geo[3], geo[4], geo[5]
        zero = acc[0]
        opl, ipl, hw = od_ * oh_ * ow_, d_ * h_ * w_, h_ * w_
        g = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        while g < (planes * ipl if flat else ipl):
            i, pl, pend, pstep = _walk(g, ipl, planes, flat)
            iz, iy, ix = i // hw, (i % hw) // w_, i % w_
            while pl < pend:
                dx[uint64(pl * ipl + i)] = gradient(codes, dy, geo, pl * opl, iz, iy, ix, zero)
                pl += pstep
            g += cuda.gridDim.x * cuda.blockDim.x

    return forward, argmax, backward, repair


# Representative variants (every mode; 2-D 2/2 and 3/2, 3-D 3/2; AVG_INC clipped for ceil
# mode) for the ahead-of-time PTX checks (kernels/signatures.py); the ops build others on
# first use.
_CHECKED = [(m, (1, 3, 3), (1, 2, 2), False) for m in MODE_NAMES] + \
    [(MAX, (1, 2, 2), (1, 2, 2), False), (AVG_EXC, (3, 3, 3), (2, 2, 2), False),
     (AVG_INC, (1, 3, 3), (1, 2, 2), True)]


def _variant_name(mode, window, stride, clip, direction):
    k, s = "x".join(map(str, window)), "x".join(map(str, stride))
    return f"pool_{MODE_NAMES[mode]}{'clip' if clip else ''}_{k}_s{s}_{direction}_kernel"


VARIANTS = {}
for _m, _w, _s, _c in _CHECKED:
    _f, _a, _b, _r = pool_kernels(_m, _w, _s, _c)
    VARIANTS[_variant_name(_m, _w, _s, _c, "fwd")] = _f
    VARIANTS[_variant_name(_m, _w, _s, _c, "bwd")] = _b
    if _m == MAX:
        VARIANTS[_variant_name(_m, _w, _s, _c, "argmax")] = _a
        VARIANTS[_variant_name(_m, _w, _s, _c, "fwd_repair")] = _r


def SIGNATURES(t, acc):
    from numba import int64, uint8
    from numba.core.types import UniTuple
    a, z = t[::1], acc[::1]
    geo = UniTuple(int64, 15)
    codes = uint8[::1]
    out = {}
    for name in VARIANTS:
        if name.endswith("_repair_kernel"):
            out[name] = (a, a, geo, acc, z)
        elif "_fwd_" in name:
            out[name] = (a, a, geo, int64, int64, z)
        elif "_argmax_" in name:
            out[name] = (a, codes, geo, int64, int64, z)
        else:
            out[name] = (codes if name.startswith("pool_max") else a, a, a, geo, int64, int64, z)
    return out
