"""Pooling's arguments: the modes, the output-size rule (floor and ceil mode), the checked
geometry and the prepared arguments of pool2d / pool3d and their backward ops (ops/pool.py).

Output size per spatial dim, x extent n, window k, stride s, padding p (PyTorch's
``pooling_output_shape``, Caffe's rule):

    floor (ceil_mode=False)   O = (n + 2p - k) // s + 1
    ceil  (ceil_mode=True)    O = ceil((n + 2p - k) / s) + 1, less one when that last window
                              would start in the far padding ((O - 1) * s >= n + p)

So every window starts inside x or in the near padding and holds at least one input. In ceil
mode the last window may reach past the padded input (n + 2p) by ``overhang`` = (O - 1) * s + k
- (n + 2p) positions, 0 < overhang < s (a window wider than the padded input is allowed in
ceil mode by up to s - 1). Those positions are neither inputs nor padding: they enter no
maximum, no sum and no divisor (average_inc_pad counts the padding the user asked for, not the
overhang: PyTorch's and Caffe's divisor).
"""

import dataclasses
import math
from typing import NamedTuple

import numpy as np

from .. import arrays
from .args import choice, int_tuple

MODES = ("max", "max_deterministic", "average_inc_pad", "average_exc_pad", "sum")
ALIASES = {"average": "average_inc_pad"}


def output_size(n, k, s, p, ceil_mode):
    """Outputs along one spatial dim (the module docstring's rule; may be < 1 for a window
    larger than the padded input: the caller refuses it)."""
    out = (n + 2 * p - k + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (out - 1) * s >= n + p:
        out -= 1
    return out


@dataclasses.dataclass(frozen=True)
class PoolGeom:
    """A checked pooling geometry in the user's rank (nd = 2 or 3)."""
    x_shape: tuple
    window: tuple
    stride: tuple
    padding: tuple
    ceil_mode: bool = False

    @property
    def nd(self):
        return len(self.window)

    @property
    def y_shape(self):
        return tuple(self.x_shape[:2]) + tuple(
            output_size(n, k, s, p, self.ceil_mode)
            for n, k, s, p in zip(self.x_shape[2:], self.window, self.stride, self.padding))

    @property
    def overhang(self):
        """Per spatial dim, how far the last window reaches past the padded input (0 unless
        ceil mode adds a window there)."""
        return tuple(max(0, (o - 1) * s + k - (n + 2 * p)) for n, k, s, p, o in
                     zip(self.x_shape[2:], self.window, self.stride, self.padding,
                         self.y_shape[2:]))

    @property
    def extended_shape(self):
        """x's shape with each spatial dim longer by its overhang: the input whose floor-mode
        pooling has this geometry's windows (the cuDNN path, ops/pool.py)."""
        return tuple(self.x_shape[:2]) + tuple(
            n + e for n, e in zip(self.x_shape[2:], self.overhang))

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


def mode_name(op, mode):
    """The checked mode, aliases resolved."""
    mode = choice(op, "mode", mode, MODES, also=tuple(ALIASES))
    return ALIASES.get(mode, mode)


def make_geom(op, nd, x_shape, window, stride, padding, ceil_mode=False):
    """Check the geometric arguments against x's shape; the PoolGeom."""
    window = int_tuple(op, "window", window, nd, 1)
    stride = window if stride is None else int_tuple(op, "stride", stride, nd, 1)
    padding = int_tuple(op, "padding", padding, nd, 0)
    if not isinstance(ceil_mode, (bool, np.bool_)):
        raise TypeError(f"{op}: ceil_mode must be a bool; got {ceil_mode!r}")
    for i, (n, k, s, p) in enumerate(zip(x_shape[2:], window, stride, padding)):
        if p >= k:
            raise ValueError(f"{op}: padding {padding} must be smaller than the window {window} "
                             f"in every dimension (cuDNN does not support padding >= window); "
                             f"spatial dim {i} has padding {p} >= window {k}")
        if n == 0:
            raise ValueError(f"{op}: x has an empty spatial dimension; shape {tuple(x_shape)}")
        if output_size(n, k, s, p, bool(ceil_mode)) < 1:
            extra = (f" by more than stride - 1 = {s - 1} (ceil_mode's limit)" if ceil_mode
                     else "")
            raise ValueError(f"{op}: the window {k} in spatial dim {i} is larger than the padded "
                             f"input ({n} + 2*{p} = {n + 2 * p}){extra}; x shape "
                             f"{tuple(x_shape)}, window {window}, stride {stride}, padding "
                             f"{padding}")
    return PoolGeom(tuple(x_shape), window, stride, padding, bool(ceil_mode))


def forward_args(op, nd, x, window, stride, padding, mode, ceil_mode, stream):
    """pool2d's and pool3d's checks: the PoolArgs."""
    mode = mode_name(op, mode)
    s = arrays.as_stream(stream)
    x = arrays.device_input(op, "x", x, s, ndim=(nd + 2,))
    return PoolArgs(x, make_geom(op, nd, x.shape, window, stride, padding, ceil_mode), mode, s)


def backward_args(op, nd, x, y, dy, window, stride, padding, mode, ceil_mode, stream):
    """pool2d_backward's and pool3d_backward's checks: the PoolBackwardArgs."""
    mode = mode_name(op, mode)
    s = arrays.as_stream(stream)
    x = arrays.device_input(op, "x", x, s, ndim=(nd + 2,))
    y = arrays.device_input(op, "y", y, s, ndim=(nd + 2,))
    dy = arrays.device_input(op, "dy", dy, s, ndim=(nd + 2,))
    geom = make_geom(op, nd, x.shape, window, stride, padding, ceil_mode)
    for name, a in (("y", y), ("dy", dy)):
        if tuple(a.shape) != geom.y_shape:
            raise ValueError(f"{op}: {name} has shape {tuple(a.shape)} but the pooling of x "
                             f"{tuple(x.shape)} gives {geom.y_shape}")
        if a.dtype != x.dtype:
            raise TypeError(f"{op}: {name} has dtype {a.dtype} but x has {x.dtype}")
    return PoolBackwardArgs(x, y, dy, geom, mode, s)
