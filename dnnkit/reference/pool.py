"""Float64 reference of N-d pooling: direct loops over the output positions."""

import numpy as np


def _pool_tuple(v, nd):
    return tuple(int(a) for a in v) if np.ndim(v) else (int(v),) * nd


def pool_windows(x_shape, window, stride, padding):
    """(output shape, [(output index, clipped input slices)], window size) of a pooling
    (stride None: the window)."""
    nd = len(x_shape) - 2
    window = _pool_tuple(window, nd)
    stride = window if stride is None else _pool_tuple(stride, nd)
    padding = _pool_tuple(padding, nd)
    out = tuple((n + 2 * p - k) // s + 1
                for n, k, s, p in zip(x_shape[2:], window, stride, padding))
    spans = [(o, tuple(slice(max(i * s - p, 0), min(i * s - p + k, n))
                       for i, n, k, s, p in zip(o, x_shape[2:], window, stride, padding)))
             for o in np.ndindex(*out)]
    return out, spans, int(np.prod(window))


def pool_forward(x, window, stride=None, padding=0, mode="max"):
    """Direct loops over the output positions. The window is clipped to the input (padding
    never enters a max or a sum); average_inc_pad divides by the full window size,
    average_exc_pad by the number of inputs in the clipped window. NaN propagates."""
    x = np.asarray(x, np.float64)
    out, spans, ksize = pool_windows(x.shape, window, stride, padding)
    nc = x.shape[:2]
    y = np.empty(nc + out)
    for o, sl in spans:
        w = x[(slice(None), slice(None)) + sl]
        w = w.reshape(nc + (int(np.prod(w.shape[2:])),))
        if mode in ("max", "max_deterministic"):
            v = w.max(axis=-1) if w.size else np.zeros(nc)
        else:
            v = w.sum(axis=-1)
            v = v / {"average_inc_pad": ksize, "average": ksize,
                     "average_exc_pad": w.shape[-1], "sum": 1}[mode]
        y[(slice(None), slice(None)) + o] = v
    return y


def pool_backward(x, dy, window, stride=None, padding=0, mode="max"):
    """dx of :func:`pool_forward`. Max routes dy[o] to the window's first maximum in scan order
    (the lowest address), or to its first NaN: numpy's argmax rule."""
    x, dy = np.asarray(x, np.float64), np.asarray(dy, np.float64)
    out, spans, ksize = pool_windows(x.shape, window, stride, padding)
    nc = x.shape[:2]
    dx = np.zeros(x.shape)
    n_i, c_i = np.indices(nc)
    for o, sl in spans:
        g = dy[(slice(None), slice(None)) + o]
        if mode in ("max", "max_deterministic"):
            w = x[(slice(None), slice(None)) + sl]
            flat = w.reshape(nc + (int(np.prod(w.shape[2:])),))
            if not flat.size:
                continue
            taps = np.unravel_index(flat.argmax(axis=-1), w.shape[2:])
            at = (n_i, c_i) + tuple(t + s.start for t, s in zip(taps, sl))
            dx[at] += g      # one target per (n, c): no repeated index within this update
        else:
            count = int(np.prod([s.stop - s.start for s in sl]))
            div = {"average_inc_pad": ksize, "average": ksize, "average_exc_pad": count,
                   "sum": 1}[mode]
            dx[(slice(None), slice(None)) + sl] += (g / div)[(...,) + (None,) * len(sl)]
    return dx
