"""dnnkit's layers as PyTorch custom operators (``torch.library``), so that ``torch.compile``
traces a converted model through them: convolution (2-D, 3-D), transposed convolution,
pooling and linear here; batch normalization, softmax, the activations and dropout in
library_norm.py.

Each operator ``dnnkit::<name>`` has
- a kernel: dnnkit's public op (the dispatcher: ``dnn.enabled``, ``backend=``, ``trace()``,
  ``profile()``, ``dnn.crosscheck`` and the memo apply) on views of the tensors, on PyTorch's
  current stream, the output a tensor over dnnkit's pool memory (dnnkit/torch/bridge.py): no
  copies, the same calls as the ``torch.autograd.Function``s of functions.py;
- a fake kernel (``register_fake``, also the meta kernel): the output's shape from dnnkit's own
  shape rules (ops/conv_args.py ``make_geom``, ops/conv_transpose.py ``output_size``,
  ops/pool_args.py ``make_geom``), which check the arguments as the op does; outputs are
  contiguous, of the input's dtype and device, as the kernels' are;
- its gradient (``register_autograd``) written with the backward operators, themselves custom
  operators, so AOTAutograd traces the backward too:

    conv:            dx = conv_backward_data(dy, w), dw = conv_backward_filter(x, dy),
                     db = conv_backward_bias(dy)
    conv_transpose:  dx = conv(dy, w), dw = conv_backward_filter(dy, x), db = bias grad
    pool:            dx = pool_backward(x, y, dy)
    linear:          dx = matmul(dy, w), dw = matmul(dy^T, x), db = conv_backward_bias(dy)

Non-tensor arguments are the schema's ints, floats, bools and strings; the backend is a
string ("auto", "cudnn", "numba"). Needs ``torch.library.custom_op`` (PyTorch >= 2.4); with an
older PyTorch importing this module raises ImportError and converted modules keep to the
autograd.Functions.
"""

from typing import Optional, Sequence

import torch
from torch import Tensor

if not hasattr(torch.library, "custom_op") or not hasattr(torch.library, "register_autograd"):
    raise ImportError(f"dnnkit.torch.library needs torch.library.custom_op (PyTorch >= 2.4); "
                      f"PyTorch {torch.__version__} has none")

from .. import ops  # noqa: E402
from ..ops import conv_args, conv_transpose as conv_transpose_rules, pool_args  # noqa: E402
from . import bridge  # noqa: E402
from .bridge import op_backend, stream_of, tensor, view  # noqa: E402

custom_op = torch.library.custom_op

_CONV = {2: (ops.conv2d, ops.conv2d_backward_data, ops.conv2d_backward_filter),
         3: (ops.conv3d, ops.conv3d_backward_data, ops.conv3d_backward_filter)}
_TRANSPOSE = {2: ops.conv_transpose2d, 3: ops.conv_transpose3d}
_POOL = {2: (ops.pool2d, ops.pool2d_backward), 3: (ops.pool3d, ops.pool3d_backward)}


def use(flag=None):
    """Whether a converted module or function runs these operators: ``flag`` when True or
    False; None (the default): while ``torch.compile`` traces (torch.compiler.is_compiling(),
    a constant to Dynamo), the lighter autograd.Functions in eager mode."""
    return torch.compiler.is_compiling() if flag is None else bool(flag)


def spatial_dims(op, t):
    """The number of spatial dims of ``t`` (N, C, *spatial) for a 2-D/3-D op, or ValueError."""
    nd = t.dim() - 2
    if nd not in (2, 3):
        raise ValueError(f"{op}: the input must be 4-D (N, C, H, W) or 5-D (N, C, D, H, W); got "
                         f"shape {tuple(t.shape)}")
    return nd


def _kw(stride, padding, dilation, groups, backend, s):
    return dict(stride=tuple(stride), padding=tuple(padding), dilation=tuple(dilation),
                groups=groups, backend=op_backend(backend), stream=s)


# ---------------------------------------------------------------- convolution

@custom_op("dnnkit::conv", mutates_args=())
def conv(x: Tensor, w: Tensor, bias: Optional[Tensor], stride: Sequence[int],
         padding: Sequence[int], dilation: Sequence[int], groups: int, backend: str) -> Tensor:
    """PyTorch's conv2d/conv3d (cross-correlation, zero padding per spatial dim)."""
    nd = spatial_dims("dnnkit::conv", x)
    s = stream_of(x)
    with bridge.graph_pool():
        y = _CONV[nd][0](view(x, s), view(w, s), view(bias, s),
                         **_kw(stride, padding, dilation, groups, backend, s))
    return tensor(y, x)


def conv_shape(x_shape, w_shape, stride, padding, dilation, groups):
    """The output shape of conv (dnnkit's geometry: its checks and rule)."""
    nd = len(x_shape) - 2
    geom = conv_args.make_geom(f"conv{nd}d", nd, tuple(x_shape), tuple(w_shape),
                               tuple(stride), tuple(padding), tuple(dilation), groups, "cross")
    return geom.user_shape(geom.y_shape)


@conv.register_fake
def _conv_fake(x, w, bias, stride, padding, dilation, groups, backend):
    spatial_dims("dnnkit::conv", x)
    return x.new_empty(conv_shape(x.shape, w.shape, stride, padding, dilation, groups))


_BWD = ("(Tensor dy, Tensor {other}, SymInt[] {shape}, int[] stride, int[] padding, "
        "int[] dilation, int groups, str backend) -> Tensor")


def _conv_gradient(which, name, a, b, dy, shape, stride, padding, dilation, groups, backend):
    """``_CONV[nd][which](a, b, shape, ...)`` (1: the data gradient, 2: the filter gradient)
    on dy's stream, as a Tensor; nd from ``a``, the operand with spatial dimensions."""
    nd = spatial_dims(name, a)
    s = stream_of(dy)
    with bridge.graph_pool():
        out = _CONV[nd][which](view(a, s), view(b, s), tuple(shape),
                               **_kw(stride, padding, dilation, groups, backend, s))
    return tensor(out, dy)


@custom_op("dnnkit::conv_backward_data", mutates_args=(),
           schema=_BWD.format(other="w", shape="x_shape"))
def conv_backward_data(dy, w, x_shape, stride, padding, dilation, groups, backend):
    """dx of conv, x of shape ``x_shape``."""
    return _conv_gradient(1, "dnnkit::conv_backward_data", dy, w, dy, x_shape, stride,
                          padding, dilation, groups, backend)


@conv_backward_data.register_fake
def _conv_backward_data_fake(dy, w, x_shape, stride, padding, dilation, groups, backend):
    return dy.new_empty(tuple(x_shape))


@custom_op("dnnkit::conv_backward_filter", mutates_args=(),
           schema=_BWD.format(other="x", shape="w_shape").replace("Tensor dy, Tensor x",
                                                                   "Tensor x, Tensor dy"))
def conv_backward_filter(x, dy, w_shape, stride, padding, dilation, groups, backend):
    """dw of conv, w of shape ``w_shape``."""
    return _conv_gradient(2, "dnnkit::conv_backward_filter", x, dy, dy, w_shape, stride,
                          padding, dilation, groups, backend)


@conv_backward_filter.register_fake
def _conv_backward_filter_fake(x, dy, w_shape, stride, padding, dilation, groups, backend):
    return dy.new_empty(tuple(w_shape))


@custom_op("dnnkit::conv_backward_bias", mutates_args=())
def conv_backward_bias(dy: Tensor, backend: str) -> Tensor:
    """db[k]: the sum of dy (N, K, *spatial) over all axes but K."""
    s = stream_of(dy)
    with bridge.graph_pool():
        db = ops.conv_backward_bias(view(dy, s), backend=op_backend(backend), stream=s)
    return tensor(db, dy)


@conv_backward_bias.register_fake
def _conv_backward_bias_fake(dy, backend):
    return dy.new_empty((dy.shape[1],))


def _conv_setup(ctx, inputs, output):
    x, w, bias, stride, padding, dilation, groups, backend = inputs
    ctx.save_for_backward(x, w)
    ctx.args, ctx.has_bias = (stride, padding, dilation, groups, backend), bias is not None


def _conv_grad(ctx, dy):
    x, w = ctx.saved_tensors
    dx = dw = db = None
    if ctx.needs_input_grad[0]:
        dx = conv_backward_data(dy, w, x.shape, *ctx.args)
    if ctx.needs_input_grad[1]:
        dw = conv_backward_filter(x, dy, w.shape, *ctx.args)
    if ctx.has_bias and ctx.needs_input_grad[2]:
        db = conv_backward_bias(dy, ctx.args[-1])
    return dx, dw, db, None, None, None, None, None


conv.register_autograd(_conv_grad, setup_context=_conv_setup)


# ---------------------------------------------------------------- transposed convolution

def _check_output_padding(nd, output_padding, stride):
    for o, st in zip(output_padding, stride):
        if o >= st:
            raise ValueError(f"conv_transpose{nd}d: output_padding {tuple(output_padding)} must "
                             f"be smaller than stride {tuple(stride)} in every dim for the "
                             f"gradient (dnnkit.torch)")


@custom_op("dnnkit::conv_transpose", mutates_args=())
def conv_transpose(x: Tensor, w: Tensor, bias: Optional[Tensor], stride: Sequence[int],
                   padding: Sequence[int], output_padding: Sequence[int],
                   dilation: Sequence[int], groups: int, backend: str) -> Tensor:
    """PyTorch's conv_transpose2d/3d (w (C_in, C_out/groups, *kernel)): the data gradient of
    conv; output_padding < stride in every dim."""
    nd = spatial_dims("dnnkit::conv_transpose", x)
    _check_output_padding(nd, output_padding, stride)
    s = stream_of(x)
    with bridge.graph_pool():
        y = _TRANSPOSE[nd](view(x, s), view(w, s), view(bias, s),
                           output_padding=tuple(output_padding),
                           **_kw(stride, padding, dilation, groups, backend, s))
    return tensor(y, x)


def conv_transpose_shape(x_shape, w_shape, stride, padding, output_padding, dilation, groups):
    """The output shape of conv_transpose (dnnkit's rule and checks)."""
    nd = len(x_shape) - 2
    out = conv_transpose_rules.output_size(f"conv_transpose{nd}d", nd, tuple(x_shape[2:]),
                                           tuple(w_shape[2:]), tuple(stride), tuple(padding),
                                           tuple(output_padding), tuple(dilation))
    return (x_shape[0], w_shape[1] * groups) + tuple(out)


@conv_transpose.register_fake
def _conv_transpose_fake(x, w, bias, stride, padding, output_padding, dilation, groups,
                         backend):
    nd = spatial_dims("dnnkit::conv_transpose", x)
    _check_output_padding(nd, output_padding, stride)
    return x.new_empty(conv_transpose_shape(x.shape, w.shape, stride, padding, output_padding,
                                            dilation, groups))


def _transpose_setup(ctx, inputs, output):
    x, w, bias, stride, padding, output_padding, dilation, groups, backend = inputs
    ctx.save_for_backward(x, w)
    ctx.args, ctx.has_bias = (stride, padding, dilation, groups, backend), bias is not None


def _transpose_grad(ctx, dy):
    x, w = ctx.saved_tensors
    dx = dw = db = None
    if ctx.needs_input_grad[0]:
        dx = conv(dy, w, None, *ctx.args)
    if ctx.needs_input_grad[1]:
        dw = conv_backward_filter(dy, x, w.shape, *ctx.args)
    if ctx.has_bias and ctx.needs_input_grad[2]:
        db = conv_backward_bias(dy, ctx.args[-1])
    return dx, dw, db, None, None, None, None, None, None


conv_transpose.register_autograd(_transpose_grad, setup_context=_transpose_setup)


# ---------------------------------------------------------------- pooling

def _window(x, window, stride, padding):
    """An empty window pools each channel whole (global pooling)."""
    if len(window):
        return tuple(window), tuple(stride), tuple(padding)
    whole = tuple(x.shape[2:])
    return whole, whole, (0,) * len(whole)


@custom_op("dnnkit::pool", mutates_args=())
def pool(x: Tensor, window: Sequence[int], stride: Sequence[int], padding: Sequence[int],
         mode: str, ceil_mode: bool, backend: str) -> Tensor:
    """Max or average pooling (dnnkit's modes); ``window=[]`` pools each channel whole."""
    nd = spatial_dims("dnnkit::pool", x)
    s = stream_of(x)
    with bridge.graph_pool():
        y = _POOL[nd][0](view(x, s), *_window(x, window, stride, padding), mode,
                         ceil_mode=ceil_mode, backend=op_backend(backend), stream=s)
    return tensor(y, x)


def pool_shape(x_shape, window, stride, padding, ceil_mode):
    """The output shape of pool (dnnkit's geometry: its checks and rule)."""
    nd = len(x_shape) - 2
    return pool_args.make_geom(f"pool{nd}d", nd, tuple(x_shape), tuple(window), tuple(stride),
                               tuple(padding), bool(ceil_mode)).y_shape


@pool.register_fake
def _pool_fake(x, window, stride, padding, mode, ceil_mode, backend):
    nd = spatial_dims("dnnkit::pool", x)
    if not len(window):       # the whole map: one output per channel (sizes may be symbolic)
        return x.new_empty(tuple(x.shape[:2]) + (1,) * nd)
    return x.new_empty(pool_shape(x.shape, window, stride, padding, ceil_mode))


@custom_op("dnnkit::pool_backward", mutates_args=())
def pool_backward(x: Tensor, y: Tensor, dy: Tensor, window: Sequence[int],
                  stride: Sequence[int], padding: Sequence[int], mode: str, ceil_mode: bool,
                  backend: str) -> Tensor:
    """dx of pool, from x, y and dy."""
    nd = spatial_dims("dnnkit::pool_backward", x)
    s = stream_of(dy)
    with bridge.graph_pool():
        dx = _POOL[nd][1](view(x, s), view(y, s), view(dy, s),
                          *_window(x, window, stride, padding), mode, ceil_mode=ceil_mode,
                          backend=op_backend(backend), stream=s)
    return tensor(dx, x)


@pool_backward.register_fake
def _pool_backward_fake(x, y, dy, window, stride, padding, mode, ceil_mode, backend):
    return x.new_empty(x.shape)


def _pool_setup(ctx, inputs, output):
    x = inputs[0]
    ctx.save_for_backward(x, output)
    ctx.args = inputs[1:]


def _pool_grad(ctx, dy):
    x, y = ctx.saved_tensors
    return (pool_backward(x, y, dy, *ctx.args),) + (None,) * 6


pool.register_autograd(_pool_grad, setup_context=_pool_setup)


# ---------------------------------------------------------------- linear

@custom_op("dnnkit::linear", mutates_args=())
def linear(x: Tensor, w: Tensor, bias: Optional[Tensor], backend: str) -> Tensor:
    """y = x @ w.T + bias over x's last axis."""
    s = stream_of(x)
    with bridge.graph_pool():
        y = ops.linear(view(x, s), view(w, s), view(bias, s), backend=op_backend(backend),
                       stream=s)
    return tensor(y, x)


@linear.register_fake
def _linear_fake(x, w, bias, backend):
    if x.dim() < 1 or w.dim() != 2 or x.shape[-1] != w.shape[1]:
        raise ValueError(f"dnnkit::linear: x {tuple(x.shape)} and w {tuple(w.shape)} do not "
                         f"match: x's last axis must be w's second")
    return x.new_empty(tuple(x.shape[:-1]) + (w.shape[0],))


@custom_op("dnnkit::matmul", mutates_args=())
def matmul(a: Tensor, b: Tensor, transpose_a: bool, transpose_b: bool, backend: str) -> Tensor:
    """op(a) @ op(b) of 2-D a and b."""
    s = stream_of(a)
    with bridge.graph_pool():
        y = ops.matmul(view(a, s), view(b, s), transpose_a, transpose_b,
                       backend=op_backend(backend), stream=s)
    return tensor(y, a)


@matmul.register_fake
def _matmul_fake(a, b, transpose_a, transpose_b, backend):
    m = a.shape[1] if transpose_a else a.shape[0]
    n = b.shape[0] if transpose_b else b.shape[1]
    return a.new_empty((m, n))


def _linear_setup(ctx, inputs, output):
    x, w, bias, backend = inputs
    ctx.save_for_backward(x, w)
    ctx.backend, ctx.has_bias = backend, bias is not None


def _linear_grad(ctx, dy):
    x, w = ctx.saved_tensors
    out_f = w.shape[0]
    g = dy.reshape(-1, out_f)          # every leading axis a row
    dx = dw = db = None
    if ctx.needs_input_grad[0]:
        dx = matmul(g, w, False, False, ctx.backend).reshape(x.shape)
    if ctx.needs_input_grad[1]:
        dw = matmul(g, x.reshape(-1, w.shape[1]), True, False, ctx.backend)
    if ctx.has_bias and ctx.needs_input_grad[2]:
        db = conv_backward_bias(dy.reshape(-1, out_f, 1, 1), ctx.backend)
    return dx, dw, db, None


linear.register_autograd(_linear_grad, setup_context=_linear_setup)
