"""Device functions shared by several kernel modules.

    load4         four loads a grid stride apart, all in flight together (UNROLL = 4)
    sigmoid       the logistic function without overflow (activations, RNN gates)
    nanmax        a maximum that lets NaN win
    block_reduce  max or sum over threadIdx.y for each threadIdx.x (REDUCE_MAX, REDUCE_SUM)
    axis_tap      the input coordinate an output coordinate reads through one kernel tap
    axis_taps     the kernel taps of one axis that read an input coordinate (col2im, the
                  direct convolution kernels' data gradients); tap_period their step;
                  tap_rows the row offsets of one (z, y) pair of them
    relu_floor, clip  the forward convolutions' and GEMM's epilogue relu (EPILOGUE)

``MAX_THREADS`` is the block size, at most, of the kernels that reduce across a block with
these helpers (softmax's launch bound; the convolution's bias gradient).
"""

import math

from numba import cuda, float32, uint64

from .bounds import inlined

MAX_THREADS = 256
REDUCE_MAX, REDUCE_SUM = 0, 1     # block_reduce's operations

# Elementwise kernels take UNROLL elements per thread per trip, all loads issued before the
# first value is used (load4): with one element's loads in flight per thread an SM holds
# ~8 KB of requests, too few to cover HBM latency (a one-element loop runs at 64% of the copy
# rate on an H100); the tail takes one per trip. The loads must come before any branch on a
# value (such as the activations' mode switch): a branch ends the stretch of code within which
# the compiler overlaps them (an activation backward that loads each element's x, y, dy just
# before its own slope keeps one element in flight: 60% of copy on an H100, where the forward
# reaches 80%). Indices are int64 (cuda.grid is), cast to uint64 for indexing: Numba adds a
# negative-index fix-up to every signed index.
UNROLL = 4

# EPILOGUE: the forward convolution and GEMM kernels take one int, ``epi``, for what they do to
# a value before storing it: bit 0 (EPI_BIAS) adds the bias, bit 1 (EPI_RELU) then applies
# relu, y = max(y, 0), as kernels/activation.py's relu does (a NaN stays NaN). A fused relu
# saves the activation's pass over y (a read and a write of every value).
EPI_BIAS, EPI_RELU = 1, 2


@inlined
def load4(a, i, step, use, zero):
    """a[i], a[i + step], a[i + 2*step], a[i + 3*step] in the accumulation type, four loads
    in flight; four zeros, loading nothing, when ``use`` is False (uniform over the grid)."""
    if use:
        return (a[uint64(i)] + zero, a[uint64(i + step)] + zero,
                a[uint64(i + 2 * step)] + zero, a[uint64(i + 3 * step)] + zero)
    return zero, zero, zero, zero


@inlined
def sigmoid(v, one):
    # exp of a non-positive argument only, so nothing overflows: 1/(1+e^-v) for v >= 0 and
    # e^v/(1+e^v) for v < 0 (equal in exact arithmetic). NaN takes the second branch.
    if v >= one - one:
        return one / (one + math.exp(-v))
    e = math.exp(v)
    return e / (one + e)


@inlined
def nanmax(a, b):
    # NaN wins, so a NaN anywhere in a reduction makes its result NaN.
    return a if (a > b or a != a) else b


@inlined
def block_reduce(red, val, op):
    """Combine ``val`` over threadIdx.y for each threadIdx.x (``op`` REDUCE_MAX or
    REDUCE_SUM); every thread gets its column's result. ``blockDim.y`` must be a power of two;
    ``red`` is shared scratch of blockDim.x * blockDim.y elements. A tree with a barrier per
    level, in a fixed order (deterministic)."""
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    bx, by = cuda.blockDim.x, cuda.blockDim.y
    red[ty * bx + tx] = val
    cuda.syncthreads()
    half = by // 2
    while half > 0:
        if ty < half:
            a, b = red[ty * bx + tx], red[(ty + half) * bx + tx]
            red[ty * bx + tx] = nanmax(a, b) if op == REDUCE_MAX else a + b
        cuda.syncthreads()
        half //= 2
    out = red[tx]
    cuda.syncthreads()  # red is reused by the next reduction
    return out


@inlined
def axis_tap(o, stride, k, ksize, dil, pad, flip):
    """Input coordinate read by output coordinate o through kernel tap k."""
    return o * stride + ((ksize - 1 - k) if flip else k) * dil - pad


@inlined
def axis_taps(i, pad, ksize, dil, stride, osize, flip, q):
    """The taps of one axis that read input coordinate i, in increasing tap order: (first
    tap, its output coordinate, output step, count; the tap step is q = ``tap_period``). Before
    the flip, tap k' reads i where i + pad - k'*dil = o*stride with 0 <= o < osize: one residue
    class of k' modulo q = stride / gcd(dil, stride), o falling by dil*q/stride per step. So a
    thread divides per axis, not per tap and channel (col2im was bound by a 64-bit remainder
    and quotient per tap); an undilated stride-1 axis divides nothing."""
    base = i + pad
    k0 = -1
    for k in range(min(ksize, q)):          # the residue class's first tap, if any
        rem = base - k * dil
        if rem >= 0 and (stride == 1 or rem % stride == 0):
            k0 = k
            break
    if k0 < 0:
        return 0, 0, 0, 0
    if stride == 1 and dil == 1:
        o0, do, hi = base, 1, min(ksize, base + 1)
    else:
        o0 = (base - k0 * dil) // stride
        do = q * dil // stride
        hi = min((ksize - k0 + q - 1) // q, o0 // do + 1)
    lo = 0 if o0 < osize else (o0 - osize + do) // do      # steps until o < osize
    if hi <= lo:
        return 0, 0, 0, 0
    if flip:        # tap ksize-1-k': increasing taps are decreasing steps, o rising
        return ksize - 1 - (k0 + (hi - 1) * q), o0 - (hi - 1) * do, do, hi - lo
    return k0 + lo * q, o0 - lo * do, -do, hi - lo


@inlined
def tap_period(dil, stride):
    """stride / gcd(dil, stride): the tap period of col2im's valid taps on an axis."""
    a, b = dil, stride
    while b != 0:
        a, b = b, a % b
    return stride // a


@inlined
def tap_rows(a, b, taps_z, taps_y, oh_, ow_, r_, s_):
    """(the output plane's row offset (zo*OH + yo)*OW, the kernel's row offset (t*R + r)*S)
    of the a-th valid tap on axis z and the b-th on axis y; ``taps_z``, ``taps_y``: each
    axis's (first tap, its output coordinate, output step, tap period) from ``axis_taps``
    and ``tap_period``. The gathers that walk the valid taps (col2im, the direct data
    gradients) take their rows from here."""
    t0, z0, zs, qt = taps_z
    r0, y0, ys, qr = taps_y
    t, zo = t0 + a * qt, z0 + a * zs
    r, yo = r0 + b * qr, y0 + b * ys
    return (zo * oh_ + yo) * ow_, (t * r_ + r) * s_


@inlined
def relu_floor(epi, zero):
    """What ``clip`` clips to: 0 when ``epi`` has EPI_RELU, else -inf, which clips nothing."""
    return zero if epi & EPI_RELU else zero + float32(-math.inf)


@inlined
def clip(v, lo):
    """max(v, lo) that keeps NaN (a select, as kernels/activation.py's relu): relu with lo = 0,
    and the epilogues' relu with lo = relu_floor(epi, zero) computed once, one select with a
    loop-invariant operand rather than a test of the flag per value. (kernels/gemm.py's
    register-tiled GEMM takes its relu at compile time instead: even this select in its store
    loop cost the large tiles their unrolled stores.)"""
    return lo if v <= lo else v
