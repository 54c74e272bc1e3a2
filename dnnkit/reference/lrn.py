"""Float64 reference of local response normalization across channels (forward, backward).

The window of channel c is [c - (size - 1) // 2, c + size // 2] clipped to [0, C) (cuDNN's
lookBehind and lookAhead), and alpha is divided by ``size`` whatever the clipping:

    q(c) = k + alpha/size * sum_{c' in W(c)} x[c']^2          y[c] = x[c] * q(c)^-beta
"""

import numpy as np


def lrn_window(size):
    """(channels before c, channels after c) of the window of a ``size``-channel LRN."""
    before = (size - 1) // 2
    return before, size - 1 - before


def _window_sums(v, before, after):
    """out[:, c] = sum of v[:, c'] over c' in [c - before, c + after] clipped to the channels."""
    c = v.shape[1]
    out = np.empty_like(v)
    for i in range(c):
        out[:, i] = v[:, max(i - before, 0):min(i + after, c - 1) + 1].sum(axis=1)
    return out


def _q(x, size, alpha, k):
    before, after = lrn_window(size)
    return k + alpha / size * _window_sums(x * x, before, after)


def lrn(x, size, alpha=1e-4, beta=0.75, k=1.0):
    """y = x * q^-beta for x (N, C, *spatial)."""
    x = np.asarray(x, np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        return x * np.power(_q(x, size, alpha, k), -beta)


def lrn_backward(x, dy, size, alpha=1e-4, beta=0.75, k=1.0):
    """dx of y = lrn(x) given dy: dy * q^-beta - 2 beta alpha/size * x * S, where S[i] sums
    dy[j] * y[j] / q[j] over the channels j whose window holds i (the window mirrored:
    [i - size // 2, i + (size - 1) // 2])."""
    x, dy = np.asarray(x, np.float64), np.asarray(dy, np.float64)
    before, after = lrn_window(size)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        q = _q(x, size, alpha, k)
        qb = np.power(q, -beta)
        back = _window_sums(dy * x * qb / q, after, before)
        return dy * qb - 2.0 * beta * alpha / size * x * back
