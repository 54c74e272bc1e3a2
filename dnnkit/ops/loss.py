"""Losses: cross-entropy, negative log-likelihood and mean squared error, with their gradients.

    cross_entropy(logits, target)   logp = log_softmax(logits) over axis 1, then nll_loss
    nll_loss(logp, target)          loss[n, s] = -logp[n, target[n, s], s]
    mse_loss(x, target)             loss[i] = (x[i] - target[i])^2

Logits and logp are (N, C) or (N, C, d1, d2, ...) (the spatial form is cudnn.torch's
SpatialCrossEntropyCriterion); targets are integer class indices (int32 or int64) of shape
(N,) or (N, d1, ...); positions whose target equals ``ignore_index`` do not count.
``reduction``: ``"mean"`` (the sum over the counted positions divided by their number, or by
the number of elements for mse; NaN when nothing counts: 0/0, as PyTorch), ``"sum"``, or
``"none"`` (the per-position losses, shaped like the target; 0 at ignored positions). "mean"
and "sum" give a 0-d device array in the input's dtype: nothing is read back to the host, so
a training step queues its loss without waiting for it (read it with ``float(y.copy_to_host())``
or ``Tensor.item()`` when it is wanted).

Gradients (``*_backward``; ``dy`` is a device array, 0-d for mean and sum, read on the device):
    cross_entropy:  dlogits = g * (softmax(logits) - onehot(target))
    nll_loss:       dlogp   = -g * onehot(target)
    mse_loss:       dx      = 2 g (x - target)       (and dtarget = -dx)
with g = dy / count (mean), dy (sum) or dy[n, s] (none), 0 at ignored positions.

Invalid targets: a target outside [0, C) that is not ``ignore_index`` cannot raise on the
device without a read back to the host; its loss, hence the mean or sum, is NaN, and so is its
row of the gradient. A target given as a host (NumPy) array is copied anyway and is checked on
the host first: ValueError naming the first bad value.

Backends. The sums are dnnkit's Numba kernels (kernels/loss.py, launched by ops/loss_numba.py:
a deterministic two-kernel reduction and a one-thread finish that divides on the device; cuDNN
has no loss reductions, so nll_loss and mse_loss run on Numba under every policy).
cross_entropy's log-softmax is dnnkit's ``log_softmax`` on the backend the call runs on
(cudnnSoftmaxForward on cuDNN); its backward computes the log-softmax again (one pass over the
logits instead of keeping logp alive from forward to backward) and fuses softmax - onehot and
the scale in one kernel.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .. import arrays, device
from ..autograd import gradient
from ..dispatch import public_op
from ..hints import ArrayLike, Backend, Stream
from ..registry import register
from . import loss_numba, split
from .softmax import softmax

REDUCTIONS = ("mean", "sum", "none")
_TOL = {"float16": (5e-3, 1e-3), "float32": (1e-5, 1e-6), "float64": (1e-12, 1e-14)}
_NO_REDUCTIONS = "cuDNN has no loss reductions"


class LossArgs(NamedTuple):
    """cross_entropy's and nll_loss's checked arguments (``x``: the logits or logp)."""
    x: object
    target: object
    reduction: str
    ignore_index: int
    stream: object


class LossBackwardArgs(NamedTuple):
    """cross_entropy_backward's and nll_loss_backward's checked arguments."""
    x: object
    target: object
    dy: object
    reduction: str
    ignore_index: int
    stream: object


class MseArgs(NamedTuple):
    """mse_loss's checked arguments."""
    x: object
    target: object
    reduction: str
    stream: object


class MseBackwardArgs(NamedTuple):
    """mse_loss_backward's checked arguments."""
    x: object
    target: object
    dy: object
    reduction: str
    stream: object


def _reduction(op, reduction):
    if reduction not in REDUCTIONS:
        raise ValueError(f"{op}: reduction must be one of {', '.join(REDUCTIONS)}; "
                         f"got {reduction!r}")
    return reduction


def _ignore(op, ignore_index):
    if isinstance(ignore_index, (bool, np.bool_)) or not isinstance(ignore_index,
                                                                    (int, np.integer)):
        raise TypeError(f"{op}: ignore_index must be an integer; got {ignore_index!r}")
    return int(ignore_index)


def _target(op, target, x, ignore, s):
    """The class-index target as a device int32/int64 array of shape (N, d1, ...); a host
    target is checked on the host (every value in [0, C) or ignore_index) and copied."""
    cuda = device.numba_cuda()
    want = (x.shape[0],) + tuple(x.shape)[2:]
    if arrays.is_device_array(target) or hasattr(target, "__cuda_array_interface__"):
        t = target if arrays.is_device_array(target) else cuda.as_cuda_array(target)
        if t.dtype not in (np.int32, np.int64):
            raise TypeError(f"{op}: target must hold int32 or int64 class indices; got dtype "
                            f"{t.dtype}")
        if not t.is_c_contiguous():
            raise ValueError(f"{op}: target must be C-contiguous; got strides "
                             f"{tuple(t.strides)}")
        host = None
    else:
        try:
            host = np.asarray(target)
        except Exception as e:
            raise TypeError(f"{op}: target must be an array; got {type(target).__name__}") \
                from e
        if host.dtype.kind not in "iu":
            raise TypeError(f"{op}: target must hold integer class indices; got dtype "
                            f"{host.dtype}")
        t = host
    if tuple(t.shape) != want:
        raise ValueError(f"{op}: target shape {tuple(t.shape)} does not match the input's "
                         f"{tuple(x.shape)} (expected {want})")
    if host is None:
        return t
    c = x.shape[1]
    bad = ((host < 0) | (host >= c)) & (host != ignore)
    if bad.any():
        pos = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"{op}: target values must be in [0, {c}) or ignore_index={ignore}; "
                         f"got {int(host[pos])} at {pos} ({int(bad.sum())} invalid)")
    return cuda.to_device(arrays.host_contiguous(host.astype(np.int64, copy=False)), stream=s)


def _scores(op, name, x, s):
    x = arrays.device_input(op, name, x, s)
    if x.ndim < 2:
        raise ValueError(f"{op}: {name} must be (N, C) or (N, C, d1, ...); got shape "
                         f"{tuple(x.shape)}")
    return x


def _dy(op, dy, reduction, want, ref, s):
    """The upstream gradient: one element (0-d) for mean and sum, ``want``'s shape for none."""
    dy = arrays.device_input(op, "dy", dy, s)
    if reduction == "none" and tuple(dy.shape) != tuple(want):
        raise ValueError(f"{op}: dy has shape {tuple(dy.shape)}; reduction='none' gives "
                         f"{tuple(want)}")
    if reduction != "none" and dy.size != 1:
        raise ValueError(f"{op}: dy must hold one element (the gradient of the "
                         f"{reduction}); got shape {tuple(dy.shape)}")
    if dy.dtype != ref.dtype:
        raise TypeError(f"{op}: dy has dtype {dy.dtype} but the input has {ref.dtype}")
    return dy


def _nll_like(op, name, x, target, reduction, ignore_index, stream):
    reduction, ignore = _reduction(op, reduction), _ignore(op, ignore_index)
    s = arrays.as_stream(stream)
    x = _scores(op, name, x, s)
    return LossArgs(x, _target(op, target, x, ignore, s), reduction, ignore, s)


def _nll_like_backward(op, name, x, target, dy, reduction, ignore_index, stream):
    reduction, ignore = _reduction(op, reduction), _ignore(op, ignore_index)
    s = arrays.as_stream(stream)
    x = _scores(op, name, x, s)
    t = _target(op, target, x, ignore, s)
    return LossBackwardArgs(x, t, _dy(op, dy, reduction, t.shape, x, s), reduction, ignore, s)


@public_op("cross_entropy")
def cross_entropy(logits: ArrayLike, target: ArrayLike, reduction: str = "mean",
                  ignore_index: int = -100, *, stream: Stream = None,
                  backend: Backend | None = None) -> LossArgs:
    """Cross-entropy of ``logits`` (N, C) or (N, C, d1, ...) at class indices ``target`` (N,) or
    (N, d1, ...): logp = log_softmax(logits) over axis 1 (on the call's backend), then
    :func:`nll_loss`.
    {LOSS_TARGET}
    {LOSS_REDUCTION}"""
    return _nll_like("cross_entropy", "logits", logits, target, reduction, ignore_index, stream)


@public_op("cross_entropy_backward")
def cross_entropy_backward(logits: ArrayLike, target: ArrayLike, dy: ArrayLike,
                           reduction: str = "mean", ignore_index: int = -100, *,
                           stream: Stream = None,
                           backend: Backend | None = None) -> LossBackwardArgs:
    """Gradient wrt the logits of :func:`cross_entropy`: g * (softmax(logits) - onehot(target)).
    {LOSS_GRAD}
    {LOSS_TARGET}
    {LOSS_REDUCTION}"""
    return _nll_like_backward("cross_entropy_backward", "logits", logits, target, dy, reduction,
                              ignore_index, stream)


@public_op("nll_loss")
def nll_loss(logp: ArrayLike, target: ArrayLike, reduction: str = "mean",
             ignore_index: int = -100, *, stream: Stream = None,
             backend: Backend | None = None) -> LossArgs:
    """Negative log-likelihood of log-probabilities ``logp`` (N, C) or (N, C, d1, ...) at class
    indices ``target`` (N,) or (N, d1, ...): loss = -logp[n, target[n, ...]]. Numba only.
    {LOSS_TARGET}
    {LOSS_REDUCTION}"""
    return _nll_like("nll_loss", "logp", logp, target, reduction, ignore_index, stream)


@public_op("nll_loss_backward")
def nll_loss_backward(logp: ArrayLike, target: ArrayLike, dy: ArrayLike, reduction: str = "mean",
                      ignore_index: int = -100, *, stream: Stream = None,
                      backend: Backend | None = None) -> LossBackwardArgs:
    """Gradient wrt logp of :func:`nll_loss`: dlogp = -g * onehot(target). Numba only.
    {LOSS_GRAD}
    {LOSS_TARGET}
    {LOSS_REDUCTION}"""
    return _nll_like_backward("nll_loss_backward", "logp", logp, target, dy, reduction,
                              ignore_index, stream)


def _mse_inputs(op, x, target, s):
    x = arrays.device_input(op, "x", x, s)
    if not (arrays.is_device_array(target) or hasattr(target, "__cuda_array_interface__")):
        h = np.asarray(target)
        if h.dtype.kind not in "iuf":
            raise TypeError(f"{op}: target must be a real array; got dtype {h.dtype}")
        if h.dtype.kind == "f" and h.dtype != x.dtype and h.shape == tuple(x.shape):
            # the rule is one for host and device targets: mixed float dtypes raise (after
            # the shape check, as on the device)
            raise TypeError(f"{op}: target dtype {h.dtype} does not match x dtype {x.dtype}")
        target = h.astype(x.dtype)      # integer host targets take x's dtype (one copy anyway)
    t = arrays.device_input(op, "target", target, s)
    if tuple(t.shape) != tuple(x.shape):
        raise ValueError(f"{op}: target shape {tuple(t.shape)} does not match x shape "
                         f"{tuple(x.shape)}")
    if t.dtype != x.dtype:
        raise TypeError(f"{op}: target dtype {t.dtype} does not match x dtype {x.dtype}")
    return x, t


@public_op("mse_loss")
def mse_loss(x: ArrayLike, target: ArrayLike, reduction: str = "mean", *,
             stream: Stream = None, backend: Backend | None = None) -> MseArgs:
    """Squared error loss[i] = (x[i] - target[i])^2; x and target of one shape and dtype. Its
    "mean" (default: the sum / x.size; NaN for an empty x) or "sum" (a 0-d device array, never
    read back to the host), or per element ("none"): ``reduction``. Numba only.
    Raises ValueError for a reduction not listed or shapes that differ; TypeError for mixed
    dtypes or a non-float target."""
    op = "mse_loss"
    reduction = _reduction(op, reduction)
    s = arrays.as_stream(stream)
    return MseArgs(*_mse_inputs(op, x, target, s), reduction, s)


@public_op("mse_loss_backward")
def mse_loss_backward(x: ArrayLike, target: ArrayLike, dy: ArrayLike, reduction: str = "mean",
                      *, stream: Stream = None,
                      backend: Backend | None = None) -> MseBackwardArgs:
    """Gradient wrt x of :func:`mse_loss`: dx = 2 g (x - target), g = dy / x.size ("mean"), dy
    ("sum") or dy per element ("none", the default being "mean"); wrt the target: the same call
    with x and target swapped. ``dy``: 0-d for "mean" and "sum", else shaped like x. Numba only.
    Raises ValueError for a reduction not listed or shapes that do not match; TypeError for
    mixed dtypes."""
    op = "mse_loss_backward"
    reduction = _reduction(op, reduction)
    s = arrays.as_stream(stream)
    x, t = _mse_inputs(op, x, target, s)
    return MseBackwardArgs(x, t, _dy(op, dy, reduction, x.shape, x, s), reduction, s)


# ---------------------------------------------------------------- implementations
# (the kernel launches: ops/loss_numba.py)

def _log_softmax(x, backend, stream):
    """log_softmax over axis 1 on ``backend`` (the op takes 2-D or 4-D: spatial dims as
    (N, C, S, 1), the same memory). An empty x has nothing to normalise."""
    if not x.size:
        return x
    n, c, sp = loss_numba.ncs(x)
    view = x if x.ndim in (2, 4) else arrays.reshaped(x, (n, c, sp, 1))
    return softmax(view, "log", "channel", backend=backend, stream=stream)


def _cross_entropy(backend):
    def forward(x, target, reduction, ignore_index, stream):
        logp = _log_softmax(x, backend, stream)
        return loss_numba.nll_forward(logp, target, reduction, ignore_index, stream)

    def backward(x, target, dy, reduction, ignore_index, stream):
        logp = _log_softmax(x, backend, stream)
        dx = loss_numba.nll_backward(logp, target, dy, reduction, ignore_index, 1, stream)
        return arrays.reshaped(dx, tuple(x.shape))
    return forward, backward


def _cudnn_supports(x, target, reduction, ignore_index, stream):
    """The log-softmax's: batches over cuDNN's 32-bit limit run as pieces (ops/split.py), a
    sample over it cannot run."""
    n = x.shape[0]
    return split.too_big(x.size // n if n else 0,
                         lambda: f"one sample of the logits {tuple(x.shape)}")


def _cudnn_backward_supports(x, target, dy, reduction, ignore_index, stream):
    return _cudnn_supports(x, target, reduction, ignore_index, stream)


for _backend, (_fwd, _bwd) in (("numba", _cross_entropy("numba")),
                               ("cudnn", _cross_entropy("cudnn"))):
    _sup = {} if _backend == "numba" else {"supports": _cudnn_supports}
    _bsup = {} if _backend == "numba" else {"supports": _cudnn_backward_supports}
    register("cross_entropy", _backend, tolerance=_TOL, **_sup)(_fwd)
    register("cross_entropy_backward", _backend, tolerance=_TOL, **_bsup)(_bwd)


@register("nll_loss", "numba", tolerance=_TOL, numba_only=_NO_REDUCTIONS)
def _nll_loss_numba(x, target, reduction, ignore_index, stream):
    return loss_numba.nll_forward(x, target, reduction, ignore_index, stream)


@register("nll_loss_backward", "numba", tolerance=_TOL, numba_only=_NO_REDUCTIONS)
def _nll_loss_backward_numba(x, target, dy, reduction, ignore_index, stream):
    return loss_numba.nll_backward(x, target, dy, reduction, ignore_index, 0, stream)


@register("mse_loss", "numba", tolerance=_TOL, numba_only=_NO_REDUCTIONS)
def _mse_loss_numba(x, target, reduction, stream):
    return loss_numba.mse_forward(x, target, reduction, stream)


@register("mse_loss_backward", "numba", tolerance=_TOL, numba_only=_NO_REDUCTIONS)
def _mse_loss_backward_numba(x, target, dy, reduction, stream):
    return loss_numba.mse_backward(x, target, dy, reduction, stream)


# ---------------------------------------------------------------- gradients
# The upstream gradient of a mean or sum is a 0-d device array: the backward kernels read it
# on the device.

@gradient("cross_entropy")
def _cross_entropy_grad(g, dy):
    if not g.needs("logits"):
        return {}
    return {"logits": cross_entropy_backward(g.logits, g.target, dy, g.reduction,
                                             g.ignore_index, backend=g.backend,
                                             stream=g.stream)}


@gradient("nll_loss")
def _nll_loss_grad(g, dy):
    if not g.needs("logp"):
        return {}
    return {"logp": nll_loss_backward(g.logp, g.target, dy, g.reduction, g.ignore_index,
                                      backend=g.backend, stream=g.stream)}


@gradient("mse_loss")
def _mse_loss_grad(g, dy):
    out = {}
    kw = dict(backend=g.backend, stream=g.stream)
    if g.needs("x"):
        out["x"] = mse_loss_backward(g.x, g.target, dy, g.reduction, **kw)
    if g.needs("target"):
        out["target"] = mse_loss_backward(g.target, g.x, dy, g.reduction, **kw)
    return out


# ---------------------------------------------------------------- python -m dnnkit check

def _ref_log_softmax(x):
    m = x.max(axis=1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=1, keepdims=True))


def _ref_nll(lp, t, with_grad=False):
    """The mean nll of float64 logp at integer targets t (no ignored positions), or its
    gradient wrt logp for an upstream gradient of 1."""
    t = t.astype(np.int64)
    if with_grad:
        onehot = np.zeros_like(lp)
        np.put_along_axis(onehot, t[:, None], 1.0, 1)
        return -onehot / t.size
    return -np.take_along_axis(lp, t[:, None], 1).mean()


def _loss_inputs(shapes, kind, with_dy):
    def make(rng, dtype, big):
        shape = shapes[big]
        x = rng.standard_normal(shape).astype(dtype)
        if kind == "nll":
            x = _ref_log_softmax(x.astype(np.float64)).astype(dtype)
        if kind == "mse":
            t = rng.standard_normal(shape).astype(dtype)
        else:
            t = rng.integers(0, shape[1], (shape[0],) + shape[2:]).astype(np.int64)
        return (x, t, np.ones(1, dtype)) if with_dy else (x, t)
    return make


def selfcheck_cases(Case):
    shapes = {False: (4, 5, 3), True: (256, 1000, 4)}
    flat = {False: (3, 4, 5), True: (64, 1024, 32)}
    return [
        Case("cross_entropy", "mean",
             lambda b, s, i: cross_entropy(i[0], i[1], backend=b, stream=s),
             lambda i: _ref_nll(_ref_log_softmax(i[0]), i[1]),
             _loss_inputs(shapes, "ce", False)),
        Case("cross_entropy_backward", "mean",
             lambda b, s, i: cross_entropy_backward(i[0], i[1], i[2], backend=b, stream=s),
             lambda i: np.exp(_ref_log_softmax(i[0])) / i[1].size
             + _ref_nll(i[0], i[1], with_grad=True),
             _loss_inputs(shapes, "ce", True)),
        Case("nll_loss", "mean",
             lambda b, s, i: nll_loss(i[0], i[1], backend=b, stream=s),
             lambda i: _ref_nll(i[0], i[1]), _loss_inputs(shapes, "nll", False)),
        Case("nll_loss_backward", "mean",
             lambda b, s, i: nll_loss_backward(i[0], i[1], i[2], backend=b, stream=s),
             lambda i: _ref_nll(i[0], i[1], with_grad=True), _loss_inputs(shapes, "nll", True)),
        Case("mse_loss", "mean",
             lambda b, s, i: mse_loss(i[0], i[1], backend=b, stream=s),
             lambda i: np.mean((i[0] - i[1]) ** 2), _loss_inputs(flat, "mse", False)),
        Case("mse_loss_backward", "mean",
             lambda b, s, i: mse_loss_backward(i[0], i[1], i[2], backend=b, stream=s),
             lambda i: 2 * (i[0] - i[1]) / i[0].size, _loss_inputs(flat, "mse", True)),
    ]
