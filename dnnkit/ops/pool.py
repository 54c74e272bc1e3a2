"""Pooling, 2-D (NCHW) and 3-D (NCDHW), forward and backward.

Modes: ``max``, ``max_deterministic``, ``average_inc_pad`` (alias ``average``: the divisor is
the full window, padding included), ``average_exc_pad`` (the divisor is the number of inputs
in the window), ``sum``. Output size per spatial dim: ``(I + 2p - k) // s + 1`` (``stride``
defaults to the window); ``ceil_mode=True`` rounds up instead, PyTorch's and Caffe's rule
(ops/pool_args.py): the last window may then reach past the padded input, and that overhang
enters no maximum, sum or divisor. Padding never enters a maximum or a sum; it must be smaller
than the window (cuDNN's rule), so every window holds at least one input. NaN in a window
propagates.

Backward: max routes dy to the window's arg-max, the **first** maximum in scan order (depth,
height, width: the lowest address), or the first NaN of a window holding one; the Numba kernel
does so in both max modes. cuDNN: ``max_deterministic`` is CUDNN_POOLING_MAX_DETERMINISTIC
(expected to pick the same element; checked by tests/gpu/test_pool.py), ``max`` is
CUDNN_POOLING_MAX, whose choice among tied maxima is not specified. ``sum`` runs on cuDNN as
average_inc_pad with alpha = window size (dnnkit/cudnn/pool.py).

Backends: Numba (kernels/pool.py: one thread per output forward, a gather backward, no
atomics) and cuDNN (cudnnPoolingForward/Backward, Nd descriptors; batches over its 32-bit
tensor limit run as pieces of the batch, ops/split.py). cuDNN has no ceil mode and only
symmetric padding: where ceil mode adds a window, cuDNN pools a copy of x whose far edges are
longer by the overhang, filled with a value that changes nothing (-inf for max, 0 otherwise),
so that its floor-mode windows are these; the average modes then rescale each output by cuDNN's
divisor over the true one (cudnnOpTensor; 1 away from the overhang), and backward crops the
extended dx (``_extended``).
"""

from __future__ import annotations

import functools
import math

import numpy as np

from .. import arrays, config, device, reference
from ..autograd import gradient
from ..cudnn import pool as cudnn_pool
from ..dispatch import public_op
from ..hints import ArrayLike, Backend, Size, Stream
from ..launch import flat as flat_arg, launch
from ..registry import register
from ..tracing import note_algo
from . import split
from .pool_args import (ALIASES, MODES, PoolArgs, PoolBackwardArgs, PoolGeom,  # noqa: F401
                        backward_args, forward_args, make_geom)

_KERNEL_MODE = {"max": 0, "max_deterministic": 0, "average_inc_pad": 1, "average_exc_pad": 2,
                "sum": 3}   # kernels/pool.py: MAX, AVG_INC, AVG_EXC, SUM
_TOL = {"float16": (5e-3, 1e-3), "float32": (1e-5, 1e-6), "float64": (1e-12, 1e-14)}


_CEIL = """``ceil_mode``: False (default) or True: round the output size up, O = ceil((I + 2p -
    k) / s) + 1, less one where that last window would start in the far padding (PyTorch's
    ``ceil_mode``, Caffe's rounding); the last window may then reach past the padded input,
    and that overhang enters no maximum, sum or divisor (average_inc_pad counts the padding
    asked for, not the overhang). In ceil mode a window may exceed the padded input by up to
    s - 1."""


def _ceil_doc(fn):
    fn.__doc__ = fn.__doc__.replace("{POOL_CEIL}", _CEIL)
    return fn


@public_op("pool2d")
@_ceil_doc
def pool2d(x: ArrayLike, window: Size, stride: Size | None = None, padding: Size = 0,
           mode: str = "max", *, ceil_mode: bool = False, stream: Stream = None,
           backend: Backend | None = None) -> PoolArgs:
    """Pool x (N, C, H, W) over windows; returns y (N, C, OH, OW), O = (I + 2p - k) // s + 1.

    {POOL_WINDOW}
    {POOL_MODES}
    {POOL_CEIL}
    x: float16, float32 or float64. The gradient is :func:`pool2d_backward`.
    {POOL_RAISES}"""
    return forward_args("pool2d", 2, x, window, stride, padding, mode, ceil_mode, stream)


@public_op("pool3d")
@_ceil_doc
def pool3d(x: ArrayLike, window: Size, stride: Size | None = None, padding: Size = 0,
           mode: str = "max", *, ceil_mode: bool = False, stream: Stream = None,
           backend: Backend | None = None) -> PoolArgs:
    """Pool x (N, C, D, H, W) over windows; returns y (N, C, OD, OH, OW), O = (I + 2p - k) // s + 1.

    {POOL_WINDOW}
    {POOL_MODES}
    {POOL_CEIL}
    x: float16, float32 or float64. The gradient is :func:`pool3d_backward`.
    {POOL_RAISES}"""
    return forward_args("pool3d", 3, x, window, stride, padding, mode, ceil_mode, stream)


@public_op("pool2d_backward")
@_ceil_doc
def pool2d_backward(x: ArrayLike, y: ArrayLike, dy: ArrayLike, window: Size,
                    stride: Size | None = None, padding: Size = 0, mode: str = "max", *,
                    ceil_mode: bool = False, stream: Stream = None,
                    backend: Backend | None = None) -> PoolBackwardArgs:
    """Gradient wrt x of ``y = pool2d(x, window, stride, padding, mode, ceil_mode=...)``, given
    x, y and dy (N, C, OH, OW); returns dx (N, C, H, W).

    {POOL_BACKWARD}
    {POOL_WINDOW}
    {POOL_MODES}
    {POOL_CEIL}
    {POOL_RAISES}"""
    return backward_args("pool2d_backward", 2, x, y, dy, window, stride, padding, mode,
                         ceil_mode, stream)


@public_op("pool3d_backward")
@_ceil_doc
def pool3d_backward(x: ArrayLike, y: ArrayLike, dy: ArrayLike, window: Size,
                    stride: Size | None = None, padding: Size = 0, mode: str = "max", *,
                    ceil_mode: bool = False, stream: Stream = None,
                    backend: Backend | None = None) -> PoolBackwardArgs:
    """Gradient wrt x of ``y = pool3d(x, window, stride, padding, mode, ceil_mode=...)``, given
    x, y and dy (N, C, OD, OH, OW); returns dx (N, C, D, H, W).

    {POOL_BACKWARD}
    {POOL_WINDOW}
    {POOL_MODES}
    {POOL_CEIL}
    {POOL_RAISES}"""
    return backward_args("pool3d_backward", 3, x, y, dy, window, stride, padding, mode,
                         ceil_mode, stream)


# ---------------------------------------------------------------- Numba
# (The kernels are imported inside the functions: they import numba, which ``import dnnkit``
# does not pay for.)

_FLAT_BELOW = 128     # planes of fewer positions are walked as (plane, position) pairs
_BLOCKS_PER_SM = 8    # a grid that fills the GPU: ~8 blocks of 256 threads per SM


def _launch(kernel, planes, positions, stream, args):
    """Positions of a plane along x (grid-stride), planes along the grid's y, capped so that
    each thread visits several planes while the grid still fills the GPU (~8 blocks per SM).
    Planes of fewer than 128 positions (global pooling: 1) are walked flat instead, one
    (plane, position) pair per thread (kernels/pool.py ``_walk``), at most 4 grids' worth of
    blocks. ``args`` end with (..., planes, acc): the flag goes between them."""
    if planes == 0 or positions == 0:
        return
    sim = device.simulator()
    threads = 32 if sim else 256
    flat = positions < (4 if sim else _FLAT_BELOW)
    full = _BLOCKS_PER_SM * device.sm_count()
    if flat:
        grid = (min(-(-planes * positions // threads), full * 4), 1)
    else:
        gx = min(-(-positions // threads), 65535)
        grid = (gx, max(1, min(planes, (2 if sim else full) // gx, 65535)))
    launch(kernel, grid, threads, stream, args[:-1] + (int(flat), args[-1]))


def _kernels(geom, mode):
    """The kernels of the mode, window and stride; average_inc_pad's divide by the clipped
    window where ceil mode's last window overhangs (kernels/pool.py ``clip``)."""
    from ..kernels.pool import pool_kernels
    lift = (1,) * (3 - geom.nd)
    clip = mode == "average_inc_pad" and any(geom.overhang)
    return pool_kernels(_KERNEL_MODE[mode], lift + tuple(geom.window), lift + tuple(geom.stride),
                        clip)


@register("pool2d", "numba", tolerance=_TOL)
@register("pool3d", "numba", tolerance=_TOL)
def _forward_numba(x, geom, mode, stream):
    y = arrays.cuda_empty(geom.y_shape, x.dtype, stream)
    shape = geom.y_shape
    planes = shape[0] * shape[1]
    _launch(_kernels(geom, mode)[0], planes, math.prod(shape[2:]), stream,
            (flat_arg(x), flat_arg(y), geom.kernel_geo(), planes,
             arrays.acc_array(x.dtype)))
    return y


@register("pool2d_backward", "numba", tolerance=_TOL)
@register("pool3d_backward", "numba", tolerance=_TOL)
def _backward_numba(x, y, dy, geom, mode, stream):
    dx = arrays.empty_like(x, stream)
    shape = tuple(x.shape)
    planes = shape[0] * shape[1]
    if not y.size:   # N*C = 0: dx is empty too
        return dx
    _, argmax, gather, _ = _kernels(geom, mode)
    geo, acc, codes = geom.kernel_geo(), arrays.acc_array(x.dtype), flat_arg(y)
    if _KERNEL_MODE[mode] == 0:
        # the arg-max of every output as its tap index (kernels/pool.py)
        codes = arrays.cuda_empty((y.size,), np.uint8 if geom.window_size <= 255
                                  else np.int32, stream)
        _launch(argmax, planes, math.prod(geom.y_shape[2:]), stream,
                (flat_arg(x), codes, geo, planes, acc))
    _launch(gather, planes, math.prod(shape[2:]), stream,
            (codes, flat_arg(dy), flat_arg(dx), geo, planes, acc))
    return dx


# ---------------------------------------------------------------- cuDNN

def _image(geom):
    """Elements of the largest of one image of x (extended in ceil mode) and of y: the item
    cuDNN's calls are split between (ops/split.py)."""
    return geom.x_shape[1] * max(math.prod(geom.extended_shape[2:]), math.prod(geom.y_shape[2:]))


def _cudnn_supports(x, geom, mode, stream):
    """Batches over cuDNN's 32-bit tensor limit run as pieces of the batch; an image over it
    cannot run. Ceil mode runs on cuDNN in every mode (``_extended``)."""
    return split.too_big(_image(geom),
                         lambda: f"one image of x {geom.extended_shape} or of y {geom.y_shape}")


def _cudnn_backward_supports(x, y, dy, geom, mode, stream):
    return _cudnn_supports(x, geom, mode, stream)


def _cudnn_mode(mode):
    """``dnn.deterministic`` turns cuDNN's MAX (atomic adds where windows overlap) into
    MAX_DETERMINISTIC; the Numba kernels are deterministic either way."""
    if mode == "max" and config.get("dnn.deterministic"):
        mode = "max_deterministic"
    note_algo(mode)
    return mode


def _divisor_ratio(geom, mode):
    """None, or per output position (shape (1, 1, *O)) cuDNN's divisor on the extended x over
    the true one, in float64: average_inc_pad, cuDNN K (every window lies inside the padded
    extended x) over K clipped at the padded end n + p; average_exc_pad, the window's count
    of extended-x elements over its count of inputs. Both are products over the dims and 1
    wherever the window does not overhang."""
    if not mode.startswith("average") or not any(geom.overhang):
        return None
    ratio = np.ones((1, 1))
    for n, k, s, p, e, o in zip(geom.x_shape[2:], geom.window, geom.stride, geom.padding,
                                geom.overhang, geom.y_shape[2:]):
        lo = np.arange(o) * s - p
        if mode == "average_inc_pad":
            have, want = np.full(o, k), np.minimum(lo + k, n + p) - lo
        else:
            have = np.minimum(lo + k, n + e) - np.maximum(lo, 0)
            want = np.minimum(lo + k, n) - np.maximum(lo, 0)
        ratio = np.multiply.outer(ratio, have / want)
    return ratio


@functools.lru_cache(maxsize=256)
def _ratio_host(geom, mode, dtype):
    r = _divisor_ratio(geom, mode)
    return None if r is None else r.astype(dtype)


def _extended(geom, mode, x, arrays_, stream):
    """Ceil mode on cuDNN: yields the pieces of the batch of (xe, *arrays_), xe holding x with
    its far edges longer by the overhang, filled with -inf in the max modes (never a maximum)
    and 0 otherwise (adds nothing to a sum), so that cuDNN's floor-mode windows on xe are the
    geometry's windows; with the divisor ratio (None, or a device constant) to rescale by, and
    the raw stream. xe is filled in every mode, though cuDNN's backward reads x only for max:
    no call reads uninitialised memory. Traffic: x read once, xe written about twice (the
    fill, the copy) before cuDNN reads it."""
    xe = arrays.cuda_empty(geom.extended_shape, x.dtype, stream)
    ratio = _ratio_host(geom, mode, np.dtype(x.dtype).name)
    scale = None if ratio is None else arrays.constant(ratio, x.dtype)
    fill = -math.inf if _KERNEL_MODE[mode] == 0 else 0.0
    sp = device.stream_pointer(stream)
    for piece in split.batch(_image(geom), x, xe, *arrays_):
        cudnn_pool.extend(piece[0], piece[1], fill, sp)
        yield piece[1:], scale, sp


@register("pool2d", "cudnn", supports=_cudnn_supports)
@register("pool3d", "cudnn", supports=_cudnn_supports)
def _forward_cudnn(x, geom, mode, stream):
    y = arrays.cuda_empty(geom.y_shape, x.dtype, stream)
    if not y.size:
        return y
    mode, w, p, st = _cudnn_mode(mode), geom.window, geom.padding, geom.stride
    if any(geom.overhang):
        # the average modes pool into t, then y = t * ratio (cuDNN divisor / true divisor)
        t = arrays.cuda_empty(geom.y_shape, x.dtype, stream) if mode.startswith("average") \
            else y
        for (xe, tp, yp), scale, sp in _extended(geom, mode, x, (t, y), stream):
            cudnn_pool.forward(xe, tp, w, p, st, mode, sp)
            if scale is not None:
                cudnn_pool.rescale(tp, scale, yp, sp)
    else:
        for xp, yp in split.batch(_image(geom), x, y):
            cudnn_pool.forward(xp, yp, w, p, st, mode, device.stream_pointer(stream))
    if _KERNEL_MODE[mode] == 0:
        repair_max(x, y, geom, mode, stream)
    return y


_REPAIR_PER_THREAD = 8      # outputs per thread: two trips of kernels/common.py's UNROLL = 4


def repair_max(x, y, geom, mode, stream):
    """y = IEEE's maximum again wherever y holds the lowest finite value of its type: cuDNN's
    max pooling starts each window from that value, so a window of -inf gives it, not -inf
    (measured on an H100, cuDNN 9.19: -3.4028235e+38 in float32, both max modes). One read
    of y; a window is re-read from x only where y holds that value. Each thread takes about
    two unrolled trips (kernels/pool.py ``repair``)."""
    acc = arrays.acc_array(x.dtype)
    blocks, threads = arrays.grid_1d(-(-y.size // _REPAIR_PER_THREAD),
                                     32 if device.simulator() else 256)
    launch(_kernels(geom, mode)[3], blocks, threads, stream,
           (flat_arg(x), flat_arg(y), geom.kernel_geo(),
            acc.dtype.type(np.finfo(x.dtype).min), acc))


@register("pool2d_backward", "cudnn", supports=_cudnn_backward_supports)
@register("pool3d_backward", "cudnn", supports=_cudnn_backward_supports)
def _backward_cudnn(x, y, dy, geom, mode, stream):
    dx = arrays.empty_like(x, stream)
    if not y.size:
        return dx
    mode, w, p, st = _cudnn_mode(mode), geom.window, geom.padding, geom.stride
    if any(geom.overhang):
        # dx = the crop of cuDNN's gradient on the extended x, of dy * ratio (average modes)
        dxe = arrays.cuda_empty(geom.extended_shape, x.dtype, stream)
        dys = arrays.cuda_empty(geom.y_shape, x.dtype, stream) if mode.startswith("average") \
            else dy
        for (xe, yp, dyp, dysp, dxep, dxp), scale, sp in _extended(
                geom, mode, x, (y, dy, dys, dxe, dx), stream):
            if scale is not None:
                cudnn_pool.rescale(dyp, scale, dysp, sp)
            cudnn_pool.backward(xe, yp, dysp, dxep, w, p, st, mode, sp)
            cudnn_pool.crop(dxep, dxp, sp)
    else:
        for xp, yp, dyp, dxp in split.batch(_image(geom), x, y, dy, dx):
            cudnn_pool.backward(xp, yp, dyp, dxp, w, p, st, mode, device.stream_pointer(stream))
    return dx


# ---------------------------------------------------------------- python -m dnnkit check

def tie_free(rng, shape, dtype, period=4):
    """Test input whose every window of extent <= ``period`` per dim holds distinct values: a
    per-(n, c) shuffle of period**nd distinct values tiled over space, so that the arg-max is
    unique whatever the tie rule. Exact in float16 while period**nd <= 1024."""
    nd, planes = len(shape) - 2, shape[0] * shape[1]
    cells = period ** nd
    vals = np.stack([rng.permutation(cells) for _ in range(planes)] or [np.zeros(cells)])
    vals = (vals - cells // 2) * rng.choice([0.125, 0.25, 0.5], size=(len(vals), 1))
    grids = np.meshgrid(*[np.arange(n) % period for n in shape[2:]], indexing="ij")
    idx = sum(g * period ** (nd - 1 - ax) for ax, g in enumerate(grids))
    return np.ascontiguousarray(vals[:planes, idx].reshape(shape), dtype=dtype)


_SHORT = {"max": "max", "max_deterministic": "max_det", "average_inc_pad": "avg_inc",
          "average_exc_pad": "avg_exc", "sum": "sum"}


def selfcheck_cases(Case):
    # (nd, small x, big x, window, stride, padding, ceil_mode, modes); variant "k/s/p mode"
    # (" ceil": ceil mode, on shapes where it adds a window in every spatial dim)
    table = [(2, (2, 3, 7, 6), (32, 64, 112, 112), 3, 2, 1, False, MODES),
             (3, (1, 2, 5, 4, 5), (8, 32, 16, 56, 56), 3, 2, 1, False,
              ("max", "max_deterministic", "average_exc_pad")),
             (2, (2, 3, 8, 6), (32, 64, 112, 112), 3, 2, 0, True,
              ("max_deterministic", "average_inc_pad", "average_exc_pad"))]
    out = []
    for nd, small, big, k, st, p, c, modes in table:
        fwd, bwd = (pool2d, pool2d_backward) if nd == 2 else (pool3d, pool3d_backward)
        for mode in modes:
            make, g = _check_inputs(small, big, k, st, p, c, mode), (k, st, p)
            name = f"{k}/{st}/{p} {_SHORT[mode]}{' ceil' if c else ''}"
            out.append(Case(
                f"pool{nd}d", name,
                lambda b, s, i, f=fwd, m=mode, g=g, c=c: f(i[0], *g, m, ceil_mode=c, backend=b,
                                                           stream=s),
                lambda i, m=mode, g=g, c=c: reference.pool_forward(i[0], *g, m, c), make))
            out.append(Case(
                f"pool{nd}d_backward", name,
                lambda b, s, i, f=bwd, m=mode, g=g, c=c: f(*i, *g, m, ceil_mode=c, backend=b,
                                                           stream=s),
                lambda i, m=mode, g=g, c=c: reference.pool_backward(i[0], i[2], *g, m, c), make))
    return out


def _check_inputs(small, big, k, st, p, c, mode):
    def make(rng, dtype, b):
        shape = big if b else small
        # max: distinct values per window, as cuDNN's MAX may break ties its own way;
        # max_deterministic: random data, ties included (both backends must agree on them).
        x = tie_free(rng, shape, dtype) if mode == "max" else \
            rng.standard_normal(shape).astype(dtype)
        y = reference.pool_forward(x, k, st, p, mode, c).astype(dtype)
        return x, y, rng.standard_normal(y.shape).astype(dtype)
    return make


# ---------------------------------------------------------------- autograd

def _pool_grad(backward):
    def rule(g, dy):
        if not g.needs("x"):
            return {}
        return {"x": backward(g.x, g.out, dy, g.window, g.stride, g.padding, g.mode,
                              ceil_mode=g.ceil_mode, backend=g.backend, stream=g.stream)}
    return rule


gradient("pool2d")(_pool_grad(pool2d_backward))
gradient("pool3d")(_pool_grad(pool3d_backward))
