"""Convolution, transposed convolution, pooling, linear and the spatial transformer as
``torch.autograd.Function``s running dnnkit's ops.

Every forward and backward is a call of dnnkit's public ops (the dispatcher: ``dnn.enabled``,
``backend=``, ``trace()``, ``profile()``, ``dnn.crosscheck`` and the memo apply) on views of
PyTorch's tensors, on PyTorch's current stream (dnnkit/torch/bridge.py). The backward runs the
ops' own gradient ops with the forward's backend argument:

    conv:            dx = convNd_backward_data(dy, w), dw = convNd_backward_filter(x, dy),
                     db = conv_backward_bias(dy)
    conv_transpose:  y = convNd_backward_data(x, w) (+ bias), so dx = convNd(dy, w),
                     dw = convNd_backward_filter(dy, x), db = conv_backward_bias(dy)
    pool:            dx = poolNd_backward(x, y, dy)
    linear:          dx = dy @ w, dw = dy^T @ x, db = the sum of dy's rows
    affine_grid:     dtheta = affine_grid_backward(dgrid)
    grid_sample:     dimg, dgrid = grid_sample_backward(img, grid, dy)

Only the gradients PyTorch asks for (``ctx.needs_input_grad``) are computed. The functions
take the backend as "auto" (the policy's choice per call), "cudnn" or "numba".
"""

from __future__ import annotations

import math

import torch

from .. import ops
from ..memory import reshaped

from . import bridge
from .bridge import keep, kept, maybe, op_backend, pooled, stream_of, tensor, through_relu, \
    view

_CONV = {2: (ops.conv2d, ops.conv2d_backward_data, ops.conv2d_backward_filter),
         3: (ops.conv3d, ops.conv3d_backward_data, ops.conv3d_backward_filter)}
_TRANSPOSE = {2: ops.conv_transpose2d, 3: ops.conv_transpose3d}
_POOL = {2: (ops.pool2d, ops.pool2d_backward), 3: (ops.pool3d, ops.pool3d_backward)}


def _grad(ctx, dy):
    """(stream, the upstream gradient as an op argument)."""
    s = stream_of(dy)
    return s, view(dy, s)


def _fused(activation):
    """The keywords of a fused relu: none for a plain call (its memo signature stays the plain
    call's). With a relu the output is saved too: its sign is the relu's slope."""
    return {} if activation is None else {"activation": activation}


class Conv(torch.autograd.Function):
    """``Conv.apply(x, w, bias, nd, stride, padding, dilation, groups, backend[,
    activation])``: PyTorch's ``conv2d``/``conv3d`` (cross-correlation, zero padding given per
    spatial dim); ``activation`` "relu" (positional, as every apply argument): relu(conv(x) +
    bias) in one op call (dnnkit.torch.fuse)."""

    @staticmethod
    @pooled
    def forward(ctx, x, w, bias, nd, stride, padding, dilation, groups, backend,
                activation=None):
        s = stream_of(x)
        fwd = _CONV[nd][0]
        kw = dict(stride=stride, padding=padding, dilation=dilation, groups=groups,
                  backend=op_backend(backend), stream=s)
        xv, wv = view(x, s), view(w, s)
        y = fwd(xv, wv, view(bias, s), **kw, **_fused(activation))
        out = tensor(y, x)
        if activation is None:
            ctx.save_for_backward(x, w)
            keep(ctx, s, (xv, wv), (x, w))
        else:
            ctx.save_for_backward(x, w, out)
            keep(ctx, s, (xv, wv, y), (x, w, out))
        ctx.nd, ctx.kw, ctx.has_bias, ctx.activation = nd, kw, bias is not None, activation
        return out

    @staticmethod
    @pooled
    def backward(ctx, dy):
        saved = ctx.saved_tensors
        x, w = saved[0], saved[1]
        s, g = _grad(ctx, dy)
        kw = dict(ctx.kw, stream=s)
        _, bwd_data, bwd_filter = _CONV[ctx.nd]
        xv, wv, *yv = kept(ctx, s, *saved)
        g = through_relu(ctx.activation, yv[0] if yv else None, g, kw["backend"], s)
        dx = dw = db = None
        if ctx.needs_input_grad[0]:
            dx = tensor(bwd_data(g, wv, tuple(x.shape), **kw), x)
        if ctx.needs_input_grad[1]:
            dw = tensor(bwd_filter(xv, g, tuple(w.shape), **kw), w)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = tensor(ops.conv_backward_bias(g, backend=kw["backend"], stream=s), w)
        return dx, dw, db, None, None, None, None, None, None, None


class ConvTranspose(torch.autograd.Function):
    """``ConvTranspose.apply(x, w, bias, nd, stride, padding, output_padding, dilation, groups,
    backend)``: PyTorch's ``conv_transpose2d``/``3d`` (w (C_in, C_out/groups, *kernel)). The
    gradient needs output_padding < stride in every dim (else the convolution of dy's shape
    is not x's)."""

    @staticmethod
    @pooled
    def forward(ctx, x, w, bias, nd, stride, padding, output_padding, dilation, groups,
                backend):
        for op_, st in zip(output_padding, stride):
            if op_ >= st:
                raise ValueError(f"conv_transpose{nd}d: output_padding {output_padding} must "
                                 f"be smaller than stride {stride} in every dim for the "
                                 f"gradient (dnnkit.torch)")
        s = stream_of(x)
        kw = dict(stride=stride, padding=padding, dilation=dilation, groups=groups,
                  backend=op_backend(backend), stream=s)
        xv, wv = view(x, s), view(w, s)
        y = _TRANSPOSE[nd](xv, wv, view(bias, s), output_padding=output_padding, **kw)
        ctx.save_for_backward(x, w)
        keep(ctx, s, (xv, wv), (x, w))
        ctx.nd, ctx.kw, ctx.has_bias = nd, kw, bias is not None
        return tensor(y, x)

    @staticmethod
    @pooled
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        s, g = _grad(ctx, dy)
        kw = dict(ctx.kw, stream=s)
        fwd, _, bwd_filter = _CONV[ctx.nd]
        xv, wv = kept(ctx, s, x, w)
        dx = dw = db = None
        if ctx.needs_input_grad[0]:
            dx = tensor(fwd(g, wv, **kw), x)
        if ctx.needs_input_grad[1]:
            dw = tensor(bwd_filter(g, xv, tuple(w.shape), **kw), w)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = tensor(ops.conv_backward_bias(g, backend=kw["backend"], stream=s), w)
        return dx, dw, db, None, None, None, None, None, None, None


class Pool(torch.autograd.Function):
    """``Pool.apply(x, nd, window, stride, padding, mode, ceil_mode, backend)``: max or average
    pooling; ``window=None`` pools each channel whole (global average pooling)."""

    @staticmethod
    @pooled
    def forward(ctx, x, nd, window, stride, padding, mode, ceil_mode, backend):
        s = stream_of(x)
        if window is None:
            window = stride = tuple(x.shape[2:])
        kw = dict(ceil_mode=ceil_mode, backend=op_backend(backend), stream=s)
        xv = view(x, s)
        y = _POOL[nd][0](xv, window, stride, padding, mode, **kw)
        out = tensor(y, x)
        ctx.save_for_backward(x, out)
        keep(ctx, s, (xv, y), (x, out))
        ctx.args, ctx.kw, ctx.nd = (window, stride, padding, mode), kw, nd
        return out

    @staticmethod
    @pooled
    def backward(ctx, dy):
        x, y = ctx.saved_tensors
        s, g = _grad(ctx, dy)
        xv, yv = kept(ctx, s, x, y)
        dx = _POOL[ctx.nd][1](xv, yv, g, *ctx.args, **dict(ctx.kw, stream=s))
        return tensor(dx, x), None, None, None, None, None, None, None


class Linear(torch.autograd.Function):
    """``Linear.apply(x, w, bias, backend[, activation])``: y = x @ w.T + bias over x's last
    axis; ``activation`` "relu" as Conv's."""

    @staticmethod
    @pooled
    def forward(ctx, x, w, bias, backend, activation=None):
        s = stream_of(x)
        b = op_backend(backend)
        y = ops.linear(view(x, s), view(w, s), view(bias, s), backend=b, stream=s,
                       **_fused(activation))
        out = tensor(y, x)
        ctx.save_for_backward(x, w, *(() if activation is None else (out,)))
        ctx.backend, ctx.has_bias, ctx.activation = b, bias is not None, activation
        return out

    @staticmethod
    @pooled
    def backward(ctx, dy):
        x, w, *y = ctx.saved_tensors
        s = stream_of(dy)
        rows, out_f = math.prod(tuple(x.shape)[:-1]), w.shape[0]
        kw = dict(backend=ctx.backend, stream=s)
        g = through_relu(ctx.activation, view(y[0].reshape(rows, out_f), s) if y else None,
                         view(dy.reshape(rows, out_f), s), ctx.backend, s)
        dx = dw = db = None
        if ctx.needs_input_grad[0]:
            dx = tensor(ops.matmul(g, view(w, s), **kw), x).reshape(x.shape)
        if ctx.needs_input_grad[1]:
            dw = tensor(ops.matmul(g, view(x.reshape(rows, w.shape[1]), s), True, False,
                                      **kw), w)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = tensor(ops.conv_backward_bias(reshaped(g, (rows, out_f, 1, 1)), **kw), w)
        return dx, dw, db, None, None


class AffineGrid(torch.autograd.Function):
    """``AffineGrid.apply(theta, size, backend)``: PyTorch's ``affine_grid(theta, size,
    align_corners=True)`` for 2-D (theta (N, 2, 3), size (N, C, H, W))."""

    @staticmethod
    @pooled
    def forward(ctx, theta, size, backend):
        s = stream_of(theta)
        ctx.backend = op_backend(backend)
        return tensor(ops.affine_grid(view(theta, s), tuple(size), backend=ctx.backend,
                                         stream=s), theta)

    @staticmethod
    @pooled
    def backward(ctx, dgrid):
        s, g = _grad(ctx, dgrid)
        return tensor(ops.affine_grid_backward(g, backend=ctx.backend, stream=s),
                      dgrid), None, None


class GridSample(torch.autograd.Function):
    """``GridSample.apply(img, grid, backend)``: PyTorch's ``grid_sample(img, grid,
    mode="bilinear", padding_mode="zeros", align_corners=True)``."""

    @staticmethod
    @pooled
    def forward(ctx, img, grid, backend):
        s = stream_of(img)
        ctx.backend = op_backend(backend)
        ctx.save_for_backward(img, grid)
        return tensor(ops.grid_sample(view(img, s), view(grid, s), backend=ctx.backend,
                                         stream=s), img)

    @staticmethod
    @pooled
    def backward(ctx, dy):
        img, grid = ctx.saved_tensors
        s, g = _grad(ctx, dy)
        dimg, dgrid = ops.grid_sample_backward(view(img, s), view(grid, s), g,
                                                  backend=ctx.backend, stream=s)
        return maybe(dimg, img), maybe(dgrid, grid), None


def _check_align(op, align_corners):
    if align_corners is not True:
        raise ValueError(f"dnnkit.torch.{op}: only align_corners=True (corner pixel centres "
                         f"at -1 and +1, cuDNN's spatial transformer) is supported; got "
                         f"align_corners={align_corners!r}")


def affine_grid(theta, size, align_corners=True, *, backend="auto"):
    """``torch.nn.functional.affine_grid`` on dnnkit (2-D, align_corners=True)."""
    _check_align("affine_grid", align_corners)
    bridge.check_backend("dnnkit.torch.affine_grid", backend)
    return bridge.function(AffineGrid, theta, tuple(size), backend)


def grid_sample(img, grid, mode="bilinear", padding_mode="zeros", align_corners=True, *,
                backend="auto"):
    """``torch.nn.functional.grid_sample`` on dnnkit (2-D, bilinear, zero padding,
    align_corners=True)."""
    if mode != "bilinear" or padding_mode != "zeros":
        raise ValueError(f"dnnkit.torch.grid_sample: only mode='bilinear' with "
                         f"padding_mode='zeros' is supported; got mode={mode!r}, "
                         f"padding_mode={padding_mode!r}")
    _check_align("grid_sample", align_corners)
    bridge.check_backend("dnnkit.torch.grid_sample", backend)
    return bridge.function(GridSample, img, grid, backend)


def spatial_transformer(img, theta, *, backend="auto"):
    """grid_sample(img, affine_grid(theta, img.shape)): the spatial transformer of an
    output the input's size, differentiable wrt img and theta."""
    return grid_sample(img, affine_grid(theta, tuple(img.shape), backend=backend),
                       backend=backend)
