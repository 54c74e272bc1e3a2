"""The gradient rules of the convolutions (ops/conv.py): the forwards' (data, filter and bias
gradients, through a fused relu's slope first) and the data gradients' (linear in dy and w:
the transposed convolutions of ops/conv_transpose.py differentiate through these).
Registered on import (ops/__init__.py)."""

from ..autograd import gradient
from .activation import fused_reads, through_fused
from .conv import (conv2d, conv2d_backward_data, conv2d_backward_filter, conv3d,
                   conv3d_backward_data, conv3d_backward_filter, conv_backward_bias)


def _geometry(g):
    """The recorded call's geometry and options, as the other convolutions take them."""
    return dict(stride=g.stride, padding=g.padding, dilation=g.dilation, groups=g.groups,
                mode=g.mode, precision=g.precision, backend=g.backend, stream=g.stream)


def _conv_grad(backward_data, backward_filter):
    """The gradient rule of conv2d / conv3d: the data and filter gradients by the backward
    convolutions with the forward's geometry, the bias gradient by conv_backward_bias; a
    fused relu first takes dy through its slope from y (activation_backward with x = y: relu's
    slope is the same read from its output)."""
    def rule(g, dy):
        kw, grads, dy = _geometry(g), {}, through_fused(g, dy)
        if g.needs("x"):
            grads["x"] = backward_data(dy, g.w, tuple(g.x.shape), **kw)
        if g.needs("w"):
            grads["w"] = backward_filter(g.x, dy, tuple(g.w.shape), **kw)
        if g.needs("bias"):
            grads["bias"] = conv_backward_bias(dy, backend=g.backend, stream=g.stream)
        return grads
    return rule


gradient("conv2d", reads_out=fused_reads)(_conv_grad(conv2d_backward_data,
                                                     conv2d_backward_filter))
gradient("conv3d", reads_out=fused_reads)(_conv_grad(conv3d_backward_data,
                                                     conv3d_backward_filter))


def _backward_data_grad(forward, backward_filter):
    """The gradient rule of conv2d/3d_backward_data (dx from dy and w; linear in each), for an
    upstream gradient ``gx`` of dx's shape: d dy = the forward convolution of gx with w, d w =
    the filter gradient with gx as the input and dy as the output gradient. (The transposed
    convolutions, ops/conv_transpose.py, are these ops: their gradients come from here.)"""
    def rule(g, gx):
        kw, grads = _geometry(g), {}
        if g.needs("dy"):
            grads["dy"] = forward(gx, g.w, **kw)
        if g.needs("w"):
            grads["w"] = backward_filter(gx, g.dy, tuple(g.w.shape), **kw)
        return grads
    return rule


gradient("conv2d_backward_data")(_backward_data_grad(conv2d, conv2d_backward_filter))
gradient("conv3d_backward_data")(_backward_data_grad(conv3d, conv3d_backward_filter))
