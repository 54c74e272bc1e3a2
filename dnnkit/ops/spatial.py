"""Spatial transformer: affine grid generator and bilinear sampler, forward and backward.

    affine_grid(theta (N, 2, 3), out_shape (N, C, H', W'))  -> grid (N, H', W', 2) of (x, y)
    grid_sample(img (N, C, H, W), grid (N, H', W', 2))       -> y (N, C, H', W')
    spatial_transformer(img, theta, scale_height, scale_width) = both, H' = ceil(H * sh),
        W' = ceil(W * sw) (Theano's dnn_spatialtf)
    grid_sample_backward(img, grid, dy) -> (dimg, dgrid);  affine_grid_backward(dgrid) -> dtheta

Coordinates (kernels/spatial.py, the one place; docs/spatial.md): corner pixel centres at
+-1 (PyTorch's align_corners=True), a 1-point output dimension at -1 (cuDNN's); bilinear,
zero outside. Empty dimensions: N = 0 gives empty outputs; C = 0 or a grid of no points gives
an empty y and zero gradients (sums over nothing) for whichever of dimg, dgrid is not empty;
an img of H or W = 0, an affine grid of H' or W' = 0: ValueError.

Backends: Numba (kernels/spatial.py) and cuDNN (dnnkit/cudnn/spatial.py). Numba's dimg is
scattered with atomic adds (float32 accumulator for float16 data), or, under
``dnn.deterministic``, gathered by input rows in a fixed order: bitwise repeatable.
cuDNN's sampler backward is used only when ``dnn.deterministic`` is off (its determinism is
not documented), and so is its grid generator backward (measured not bitwise repeatable).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .. import arrays, config, device, reference
from ..autograd import gradient
from ..cudnn import spatial as cudnn_spatial
from ..dispatch import public_op
from ..hints import ArrayLike, Backend, Shape, Stream
from ..registry import register
from . import spatial_numba  # noqa: F401 - registers the Numba implementations



class AffineGridArgs(NamedTuple):
    """affine_grid's checked arguments, as its implementations take them."""
    theta: object
    out_shape: tuple
    stream: object


class AffineGridBackwardArgs(NamedTuple):
    """affine_grid_backward's checked arguments."""
    dgrid: object
    stream: object


class GridSampleArgs(NamedTuple):
    """grid_sample's checked arguments."""
    img: object
    grid: object
    stream: object


class GridSampleBackwardArgs(NamedTuple):
    """grid_sample_backward's checked arguments."""
    img: object
    grid: object
    dy: object
    stream: object


class SpatialTransformerArgs(NamedTuple):
    """spatial_transformer's checked arguments: ``out_shape`` (N, C, H', W') of y."""
    img: object
    theta: object
    out_shape: tuple
    stream: object


def _same_dtype(op, ref_name, ref, **others):
    for name, a in others.items():
        if a.dtype != ref.dtype:
            raise TypeError(f"{op}: {name} has dtype {a.dtype} but {ref_name} has {ref.dtype}")


def _out_shape(op, out_shape, n):
    try:
        t = tuple(out_shape)
    except TypeError:
        raise TypeError(f"{op}: out_shape must be a tuple (N, C, H', W'); got {out_shape!r}") \
            from None
    if len(t) != 4 or not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool)
                              for v in t):
        raise TypeError(f"{op}: out_shape must be 4 ints (N, C, H', W'); got {out_shape!r}")
    t = tuple(int(v) for v in t)
    if t[0] != n:
        raise ValueError(f"{op}: out_shape {t} has N = {t[0]} but theta has N = {n}")
    if min(t[1:]) < 1:
        raise ValueError(f"{op}: out_shape {t} must have C, H', W' >= 1")
    return t


def _theta(op, theta, s):
    theta = arrays.device_input(op, "theta", theta, s, ndim=(3,))
    if tuple(theta.shape[1:]) != (2, 3):
        raise ValueError(f"{op}: theta must be (N, 2, 3); got shape {tuple(theta.shape)}")
    return theta


def _img_grid(op, img, grid, s):
    img = arrays.device_input(op, "img", img, s, ndim=(4,))
    grid = arrays.device_input(op, "grid", grid, s, ndim=(4,))
    if grid.shape[3] != 2 or grid.shape[0] != img.shape[0]:
        raise ValueError(f"{op}: grid must be (N, H', W', 2) with img's N = {img.shape[0]}; "
                         f"got shape {tuple(grid.shape)}")
    if min(img.shape[2:]) < 1:
        raise ValueError(f"{op}: img has an empty spatial dimension; shape {tuple(img.shape)}")
    _same_dtype(op, "img", img, grid=grid)
    return img, grid


@public_op("affine_grid")
def affine_grid(theta: ArrayLike, out_shape: Shape, *, stream: Stream = None,
                backend: Backend | None = None) -> AffineGridArgs:
    """The sampling grid (N, H', W', 2) of (x, y) for theta (N, 2, 3) and ``out_shape``
    (N, C, H', W'): ``grid[n, i, j] = theta[n] @ (x_j, y_i, 1)``, x_j = -1 + 2j/(W'-1),
    y_i = -1 + 2i/(H'-1) (-1 for a 1-point dimension, as cuDNN).
    Raises ValueError for theta not (N, 2, 3) or an out_shape with another N or a size < 1;
    TypeError for an out_shape that is not 4 ints."""
    s = arrays.as_stream(stream)
    theta = _theta("affine_grid", theta, s)
    return AffineGridArgs(theta, _out_shape("affine_grid", out_shape, theta.shape[0]), s)


@public_op("affine_grid_backward")
def affine_grid_backward(dgrid: ArrayLike, *, stream: Stream = None,
                         backend: Backend | None = None) -> AffineGridBackwardArgs:
    """Gradient of :func:`affine_grid`: dtheta (N, 2, 3) = sum over the grid points of
    dgrid[n, i, j] (x) (x_j, y_i, 1), from dgrid (N, H', W', 2).
    Raises ValueError for a dgrid not (N, H', W', 2) with H', W' >= 1."""
    op = "affine_grid_backward"
    s = arrays.as_stream(stream)
    dgrid = arrays.device_input(op, "dgrid", dgrid, s, ndim=(4,))
    if dgrid.shape[3] != 2 or min(dgrid.shape[1:3]) < 1:
        raise ValueError(f"{op}: dgrid must be (N, H', W', 2) with H', W' >= 1; got shape "
                         f"{tuple(dgrid.shape)}")
    return AffineGridBackwardArgs(dgrid, s)


@public_op("grid_sample")
def grid_sample(img: ArrayLike, grid: ArrayLike, *, stream: Stream = None,
                backend: Backend | None = None) -> GridSampleArgs:
    """Bilinear samples y (N, C, H', W') of img (N, C, H, W) at the normalized (x, y) of grid
    (N, H', W', 2): pixel u = (x + 1)(W - 1)/2, v = (y + 1)(H - 1)/2; zero outside the image.
    Raises ValueError for a grid not (N, H', W', 2) with img's N, or an empty img; TypeError for
    mixed dtypes."""
    s = arrays.as_stream(stream)
    return GridSampleArgs(*_img_grid("grid_sample", img, grid, s), s)


@public_op("grid_sample_backward")
def grid_sample_backward(img: ArrayLike, grid: ArrayLike, dy: ArrayLike, *,
                         stream: Stream = None,
                         backend: Backend | None = None) -> GridSampleBackwardArgs:
    """Gradients of :func:`grid_sample` wrt img (N, C, H, W) and grid (N, H', W', 2), given dy
    (N, C, H', W'): returns (dimg, dgrid). Numba adds dimg atomically, or in a fixed order under
    dnn.deterministic (bitwise repeatable).
    Raises ValueError for shapes that do not match; TypeError for mixed dtypes."""
    op = "grid_sample_backward"
    s = arrays.as_stream(stream)
    img, grid = _img_grid(op, img, grid, s)
    dy = arrays.device_input(op, "dy", dy, s, ndim=(4,))
    want = tuple(img.shape[:2]) + tuple(grid.shape[1:3])
    if tuple(dy.shape) != want:
        raise ValueError(f"{op}: dy has shape {tuple(dy.shape)}; img {tuple(img.shape)} and "
                         f"grid {tuple(grid.shape)} give {want}")
    _same_dtype(op, "img", img, dy=dy)
    return GridSampleBackwardArgs(img, grid, dy, s)


def _scale(op, name, v):
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise TypeError(f"{op}: {name} must be a number; got {v!r}")
    v = float(v)
    if not (np.isfinite(v) and v > 0):
        raise ValueError(f"{op}: {name} must be finite and > 0; got {v}")
    return v


@public_op("spatial_transformer")
def spatial_transformer(img: ArrayLike, theta: ArrayLike, *, scale_height: float = 1.0,
                        scale_width: float = 1.0, stream: Stream = None,
                        backend: Backend | None = None) -> SpatialTransformerArgs:
    """``grid_sample(img, affine_grid(theta, (N, C, ceil(H*sh), ceil(W*sw))))`` on one backend
    (Theano's dnn_spatialtf): img (N, C, H, W), theta (N, 2, 3). ``scale_height`` (sh) and
    ``scale_width`` (sw): numbers > 0, default 1.0, the output's size over the input's.
    Raises ValueError for a scale <= 0 or not finite, another N in theta or an empty img;
    TypeError for a scale that is not a number or mixed dtypes."""
    op = "spatial_transformer"
    sh, sw = _scale(op, "scale_height", scale_height), _scale(op, "scale_width", scale_width)
    s = arrays.as_stream(stream)
    img = arrays.device_input(op, "img", img, s, ndim=(4,))
    theta = _theta(op, theta, s)
    _same_dtype(op, "img", img, theta=theta)
    n, c, h, w = img.shape
    if theta.shape[0] != n:
        raise ValueError(f"{op}: theta has N = {theta.shape[0]} but img has N = {n}")
    if min(h, w) < 1:
        raise ValueError(f"{op}: img has an empty spatial dimension; shape {tuple(img.shape)}")
    return SpatialTransformerArgs(img, theta, (n, c, math.ceil(h * sh), math.ceil(w * sw)), s)


# ---------------------------------------------------------------- cuDNN

def _too_big(*shapes):
    return max(max(math.prod(s), *s) for s in shapes) >= 2**31


def _supports_grid(theta, out_shape, stream):
    if _too_big(out_shape, (out_shape[0], out_shape[2], out_shape[3], 2)):
        return f"output {out_shape} exceeds cuDNN's 32-bit tensor size"
    return None


def _supports_grid_backward(dgrid, stream):
    if config.get("dnn.deterministic"):
        # measured (H100, cuDNN 9.19): the same dgrid gave dtheta differing in the last bit
        # between runs on concurrent streams (tests/gpu/test_threads.py)
        return ("dnn.deterministic: cuDNN's grid generator backward is not bitwise "
                "repeatable; the Numba reduction is")
    return "dgrid exceeds cuDNN's 32-bit tensor size" if _too_big(dgrid.shape) else None


def _supports_sample(img, grid, stream):
    return _sample_too_big(tuple(img.shape), tuple(grid.shape))


def _sample_too_big(img_shape, grid_shape):
    if _too_big(img_shape, grid_shape, img_shape[:2] + grid_shape[1:3]):
        return f"img {img_shape} or grid {grid_shape} exceeds cuDNN's 32-bit tensor size"
    return None


def _supports_sample_backward(img, grid, dy, stream):
    if config.get("dnn.deterministic"):
        return ("dnn.deterministic: cuDNN does not document its sampler backward as "
                "deterministic; the Numba row gather is")
    return _sample_too_big(tuple(img.shape), tuple(grid.shape))


def _supports_st(img, theta, out_shape, stream):
    n, _, oh, ow = out_shape
    return _sample_too_big(tuple(img.shape), (n, oh, ow, 2)) or \
        _supports_grid(theta, out_shape, stream)


@register("affine_grid", "cudnn", supports=_supports_grid)
def _grid_cudnn(theta, out_shape, stream):
    n, _, oh, ow = out_shape
    grid = arrays.cuda_empty((n, oh, ow, 2), theta.dtype, stream)
    if n:
        cudnn_spatial.grid_forward(theta, grid, device.stream_pointer(stream))
    return grid


@register("affine_grid_backward", "cudnn", supports=_supports_grid_backward)
def _grid_backward_cudnn(dgrid, stream):
    dtheta = arrays.cuda_empty((dgrid.shape[0], 2, 3), dgrid.dtype, stream)
    if dgrid.shape[0]:
        cudnn_spatial.grid_backward(dgrid, dtheta, device.stream_pointer(stream))
    return dtheta


@register("grid_sample", "cudnn", supports=_supports_sample)
def _sample_cudnn(img, grid, stream):
    y = arrays.cuda_empty(tuple(img.shape[:2]) + tuple(grid.shape[1:3]), img.dtype, stream)
    if y.size:
        cudnn_spatial.sampler_forward(img, grid, y, device.stream_pointer(stream))
    return y


@register("grid_sample_backward", "cudnn", supports=_supports_sample_backward)
def _sample_backward_cudnn(img, grid, dy, stream):
    dimg, dgrid = arrays.empty_like(img, stream), arrays.empty_like(grid, stream)
    if dy.size:
        cudnn_spatial.sampler_backward(img, grid, dy, dimg, dgrid, device.stream_pointer(stream))
    else:     # no channels or no grid points: both gradients sum nothing (cuDNN rejects it)
        arrays.zero_fill(dimg, stream)
        arrays.zero_fill(dgrid, stream)
    return dimg, dgrid


@register("spatial_transformer", "cudnn", supports=_supports_st)
def _st_cudnn(img, theta, out_shape, stream):
    return _sample_cudnn(img, _grid_cudnn(theta, out_shape, stream), stream)


# ---------------------------------------------------------------- python -m dnnkit check

def _theta_near_identity(rng, n, dtype):
    t = np.tile(np.array([[1.0, 0, 0], [0, 1.0, 0]]), (n, 1, 1))
    return (t + 0.2 * rng.standard_normal((n, 2, 3))).astype(dtype)


def _grid_off_kinks(rng, n, oh, ow, h, w, dtype):
    """A sampling grid whose points sit at least 0.1 pixel from every pixel row and column
    (bilinear sampling's gradient wrt the grid jumps there: a coordinate rounded in the data
    type, here or in cuDNN, may land on the other side than the float64 reference)."""
    def coords(size, count):
        u = rng.integers(0, max(size - 1, 1), count) + rng.uniform(0.1, 0.9, count)
        return 2 * u / max(size - 1, 1) - 1      # pixel u -> [-1, 1] (corners at +-1)
    g = np.stack([coords(w, n * oh * ow), coords(h, n * oh * ow)], -1)
    return g.reshape(n, oh, ow, 2).astype(dtype)


# Sampling at 224 pixels: a coordinate computed in float32 is off by up to ~224 * 2**-24
# pixel, so samples differ from the float64 reference by ~2e-5 relative (PyTorch's too).
_SAMPLE_TOL = {"float16": 1e-2, "float32": 1e-4}


def selfcheck_cases(Case):
    small, big = ((2, 3, 6, 5), (5, 4)), ((16, 3, 224, 224), (224, 224))

    def inputs(rng, dtype, b):
        (n, c, h, w), (oh, ow) = big if b else small
        img = rng.standard_normal((n, c, h, w)).astype(dtype)
        theta = _theta_near_identity(rng, n, dtype)
        grid = _grid_off_kinks(rng, n, oh, ow, h, w, dtype)
        dy = rng.standard_normal((n, c, oh, ow)).astype(dtype)
        return img, theta, grid, dy

    return [
        Case("affine_grid", "bilinear",
             lambda b, s, i: affine_grid(i[1], (i[0].shape[0], i[0].shape[1]) + i[2].shape[1:3],
                                         backend=b, stream=s),
             lambda i: reference.affine_grid(i[1], (i[0].shape[0], i[0].shape[1])
                                             + i[2].shape[1:3]),
             inputs),
        Case("grid_sample", "bilinear",
             lambda b, s, i: grid_sample(i[0], i[2], backend=b, stream=s),
             lambda i: reference.grid_sample(i[0], i[2]), inputs, _SAMPLE_TOL),
        Case("grid_sample_backward", "dimg",
             lambda b, s, i: grid_sample_backward(i[0], i[2], i[3], backend=b, stream=s)[0],
             lambda i: reference.grid_sample_backward(i[0], i[2], i[3])[0], inputs, _SAMPLE_TOL),
        Case("grid_sample_backward", "dgrid",
             lambda b, s, i: grid_sample_backward(i[0], i[2], i[3], backend=b, stream=s)[1],
             lambda i: reference.grid_sample_backward(i[0], i[2], i[3])[1], inputs, _SAMPLE_TOL),
        Case("spatial_transformer", "bilinear",
             lambda b, s, i: spatial_transformer(i[0], i[1], backend=b, stream=s),
             lambda i: reference.spatial_transformer(i[0], i[1]), inputs, _SAMPLE_TOL),
        Case("affine_grid_backward", "bilinear",
             lambda b, s, i: affine_grid_backward(i[2], backend=b, stream=s),
             lambda i: reference.affine_grid_backward(i[2]), inputs),
    ]


# ---------------------------------------------------------------- autograd

@gradient("affine_grid")
def _affine_grid_grad(g, dgrid):
    if not g.needs("theta"):
        return {}
    # affine_grid_backward runs on Numba under every policy but forced (docs/determinism.md):
    # the policy picks, not the forward's backend
    return {"theta": affine_grid_backward(dgrid, stream=g.stream)}


@gradient("grid_sample")
def _grid_sample_grad(g, dy):
    dimg, dgrid = grid_sample_backward(g.img, g.grid, dy, backend=g.backend, stream=g.stream)
    return {"img": dimg, "grid": dgrid}


@gradient("spatial_transformer")
def _spatial_transformer_grad(g, dy):
    grid = affine_grid(g.theta, tuple(g.out.shape), backend=g.backend, stream=g.stream)
    dimg, dgrid = grid_sample_backward(g.img, grid, dy, backend=g.backend, stream=g.stream)
    grads = {"img": dimg}
    if g.needs("theta"):
        grads["theta"] = affine_grid_backward(dgrid, stream=g.stream)
    return grads
