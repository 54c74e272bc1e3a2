"""Elementwise activations: relu, clipped_relu, tanh, sigmoid, elu, swish, identity.

    relu          y = max(x, 0)
    clipped_relu  y = min(max(x, 0), coef)                         (coef = ceiling > 0)
    tanh          y = tanh(x)
    sigmoid       y = 1 / (1 + exp(-x))
    elu           y = x if x > 0 else coef * (exp(x) - 1)          (coef = alpha)
    swish         y = x * sigmoid(coef * x)                        (coef = beta)
    identity      y = x

Backward: dx = dy * f'(x). Where the slope is a choice, both backends take cuDNN's: relu 0 at
x == 0; clipped_relu 0 at x == 0 and 1 at x == coef (PyTorch's hardtanh takes 0 there); elu 1
at x == 0. NaN propagates forward (CUDNN_PROPAGATE_NAN); backward, a NaN dy always propagates,
and a NaN x gives slope 0 for relu/clipped_relu, NaN otherwise. cuDNN:
cudnnActivationForward/Backward; it has no stand-alone identity, so identity always runs on
Numba, and its ELU backward takes the slope from y, which for alpha = 0 cannot tell x < 0 from
x = 0: that case runs on Numba too. Arrays over cuDNN's 32-bit tensor limit run as flat pieces
(ops/split.py).

In place: ``out=`` names the array the result is written into (ops/inplace.py): x itself for
activation (cudnnActivationForward allows y == x), dy, x or y for activation_backward
(cuDNN allows dx == dy; over x or y its result goes through a pool array). Backward after
``activation(x, out=x)`` has only y: relu (slope 1 where y > 0), tanh (1 - y^2), sigmoid
(y (1 - y)), identity and elu with alpha > 0 (1 where y >= 0, else y + alpha) take their slope
from y exactly, and their gradient rule passes y for x; clipped_relu (y == coef for every x >=
coef), swish and elu with alpha <= 0 need x, and backward raises RuntimeError saying so.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

import numpy as np

from .. import arrays, device
from ..autograd import gradient
from ..cudnn import activation as cudnn_activation
from ..dispatch import public_op
from ..hints import ArrayLike, Backend, OpOutput, Stream
from ..launch import Prepared, flat as flat_arg, launch
from ..registry import binder, register
from . import inplace, split
from .args import choice

MODES = ("relu", "clipped_relu", "tanh", "sigmoid", "elu", "swish", "identity")
_MODE_ID = {m: i for i, m in enumerate(MODES)}   # matches kernels/activation.py
_TOL = {"float16": (2e-3, 1e-3), "float32": (1e-5, 1e-6), "float64": (1e-12, 1e-14)}


class ActivationArgs(NamedTuple):
    """activation's checked arguments, as its implementations take them."""
    x: object
    mode: str
    coef: float
    stream: object
    out: object = None


class ActivationBackwardArgs(NamedTuple):
    """activation_backward's checked arguments, as its implementations take them."""
    x: object
    y: object
    dy: object
    mode: str
    coef: float
    stream: object
    out: object = None


# modes whose slope y gives exactly (elu only with alpha > 0): backward after out=x
FROM_OUTPUT = ("relu", "tanh", "sigmoid", "identity", "elu")


def from_output(mode, coef):
    """Whether activation_backward can take f'(x) from y alone (x overwritten in place)."""
    return mode in FROM_OUTPUT and (mode != "elu" or coef > 0)


def _check(op, mode, coef):
    choice(op, "mode", mode, MODES)      # before any lookup: a list mode is not hashable
    try:
        coef = float(coef)
    except (TypeError, ValueError):
        raise TypeError(f"{op}: coef must be a number; got {coef!r}") from None
    if not np.isfinite(coef):
        raise ValueError(f"{op}: coef must be finite; got {coef}")
    if mode == "clipped_relu" and coef <= 0:
        raise ValueError(f"{op}: clipped_relu needs coef (the ceiling) > 0; got {coef}")
    return coef


@public_op("activation")
def activation(x: ArrayLike, mode: str = "relu", coef: float = 0.0, *, out: ArrayLike = None,
               stream: Stream = None, backend: Backend | None = None) -> ActivationArgs:
    """Apply an activation elementwise: y = f(x), a new array shaped like ``x``.

    ``mode`` (default "relu") and ``coef`` (its parameter; ignored by the other modes):
        relu          y = max(x, 0)
        clipped_relu  y = min(max(x, 0), coef)                  coef: the ceiling, > 0
        tanh          y = tanh(x)
        sigmoid       y = 1 / (1 + exp(-x))
        elu           y = x if x > 0 else coef * (exp(x) - 1)   coef: alpha
        swish         y = x * sigmoid(coef * x)                 coef: beta
        identity      y = x                   (Numba: cuDNN has no stand-alone identity)
    x: float16, float32 or float64, any shape; computed in float32 for float16; NaN propagates.
    ``out``: a device array of x's shape and dtype to write y into and return, x itself for
    in place (a Tensor x's gradient then comes from y: relu, tanh, sigmoid, identity, elu with
    coef > 0; see the module docstring); None (default): a new array.
    Raises ValueError for a mode not listed, a coef that is not finite, clipped_relu with
    coef <= 0, or an out of another shape or overlapping x in part; TypeError for a coef that
    is not a number or an out of another dtype."""
    coef = _check("activation", mode, coef)
    s = arrays.as_stream(stream)
    x = arrays.device_input("activation", "x", x, s)
    out = inplace.output("activation", out, x, s, x=x)
    return ActivationArgs(x, mode, coef, s, out)


@public_op("activation_backward")
def activation_backward(x: ArrayLike, y: ArrayLike, dy: ArrayLike, mode: str = "relu",
                        coef: float = 0.0, *, out: ArrayLike = None, stream: Stream = None,
                        backend: Backend | None = None) -> ActivationBackwardArgs:
    """Gradient of :func:`activation`: dx = dy * f'(x), given x, y = activation(x) and dy.

    x, y, dy: one shape and one dtype (float16, float32 or float64); returns dx shaped like x.
    ``mode``: "relu" (default), "clipped_relu", "tanh", "sigmoid", "elu", "swish" or "identity";
    ``coef`` as in the forward call. Where the slope is a choice, both backends take cuDNN's:
    relu 0 at x == 0; clipped_relu 0 at x == 0 and 1 at x == coef; elu 1 at x == 0. A NaN dy
    propagates; a NaN x gives slope 0 for relu and clipped_relu, NaN otherwise.
    ``out``: a device array shaped like x to write dx into and return (dy, x or y itself for
    in place); None (default): a new array. With y passed for x (x overwritten by an in-place
    forward), the modes of ``from_output`` give their exact gradient.
    Raises ValueError for a mode not listed, a bad coef, arrays of different shapes or an out
    overlapping an input in part; TypeError for different dtypes."""
    op = "activation_backward"
    coef = _check(op, mode, coef)
    s = arrays.as_stream(stream)
    x = arrays.device_input(op, "x", x, s)
    y = arrays.device_input(op, "y", y, s)
    dy = arrays.device_input(op, "dy", dy, s)
    arrays.same_shape(op, "x", x, y=y, dy=dy)
    out = inplace.output(op, out, x, s, x=x, y=y, dy=dy)
    return ActivationBackwardArgs(x, y, dy, mode, coef, s, out)


class Elementwise(Protocol):
    """The type of relu, tanh and sigmoid: ``activation`` with the mode fixed."""

    def __call__(self, x: ArrayLike, *, out: ArrayLike = None, backend: Backend | None = None,
                 stream: Stream = None) -> OpOutput: ...


def _shortcut(mode: str) -> Elementwise:
    def fn(x: ArrayLike, *, out: ArrayLike = None, backend: Backend | None = None,
           stream: Stream = None) -> OpOutput:
        if stream is None and out is None:      # no keyword: a cheaper memo signature
            return activation(x, mode, backend=backend)
        return activation(x, mode, out=out, backend=backend, stream=stream)
    fn.__name__ = fn.__qualname__ = mode
    formula = {"relu": "max(x, 0)", "tanh": "tanh(x)", "sigmoid": "1 / (1 + exp(-x))"}[mode]
    fn.__doc__ = f"""Elementwise {mode}, y = {formula}: ``activation(x, {mode!r})``.

    x: float16, float32 or float64, any shape; returns a new array shaped like x (computed in
    float32 for float16; NaN propagates), or ``out`` with y written into it (``out=x``: in
    place). The gradient: activation_backward(x, y, dy, {mode!r}).
    Raises TypeError for an x that is not a float array.

    {{OP_FOOTER}}"""
    fn.op_name = "activation"
    return fn


relu, tanh, sigmoid = _shortcut("relu"), _shortcut("tanh"), _shortcut("sigmoid")


# ---------------------------------------------------------------- Numba
# (The kernels are imported inside the functions: they import numba, which ``import dnnkit``
# does not pay for.)

def _launch(kernel, n, stream, *args):
    if n:
        blocks, threads = arrays.grid_1d(n)
        launch(kernel, blocks, threads, stream, args)


@register("activation", "numba", tolerance=_TOL)
def _activation_numba(x, mode, coef, stream, out=None):
    from ..kernels import activation_fwd_kernel
    y = inplace.result(out, x, stream)       # the kernel reads x[i] before writing y[i]
    acc = arrays.acc_array(x.dtype)
    _launch(activation_fwd_kernel, x.size, stream, flat_arg(x), flat_arg(y),
            _MODE_ID[mode], acc.dtype.type(coef), acc)
    return y


@register("activation_backward", "numba", tolerance=_TOL)
def _activation_backward_numba(x, y, dy, mode, coef, stream, out=None):
    from ..kernels import activation_bwd_kernel
    dx = inplace.result(out, x, stream)      # elementwise: any of x, y, dy may be dx
    acc = arrays.acc_array(x.dtype)
    _launch(activation_bwd_kernel, x.size, stream, flat_arg(x), flat_arg(y),
            flat_arg(dy), flat_arg(dx), _MODE_ID[mode], acc.dtype.type(coef), acc)
    return dx


# ---------------------------------------------------------------- cuDNN

def _cudnn_supports(x, mode, coef, stream, out=None):
    """Any size: arrays over cuDNN's 32-bit limit run as flat pieces (ops/split.py)."""
    if mode == "identity":
        return "cuDNN has no stand-alone identity activation (only inside fused convolutions)"
    return None


def _cudnn_backward_supports(x, y, dy, mode, coef, stream, out=None):
    if mode == "elu" and coef == 0.0:
        # measured on an H100 (cuDNN 9.19): slope 1 where y = 0, i.e. for every x < 0
        return ("cuDNN's ELU backward takes the slope from y, and with alpha = 0 y is 0 for "
                "every x <= 0: it cannot tell the slope 0 of x < 0 from the 1 of x = 0")
    return _cudnn_supports(x, mode, coef, stream)


@register("activation", "cudnn", supports=_cudnn_supports)
def _activation_cudnn(x, mode, coef, stream, out=None):
    y = inplace.result(out, x, stream)       # y == x: in place, as the API reference allows
    if x.size:
        for xp, yp in split.flat(x, y):
            cudnn_activation.forward(xp, yp, mode, coef, device.stream_pointer(stream))
    return y


def _backward_into(x, y, dy, dx, mode, coef, stream):
    for xp, yp, dyp, dxp in split.flat(x, y, dy, dx):
        cudnn_activation.backward(xp, yp, dyp, dxp, mode, coef, device.stream_pointer(stream))


@register("activation_backward", "cudnn", supports=_cudnn_backward_supports)
def _activation_backward_cudnn(x, y, dy, mode, coef, stream, out=None):
    if not x.size:
        return inplace.result(out, x, stream)
    if out is None or inplace.same(out, dy) or not (inplace.same(out, x) or
                                                    inplace.same(out, y)):
        dx = inplace.result(out, x, stream)  # dx == dy: in place, as the API reference allows
        _backward_into(x, y, dy, dx, mode, coef, stream)
        return dx
    tmp = arrays.empty_like(x, stream)       # over x or y: not documented, so through a copy
    _backward_into(x, y, dy, tmp, mode, coef, stream)
    return arrays.copy_into(out, tmp, stream)


# Runners for repeated calls of one signature (dispatch's memo): arrays of one cuDNN piece.

@binder("activation", "cudnn")
def _bind_activation_cudnn(x, mode, coef, stream, out=None):
    if not 0 < x.size <= split.LIMIT:
        return None
    run = cudnn_activation.bind(False, x.size, x.dtype, mode, coef, device.stream_pointer(stream))
    alloc = arrays.allocator(x.shape, x.dtype, stream)

    def activation(x, mode, coef, stream, out=None):
        y = alloc() if out is None else out
        run(x, y)
        return y
    return activation


@binder("activation_backward", "cudnn")
def _bind_activation_backward_cudnn(x, y, dy, mode, coef, stream, out=None):
    if not 0 < x.size <= split.LIMIT or (out is not None and not inplace.same(out, dy) and (
            inplace.same(out, x) or inplace.same(out, y))):
        return None
    run = cudnn_activation.bind(True, x.size, x.dtype, mode, coef, device.stream_pointer(stream))
    alloc = arrays.allocator(x.shape, x.dtype, stream)

    def activation_backward(x, y, dy, mode, coef, stream, out=None):
        if out is None:
            dx = alloc()
        elif inplace.same(out, dy) or not (inplace.same(out, x) or inplace.same(out, y)):
            dx = out
        else:         # a later call of this signature writing over x or y: through a copy
            return _activation_backward_cudnn(x, y, dy, mode, coef, stream, out)
        run(x, y, dy, dx)
        return dx
    return activation_backward


# Runners of the Numba kernels for repeated calls (dispatch's memo): the launch packed once
# (launch.Prepared); a call allocates its output and writes its arrays' addresses into it.

@binder("activation", "numba")
def _bind_activation_numba(x, mode, coef, stream, out=None):
    if not x.size or out is not None:
        return None
    from ..kernels import activation_fwd_kernel
    alloc, acc = arrays.allocator(x.shape, x.dtype, stream), arrays.acc_array(x.dtype)
    blocks, threads = arrays.grid_1d(x.size)
    pl = Prepared(activation_fwd_kernel, blocks, threads,
                  (flat_arg(x), flat_arg(x), _MODE_ID[mode], acc.dtype.type(coef), acc))

    def activation(x, mode, coef, stream, out=None):
        y = alloc()
        pl.set_flat(0, x)
        pl.set_flat(1, y)
        pl(stream)
        return y
    return activation


@binder("activation_backward", "numba")
def _bind_activation_backward_numba(x, y, dy, mode, coef, stream, out=None):
    if not x.size or out is not None:
        return None
    from ..kernels import activation_bwd_kernel
    alloc, acc = arrays.allocator(x.shape, x.dtype, stream), arrays.acc_array(x.dtype)
    blocks, threads = arrays.grid_1d(x.size)
    f = flat_arg(x)
    pl = Prepared(activation_bwd_kernel, blocks, threads,
                  (f, f, f, f, _MODE_ID[mode], acc.dtype.type(coef), acc))

    def activation_backward(x, y, dy, mode, coef, stream, out=None):
        dx = alloc()
        for i, a in enumerate((x, y, dy, dx)):
            pl.set_flat(i, a)
        pl(stream)
        return dx
    return activation_backward


# ---------------------------------------------------------------- autograd

@gradient("activation")
def _activation_grad(g, dy):
    if not g.needs("x"):
        return {}
    if g.wrote_into("x"):         # activation(x, out=x): only y is left
        if not from_output(g.mode, g.coef):
            raise RuntimeError(
                f"activation: the gradient of {g.mode}"
                f"{f' with coef {g.coef}' if g.mode == 'elu' else ''} needs its input x, which "
                f"the in-place call (out=x) overwrote; y alone gives the slope of relu, tanh, "
                f"sigmoid, identity and elu with coef > 0: run {g.mode} out of place")
        y = g.out
        return {"x": activation_backward(y, y, dy, g.mode, g.coef, backend=g.backend,
                                         stream=g.stream)}
    return {"x": activation_backward(g.x, g.out, dy, g.mode, g.coef, backend=g.backend,
                                     stream=g.stream)}


# ---------------------------------------------------------------- fused activations

def fused_reads(args):
    """``reads_out`` of the gradient rule of an op with a fused ``activation=`` (the
    convolutions, linear): y when one was fused (its slope), else no output."""
    return (0,) if args.get("activation") else ()


def through_fused(g, dy):
    """dy through the recorded call's fused activation, its slope read from the op's output y
    (relu's is the same from y as from its input), or dy when none was fused."""
    if g.activation is None:
        return dy
    return activation_backward(g.out, g.out, dy, g.activation, backend=g.backend,
                               stream=g.stream)
