"""Embedding lookup and its gradient.

    embedding(ids, weight, padding_idx=None)       y[..., :] = weight[ids[...], :]
    embedding_backward(ids, dy, num, padding_idx)  dw[v, :] = sum over {i : ids[i] == v} dy[i, :]

``ids``: integer indices (int32 or int64; a host array is copied as int64) of any shape;
``weight``: (num, dim) float16/32/64; y: ids.shape + (dim,). ``padding_idx`` (an index in
[-num, num), negative counting from the end, as PyTorch): its row is looked up like any other,
and gets no gradient.

Out-of-range ids: an id outside [0, num) cannot raise on the device without reading the ids
back to the host on every call; its output row is NaN instead (never a clamped or zero row,
which would train silently on wrong data), so the loss it reaches is NaN, and it adds nothing
to the gradient. Ids given as a host array are checked on the host before the copy
(ValueError naming the first bad id).

Backward: dw is zeroed and every dy row added to its id's row with atomic adds in the
accumulation type: float32 and float64 gradients in place; a float16 weight's gradient sums
in a float32 scratch and is rounded once at the end (float16 atomics would round at every
add). Ids that repeat are summed in the order the GPU schedules the adds, so the last bits of
those rows can differ from run to run: this op is not bitwise reproducible, and
``dnn.deterministic`` does not change it (docs/determinism.md).

Backends: Numba only (kernels/embedding.py): cuDNN has no embedding lookup.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .. import arrays, device
from ..autograd import gradient
from ..dispatch import public_op
from ..hints import ArrayLike, Backend, Stream
from ..launch import launch
from ..registry import register

_NO_CUDNN = "cuDNN has no embedding lookup"
_TOL = {"float16": (1e-3, 1e-3), "float32": (1e-6, 1e-6), "float64": (1e-13, 1e-13)}


class EmbeddingArgs(NamedTuple):
    """embedding's checked arguments (``pad``: padding_idx in [0, num), or -1 for none)."""
    ids: object
    weight: object
    pad: int
    stream: object


class EmbeddingBackwardArgs(NamedTuple):
    """embedding_backward's checked arguments."""
    ids: object
    dy: object
    num: int
    pad: int
    stream: object


def _ids(op, ids, num, s):
    """ids as a device int32/int64 array; a host array is checked and copied as int64."""
    cuda = device.numba_cuda()
    if arrays.is_device_array(ids) or hasattr(ids, "__cuda_array_interface__"):
        d = ids if arrays.is_device_array(ids) else cuda.as_cuda_array(ids)
        if d.dtype not in (np.int32, np.int64):
            raise TypeError(f"{op}: ids must be int32 or int64 indices; got dtype {d.dtype}")
        if not d.is_c_contiguous():
            raise ValueError(f"{op}: ids must be C-contiguous; got strides {tuple(d.strides)}")
        return d
    try:
        h = np.asarray(ids)
    except Exception as e:
        raise TypeError(f"{op}: ids must be an array; got {type(ids).__name__}") from e
    if h.dtype.kind not in "iu":
        raise TypeError(f"{op}: ids must hold integer indices; got dtype {h.dtype}")
    bad = (h < 0) | (h >= num)
    if bad.any():
        pos = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"{op}: ids must be in [0, {num}); got {int(h[pos])} at {pos} "
                         f"({int(bad.sum())} out of range)")
    return cuda.to_device(arrays.host_contiguous(h.astype(np.int64, copy=False)), stream=s)


def _pad(op, padding_idx, num):
    if padding_idx is None:
        return -1
    if isinstance(padding_idx, (bool, np.bool_)) or not isinstance(padding_idx,
                                                                    (int, np.integer)):
        raise TypeError(f"{op}: padding_idx must be None or an integer; got {padding_idx!r}")
    p = int(padding_idx)
    if not -num <= p < num:
        raise ValueError(f"{op}: padding_idx must be in [-{num}, {num}) for {num} rows; "
                         f"got {p}")
    return p + num if p < 0 else p


def _num(op, num):
    if isinstance(num, (bool, np.bool_)) or not isinstance(num, (int, np.integer)):
        raise TypeError(f"{op}: num must be an integer (the table's rows); got {num!r}")
    if num < 0:
        raise ValueError(f"{op}: num must be >= 0; got {num}")
    return int(num)


@public_op("embedding")
def embedding(ids: ArrayLike, weight: ArrayLike, padding_idx: int | None = None, *,
              stream: Stream = None, backend: Backend | None = None) -> EmbeddingArgs:
    """Rows of ``weight`` (num, dim) at integer ``ids`` (any shape): y[..., :] =
    weight[ids[...], :], shaped ids.shape + (dim,).

    ``ids``: int32 or int64 indices (a host array is copied as int64). An id outside [0, num)
    gives a NaN row on the device (never a clamped row); a host ``ids`` array is checked first.
    ``padding_idx``: None (default) or an index in [-num, num), negative from the end: its row is
    looked up as any other and gets no gradient. Runs on Numba only (cuDNN has no embedding).
    Raises ValueError for an id out of range in a host array or a padding_idx out of range;
    TypeError for non-integer ids or a weight that is not a float array."""
    op = "embedding"
    s = arrays.as_stream(stream)
    weight = arrays.device_input(op, "weight", weight, s, ndim=(2,))
    num = weight.shape[0]
    return EmbeddingArgs(_ids(op, ids, num, s), weight, _pad(op, padding_idx, num), s)


@public_op("embedding_backward")
def embedding_backward(ids: ArrayLike, dy: ArrayLike, num: int, padding_idx: int | None = None,
                       *, stream: Stream = None,
                       backend: Backend | None = None) -> EmbeddingBackwardArgs:
    """Gradient wrt the weight of :func:`embedding`: dw (num, dim), dw[v, :] = the sum of the dy
    rows whose id is v; dy shaped ids.shape + (dim,).

    ``num``: the table's rows (an int >= 0). ``padding_idx``: None (default) or an index in
    [-num, num): its row gets no gradient, nor does an id outside [0, num). Repeated ids are
    summed with atomic adds, in no fixed order (not bitwise reproducible). Numba only.
    Raises ValueError for a dy of the wrong shape or num, ids or padding_idx out of range;
    TypeError for non-integer ids or num."""
    op = "embedding_backward"
    num = _num(op, num)
    s = arrays.as_stream(stream)
    dy = arrays.device_input(op, "dy", dy, s)
    ids = _ids(op, ids, num, s)
    if dy.ndim != ids.ndim + 1 or tuple(dy.shape)[:-1] != tuple(ids.shape):
        raise ValueError(f"{op}: dy must have shape ids.shape + (dim,) = "
                         f"{tuple(ids.shape)} + (dim,); got {tuple(dy.shape)}")
    return EmbeddingBackwardArgs(ids, dy, num, _pad(op, padding_idx, num), s)


# ---------------------------------------------------------------- Numba
# (The kernels are imported inside the functions: they import numba, which ``import dnnkit``
# does not pay for.)

def _launch(kernel, n, stream, args):
    if n:
        blocks, threads = arrays.grid_1d(n)
        launch(kernel, blocks, threads, stream, args)


@register("embedding", "numba", tolerance=_TOL, numba_only=_NO_CUDNN)
def _embedding_numba(ids, weight, pad, stream):
    from ..kernels import embedding_fwd_kernel
    num, dim = weight.shape
    y = arrays.cuda_empty(tuple(ids.shape) + (dim,), weight.dtype, stream)
    _launch(embedding_fwd_kernel, y.size, stream,
            (arrays.flat(ids), arrays.flat(weight), arrays.flat(y), num, dim,
             arrays.acc_array(weight.dtype)))
    return y


@register("embedding_backward", "numba", tolerance=_TOL, numba_only=_NO_CUDNN)
def _embedding_backward_numba(ids, dy, num, pad, stream):
    from ..kernels import embedding_bwd_kernel, embedding_cast_kernel
    dim = tuple(dy.shape)[-1]
    dw = arrays.cuda_empty((num, dim), dy.dtype, stream)
    acc = arrays.acc_array(dy.dtype)
    # float16: sum in a float32 scratch, round once
    total = dw if acc.dtype == dy.dtype else arrays.cuda_empty((num, dim), acc.dtype, stream)
    arrays.zero_fill(total, stream)
    _launch(embedding_bwd_kernel, dy.size, stream,
            (arrays.flat(ids), arrays.flat(dy), arrays.flat(total), num, dim, pad, acc))
    if total is not dw:
        _launch(embedding_cast_kernel, dw.size, stream, (arrays.flat(total), arrays.flat(dw),
                                                         acc))
    return dw


# ---------------------------------------------------------------- gradients

@gradient("embedding")
def _embedding_grad(g, dy):
    if not g.needs("weight"):
        return {}
    return {"weight": embedding_backward(g.ids, dy, g.weight.shape[0], g.padding_idx,
                                         backend=g.backend, stream=g.stream)}


# ---------------------------------------------------------------- python -m dnnkit check

def _inputs(ids_shape, num, dim, with_dy):
    def make(rng, dtype, big):
        ids = rng.integers(0, num[big], ids_shape[big]).astype(np.int64)
        if with_dy:
            return ids, rng.standard_normal(ids_shape[big] + (dim[big],)).astype(dtype)
        return ids, rng.standard_normal((num[big], dim[big])).astype(dtype)
    return make


def _ref_backward(ids, dy, num):
    dw = np.zeros((num, dy.shape[-1]))
    np.add.at(dw, ids.astype(np.int64).reshape(-1), dy.reshape(-1, dy.shape[-1]))
    return dw


def selfcheck_cases(Case):
    shapes, num, dim = {False: (3, 4), True: (35, 128)}, {False: 6, True: 10000}, \
        {False: 5, True: 650}
    return [
        Case("embedding", "lookup",
             lambda b, s, i: embedding(i[0], i[1], backend=b, stream=s),
             lambda i: i[1][i[0].astype(np.int64)], _inputs(shapes, num, dim, False)),
        Case("embedding_backward", "scatter-add",
             lambda b, s, i: embedding_backward(i[0], i[1], 6 if i[0].size < 100 else 10000,
                                                backend=b, stream=s),
             lambda i: _ref_backward(i[0], i[1], 6 if i[0].size < 100 else 10000),
             _inputs(shapes, num, dim, True)),
    ]
