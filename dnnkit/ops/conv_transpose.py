"""Transposed convolution, 2-D (NCHW) and 3-D (NCDHW): PyTorch's ``conv_transpose2d/3d``,
cudnn.torch's ``SpatialFullConvolution``, Theano's ``dnn_gradinput`` used as a layer.

w is laid out (C_in, C_out/groups, *kernel), as PyTorch's. Each input position scatters its
channels through the kernel onto a strided grid of the output:

    y[n, g*Co/G + c, i] = sum of x[n, k, o] * w[k, c, t'] over the k of group g and the (o, t)
                          with o*stride + t*dilation - padding = i;   then + bias[...]

(t' = t for ``mode="cross"``, the reversed tap for ``"conv"``). That sum is the gradient wrt
the input of the convolution with the same w: conv_transpose2d(x, w) is
``conv2d_backward_data(x, w, y_shape)`` with x in the place of dy, and the bias is added by
``add`` (broadcast over N and space). These functions are compositions of those public ops:
both backends (cuDNN's cudnnConvolutionBackwardData, the Numba GEMM + col2im and its
Winograd / implicit-GEMM paths), the flags ``dnn.conv.algo_bwd_data`` and
``dnn.conv.precision``, the memo of repeated calls and ``trace()`` are theirs.

Output size per spatial dim: ``(I - 1)*stride - 2*padding + dilation*(k - 1) +
output_padding + 1``. A convolution of stride s maps s consecutive input sizes to one output
size; ``output_padding`` (< max(stride, dilation), PyTorch's rule) picks the larger ones: it
adds rows at the far end of y. The convolution of y's shape has x's size when
output_padding < stride; with output_padding >= stride (possible only when dilation > stride)
it has ``output_padding // stride`` more positions, which hold zeros: x is extended with
zero rows there (``concatenate``) before the data gradient runs.

Gradients. Of the data gradient dx = conv_backward_data(dy, w) (linear in dy and in w), for
an upstream gradient G of dx's shape:

    d dy = conv_forward(G, w)                       (the forward convolution)
    d w  = conv_backward_filter(G, dy, w.shape)     (G in the role of the input x, dy of dy)

with the same stride, padding, dilation, groups and mode; the rule is registered beside
``conv2d_backward_data`` and ``conv3d_backward_data`` (ops/conv_grad.py), so a transposed
convolution is differentiable wrt x and w. The bias gradient, the sum of dy per channel, is ``add``'s rule
(``sum_to``); the zero rows of a large output_padding drop out in ``concatenate``'s (split).
tests/ops/test_conv_transpose.py checks all three by finite differences in float64.
"""

from collections.abc import Sequence
from typing import Any, Optional, Union

import numpy as np

from .. import arrays
from ..hints import ArrayLike, Backend, Stream
from ..policy import policy
from ..tensors import Tensor
from .args import choice, int_tuple
from .arith import add
from .conv import conv2d_backward_data, conv3d_backward_data
from .conv_args import ALGOS, PRECISIONS
from .shape import concatenate, reshape

MODES = ("cross", "conv")
Sizes = Union[int, Sequence[int]]       # one size for every spatial dim, or one per dim

_OPS = {2: ("conv_transpose2d", conv2d_backward_data), 3: ("conv_transpose3d",
                                                            conv3d_backward_data)}


def conv_transpose2d(x: ArrayLike, w: ArrayLike, bias: Optional[ArrayLike] = None, *,
                     stride: Sizes = 1, padding: Sizes = 0, output_padding: Sizes = 0,
                     dilation: Sizes = 1, groups: int = 1, mode: str = "cross",
                     algo: Optional[str] = None, precision: Optional[str] = None,
                     backend: Optional[Backend] = None, stream: Stream = None) -> Any:
    """2-D transposed convolution of x (N, C_in, H, W) with w (C_in, C_out/groups, kh, kw),
    plus bias (C_out,) or None; returns y (N, C_out, OH, OW) with, per spatial dim,
    O = (I - 1)*stride - 2*padding + dilation*(k - 1) + output_padding + 1.

        y[n, g*Co/G + c, i] = sum of x[n, k, o] * w[k, c, t'] over the k of group g and the
                              (o, t) with o*stride + t*dilation - padding = i; + bias

    PyTorch's ``torch.nn.functional.conv_transpose2d`` (the same w layout and output size):
    the data gradient of ``conv2d`` with the same w, run as :func:`conv2d_backward_data` and
    :func:`add` for the bias (``trace()`` lists them). Its gradients wrt x, w and bias:
    ``conv2d(dy, w)``, ``conv2d_backward_filter(dy, x)``, the sum of dy per channel.
    ``stride``, ``dilation``: an int or one per spatial dim, >= 1. ``padding``: an int or one
    per spatial dim, >= 0 (taken off both ends of the output). ``output_padding``: an int or
    one per spatial dim, >= 0 and < max(stride, dilation) in that dim: added at the far end
    (default 0). ``groups``: a positive int dividing C_in; C_out = w.shape[1] * groups.
    ``mode``: "cross" (default, as PyTorch) or "conv" (the kernel reversed, Theano's
    conv_mode='conv'). float16, float32 or float64, one dtype for all three arrays.
    {CONV_ALGO_BWD_DATA}
    {CONV_PRECISION}
    Raises ValueError for a bad stride, padding, dilation, output_padding (naming it, the
    stride and the dilation), groups, mode, algo or precision, a w without taps, C_in that
    does not match w, a bias that is not (C_out,), an empty spatial dim of x or an output
    size below 1; TypeError for mixed dtypes or sizes that are not ints.

    {OP_FOOTER}"""
    return _transpose(2, x, w, bias, stride, padding, output_padding, dilation, groups, mode,
                      algo, precision, backend, stream)


def conv_transpose3d(x: ArrayLike, w: ArrayLike, bias: Optional[ArrayLike] = None, *,
                     stride: Sizes = 1, padding: Sizes = 0, output_padding: Sizes = 0,
                     dilation: Sizes = 1, groups: int = 1, mode: str = "cross",
                     algo: Optional[str] = None, precision: Optional[str] = None,
                     backend: Optional[Backend] = None, stream: Stream = None) -> Any:
    """3-D transposed convolution of x (N, C_in, D, H, W) with w (C_in, C_out/groups, kd, kh,
    kw), plus bias (C_out,) or None; returns y (N, C_out, OD, OH, OW) with, per spatial dim,
    O = (I - 1)*stride - 2*padding + dilation*(k - 1) + output_padding + 1:
    :func:`conv_transpose2d` over three spatial dims (PyTorch's
    ``torch.nn.functional.conv_transpose3d``), run as :func:`conv3d_backward_data` and
    :func:`add` for the bias. ``stride``, ``padding``, ``output_padding``, ``dilation``: an
    int or one per spatial dim (>= 1, >= 0, >= 0 and < max(stride, dilation), >= 1).
    ``groups``: a positive int dividing C_in. ``mode``: "cross" (default) or "conv". float16,
    float32 or float64, one dtype for all three arrays.
    {CONV_ALGO_BWD_DATA}
    {CONV_PRECISION}
    Raises ValueError for a bad stride, padding, dilation, output_padding (naming it, the
    stride and the dilation), groups, mode, algo or precision, a w without taps, C_in that
    does not match w, a bias that is not (C_out,), an empty spatial dim of x or an output
    size below 1; TypeError for mixed dtypes or sizes that are not ints.

    {OP_FOOTER}"""
    return _transpose(3, x, w, bias, stride, padding, output_padding, dilation, groups, mode,
                      algo, precision, backend, stream)


conv_transpose2d.op_name = "conv2d_backward_data"     # its tolerance (dnnkit.testing)
conv_transpose3d.op_name = "conv3d_backward_data"


def _checked(op, name, a, stream, ndim):
    """``a`` checked (dtype, rank, contiguity) as ``op``'s argument: a Tensor as it is (its
    array checked), anything else as a device array (a NumPy array copied once, here)."""
    if isinstance(a, Tensor):
        return a, arrays.device_input(op, name, a.data, stream, ndim=ndim)
    d = arrays.device_input(op, name, a, stream, ndim=ndim)
    return d, d


def output_size(op, nd, in_sizes, kernel, stride, padding, output_padding, dilation):
    """The output's spatial sizes, (I - 1)*s - 2p + d(k - 1) + op + 1 per dim; ValueError
    naming the values for an output_padding out of range or a size below 1."""
    for i in range(nd):
        if output_padding[i] >= max(stride[i], dilation[i]):
            raise ValueError(f"{op}: output_padding must be smaller than max(stride, dilation) "
                             f"in every spatial dim; got output_padding={output_padding}, "
                             f"stride={stride}, dilation={dilation}")
    out = tuple((n - 1) * s - 2 * p + d * (k - 1) + o + 1 for n, k, s, p, o, d in
                zip(in_sizes, kernel, stride, padding, output_padding, dilation))
    if min(out) < 1:
        raise ValueError(f"{op}: the output size {out} is below 1 (input {tuple(in_sizes)}, "
                         f"kernel {tuple(kernel)}, stride {stride}, padding {padding}, "
                         f"output_padding {output_padding}, dilation {dilation})")
    return out


def _transpose(nd, x, w, bias, stride, padding, output_padding, dilation, groups, mode, algo,
               precision, backend, stream):
    op, backward_data = _OPS[nd]
    policy(op, backend)     # a bad backend= named under this op, before anything runs
    s = arrays.as_stream(stream)
    x, xa = _checked(op, "x", x, s, (nd + 2,))
    w, wa = _checked(op, "w", w, s, (nd + 2,))
    if xa.dtype != wa.dtype:
        raise TypeError(f"{op}: w has dtype {wa.dtype} but x has {xa.dtype}")
    if not isinstance(groups, (int, np.integer)) or isinstance(groups, bool) or groups < 1:
        raise ValueError(f"{op}: groups must be a positive int; got {groups!r}")
    choice(op, "mode", mode, MODES)
    if algo is not None:        # checked here too: nothing may run before a bad argument
        choice(op, "algo", algo, ALGOS["bwd_data"])
    if precision is not None:
        choice(op, "precision", precision, PRECISIONS)
    groups = int(groups)
    c_in, c_out = xa.shape[1], wa.shape[1] * groups
    if wa.shape[0] != c_in:
        raise ValueError(f"{op}: w is (C_in, C_out/groups, *kernel) = {tuple(wa.shape)} but x "
                         f"has C_in={c_in}; x {tuple(xa.shape)}")
    if c_in % groups:
        raise ValueError(f"{op}: groups={groups} must divide the input channels C_in={c_in}")
    kernel = tuple(wa.shape[2:])
    if 0 in kernel:
        raise ValueError(f"{op}: the filter window must have >= 1 tap in every spatial dim; "
                         f"w {tuple(wa.shape)}")
    if 0 in tuple(xa.shape[2:]):
        raise ValueError(f"{op}: x has an empty spatial dimension; x {tuple(xa.shape)}")
    stride = int_tuple(op, "stride", stride, nd, 1)
    padding = int_tuple(op, "padding", padding, nd, 0)
    output_padding = int_tuple(op, "output_padding", output_padding, nd, 0)
    dilation = int_tuple(op, "dilation", dilation, nd, 1)
    out = output_size(op, nd, xa.shape[2:], kernel, stride, padding, output_padding, dilation)
    if bias is not None:
        bias, ba = _checked(op, "bias", bias, s, (1,))
        if tuple(ba.shape) != (c_out,):
            raise ValueError(f"{op}: bias must have shape ({c_out},); got {tuple(ba.shape)}")
        if ba.dtype != xa.dtype:
            raise TypeError(f"{op}: bias has dtype {ba.dtype} but x has {xa.dtype}")
    kw = {} if stream is None else {"stream": stream}
    for i in range(nd):
        extra = output_padding[i] // stride[i]
        if extra:   # the convolution of y's shape has `extra` more positions here: zeros
            shape = list(xa.shape)
            shape[2 + i] = extra
            zeros = arrays.zero_fill(arrays.cuda_empty(tuple(shape), xa.dtype, s), s)
            x = concatenate([x, zeros], 2 + i, backend=backend, **kw)
            xa = x.data if isinstance(x, Tensor) else x
    y = backward_data(x, w, (xa.shape[0], c_out) + out, stride=stride, padding=padding,
                      dilation=dilation, groups=groups, mode=mode, algo=algo,
                      precision=precision, backend=backend, **kw)
    if bias is None:
        return y
    return add(y, reshape(bias, (1, c_out) + (1,) * nd, backend=backend, **kw), backend=backend,
               **kw)


__all__ = ["conv_transpose2d", "conv_transpose3d"]
