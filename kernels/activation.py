"""Elementwise activations, forward and backward.

Modes (integers shared with dnnkit.ops.activation): 0 relu, 1 clipped_relu (coef = ceiling),
2 tanh, 3 sigmoid, 4 elu (coef = alpha), 5 swish (coef = beta), 6 identity.
NaN propagates through every mode (as cuDNN with CUDNN_PROPAGATE_NAN): comparisons are written
so that a NaN input falls through to ``v``. Memory traffic: forward reads x, writes y;
backward reads dy and only the inputs the mode's slope needs (x, y or both; see _reads) and
writes dx: relu's backward is three streams, not four.
"""

import math

from numba import cuda, float32, uint64

from .bounds import inlined
from .common import UNROLL, load4, sigmoid

RELU, CLIPPED_RELU, TANH, SIGMOID, ELU, SWISH, IDENTITY = range(7)


@inlined
def _forward(v, mode, coef, zero):
    # Constants are float32 so that they do not promote float32 arithmetic to float64
    # (a Python int or float literal would); with float64 data they widen exactly.
    one = zero + float32(1)
    if mode == RELU:
        return zero if v <= zero else v
    if mode == CLIPPED_RELU:
        if v <= zero:
            return zero
        return coef if v >= coef else v
    if mode == TANH:
        return math.tanh(v)
    if mode == SIGMOID:
        return sigmoid(v, one)
    if mode == ELU:
        return coef * (math.exp(v) - one) if v <= zero else v
    if mode == SWISH:
        return v * sigmoid(coef * v, one)
    return v


@inlined
def _derivative(v, w, mode, coef, zero):
    """f'(x) from x (v) and y = f(x) (w). At the kinks and for a NaN x this follows cuDNN 9
    (probed on an H200, validation/cudnn_conventions.py): relu slope 1 for x > 0 only;
    clipped_relu 1 for 0 < x <= coef; elu 1 for x >= 0; a NaN x gives slope 0 for relu and
    clipped_relu and NaN for elu (through y)."""
    one = zero + float32(1)
    if mode == RELU:
        return one if v > zero else zero
    if mode == CLIPPED_RELU:
        return one if (v > zero and v <= coef) else zero
    if mode == TANH:
        return one - w * w
    if mode == SIGMOID:
        return w * (one - w)
    if mode == ELU:
        return one if v >= zero else w + coef          # alpha*e^x = y + alpha for x < 0
    if mode == SWISH:
        s = sigmoid(coef * v, one)                      # d/dx x*s(bx) = s + b*y*(1 - s)
        return s + coef * w * (one - s)
    return one


@inlined
def _chain(g, v, w, mode, coef, zero):
    """dx = dy * f'(x). relu and clipped_relu select instead (dy where the slope is 1, else 0),
    as cuDNN 9 and PyTorch do: a NaN or Inf dy where the slope is 0 gives 0, not 0 * Inf = NaN
    (probed on an H100, validation/cudnn_conventions.py). The other modes multiply, as cuDNN."""
    s = _derivative(v, w, mode, coef, zero)
    if mode == RELU or mode == CLIPPED_RELU:
        return g if s != zero else zero
    return g * s


@cuda.jit(cache=True)
def activation_fwd_kernel(x, y, mode, coef, acc):
    """y[i] = f(x[i]) on flat arrays. Thread mapping: grid-stride loop, consecutive threads on
    consecutive elements (coalesced), UNROLL elements a grid-stride apart per trip, their loads
    issued together (kernels/common.py). Traffic: reads x, writes y."""
    zero = acc[0]
    i, step, n = cuda.grid(1), cuda.gridsize(1), x.size
    while i + 3 * step < n:
        a, b, c, d = load4(x, i, step, True, zero)
        y[uint64(i)] = _forward(a, mode, coef, zero)
        y[uint64(i + step)] = _forward(b, mode, coef, zero)
        y[uint64(i + 2 * step)] = _forward(c, mode, coef, zero)
        y[uint64(i + 3 * step)] = _forward(d, mode, coef, zero)
        i += UNROLL * step
    while i < n:
        y[uint64(i)] = _forward(x[uint64(i)] + zero, mode, coef, zero)
        i += step


@inlined
def _reads(mode):
    """(x, y): which inputs the slope of ``mode`` reads (_derivative): x for relu,
    clipped_relu, elu and swish; y for tanh, sigmoid, elu and swish; identity neither."""
    return (mode != TANH and mode != SIGMOID and mode != IDENTITY,
            mode != RELU and mode != CLIPPED_RELU and mode != IDENTITY)


@cuda.jit(cache=True)
def activation_bwd_kernel(x, y, dy, dx, mode, coef, acc):
    """dx[i] = dy[i] * f'(x[i]) (f' from x and y, see _derivative and _chain); same thread
    mapping as the forward kernel, all loads of a trip issued before the first slope. A NaN in
    dy propagates except where relu's or clipped_relu's slope is 0 (_chain). Traffic: reads dy
    and only what the mode's slope needs (_reads: relu and clipped_relu x, tanh and sigmoid y,
    elu and swish both, identity neither), writes dx."""
    zero = acc[0]
    rx, ry = _reads(mode)
    i, step, n = cuda.grid(1), cuda.gridsize(1), dx.size
    while i + 3 * step < n:
        g0, g1, g2, g3 = load4(dy, i, step, True, zero)
        v0, v1, v2, v3 = load4(x, i, step, rx, zero)
        w0, w1, w2, w3 = load4(y, i, step, ry, zero)
        dx[uint64(i)] = _chain(g0, v0, w0, mode, coef, zero)
        dx[uint64(i + step)] = _chain(g1, v1, w1, mode, coef, zero)
        dx[uint64(i + 2 * step)] = _chain(g2, v2, w2, mode, coef, zero)
        dx[uint64(i + 3 * step)] = _chain(g3, v3, w3, mode, coef, zero)
        i += UNROLL * step
    while i < n:
        j = uint64(i)
        v = x[j] + zero if rx else zero
        w = y[j] + zero if ry else zero
        dx[j] = _chain(dy[j] + zero, v, w, mode, coef, zero)
        i += step


def SIGNATURES(t, acc):
    from numba import int64
    a, z = t[::1], acc[::1]
    return {"activation_fwd_kernel": (a, a, int64, acc, z),
            "activation_bwd_kernel": (a, a, a, a, int64, acc, z)}
