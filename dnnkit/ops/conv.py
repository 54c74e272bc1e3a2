"""Convolution, 2-D (NCHW, weights KCRS) and 3-D (NCDHW, weights KCTRS): forward, gradient wrt
data, wrt filter, and bias.

    y[n, k, o] = sum_{c, t} x_pad[n, g*C/G + c, o*stride + t*dilation] * w[k, c, t'] + bias[k]

with t' = t for ``mode="cross"`` (cross-correlation, what every framework computes) and the
reversed tap for ``mode="conv"`` (true convolution, Theano's default). ``padding``: an int, a
tuple, or Theano's border modes ``"valid"`` (0), ``"full"`` ((k-1)*d) and ``"half"``
(((k-1)*d + 1) // 2: "same" for odd kernels). Output size per spatial dim:
``(I + 2p - d(k-1) - 1) // s + 1``.

Empty dimensions (both backends, PyTorch's rules): N = 0 or K = 0 gives empty outputs; C = 0
gives y = bias (or 0; with activation="relu", relu of it), a sum over nothing, and empty dx,
dw; an empty input padded out to a window gives y = bias (likewise); a gradient that sums
nothing (dw of an empty batch, dx without filters, db of an empty dy) is 0; a filter window of
0 taps (w (K, C, 0, 0)) is a ValueError.

Backends: Numba (im2col + tiled GEMM, col2im gather for the data gradient; ops/conv_numba.py)
and cuDNN (cudnnConvolutionForward/BackwardData/BackwardFilter/BackwardBias; cudnn/conv.py;
batches over its 32-bit tensor limit run as pieces of the batch, ops/split.py).
Flags: ``dnn.conv.algo_fwd|algo_bwd_data|algo_bwd_filter`` (cuDNN algorithm or runtime choice;
``algo=`` overrides per call), ``dnn.conv.workspace_limit``, ``dnn.conv.precision``
(``precision=`` overrides), ``dnn.conv.allow_tf32``, ``dnn.deterministic``.
"""

from __future__ import annotations

import dataclasses
import functools
import math

from .. import arrays, device
from ..cudnn import activation as cudnn_act, conv as cconv
from ..dispatch import public_op
from ..hints import ArrayLike, Backend, Padding, Shape, Size, Stream
from ..registry import binder, register
from ..tracing import note_algo
from . import conv_args, conv_numba, conv_prepared, split


@public_op("conv2d")
def conv2d(x: ArrayLike, w: ArrayLike, bias: ArrayLike | None = None, *, stride: Size = 1,
           padding: Padding = 0, dilation: Size = 1, groups: int = 1, mode: str = "cross",
           algo: str | None = None, precision: str | None = None, stream: Stream = None,
           backend: Backend | None = None,
           activation: str | None = None) -> conv_args.ConvForwardArgs:
    """2-D convolution of x (N, C, H, W) with w (K, C/groups, R, S), plus bias (K,) or None;
    returns y (N, K, OH, OW), O = (I + 2p - d(k - 1) - 1) // s + 1 per spatial dim.

        y[n, k, o] = sum_(c, t) x_pad[n, g*C/G + c, o*stride + t*dilation] * w[k, c, t'] + bias[k]

    with t' = t for mode "cross" and the reversed tap for "conv". float16, float32 or float64.
    {CONV_OPTIONS}
    {CONV_ACTIVATION}
    {CONV_ALGO_FWD}
    {CONV_PRECISION}
    {CONV_RAISES}"""
    return conv_args.forward_args("conv2d", 2, x, w, bias, stride, padding, dilation, groups,
                                  mode, algo, precision, stream, activation)


@public_op("conv3d")
def conv3d(x: ArrayLike, w: ArrayLike, bias: ArrayLike | None = None, *, stride: Size = 1,
           padding: Padding = 0, dilation: Size = 1, groups: int = 1, mode: str = "cross",
           algo: str | None = None, precision: str | None = None, stream: Stream = None,
           backend: Backend | None = None,
           activation: str | None = None) -> conv_args.ConvForwardArgs:
    """3-D convolution of x (N, C, D, H, W) with w (K, C/groups, T, R, S), plus bias (K,) or
    None; returns y (N, K, OD, OH, OW), O = (I + 2p - d(k - 1) - 1) // s + 1 per spatial dim:
    :func:`conv2d`'s sum over three spatial dims. float16, float32 or float64.
    {CONV_OPTIONS}
    {CONV_ACTIVATION}
    {CONV_ALGO_FWD}
    {CONV_PRECISION}
    {CONV_RAISES}"""
    return conv_args.forward_args("conv3d", 3, x, w, bias, stride, padding, dilation, groups,
                                  mode, algo, precision, stream, activation)


@public_op("conv2d_backward_data")
def conv2d_backward_data(dy: ArrayLike, w: ArrayLike, x_shape: Shape, *, stride: Size = 1,
                         padding: Padding = 0, dilation: Size = 1, groups: int = 1,
                         mode: str = "cross", algo: str | None = None,
                         precision: str | None = None, stream: Stream = None,
                         backend: Backend | None = None) -> conv_args.ConvBackwardDataArgs:
    """Gradient wrt x of :func:`conv2d`: dx shaped ``x_shape`` (N, C, H, W), from dy
    (N, K, OH, OW) and w (K, C/groups, R, S), with the forward's keyword arguments.

    dx[n, c, i] = sum of dy[n, k, o] * w[k, c, t'] over the k of c's group and the (o, t) with
    o*stride + t*dilation - padding = i.
    {CONV_OPTIONS}
    {CONV_ALGO_BWD_DATA}
    {CONV_PRECISION}
    {CONV_RAISES}
    Also ValueError when dy is not the forward's output shape for ``x_shape``."""
    return conv_args.backward_data_args("conv2d_backward_data", 2, dy, w, x_shape, stride,
                                        padding, dilation, groups, mode, algo, precision,
                                        stream)


@public_op("conv3d_backward_data")
def conv3d_backward_data(dy: ArrayLike, w: ArrayLike, x_shape: Shape, *, stride: Size = 1,
                         padding: Padding = 0, dilation: Size = 1, groups: int = 1,
                         mode: str = "cross", algo: str | None = None,
                         precision: str | None = None, stream: Stream = None,
                         backend: Backend | None = None) -> conv_args.ConvBackwardDataArgs:
    """Gradient wrt x of :func:`conv3d`: dx shaped ``x_shape`` (N, C, D, H, W), from dy
    (N, K, OD, OH, OW) and w (K, C/groups, T, R, S), with the forward's keyword arguments
    (:func:`conv2d_backward_data` over three spatial dims).
    {CONV_OPTIONS}
    {CONV_ALGO_BWD_DATA}
    {CONV_PRECISION}
    {CONV_RAISES}
    Also ValueError when dy is not the forward's output shape for ``x_shape``."""
    return conv_args.backward_data_args("conv3d_backward_data", 3, dy, w, x_shape, stride,
                                        padding, dilation, groups, mode, algo, precision,
                                        stream)


@public_op("conv2d_backward_filter")
def conv2d_backward_filter(x: ArrayLike, dy: ArrayLike, w_shape: Shape, *, stride: Size = 1,
                           padding: Padding = 0, dilation: Size = 1, groups: int = 1,
                           mode: str = "cross", algo: str | None = None,
                           precision: str | None = None, stream: Stream = None,
                           backend: Backend | None = None) -> conv_args.ConvBackwardFilterArgs:
    """Gradient wrt w of :func:`conv2d`: dw shaped ``w_shape`` (K, C/groups, R, S), from x
    (N, C, H, W) and dy (N, K, OH, OW), with the forward's keyword arguments.

    dw[k, c, t'] = sum over n and the outputs o of x_pad[n, g*C/G + c, o*stride + t*dilation] *
    dy[n, k, o]; an empty batch gives zeros.
    {CONV_OPTIONS}
    {CONV_ALGO_BWD_FILTER}
    {CONV_PRECISION}
    {CONV_RAISES}
    Also ValueError when dy is not the forward's output shape for x and ``w_shape``."""
    return conv_args.backward_filter_args("conv2d_backward_filter", 2, x, dy, w_shape, stride,
                                          padding, dilation, groups, mode, algo, precision,
                                          stream)


@public_op("conv3d_backward_filter")
def conv3d_backward_filter(x: ArrayLike, dy: ArrayLike, w_shape: Shape, *, stride: Size = 1,
                           padding: Padding = 0, dilation: Size = 1, groups: int = 1,
                           mode: str = "cross", algo: str | None = None,
                           precision: str | None = None, stream: Stream = None,
                           backend: Backend | None = None) -> conv_args.ConvBackwardFilterArgs:
    """Gradient wrt w of :func:`conv3d`: dw shaped ``w_shape`` (K, C/groups, T, R, S), from x
    (N, C, D, H, W) and dy (N, K, OD, OH, OW), with the forward's keyword arguments
    (:func:`conv2d_backward_filter` over three spatial dims).
    {CONV_OPTIONS}
    {CONV_ALGO_BWD_FILTER}
    {CONV_PRECISION}
    {CONV_RAISES}
    Also ValueError when dy is not the forward's output shape for x and ``w_shape``."""
    return conv_args.backward_filter_args("conv3d_backward_filter", 3, x, dy, w_shape, stride,
                                          padding, dilation, groups, mode, algo, precision,
                                          stream)


@public_op("conv_backward_bias")
def conv_backward_bias(dy: ArrayLike, *, stream: Stream = None,
                       backend: Backend | None = None) -> conv_args.ConvBiasArgs:
    """Gradient wrt the bias of a convolution: db[k] = sum over n and space of dy[n, k, ...].

    dy: (N, K, L), (N, K, H, W) or (N, K, D, H, W), float16, float32 or float64; returns db (K,)
    in dy's dtype, summed in the accumulation type (float32 for float16); an empty dy gives
    zeros. No options besides ``backend`` and ``stream``.
    Raises ValueError for a dy that is not 3-, 4- or 5-D; TypeError for a non-float dy."""
    s = arrays.as_stream(stream)
    dy = arrays.device_input("conv_backward_bias", "dy", dy, s, ndim=(3, 4, 5))
    return conv_args.ConvBiasArgs(dy, s)


FORWARD = ("conv2d", "conv3d")
BACKWARD_DATA = ("conv2d_backward_data", "conv3d_backward_data")
BACKWARD_FILTER = ("conv2d_backward_filter", "conv3d_backward_filter")
_TOL = {"float16": (1e-2, 1e-2), "float32": (1e-4, 1e-5), "float64": (1e-10, 1e-12)}


def _five(a, shape5):
    return arrays.reshaped(a, shape5)


# ---------------------------------------------------------------- Numba

def _numba_forward(x, w, bias, geom, opts, stream, activation=None):
    y, algo = conv_numba.forward(_five(x, geom.x_shape), _five(w, geom.w_shape), bias, geom,
                                 stream, conv_numba.gemm_math(opts), activation == "relu")
    note_algo(algo)
    return arrays.reshaped(y, geom.user_shape(geom.y_shape))


def _numba_backward_data(dy, w, geom, opts, stream):
    dx, algo = conv_numba.backward_data(_five(dy, geom.y_shape), _five(w, geom.w_shape), geom,
                                        stream, conv_numba.gemm_math(opts))
    note_algo(algo)
    return arrays.reshaped(dx, geom.user_shape(geom.x_shape))


def _numba_backward_filter(x, dy, geom, opts, stream):
    dw, algo = conv_numba.backward_filter(_five(x, geom.x_shape), _five(dy, geom.y_shape),
                                          geom, stream, conv_numba.gemm_math(opts))
    note_algo(algo)
    return arrays.reshaped(dw, geom.user_shape(geom.w_shape))


def _numba_backward_bias(dy, stream):
    return conv_numba.backward_bias(dy, stream)


# ---------------------------------------------------------------- cuDNN

def _image(geom):
    """Elements of the larger of one image of x and of y: the item cuDNN's calls are split
    between (ops/split.py). Kept on the geometry (it is read on every call)."""
    n = geom.__dict__.get("_image")
    if n is None:
        n = max(math.prod(geom.x_shape[1:]), math.prod(geom.y_shape[1:]))
        object.__setattr__(geom, "_image", n)
    return n


def _piece(geom, n):
    """The geometry of a piece of ``n`` images."""
    return geom if n == geom.x_shape[0] else \
        dataclasses.replace(geom, x_shape=(n,) + tuple(geom.x_shape[1:]))


def _pieces(geom, *batched):
    """[(views of the batched arrays, their geometry)] per piece of the batch."""
    views = split.batch(_image(geom), *batched)
    if len(views) == 1:
        return ((views[0], geom),)
    return [(v, _piece(geom, v[0].shape[0])) for v in views]


def _cudnn_supports(geom, opts):
    """Batches over cuDNN's 32-bit tensor limit run as pieces of the batch (each piece with
    its own algorithm choice and workspace); an image or a filter set over it cannot run."""
    key = (geom, opts["dtype"], opts["compute_dtype"], split.LIMIT)
    why = _supported.get(key, False)
    if why is False:                      # (None is a valid answer: supported)
        why = _supported[key] = _cudnn_why(geom, opts)
        if len(_supported) > 4096:
            _supported.clear()
    return why


_supported = {}     # _cudnn_supports' answers: it runs on every call


def _cudnn_supports_forward(x, w, bias, geom, opts, stream, activation=None):
    return _cudnn_supports(geom, opts)


def _cudnn_supports_backward_data(dy, w, geom, opts, stream):
    return _cudnn_supports(geom, opts)


def _cudnn_supports_backward_filter(x, dy, geom, opts, stream):
    return _cudnn_supports(geom, opts)


def _cudnn_why(geom, opts):
    us = geom.user_shape
    why = split.too_big(_image(geom), lambda: f"one image of x {us(geom.x_shape)} or of y "
                        f"{us(geom.y_shape)}") or \
        split.too_big(math.prod(geom.w_shape), lambda: f"w {us(geom.w_shape)}")
    if why:
        return why
    start, stop = split.bounds(geom.x_shape[0], _image(geom))[0]       # the largest piece
    return cconv.supports(_piece(geom, stop - start), opts["dtype"], opts["compute_dtype"],
                          allow_empty=True)


def _empty(geom):
    """Does the convolution sum run over nothing (an empty batch, input or filter set)?"""
    return 0 in geom.x_shape or 0 in geom.w_shape or 0 in geom.y_shape


def _cudnn_kw(opts, direction, stream):
    return dict(algo=opts["algo"], compute_dtype=opts["compute_dtype"],
                allow_tf32=opts["allow_tf32"], deterministic=opts["deterministic"],
                workspace_limit=conv_args.workspace_limit(opts),
                stream=device.stream_pointer(stream))


def _cudnn_forward(x, w, bias, geom, opts, stream, activation=None):
    y = arrays.cuda_empty(geom.user_shape(geom.y_shape), x.dtype, stream)
    if y.size:
        # an empty sum (no input channels, or an empty input padded out to a y): y = bias
        # (cuDNN rejects empty tensors)
        empty = _empty(geom)
        if empty:
            arrays.zero_fill(y, stream)
        kw = _cudnn_kw(opts, "fwd", stream)
        for (xp, yp), g in _pieces(geom, x, y):
            if not empty:
                note_algo(cconv.forward(xp, w, yp, g, **kw))
            if bias is not None:
                cconv.add_bias(yp, bias, g, device.stream_pointer(stream))
            if activation is not None:        # in place (cuDNN allows x == y)
                cudnn_act.forward(yp, yp, activation, 0.0, device.stream_pointer(stream))
    return y


def _cudnn_backward_data(dy, w, geom, opts, stream):
    dx = arrays.cuda_empty(geom.user_shape(geom.x_shape), dy.dtype, stream)
    if dx.size and _empty(geom):          # no filters: the gradient is zero (cuDNN rejects it)
        return arrays.zero_fill(dx, stream)
    if dx.size:
        kw = _cudnn_kw(opts, "bwd_data", stream)
        for (dyp, dxp), g in _pieces(geom, dy, dx):
            note_algo(cconv.backward_data(dyp, w, dxp, g, **kw))
    return dx


def _cudnn_backward_filter(x, dy, geom, opts, stream):
    """Pieces of the batch add their partial filter gradients (ops/split.py ``summed``)."""
    dw = arrays.cuda_empty(geom.user_shape(geom.w_shape), x.dtype, stream)
    if dw.size and _empty(geom):          # an empty batch: the sum over images is zero
        return arrays.zero_fill(dw, stream)
    if dw.size:
        kw = _cudnn_kw(opts, "bwd_filter", stream)

        def run(piece, dest):
            (xp, dyp), g = piece
            note_algo(cconv.backward_filter(xp, dyp, dest, g, **kw))
        split.summed(dw, _pieces(geom, x, dy), run, stream)
    return dw


# Runners for repeated calls of one signature (dispatch's memo, dnnkit/fastpath.py): one piece
# of the batch, no empty sum; the convolution itself through cconv.bind (plans kept).

def _bindable(geom):
    return not _empty(geom) and len(split.bounds(geom.x_shape[0], _image(geom)) or ()) == 1


def _bind(d, geom, opts, stream):
    return cconv.bind(d, geom, opts["dtype"], **_cudnn_kw(opts, d.name, stream))


def _bind_cudnn_forward(x, w, bias, geom, opts, stream, activation=None):
    if not _bindable(geom):
        return None
    run = _bind(cconv.FWD, geom, opts, stream)
    alloc = arrays.allocator(geom.user_shape(geom.y_shape), x.dtype, stream)
    sp = device.stream_pointer(stream)
    act = None if activation is None else cudnn_act.bind(
        False, math.prod(geom.y_shape), x.dtype, activation, 0.0, sp)

    def forward(x, w, bias, geom, opts, stream, activation=None):
        y = alloc()
        note_algo(run(x, w, y))
        if bias is not None:
            cconv.add_bias(y, bias, geom, sp)
        if act is not None:
            act(y, y)
        return y
    return forward


def _bind_gradient(d, geom, opts, stream, shape, dtype, swap):
    """The runner of a gradient (dx from (dy, w), dw from (x, dy)); ``swap``: cuDNN takes the
    two inputs in the other order (the data gradient's (w, dy))."""
    run, alloc = _bind(d, geom, opts, stream), arrays.allocator(shape, dtype, stream)

    def gradient(a, b, geom, opts, stream):
        out = alloc()
        note_algo(run(b, a, out) if swap else run(a, b, out))
        return out
    return gradient


def _bind_cudnn_backward_data(dy, w, geom, opts, stream):
    return _bind_gradient(cconv.BWD_DATA, geom, opts, stream, geom.user_shape(geom.x_shape),
                          dy.dtype, True) if _bindable(geom) else None


def _bind_cudnn_backward_filter(x, dy, geom, opts, stream):
    return _bind_gradient(cconv.BWD_FILTER, geom, opts, stream, geom.user_shape(geom.w_shape),
                          x.dtype, False) if _bindable(geom) else None


def _cudnn_bias_supports(dy, stream):
    if dy.ndim not in (4, 5):
        return f"cudnnConvolutionBackwardBias takes 4-D or 5-D tensors; got {dy.shape}"
    return split.too_big(math.prod(dy.shape[1:]), lambda: f"one image of dy {tuple(dy.shape)}")


def _cudnn_backward_bias(dy, stream):
    """Pieces of the batch add their partial sums (ops/split.py ``summed``)."""
    db = arrays.cuda_empty((dy.shape[1],), dy.dtype, stream)
    if db.size and not dy.size:            # an empty batch or image: the sum is zero
        return arrays.zero_fill(db, stream)
    if db.size:
        sp = device.stream_pointer(stream)
        split.summed(db, split.batch(math.prod(dy.shape[1:]), dy),
                     lambda piece, dest: cconv.backward_bias(piece[0], dest, sp), stream)
    return db


for _names, _numba, _cudnn, _supports, _bind_it, _bind_numba in (
        (FORWARD, _numba_forward, _cudnn_forward, _cudnn_supports_forward,
         _bind_cudnn_forward, conv_prepared.bind_forward),
        (BACKWARD_DATA, _numba_backward_data, _cudnn_backward_data,
         _cudnn_supports_backward_data, _bind_cudnn_backward_data,
         conv_prepared.bind_backward_data),
        (BACKWARD_FILTER, _numba_backward_filter, _cudnn_backward_filter,
         _cudnn_supports_backward_filter, _bind_cudnn_backward_filter, None)):
    for _name in _names:
        register(_name, "numba", tolerance=_TOL)(_numba)
        register(_name, "cudnn", supports=_supports, tolerance=_TOL)(_cudnn)
        binder(_name, "cudnn")(_bind_it)
        if _bind_numba is not None:       # ops/conv_prepared.py
            binder(_name, "numba")(functools.partial(_bind_numba, note=note_algo))
register("conv_backward_bias", "numba", tolerance=_TOL)(_numba_backward_bias)
register("conv_backward_bias", "cudnn", supports=_cudnn_bias_supports,
         tolerance=_TOL)(_cudnn_backward_bias)

__all__ = ["conv2d", "conv3d", "conv2d_backward_data", "conv3d_backward_data",
           "conv2d_backward_filter", "conv3d_backward_filter", "conv_backward_bias"]
