"""Elementwise activations, forward and backward.

Modes (integers shared with dnnkit.ops.activation): 0 relu, 1 clipped_relu (coef = ceiling),
2 tanh, 3 sigmoid, 4 elu (coef = alpha), 5 swish (coef = beta), 6 identity.
NaN propagates through every mode (as cuDNN with CUDNN_PROPAGATE_NAN): comparisons are written
so that a NaN input falls through to ``v``. Memory traffic: forward reads x, writes y;
backward reads x, y, dy and writes dx.
"""

import math

from numba import cuda, float32

RELU, CLIPPED_RELU, TANH, SIGMOID, ELU, SWISH, IDENTITY = range(7)


@cuda.jit(device=True, inline=True)
def _sigmoid(v, one):
    # exp of a non-positive argument only, so nothing overflows: 1/(1+e^-v) for v >= 0 and
    # e^v/(1+e^v) for v < 0 (equal in exact arithmetic). NaN takes the second branch.
    if v >= one - one:
        return one / (one + math.exp(-v))
    e = math.exp(v)
    return e / (one + e)


@cuda.jit(device=True, inline=True)
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
        return _sigmoid(v, one)
    if mode == ELU:
        return coef * (math.exp(v) - one) if v <= zero else v
    if mode == SWISH:
        return v * _sigmoid(coef * v, one)
    return v


@cuda.jit(device=True, inline=True)
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
        s = _sigmoid(coef * v, one)                     # d/dx x*s(bx) = s + b*y*(1 - s)
        return s + coef * w * (one - s)
    return one


# Four elements per thread per trip, all four loads issued before the first store: with one
# load in flight per thread an SM holds ~8 KB of requests, too few to cover HBM latency (the
# one-element loop ran at 64% of the copy rate on an H100); the tail takes one per trip.
UNROLL = 4


@cuda.jit(cache=True)
def activation_fwd_kernel(x, y, mode, coef, acc):
    """y[i] = f(x[i]) on flat arrays. Thread mapping: grid-stride loop, consecutive threads on
    consecutive elements (coalesced), UNROLL elements a grid-stride apart per trip."""
    zero = acc[0]
    i, step, n = cuda.grid(1), cuda.gridsize(1), x.size
    while i + 3 * step < n:
        a, b, c, d = x[i], x[i + step], x[i + 2 * step], x[i + 3 * step]
        y[i] = _forward(a + zero, mode, coef, zero)
        y[i + step] = _forward(b + zero, mode, coef, zero)
        y[i + 2 * step] = _forward(c + zero, mode, coef, zero)
        y[i + 3 * step] = _forward(d + zero, mode, coef, zero)
        i += UNROLL * step
    while i < n:
        y[i] = _forward(x[i] + zero, mode, coef, zero)
        i += step


@cuda.jit(device=True, inline=True)
def _grad(x, y, dy, i, mode, coef, zero):
    return (dy[i] + zero) * _derivative(x[i] + zero, y[i] + zero, mode, coef, zero)


@cuda.jit(cache=True)
def activation_bwd_kernel(x, y, dy, dx, mode, coef, acc):
    """dx[i] = dy[i] * f'(x[i]) (f' from x and y, see _derivative); same thread mapping as the
    forward kernel (the four gradients are computed before any is stored). A NaN in dy always
    propagates."""
    zero = acc[0]
    i, step, n = cuda.grid(1), cuda.gridsize(1), x.size
    while i + 3 * step < n:
        a = _grad(x, y, dy, i, mode, coef, zero)
        b = _grad(x, y, dy, i + step, mode, coef, zero)
        c = _grad(x, y, dy, i + 2 * step, mode, coef, zero)
        d = _grad(x, y, dy, i + 3 * step, mode, coef, zero)
        dx[i], dx[i + step], dx[i + 2 * step], dx[i + 3 * step] = a, b, c, d
        i += UNROLL * step
    while i < n:
        dx[i] = _grad(x, y, dy, i, mode, coef, zero)
        i += step


def SIGNATURES(t, acc):
    from numba import int64
    a, z = t[::1], acc[::1]
    return {"activation_fwd_kernel": (a, a, int64, acc, z),
            "activation_bwd_kernel": (a, a, a, a, int64, acc, z)}
