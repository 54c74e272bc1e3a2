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


@cuda.jit(cache=True)
def activation_fwd_kernel(x, y, mode, coef, acc):
    """y[i] = f(x[i]) on flat arrays. Thread mapping: grid-stride loop, one element per thread
    per iteration, consecutive threads on consecutive elements (coalesced)."""
    zero = acc[0]
    start, step = cuda.grid(1), cuda.gridsize(1)
    for i in range(start, x.size, step):
        y[i] = _forward(x[i] + zero, mode, coef, zero)


@cuda.jit(cache=True)
def activation_bwd_kernel(x, y, dy, dx, mode, coef, acc):
    """dx[i] = dy[i] * f'(x[i]) (f' from x and y, see _derivative); same thread mapping as the
    forward kernel. A NaN in dy always propagates."""
    zero = acc[0]
    start, step = cuda.grid(1), cuda.gridsize(1)
    for i in range(start, x.size, step):
        v = x[i] + zero
        dx[i] = (dy[i] + zero) * _derivative(v, y[i] + zero, mode, coef, zero)


def SIGNATURES(t, acc):
    from numba import int64
    a, z = t[::1], acc[::1]
    return {"activation_fwd_kernel": (a, a, int64, acc, z),
            "activation_bwd_kernel": (a, a, a, a, int64, acc, z)}
