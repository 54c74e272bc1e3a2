"""Float64 reference of N-d convolution: forward, data, filter and bias gradients."""

import numpy as np


def _flip(w):
    nd = w.ndim - 2
    return w[(slice(None), slice(None)) + (slice(None, None, -1),) * nd]


def _windows(x, ks, stride, padding, dilation):
    """cols[N, C, *taps, *out]: the padded input seen by every kernel tap at every output."""
    nd = x.ndim - 2
    xp = np.pad(x, [(0, 0), (0, 0)] + [(p, p) for p in padding])
    out = tuple((xp.shape[2 + i] - dilation[i] * (ks[i] - 1) - 1) // stride[i] + 1
                for i in range(nd))
    cols = np.empty(x.shape[:2] + tuple(ks) + out)
    for taps in np.ndindex(*ks):
        sl = tuple(slice(t * d, t * d + s * (o - 1) + 1, s)
                   for t, d, s, o in zip(taps, dilation, stride, out))
        cols[(slice(None), slice(None)) + taps] = xp[(slice(None), slice(None)) + sl]
    return cols, out, xp.shape


def _group_slices(c, k, groups):
    cg, kg = c // groups, k // groups
    return [(slice(g * cg, (g + 1) * cg), slice(g * kg, (g + 1) * kg)) for g in range(groups)]


def conv_forward(x, w, bias=None, stride=1, padding=0, dilation=1, groups=1, flip=False):
    """y[n, k, o] = sum_{c, t} x_pad[n, g*Cg + c, o*s + t*d] * w[k, c, t] (+ bias[k]);
    ``flip`` reverses the kernel (true convolution). Tuples have one entry per spatial dim."""
    x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
    nd = x.ndim - 2
    w = _flip(w) if flip else w
    cols, out, _ = _windows(x, w.shape[2:], stride, padding, dilation)
    y = np.empty((x.shape[0], w.shape[0]) + out)
    axes = list(range(1, 2 + nd))
    for cs, ks in _group_slices(x.shape[1], w.shape[0], groups):
        part = np.tensordot(cols[:, cs], w[ks], axes=(axes, axes))   # (N, *out, Kg)
        y[:, ks] = np.moveaxis(part, -1, 1)
    if bias is not None:
        y += np.asarray(bias, np.float64).reshape((1, -1) + (1,) * nd)
    return y


def conv_backward_data(dy, w, x_shape, stride=1, padding=0, dilation=1, groups=1, flip=False):
    dy, w = np.asarray(dy, np.float64), np.asarray(w, np.float64)
    w = _flip(w) if flip else w
    ks = w.shape[2:]
    padded = tuple(x_shape[:2]) + tuple(s + 2 * p for s, p in zip(x_shape[2:], padding))
    dxp = np.zeros(padded)
    for cs, kk in _group_slices(x_shape[1], w.shape[0], groups):
        # dcols[N, Cg, *taps, *out] = sum_k dy[N, k, *out] * w[k, Cg, *taps]
        wk = w[kk].reshape(w[kk].shape[0], w.shape[1], -1)              # (Kg, Cg, taps)
        dyk = dy[:, kk].reshape(dy.shape[0], wk.shape[0], -1)           # (N, Kg, out)
        dcols = np.einsum("nko,kct->ncto", dyk, wk)                     # (N, Cg, taps, out)
        dcols = dcols.reshape((dy.shape[0], wk.shape[1]) + tuple(ks) + dy.shape[2:])
        for taps in np.ndindex(*ks):
            sl = tuple(slice(t * d, t * d + s * (o - 1) + 1, s)
                       for t, d, s, o in zip(taps, dilation, stride, dy.shape[2:]))
            dxp[(slice(None), cs) + sl] += dcols[(slice(None), slice(None)) + taps]
    crop = tuple(slice(p, p + s) for p, s in zip(padding, x_shape[2:]))
    return dxp[(slice(None), slice(None)) + crop]


def conv_backward_filter(x, dy, w_shape, stride=1, padding=0, dilation=1, groups=1, flip=False):
    x, dy = np.asarray(x, np.float64), np.asarray(dy, np.float64)
    nd = x.ndim - 2
    cols, out, _ = _windows(x, w_shape[2:], stride, padding, dilation)
    dw = np.empty(w_shape)
    out_axes = list(range(2, 2 + nd))
    for cs, ks in _group_slices(x.shape[1], w_shape[0], groups):
        # dw[k, c, *taps] = sum_{n, o} dy[n, k, o] * cols[n, c, *taps, o]
        dw[ks] = np.tensordot(dy[:, ks], cols[:, cs],
                              axes=([0] + out_axes, [0] + [2 + nd + i for i in range(nd)]))
    return _flip(dw) if flip else dw


def conv_backward_bias(dy):
    dy = np.asarray(dy, np.float64)
    return dy.sum(axis=(0,) + tuple(range(2, dy.ndim)))
