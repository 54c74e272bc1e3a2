"""Batch normalization, softmax and log-softmax, the activations and dropout as
``torch.autograd.Function``s running dnnkit's ops (dnnkit/torch/functions.py describes the
pattern: dnnkit's public ops on views of PyTorch's tensors, on PyTorch's current stream).

    batch norm, training:  y, mean, invstd = batch_norm_train(x, gamma, beta, running stats
                           updated in place in PyTorch's buffers); backward:
                           batch_norm_backward(x, dy, gamma, mean, invstd)
    batch norm, eval:      y = batch_norm_inference(x, gamma, beta, running_mean, running_var);
                           with r = 1/sqrt(var + eps) (batch_norm_inference of ones):
                           dx = dy * gamma * r, dgamma = sum(dy * (x - mean) * r), dbeta =
                           sum(dy), the sums over N and space (multiply, subtract, sum)
    softmax over dim d:    x viewed as (outer, C, inner, 1), channel mode: any dim, no copy;
                           dx = softmax_backward(y, dy, algo)
    activation:            y = activation(x, mode, coef), dx = activation_backward(x, y, dy)
    dropout:               y, state = dropout(x, p, seed drawn from PyTorch's CPU generator);
                           dx = dropout_backward(dy, state), on the backend that made the mask
"""

from __future__ import annotations

import math

import torch

from .. import ops

from . import bridge
from .bridge import held, keep, kept, op_backend, pooled, stream_of, tensor, through_relu, \
    view

try:        # the custom operators, what torch.compile traces (PyTorch >= 2.4)
    from . import library_norm
except ImportError:
    library_norm = None


def _traced():
    return library_norm is not None and bridge.compiling()


def _gamma_beta(x, weight, bias, s):
    """The scale and shift as op arguments: the affine parameters, or ones and zeros (cached
    constants) for affine=False."""
    if weight is not None and bias is not None:
        return view(weight, s), view(bias, s)
    c = x.shape[1]
    like = torch.empty((), dtype=torch.float64 if x.dtype == torch.float64 else torch.float32)
    g = view(weight, s) if weight is not None else bridge.constant([1.0] * c, like)
    b = view(bias, s) if bias is not None else bridge.constant([0.0] * c, like)
    return g, b


def _fused(residual, activation, s):
    """The fused-tail keywords of the batch-norm ops (none for a plain call: the memo's
    signature stays the plain call's)."""
    if residual is None and activation is None:
        return {}
    return dict(activation=activation, residual=view(residual, s))


def _save(ctx, s, x, weight, xv, y, out, activation, *more):
    """What a batch-norm Function's backward reads: saved x, weight, with a fused relu the
    output (its sign is relu's slope; else None) and ``more``; kept x's view (and the
    output's array)."""
    if activation is None:
        ctx.save_for_backward(x, weight, None, *more)
        keep(ctx, s, (xv,), (x,))
    else:
        ctx.save_for_backward(x, weight, out, *more)
        keep(ctx, s, (xv, y), (x, out))


class BatchNormTrain(torch.autograd.Function):
    """``BatchNormTrain.apply(x, weight, bias, running_mean, running_var, eps, momentum,
    backend[, residual, activation])``: batch statistics; the running ones (or None) updated
    in place. ``residual`` (x's shape) is added and ``activation`` ("relu") applied in the
    same op call, relu(bn(x) + residual) (dnnkit.torch.fuse; positional, as every apply
    argument)."""

    @staticmethod
    @pooled
    def forward(ctx, x, weight, bias, running_mean, running_var, eps, momentum, backend,
                residual=None, activation=None):
        s = stream_of(x)
        b = op_backend(backend)
        g, be = _gamma_beta(x, weight, bias, s)
        rm = rv = None
        if running_mean is not None:
            # views of PyTorch's buffers: the op writes the updated statistics into them
            rm, rv = held(running_mean, s), held(running_var, s)
        xv = view(x, s)
        y, mean, invstd = ops.batch_norm_train(xv, g, be, epsilon=eps, momentum=momentum,
                                                  running_mean=rm, running_var=rv, backend=b,
                                                  stream=s, **_fused(residual, activation, s))
        out = tensor(y, x)
        _save(ctx, s, x, weight, xv, y, out, activation)
        ctx.saved = (mean, invstd, g, weight)   # g may be weight's kept view: not holding it
        ctx.eps, ctx.backend, ctx.fused = eps, b, (activation, residual is not None)
        return out

    @staticmethod
    @pooled
    def backward(ctx, dy):
        saved = ctx.saved_tensors
        x, weight = saved[0], saved[1]
        mean, invstd, g, _ = ctx.saved
        act, res = ctx.fused
        s = stream_of(dy)
        if act is None:
            (xv,) = kept(ctx, s, x)
            tail = {"residual": True} if res else {}
        else:
            xv, yv = kept(ctx, s, x, saved[2])
            tail = dict(activation=act, y=yv, residual=res)
        grads = ops.batch_norm_backward(xv, view(dy, s), g, mean, invstd, epsilon=ctx.eps,
                                        backend=ctx.backend, stream=s, **tail)
        affine = weight is not None
        return (tensor(grads[0], x) if ctx.needs_input_grad[0] else None,
                tensor(grads[1], weight) if affine and ctx.needs_input_grad[1] else None,
                tensor(grads[2], weight) if affine and ctx.needs_input_grad[2] else None,
                None, None, None, None, None,
                tensor(grads[3], x) if res and ctx.needs_input_grad[8] else None, None)


class BatchNormEval(torch.autograd.Function):
    """``BatchNormEval.apply(x, weight, bias, running_mean, running_var, eps, backend[,
    residual, activation])``: normalisation by the given statistics (no gradient
    reaches them); ``residual`` and ``activation`` as BatchNormTrain's."""

    @staticmethod
    @pooled
    def forward(ctx, x, weight, bias, running_mean, running_var, eps, backend,
                residual=None, activation=None):
        s = stream_of(x)
        b = op_backend(backend)
        g, be = _gamma_beta(x, weight, bias, s)
        xv = view(x, s)
        y = ops.batch_norm_inference(xv, g, be, held(running_mean, s), held(running_var, s),
                                     epsilon=eps, backend=b, stream=s,
                                     **_fused(residual, activation, s))
        out = tensor(y, x)
        _save(ctx, s, x, weight, xv, y, out, activation, running_mean, running_var)
        ctx.eps, ctx.backend, ctx.g = eps, b, (g, weight)      # (as BatchNormTrain's)
        ctx.fused = (activation, residual is not None)
        return out

    @staticmethod
    @pooled
    def backward(ctx, dy):
        x, weight, y, rm, rv = ctx.saved_tensors
        act, res = ctx.fused
        if x.dtype != rv.dtype:     # (dnnkit's own gradient rule says the same)
            raise RuntimeError(
                f"dnnkit.torch batch norm in eval mode: the gradient of {x.dtype} data with "
                f"{rv.dtype} statistics is not supported (dnnkit's element-wise ops take one "
                f"dtype); freeze the layer (requires_grad False on its input and parameters), "
                f"train it in train mode, or exclude it from convert()")
        s = stream_of(dy)
        kw = dict(backend=ctx.backend, stream=s)
        xv, *yv = kept(ctx, s, x, *(() if act is None else (y,)))
        g = through_relu(act, yv[0] if yv else None, view(dy, s), ctx.backend, s)
        c = x.shape[1]
        bshape = (1, c) + (1,) * (x.dim() - 2)
        axes = (0,) + tuple(range(2, x.dim()))
        like = rv
        one = view(torch.ones((1, c), dtype=like.dtype, device=like.device), s)
        ones, zeros = bridge.constant([1.0] * c, like), bridge.constant([0.0] * c, like)
        # r = 1/sqrt(var + eps): batch_norm_inference of x = 1 with mean 0, gamma 1, beta 0
        r = ops.reshape(ops.batch_norm_inference(one, ones, zeros, zeros, view(rv, s),
                                                       epsilon=ctx.eps, **kw), bshape, **kw)
        dx = dgamma = dbeta = None
        if ctx.needs_input_grad[0]:
            scale = ops.multiply(r, ops.reshape(ctx.g[0], bshape, **kw), **kw)
            dx = tensor(ops.multiply(g, scale, **kw), x)
        if weight is not None and ctx.needs_input_grad[1]:
            xhat = ops.multiply(ops.subtract(xv, ops.reshape(view(rm, s), bshape,
                                                                      **kw), **kw), r, **kw)
            dgamma = tensor(ops.sum(ops.multiply(g, xhat, **kw), axes, **kw), weight)
        if weight is not None and ctx.needs_input_grad[2]:
            dbeta = tensor(ops.sum(g, axes, **kw), weight)
        dz = None
        if res and ctx.needs_input_grad[7]:     # d(bn(x) + z)/dz: dy (through relu's slope)
            dz = dy if act is None else tensor(g, x)
        return dx, dgamma, dbeta, None, None, None, None, dz, None


def _as_4d(x, dim):
    """x's shape as (outer, C, inner, 1) for a softmax over ``dim`` (channel mode)."""
    shape = tuple(x.shape)
    d = dim % len(shape) if shape else 0
    return (math.prod(shape[:d]), shape[d] if shape else 1, math.prod(shape[d + 1:]), 1)


class Softmax(torch.autograd.Function):
    """``Softmax.apply(x, dim, log, backend)``: softmax (or log-softmax) over ``dim``."""

    @staticmethod
    @pooled
    def forward(ctx, x, dim, log, backend):
        s = stream_of(x)
        b = op_backend(backend)
        algo = "log" if log else "accurate"
        y = ops.softmax(view(x.reshape(_as_4d(x, dim)), s), algo, "channel", backend=b,
                           stream=s)
        out = tensor(y, x).reshape(x.shape)
        ctx.save_for_backward(out)
        ctx.algo, ctx.backend, ctx.dim = algo, b, dim
        return out

    @staticmethod
    @pooled
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        s = stream_of(dy)
        shape = _as_4d(y, ctx.dim)
        dx = ops.softmax_backward(view(y.reshape(shape), s), view(dy.reshape(shape), s),
                                     ctx.algo, "channel", backend=ctx.backend, stream=s)
        return tensor(dx, y).reshape(y.shape), None, None, None


class Activation(torch.autograd.Function):
    """``Activation.apply(x, mode, coef, backend)``: dnnkit's activation modes (relu,
    clipped_relu, tanh, sigmoid, elu, swish)."""

    @staticmethod
    @pooled
    def forward(ctx, x, mode, coef, backend):
        s = stream_of(x)
        b = op_backend(backend)
        xv = view(x, s)
        y = ops.activation(xv, mode, coef, backend=b, stream=s)
        out = tensor(y, x)
        ctx.save_for_backward(x, out)
        keep(ctx, s, (xv, y), (x, out))
        ctx.mode, ctx.coef, ctx.backend = mode, coef, b
        return out

    @staticmethod
    @pooled
    def backward(ctx, dy):
        x, y = ctx.saved_tensors
        s = stream_of(dy)
        xv, yv = kept(ctx, s, x, y)
        dx = ops.activation_backward(xv, yv, view(dy, s), ctx.mode,
                                        ctx.coef, backend=ctx.backend, stream=s)
        return tensor(dx, x), None, None, None


class Dropout(torch.autograd.Function):
    """``Dropout.apply(x, p, backend)``: y = x * mask / (1 - p), the mask dnnkit's (seeded from
    PyTorch's generator); 0 < p < 1."""

    @staticmethod
    @pooled
    def forward(ctx, x, p, backend):
        s = stream_of(x)
        y, state = ops.dropout(view(x, s), p, seed=bridge.seed(), backend=op_backend(backend),
                                  stream=s)
        ctx.state = state
        return tensor(y, x)

    @staticmethod
    @pooled
    def backward(ctx, dy):
        s = stream_of(dy)
        state = ctx.state
        dx = ops.dropout_backward(view(dy, s), state, backend=state.backend, stream=s)
        return tensor(dx, dy), None, None


def activation(x, mode="relu", coef=0.0, *, backend="auto"):
    """dnnkit's ``activation`` on a PyTorch tensor, differentiable."""
    bridge.check_backend("dnnkit.torch.activation", backend)
    if _traced():
        return library_norm.activation(x, mode, float(coef), backend)
    return Activation.apply(x, mode, float(coef), backend)


def softmax(x, dim, *, backend="auto"):
    """``torch.softmax(x, dim)`` on dnnkit, differentiable."""
    bridge.check_backend("dnnkit.torch.softmax", backend)
    if _traced():
        return library_norm.softmax(x, dim, False, backend)
    return Softmax.apply(x, dim, False, backend)


def log_softmax(x, dim, *, backend="auto"):
    """``torch.log_softmax(x, dim)`` on dnnkit, differentiable."""
    bridge.check_backend("dnnkit.torch.log_softmax", backend)
    if _traced():
        return library_norm.softmax(x, dim, True, backend)
    return Softmax.apply(x, dim, True, backend)


def dropout(x, p=0.5, training=True, *, backend="auto"):
    """``torch.nn.functional.dropout`` on dnnkit: identity when not training or p == 0;
    p must be in [0, 1)."""
    bridge.check_backend("dnnkit.torch.dropout", backend)
    if not training or p == 0:
        return x
    if _traced():
        return library_norm.dropout(x, library_norm.draw_seed(), float(p), backend)
    return Dropout.apply(x, float(p), backend)
