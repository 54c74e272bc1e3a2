"""Layers over dnnkit's ops, called on Tensors: each ``forward`` runs ops with the module's
``backend`` and the graph records itself (no layer keeps anything for a backward of its own).

Weights are initialised from a seeded NumPy generator as PyTorch does by default
(Kaiming-uniform with a = sqrt(5): U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weights and biases;
N(0, 1) for an embedding), and laid out as PyTorch's: a convolution's weight is
(out, in/groups, *kernel), a linear layer's (out, in).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, TypeVar

import numpy as np

from .. import ops
from ..hints import ArrayLike, DType, Padding, Size
from ..ops.conv_args import ALGOS, PRECISIONS
from ..tensors import Tensor
from . import checks
from .checks import as_input
from .module import Module
from .parameter import Parameter


_T = TypeVar("_T")


def _uniform(rng, shape, fan_in, dtype):
    bound = 1.0 / math.sqrt(max(1, fan_in))
    return rng.uniform(-bound, bound, shape).astype(dtype)


def conv_channels(cls: str, nd: int, in_channels: int, out_channels: int, kernel_size: Size,
                  groups: int) -> tuple[int, int, tuple[int, ...], int]:
    """(in, out, kernel, groups) of a convolution layer, checked: groups divide both channel
    counts (the plain and the transposed layers alike)."""
    cin = checks.integer(cls, "in_channels", in_channels, 1)
    cout = checks.integer(cls, "out_channels", out_channels, 1)
    k = checks.sizes(cls, "kernel_size", kernel_size, nd, 1)
    g = checks.integer(cls, "groups", groups, 1)
    if cin % g or cout % g:
        raise ValueError(f"{cls}: groups={g} must divide in_channels={cin} and "
                         f"out_channels={cout}")
    return cin, cout, k, g


def conv_parameters(m: Module, cls: str, nd: int, channels: tuple[int, int, tuple[int, ...], int],
                    weight_shape: tuple[int, ...], fan_in: int, bias: bool, dtype: DType,
                    seed: int | None) -> None:
    """A convolution layer's attributes and parameters: weight and bias ~ U(+-1/sqrt(fan_in))
    (PyTorch's init), the weight drawn first from the seeded generator."""
    dtype = checks.float_dtype(cls, dtype)
    rng = np.random.default_rng(checks.seed(cls, seed))
    m.nd, (m.in_channels, m.out_channels, m.kernel_size, _) = nd, channels
    m.weight = Parameter(_uniform(rng, weight_shape, fan_in, dtype))
    m.bias = Parameter(_uniform(rng, (m.out_channels,), fan_in, dtype)) \
        if checks.flag(cls, "bias", bias) else None


CONV_MODES = ("cross", "conv")
# the options a convolution layer passes to its op, and their defaults (not in repr when unset)
CONV_OPTIONS = {"mode": "cross", "algo": None, "precision": None}


def conv_options(cls: str, mode: str, algo: str | None, precision: str | None,
                 direction: str) -> dict[str, Any]:
    """A convolution layer's op options, checked: ``mode`` "cross" (PyTorch's and
    cudnn.torch's) or "conv" (the filter flipped: Theano's default conv_mode); ``algo`` one of
    the op's ``direction`` algorithms ("fwd"; "bwd_data" for the transposed layers, whose
    forward is a backward-data convolution) or None for the ``dnn.conv.algo_*`` flag;
    ``precision`` one of PRECISIONS or None for the ``dnn.conv.precision`` flag. Plain
    attributes, not state: a state dict is the same whatever they are."""
    def pick(name, value, allowed):
        if not isinstance(value, str) or value not in allowed:
            raise ValueError(f"{cls}: {name} must be one of {', '.join(allowed)}; got "
                             f"{value!r}")
        return value
    return {"mode": pick("mode", mode, CONV_MODES),
            "algo": None if algo is None else pick("algo", algo, ALGOS[direction]),
            "precision": None if precision is None else pick("precision", precision,
                                                             PRECISIONS)}


def conv_repr(m: Module, defaults: dict[str, Any]) -> str:
    """``in, out, kernel_size=, stride=, padding=`` and the options in ``defaults`` (name:
    default value) that differ from their default, as PyTorch prints a convolution layer."""
    c = m.conv
    s = (f"{m.in_channels}, {m.out_channels}, kernel_size={m.kernel_size}, "
         f"stride={c['stride']}, padding={c['padding']}")
    for name, default in defaults.items():
        if c[name] != default:
            s += f", {name}={c[name]}"
    s += "" if m.bias is not None else ", bias=False"
    for name, default in CONV_OPTIONS.items():
        if c.get(name, default) != default:
            s += f", {name}={c[name]!r}"
    return s


class _ConvNd(Module):
    fused_activations = ("relu",)       # what forward's activation= takes (nn.Sequential)

    def __init__(self, nd: int, in_channels: int, out_channels: int, kernel_size: Size,
                 stride: Size, padding: Padding, dilation: Size, groups: int, bias: bool,
                 dtype: DType, seed: int | None, mode: str, algo: str | None,
                 precision: str | None) -> None:
        super().__init__()
        cls = f"Conv{nd}d"
        cin, cout, k, g = ch = conv_channels(cls, nd, in_channels, out_channels, kernel_size,
                                             groups)
        self.conv = dict(stride=checks.sizes(cls, "stride", stride, nd, 1),
                         padding=padding if isinstance(padding, str) else
                         checks.sizes(cls, "padding", padding, nd, 0),
                         dilation=checks.sizes(cls, "dilation", dilation, nd, 1), groups=g,
                         **conv_options(cls, mode, algo, precision, "fwd"))
        if isinstance(padding, str) and padding not in ("valid", "full", "half"):
            raise ValueError(f"{cls}: padding must be an int, a tuple or one of 'valid', "
                             f"'full', 'half'; got {padding!r}")
        conv_parameters(self, cls, nd, ch, (cout, cin // g) + k, cin // g * math.prod(k), bias,
                        dtype, seed)
        self._op = ops.conv2d if nd == 2 else ops.conv3d

    def extra_repr(self) -> str:
        return conv_repr(self, {"dilation": (1,) * self.nd, "groups": 1})

    def forward(self, x: ArrayLike, activation: str | None = None) -> Tensor:
        """conv(x) (+ bias), then max(that, 0) with ``activation="relu"``, in one op call
        (``nn.Sequential`` fuses a convolution followed by a ReLU this way)."""
        x = as_input(type(self).__name__, x, self.weight.dtype)
        return self._op(x, self.weight, self.bias, **self.conv, backend=self.backend,
                        activation=activation)


class Conv2d(_ConvNd):
    """2-D convolution of (N, C, H, W); weight (out, in/groups, kh, kw), bias (out,).
    ``mode`` ("cross" or "conv"), ``algo`` and ``precision``: the op's (None: the flags)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: Size, stride: Size = 1,
                 padding: Padding = 0, dilation: Size = 1, groups: int = 1, bias: bool = True,
                 *, dtype: DType = "float32", seed: int | None = None, mode: str = "cross",
                 algo: str | None = None, precision: str | None = None) -> None:
        super().__init__(2, in_channels, out_channels, kernel_size, stride, padding, dilation,
                         groups, bias, dtype, seed, mode, algo, precision)


class Conv3d(_ConvNd):
    """3-D convolution of (N, C, D, H, W); weight (out, in/groups, kd, kh, kw).
    ``mode`` ("cross" or "conv"), ``algo`` and ``precision``: the op's (None: the flags)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: Size, stride: Size = 1,
                 padding: Padding = 0, dilation: Size = 1, groups: int = 1, bias: bool = True,
                 *, dtype: DType = "float32", seed: int | None = None, mode: str = "cross",
                 algo: str | None = None, precision: str | None = None) -> None:
        super().__init__(3, in_channels, out_channels, kernel_size, stride, padding, dilation,
                         groups, bias, dtype, seed, mode, algo, precision)


class Linear(Module):
    """y = x W^T + b for x (..., in_features): ``dnnkit.linear``, weight (out_features,
    in_features) as PyTorch's, bias (out_features,)."""

    fused_activations = ("relu",)       # what forward's activation= takes (nn.Sequential)

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *,
                 dtype: DType = "float32", seed: int | None = None) -> None:
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

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}")

    def forward(self, x: ArrayLike, activation: str | None = None) -> Tensor:
        """x W^T + b, then max(that, 0) with ``activation="relu"``, in one op call
        (``nn.Sequential`` fuses a Linear followed by a ReLU this way)."""
        x = as_input("Linear", x, self.weight.dtype)
        return ops.linear(x, self.weight, self.bias, backend=self.backend, activation=activation)


class Flatten(Module):
    """(N, ...) -> (N, prod(...)): a view (``dnnkit.reshape``)."""

    def forward(self, x: ArrayLike) -> Tensor:
        x = as_input("Flatten", x)
        if x.ndim < 1:
            raise ValueError("Flatten: the input needs a batch dimension; got a 0-d tensor")
        return ops.reshape(x, (x.shape[0], math.prod(x.shape[1:])), backend=self.backend)


class Identity(Module):
    """Returns its input (a placeholder, e.g. a residual block's shortcut)."""

    def forward(self, x: _T) -> _T:
        return x


class _Pool(Module):
    """``ceil_mode``: round the output size up (PyTorch's ceil_mode; ``dnnkit.pool2d``)."""

    def __init__(self, nd: int, mode: str, kernel_size: Size, stride: Size | None = None,
                 padding: Size = 0, ceil_mode: bool = False) -> None:
        super().__init__()
        cls = type(self).__name__
        k = checks.sizes(cls, "kernel_size", kernel_size, nd, 1)
        s = k if stride is None else checks.sizes(cls, "stride", stride, nd, 1)
        p = checks.sizes(cls, "padding", padding, nd, 0)
        if any(pi >= ki for pi, ki in zip(p, k)):
            raise ValueError(f"{cls}: padding {p} must be smaller than kernel_size {k}")
        self.ceil_mode = checks.flag(cls, "ceil_mode", ceil_mode)
        self.nd, self.mode, self.args = nd, mode, (k, s, p)
        self._op = ops.pool2d if nd == 2 else ops.pool3d

    def extra_repr(self) -> str:
        k, s, p = self.args
        return f"kernel_size={k}, stride={s}, padding={p}, ceil_mode={self.ceil_mode}"

    def forward(self, x: ArrayLike) -> Tensor:
        x = as_input(type(self).__name__, x)
        return self._op(x, *self.args, self.mode, ceil_mode=self.ceil_mode,
                        backend=self.backend)


class MaxPool2d(_Pool):
    def __init__(self, kernel_size: Size, stride: Size | None = None, padding: Size = 0, *,
                 ceil_mode: bool = False, deterministic: bool = False) -> None:
        det = checks.flag("MaxPool2d", "deterministic", deterministic)
        super().__init__(2, "max_deterministic" if det else "max", kernel_size, stride, padding,
                         ceil_mode)


class MaxPool3d(_Pool):
    def __init__(self, kernel_size: Size, stride: Size | None = None, padding: Size = 0, *,
                 ceil_mode: bool = False, deterministic: bool = False) -> None:
        det = checks.flag("MaxPool3d", "deterministic", deterministic)
        super().__init__(3, "max_deterministic" if det else "max", kernel_size, stride, padding,
                         ceil_mode)


class _AvgPool(_Pool):
    """PyTorch's AvgPool arguments, in its order: ``count_include_pad`` True divides by the
    window including the padding (average_inc_pad), False by the inputs in it
    (average_exc_pad)."""

    def __init__(self, nd: int, kernel_size: Size, stride: Size | None, padding: Size,
                 ceil_mode: bool, count_include_pad: bool) -> None:
        inc = checks.flag(type(self).__name__, "count_include_pad", count_include_pad)
        super().__init__(nd, "average_inc_pad" if inc else "average_exc_pad", kernel_size,
                         stride, padding, ceil_mode)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, count_include_pad={self.mode == 'average_inc_pad'}"


class AvgPool2d(_AvgPool):
    def __init__(self, kernel_size: Size, stride: Size | None = None, padding: Size = 0,
                 ceil_mode: bool = False, count_include_pad: bool = True) -> None:
        super().__init__(2, kernel_size, stride, padding, ceil_mode, count_include_pad)


class AvgPool3d(_AvgPool):
    def __init__(self, kernel_size: Size, stride: Size | None = None, padding: Size = 0,
                 ceil_mode: bool = False, count_include_pad: bool = True) -> None:
        super().__init__(3, kernel_size, stride, padding, ceil_mode, count_include_pad)


class GlobalAvgPool2d(Module):
    """The mean over every spatial position: (N, C, H, W) -> (N, C) (``dnnkit.global_avg_pool``;
    (N, C, D, H, W) too)."""

    def forward(self, x: ArrayLike) -> Tensor:
        x = as_input(type(self).__name__, x)
        return ops.global_avg_pool(x, backend=self.backend)


class AdaptiveAvgPool2d(GlobalAvgPool2d):
    """PyTorch's ``AdaptiveAvgPool2d`` for an output of 1 x 1, the form classifiers use:
    (N, C, H, W) -> (N, C, 1, 1). Other output sizes are refused by the constructor."""

    def __init__(self, output_size: int | Sequence[int] = 1) -> None:
        super().__init__()
        one = (lambda v: isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))
               and v == 1)      # (no `in` test: an array compares elementwise)
        if not (one(output_size) or isinstance(output_size, (tuple, list))
                and len(output_size) == 2 and all(map(one, output_size))):
            raise ValueError(f"AdaptiveAvgPool2d: only output_size 1 (a global average) is "
                             f"supported; got {output_size!r}")

    def extra_repr(self) -> str:
        return "output_size=1"

    def forward(self, x: ArrayLike) -> Tensor:
        y = super().forward(x)
        return ops.reshape(y, tuple(y.shape) + (1, 1), backend=self.backend)


class Dropout(Module):
    """Drops with probability p in training (scaling the rest by 1/(1-p)); identity in eval.
    ``seed``: the k-th training call draws mask k of the seed's sequence (``dnnkit.dropout``'s
    ``offset``: reproducible masks, and on cuDNN one RNG initialisation per run); None draws a
    fresh mask on every call. ``inplace=True`` writes the result over the input (its gradient
    needs only the mask)."""

    def __init__(self, p: float = 0.5, inplace: bool = False, *,
                 seed: int | None = None) -> None:
        super().__init__()
        self.p = checks.real("Dropout", "p", p, low=0.0, high=1.0, high_open=True)
        self.seed, self._calls = checks.seed("Dropout", seed), 0
        self.inplace = checks.flag("Dropout", "inplace", inplace)

    def extra_repr(self) -> str:
        return f"p={self.p}" + (", inplace=True" if self.inplace else "")

    def forward(self, x: ArrayLike) -> Tensor:
        x = as_input("Dropout", x)
        if not self.training or self.p == 0.0:
            return x
        offset = 0 if self.seed is None else self._calls
        self._calls += 1
        y, _state = ops.dropout(x, self.p, seed=self.seed, offset=offset,
                                out=x if self.inplace else None, backend=self.backend)
        return y


class Embedding(Module):
    """Rows of ``weight`` (num_embeddings, embedding_dim) at integer ids (any shape): y =
    ids.shape + (embedding_dim,) (``dnnkit.embedding``, Numba only: cuDNN has none).
    ``padding_idx``: a row initialised to zeros that gets no gradient. weight ~ N(0, 1)."""

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None,
                 *, dtype: DType = "float32", seed: int | None = None) -> None:
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

    def extra_repr(self) -> str:
        pad = f", padding_idx={self.padding_idx}" if self.padding_idx is not None else ""
        return f"{self.num_embeddings}, {self.embedding_dim}{pad}"

    def forward(self, ids: ArrayLike) -> Tensor:
        return ops.embedding(ids, self.weight, self.padding_idx, backend=self.backend)


class SpatialTransformer(Module):
    """``forward(img, theta)``: img (N, C, H, W) sampled at the affine grid of theta (N, 2, 3)
    (Theano's dnn_spatialtf; ``dnnkit.spatial_transformer``), out (N, C, ceil(H*sh),
    ceil(W*sw))."""

    def __init__(self, scale_height: float = 1.0, scale_width: float = 1.0) -> None:
        super().__init__()
        cls = "SpatialTransformer"
        self.scale = (checks.real(cls, "scale_height", scale_height, low=0.0, low_open=True),
                      checks.real(cls, "scale_width", scale_width, low=0.0, low_open=True))

    def extra_repr(self) -> str:
        return f"scale_height={self.scale[0]}, scale_width={self.scale[1]}"

    def forward(self, img: ArrayLike | Sequence[ArrayLike],
                theta: ArrayLike | None = None) -> Tensor:
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
