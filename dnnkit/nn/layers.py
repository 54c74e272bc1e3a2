"""Layers over dnnkit's ops. Each keeps in ``forward`` what its ``backward`` needs (inputs,
outputs, saved statistics) and runs every op through :meth:`Module.run`, gradients through
:meth:`Module.run_as` (the forward's backend). Weights are initialised from a seeded NumPy
generator as PyTorch does by default (Kaiming-uniform with a = sqrt(5): U(-1/sqrt(fan_in),
1/sqrt(fan_in)) for weights and biases)."""

import math

import numpy as np

from .. import ops, recurrent
from .module import Module
from .parameter import Parameter


def _uniform(rng, shape, fan_in, dtype):
    bound = 1.0 / math.sqrt(max(1, fan_in))
    return rng.uniform(-bound, bound, shape).astype(dtype)


class _ConvNd(Module):
    def __init__(self, nd, in_channels, out_channels, kernel_size, stride, padding, dilation,
                 groups, bias, dtype, seed):
        super().__init__()
        k = tuple(kernel_size) if isinstance(kernel_size, (tuple, list)) else (kernel_size,) * nd
        if len(k) != nd or in_channels % groups or out_channels % groups:
            raise ValueError(f"Conv{nd}d: kernel_size {kernel_size} must have {nd} entries and "
                             f"groups={groups} must divide in_channels={in_channels} and "
                             f"out_channels={out_channels}")
        rng = np.random.default_rng(seed)
        fan_in = in_channels // groups * math.prod(k)
        self.nd, self.kernel_size = nd, k
        self.conv = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)
        self.weight = Parameter(_uniform(rng, (out_channels, in_channels // groups) + k, fan_in,
                                         dtype))
        self.bias = Parameter(_uniform(rng, (out_channels,), fan_in, dtype)) if bias else None
        self._fns = (ops.conv2d, ops.conv2d_backward_data, ops.conv2d_backward_filter) \
            if nd == 2 else (ops.conv3d, ops.conv3d_backward_data, ops.conv3d_backward_filter)

    def extra_repr(self):
        k, c = self.weight.shape, self.conv
        return (f"{k[1] * c['groups']}, {k[0]}, kernel_size={self.kernel_size}, "
                f"stride={c['stride']}, padding={c['padding']}")

    def forward(self, x):
        fwd = self._fns[0]
        self._x = x
        b = self.bias.data if self.bias is not None else None
        return self.run(fwd, x, self.weight.data, b, **self.conv)

    def backward(self, dy):
        fwd, bwd_data, bwd_filter = self._fns
        x = self._x
        dx = self.run_as(fwd.op_name, bwd_data, dy, self.weight.data, tuple(x.shape),
                         **self.conv)
        self.weight.accumulate(self.run_as(fwd.op_name, bwd_filter, x, dy, self.weight.shape,
                                           **self.conv))
        if self.bias is not None:
            self.bias.accumulate(self.run_as(fwd.op_name, ops.conv_backward_bias, dy))
        return dx


class Conv2d(_ConvNd):
    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1,
                 groups=1, bias=True, *, dtype="float32", seed=None):
        super().__init__(2, in_channels, out_channels, kernel_size, stride, padding, dilation,
                         groups, bias, dtype, seed)


class Conv3d(_ConvNd):
    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1,
                 groups=1, bias=True, *, dtype="float32", seed=None):
        super().__init__(3, in_channels, out_channels, kernel_size, stride, padding, dilation,
                         groups, bias, dtype, seed)


class Linear(Module):
    """y = x W^T + b for x (N, in): a 1x1 convolution of (N, in, 1, 1), so it runs on cuDNN
    or on the Numba GEMM under the same policy as every conv (cuBLAS is not a dependency)."""

    def __init__(self, in_features, out_features, bias=True, *, dtype="float32", seed=None):
        super().__init__()
        self.conv = Conv2d(in_features, out_features, 1, bias=bias, dtype=dtype, seed=seed)
        self.in_features, self.out_features = in_features, out_features

    def extra_repr(self):
        return f"in_features={self.in_features}, out_features={self.out_features}"

    def forward(self, x):
        if x.ndim != 2 or x.shape[1] != self.in_features:
            raise ValueError(f"Linear: input must be (N, {self.in_features}); got "
                             f"{tuple(x.shape)}")
        n = x.shape[0]
        return self.conv.forward(x.reshape(n, self.in_features, 1, 1)).reshape(
            n, self.out_features)

    def backward(self, dy):
        n = dy.shape[0]
        return self.conv.backward(dy.reshape(n, self.out_features, 1, 1)).reshape(
            n, self.in_features)


class Flatten(Module):
    """(N, ...) -> (N, prod(...)): a view."""

    def forward(self, x):
        self._shape = tuple(x.shape)
        return x.reshape(x.shape[0], math.prod(x.shape[1:]))

    def backward(self, dy):
        return dy.reshape(*self._shape)


class _Pool(Module):
    def __init__(self, nd, mode, kernel_size, stride=None, padding=0):
        super().__init__()
        self.nd, self.mode = nd, mode
        self.args = (kernel_size, stride, padding)
        self._fns = (ops.pool2d, ops.pool2d_backward) if nd == 2 else \
            (ops.pool3d, ops.pool3d_backward)

    def extra_repr(self):
        k, s, p = self.args
        return f"kernel_size={k}, stride={s if s is not None else k}, padding={p}"

    def forward(self, x):
        self._x = x
        self._y = self.run(self._fns[0], x, *self.args, mode=self.mode)
        return self._y

    def backward(self, dy):
        return self.run_as(self._fns[0].op_name, self._fns[1], self._x, self._y, dy, *self.args,
                           mode=self.mode)


class MaxPool2d(_Pool):
    def __init__(self, kernel_size, stride=None, padding=0, *, deterministic=False):
        super().__init__(2, "max_deterministic" if deterministic else "max", kernel_size,
                         stride, padding)


class MaxPool3d(_Pool):
    def __init__(self, kernel_size, stride=None, padding=0, *, deterministic=False):
        super().__init__(3, "max_deterministic" if deterministic else "max", kernel_size,
                         stride, padding)


class AvgPool2d(_Pool):
    def __init__(self, kernel_size, stride=None, padding=0, *, count_include_pad=True):
        super().__init__(2, "average_inc_pad" if count_include_pad else "average_exc_pad",
                         kernel_size, stride, padding)


class _Activation(Module):
    mode, coef = "relu", 0.0

    def forward(self, x):
        self._x = x
        self._y = self.run(ops.activation, x, self.mode, self.coef)
        return self._y

    def backward(self, dy):
        return self.run_as("activation", ops.activation_backward, self._x, self._y, dy,
                           self.mode, self.coef)


class ReLU(_Activation):
    mode = "relu"


class Tanh(_Activation):
    mode = "tanh"


class Sigmoid(_Activation):
    mode = "sigmoid"


class ClippedReLU(_Activation):
    mode = "clipped_relu"

    def __init__(self, ceiling):
        super().__init__()
        self.coef = float(ceiling)

    def extra_repr(self):
        return f"ceiling={self.coef}"


class ELU(_Activation):
    mode = "elu"

    def __init__(self, alpha=1.0):
        super().__init__()
        self.coef = float(alpha)

    def extra_repr(self):
        return f"alpha={self.coef}"


class Softmax(Module):
    """Softmax over the channels ("channel": dim 1 at every position) or over everything but
    the batch ("instance")."""
    algo = "accurate"

    def __init__(self, mode="channel"):
        super().__init__()
        self.mode = mode

    def extra_repr(self):
        return f"mode={self.mode!r}"

    def forward(self, x):
        self._y = self.run(ops.softmax, x, self.algo, self.mode)
        return self._y

    def backward(self, dy):
        return self.run_as("softmax", ops.softmax_backward, self._y, dy, self.algo, self.mode)


class LogSoftmax(Softmax):
    algo = "log"


class Dropout(Module):
    """Drops with probability p in training (scaling the rest by 1/(1-p)); identity in eval."""

    def __init__(self, p=0.5, *, seed=None):
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"Dropout: p must be in [0, 1); got {p}")
        self.p, self.seed, self._calls = float(p), seed, 0

    def extra_repr(self):
        return f"p={self.p}"

    def forward(self, x):
        if not self.training or self.p == 0.0:
            self._state = None
            return x
        seed = None if self.seed is None else self.seed + self._calls
        self._calls += 1
        y, self._state = self.run(ops.dropout, x, self.p, seed=seed)
        return y

    def backward(self, dy):
        if self._state is None:
            return dy
        # the backend that made the mask (recorded by the forward) is the only one that can
        return self.run_as("dropout", ops.dropout_backward, dy, self._state)


class _BatchNorm(Module):
    def __init__(self, nd, num_features, eps=1e-5, momentum=0.1, dtype="float32"):
        super().__init__()
        self.nd, self.eps, self.momentum = nd, float(eps), float(momentum)
        pdt = "float32" if np.dtype(dtype) != np.float64 else "float64"
        self.weight = Parameter(np.ones(num_features, pdt))
        self.bias = Parameter(np.zeros(num_features, pdt))
        from numba import cuda      # on first use: ``import dnnkit`` does not load numba
        self.register_buffer("running_mean", cuda.to_device(np.zeros(num_features, pdt)))
        self.register_buffer("running_var", cuda.to_device(np.ones(num_features, pdt)))

    def extra_repr(self):
        return f"{self.weight.shape[0]}, eps={self.eps}, momentum={self.momentum}"

    def forward(self, x):
        if x.ndim != self.nd:
            raise ValueError(f"{type(self).__name__}: input must be {self.nd}-D; got "
                             f"{tuple(x.shape)}")
        if not self.training:
            self._saved = None
            return self.run(ops.batch_norm_inference, x, self.weight.data, self.bias.data,
                            self.running_mean, self.running_var, epsilon=self.eps)
        self._x = x
        y, mean, invstd = self.run(ops.batch_norm_train, x, self.weight.data, self.bias.data,
                                   epsilon=self.eps, momentum=self.momentum,
                                   running_mean=self.running_mean,
                                   running_var=self.running_var)
        self._saved = (mean, invstd)
        return y

    def backward(self, dy):
        if self._saved is None:
            raise ValueError(f"{type(self).__name__}.backward: the forward ran in eval mode "
                             "(backward through running statistics is not supported)")
        dx, dgamma, dbeta = self.run_as("batch_norm_train", ops.batch_norm_backward, self._x,
                                        dy, self.weight.data, *self._saved, epsilon=self.eps)
        self.weight.accumulate(dgamma)
        self.bias.accumulate(dbeta)
        return dx


class BatchNorm1d(_BatchNorm):
    """Over (N, C): one statistic per feature."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, *, dtype="float32"):
        super().__init__(2, num_features, eps, momentum, dtype)


class BatchNorm2d(_BatchNorm):
    def __init__(self, num_features, eps=1e-5, momentum=0.1, *, dtype="float32"):
        super().__init__(4, num_features, eps, momentum, dtype)


class BatchNorm3d(_BatchNorm):
    def __init__(self, num_features, eps=1e-5, momentum=0.1, *, dtype="float32"):
        super().__init__(5, num_features, eps, momentum, dtype)


class SpatialTransformer(Module):
    """img (N, C, H, W) and theta (N, 2, 3) -> the sampled image (Theano's dnn_spatialtf).
    ``forward((img, theta))``; ``backward(dy)`` returns ``(dimg, dtheta)``."""

    def __init__(self, scale_height=1.0, scale_width=1.0):
        super().__init__()
        self.scale = (float(scale_height), float(scale_width))

    def forward(self, inputs):
        img, theta = inputs
        n, c, h, w = img.shape
        shape = (n, c, math.ceil(h * self.scale[0]), math.ceil(w * self.scale[1]))
        self._img = img
        self._grid = self.run(ops.affine_grid, theta, shape)
        return self.run(ops.grid_sample, img, self._grid)

    def backward(self, dy):
        dimg, dgrid = self.run_as("grid_sample", ops.grid_sample_backward, self._img,
                                  self._grid, dy)
        return dimg, self.run_as("affine_grid", ops.affine_grid_backward, dgrid)


class _Recurrent(Module):
    """dnnkit.RNN as a layer: one flat Parameter in cuDNN's layout (docs/rnn.md).
    ``forward(x)`` returns y ((T, N, H*dirs), or (N, T, ...) with ``batch_first``) and keeps
    hy/cy in ``self.hy``/``self.cy``; ``backward(dy)`` returns dx."""
    mode = "lstm"

    def __init__(self, input_size, hidden_size, num_layers=1, *, bidirectional=False,
                 batch_first=False, input_mode="linear", dtype="float32", seed=0):
        super().__init__()
        self.rnn = recurrent.RNN(self.mode, input_size, hidden_size, num_layers,
                                 bidirectional=bidirectional, input_mode=input_mode,
                                 batch_first=batch_first, dtype=dtype)
        self.weight = Parameter(self.rnn.init_params(seed=seed))

    def extra_repr(self):
        c = self.rnn.cfg
        return (f"{c.input_size}, {c.hidden_size}, num_layers={c.num_layers}, "
                f"bidirectional={c.bidirectional}")

    def forward(self, x, hx=None, cx=None, *, lengths=None):
        self._x, self._hx, self._cx, self._lengths = x, hx, cx, lengths
        out = self.run(self.rnn.forward, self.weight.data, x, hx, cx, training=self.training,
                       lengths=lengths)
        self._y, self.hy, self.cy, self._state = out[0], out[1], out[2], out.state
        return self._y

    def backward(self, dy, dhy=None, dcy=None):
        if self._state is None:
            raise ValueError(f"{type(self).__name__}.backward: the forward ran in eval mode")
        dx, self.dhx, self.dcx, dw = self.run_as(
            "rnn_forward", self.rnn.backward, self.weight.data, self._x, self._y, dy, dhy, dcy,
            self._hx, self._cx, state=self._state, lengths=self._lengths)
        self.weight.accumulate(dw)
        return dx


class RNN(_Recurrent):
    """Elman RNN; ``nonlinearity`` "tanh" or "relu"."""

    def __init__(self, input_size, hidden_size, num_layers=1, *, nonlinearity="tanh", **kw):
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"RNN: nonlinearity must be 'tanh' or 'relu'; got {nonlinearity!r}")
        self.mode = f"rnn_{nonlinearity}"
        super().__init__(input_size, hidden_size, num_layers, **kw)


class LSTM(_Recurrent):
    mode = "lstm"


class GRU(_Recurrent):
    mode = "gru"
