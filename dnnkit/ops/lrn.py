"""Local response normalization across channels (LRN), forward and backward.

For x (N, C, *spatial), at every sample and spatial position:

    y[c] = x[c] / (k + alpha/size * sum_{c' in W(c)} x[c']^2)^beta
    W(c) = [c - (size - 1) // 2, c + size // 2], clipped to [0, C)

Backward, with q(c) = k + alpha/size * sum_{W(c)} x^2 (so y[c] = x[c] * q(c)^-beta):

    dx[i] = dy[i] * q(i)^-beta - 2 * beta * alpha/size * x[i] * sum_{j: i in W(j)} dy[j] y[j] / q(j)

The window is cuDNN's (lookBehind = (size - 1) // 2 channels before c, lookAhead = size // 2
after; also Caffe's and Torch7's SpatialCrossMapLRN), and alpha is divided by ``size`` whatever
the clipping, as cuDNN and PyTorch do. PyTorch's torch.nn.LocalResponseNorm takes the same
window for an odd size (AlexNet's and GoogLeNet's 5); for an even size its window is one
channel earlier, [c - size // 2, c + (size - 1) // 2]. A NaN in x makes every output whose
window holds it NaN.

Backends: Numba (kernels/lrn.py: one thread per element, each window sum taken afresh) and
cuDNN (cudnnLRNCrossChannelForward/Backward, CUDNN_LRN_CROSS_CHANNEL_DIM1, on the 4-D view
(N, C, S, 1), S the product of the spatial dims). cuDNN's descriptor takes 1 <= size <= 16,
k >= 1e-5 and beta >= 0.01 only: other arguments run on Numba (``supports()``). Batches over
cuDNN's 32-bit tensor limit run as pieces of the batch (ops/split.py).
"""

from __future__ import annotations

import math
import numbers
from typing import NamedTuple

import numpy as np

from .. import arrays, device, reference
from ..autograd import gradient
from ..cudnn import lrn as cudnn_lrn
from ..dispatch import public_op
from ..hints import ArrayLike, Backend, Stream
from ..launch import launch
from ..registry import register
from . import split
from .args import INT64_LIMIT

_TOL = {"float16": (5e-3, 1e-3), "float32": (1e-5, 1e-6), "float64": (1e-12, 1e-14)}
_NDIM = (3, 4, 5)


class LrnArgs(NamedTuple):
    """lrn's checked arguments, as its implementations take them."""
    x: object
    size: int
    alpha: float
    beta: float
    k: float
    stream: object


class LrnBackwardArgs(NamedTuple):
    """lrn_backward's checked arguments, as its implementations take them."""
    x: object
    y: object
    dy: object
    size: int
    alpha: float
    beta: float
    k: float
    stream: object


def check_params(op, size, alpha, beta, k):
    """(size, alpha, beta, k) as (int, float, float, float): ``size`` an int >= 1 (not a
    bool), the others finite real numbers; TypeError / ValueError naming ``op`` (an op or a
    layer), the argument and the value otherwise."""
    if isinstance(size, (bool, np.bool_)) or not isinstance(size, (int, np.integer)):
        raise TypeError(f"{op}: size must be an int; got {size!r}")
    if not 1 <= size < INT64_LIMIT:
        raise ValueError(f"{op}: size must be >= 1 (and < 2**63); got {size}")
    out = [int(size)]
    for name, v in (("alpha", alpha), ("beta", beta), ("k", k)):
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Real):
            raise TypeError(f"{op}: {name} must be a real number; got {v!r}")
        if not math.isfinite(float(v)):
            raise ValueError(f"{op}: {name} must be finite; got {v!r}")
        out.append(float(v))
    return tuple(out)


@public_op("lrn")
def lrn(x: ArrayLike, size: int, alpha: float = 1e-4, beta: float = 0.75, k: float = 1.0, *,
        stream: Stream = None, backend: Backend | None = None) -> LrnArgs:
    """Local response normalization across channels; y shaped like ``x``:

        y[c] = x[c] / (k + alpha/size * sum of x[c']^2 over c' in [c - (size-1)//2,
               c + size//2] clipped to [0, C))^beta

    at every sample and spatial position. x: (N, C, L), (N, C, H, W) or (N, C, D, H, W),
    float16, float32 or float64 (computed in float32 for float16). ``size``: the window's
    width in channels, an int >= 1; ``alpha`` (default 1e-4, divided by size), ``beta``
    (default 0.75), ``k`` (default 1.0): finite numbers. The window is cuDNN's; PyTorch's
    LocalResponseNorm has the same for an odd size and one channel earlier for an even size.
    cuDNN runs 1 <= size <= 16, k >= 1e-5 and beta >= 0.01; other values run on Numba. The
    gradient is :func:`lrn_backward`.
    Raises ValueError for x not 3-D to 5-D, a size < 1 or a parameter that is not finite;
    TypeError for a size that is not an int, a parameter that is not a number or x not a
    float array."""
    size, alpha, beta, k = check_params("lrn", size, alpha, beta, k)
    s = arrays.as_stream(stream)
    x = arrays.device_input("lrn", "x", x, s, ndim=_NDIM)
    return LrnArgs(x, size, alpha, beta, k, s)


@public_op("lrn_backward")
def lrn_backward(x: ArrayLike, y: ArrayLike, dy: ArrayLike, size: int, alpha: float = 1e-4,
                 beta: float = 0.75, k: float = 1.0, *, stream: Stream = None,
                 backend: Backend | None = None) -> LrnBackwardArgs:
    """Gradient wrt x of ``y = lrn(x, size, alpha, beta, k)``, given x, y and dy; returns dx
    shaped like x. With q(c) = k + alpha/size * sum of x^2 over the window of c:

        dx[i] = dy[i] * q(i)^-beta - 2*beta*alpha/size * x[i] * sum_j dy[j] * y[j] / q(j)

    over the channels j whose window holds i. x, y, dy: one shape, (N, C, L), (N, C, H, W) or
    (N, C, D, H, W), and one dtype (float16, float32 or float64). ``size``, ``alpha``,
    ``beta``, ``k``: the forward's (an int >= 1, finite numbers).
    Raises ValueError for arrays of different shapes or not 3-D to 5-D, a size < 1 or a
    parameter that is not finite; TypeError for different dtypes, a size that is not an int
    or a parameter that is not a number."""
    op = "lrn_backward"
    size, alpha, beta, k = check_params(op, size, alpha, beta, k)
    s = arrays.as_stream(stream)
    x = arrays.device_input(op, "x", x, s, ndim=_NDIM)
    y = arrays.device_input(op, "y", y, s, ndim=_NDIM)
    dy = arrays.device_input(op, "dy", dy, s, ndim=_NDIM)
    arrays.same_shape(op, "x", x, y=y, dy=dy)
    return LrnBackwardArgs(x, y, dy, size, alpha, beta, k, s)


# ---------------------------------------------------------------- Numba
# (The kernels are imported inside the functions: they import numba, which ``import dnnkit``
# does not pay for.)

def _launch(kernel, x, size, alpha, beta, k, stream, *arrays_):
    """One thread per element, grid-stride (kernels/lrn.py); geo = (C, S, LB, LA), the
    window's reach clipped to the channels (the same windows, and no int64 overflow for a
    huge size)."""
    c, s = x.shape[1], math.prod(x.shape[2:])
    lb = min((size - 1) // 2, c)
    la = min(size - 1 - (size - 1) // 2, c)
    acc = arrays.acc_array(x.dtype)
    t = acc.dtype.type
    blocks, threads = arrays.grid_1d(x.size, 32 if device.simulator() else 256)
    launch(kernel, blocks, threads, stream,
           tuple(arrays.flat(a) for a in arrays_) + ((c, s, lb, la), t(alpha / size), t(beta),
                                                     t(k), acc))


@register("lrn", "numba", tolerance=_TOL)
def _lrn_numba(x, size, alpha, beta, k, stream):
    from ..kernels import lrn_fwd_kernel
    y = arrays.empty_like(x, stream)
    if x.size:
        _launch(lrn_fwd_kernel, x, size, alpha, beta, k, stream, x, y)
    return y


@register("lrn_backward", "numba", tolerance=_TOL)
def _lrn_backward_numba(x, y, dy, size, alpha, beta, k, stream):
    from ..kernels import lrn_bwd_kernel
    dx = arrays.empty_like(x, stream)
    if x.size:
        _launch(lrn_bwd_kernel, x, size, alpha, beta, k, stream, x, y, dy, dx)
    return dx


# ---------------------------------------------------------------- cuDNN

def _sample(x):
    """Elements of one sample (C*S): the item cuDNN's calls are split between."""
    return math.prod(x.shape[1:])


def _cudnn_supports(x, size, alpha, beta, k, stream):
    """cudnnSetLRNDescriptor's limits (CUDNN_STATUS_BAD_PARAM outside them, cuDNN 9.28), then
    the 32-bit tensor limit of one sample."""
    if not cudnn_lrn.MIN_N <= size <= cudnn_lrn.MAX_N:
        return (f"cuDNN's LRN window is {cudnn_lrn.MIN_N} to {cudnn_lrn.MAX_N} channels "
                f"(CUDNN_LRN_MAX_N); got size {size}")
    if k < cudnn_lrn.MIN_K:
        return f"cuDNN's LRN needs k >= {cudnn_lrn.MIN_K:g} (CUDNN_LRN_MIN_K); got k {k}"
    if beta < cudnn_lrn.MIN_BETA:
        return (f"cuDNN's LRN needs beta >= {cudnn_lrn.MIN_BETA:g} (CUDNN_LRN_MIN_BETA); got "
                f"beta {beta}")
    return split.too_big(_sample(x), lambda: f"one sample of x {tuple(x.shape)}")


def _cudnn_backward_supports(x, y, dy, size, alpha, beta, k, stream):
    return _cudnn_supports(x, size, alpha, beta, k, stream)


def _dims(a):
    """cuDNN's 4-D view (N, C, S, 1) of an (N, C, *spatial) array."""
    return (a.shape[0], a.shape[1], math.prod(a.shape[2:]), 1)


@register("lrn", "cudnn", supports=_cudnn_supports)
def _lrn_cudnn(x, size, alpha, beta, k, stream):
    y = arrays.empty_like(x, stream)
    if x.size:
        for xp, yp in split.batch(_sample(x), x, y):
            cudnn_lrn.forward(xp, yp, _dims(xp), size, alpha, beta, k,
                              device.stream_pointer(stream))
    return y


@register("lrn_backward", "cudnn", supports=_cudnn_backward_supports)
def _lrn_backward_cudnn(x, y, dy, size, alpha, beta, k, stream):
    dx = arrays.empty_like(x, stream)
    if x.size:
        for xp, yp, dyp, dxp in split.batch(_sample(x), x, y, dy, dx):
            cudnn_lrn.backward(xp, yp, dyp, dxp, _dims(xp), size, alpha, beta, k,
                               device.stream_pointer(stream))
    return dx


# ---------------------------------------------------------------- python -m dnnkit check

# alpha large enough that the normalization changes y by tens of percent (with the default
# 1e-4, y = x to four digits and a wrong window would go unseen)
_CHECK = (1.0, 0.75, 2.0)       # alpha, beta, k


def selfcheck_cases(Case):
    small, big = (2, 7, 3, 4), (32, 96, 27, 27)
    out = []
    for size in (5, 4):
        make, name = _check_inputs(small, big, size), f"size {size}"
        out.append(Case("lrn", name,
                        lambda b, s, i, n=size: lrn(i[0], n, *_CHECK, backend=b, stream=s),
                        lambda i, n=size: reference.lrn(i[0], n, *_CHECK), make))
        out.append(Case("lrn_backward", name,
                        lambda b, s, i, n=size: lrn_backward(*i, n, *_CHECK, backend=b,
                                                             stream=s),
                        lambda i, n=size: reference.lrn_backward(i[0], i[2], n, *_CHECK),
                        make))
    return out


def _check_inputs(small, big, size):
    def make(rng, dtype, b):
        x = rng.standard_normal(big if b else small).astype(dtype)
        y = reference.lrn(x, size, *_CHECK).astype(dtype)
        return x, y, rng.standard_normal(x.shape).astype(dtype)
    return make


# ---------------------------------------------------------------- autograd

@gradient("lrn")
def _lrn_grad(g, dy):
    if not g.needs("x"):
        return {}
    return {"x": lrn_backward(g.x, g.out, dy, g.size, g.alpha, g.beta, g.k, backend=g.backend,
                              stream=g.stream)}
