"""Batch normalization, softmax and log-softmax, the activations and dropout as PyTorch custom
operators (dnnkit/torch/library.py describes the pattern: dnnkit's public ops on views of the
tensors on PyTorch's current stream, a fake kernel giving the output's shape and dtype, the
gradient written with backward operators).

    batch_norm_train(x, weight, bias, running_mean, running_var, eps, momentum)
        -> (y, mean, invstd, new running_mean, new running_var): functional, since PyTorch
        takes an autograd formula only for an operator that mutates nothing; dnnkit updates
        copies of the (C,) running statistics, which batch_norm_train_update copies back into
        the buffers; mean and invstd are (C,), float32 (float64 for float64 x), as dnnkit's;
        gradient: batch_norm_backward(x, dy, weight, mean, invstd) -> (dx, dgamma, dbeta)
    batch_norm_eval(x, weight, bias, running_mean, running_var, eps) -> y;
        gradient: batch_norm_eval_backward (functions_norm.py's BatchNormEval formulas)
    softmax(x, dim, log) -> y; gradient: softmax_backward(y, dy, dim, log)
    activation(x, mode, coef) -> y; gradient: activation_backward(x, y, dy, mode, coef)
    dropout(x, seed, p) -> y: the mask a pure function of the seed (a CPU int64 scalar tensor,
        drawn by the caller from PyTorch's generator), so the op is replayable and the
        gradient is the same op on dy: dx = dropout(dy, seed, p) = dy * mask / (1 - p). On
        Numba the mask is a counter-based hash of (seed, index); on cuDNN a seed with offset 0
        restores the RNG states the seed initialised (cudnn/dropout.py), so both draw the
        forward's mask again. Nothing is kept between forward and backward but the seed.
"""

from typing import Optional, Sequence, Tuple

import torch
from torch import Tensor

from .. import ops
from . import bridge
from .bridge import op_backend, stream_of, tensor, view
from .library import custom_op

_NOT = (None,)


def _acc(x):
    """dnnkit's parameter and statistics dtype for x: float64 for float64, else float32."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _gamma_beta(x, weight, bias, s):
    c = x.shape[1]
    like = torch.empty((), dtype=_acc(x))
    g = view(weight, s) if weight is not None else bridge.constant([1.0] * c, like)
    b = view(bias, s) if bias is not None else bridge.constant([0.0] * c, like)
    return g, b


def _channels(op, x):
    if x.dim() < 2:
        raise ValueError(f"{op}: x must be (N, C, *spatial); got shape {tuple(x.shape)}")
    return x.shape[1]


# ---------------------------------------------------------------- batch norm, training

@custom_op("dnnkit::batch_norm_train", mutates_args=())
def batch_norm_train(x: Tensor, weight: Optional[Tensor], bias: Optional[Tensor],
                     running_mean: Optional[Tensor], running_var: Optional[Tensor], eps: float,
                     momentum: float, backend: str) -> Tuple[Tensor, Tensor, Tensor, Tensor,
                                                             Tensor]:
    """Batch statistics: (y, mean, invstd, the updated running mean and variance, or empty
    tensors without running statistics). Functional (PyTorch takes an autograd formula only
    for an operator that mutates nothing): dnnkit updates copies of the running statistics,
    which :func:`batch_norm_train_update` copies back into the buffers."""
    s = stream_of(x)
    with bridge.graph_pool():
        g, b = _gamma_beta(x, weight, bias, s)
        if running_mean is None:
            rm = rv = x.new_empty((0,), dtype=_acc(x))
            new = (rm, rv.clone())
        else:
            rm, rv = running_mean.clone(), running_var.clone()
            new = (rm, rv)
        # the op writes the updated statistics into the copies' memory
        y, mean, invstd = ops.batch_norm_train(
            view(x, s), g, b, epsilon=eps, momentum=momentum,
            running_mean=view(rm, s) if running_mean is not None else None,
            running_var=view(rv, s) if running_mean is not None else None,
            backend=op_backend(backend), stream=s)
    return (tensor(y, x), tensor(mean, x), tensor(invstd, x)) + new


@batch_norm_train.register_fake
def _batch_norm_train_fake(x, weight, bias, running_mean, running_var, eps, momentum, backend):
    c = _channels("dnnkit::batch_norm_train", x)
    if running_mean is None:
        new = (x.new_empty((0,), dtype=_acc(x)), x.new_empty((0,), dtype=_acc(x)))
    else:
        new = (running_mean.new_empty(running_mean.shape),
               running_var.new_empty(running_var.shape))
    return (x.new_empty(x.shape), x.new_empty((c,), dtype=_acc(x)),
            x.new_empty((c,), dtype=_acc(x))) + new


def batch_norm_train_update(x, weight, bias, running_mean, running_var, eps, momentum,
                            backend):
    """batch_norm_train's y, the running statistics (or None) updated in place."""
    y, _, _, rm, rv = batch_norm_train(x, weight, bias, running_mean, running_var, eps,
                                       momentum, backend)
    if running_mean is not None:
        with torch.no_grad():
            running_mean.copy_(rm)
            running_var.copy_(rv)
    return y


@custom_op("dnnkit::batch_norm_backward", mutates_args=())
def batch_norm_backward(x: Tensor, dy: Tensor, weight: Optional[Tensor], mean: Tensor,
                        invstd: Tensor, eps: float, backend: str) -> Tuple[Tensor, Tensor, Tensor]:
    """(dx, dgamma, dbeta) of batch_norm_train from its saved mean and invstd."""
    s = stream_of(dy)
    with bridge.graph_pool():
        g, _ = _gamma_beta(x, weight, None, s)
        dx, dgamma, dbeta = ops.batch_norm_backward(view(x, s), view(dy, s), g, view(mean, s),
                                                    view(invstd, s), epsilon=eps,
                                                    backend=op_backend(backend), stream=s)
    return tensor(dx, x), tensor(dgamma, mean), tensor(dbeta, mean)


@batch_norm_backward.register_fake
def _batch_norm_backward_fake(x, dy, weight, mean, invstd, eps, backend):
    c = _channels("dnnkit::batch_norm_backward", x)
    return x.new_empty(x.shape), mean.new_empty((c,)), mean.new_empty((c,))


def _train_setup(ctx, inputs, output):
    x, weight, bias, _, _, eps, _, backend = inputs
    _, mean, invstd, rm, rv = output
    ctx.mark_non_differentiable(mean, invstd, rm, rv)
    ctx.save_for_backward(x, weight, mean, invstd)
    ctx.eps, ctx.backend, ctx.has_bias = eps, backend, bias is not None


def _train_grad(ctx, dy, *_statistics):
    x, weight, mean, invstd = ctx.saved_tensors
    dx, dgamma, dbeta = batch_norm_backward(x, dy, weight, mean, invstd, ctx.eps, ctx.backend)
    return (dx if ctx.needs_input_grad[0] else None,
            dgamma if weight is not None and ctx.needs_input_grad[1] else None,
            dbeta if ctx.has_bias and ctx.needs_input_grad[2] else None) + _NOT * 5


batch_norm_train.register_autograd(_train_grad, setup_context=_train_setup)


# ---------------------------------------------------------------- batch norm, evaluation

@custom_op("dnnkit::batch_norm_eval", mutates_args=())
def batch_norm_eval(x: Tensor, weight: Optional[Tensor], bias: Optional[Tensor],
                    running_mean: Tensor, running_var: Tensor, eps: float,
                    backend: str) -> Tensor:
    """Normalisation by the given statistics (no gradient reaches them)."""
    s = stream_of(x)
    with bridge.graph_pool():
        g, b = _gamma_beta(x, weight, bias, s)
        y = ops.batch_norm_inference(view(x, s), g, b, view(running_mean, s),
                                     view(running_var, s), epsilon=eps,
                                     backend=op_backend(backend), stream=s)
    return tensor(y, x)


@batch_norm_eval.register_fake
def _batch_norm_eval_fake(x, weight, bias, running_mean, running_var, eps, backend):
    _channels("dnnkit::batch_norm_eval", x)
    return x.new_empty(x.shape)


@custom_op("dnnkit::batch_norm_eval_backward", mutates_args=())
def batch_norm_eval_backward(x: Tensor, dy: Tensor, weight: Optional[Tensor],
                             running_mean: Tensor, running_var: Tensor, eps: float,
                             needs: Sequence[bool], backend: str) -> Tuple[Tensor, Tensor, Tensor]:
    """(dx, dgamma, dbeta) of batch_norm_eval; with r = 1/sqrt(var + eps): dx = dy * gamma * r,
    dgamma = sum(dy * (x - mean) * r), dbeta = sum(dy) over N and space. A gradient
    ``needs`` does not ask for is an empty tensor."""
    s = stream_of(dy)
    kw = dict(backend=op_backend(backend), stream=s)
    c = x.shape[1]
    bshape = (1, c) + (1,) * (x.dim() - 2)
    axes = (0,) + tuple(range(2, x.dim()))
    rv = running_var
    dx, dgamma, dbeta = x.new_empty((0,)), rv.new_empty((0,)), rv.new_empty((0,))
    with bridge.graph_pool():
        g, _ = _gamma_beta(x, weight, None, s)
        one = view(torch.ones((1, c), dtype=rv.dtype, device=rv.device), s)
        ones, zeros = bridge.constant([1.0] * c, rv), bridge.constant([0.0] * c, rv)
        # r: batch_norm_inference of x = 1 with mean 0, gamma 1, beta 0
        r = ops.reshape(ops.batch_norm_inference(one, ones, zeros, zeros, view(rv, s),
                                                 epsilon=eps, **kw), bshape, **kw)
        gy, xv = view(dy, s), view(x, s)
        if needs[0]:
            scale = ops.multiply(r, ops.reshape(g, bshape, **kw), **kw)
            dx = tensor(ops.multiply(gy, scale, **kw), x)
        if needs[1]:
            xhat = ops.multiply(ops.subtract(xv, ops.reshape(view(running_mean, s), bshape,
                                                             **kw), **kw), r, **kw)
            dgamma = tensor(ops.sum(ops.multiply(gy, xhat, **kw), axes, **kw), rv)
        if needs[2]:
            dbeta = tensor(ops.sum(gy, axes, **kw), rv)
    return dx, dgamma, dbeta


@batch_norm_eval_backward.register_fake
def _batch_norm_eval_backward_fake(x, dy, weight, running_mean, running_var, eps, needs,
                                   backend):
    c = _channels("dnnkit::batch_norm_eval_backward", x)
    rv = running_var
    return (x.new_empty(x.shape if needs[0] else (0,)), rv.new_empty((c,) if needs[1] else (0,)),
            rv.new_empty((c,) if needs[2] else (0,)))


def _eval_setup(ctx, inputs, output):
    x, weight, bias, rm, rv, eps, backend = inputs
    ctx.save_for_backward(x, weight, rm, rv)
    ctx.eps, ctx.backend, ctx.has_bias = eps, backend, bias is not None


def _eval_grad(ctx, dy):
    x, weight, rm, rv = ctx.saved_tensors
    need = ctx.needs_input_grad
    needs = [bool(need[0]), weight is not None and bool(need[1]),
             ctx.has_bias and bool(need[2])]
    dx, dgamma, dbeta = batch_norm_eval_backward(x, dy, weight, rm, rv, ctx.eps, needs,
                                                 ctx.backend)
    return (dx if needs[0] else None, dgamma if needs[1] else None,
            dbeta if needs[2] else None) + _NOT * 4


batch_norm_eval.register_autograd(_eval_grad, setup_context=_eval_setup)


# ---------------------------------------------------------------- softmax, log-softmax

def _as_4d(op, shape, dim):
    """x's shape as (outer, C, inner, 1) for a softmax over ``dim`` (channel mode, no copy)."""
    rank = max(len(shape), 1)
    if not -rank <= dim < rank:
        raise ValueError(f"{op}: dim {dim} is out of range for x of shape {tuple(shape)}")
    if not shape:
        return (1, 1, 1, 1)
    d = dim % rank
    outer = inner = 1
    for v in shape[:d]:
        outer = outer * v
    for v in shape[d + 1:]:
        inner = inner * v
    return (outer, shape[d], inner, 1)


@custom_op("dnnkit::softmax", mutates_args=())
def softmax(x: Tensor, dim: int, log: bool, backend: str) -> Tensor:
    """softmax (log-softmax for ``log``) over ``dim``."""
    s = stream_of(x)
    shape = _as_4d("dnnkit::softmax", tuple(x.shape), dim)
    with bridge.graph_pool():
        y = ops.softmax(view(x.reshape(shape), s), "log" if log else "accurate", "channel",
                        backend=op_backend(backend), stream=s)
    return tensor(y, x).reshape(x.shape)


@softmax.register_fake
def _softmax_fake(x, dim, log, backend):
    _as_4d("dnnkit::softmax", tuple(x.shape), dim)
    return x.new_empty(x.shape)


@custom_op("dnnkit::softmax_backward", mutates_args=())
def softmax_backward(y: Tensor, dy: Tensor, dim: int, log: bool, backend: str) -> Tensor:
    """dx of softmax from y and dy."""
    s = stream_of(dy)
    shape = _as_4d("dnnkit::softmax_backward", tuple(y.shape), dim)
    with bridge.graph_pool():
        dx = ops.softmax_backward(view(y.reshape(shape), s), view(dy.reshape(shape), s),
                                  "log" if log else "accurate", "channel",
                                  backend=op_backend(backend), stream=s)
    return tensor(dx, y).reshape(y.shape)


@softmax_backward.register_fake
def _softmax_backward_fake(y, dy, dim, log, backend):
    return y.new_empty(y.shape)


def _softmax_setup(ctx, inputs, output):
    ctx.save_for_backward(output)
    ctx.args = inputs[1:]


def _softmax_grad(ctx, dy):
    (y,) = ctx.saved_tensors
    return (softmax_backward(y, dy, *ctx.args),) + _NOT * 3


softmax.register_autograd(_softmax_grad, setup_context=_softmax_setup)


# ---------------------------------------------------------------- activations

@custom_op("dnnkit::activation", mutates_args=())
def activation(x: Tensor, mode: str, coef: float, backend: str) -> Tensor:
    """dnnkit's activation modes (relu, clipped_relu, tanh, sigmoid, elu, swish, ...)."""
    s = stream_of(x)
    with bridge.graph_pool():
        y = ops.activation(view(x, s), mode, coef, backend=op_backend(backend), stream=s)
    return tensor(y, x)


@activation.register_fake
def _activation_fake(x, mode, coef, backend):
    return x.new_empty(x.shape)


@custom_op("dnnkit::activation_backward", mutates_args=())
def activation_backward(x: Tensor, y: Tensor, dy: Tensor, mode: str, coef: float,
                        backend: str) -> Tensor:
    """dx = dy * f'(x) of activation."""
    s = stream_of(dy)
    with bridge.graph_pool():
        dx = ops.activation_backward(view(x, s), view(y, s), view(dy, s), mode, coef,
                                     backend=op_backend(backend), stream=s)
    return tensor(dx, x)


@activation_backward.register_fake
def _activation_backward_fake(x, y, dy, mode, coef, backend):
    return x.new_empty(x.shape)


def _activation_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0], output)
    ctx.args = inputs[1:]


def _activation_grad(ctx, dy):
    x, y = ctx.saved_tensors
    return (activation_backward(x, y, dy, *ctx.args),) + _NOT * 3


activation.register_autograd(_activation_grad, setup_context=_activation_setup)


# ---------------------------------------------------------------- dropout

def draw_seed():
    """A dropout seed in [0, 2**62) from PyTorch's default CPU generator, as a CPU int64
    scalar tensor (bridge.seed's draw, without reading it on the host: torch.compile traces
    it into the graph)."""
    return torch.randint(0, 2**62, (), dtype=torch.int64)


def _seed(seed):
    if seed.device.type != "cpu" or seed.dtype != torch.int64 or seed.numel() != 1:
        raise TypeError(f"dnnkit::dropout: seed must be a CPU int64 tensor of one element (read "
                        f"on the host without a device wait); got {seed.dtype} of shape "
                        f"{tuple(seed.shape)} on {seed.device}")
    return int(seed.item())


@custom_op("dnnkit::dropout", mutates_args=())
def dropout(x: Tensor, seed: Tensor, p: float, backend: str) -> Tensor:
    """y = x * mask / (1 - p), the mask a function of ``seed`` alone (0 < p < 1)."""
    s = stream_of(x)
    with bridge.graph_pool():
        y, _ = ops.dropout(view(x, s), p, seed=_seed(seed), backend=op_backend(backend),
                           stream=s)
    return tensor(y, x)


@dropout.register_fake
def _dropout_fake(x, seed, p, backend):
    return x.new_empty(x.shape)


def _dropout_setup(ctx, inputs, output):
    _, seed, p, backend = inputs
    ctx.save_for_backward(seed)
    ctx.p, ctx.backend = p, backend


def _dropout_grad(ctx, dy):
    (seed,) = ctx.saved_tensors
    return dropout(dy, seed, ctx.p, ctx.backend), None, None, None


dropout.register_autograd(_dropout_grad, setup_context=_dropout_setup)
