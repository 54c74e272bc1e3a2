"""Float64 references of the activation functions (pointwise and softmax) and dropout."""

import numpy as np


def activation(x, mode="relu", coef=0.0):
    x = np.asarray(x, dtype=np.float64)
    # IEEE arithmetic as the kernels do it: exp overflows to inf, and swish(-inf) is
    # -inf / inf = NaN (the kernels' value too), not the limit 0
    with np.errstate(over="ignore", invalid="ignore"):
        if mode == "relu":
            return np.where(x > 0, x, np.where(np.isnan(x), x, 0.0))
        if mode == "clipped_relu":
            return np.where(np.isnan(x), x, np.clip(x, 0.0, coef))
        if mode == "tanh":
            return np.tanh(x)
        if mode == "sigmoid":
            return 1.0 / (1.0 + np.exp(-x))
        if mode == "elu":
            return np.where(x > 0, x, coef * np.expm1(np.minimum(x, 0)))
        if mode == "swish":
            return x / (1.0 + np.exp(-coef * x))
        if mode == "identity":
            return x.copy()
    raise ValueError(f"unknown activation mode {mode!r}")


def activation_backward(x, dy, mode="relu", coef=0.0):
    """dy * f'(x). At the kinks the slope is cuDNN's: relu 0 at x == 0, clipped_relu 1 at
    x == coef (0 at x == 0), elu 1 at x == 0. A NaN x gives 0 for relu/clipped_relu. relu and
    clipped_relu select rather than multiply, as cuDNN and PyTorch: where their slope is 0, dx
    is 0 even for a NaN or Inf dy."""
    x = np.asarray(x, dtype=np.float64)
    dy = np.asarray(dy, dtype=np.float64)
    with np.errstate(over="ignore"):
        if mode == "relu":
            d = (x > 0) * 1.0   # NaN > 0 is False: slope 0, as cuDNN
        elif mode == "clipped_relu":
            d = ((x > 0) & (x <= coef)) * 1.0
        elif mode == "tanh":
            d = 1.0 - np.tanh(x) ** 2
        elif mode == "sigmoid":
            s = 1.0 / (1.0 + np.exp(-x))
            d = s * (1.0 - s)
        elif mode == "elu":
            d = np.where(x >= 0, 1.0, coef * np.exp(np.minimum(x, 0)))
            d = np.where(np.isnan(x), np.nan, d)
        elif mode == "swish":
            s = 1.0 / (1.0 + np.exp(-coef * x))
            d = s + coef * x * s * (1.0 - s)
        elif mode == "identity":
            d = np.ones_like(x)
        else:
            raise ValueError(f"unknown activation mode {mode!r}")
    if mode in ("relu", "clipped_relu"):
        return np.where(d != 0, dy, 0.0)
    return dy * d


def _rows(x, mode):
    """View x as (N, C, S) with the reduction over axis 1."""
    x = np.asarray(x, dtype=np.float64)
    n, c = x.shape[0], x.shape[1]
    s = int(np.prod(x.shape[2:], dtype=np.int64))
    return x.reshape(n, c * s, 1) if mode == "instance" else x.reshape(n, c, s)


def softmax(x, algo="accurate", mode="channel"):
    shape = np.shape(x)
    r = _rows(x, mode)
    m = r.max(axis=1, keepdims=True)
    e = np.exp(r - m)
    tot = e.sum(axis=1, keepdims=True)
    out = (r - m - np.log(tot)) if algo == "log" else e / tot
    return out.reshape(shape)


def softmax_backward(y, dy, algo="accurate", mode="channel"):
    shape = np.shape(y)
    y, dy = _rows(y, mode), _rows(dy, mode)
    if algo == "log":
        out = dy - np.exp(y) * dy.sum(axis=1, keepdims=True)
    else:
        out = y * (dy - (dy * y).sum(axis=1, keepdims=True))
    return out.reshape(shape)


def dropout(x, mask, p):
    """x * mask / (1 - p) for a 0/1 (or boolean) mask."""
    return np.asarray(x, np.float64) * np.asarray(mask, np.float64) / (1.0 - p)
