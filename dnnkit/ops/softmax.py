"""Softmax and log-softmax over channels or over whole instances, forward and backward.

``algo``: ``accurate`` subtracts the maximum before exponentiating (never overflows),
``fast`` does not (overflows for logits above ~88 in float32, as cuDNN's FAST), ``log`` gives
log-softmax (max-subtracted). ``mode``: ``channel`` normalises over axis 1 at each spatial
position; ``instance`` over all of C*spatial of each sample. Inputs are (N, C, *spatial) with 0
to 3 spatial dims: (N, C), (N, C, L), NCHW or NCDHW (cudnn.torch's SoftMax, SpatialSoftMax
and VolumetricSoftMax are the channel mode of 2-, 4- and 5-D inputs).

    softmax:      y = exp(x - m) / sum exp(x - m)        dx = y * (dy - sum(dy * y))
    log-softmax:  y = x - m - log(sum exp(x - m))        dx = dy - exp(y) * sum(dy)

cuDNN: cudnnSoftmaxForward/Backward on a 4-D (N, C, H, W) descriptor: (N, C, 1, 1) for 2-D,
(N, C, L, 1) for 3-D, and (N, C, D*H, W) for 5-D, the depth folded into the height (both modes
depend on the spatial positions only as a set: channel mode on C alone at each, instance mode on
all of C*spatial). The Numba kernels see every input as (N, C, S) the same way. Batches over
cuDNN's 32-bit tensor limit run as pieces of the batch (ops/split.py).
"""

from __future__ import annotations

from typing import NamedTuple

from .. import arrays, device
from ..autograd import gradient
from ..cudnn import softmax as cudnn_softmax
from ..dispatch import public_op
from ..hints import ArrayLike, Backend, OpOutput, Stream
from ..launch import launch, pow2_at_most
from ..registry import register
from ..tracing import note_algo
from . import split
from .args import choice

ALGOS = ("fast", "accurate", "log")
_ALGO_ID = {"fast": 0, "accurate": 1, "log": 2}   # matches kernels/softmax.py
MODES = ("channel", "instance")
NDIMS = (2, 3, 4, 5)        # (N, C, *spatial): 0 to 3 spatial dims
_TOL = {"float16": (5e-3, 1e-3), "float32": (1e-5, 1e-6), "float64": (1e-12, 1e-14)}


class SoftmaxArgs(NamedTuple):
    """softmax's checked arguments, as its implementations take them."""
    x: object
    algo: str
    mode: str
    stream: object


class SoftmaxBackwardArgs(NamedTuple):
    """softmax_backward's checked arguments, as its implementations take them."""
    y: object
    dy: object
    algo: str
    mode: str
    stream: object


def _check(op, algo, mode):
    choice(op, "algo", algo, ALGOS)      # before any lookup: a list is not hashable
    choice(op, "mode", mode, MODES)


@public_op("softmax")
def softmax(x: ArrayLike, algo: str = "accurate", mode: str = "channel", *,
            stream: Stream = None, backend: Backend | None = None) -> SoftmaxArgs:
    """Softmax, y = exp(x - m) / sum exp(x - m), over channels or instances; shaped like ``x``.

    x: (N, C, *spatial) with 0 to 3 spatial dims ((N, C), (N, C, L), (N, C, H, W),
    (N, C, D, H, W)), float16, float32 or float64. ``mode``: "channel" (default) sums over
    axis 1 at each spatial position; "instance" over all of C*spatial of each sample.
    ``algo``: "accurate" (default) subtracts the maximum m first (never overflows); "fast" does
    not (m = 0: overflows for inputs above ~88 in float32, as cuDNN's FAST); "log" gives the
    log-softmax y = x - m - log(sum exp(x - m)) (:func:`log_softmax`).
    Raises ValueError for an algo or mode not listed, or x not 2-D to 5-D."""
    _check("softmax", algo, mode)
    s = arrays.as_stream(stream)
    x = arrays.device_input("softmax", "x", x, s, ndim=NDIMS)
    return SoftmaxArgs(x, algo, mode, s)


def log_softmax(x: ArrayLike, mode: str = "channel", *, backend: Backend | None = None,
                stream: Stream = None) -> OpOutput:
    """Log-softmax, y = x - m - log(sum exp(x - m)) with m the maximum (never overflows):
    ``softmax(x, algo="log", mode=mode)``; a new array shaped like ``x``.

    x: (N, C, *spatial), 2-D to 5-D, float16, float32 or float64. ``mode``: "channel"
    (default, over axis 1 at each spatial position) or "instance" (over all of C*spatial of
    each sample). Its gradient: ``softmax_backward(y, dy, "log", mode)``. Raises ValueError for
    a mode not listed or x not 2-D to 5-D.

    {OP_FOOTER}"""
    return softmax(x, "log", mode, backend=backend, stream=stream)


log_softmax.op_name = "softmax"


@public_op("softmax_backward")
def softmax_backward(y: ArrayLike, dy: ArrayLike, algo: str = "accurate", mode: str = "channel",
                     *, stream: Stream = None,
                     backend: Backend | None = None) -> SoftmaxBackwardArgs:
    """Gradient wrt x of y = softmax(x, algo, mode), from y and dy; dx shaped like y.

    softmax ("accurate", "fast"): dx = y * (dy - sum(dy * y)); log-softmax ("log"): dx = dy -
    exp(y) * sum(dy), the sums over the forward's ``mode``: "channel" (axis 1 at each spatial
    position) or "instance" (all of C*spatial of each sample). y, dy: one shape, (N, C,
    *spatial) 2-D to 5-D, and one dtype (float16, float32 or float64).
    Raises ValueError for an algo or mode not listed, or y and dy of different shapes or not
    2-D to 5-D; TypeError for different dtypes."""
    op = "softmax_backward"
    _check(op, algo, mode)
    s = arrays.as_stream(stream)
    y = arrays.device_input(op, "y", y, s, ndim=NDIMS)
    dy = arrays.device_input(op, "dy", dy, s, ndim=NDIMS)
    arrays.same_shape(op, "y", y, dy=dy)
    return SoftmaxBackwardArgs(y, dy, algo, mode, s)


def _ncs(shape, mode):
    """(N, C, S): reduce over C at stride S (see kernels/softmax.py)."""
    n, c = shape[0], shape[1]
    spatial = 1
    for d in shape[2:]:
        spatial *= d
    return (n, c * spatial, 1) if mode == "instance" else (n, c, spatial)


_MAX_BLOCKS = 65535     # grid cap; blocks walk row tiles in a grid-stride loop beyond it


def _config(n, c, s, itemsize=4):
    """(bx, by, K, cached) for N*S rows of C elements at stride S (kernels/softmax.py): bx
    lanes on consecutive rows (consecutive addresses when S > 1; bx = 1 when S == 1, a block
    per row), by threads along each row, at most MAX_THREADS in all.

    The row stays in registers (cached) with the smallest K of CACHED_K for which some
    bx >= 8 (32-byte runs: a whole DRAM sector) gives C <= K*by; float64 only with K = 4 (its
    values take twice the registers, and the launch bounds are set for 4-byte data). Else the
    streaming variant (K = STREAM_K, two passes). by is a power of two and at least 32 // bx
    where C allows, so a block is at least a warp."""
    # (kernel modules are imported on first use here and below: they import numba, which
    # ``import dnnkit`` does not pay for)
    from ..kernels.softmax import CACHED_K, MAX_THREADS, STREAM_K
    bx0 = 1 if s == 1 else pow2_at_most(s, 32)
    for k in (CACHED_K if itemsize <= 4 else CACHED_K[:1]):
        bx = bx0
        while True:
            cap = MAX_THREADS // bx
            if c <= k * cap:
                by = max(pow2_at_most(-(-c // k), cap), pow2_at_most(c, max(1, 32 // bx)))
                return bx, by, k, True
            if bx <= 8:
                break
            bx //= 2
    return bx0, pow2_at_most(c, MAX_THREADS // bx0), STREAM_K, False


def _launch(direction, shape, mode, algo, stream, *arrays_):
    from ..kernels.softmax import ROW_BY, softmax_kernels
    n, c, s = _ncs(shape, mode)
    if n * c * s == 0:
        return
    acc = arrays.acc_array(arrays_[0].dtype)
    bx, by, k, cached = _config(n, c, s, arrays_[0].dtype.itemsize)
    if cached and c > k * by:
        raise AssertionError(f"softmax: a cached kernel needs C <= K*by; got {c}, {k}, {by}")
    # one block per contiguous row of ROW_BY threads: the variant with constant strides
    row_by = ROW_BY if cached and s == 1 and bx == 1 and by == ROW_BY else 0
    kernel = softmax_kernels(k, cached, row_by)[0 if direction == "fwd" else 1]
    blocks = min((n * s + bx - 1) // bx, _MAX_BLOCKS)
    flat = [arrays.flat(a) for a in arrays_]
    scratch = 2 * bx * by * acc.dtype.itemsize          # the two halves of _reduce's scratch
    launch(kernel, blocks, (bx, by), stream, (*flat, n, c, s, _ALGO_ID[algo], acc), scratch)


@register("softmax", "numba", tolerance=_TOL)
def _softmax_numba(x, algo, mode, stream):
    note_algo(algo)
    y = arrays.empty_like(x, stream)
    _launch("fwd", x.shape, mode, algo, stream, x, y)
    return y


@register("softmax_backward", "numba", tolerance=_TOL)
def _softmax_backward_numba(y, dy, algo, mode, stream):
    note_algo(algo)
    dx = arrays.empty_like(y, stream)
    _launch("bwd", y.shape, mode, algo, stream, y, dy, dx)
    return dx


def dims4(shape, mode):
    """cuDNN's (N, C, H, W) view and mode: 2-D and 3-D padded with 1s, 5-D (N, C, D, H, W) as
    (N, C, D*H, W) (a C-contiguous array's D and H fold into one stride; neither mode depends
    on how the spatial positions are arranged). With H = W = 1 the two modes are the same
    function, and cuDNN's channel-mode backward is then a pathologically slow kernel (60 ms
    against 0.24 ms for instance mode at 8192x4096 float32 on an H100, validation/bench.py;
    the forward 0.135 against 0.107 ms): such shapes always go to instance mode."""
    dims = tuple(shape)
    if len(dims) == 5:
        dims = (dims[0], dims[1], dims[2] * dims[3], dims[4])
    dims += (1,) * (4 - len(dims))
    return dims, ("instance" if dims[2] * dims[3] == 1 else mode)


def _row(shape):
    """Elements of one sample (C*H*W): the item cuDNN's calls are split between."""
    per = 1
    for d in shape[1:]:
        per *= d
    return per


def _sample_too_big(name, a):
    """Samples are never split (instance mode reduces over a whole one); batches over cuDNN's
    32-bit limit run as pieces of the batch (ops/split.py)."""
    return split.too_big(_row(a.shape), lambda: f"one sample of {name} {tuple(a.shape)}")


def _cudnn_supports(x, algo, mode, stream):
    return _sample_too_big("x", x)


def _cudnn_backward_supports(y, dy, algo, mode, stream):
    return _sample_too_big("x", y)


@register("softmax", "cudnn", supports=_cudnn_supports)
def _softmax_cudnn(x, algo, mode, stream):
    note_algo(algo)
    y = arrays.empty_like(x, stream)
    if x.size:
        for xp, yp in split.batch(_row(x.shape), x, y):
            cudnn_softmax.forward(xp, yp, *dims4(xp.shape, mode), algo=algo,
                                  stream=device.stream_pointer(stream))
    return y


@register("softmax_backward", "cudnn", supports=_cudnn_backward_supports)
def _softmax_backward_cudnn(y, dy, algo, mode, stream):
    note_algo(algo)
    dx = arrays.empty_like(y, stream)
    if y.size:
        for yp, dyp, dxp in split.batch(_row(y.shape), y, dy, dx):
            cudnn_softmax.backward(yp, dyp, dxp, *dims4(yp.shape, mode), algo=algo,
                                   stream=device.stream_pointer(stream))
    return dx


# ---------------------------------------------------------------- autograd

@gradient("softmax")
def _softmax_grad(g, dy):
    if not g.needs("x"):
        return {}
    return {"x": softmax_backward(g.out, dy, g.algo, g.mode, backend=g.backend, stream=g.stream)}
