"""Float64 reference of N-d pooling: direct loops over the output positions. Output size per
spatial dim (n, k, s, p): (n + 2p - k) // s + 1, or with ``ceil_mode`` ceil((n + 2p - k) / s)
+ 1, less one when that last window would start at or past n + p (PyTorch's
pooling_output_shape)."""

import numpy as np


def _pool_tuple(v, nd):
    return tuple(int(a) for a in v) if np.ndim(v) else (int(v),) * nd


def _out(n, k, s, p, ceil_mode):
    if not ceil_mode:
        return (n + 2 * p - k) // s + 1
    o = -(-(n + 2 * p - k) // s) + 1
    return o - 1 if (o - 1) * s >= n + p else o


def _geometry(nd, window, stride, padding):
    window = _pool_tuple(window, nd)
    stride = window if stride is None else _pool_tuple(stride, nd)
    return window, stride, _pool_tuple(padding, nd)


def pool_windows(x_shape, window, stride, padding, ceil_mode=False):
    """(output shape, [(output index, clipped input slices)], window size) of a pooling
    (stride None: the window)."""
    window, stride, padding = _geometry(len(x_shape) - 2, window, stride, padding)
    out = tuple(_out(n, k, s, p, ceil_mode)
                for n, k, s, p in zip(x_shape[2:], window, stride, padding))
    spans = [(o, tuple(slice(max(i * s - p, 0), min(i * s - p + k, n))
                       for i, n, k, s, p in zip(o, x_shape[2:], window, stride, padding)))
             for o in np.ndindex(*out)]
    return out, spans, int(np.prod(window))


def _inc_divisor(o, x_shape, window, stride, padding):
    """average_inc_pad's divisor of output o: the window clipped at the padded end n + p (the
    full window size unless ceil mode's last window overhangs: PyTorch's rule)."""
    window, stride, padding = _geometry(len(x_shape) - 2, window, stride, padding)
    return int(np.prod([min(i * s - p + k, n + p) - (i * s - p)
                        for i, n, k, s, p in zip(o, x_shape[2:], window, stride, padding)]))


def pool_forward(x, window, stride=None, padding=0, mode="max", ceil_mode=False):
    """Direct loops over the output positions. The window is clipped to the input (padding
    never enters a max or a sum); average_inc_pad divides by the window clipped at the padded
    end (the full window size without ceil mode), average_exc_pad by the number of inputs in
    the clipped window. NaN propagates."""
    x = np.asarray(x, np.float64)
    out, spans, _ = pool_windows(x.shape, window, stride, padding, ceil_mode)
    nc = x.shape[:2]
    y = np.empty(nc + out)
    for o, sl in spans:
        w = x[(slice(None), slice(None)) + sl]
        w = w.reshape(nc + (int(np.prod(w.shape[2:])),))
        if mode in ("max", "max_deterministic"):
            v = w.max(axis=-1) if w.size else np.zeros(nc)
        else:
            v = w.sum(axis=-1)
            if mode in ("average_inc_pad", "average"):
                v = v / _inc_divisor(o, x.shape, window, stride, padding)
            elif mode == "average_exc_pad":
                v = v / w.shape[-1]
        y[(slice(None), slice(None)) + o] = v
    return y


def pool_backward(x, dy, window, stride=None, padding=0, mode="max", ceil_mode=False):
    """dx of :func:`pool_forward`. Max routes dy[o] to the window's first maximum in scan order
    (the lowest address), or to its first NaN: numpy's argmax rule."""
    x, dy = np.asarray(x, np.float64), np.asarray(dy, np.float64)
    out, spans, _ = pool_windows(x.shape, window, stride, padding, ceil_mode)
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
            div = 1
            if mode in ("average_inc_pad", "average"):
                div = _inc_divisor(o, x.shape, window, stride, padding)
            elif mode == "average_exc_pad":
                div = int(np.prod([s.stop - s.start for s in sl]))
            dx[(slice(None), slice(None)) + sl] += (g / div)[(...,) + (None,) * len(sl)]
    return dx
