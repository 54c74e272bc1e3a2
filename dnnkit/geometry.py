"""Convolution geometry shared by the op, the Numba backend and the cuDNN backend.

Internally every convolution is 3-D: a 2-D one has a leading spatial dimension of size 1 with
kernel 1, stride 1, pad 0, dilation 1 (``nd`` remembers what the user asked for). Shapes:
x (N, C, D, H, W), w (K, C/groups, T, R, S), y (N, K, OD, OH, OW), with
``O = (I + 2p - d(k-1) - 1) // s + 1`` per spatial dimension.

``flip`` is True for ``mode="conv"`` (true convolution, Theano's default): the kernel is read
reversed in every spatial dimension. cuDNN takes it as CUDNN_CONVOLUTION; the Numba kernels read
tap (t, r, s) as (T-1-t, R-1-r, S-1-s).
"""

import dataclasses
import functools


@dataclasses.dataclass(frozen=True)
class ConvGeom:
    nd: int                 # 2 or 3: the rank the user asked for
    x_shape: tuple          # (N, C, D, H, W), 3-D form
    w_shape: tuple          # (K, C // groups, T, R, S)
    stride: tuple           # (sd, sh, sw)
    padding: tuple          # (pd, ph, pw)
    dilation: tuple         # (dd, dh, dw)
    groups: int
    flip: bool

    # A geometry is a cache key on every call of a convolution and its derived shapes are read
    # many times per call: both are computed once per object (kept in its __dict__, outside
    # the fields that equality compares).
    def __hash__(self):
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash(dataclasses.astuple(self))
            object.__setattr__(self, "_hash", h)
        return h

    @functools.cached_property
    def out_spatial(self):
        return tuple((i + 2 * p - d * (k - 1) - 1) // s + 1 for i, k, s, p, d in zip(
            self.x_shape[2:], self.w_shape[2:], self.stride, self.padding, self.dilation))

    @functools.cached_property
    def y_shape(self):
        return (self.x_shape[0], self.w_shape[0]) + self.out_spatial

    def user_shape(self, shape5):
        """Drop the dummy depth dimension of a 2-D convolution."""
        return tuple(shape5[:2]) + tuple(shape5[5 - self.nd:])

    def user_tuple(self, t3):
        return tuple(t3[3 - self.nd:])

    @property
    def flops(self):
        """Multiply-adds x 2 of the forward pass (also each backward pass)."""
        n, k = self.x_shape[0], self.w_shape[0]
        taps = 1
        for v in self.w_shape[1:]:
            taps *= v
        out = 1
        for v in self.out_spatial:
            out *= v
        return 2 * n * k * out * taps
