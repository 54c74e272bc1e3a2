"""Shape ops: reshape, concatenate, split, take_batch (and take_batch_backward).

    reshape(x, shape)             a view of x (C-contiguous) with a new shape; one -1 entry is
                                  inferred
    concatenate(arrays, axis=0)   the arrays joined along ``axis`` (equal elsewhere, one dtype)
    split(x, sections_or_sizes, axis=0)
                                  a tuple of pieces of x along ``axis``: an int n gives n equal
                                  pieces (n must divide the axis), a sequence gives the pieces'
                                  sizes (summing to the axis); each piece a new array
    take_batch(x, index)          x[index] on the first dimension, index an int or a slice of
                                  step 1: a view (no copy)
    take_batch_backward(dy, x_shape, index)
                                  zeros of x_shape with dy in x[index]: take_batch's gradient

Gradients: reshape -> reshape back; concatenate -> split into the inputs' sizes; split ->
concatenate (zeros for a piece no gradient reached); take_batch -> take_batch_backward.

Backends. reshape and take_batch are views: nothing is computed on either backend (registered
Numba-only with that reason). Copies: Numba's kernels/shape.py copies a block of rows between
arrays viewed as (outer, rows, inner) (``inner`` the elements after the axis); cuDNN's
cudnnTransformTensor copies between a packed descriptor and the same block described with the
larger array's strides (a slice of it), one call per piece, while every dimension and stride
fits cuDNN's 32-bit limit (``supports()`` gives the reason otherwise). take_batch_backward
zeros dx with a memset on both backends, then copies dy into the slice.
"""

from __future__ import annotations
import math
from typing import NamedTuple

import numpy as np

from .. import arrays, device, tensor_calls
from ..autograd import PUBLIC, gradient
from ..cudnn import optensor as cudnn_optensor
from ..dispatch import public_op, run
from ..hints import Arrays, ArrayLike, Backend, OpOutput, Shape, Stream
from ..launch import launch
from ..registry import PREPARE, register
from ..tensors import Tensor
from . import split as pieces
from .broadcasting import axes, grid, shape_arg

_VIEW = "a view of the same memory: nothing to compute on either backend"
_TOL = {"float16": (0.0, 0.0), "float32": (0.0, 0.0), "float64": (0.0, 0.0)}   # exact copies


class ReshapeArgs(NamedTuple):
    """reshape's checked arguments (``shape`` with the -1 resolved)."""
    x: object
    shape: tuple
    stream: object


class ConcatArgs(NamedTuple):
    """concatenate's checked arguments: the arrays viewed as (outer, rows[i], inner)."""
    arrays: tuple
    axis: int
    shape: tuple
    outer: int
    rows: tuple
    inner: int
    stream: object


class SplitArgs(NamedTuple):
    """split's checked arguments: x viewed as (outer, sum(rows), inner)."""
    x: object
    axis: int
    rows: tuple
    outer: int
    inner: int
    stream: object


class TakeArgs(NamedTuple):
    """take_batch's and take_batch_backward's checked arguments: rows start:stop of the first
    dimension, ``squeeze`` when the index was an int (the dimension dropped). take_batch_backward
    passes dy as ``x`` and x's shape as ``shape``."""
    x: object
    shape: tuple
    start: int
    stop: int
    squeeze: bool
    stream: object


def _axis(op, axis, ndim):
    if isinstance(axis, tuple) or axis is None:
        raise TypeError(f"{op}: axis must be an int; got {axis!r}")
    return axes(op, axis, ndim)[0]


@public_op("reshape")
def reshape(x: ArrayLike, shape: int | Shape, *, stream: Stream = None,
            backend: Backend | None = None) -> ReshapeArgs:
    """A view of ``x`` (C-contiguous) with ``shape``: an int or a tuple of ints, one of them may
    be -1 (inferred from the size). No copy: the view shares x's memory.
    Raises ValueError when the sizes do not match or more than one entry is -1 (or another
    negative size); TypeError for a shape that is not ints."""
    op = "reshape"
    s = arrays.as_stream(stream)
    x = arrays.device_input(op, "x", x, s)
    t = (shape,) if isinstance(shape, (int, np.integer)) else \
        tuple(shape) if isinstance(shape, (tuple, list)) else None
    # ints only: int() would take "3" and 2.5 (and a dict its keys) without a word
    if t is None or not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool)
                            for v in t):
        raise TypeError(f"{op}: shape must be an int or a tuple of ints; got {shape!r}")
    t = tuple(int(v) for v in t)
    if t.count(-1) > 1 or any(v < -1 for v in t):
        raise ValueError(f"{op}: shape {t} may hold one -1 and no other negative size")
    known = math.prod(v for v in t if v != -1)
    if -1 in t:
        if known == 0 or x.size % known:
            raise ValueError(f"{op}: cannot reshape x of shape {tuple(x.shape)} ({x.size} "
                             f"elements) into {t}")
        t = tuple(x.size // known if v == -1 else v for v in t)
    if math.prod(t) != x.size:
        raise ValueError(f"{op}: cannot reshape x of shape {tuple(x.shape)} ({x.size} "
                         f"elements) into {t} ({math.prod(t)} elements)")
    return ReshapeArgs(x, t, s)


def _concat_args(op, arrays_, axis, stream):
    s = arrays.as_stream(stream)
    if not isinstance(arrays_, (list, tuple)):
        raise TypeError(f"{op}: arrays must be a list or tuple of arrays; got "
                        f"{type(arrays_).__name__}")
    if not len(arrays_):
        raise ValueError(f"{op}: needs at least one array")
    xs = tuple(arrays.device_input(op, f"arrays[{i}]", a, s) for i, a in enumerate(arrays_))
    first = xs[0]
    if first.ndim == 0:
        raise ValueError(f"{op}: 0-d arrays cannot be concatenated")
    ax = _axis(op, axis, first.ndim)
    for i, a in enumerate(xs[1:], 1):
        if a.dtype != first.dtype:
            raise TypeError(f"{op}: arrays[{i}] has dtype {a.dtype} but arrays[0] has "
                            f"{first.dtype}")
        if a.ndim != first.ndim or any(m != n for k, (m, n) in
                                       enumerate(zip(a.shape, first.shape)) if k != ax):
            raise ValueError(f"{op}: arrays[{i}] has shape {tuple(a.shape)}, which differs from "
                             f"arrays[0]'s {tuple(first.shape)} outside axis {ax}")
    rows = tuple(int(a.shape[ax]) for a in xs)
    shape = tuple(first.shape[:ax]) + (sum(rows),) + tuple(first.shape[ax + 1:])
    return ConcatArgs(xs, ax, shape, math.prod(first.shape[:ax]), rows,
                      math.prod(first.shape[ax + 1:]), s)


@public_op("concatenate")
def _concatenate(arrays, axis=0, *, stream=None, backend=None):
    """concatenate's checks (the dispatcher's public op); :func:`concatenate` calls it."""
    return _concat_args("concatenate", arrays, axis, stream)


def concatenate(arrays: Arrays, axis: int = 0, *, backend: Backend | None = None,
                stream: Stream = None) -> OpOutput:
    """The ``arrays`` (a list or tuple, at least one) joined along ``axis`` (an int, default 0,
    negative from the end); equal shapes except along ``axis``, one dtype; a new device array.
    Raises ValueError for no arrays, 0-d arrays, shapes that differ off the axis or an axis out
    of range; TypeError for ``arrays`` that is not a list or tuple, mixed dtypes or a non-int axis.
    The dispatcher looks for Tensors among an op's own arguments; here they sit inside the
    list, so this function looks there: a list holding Tensors is recorded for autograd
    (dnnkit/tensor_calls.py names them ``arrays[i]``) and gives a Tensor.

    {OP_FOOTER}"""
    kw = {} if stream is None else {"stream": stream}
    if type(arrays) in (list, tuple) and any(isinstance(a, Tensor) for a in arrays):
        return tensor_calls.call("concatenate", _run_concatenate, (arrays, axis), kw, backend)
    return _concatenate(arrays, axis, backend=backend, **kw)


def _run_concatenate(args, kw, backend):
    """(output, the backend that ran it) of a concatenation of arrays, through the
    dispatcher's full path (a list argument is never memoised)."""
    out, _, ran_on = run("concatenate", PREPARE["concatenate"](*args, **kw), backend)
    return out, ran_on


# callers that find an op by name (and tensor_calls.py, which reads its parameters) get the
# function that looks inside the list
PUBLIC["concatenate"] = concatenate


@public_op("split")
def split(x: ArrayLike, sections_or_sizes: int | Shape, axis: int = 0, *, stream: Stream = None,
          backend: Backend | None = None) -> SplitArgs:
    """``x`` cut along ``axis`` (an int, default 0, negative from the end) into a tuple of new
    arrays: ``sections_or_sizes`` an int n (n equal pieces; n must divide the axis, as
    numpy.split) or a sequence of the pieces' sizes (>= 0, summing to the axis, as torch.split).
    Raises ValueError for a 0-d x, sections that do not divide the axis, sizes that do not sum to
    it or an axis out of range; TypeError for sections_or_sizes that are not ints."""
    op = "split"
    s = arrays.as_stream(stream)
    x = arrays.device_input(op, "x", x, s)
    if x.ndim == 0:
        raise ValueError(f"{op}: a 0-d array cannot be split")
    ax = _axis(op, axis, x.ndim)
    n = int(x.shape[ax])
    v = sections_or_sizes
    if isinstance(v, bool) or not (isinstance(v, int) or hasattr(v, "__len__")):
        raise TypeError(f"{op}: sections_or_sizes must be an int or a sequence of ints; got "
                        f"{v!r}")
    if isinstance(v, int):
        if v < 1 or n % v:
            raise ValueError(f"{op}: {v} sections do not divide axis {ax} of length {n} "
                             f"equally (x shape {tuple(x.shape)})")
        rows = (n // v,) * v
    else:
        if not all(isinstance(r, int) and not isinstance(r, bool) for r in v):
            raise TypeError(f"{op}: sizes must be ints; got {v!r}")
        rows = tuple(v)
        if not rows or any(r < 0 for r in rows) or sum(rows) != n:
            raise ValueError(f"{op}: sizes {rows} must be >= 0 and sum to axis {ax}'s length "
                             f"{n} (x shape {tuple(x.shape)})")
    return SplitArgs(x, ax, rows, math.prod(x.shape[:ax]), math.prod(x.shape[ax + 1:]), s)


def _index(op, index, n):
    """(start, stop, squeeze) of an int or step-1 slice of a first dimension of length n."""
    if isinstance(index, slice):
        if index.step not in (None, 1):
            raise ValueError(f"{op}: a slice index must have step 1 (a view); got {index}")
        start, stop, _ = index.indices(n)
        return start, max(start, stop), False
    if isinstance(index, bool) or not hasattr(index, "__index__"):
        raise TypeError(f"{op}: index must be an int or a slice; got {index!r}")
    i = int(index)
    if not -n <= i < n:
        raise ValueError(f"{op}: index {i} is out of range for a first dimension of {n}")
    i %= n
    return i, i + 1, True


@public_op("take_batch")
def take_batch(x: ArrayLike, index: int | slice, *, stream: Stream = None,
               backend: Backend | None = None) -> TakeArgs:
    """``x[index]`` on the first dimension: ``index`` an int (negative from the end; the dimension
    is dropped) or a slice of step 1 (kept). A view sharing x's memory: no copy.
    Raises ValueError for a 0-d x, an index out of range or a slice step other than 1;
    TypeError for an index that is neither an int nor a slice."""
    op = "take_batch"
    s = arrays.as_stream(stream)
    x = arrays.device_input(op, "x", x, s)
    if x.ndim == 0:
        raise ValueError(f"{op}: x must have a first dimension; got a 0-d array")
    return TakeArgs(x, tuple(x.shape), *_index(op, index, x.shape[0]), s)


@public_op("take_batch_backward")
def take_batch_backward(dy: ArrayLike, x_shape: Shape, index: int | slice, *,
                        stream: Stream = None, backend: Backend | None = None) -> TakeArgs:
    """Gradient of :func:`take_batch`: zeros of ``x_shape`` with ``dy`` in ``[index]``; ``index``
    an int or a slice of step 1, as in the forward call, and dy shaped as ``x[index]``.
    Raises ValueError for a dy of another shape, an empty x_shape or an index out of range;
    TypeError for an x_shape that is not ints or an index that is neither an int nor a slice."""
    op = "take_batch_backward"
    s = arrays.as_stream(stream)
    dy = arrays.device_input(op, "dy", dy, s)
    x_shape = shape_arg(op, "x_shape", x_shape)
    if not x_shape:
        raise ValueError(f"{op}: x_shape must have a first dimension; got ()")
    start, stop, squeeze = _index(op, index, x_shape[0])
    want = x_shape[1:] if squeeze else (stop - start,) + x_shape[1:]
    if tuple(dy.shape) != want:
        raise ValueError(f"{op}: dy has shape {tuple(dy.shape)} but x{list(x_shape)}[{index}] "
                         f"has {want}")
    return TakeArgs(dy, x_shape, start, stop, squeeze, s)


# ---------------------------------------------------------------- views (both backends)

@register("reshape", "numba", numba_only=_VIEW)
def _reshape(x, shape, stream):
    return arrays.reshaped(x, shape)


@register("take_batch", "numba", numba_only=_VIEW)
def _take_batch(x, shape, start, stop, squeeze, stream):
    return arrays.rows(x, start, None if squeeze else stop)


# ---------------------------------------------------------------- Numba
# (The kernel is imported inside the function: it imports numba, which ``import dnnkit`` does
# not pay for.)

def _copy(src, dst, outer, rows, inner, src_rows, src_row0, dst_rows, dst_row0, stream):
    """dst[o, dst_row0 + r, k] = src[o, src_row0 + r, k] for r < rows (kernels/shape.py)."""
    n = outer * rows * inner
    if not n:
        return
    from ..kernels.shape import slice_copy_fwd_kernel
    blocks, threads = grid(n)
    launch(slice_copy_fwd_kernel, blocks, threads, stream,
           (arrays.flat(src), arrays.flat(dst),
            (outer, rows, inner, src_rows, src_row0, dst_rows, dst_row0),
            arrays.acc_array(src.dtype)))


@register("concatenate", "numba", tolerance=_TOL)
def _concatenate_numba(arrays_, axis, shape, outer, rows, inner, stream):
    y = arrays.cuda_empty(shape, arrays_[0].dtype, stream)
    total, row0 = shape[axis], 0
    for a, r in zip(arrays_, rows):
        _copy(a, y, outer, r, inner, r, 0, total, row0, stream)
        row0 += r
    return y


@register("split", "numba", tolerance=_TOL)
def _split_numba(x, axis, rows, outer, inner, stream):
    out, total, row0 = [], sum(rows), 0
    for r in rows:
        shape = tuple(x.shape[:axis]) + (r,) + tuple(x.shape[axis + 1:])
        y = arrays.cuda_empty(shape, x.dtype, stream)
        _copy(x, y, outer, r, inner, total, row0, r, 0, stream)
        out.append(y)
        row0 += r
    return tuple(out)


@register("take_batch_backward", "numba", tolerance=_TOL)
def _take_batch_backward_numba(x, shape, start, stop, squeeze, stream):
    dx = arrays.zero_fill(arrays.cuda_empty(shape, x.dtype, stream), stream)
    inner = math.prod(shape[1:])
    _copy(x, dx, 1, stop - start, inner, stop - start, 0, shape[0], start, stream)
    return dx


# ---------------------------------------------------------------- cuDNN

def _block(outer, rows, inner, total):
    """(dims, strides of the block inside an array of ``total`` rows): (outer, rows, inner)
    with the larger array's strides."""
    return (outer, rows, inner), (total * inner, inner, 1)


def _fits(outer, total, inner, what):
    return pieces.too_big(outer * total * inner, what)


def _concat_supports(arrays, axis, shape, outer, rows, inner, stream):
    return _fits(outer, shape[axis], inner, lambda: f"the concatenation {shape}")


def _split_supports(x, axis, rows, outer, inner, stream):
    return _fits(outer, sum(rows), inner, lambda: f"x {tuple(x.shape)}")


def _take_backward_supports(x, shape, start, stop, squeeze, stream):
    return _fits(1, shape[0], math.prod(shape[1:]), lambda: f"dx {shape}")


def _transform(src, s_total, s_row0, dst, d_total, d_row0, outer, rows, inner, stream):
    if outer * rows * inner:
        sd, ss = _block(outer, rows, inner, s_total)
        dd, ds = _block(outer, rows, inner, d_total)
        cudnn_optensor.transform(src, sd, ss, s_row0 * inner, dst, dd, ds, d_row0 * inner,
                                 device.stream_pointer(stream))


@register("concatenate", "cudnn", supports=_concat_supports)
def _concatenate_cudnn(arrays_, axis, shape, outer, rows, inner, stream):
    y = arrays.cuda_empty(shape, arrays_[0].dtype, stream)
    row0 = 0
    for a, r in zip(arrays_, rows):
        _transform(a, r, 0, y, shape[axis], row0, outer, r, inner, stream)
        row0 += r
    return y


@register("split", "cudnn", supports=_split_supports)
def _split_cudnn(x, axis, rows, outer, inner, stream):
    out, total, row0 = [], sum(rows), 0
    for r in rows:
        y = arrays.cuda_empty(tuple(x.shape[:axis]) + (r,) + tuple(x.shape[axis + 1:]),
                              x.dtype, stream)
        _transform(x, total, row0, y, r, 0, outer, r, inner, stream)
        out.append(y)
        row0 += r
    return tuple(out)


@register("take_batch_backward", "cudnn", supports=_take_backward_supports)
def _take_batch_backward_cudnn(x, shape, start, stop, squeeze, stream):
    dx = arrays.zero_fill(arrays.cuda_empty(shape, x.dtype, stream), stream)
    _transform(x, stop - start, 0, dx, shape[0], start, 1, stop - start,
               math.prod(shape[1:]), stream)
    return dx


# ---------------------------------------------------------------- gradients

@gradient("reshape")
def _reshape_grad(g, dy):
    if not g.needs("x"):
        return {}
    return {"x": reshape(dy, tuple(g.x.shape), backend=g.backend, stream=g.stream)}


@gradient("concatenate")
def _concatenate_grad(g, dy):
    names = [f"arrays[{i}]" for i in range(len(g.arrays))]
    if not any(g.needs(n) for n in names):
        return {}
    rows = tuple(int(tuple(a.shape)[g.axis]) for a in g.arrays)
    pieces_ = split(dy, rows, g.axis, backend=g.backend, stream=g.stream)
    return {n: p for n, p in zip(names, pieces_) if g.needs(n)}


@gradient("split")
def _split_grad(g, *dys):
    if not g.needs("x"):
        return {}
    # a piece no gradient reached contributes zeros (a memset)
    s = arrays.as_stream(g.stream)
    parts = [d if d is not None else arrays.zero_fill(arrays.cuda_empty(o.shape, o.dtype, s), s)
             for d, o in zip(dys, g.out)]
    return {"x": concatenate(parts, g.axis, backend=g.backend, stream=g.stream)}


@gradient("take_batch")
def _take_batch_grad(g, dy):
    # A view, computed on neither backend: the backward's copy runs on Numba after a Numba
    # producer of x, else by the policy (dnn.enabled), as a call without backend= does.
    if g.needs("x"):
        return {"x": take_batch_backward(dy, tuple(g.x.shape), g.index,
                                         backend=g.follow("x"), stream=g.stream)}


# ---------------------------------------------------------------- python -m dnnkit check

def _inputs(small, big, k=1):
    def make(rng, dtype, b):
        return tuple(rng.standard_normal(big if b else small).astype(dtype) for _ in range(k))
    return make


def selfcheck_cases(Case):
    small, big = (4, 3, 5), (64, 256, 1024)
    return [
        Case("reshape", "(-1, last)",
             lambda b, s, i: reshape(i[0], (-1, tuple(i[0].shape)[-1]), backend=b, stream=s),
             lambda i: i[0].reshape(-1, i[0].shape[-1]), _inputs(small, big)),
        Case("concatenate", "3 on axis 1",
             lambda b, s, i: concatenate(i, 1, backend=b, stream=s),
             lambda i: np.concatenate(i, 1), _inputs(small, big, 3)),
        Case("split", "3 on axis 1, last",
             lambda b, s, i: split(i[0], 3, 1, backend=b, stream=s)[-1],
             lambda i: np.split(i[0], 3, 1)[-1], _inputs((4, 6, 5), (64, 384, 1024))),
        Case("take_batch", "[1:3]", lambda b, s, i: take_batch(i[0], slice(1, 3), backend=b,
                                                                 stream=s),
             lambda i: i[0][1:3], _inputs(small, big)),
        Case("take_batch_backward", "[1:3]",
             lambda b, s, i: take_batch_backward(i[0][1:3], i[0].shape, slice(1, 3), backend=b,
                                                 stream=s),
             lambda i: np.concatenate([np.zeros_like(i[0][:1]), i[0][1:3],
                                       np.zeros_like(i[0][3:])]), _inputs(small, big)),
    ]
