"""Global average pooling: the mean over every spatial position, with its gradient rule.

    global_avg_pool(x)    x (N, C, H, W) or (N, C, D, H, W) -> y (N, C)
                          y[n, c] = sum over space of x[n, c] / (spatial size)

It is pool2d / pool3d ``average`` (ops/pool.py) with the whole spatial extent as the window, no
padding, and the (N, C, 1, 1) result viewed as (N, C): the same Numba kernels (global pooling
takes their flat walk: one (plane, position) pair per thread) and the same
cudnnPoolingForward. The gradient (the rule below) is pool2d_backward / pool3d_backward on the
backend of the forward: dx = dy / (spatial size) at every position. PyTorch:
``AdaptiveAvgPool2d(1)`` followed by a flatten.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from .. import arrays
from ..autograd import gradient
from ..dispatch import public_op
from ..hints import ArrayLike, Backend, Stream
from ..registry import register
from . import split
from .pool import PoolGeom, make_geom, pool2d, pool2d_backward, pool3d, pool3d_backward

_TOL = {"float16": (5e-3, 1e-3), "float32": (1e-5, 1e-6), "float64": (1e-12, 1e-14)}
_MODE = "average_inc_pad"      # no padding: the same as average_exc_pad


class GlobalPoolArgs(NamedTuple):
    """global_avg_pool's checked arguments: the pooling of x over its whole spatial extent."""
    x: object
    geom: PoolGeom
    stream: object


@public_op("global_avg_pool")
def global_avg_pool(x: ArrayLike, *, stream: Stream = None,
                    backend: Backend | None = None) -> GlobalPoolArgs:
    """The mean over every spatial position: x (N, C, H, W) or (N, C, D, H, W) -> y (N, C).

    y[n, c] = sum of x[n, c, ...] / (the number of spatial positions): pool2d / pool3d with mode
    "average" and the whole spatial extent as the window, reshaped (the same kernels and cuDNN
    calls); its gradient is their backward. No options besides ``backend`` and ``stream``.
    Raises ValueError for x not 4-D or 5-D or with an empty spatial dimension; TypeError for a
    non-float x."""
    op = "global_avg_pool"
    s = arrays.as_stream(stream)
    x = arrays.device_input(op, "x", x, s, ndim=(4, 5))
    shape = tuple(x.shape)
    if 0 in shape[2:]:
        raise ValueError(f"{op}: x has an empty spatial dimension (a mean over nothing); "
                         f"shape {shape}")
    return GlobalPoolArgs(x, make_geom(op, len(shape) - 2, shape, shape[2:], None, 0), s)


def _pool(x, geom, backend, stream):
    fwd = pool2d if geom.nd == 2 else pool3d
    y = fwd(x, geom.window, None, 0, _MODE, backend=backend, stream=stream)
    return arrays.reshaped(y, geom.x_shape[:2])


def _cudnn_supports(x, geom, stream):
    """pool2d's and pool3d's: batches over cuDNN's 32-bit limit run as pieces (ops/split.py),
    an image over it cannot run."""
    return split.too_big(math.prod(geom.x_shape[1:]),
                         lambda: f"one image of x {geom.x_shape}")


@register("global_avg_pool", "numba", tolerance=_TOL)
def _global_numba(x, geom, stream):
    return _pool(x, geom, "numba", stream)


@register("global_avg_pool", "cudnn", supports=_cudnn_supports)
def _global_cudnn(x, geom, stream):
    return _pool(x, geom, "cudnn", stream)


@gradient("global_avg_pool")
def _global_avg_pool_grad(g, dy):
    """pool*_backward of the average pooling (its y is not read for average modes: dy, of
    y's shape, stands in for it)."""
    if not g.needs("x"):
        return {}
    shape = tuple(g.x.shape)
    nd = len(shape) - 2
    dy_full = arrays.reshaped(dy, shape[:2] + (1,) * nd)
    backward = pool2d_backward if nd == 2 else pool3d_backward
    return {"x": backward(g.x, dy_full, dy_full, shape[2:], None, 0, _MODE,
                          backend=g.backend, stream=g.stream)}


# ---------------------------------------------------------------- python -m dnnkit check

def selfcheck_cases(Case):
    def make(rng, dtype, big):
        return (rng.standard_normal((32, 512, 7, 7) if big else (2, 3, 4, 5)).astype(dtype),)
    return [Case("global_avg_pool", "whole extent",
                 lambda b, s, i: global_avg_pool(i[0], backend=b, stream=s),
                 lambda i: i[0].mean(axis=(2, 3)), make)]
