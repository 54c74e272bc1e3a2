"""Batch normalization: training forward, inference forward and backward.

    training:   mean, var = batch mean and biased variance of x per statistic (m values each)
                y = (x - mean) / sqrt(var + eps) * gamma + beta
                running_mean = (1 - momentum) * running_mean + momentum * mean
                running_var  = (1 - momentum) * running_var  + momentum * var * m / (m - 1)
    inference:  y = (x - mean) / sqrt(var + eps) * gamma + beta     (given mean, var)
    backward:   xhat = (x - mean) * invstd;  dbeta = sum dy;  dgamma = sum dy * xhat
                dx = gamma * invstd / m * (m * dy - dbeta - xhat * dgamma)

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

from .. import arrays, device, reference
from ..cudnn import batchnorm as cudnn_bn
from ..autograd import gradient
from ..tensors import unwrap
from ..dispatch import public_op
from ..hints import ArrayLike, Backend, OpOutput, Stream
from ..registry import register
from . import inplace
from .args import choice
from .batchnorm_numba import flat_copy, ncs

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
                stream: Stream = None, backend: Backend | None = None) -> BatchNormTrainArgs:
    op = "batch_norm_train"
    eps = _check(op, mode, epsilon)
    mom = _check_momentum(op, momentum)
    s = arrays.as_stream(stream)
    x = _x(op, x, s)
    g, b = _param(op, "gamma", gamma, x, mode, s), _param(op, "beta", beta, x, mode, s)
    rm, rv = _running(op, running_mean, running_var, x, mode, s)
    n, _, sp = ncs(x.shape, mode)
    if n * sp < 2:
        raise ValueError(f"{op}: needs more than one value per statistic to estimate a variance;"
                         f" x {tuple(x.shape)} in {mode} mode gives {n * sp}")
    return BatchNormTrainArgs(x, g, b, mode, eps, mom, rm, rv, s)


_train = public_op("batch_norm_train")(_train_args)


def batch_norm_train(x: ArrayLike, gamma: ArrayLike, beta: ArrayLike, *, mode: str = "spatial",
                     epsilon: float = 1e-5, momentum: float = 0.1,
                     running_mean: ArrayLike | None = None,
                     running_var: ArrayLike | None = None, backend: Backend | None = None,
                     stream: Stream = None) -> tuple[OpOutput, OpOutput, OpOutput]:
    """Normalize x (N, C, *spatial; 2-D to 5-D) with its batch statistics:
    ``y = (x - mean) / sqrt(var + epsilon) * gamma + beta``; returns ``(y, saved_mean,
    saved_invstd)``, the batch mean and 1/sqrt(var + epsilon) (var biased), shaped like gamma:
    pass them to :func:`batch_norm_backward`.

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
                                     running_var=running_var, backend=backend, stream=stream)
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
                         backend: Backend | None = None) -> BatchNormInferenceArgs:
    """Normalize x with given statistics (e.g. the running ones): returns
    ``y = (x - mean) / sqrt(var + epsilon) * gamma + beta``, shaped like x (N, C, *spatial;
    2-D to 5-D).

    ``gamma``, ``beta``, ``mean``, ``var``: the parameters and statistics, shaped by ``mode``.
    {BN_OPTIONS}
    ``out``: a device array shaped like x to write y into (x itself: in place; ops/inplace.py).
    Raises ValueError for a mode not listed, a bad epsilon, parameters of the wrong shape or an
    out overlapping x in part; TypeError for parameters or an out of the wrong dtype."""
    op = "batch_norm_inference"
    eps = _check(op, mode, epsilon)
    s = arrays.as_stream(stream)
    x = _x(op, x, s)
    p = [_param(op, name, a, x, mode, s) for name, a in
         (("gamma", gamma), ("beta", beta), ("mean", mean), ("var", var))]
    out = inplace.output(op, out, x, s, x=x, gamma=p[0], beta=p[1], mean=p[2], var=p[3])
    return BatchNormInferenceArgs(x, *p, mode, eps, s, out)


@public_op("batch_norm_backward")
def batch_norm_backward(x: ArrayLike, dy: ArrayLike, gamma: ArrayLike, saved_mean: ArrayLike,
                        saved_invstd: ArrayLike, *, mode: str = "spatial",
                        epsilon: float = 1e-5, stream: Stream = None,
                        backend: Backend | None = None) -> BatchNormBackwardArgs:
    """Gradients of :func:`batch_norm_train` (the batch statistics as functions of x): returns
    ``(dx, dgamma, dbeta)``, with xhat = (x - saved_mean) * saved_invstd over m values each:

        dbeta = sum dy;  dgamma = sum dy * xhat;
        dx = gamma * saved_invstd / m * (m * dy - dbeta - xhat * dgamma)

    x, dy: one shape (N, C, *spatial); ``saved_mean``, ``saved_invstd``: the training forward's.
    {BN_OPTIONS}
    ``epsilon`` must be the forward's (cuDNN checks it).
    Raises ValueError for a mode not listed, a bad epsilon, arrays of the wrong shape or an empty
    batch; TypeError for arrays of the wrong dtype."""
    op = "batch_norm_backward"
    eps = _check(op, mode, epsilon)
    s = arrays.as_stream(stream)
    x = _x(op, x, s)
    dy = arrays.device_input(op, "dy", dy, s)
    arrays.same_shape(op, "x", x, dy=dy)
    p = [_param(op, name, a, x, mode, s) for name, a in
         (("gamma", gamma), ("saved_mean", saved_mean), ("saved_invstd", saved_invstd))]
    if x.shape[0] == 0:
        raise ValueError(f"{op}: x {tuple(x.shape)} is an empty batch (no statistics to "
                         "differentiate)")
    return BatchNormBackwardArgs(x, dy, *p, mode, eps, s)


# ---------------------------------------------------------------- cuDNN

def _cudnn_reason(x, eps):
    if eps < CUDNN_MIN_EPSILON:
        return (f"epsilon {eps:g} is below cuDNN's minimum CUDNN_BN_MIN_EPSILON "
                f"({CUDNN_MIN_EPSILON:g})")
    if x.size >= 2**31:
        return f"{x.size} elements exceed cuDNN's 32-bit tensor size"
    return None


def _supports_train(x, gamma, beta, mode, epsilon, momentum, running_mean, running_var,
                    stream):
    return _cudnn_reason(x, epsilon)


def _supports_inference(x, gamma, beta, mean, var, mode, epsilon, stream, out=None):
    return _cudnn_reason(x, epsilon)


def _supports_backward(x, dy, gamma, saved_mean, saved_invstd, mode, epsilon, stream):
    return _cudnn_reason(x, epsilon)


@register("batch_norm_train", "cudnn", supports=_supports_train,
          updates=("running_mean", "running_var"))
def _train_cudnn(x, gamma, beta, mode, epsilon, momentum, running_mean, running_var, stream):
    y = arrays.empty_like(x, stream)
    mean, invstd = (arrays.cuda_empty(gamma.shape, gamma.dtype, stream) for _ in range(2))
    rm, rv = running_mean, running_var        # updated in place (registered as updates)
    if x.size:   # empty (C = 0; argument checks refuse an empty batch): nothing to compute
        cudnn_bn.forward_training(x, y, gamma, beta, mean, invstd, rm, rv, mode, epsilon,
                                  momentum, device.stream_pointer(stream))
    return y, mean, invstd, rm, rv


@register("batch_norm_inference", "cudnn", supports=_supports_inference)
def _inference_cudnn(x, gamma, beta, mean, var, mode, epsilon, stream, out=None):
    def write(y):   # (cuDNN rejects empty tensors; in place is not documented: through_copy)
        if x.size:
            cudnn_bn.forward_inference(x, y, gamma, beta, mean, var, mode, epsilon,
                                       device.stream_pointer(stream))
    return inplace.through_copy(out, x, stream, write)


@register("batch_norm_backward", "cudnn", supports=_supports_backward)
def _backward_cudnn(x, dy, gamma, saved_mean, saved_invstd, mode, epsilon, stream):
    dx = arrays.empty_like(x, stream)
    dgamma, dbeta = (arrays.cuda_empty(gamma.shape, gamma.dtype, stream) for _ in range(2))
    if x.size:
        cudnn_bn.backward(x, dy, dx, gamma, dgamma, dbeta, saved_mean, saved_invstd, mode,
                          epsilon, device.stream_pointer(stream))
    else:        # (C = 0 or no values per statistic) the parameter gradients sum nothing
        arrays.zero_fill(dgamma, stream)
        arrays.zero_fill(dbeta, stream)
    return dx, dgamma, dbeta


# ---------------------------------------------------------------- python -m dnnkit check

class _Joined:
    """Several device outputs checked as one: ``copy_to_host()`` concatenates them (float64,
    flat), in the order of the float64 reference's outputs."""

    def __init__(self, *outs):
        self.outs = [o for o in outs if o is not None]

    def copy_to_host(self):
        return np.concatenate([np.asarray(arrays.to_host(o), np.float64).ravel()
                               for o in self.outs])


def _inputs(mode, small, big, kind):
    """(rng, dtype, big) -> host inputs: x, gamma, beta, then running mean/var (train), mean/var
    (inference), or dy, saved mean, saved invstd (backward). Parameters in the parameter
    dtype (float32 for float16 data)."""
    def make(rng, dtype, b):
        shape = big if b else small
        pdt = arrays.acc_dtype(dtype)
        pshape = param_shapes(shape, mode)[0]
        x = (rng.standard_normal(shape) * 3 + 1).astype(dtype)
        gamma = (1 + 0.5 * rng.standard_normal(pshape)).astype(pdt)
        beta = rng.standard_normal(pshape).astype(pdt)
        if kind == "train":
            return x, gamma, beta, rng.standard_normal(pshape).astype(pdt), \
                (1 + rng.random(pshape)).astype(pdt)
        if kind == "inference":
            return x, gamma, beta, rng.standard_normal(pshape).astype(pdt), \
                (0.5 + rng.random(pshape)).astype(pdt)
        _, mean, invstd, _, _ = reference.batch_norm_train(x, gamma, beta, mode)
        dy = rng.standard_normal(shape).astype(dtype)
        return x, gamma, beta, dy, mean.astype(pdt), invstd.astype(pdt)
    return make


def _run_train(mode):
    def run(backend, stream, i):
        s = arrays.as_stream(stream)      # (fresh copies: every call updates them)
        rm, rv = (flat_copy(a, s).reshape(*a.shape) for a in (i[3], i[4]))
        y, mean, invstd = batch_norm_train(i[0], i[1], i[2], mode=mode, running_mean=rm,
                                           running_var=rv, backend=backend, stream=s)
        return _Joined(y, mean, invstd, rm, rv)
    return run


def selfcheck_cases(Case):
    # N = 4: with N = 2 the per-activation dx is identically 0 (only rounding to compare)
    small, big = (4, 3, 2, 5), (32, 64, 28, 28)
    out = []
    for mode in MODES:
        out.append(Case("batch_norm_train", mode, _run_train(mode),
                        lambda i, m=mode: np.concatenate(
                            [a.ravel() for a in reference.batch_norm_train(
                                i[0], i[1], i[2], m, 1e-5, 0.1, i[3], i[4])]),
                        _inputs(mode, small, big, "train")))
        out.append(Case("batch_norm_inference", mode,
                        lambda b, s, i, m=mode: batch_norm_inference(
                            *i, mode=m, backend=b, stream=s),
                        lambda i, m=mode: reference.batch_norm_inference(*i, mode=m),
                        _inputs(mode, small, big, "inference")))
        out.append(Case("batch_norm_backward", mode,
                        lambda b, s, i, m=mode: _Joined(*batch_norm_backward(
                            i[0], i[3], i[1], i[4], i[5], mode=m, backend=b, stream=s)),
                        lambda i, m=mode: np.concatenate(
                            [a.ravel() for a in reference.batch_norm_backward(
                                i[0], i[3], i[1], i[4], i[5], m)]),
                        _inputs(mode, small, big, "backward")))
    return out


# ---------------------------------------------------------------- autograd

@gradient("batch_norm_train", outputs=(0,), inputs=("x", "gamma", "beta"), reads_out=(1, 2))
def _batch_norm_grad(g, dy):
    _, mean, invstd = g.out[:3]
    dx, dgamma, dbeta = batch_norm_backward(g.x, dy, g.gamma, mean, invstd, mode=g.mode,
                                            epsilon=g.epsilon, backend=g.backend,
                                            stream=g.stream)
    return {"x": dx, "gamma": dgamma, "beta": dbeta}


@gradient("batch_norm_inference", inputs=("x", "gamma", "beta"))
def _batch_norm_inference_grad(g, dy):
    """y = (x - mean) r gamma + beta with r = 1/sqrt(var + epsilon) fixed (the statistics get
    no gradient): dx = dy r gamma, dgamma = sum(dy (x - mean) r), dbeta = sum(dy), the sums
    over the batch (and the spatial positions in spatial mode). Composed of glue ops on the
    call's backend; the statistics' dtype must be x's (float32 statistics of float16 data
    would need mixed-dtype arithmetic)."""
    from . import arith, reduce, shape as shape_ops
    x = g.out if g.wrote_into("x") else g.x     # (out=x: x's value only for dgamma, below)
    if np.dtype(x.dtype) != np.dtype(g.gamma.dtype):
        raise RuntimeError(
            f"batch_norm_inference: the gradient of {x.dtype} data with {g.gamma.dtype} "
            f"statistics is not supported; run it under dnnkit.no_grad() or use "
            f"batch_norm_train")
    kw = dict(backend=g.backend, stream=g.stream)
    if g.mode == "spatial":
        bshape = (1, x.shape[1]) + (1,) * (x.ndim - 2)
        axes = (0,) + tuple(range(2, x.ndim))
    else:
        bshape, axes = (1,) + tuple(x.shape[1:]), (0,)
    c = int(np.prod(bshape))
    flat = (c,)
    pdt = g.gamma.dtype
    one = arrays.constant(np.ones((1, c)), pdt)
    ones, zeros = arrays.constant(np.ones(c), pdt), arrays.constant(np.zeros(c), pdt)
    var = shape_ops.reshape(g.var, flat, **kw)
    r = shape_ops.reshape(batch_norm_inference(one, ones, zeros, zeros, var,
                                               epsilon=g.epsilon, **kw), bshape, **kw)
    out = {}
    if g.needs("x"):
        out["x"] = arith.multiply(dy, arith.multiply(
            r, shape_ops.reshape(g.gamma, bshape, **kw), **kw), **kw)
    if g.needs("gamma"):
        xhat = arith.multiply(arith.subtract(g.x, shape_ops.reshape(g.mean, bshape, **kw),
                                             **kw), r, **kw)
        out["gamma"] = shape_ops.reshape(reduce.sum(arith.multiply(dy, xhat, **kw), axes,
                                                    **kw), g.gamma.shape, **kw)
    if g.needs("beta"):
        out["beta"] = shape_ops.reshape(reduce.sum(dy, axes, **kw), g.beta.shape, **kw)
    return out

