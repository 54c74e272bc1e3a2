"""Batch normalization: training forward, inference forward and backward.

    training:   mean, var = batch mean and biased variance of x per statistic (m values each)
                y = (x - mean) / sqrt(var + eps) * gamma + beta
                running_mean = (1 - momentum) * running_mean + momentum * mean
                running_var  = (1 - momentum) * running_var  + momentum * var * m / (m - 1)
    inference:  y = (x - mean) / sqrt(var + eps) * gamma + beta     (given mean, var)
    backward:   xhat = (x - mean) * invstd;  dbeta = sum dy;  dgamma = sum dy * xhat
                dx = gamma * invstd / m * (m * dy - dbeta - xhat * dgamma)

Fusion. ``activation="relu"`` fuses a relu into each: y = max(y, 0) in the forwards, and the
backward (given the forward's y) first takes dy through relu's slope (1 where y > 0, else 0;
cuDNN's and ops/activation.py's conventions). ``residual=z`` (x's shape and dtype) adds z
before the activation, y = relu(bn(x) + z) (a ResNet block's end; cuDNN's BN_ADD_ACTIVATION
form), and ``batch_norm_backward(residual=True)`` also returns z's gradient (dy through the
slope). One op call instead of two or three each way; on the Numba kernels also fewer passes
over memory (kernels/batchnorm.py); on cuDNN the op makes cuDNN's add and activation calls
itself (cudnn/batchnorm.py says why not cuDNN's fused form). ``nn.Sequential`` takes the relu
for a BatchNorm followed by a ReLU; dnnkit.models' ResNet blocks take both.

``mode="spatial"``: one statistic per channel over (N, *spatial), parameters shaped (C,) or
(1, C, 1, ...); ``mode="per-activation"``: one per (c, *spatial) position over N, parameters
shaped x.shape[1:] or (1,) + x.shape[1:]. x is 2-D to 5-D, (N, C, *spatial).

Dtypes follow cuDNN (cudnnDeriveBNTensorDescriptor): parameters and statistics are float32 for
float16 and float32 data, float64 for float64 data. Host parameters of another float dtype are
converted; device parameters must already have it.

momentum is cuDNN's exponentialAverageFactor (PyTorch's momentum is the same). The saved
statistics are the batch mean and 1/sqrt(var + eps) (cuDNN's resultSaveInvVariance).

Backends: Numba (ops/batchnorm_numba.py on kernels/batchnorm.py: Welford statistics,
deterministic) and cuDNN (cudnn/batchnorm.py). cuDNN is not used for epsilon < 1e-5
(CUDNN_MIN_EPSILON; see cudnn/batchnorm.py) nor for empty or >2**31-element tensors.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .. import arrays, device
from ..cudnn import batchnorm as cudnn_bn
from ..autograd import gradient
from ..tensors import unwrap
from ..dispatch import public_op
from ..hints import ArrayLike, Backend, OpOutput, Stream
from ..registry import register
from . import inplace
from .args import choice, fused_activation
from .batchnorm_numba import ncs

MODES = ("spatial", "per-activation")
CUDNN_MIN_EPSILON = 1e-5


class BatchNormTrainArgs(NamedTuple):
    """batch_norm_train's checked arguments, as its implementations take them (the
    running statistics: None, or device arrays the implementations copy and update)."""
    x: object
    gamma: object
    beta: object
    mode: str
    epsilon: float
    momentum: float
    running_mean: object
    running_var: object
    stream: object
    activation: object = None
    residual: object = None


class BatchNormInferenceArgs(NamedTuple):
    """batch_norm_inference's checked arguments."""
    x: object
    gamma: object
    beta: object
    mean: object
    var: object
    mode: str
    epsilon: float
    stream: object
    out: object = None
    activation: object = None
    residual: object = None


class BatchNormBackwardArgs(NamedTuple):
    """batch_norm_backward's checked arguments."""
    x: object
    dy: object
    gamma: object
    saved_mean: object
    saved_invstd: object
    mode: str
    epsilon: float
    stream: object
    activation: object = None
    y: object = None
    residual: bool = False


# ---------------------------------------------------------------- arguments

def _check(op, mode, epsilon):
    choice(op, "mode", mode, MODES)
    try:
        eps = float(epsilon)
    except (TypeError, ValueError):
        raise TypeError(f"{op}: epsilon must be a number; got {epsilon!r}") from None
    if not (np.isfinite(eps) and eps > 0):
        raise ValueError(f"{op}: epsilon must be positive and finite (it keeps 1/sqrt(var + "
                         f"epsilon) finite for a constant channel); got {epsilon!r}")
    return eps


def _residual(op, z, x, stream):
    if z is None:
        return None
    z = arrays.device_input(op, "residual", z, stream)
    arrays.same_shape(op, "x", x, residual=z)
    return z


def _check_momentum(op, momentum):
    try:
        mom = float(momentum)
    except (TypeError, ValueError):
        raise TypeError(f"{op}: momentum must be a number; got {momentum!r}") from None
    if not 0.0 <= mom <= 1.0:
        raise ValueError(f"{op}: momentum must be in [0, 1] (the weight of the batch statistics "
                         f"in the running average); got {momentum!r}")
    return mom


def param_shapes(shape, mode):
    """The two accepted shapes of a parameter or statistic of x (shape): flat, broadcast."""
    if mode == "per-activation":
        return tuple(shape[1:]), (1,) + tuple(shape[1:])
    return (shape[1],), (1, shape[1]) + (1,) * (len(shape) - 2)


def _param(op, name, a, x, mode, stream):
    """A parameter or statistic of x as a device array of cuDNN's parameter dtype."""
    pdt = arrays.acc_dtype(x.dtype)
    if not (arrays.is_device_array(a) or hasattr(a, "__cuda_array_interface__")):
        h = np.asarray(a)
        a = h.astype(pdt) if h.dtype.kind == "f" and h.dtype != pdt else h
    d = arrays.device_input(op, name, a, stream)
    if d.dtype != pdt:
        raise TypeError(f"{op}: {name} must be {pdt} for {x.dtype} x (cuDNN's rule: float32 "
                        f"parameters for float16 and float32 data); got {d.dtype}")
    allowed = param_shapes(x.shape, mode)
    if tuple(d.shape) not in allowed:
        raise ValueError(f"{op}: {name} has shape {tuple(d.shape)}; for x {tuple(x.shape)} in "
                         f"{mode} mode it must be {allowed[0]} or {allowed[1]}")
    return d


def _running(op, rm, rv, x, mode, stream):
    if (rm is None) != (rv is None):
        raise ValueError(f"{op}: give both running_mean and running_var, or neither")
    if rm is None:
        return None, None
    out = []
    for name, a in (("running_mean", rm), ("running_var", rv)):
        if isinstance(a, np.ndarray):
            if not a.flags.writeable:
                raise ValueError(f"{op}: {name} is read-only; it is updated in place")
        elif not (arrays.is_device_array(a) or hasattr(a, "__cuda_array_interface__")):
            raise TypeError(f"{op}: {name} must be a NumPy or device array (it is updated in "
                            f"place); got {type(a).__name__}")
        out.append(_param(op, name, a, x, mode, stream))
    return out


def _x(op, x, stream):
    return arrays.device_input(op, "x", x, stream, ndim=(2, 3, 4, 5))


def _train_args(x: ArrayLike, gamma: ArrayLike, beta: ArrayLike, *, mode: str = "spatial",
                epsilon: float = 1e-5, momentum: float = 0.1,
                running_mean: ArrayLike | None = None, running_var: ArrayLike | None = None,
                stream: Stream = None, backend: Backend | None = None,
                activation: str | None = None,
                residual: ArrayLike | None = None) -> BatchNormTrainArgs:
    op = "batch_norm_train"
    eps = _check(op, mode, epsilon)
    act = fused_activation(op, activation)
    mom = _check_momentum(op, momentum)
    s = arrays.as_stream(stream)
    x = _x(op, x, s)
    g, b = _param(op, "gamma", gamma, x, mode, s), _param(op, "beta", beta, x, mode, s)
    rm, rv = _running(op, running_mean, running_var, x, mode, s)
    n, _, sp = ncs(x.shape, mode)
    if n * sp < 2:
        raise ValueError(f"{op}: needs more than one value per statistic to estimate a variance;"
                         f" x {tuple(x.shape)} in {mode} mode gives {n * sp}")
    return BatchNormTrainArgs(x, g, b, mode, eps, mom, rm, rv, s, act,
                              _residual(op, residual, x, s))


_train = public_op("batch_norm_train")(_train_args)


def batch_norm_train(x: ArrayLike, gamma: ArrayLike, beta: ArrayLike, *, mode: str = "spatial",
                     epsilon: float = 1e-5, momentum: float = 0.1,
                     running_mean: ArrayLike | None = None,
                     running_var: ArrayLike | None = None, backend: Backend | None = None,
                     stream: Stream = None, activation: str | None = None,
                     residual: ArrayLike | None = None) -> tuple[OpOutput, OpOutput, OpOutput]:
    """Normalize x (N, C, *spatial; 2-D to 5-D) with its batch statistics:
    ``y = (x - mean) / sqrt(var + epsilon) * gamma + beta``; returns ``(y, saved_mean,
    saved_invstd)``, the batch mean and 1/sqrt(var + epsilon) (var biased), shaped like gamma:
    pass them to :func:`batch_norm_backward`.
    ``activation``: None (default) or "relu": y = max(y, 0) in the same call (pass the same
    activation and this y to batch_norm_backward). ``residual``: an array of x's shape and
    dtype added before the activation, y = relu(bn(x) + residual) (batch_norm_backward's
    ``residual=True`` gives its gradient).

    {BN_OPTIONS}
    ``momentum``: in [0, 1] (default 0.1, cuDNN's exponentialAverageFactor, PyTorch's momentum).
    ``running_mean``, ``running_var``: both or neither (default); NumPy or device arrays of the
    parameters' dtype and shape, updated in place: r = (1 - momentum) r + momentum * batch
    statistic, the variance unbiased by m / (m - 1).
    Raises ValueError for a mode not listed, a bad epsilon or momentum, parameters of the wrong
    shape, one running array without the other, a read-only running array or statistics over
    a single value; TypeError for parameters of the wrong dtype.

    {OP_FOOTER}"""
    y, mean, invstd, rm, rv = _train(x, gamma, beta, mode=mode, epsilon=epsilon,
                                     momentum=momentum, running_mean=running_mean,
                                     running_var=running_var, backend=backend, stream=stream,
                                     activation=activation, residual=residual)
    if rm is not None:    # (updated in place; a device copy of a NumPy array goes back)
        s = arrays.as_stream(stream)
        _write_back(unwrap(running_mean), unwrap(rm), s)
        _write_back(unwrap(running_var), unwrap(rv), s)
    return y, mean, invstd


batch_norm_train.op_name = "batch_norm_train"


def _write_back(dst, src, stream):
    if isinstance(dst, np.ndarray):
        device.refuse_in_capture("batch_norm_train with NumPy running statistics", "they are "
                                 "copied back to the host", device.stream_pointer(stream))
        h = src.copy_to_host(stream=stream)
        stream.synchronize()
        dst[...] = h.reshape(dst.shape)
        return
    if dst is not src:      # a foreign array: its view was written, unless copied
        d = arrays.device_input("batch_norm_train", "running statistics", dst, stream)
        if device.simulator() or d.device_ctypes_pointer.value != src.device_ctypes_pointer.value:
            arrays.copy_into(d, src, stream)


@public_op("batch_norm_inference")
def batch_norm_inference(x: ArrayLike, gamma: ArrayLike, beta: ArrayLike, mean: ArrayLike,
                         var: ArrayLike, *, mode: str = "spatial", epsilon: float = 1e-5,
                         out: ArrayLike = None, stream: Stream = None,
                         backend: Backend | None = None, activation: str | None = None,
                         residual: ArrayLike | None = None) -> BatchNormInferenceArgs:
    """Normalize x with given statistics (e.g. the running ones): returns
    ``y = (x - mean) / sqrt(var + epsilon) * gamma + beta``, shaped like x (N, C, *spatial;
    2-D to 5-D).

    ``gamma``, ``beta``, ``mean``, ``var``: the parameters and statistics, shaped by ``mode``.
    {BN_OPTIONS}
    ``out``: a device array shaped like x to write y into (x itself: in place; ops/inplace.py).
    ``activation``: None (default) or "relu": y = max(y, 0) in the same call; ``residual``: an
    array of x's shape and dtype added before it.
    Raises ValueError for a mode or activation not listed, a bad epsilon, parameters of the
    wrong shape or an out overlapping x in part; TypeError for parameters or an out of the
    wrong dtype."""
    op = "batch_norm_inference"
    eps = _check(op, mode, epsilon)
    act = fused_activation(op, activation)
    s = arrays.as_stream(stream)
    x = _x(op, x, s)
    p = [_param(op, name, a, x, mode, s) for name, a in
         (("gamma", gamma), ("beta", beta), ("mean", mean), ("var", var))]
    z = _residual(op, residual, x, s)
    out = inplace.output(op, out, x, s, x=x, gamma=p[0], beta=p[1], mean=p[2], var=p[3],
                         **({} if z is None else {"residual": z}))
    return BatchNormInferenceArgs(x, *p, mode, eps, s, out, act, z)


@public_op("batch_norm_backward")
def batch_norm_backward(x: ArrayLike, dy: ArrayLike, gamma: ArrayLike, saved_mean: ArrayLike,
                        saved_invstd: ArrayLike, *, mode: str = "spatial",
                        epsilon: float = 1e-5, stream: Stream = None,
                        backend: Backend | None = None, activation: str | None = None,
                        y: ArrayLike | None = None,
                        residual: bool = False) -> BatchNormBackwardArgs:
    """Gradients of :func:`batch_norm_train` (the batch statistics as functions of x): returns
    ``(dx, dgamma, dbeta)``, with xhat = (x - saved_mean) * saved_invstd over m values each:

        dbeta = sum dy;  dgamma = sum dy * xhat;
        dx = gamma * saved_invstd / m * (m * dy - dbeta - xhat * dgamma)

    x, dy: one shape (N, C, *spatial); ``saved_mean``, ``saved_invstd``: the training forward's.
    {BN_OPTIONS}
    ``epsilon`` must be the forward's (cuDNN checks it).
    ``activation``: the forward's (None or "relu"); with "relu", ``y`` is the forward's output
    (max(y, 0)) and dy is first taken through relu's slope (1 where y > 0).
    ``residual``: True when the forward added a residual: returns ``(dx, dgamma, dbeta,
    dresidual)``, dresidual being dy through the activation's slope.
    Raises ValueError for a mode or activation not listed, a bad epsilon, arrays of the wrong
    shape, an activation without y or an empty batch; TypeError for arrays of the wrong dtype."""
    op = "batch_norm_backward"
    eps = _check(op, mode, epsilon)
    act = fused_activation(op, activation)
    s = arrays.as_stream(stream)
    x = _x(op, x, s)
    dy = arrays.device_input(op, "dy", dy, s)
    if act is not None:
        if y is None:
            raise ValueError(f"{op}: activation={act!r} needs y, the forward's output (relu's "
                             "slope comes from it)")
        y = arrays.device_input(op, "y", y, s)
        arrays.same_shape(op, "x", x, dy=dy, y=y)
    else:
        y = None                  # (unread without an activation)
        arrays.same_shape(op, "x", x, dy=dy)
    p = [_param(op, name, a, x, mode, s) for name, a in
         (("gamma", gamma), ("saved_mean", saved_mean), ("saved_invstd", saved_invstd))]
    if x.shape[0] == 0:
        raise ValueError(f"{op}: x {tuple(x.shape)} is an empty batch (no statistics to "
                         "differentiate)")
    if not isinstance(residual, (bool, np.bool_)):
        raise TypeError(f"{op}: residual must be True or False (whether the forward added "
                        f"one); got {residual!r}")
    return BatchNormBackwardArgs(x, dy, *p, mode, eps, s, act, y, bool(residual))


# ---------------------------------------------------------------- cuDNN

def _cudnn_reason(x, eps):
    if eps < CUDNN_MIN_EPSILON:
        return (f"epsilon {eps:g} is below cuDNN's minimum CUDNN_BN_MIN_EPSILON "
                f"({CUDNN_MIN_EPSILON:g})")
    if x.size >= 2**31:
        return f"{x.size} elements exceed cuDNN's 32-bit tensor size"
    return None


def _supports_train(x, gamma, beta, mode, epsilon, momentum, running_mean, running_var,
                    stream, activation=None, residual=None):
    return _cudnn_reason(x, epsilon)


def _supports_inference(x, gamma, beta, mean, var, mode, epsilon, stream, out=None,
                        activation=None, residual=None):
    return _cudnn_reason(x, epsilon)


def _supports_backward(x, dy, gamma, saved_mean, saved_invstd, mode, epsilon, stream,
                       activation=None, y=None, residual=False):
    return _cudnn_reason(x, epsilon)


@register("batch_norm_train", "cudnn", supports=_supports_train,
          updates=("running_mean", "running_var"))
def _train_cudnn(x, gamma, beta, mode, epsilon, momentum, running_mean, running_var, stream,
                 activation=None, residual=None):
    y = arrays.empty_like(x, stream)
    mean, invstd = (arrays.cuda_empty(gamma.shape, gamma.dtype, stream) for _ in range(2))
    rm, rv = running_mean, running_var        # updated in place (registered as updates)
    if x.size:   # empty (C = 0; argument checks refuse an empty batch): nothing to compute
        cudnn_bn.forward_training(x, y, gamma, beta, mean, invstd, rm, rv, mode, epsilon,
                                  momentum, device.stream_pointer(stream), activation, residual)
    return y, mean, invstd, rm, rv


@register("batch_norm_inference", "cudnn", supports=_supports_inference)
def _inference_cudnn(x, gamma, beta, mean, var, mode, epsilon, stream, out=None,
                     activation=None, residual=None):
    if residual is not None and inplace.same(out, residual):
        # cuDNN's batch norm writes y before the residual is added: add a copy of it
        residual = arrays.copy_into(arrays.empty_like(residual, stream), residual, stream)

    def write(y):   # (cuDNN rejects empty tensors; in place is not documented: through_copy)
        if x.size:
            cudnn_bn.forward_inference(x, y, gamma, beta, mean, var, mode, epsilon,
                                       device.stream_pointer(stream), activation, residual)
    return inplace.through_copy(out, x, stream, write)


@register("batch_norm_backward", "cudnn", supports=_supports_backward)
def _backward_cudnn(x, dy, gamma, saved_mean, saved_invstd, mode, epsilon, stream,
                    activation=None, y=None, residual=False):
    dx = arrays.empty_like(x, stream)
    dgamma, dbeta = (arrays.cuda_empty(gamma.shape, gamma.dtype, stream) for _ in range(2))
    # relu's dy, which is also the residual's gradient
    dz = arrays.empty_like(x, stream) if activation or residual else None
    if x.size:
        cudnn_bn.backward(x, dy, dx, gamma, dgamma, dbeta, saved_mean, saved_invstd, mode,
                          epsilon, device.stream_pointer(stream), activation, y, dz)
    else:        # (C = 0 or no values per statistic) the parameter gradients sum nothing
        arrays.zero_fill(dgamma, stream)
        arrays.zero_fill(dbeta, stream)
    return (dx, dgamma, dbeta, dz) if residual else (dx, dgamma, dbeta)


# ---------------------------------------------------------------- autograd

def _reads(args):
    """The outputs the training rule reads: y too when a relu was fused (its slope)."""
    return (0, 1, 2) if args.get("activation") else (1, 2)


@gradient("batch_norm_train", outputs=(0,), inputs=("x", "gamma", "beta", "residual"),
          reads_out=_reads)
def _batch_norm_grad(g, dy):
    y, mean, invstd = g.out[:3]
    act, z = g.activation, g.needs("residual")
    got = batch_norm_backward(g.x, dy, g.gamma, mean, invstd, mode=g.mode, epsilon=g.epsilon,
                              backend=g.backend, stream=g.stream, activation=act,
                              y=y if act else None, residual=z)
    out = {"x": got[0], "gamma": got[1], "beta": got[2]}
    if z:
        out["residual"] = got[3]
    return out
