"""Pooling, 2-D (NCHW) and 3-D (NCDHW), forward and backward.

Modes: ``max``, ``max_deterministic``, ``average_inc_pad`` (alias ``average``: the divisor is
the full window, padding included), ``average_exc_pad`` (the divisor is the number of inputs
in the window), ``sum``. Output size per spatial dim: ``(I + 2p - k) // s + 1`` (``stride``
defaults to the window). Padding never enters a maximum or a sum; it must be smaller than the
window (cuDNN's rule), so every window holds at least one input. NaN in a window propagates.

Backward: max routes dy to the window's arg-max, the **first** maximum in scan order (depth,
height, width: the lowest address), or the first NaN of a window holding one; the Numba kernel
does so in both max modes. cuDNN: ``max_deterministic`` is CUDNN_POOLING_MAX_DETERMINISTIC
(expected to pick the same element; checked by tests/gpu/test_pool.py), ``max`` is
CUDNN_POOLING_MAX, whose choice among tied maxima is not specified. ``sum`` runs on cuDNN as
average_inc_pad with alpha = window size (dnnkit/cudnn/pool.py).

Backends: Numba (kernels/pool.py: one thread per output forward, a gather backward, no
atomics) and cuDNN (cudnnPoolingForward/Backward, Nd descriptors; batches over its 32-bit
tensor limit run as pieces of the batch, ops/split.py).
"""

import dataclasses
import math
from typing import NamedTuple

import numpy as np

from .. import arrays, config, device, reference
from ..autograd import gradient
from ..cudnn import pool as cudnn_pool
from ..dispatch import public_op
from ..launch import launch
from ..registry import register
from ..tracing import note_algo
from . import split
from .args import choice, int_tuple

MODES = ("max", "max_deterministic", "average_inc_pad", "average_exc_pad", "sum")
ALIASES = {"average": "average_inc_pad"}
_KERNEL_MODE = {"max": 0, "max_deterministic": 0, "average_inc_pad": 1, "average_exc_pad": 2,
                "sum": 3}   # kernels/pool.py: MAX, AVG_INC, AVG_EXC, SUM
_TOL = {"float16": (5e-3, 1e-3), "float32": (1e-5, 1e-6), "float64": (1e-12, 1e-14)}


@dataclasses.dataclass(frozen=True)
class PoolGeom:
    """A checked pooling geometry in the user's rank (nd = 2 or 3)."""
    x_shape: tuple
    window: tuple
    stride: tuple
    padding: tuple

    @property
    def nd(self):
        return len(self.window)

    @property
    def y_shape(self):
        return tuple(self.x_shape[:2]) + tuple(
            (n + 2 * p - k) // s + 1
            for n, k, s, p in zip(self.x_shape[2:], self.window, self.stride, self.padding))

    @property
    def window_size(self):
        return math.prod(self.window)

    def kernel_geo(self):
        """kernels/pool.py's 15-int tuple (3-D form: a 2-D pooling has depth 1)."""
        lift = 3 - self.nd
        sp, out = (1,) * lift + tuple(self.x_shape[2:]), (1,) * lift + self.y_shape[2:]
        return (sp + out + (1,) * lift + self.window + (1,) * lift + self.stride
                + (0,) * lift + self.padding)


class PoolArgs(NamedTuple):
    """pool2d's and pool3d's checked arguments, as their implementations take them."""
    x: object
    geom: PoolGeom
    mode: str
    stream: object


class PoolBackwardArgs(NamedTuple):
    """pool2d_backward's and pool3d_backward's checked arguments."""
    x: object
    y: object
    dy: object
    geom: PoolGeom
    mode: str
    stream: object


def _mode(op, mode):
    mode = choice(op, "mode", mode, MODES, also=tuple(ALIASES))
    return ALIASES.get(mode, mode)


def make_geom(op, nd, x_shape, window, stride, padding):
    """Check the geometric arguments against x's shape; the PoolGeom."""
    window = int_tuple(op, "window", window, nd, 1)
    stride = window if stride is None else int_tuple(op, "stride", stride, nd, 1)
    padding = int_tuple(op, "padding", padding, nd, 0)
    for i, (n, k, p) in enumerate(zip(x_shape[2:], window, padding)):
        if p >= k:
            raise ValueError(f"{op}: padding {padding} must be smaller than the window {window} "
                             f"in every dimension (cuDNN does not support padding >= window); "
                             f"spatial dim {i} has padding {p} >= window {k}")
        if n == 0:
            raise ValueError(f"{op}: x has an empty spatial dimension; shape {tuple(x_shape)}")
        if k > n + 2 * p:
            raise ValueError(f"{op}: the window {k} in spatial dim {i} is larger than the padded "
                             f"input ({n} + 2*{p} = {n + 2 * p}); x shape {tuple(x_shape)}, "
                             f"window {window}, padding {padding}")
    return PoolGeom(tuple(x_shape), window, stride, padding)


def _forward_args(op, nd, x, window, stride, padding, mode, stream):
    mode = _mode(op, mode)
    s = arrays.as_stream(stream)
    x = arrays.device_input(op, "x", x, s, ndim=(nd + 2,))
    return PoolArgs(x, make_geom(op, nd, x.shape, window, stride, padding), mode, s)


def _backward_args(op, nd, x, y, dy, window, stride, padding, mode, stream):
    mode = _mode(op, mode)
    s = arrays.as_stream(stream)
    x = arrays.device_input(op, "x", x, s, ndim=(nd + 2,))
    y = arrays.device_input(op, "y", y, s, ndim=(nd + 2,))
    dy = arrays.device_input(op, "dy", dy, s, ndim=(nd + 2,))
    geom = make_geom(op, nd, x.shape, window, stride, padding)
    for name, a in (("y", y), ("dy", dy)):
        if tuple(a.shape) != geom.y_shape:
            raise ValueError(f"{op}: {name} has shape {tuple(a.shape)} but the pooling of x "
                             f"{tuple(x.shape)} gives {geom.y_shape}")
        if a.dtype != x.dtype:
            raise TypeError(f"{op}: {name} has dtype {a.dtype} but x has {x.dtype}")
    return PoolBackwardArgs(x, y, dy, geom, mode, s)


@public_op("pool2d")
def pool2d(x, window, stride=None, padding=0, mode="max", *, stream=None):
    """Pool x (N, C, H, W) over windows; returns y (N, C, OH, OW), O = (I + 2p - k) // s + 1.

    {POOL_WINDOW}
    {POOL_MODES}
    x: float16, float32 or float64. The gradient is :func:`pool2d_backward`.
    {POOL_RAISES}"""
    return _forward_args("pool2d", 2, x, window, stride, padding, mode, stream)


@public_op("pool3d")
def pool3d(x, window, stride=None, padding=0, mode="max", *, stream=None):
    """Pool x (N, C, D, H, W) over windows; returns y (N, C, OD, OH, OW), O = (I + 2p - k) // s + 1.

    {POOL_WINDOW}
    {POOL_MODES}
    x: float16, float32 or float64. The gradient is :func:`pool3d_backward`.
    {POOL_RAISES}"""
    return _forward_args("pool3d", 3, x, window, stride, padding, mode, stream)


@public_op("pool2d_backward")
def pool2d_backward(x, y, dy, window, stride=None, padding=0, mode="max", *, stream=None):
    """Gradient wrt x of ``y = pool2d(x, window, stride, padding, mode)``, given x, y and dy
    (N, C, OH, OW); returns dx (N, C, H, W).

    {POOL_BACKWARD}
    {POOL_WINDOW}
    {POOL_MODES}
    {POOL_RAISES}"""
    return _backward_args("pool2d_backward", 2, x, y, dy, window, stride, padding, mode, stream)


@public_op("pool3d_backward")
def pool3d_backward(x, y, dy, window, stride=None, padding=0, mode="max", *, stream=None):
    """Gradient wrt x of ``y = pool3d(x, window, stride, padding, mode)``, given x, y and dy
    (N, C, OD, OH, OW); returns dx (N, C, D, H, W).

    {POOL_BACKWARD}
    {POOL_WINDOW}
    {POOL_MODES}
    {POOL_RAISES}"""
    return _backward_args("pool3d_backward", 3, x, y, dy, window, stride, padding, mode, stream)


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
    from ..kernels.pool import pool_kernels
    lift = (1,) * (3 - geom.nd)
    return pool_kernels(_KERNEL_MODE[mode], lift + tuple(geom.window), lift + tuple(geom.stride))


@register("pool2d", "numba", tolerance=_TOL)
@register("pool3d", "numba", tolerance=_TOL)
def _forward_numba(x, geom, mode, stream):
    y = arrays.cuda_empty(geom.y_shape, x.dtype, stream)
    shape = geom.y_shape
    planes = shape[0] * shape[1]
    _launch(_kernels(geom, mode)[0], planes, math.prod(shape[2:]), stream,
            (arrays.flat(x), arrays.flat(y), geom.kernel_geo(), planes,
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
    geo, acc, codes = geom.kernel_geo(), arrays.acc_array(x.dtype), arrays.flat(y)
    if _KERNEL_MODE[mode] == 0:
        # the arg-max of every output as its tap index (kernels/pool.py)
        codes = arrays.cuda_empty((y.size,), np.uint8 if geom.window_size <= 255
                                  else np.int32, stream)
        _launch(argmax, planes, math.prod(geom.y_shape[2:]), stream,
                (arrays.flat(x), codes, geo, planes, acc))
    _launch(gather, planes, math.prod(shape[2:]), stream,
            (codes, arrays.flat(dy), arrays.flat(dx), geo, planes, acc))
    return dx


# ---------------------------------------------------------------- cuDNN

def _image(geom):
    """Elements of the larger of one image of x and of y: the item cuDNN's calls are split
    between (ops/split.py)."""
    return geom.x_shape[1] * max(math.prod(geom.x_shape[2:]), math.prod(geom.y_shape[2:]))


def _cudnn_supports(x, geom, mode, stream):
    """Batches over cuDNN's 32-bit tensor limit run as pieces of the batch; an image over it
    cannot run."""
    return split.too_big(_image(geom),
                         lambda: f"one image of x {tuple(x.shape)} or of y {geom.y_shape}")


def _cudnn_backward_supports(x, y, dy, geom, mode, stream):
    return _cudnn_supports(x, geom, mode, stream)


def _cudnn_mode(mode):
    """``dnn.deterministic`` turns cuDNN's MAX (atomic adds where windows overlap) into
    MAX_DETERMINISTIC; the Numba kernels are deterministic either way."""
    if mode == "max" and config.get("dnn.deterministic"):
        mode = "max_deterministic"
    note_algo(mode)
    return mode


@register("pool2d", "cudnn", supports=_cudnn_supports)
@register("pool3d", "cudnn", supports=_cudnn_supports)
def _forward_cudnn(x, geom, mode, stream):
    y = arrays.cuda_empty(geom.y_shape, x.dtype, stream)
    if y.size:
        mode = _cudnn_mode(mode)
        for xp, yp in split.batch(_image(geom), x, y):
            cudnn_pool.forward(xp, yp, geom.window, geom.padding, geom.stride, mode,
                          device.stream_pointer(stream))
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
           (arrays.flat(x), arrays.flat(y), geom.kernel_geo(),
            acc.dtype.type(np.finfo(x.dtype).min), acc))


@register("pool2d_backward", "cudnn", supports=_cudnn_backward_supports)
@register("pool3d_backward", "cudnn", supports=_cudnn_backward_supports)
def _backward_cudnn(x, y, dy, geom, mode, stream):
    dx = arrays.empty_like(x, stream)
    if y.size:
        mode = _cudnn_mode(mode)
        for xp, yp, dyp, dxp in split.batch(_image(geom), x, y, dy, dx):
            cudnn_pool.backward(xp, yp, dyp, dxp, geom.window, geom.padding, geom.stride, mode,
                           device.stream_pointer(stream))
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
    # (nd, small x, big x, window, stride, padding, modes); variant "k/s/p mode"
    table = [(2, (2, 3, 7, 6), (32, 64, 112, 112), 3, 2, 1, MODES),
             (3, (1, 2, 5, 4, 5), (8, 32, 16, 56, 56), 3, 2, 1,
              ("max", "max_deterministic", "average_exc_pad"))]
    out = []
    for nd, small, big, k, st, p, modes in table:
        fwd, bwd = (pool2d, pool2d_backward) if nd == 2 else (pool3d, pool3d_backward)
        for mode in modes:
            make, g, name = _check_inputs(small, big, k, st, p, mode), (k, st, p), \
                f"{k}/{st}/{p} {_SHORT[mode]}"
            out.append(Case(
                f"pool{nd}d", name,
                lambda b, s, i, f=fwd, m=mode, g=g: f(i[0], *g, m, backend=b, stream=s),
                lambda i, m=mode, g=g: reference.pool_forward(i[0], *g, m), make))
            out.append(Case(
                f"pool{nd}d_backward", name,
                lambda b, s, i, f=bwd, m=mode, g=g: f(*i, *g, m, backend=b, stream=s),
                lambda i, m=mode, g=g: reference.pool_backward(i[0], i[2], *g, m), make))
    return out


def _check_inputs(small, big, k, st, p, mode):
    def make(rng, dtype, b):
        shape = big if b else small
        # max: distinct values per window, as cuDNN's MAX may break ties its own way;
        # max_deterministic: random data, ties included (both backends must agree on them).
        x = tie_free(rng, shape, dtype) if mode == "max" else \
            rng.standard_normal(shape).astype(dtype)
        y = reference.pool_forward(x, k, st, p, mode).astype(dtype)
        return x, y, rng.standard_normal(y.shape).astype(dtype)
    return make


# ---------------------------------------------------------------- autograd

def _pool_grad(backward):
    def rule(g, dy):
        if not g.needs("x"):
            return {}
        return {"x": backward(g.x, g.out, dy, g.window, g.stride, g.padding, g.mode,
                              backend=g.backend, stream=g.stream)}
    return rule


gradient("pool2d")(_pool_grad(pool2d_backward))
gradient("pool3d")(_pool_grad(pool3d_backward))
