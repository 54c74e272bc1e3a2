"""Sums over axes and broadcasting: sum, mean, sum_to, broadcast_to, mean_backward.

    sum(x, axis, keepdims)      y = sum of x over ``axis`` (an int, a tuple of ints, None: all)
    mean(x, axis, keepdims)     y = sum / count (count: the number of summed elements; an empty
                                reduction gives 0 for sum and NaN for mean, as NumPy)
    sum_to(x, shape)            x summed over its leading axes and over the axes where ``shape``
                                has 1 and x does not: the gradient of a broadcast to x.shape
                                (x itself when shape == x.shape)
    broadcast_to(x, shape)      x repeated along the axes NumPy's broadcasting adds or stretches
    mean_backward(dy, x_shape, axis, keepdims)
                                dx = dy broadcast to x_shape / count (the gradient of mean)

Gradients: sum -> broadcast_to(dy), mean -> mean_backward(dy), sum_to -> broadcast_to(dy),
broadcast_to -> sum_to(dy).

Backends. Numba: kernels/reduce.py (a block column per output, a fixed-order tree in the
accumulation type: deterministic, no atomics; when the outputs are too few to fill the GPU
and each sums many elements, two passes: partial sums in the accumulation type, then theirs)
and kernels/arith.py's broadcasting walk (a copy, or a product with 1/count). cuDNN: cudnnReduceTensor (ADD or AVG, float32 compute for
float16/float32 data, float64 for float64; no indices; the workspace from dnnkit's per-stream
cache) and cudnnAddTensor (C = alpha A + 0 C broadcasts A, alpha = 1 or 1/count), on the
arrays' dimensions after merging neighbours that are reduced or broadcast alike. cuDNN takes
at most 8 such dimensions for a reduction and 5 for cudnnAddTensor, and tensors under its
32-bit limit; otherwise ``supports()`` gives the reason.

The broadcasting geometry (merged walks, kernel geo tuples) is ops/broadcasting.py's.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .. import arrays, device
from ..autograd import gradient
from ..cudnn import optensor as cudnn_optensor
from ..dispatch import public_op
from ..hints import ArrayLike, Axis, Backend, Shape, Stream
from ..launch import flat as flat_arg, launch, pow2_at_most
from ..registry import register
from . import split
from .broadcasting import (CUDNN_ADD_DIMS, COPY, MAXDIM, MULTIPLY, axes, broadcast, c_strides,
                           elementwise_geo, grid, merge, pad, read_strides, shape_arg)

CUDNN_REDUCE_DIMS = 8
_TOL = {"float16": (2e-3, 1e-3), "float32": (1e-5, 1e-6), "float64": (1e-12, 1e-14)}


# ---------------------------------------------------------------- prepared arguments

class ReduceArgs(NamedTuple):
    """sum's, mean's and sum_to's checked arguments. ``dims``: x's dimensions after merging
    neighbours reduced alike (size-1 ones dropped), ``reduced``: which of them are summed;
    ``geo`` and ``count``: kernels/reduce.py's walk and the number of summed elements."""
    x: object
    shape: tuple
    dims: tuple
    reduced: tuple
    geo: tuple
    count: int
    mode: str
    stream: object


class BroadcastArgs(NamedTuple):
    """broadcast_to's and mean_backward's checked arguments: y = scale * x read as ``shape``.
    ``dims``/``x_dims``: y's and x's dimensions after merging (x's 1 where it broadcasts);
    ``geo``: kernels/arith.py's walk."""
    x: object
    shape: tuple
    dims: tuple
    x_dims: tuple
    geo: tuple
    scale: float
    stream: object


def _reduce_args(op, x, ax, out_shape, stream):
    dims, reduced = [], []
    for k, n in enumerate(x.shape):
        if n == 1:
            continue
        r = k in ax
        if dims and reduced[-1] == r:
            dims[-1] *= n
        else:
            dims.append(n)
            reduced.append(r)
    if not dims:
        dims, reduced = [1], [True]
    st = c_strides(dims)
    kept = [(n, s) for n, s, r in zip(dims, st, reduced) if not r] or [(1, 0)]
    red = [(n, s) for n, s, r in zip(dims, st, reduced) if r] or [(1, 0)]
    if max(len(kept), len(red)) > MAXDIM:
        raise ValueError(f"{op}: x {tuple(x.shape)} reduced over axes {ax} alternates between "
                         f"kept and reduced axes more than {MAXDIM} times")
    count = math.prod(x.shape[k] for k in ax)
    geo = (len(kept), len(red)) + pad([n for n, _ in kept]) + pad([s for _, s in kept]) + \
        pad([n for n, _ in red]) + pad([s for _, s in red])
    return ReduceArgs(x, tuple(out_shape), tuple(dims), tuple(reduced), geo, count, op, stream)


def _reduction(op, x, axis, keepdims, stream):
    s = arrays.as_stream(stream)
    x = arrays.device_input(op, "x", x, s)
    ax = axes(op, axis, x.ndim)
    out = tuple(1 if k in ax else n for k, n in enumerate(x.shape)) if keepdims else \
        tuple(n for k, n in enumerate(x.shape) if k not in ax)
    return _reduce_args(op, x, ax, out, s)


def _broadcast_args(op, x, read_as, shape, scale, s):
    """y = scale * x, x's elements read as an array of shape ``read_as`` (x's own shape, or
    mean's output with its reduced axes kept as 1) broadcast to ``shape``."""
    dims, xs = merge(shape, read_strides(read_as, shape))
    x_dims = tuple(n if st else 1 for n, st in zip(dims, xs))
    geo = elementwise_geo(op, dims, xs, (0,) * len(dims), True, False)
    return BroadcastArgs(x, tuple(shape), dims, x_dims, geo, float(scale), s)


# ---------------------------------------------------------------- public functions

@public_op("sum")
def sum(x: ArrayLike, axis: Axis = None, keepdims: bool = False, *,   # noqa: A001 - NumPy's
        stream: Stream = None, backend: Backend | None = None) -> ReduceArgs:
    """Sum of ``x`` over ``axis``; a new device array (0-d for a full sum); 0 for an empty sum.

    {REDUCE_AXIS}
    Summed in the accumulation type (float32 for float16) in a fixed order: deterministic.
    Raises ValueError for an axis out of range or repeated; TypeError for an axis that is not an
    int or a tuple of ints."""
    return _reduction("sum", x, axis, keepdims, stream)


@public_op("mean")
def mean(x: ArrayLike, axis: Axis = None, keepdims: bool = False, *, stream: Stream = None,
         backend: Backend | None = None) -> ReduceArgs:
    """Mean of ``x`` over ``axis``: the sum / the number of summed elements (NaN for none).

    {REDUCE_AXIS}
    Raises ValueError for an axis out of range or repeated; TypeError for an axis that is not an
    int or a tuple of ints."""
    return _reduction("mean", x, axis, keepdims, stream)


@public_op("sum_to")
def sum_to(x: ArrayLike, shape: Shape, *, stream: Stream = None,
           backend: Backend | None = None) -> ReduceArgs:
    """``x`` summed to ``shape``, a shape that broadcasts to x's: over x's leading axes and the axes
    where ``shape`` has 1 and x does not (the gradient of ``broadcast_to(., x.shape)``); x itself
    when ``shape`` is x's shape. ``shape``: a tuple of ints >= 0.
    Raises ValueError when ``shape`` does not broadcast to x's shape; TypeError for a shape that
    is not a tuple of ints."""
    op = "sum_to"
    s = arrays.as_stream(stream)
    x = arrays.device_input(op, "x", x, s)
    shape = shape_arg(op, "shape", shape)
    if len(shape) > x.ndim or broadcast(op, shape=shape, x=x.shape) != tuple(x.shape):
        raise ValueError(f"{op}: shape {shape} does not broadcast to x's shape "
                         f"{tuple(x.shape)}, so x cannot be summed to it")
    lead = x.ndim - len(shape)
    ax = tuple(range(lead)) + tuple(lead + k for k, n in enumerate(shape)
                                    if n == 1 and x.shape[lead + k] != 1)
    return _reduce_args(op, x, ax, shape, s)


@public_op("broadcast_to")
def broadcast_to(x: ArrayLike, shape: Shape, *, stream: Stream = None,
                 backend: Backend | None = None) -> BroadcastArgs:
    """``x`` repeated to ``shape`` by NumPy's broadcasting (aligned at the right; each of x's
    dimensions equal or 1): a new C-contiguous array (NumPy's returns a read-only view).
    ``shape``: a tuple of ints >= 0 with at least x's number of dimensions.
    Raises ValueError when x cannot be broadcast to ``shape``; TypeError for a shape that is not
    a tuple of ints."""
    op = "broadcast_to"
    s = arrays.as_stream(stream)
    x = arrays.device_input(op, "x", x, s)
    shape = shape_arg(op, "shape", shape)
    if len(shape) < x.ndim or broadcast(op, x=x.shape, shape=shape) != shape:
        raise ValueError(f"{op}: x of shape {tuple(x.shape)} cannot be broadcast to {shape}")
    return _broadcast_args(op, x, tuple(x.shape), shape, 1.0, s)


@public_op("mean_backward")
def mean_backward(dy: ArrayLike, x_shape: Shape, axis: Axis = None, keepdims: bool = False, *,
                  stream: Stream = None, backend: Backend | None = None) -> BroadcastArgs:
    """Gradient of :func:`mean`: dx = dy / count broadcast to ``x_shape`` over ``axis``, count
    the number of elements each mean took; dy shaped as mean's output for these arguments.

    {REDUCE_AXIS}
    Raises ValueError when dy's shape is not mean's output or an axis is out of range or
    repeated; TypeError for an axis or x_shape of the wrong type."""
    op = "mean_backward"
    s = arrays.as_stream(stream)
    dy = arrays.device_input(op, "dy", dy, s)
    x_shape = shape_arg(op, "x_shape", x_shape)
    ax = axes(op, axis, len(x_shape))
    kshape = tuple(1 if k in ax else n for k, n in enumerate(x_shape))
    want = kshape if keepdims else tuple(n for k, n in enumerate(x_shape) if k not in ax)
    if tuple(dy.shape) != want:
        raise ValueError(f"{op}: dy has shape {tuple(dy.shape)} but the mean of x "
                         f"{x_shape} over axis {axis!r} (keepdims={keepdims}) has {want}")
    count = math.prod(x_shape[k] for k in ax)
    # dy without the reduced axes holds the same elements in the same order as with them
    # kept as 1: it is read as the keepdims shape
    return _broadcast_args(op, dy, kshape, x_shape, 1.0 / count if count else float("nan"), s)


# ---------------------------------------------------------------- Numba
# (The kernels are imported inside the functions: they import numba, which ``import dnnkit``
# does not pay for.)

_MAX_BLOCKS = 65535
PART_MIN = 4096        # reduced elements per part, at least, in a two-pass sum
_BLOCKS_PER_SM = 4     # a two-pass sum aims at about this many blocks per SM


def _parts(n_out, count):
    """How many parts each output's sum is cut into: 1 (one pass) unless the outputs are too
    few to fill the GPU (fewer than ~4 blocks per SM) and each has many elements; then enough
    parts to fill it, each of at least PART_MIN elements (the second pass sums them)."""
    target = _BLOCKS_PER_SM * device.sm_count()
    if n_out >= target or count < 2 * PART_MIN:
        return 1
    return max(1, min(-(-target // n_out), count // PART_MIN))


def _reduce_launch(x, y, scale, count, parts, geo, stream):
    from ..kernels.reduce import reduce_fwd_kernel
    cap = 32 if device.simulator() else 256
    per = -(-count // parts)                # positions per part
    by = pow2_at_most(per, cap)             # threads per column, a power of two
    bx = max(1, cap // by)                  # columns per block
    blocks = min(-(-y.size // bx), _MAX_BLOCKS)
    acc = arrays.acc_array(x.dtype)
    launch(reduce_fwd_kernel, blocks, (bx, by), stream,
           (flat_arg(x), flat_arg(y), acc.dtype.type(scale), count, parts, geo, acc),
           bx * by * acc.dtype.itemsize)


@register("sum", "numba", tolerance=_TOL)
@register("mean", "numba", tolerance=_TOL)
@register("sum_to", "numba", tolerance=_TOL)
def _reduce_numba(x, shape, dims, reduced, geo, count, mode, stream):
    if mode == "sum_to" and tuple(x.shape) == shape:
        return x                      # nothing to sum
    y = arrays.cuda_empty(shape, x.dtype, stream)
    n_out = y.size
    if not n_out:
        return y
    scale = (1.0 / count if count else float("nan")) if mode == "mean" else 1.0
    parts = _parts(n_out, count)
    if parts == 1:
        _reduce_launch(x, y, scale, count, 1, geo, stream)
        return y
    # two passes: partial sums (n_out, parts) in the accumulation type, then their sums
    partial = arrays.cuda_empty((n_out * parts,), arrays.acc_dtype(x.dtype), stream)
    _reduce_launch(x, partial, 1.0, count, parts, geo, stream)
    geo2 = (1, 1) + pad([n_out]) + pad([parts]) + pad([parts]) + pad([1])
    _reduce_launch(partial, y, scale, parts, 1, geo2, stream)
    return y


@register("broadcast_to", "numba", tolerance=_TOL)
@register("mean_backward", "numba", tolerance=_TOL)
def _broadcast_numba(x, shape, dims, x_dims, geo, scale, stream):
    from ..kernels.arith import arith_fwd_kernel
    y = arrays.cuda_empty(shape, x.dtype, stream)
    if y.size:
        acc = arrays.acc_array(x.dtype)
        blocks, threads = grid(y.size)
        op = COPY if scale == 1.0 else MULTIPLY
        launch(arith_fwd_kernel, blocks, threads, stream,
               (flat_arg(x), flat_arg(x), flat_arg(y), acc.dtype.type(0),
                acc.dtype.type(scale), op, geo, acc))
    return y


# ---------------------------------------------------------------- cuDNN

def _too_big(*sizes):
    return split.too_big(max(sizes), "the tensor")


def _reduce_supports(x, shape, dims, reduced, geo, count, mode, stream):
    if len(dims) > CUDNN_REDUCE_DIMS:
        return (f"cudnnReduceTensor takes at most {CUDNN_REDUCE_DIMS} dimensions; x "
                f"{tuple(x.shape)} needs {len(dims)} after merging")
    return _too_big(x.size)


def _broadcast_supports(x, shape, dims, x_dims, geo, scale, stream):
    if len(dims) > CUDNN_ADD_DIMS:
        return (f"cudnnAddTensor takes at most {CUDNN_ADD_DIMS} dimensions; broadcasting "
                f"{tuple(x.shape)} to {shape} needs {len(dims)} after merging")
    return _too_big(math.prod(shape))


@register("sum", "cudnn", supports=_reduce_supports)
@register("mean", "cudnn", supports=_reduce_supports)
@register("sum_to", "cudnn", supports=_reduce_supports)
def _reduce_cudnn(x, shape, dims, reduced, geo, count, mode, stream):
    if mode == "sum_to" and tuple(x.shape) == shape:
        return x
    y = arrays.cuda_empty(shape, x.dtype, stream)
    if not y.size:
        return y
    sp = device.stream_pointer(stream)
    if not x.size:          # a sum over nothing: 0 (a memset), or NaN for mean
        if mode == "mean":
            cudnn_optensor.set_tensor(y, (y.size,), float("nan"), sp)
            return y
        return arrays.zero_fill(y, stream)
    y_dims = tuple(1 if r else n for n, r in zip(dims, reduced))
    if y_dims == tuple(dims):
        # nothing of more than one element is reduced: cudnnReduceTensor answers BAD_PARAM
        # for that (measured, cuDNN 9.19 on an NVIDIA H200); cudnnAddTensor copies it
        cudnn_optensor.add_tensor(1.0, x, dims, 0.0, y, y_dims, sp)
        return y
    cudnn_optensor.reduce(x, dims, y, y_dims, "avg" if mode == "mean" else "add", sp)
    return y


@register("broadcast_to", "cudnn", supports=_broadcast_supports)
@register("mean_backward", "cudnn", supports=_broadcast_supports)
def _broadcast_cudnn(x, shape, dims, x_dims, geo, scale, stream):
    y = arrays.cuda_empty(shape, x.dtype, stream)
    if y.size:
        cudnn_optensor.add_tensor(scale, x, x_dims, 0.0, y, dims, device.stream_pointer(stream))
    return y


# ---------------------------------------------------------------- gradients

def _kept(x_shape, axis, dy):
    """dy viewed with the reduced axes kept as size 1 (the same elements, in order)."""
    ax = axes("sum", axis, len(x_shape))
    return arrays.reshaped(dy, tuple(1 if k in ax else n for k, n in enumerate(x_shape)))


@gradient("sum")
def _sum_grad(g, dy):
    if not g.needs("x"):
        return {}
    return {"x": broadcast_to(_kept(g.x.shape, g.axis, dy), tuple(g.x.shape),
                              backend=g.backend, stream=g.stream)}


@gradient("mean")
def _mean_grad(g, dy):
    if not g.needs("x"):
        return {}
    return {"x": mean_backward(dy, tuple(g.x.shape), g.axis, g.keepdims, backend=g.backend,
                               stream=g.stream)}


@gradient("sum_to")
def _sum_to_grad(g, dy):
    if not g.needs("x"):
        return {}
    return {"x": broadcast_to(dy, tuple(g.x.shape), backend=g.backend, stream=g.stream)}


@gradient("broadcast_to")
def _broadcast_to_grad(g, dy):
    if not g.needs("x"):
        return {}
    return {"x": sum_to(dy, tuple(g.x.shape), backend=g.backend, stream=g.stream)}


# ---------------------------------------------------------------- python -m dnnkit check

_TARGET = {(3, 1, 1): (2, 3, 4, 5), (64, 1, 1): (32, 64, 32, 32)}   # broadcast_to's rows


def _inputs(small, big, dy=None, offset=0.0):
    def make(rng, dtype, b):
        # offset: sums far from 0, so that their relative error means something
        out = ((rng.standard_normal(big if b else small) + offset).astype(dtype),)
        return out if dy is None else out + (rng.standard_normal(dy(out[0].shape)).astype(
            dtype),)
    return make


def selfcheck_cases(Case):
    small, big = (2, 3, 4, 5), (32, 64, 32, 32)
    out = []
    for name, ax in (("all", None), ("N,H,W", (0, 2, 3)), ("last", -1)):
        out.append(Case("sum", name, lambda b, s, i, a=ax: sum(i[0], a, backend=b, stream=s),
                        lambda i, a=ax: np.sum(i[0], axis=a), _inputs(small, big, None, 1.0)))
        out.append(Case("mean", name, lambda b, s, i, a=ax: mean(i[0], a, backend=b, stream=s),
                        lambda i, a=ax: np.mean(i[0], axis=a), _inputs(small, big, None, 1.0)))
    out.append(Case("sum_to", "to (1,C,1,1)",
                    lambda b, s, i: sum_to(i[0], (1, i[0].shape[1], 1, 1), backend=b, stream=s),
                    lambda i: np.sum(i[0], axis=(0, 2, 3), keepdims=True), _inputs(small, big)))
    out.append(Case("broadcast_to", "(C,1,1) to NCHW",
                    lambda b, s, i: broadcast_to(i[0], _TARGET[i[0].shape], backend=b,
                                                 stream=s),
                    lambda i: np.broadcast_to(i[0], _TARGET[i[0].shape]).copy(),
                    _inputs((3, 1, 1), (64, 1, 1))))
    out.append(Case("mean_backward", "N,H,W",
                    lambda b, s, i: mean_backward(i[1], i[0].shape, (0, 2, 3), backend=b,
                                                  stream=s),
                    lambda i: np.broadcast_to(i[1].reshape(1, -1, 1, 1) / (
                        i[0].size // i[0].shape[1]), i[0].shape).copy(),
                    _inputs(small, big, dy=lambda sh: (sh[1],))))
    return out
