"""Runners of the Numba convolution for repeated calls (dispatch's memo; registry ``binder``).

Where a call of one signature is one GEMM launch — the forward and the data gradient on the
implicit GEMM (ops/conv_implicit.py: stride-1 3x3 layers of up to 128 output channels, the
layers of a CIFAR ResNet or VGG at batch 32) — the runner packs that launch once
(``gemm.prepared``, a ``launch.Prepared``) and a call allocates its output, writes its arrays'
addresses into the packed launch and launches it. That skips, per call, the path's sizes and
rules (``ConvSizes``, the Winograd, direct and implicit checks, the plan lookup), the views of the
arrays as 5-D, and the typing and packing of the GEMM's thirteen arguments (validation/notes/
host-overhead.md: a 1x8x8x8 convolution's Numba call cost 60 us against the cuDNN path's 17).
Every other path (im2col with its column buffer, split k, Winograd, pointwise) keeps the
full implementation, as does a first call that takes none of these.
"""

from math import prod

from .. import arrays
from . import conv_depthwise, conv_direct, conv_numba, conv_winograd, gemm
from .conv_implicit import (implicit_backward_data, implicit_backward_data_gemm,
                            implicit_forward, implicit_forward_gemm)


def _sizes(geom, dtype, opts, itemsize, direction):
    """(ConvSizes, math) of a call the runners may serve, or None: work to do, and neither
    the depthwise kernels, Winograd nor the direct kernels (ops/conv_numba.py takes them
    first) for ``direction``."""
    sz, math = conv_numba.ConvSizes(geom, itemsize), conv_numba.gemm_math(opts)
    if sz.empty() or conv_depthwise.applies(geom) or conv_winograd.pays(geom, dtype) \
            or conv_direct.pays(geom, direction):
        return None
    return sz, math


def bind_forward(x, w, bias, geom, opts, stream, activation=None, *, note):
    """The forward's runner where it is the implicit GEMM; None elsewhere. ``note(algo)``:
    ops/conv.py's algorithm note for traces."""
    got = _sizes(geom, x.dtype, opts, x.dtype.itemsize, "fwd")
    conv = None if got is None else implicit_forward(geom, got[0])
    if conv is None:
        return None
    sz, math = got
    # the output's place is held by x until a call writes its own y there (same flat type)
    args, kw = implicit_forward_gemm(sz, conv, x, w, x, bias, math, activation == "relu")
    launch = gemm.prepared(*args, **kw)
    alloc = arrays.allocator(geom.user_shape(geom.y_shape), x.dtype, stream)

    def forward(x, w, bias, geom, opts, stream, activation=None):
        y = alloc()
        launch.set_flat(0, w)
        launch.set_flat(1, x)
        launch.set_flat(2, y)
        # without a bias the kernel reads none: w holds the place (no array of an old call)
        launch.set_flat(3, w if bias is None else bias)
        launch(stream)
        note("implicit_gemm")
        return y
    return forward


def bind_backward_data(dy, w, geom, opts, stream, note):
    """The data gradient's runner where it is the implicit GEMM; None elsewhere."""
    acc = arrays.acc_array(dy.dtype)
    got = _sizes(geom, dy.dtype, opts, acc.dtype.itemsize, "bwd_data")
    # an empty dx returns at once on the full path (x's image may be empty, padded to an output)
    conv = None if got is None or not prod(geom.x_shape) else \
        implicit_backward_data(geom, got[0])
    if conv is None:
        return None
    sz, math = got
    args, kw = implicit_backward_data_gemm(sz, conv, dy, w, dy, math)
    launch = gemm.prepared(*args, **kw)
    alloc = arrays.allocator(geom.user_shape(geom.x_shape), dy.dtype, stream)

    def backward_data(dy, w, geom, opts, stream):
        dx = alloc()
        launch.set_flat(0, w)
        launch.set_flat(1, dy)
        launch.set_flat(2, dx)
        launch(stream)
        note("implicit_gemm")
        return dx
    return backward_data


__all__ = ["bind_forward", "bind_backward_data"]
