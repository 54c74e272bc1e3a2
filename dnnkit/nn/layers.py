"""Layers over dnnkit's ops, called on Tensors: each ``forward`` runs ops with the module's
``backend`` and the graph records itself (no layer keeps anything for a backward of its own).

Weights are initialised from a seeded NumPy generator as PyTorch does by default
(Kaiming-uniform with a = sqrt(5): U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weights and biases;
N(0, 1) for an embedding), and laid out as PyTorch's: a convolution's weight is
(out, in/groups, *kernel), a linear layer's (out, in).
"""

import math

import numpy as np

from .. import ops
from . import checks
from .checks import as_input
from .module import Module
from .parameter import Parameter


def _uniform(rng, shape, fan_in, dtype):
    bound = 1.0 / math.sqrt(max(1, fan_in))
    return rng.uniform(-bound, bound, shape).astype(dtype)


class _ConvNd(Module):
    def __init__(self, nd, in_channels, out_channels, kernel_size, stride, padding, dilation,
                 groups, bias, dtype, seed):
        super().__init__()
        cls = f"Conv{nd}d"
        cin = checks.integer(cls, "in_channels", in_channels, 1)
        cout = checks.integer(cls, "out_channels", out_channels, 1)
        k = checks.sizes(cls, "kernel_size", kernel_size, nd, 1)
        g = checks.integer(cls, "groups", groups, 1)
        if cin % g or cout % g:
            raise ValueError(f"{cls}: groups={g} must divide in_channels={cin} and "
                             f"out_channels={cout}")
        self.conv = dict(stride=checks.sizes(cls, "stride", stride, nd, 1),
                         padding=padding if isinstance(padding, str) else
                         checks.sizes(cls, "padding", padding, nd, 0),
                         dilation=checks.sizes(cls, "dilation", dilation, nd, 1), groups=g)
        if isinstance(padding, str) and padding not in ("valid", "full", "half"):
            raise ValueError(f"{cls}: padding must be an int, a tuple or one of 'valid', "
                             f"'full', 'half'; got {padding!r}")
        dtype = checks.float_dtype(cls, dtype)
        rng = np.random.default_rng(checks.seed(cls, seed))
        fan_in = cin // g * math.prod(k)
        self.nd, self.kernel_size = nd, k
        self.in_channels, self.out_channels = cin, cout
        self.weight = Parameter(_uniform(rng, (cout, cin // g) + k, fan_in, dtype))
        self.bias = Parameter(_uniform(rng, (cout,), fan_in, dtype)) \
            if checks.flag(cls, "bias", bias) else None
        self._op = ops.conv2d if nd == 2 else ops.conv3d

    def extra_repr(self):
        c = self.conv
        s = (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
             f"stride={c['stride']}, padding={c['padding']}")
        if c["dilation"] != (1,) * self.nd:
            s += f", dilation={c['dilation']}"
        if c["groups"] != 1:
            s += f", groups={c['groups']}"
        return s + ("" if self.bias is not None else ", bias=False")

    def forward(self, x):
        x = as_input(type(self).__name__, x, self.weight.dtype)
        return self._op(x, self.weight, self.bias, **self.conv, backend=self.backend)


class Conv2d(_ConvNd):
    """2-D convolution of (N, C, H, W); weight (out, in/groups, kh, kw), bias (out,)."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1,
                 groups=1, bias=True, *, dtype="float32", seed=None):
        super().__init__(2, in_channels, out_channels, kernel_size, stride, padding, dilation,
                         groups, bias, dtype, seed)


class Conv3d(_ConvNd):
    """3-D convolution of (N, C, D, H, W); weight (out, in/groups, kd, kh, kw)."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1,
                 groups=1, bias=True, *, dtype="float32", seed=None):
        super().__init__(3, in_channels, out_channels, kernel_size, stride, padding, dilation,
                         groups, bias, dtype, seed)


class Linear(Module):
    """y = x W^T + b for x (..., in_features): ``dnnkit.linear``, weight (out_features,
    in_features) as PyTorch's, bias (out_features,)."""

    def __init__(self, in_features, out_features, bias=True, *, dtype="float32", seed=None):
        super().__init__()
        cls = "Linear"
        self.in_features = checks.integer(cls, "in_features", in_features, 1)
        self.out_features = checks.integer(cls, "out_features", out_features, 1)
        dtype = checks.float_dtype(cls, dtype)
        rng = np.random.default_rng(checks.seed(cls, seed))
        self.weight = Parameter(_uniform(rng, (self.out_features, self.in_features),
                                         self.in_features, dtype))
        self.bias = Parameter(_uniform(rng, (self.out_features,), self.in_features, dtype)) \
            if checks.flag(cls, "bias", bias) else None

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}")

    def forward(self, x):
        x = as_input("Linear", x, self.weight.dtype)
        return ops.linear(x, self.weight, self.bias, backend=self.backend)


class Flatten(Module):
    """(N, ...) -> (N, prod(...)): a view (``dnnkit.reshape``)."""

    def forward(self, x):
        x = as_input("Flatten", x)
        if x.ndim < 1:
            raise ValueError("Flatten: the input needs a batch dimension; got a 0-d tensor")
        return ops.reshape(x, (x.shape[0], math.prod(x.shape[1:])), backend=self.backend)


class Identity(Module):
    """Returns its input (a placeholder, e.g. a residual block's shortcut)."""

    def forward(self, x):
        return x


class _Pool(Module):
    def __init__(self, nd, mode, kernel_size, stride=None, padding=0):
        super().__init__()
        cls = type(self).__name__
        k = checks.sizes(cls, "kernel_size", kernel_size, nd, 1)
        s = k if stride is None else checks.sizes(cls, "stride", stride, nd, 1)
        p = checks.sizes(cls, "padding", padding, nd, 0)
        if any(pi >= ki for pi, ki in zip(p, k)):
            raise ValueError(f"{cls}: padding {p} must be smaller than kernel_size {k}")
        self.nd, self.mode, self.args = nd, mode, (k, s, p)
        self._op = ops.pool2d if nd == 2 else ops.pool3d

    def extra_repr(self):
        k, s, p = self.args
        return f"kernel_size={k}, stride={s}, padding={p}"

    def forward(self, x):
        x = as_input(type(self).__name__, x)
        return self._op(x, *self.args, self.mode, backend=self.backend)


class MaxPool2d(_Pool):
    def __init__(self, kernel_size, stride=None, padding=0, *, deterministic=False):
        det = checks.flag("MaxPool2d", "deterministic", deterministic)
        super().__init__(2, "max_deterministic" if det else "max", kernel_size, stride, padding)


class MaxPool3d(_Pool):
    def __init__(self, kernel_size, stride=None, padding=0, *, deterministic=False):
        det = checks.flag("MaxPool3d", "deterministic", deterministic)
        super().__init__(3, "max_deterministic" if det else "max", kernel_size, stride, padding)


class AvgPool2d(_Pool):
    def __init__(self, kernel_size, stride=None, padding=0, *, count_include_pad=True):
        inc = checks.flag("AvgPool2d", "count_include_pad", count_include_pad)
        super().__init__(2, "average_inc_pad" if inc else "average_exc_pad", kernel_size,
                         stride, padding)


class GlobalAvgPool2d(Module):
    """The mean over every spatial position: (N, C, H, W) -> (N, C) (``dnnkit.global_avg_pool``;
    (N, C, D, H, W) too)."""

    def forward(self, x):
        x = as_input(type(self).__name__, x)
        return ops.global_avg_pool(x, backend=self.backend)


class AdaptiveAvgPool2d(GlobalAvgPool2d):
    """PyTorch's ``AdaptiveAvgPool2d`` for an output of 1 x 1, the form classifiers use:
    (N, C, H, W) -> (N, C, 1, 1). Other output sizes are refused by the constructor."""

    def __init__(self, output_size=1):
        super().__init__()
        one = (lambda v: isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))
               and v == 1)      # (no `in` test: an array compares elementwise)
        if not (one(output_size) or isinstance(output_size, (tuple, list))
                and len(output_size) == 2 and all(map(one, output_size))):
            raise ValueError(f"AdaptiveAvgPool2d: only output_size 1 (a global average) is "
                             f"supported; got {output_size!r}")

    def extra_repr(self):
        return "output_size=1"

    def forward(self, x):
        y = super().forward(x)
        return ops.reshape(y, tuple(y.shape) + (1, 1), backend=self.backend)


class _Activation(Module):
    mode, coef = "relu", 0.0

    def forward(self, x):
        x = as_input(type(self).__name__, x)
        return ops.activation(x, self.mode, self.coef, backend=self.backend)


class ReLU(_Activation):
    mode = "relu"


class Tanh(_Activation):
    mode = "tanh"


class Sigmoid(_Activation):
    mode = "sigmoid"


class ClippedReLU(_Activation):
    """min(max(x, 0), ceiling)."""
    mode = "clipped_relu"

    def __init__(self, ceiling):
        super().__init__()
        self.coef = checks.real("ClippedReLU", "ceiling", ceiling, low=0.0, low_open=True)

    def extra_repr(self):
        return f"ceiling={self.coef}"


class ELU(_Activation):
    mode = "elu"

    def __init__(self, alpha=1.0):
        super().__init__()
        self.coef = checks.real("ELU", "alpha", alpha)

    def extra_repr(self):
        return f"alpha={self.coef}"


class Softmax(Module):
    """Softmax over the channels ("channel": dim 1 at every position) or over everything but
    the batch ("instance"), of (N, C) or (N, C, H, W)."""
    algo = "accurate"

    def __init__(self, mode="channel"):
        super().__init__()
        if mode not in ("channel", "instance") or not isinstance(mode, str):
            raise ValueError(f"{type(self).__name__}: mode must be 'channel' or 'instance'; "
                             f"got {mode!r}")
        self.mode = mode

    def extra_repr(self):
        return f"mode={self.mode!r}"

    def forward(self, x):
        x = as_input(type(self).__name__, x)
        return ops.softmax(x, self.algo, self.mode, backend=self.backend)


class LogSoftmax(Softmax):
    algo = "log"


class Dropout(Module):
    """Drops with probability p in training (scaling the rest by 1/(1-p)); identity in eval.
    ``seed``: the k-th training call uses seed + k (reproducible masks); None draws a fresh
    seed on every call."""

    def __init__(self, p=0.5, *, seed=None):
        super().__init__()
        self.p = checks.real("Dropout", "p", p, low=0.0, high=1.0, high_open=True)
        self.seed, self._calls = checks.seed("Dropout", seed), 0

    def extra_repr(self):
        return f"p={self.p}"

    def forward(self, x):
        x = as_input("Dropout", x)
        if not self.training or self.p == 0.0:
            return x
        seed = None if self.seed is None else (self.seed + self._calls) % 2**64
        self._calls += 1
        y, _state = ops.dropout(x, self.p, seed=seed, backend=self.backend)
        return y


class Embedding(Module):
    """Rows of ``weight`` (num_embeddings, embedding_dim) at integer ids (any shape): y =
    ids.shape + (embedding_dim,) (``dnnkit.embedding``, Numba only: cuDNN has none).
    ``padding_idx``: a row initialised to zeros that gets no gradient. weight ~ N(0, 1)."""

    def __init__(self, num_embeddings, embedding_dim, padding_idx=None, *, dtype="float32",
                 seed=None):
        super().__init__()
        cls = "Embedding"
        self.num_embeddings = checks.integer(cls, "num_embeddings", num_embeddings, 1)
        self.embedding_dim = checks.integer(cls, "embedding_dim", embedding_dim, 1)
        if padding_idx is not None:
            padding_idx = checks.integer(cls, "padding_idx", padding_idx, -self.num_embeddings)
            if padding_idx >= self.num_embeddings:
                raise ValueError(f"{cls}: padding_idx must be in [-{self.num_embeddings}, "
                                 f"{self.num_embeddings}); got {padding_idx}")
        self.padding_idx = padding_idx
        dtype = checks.float_dtype(cls, dtype)
        w = np.random.default_rng(checks.seed(cls, seed)).standard_normal(
            (self.num_embeddings, self.embedding_dim))
        if padding_idx is not None:
            w[padding_idx] = 0
        self.weight = Parameter(w.astype(dtype))

    def extra_repr(self):
        pad = f", padding_idx={self.padding_idx}" if self.padding_idx is not None else ""
        return f"{self.num_embeddings}, {self.embedding_dim}{pad}"

    def forward(self, ids):
        return ops.embedding(ids, self.weight, self.padding_idx, backend=self.backend)


class SpatialTransformer(Module):
    """``forward(img, theta)``: img (N, C, H, W) sampled at the affine grid of theta (N, 2, 3)
    (Theano's dnn_spatialtf; ``dnnkit.spatial_transformer``), out (N, C, ceil(H*sh),
    ceil(W*sw))."""

    def __init__(self, scale_height=1.0, scale_width=1.0):
        super().__init__()
        cls = "SpatialTransformer"
        self.scale = (checks.real(cls, "scale_height", scale_height, low=0.0, low_open=True),
                      checks.real(cls, "scale_width", scale_width, low=0.0, low_open=True))

    def extra_repr(self):
        return f"scale_height={self.scale[0]}, scale_width={self.scale[1]}"

    def forward(self, img, theta=None):
        if theta is None:
            if isinstance(img, (tuple, list)) and len(img) == 2:
                img, theta = img
            else:
                raise TypeError("SpatialTransformer.forward takes two inputs, (img, theta): "
                                "the image (N, C, H, W) and the affine matrices (N, 2, 3); got "
                                f"one {type(img).__name__}")
        img = as_input("SpatialTransformer", img)
        theta = as_input("SpatialTransformer", theta, img.dtype)
        return ops.spatial_transformer(img, theta, scale_height=self.scale[0],
                                       scale_width=self.scale[1], backend=self.backend)
