"""Transposed convolution layers (``dnnkit.conv_transpose2d`` / ``conv_transpose3d``), with
PyTorch's constructor, parameter names, weight layout (in, out/groups, *kernel) and default
initialisation, so that a PyTorch ``ConvTranspose2d/3d`` state dict loads unchanged.

PyTorch initialises them as its other convolutions, Kaiming-uniform with a = sqrt(5), with the
fan-in read from the weight's second dimension: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weight
and bias, fan_in = out_channels/groups * prod(kernel_size).
"""

from __future__ import annotations

import math

from .. import ops
from ..hints import ArrayLike, DType, Size
from ..ops.conv_transpose import output_size as transposed_size
from ..tensors import Tensor
from . import checks
from .checks import as_input
from .layers import conv_channels, conv_options, conv_parameters, conv_repr
from .module import Module


class _ConvTransposeNd(Module):
    def __init__(self, nd: int, in_channels: int, out_channels: int, kernel_size: Size,
                 stride: Size, padding: Size, output_padding: Size, groups: int, bias: bool,
                 dilation: Size, dtype: DType, seed: int | None, mode: str, algo: str | None,
                 precision: str | None) -> None:
        super().__init__()
        cls = f"ConvTranspose{nd}d"
        cin, cout, k, g = ch = conv_channels(cls, nd, in_channels, out_channels, kernel_size,
                                             groups)
        s = checks.sizes(cls, "stride", stride, nd, 1)
        d = checks.sizes(cls, "dilation", dilation, nd, 1)
        op = checks.sizes(cls, "output_padding", output_padding, nd, 0)
        if any(o >= max(si, di) for o, si, di in zip(op, s, d)):
            raise ValueError(f"{cls}: output_padding must be smaller than max(stride, "
                             f"dilation) in every spatial dim; got output_padding={op}, "
                             f"stride={s}, dilation={d}")
        self.conv = dict(stride=s, padding=checks.sizes(cls, "padding", padding, nd, 0),
                         output_padding=op, dilation=d, groups=g,
                         **conv_options(cls, mode, algo, precision, "bwd_data"))
        # PyTorch's layout (in, out/groups, *kernel); its fan-in is weight.size(1) * kernel
        conv_parameters(self, cls, nd, ch, (cin, cout // g) + k, cout // g * math.prod(k),
                        bias, dtype, seed)
        self._op = ops.conv_transpose2d if nd == 2 else ops.conv_transpose3d

    def extra_repr(self) -> str:
        return conv_repr(self, {"output_padding": (0,) * self.nd, "dilation": (1,) * self.nd,
                                "groups": 1})

    def forward(self, x: ArrayLike, output_size: Size | None = None) -> Tensor:
        """``output_size`` (PyTorch's): the spatial sizes wanted (or the whole shape), one of
        those the stride allows; it sets output_padding for this call."""
        cls = type(self).__name__
        x = as_input(cls, x, self.weight.dtype)
        kw = self.conv
        if output_size is not None:
            kw = dict(kw, output_padding=self._output_padding(cls, x, output_size))
        return self._op(x, self.weight, self.bias, **kw, backend=self.backend)

    def _output_padding(self, cls, x, size):
        """The output_padding that gives the spatial sizes ``size`` (PyTorch's rule: each
        between the smallest output size and that plus max(stride, dilation) - 1)."""
        nd, c = self.nd, self.conv
        n = len(size) if isinstance(size, (tuple, list)) else nd
        want = checks.sizes(cls, "output_size", size, n, 0)[-nd:]
        if n not in (nd, nd + 2) or x.ndim != nd + 2:
            raise ValueError(f"{cls}: output_size must give the {nd} spatial sizes (or the "
                             f"whole output shape) for an input of {nd + 2} dims; got "
                             f"{size!r}, x {tuple(x.shape)}")
        low = transposed_size(cls, nd, x.shape[2:], self.kernel_size, c["stride"],
                              c["padding"], (0,) * nd, c["dilation"])
        pad = tuple(w - lo for w, lo in zip(want, low))
        if any(p < 0 or p >= max(s, d) for p, s, d in zip(pad, c["stride"], c["dilation"])):
            high = tuple(lo + max(s, d) - 1 for lo, s, d in zip(low, c["stride"], c["dilation"]))
            raise ValueError(f"{cls}: output_size {want} is not reachable from x "
                             f"{tuple(x.shape)}: each size must lie between {low} and {high}")
        return pad


class ConvTranspose2d(_ConvTransposeNd):
    """2-D transposed convolution of (N, C_in, H, W); weight (in, out/groups, kh, kw), bias
    (out,): ``dnnkit.conv_transpose2d``. PyTorch's arguments in PyTorch's order; padding and
    output_padding are ints or pairs. ``mode`` ("cross" or "conv": the kernel flipped),
    ``algo`` (a backward-data algorithm: the op's forward is one) and ``precision`` are passed
    to the op (None: the ``dnn.conv`` flags)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: Size,
                 stride: Size = 1, padding: Size = 0, output_padding: Size = 0, groups: int = 1,
                 bias: bool = True, dilation: Size = 1, *, dtype: DType = "float32",
                 seed: int | None = None, mode: str = "cross", algo: str | None = None,
                 precision: str | None = None) -> None:
        super().__init__(2, in_channels, out_channels, kernel_size, stride, padding,
                         output_padding, groups, bias, dilation, dtype, seed, mode, algo,
                         precision)


class ConvTranspose3d(_ConvTransposeNd):
    """3-D transposed convolution of (N, C_in, D, H, W); weight (in, out/groups, kd, kh, kw),
    bias (out,): ``dnnkit.conv_transpose3d``, with PyTorch's arguments in PyTorch's order;
    ``mode``, ``algo`` and ``precision`` as ConvTranspose2d's."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: Size,
                 stride: Size = 1, padding: Size = 0, output_padding: Size = 0, groups: int = 1,
                 bias: bool = True, dilation: Size = 1, *, dtype: DType = "float32",
                 seed: int | None = None, mode: str = "cross", algo: str | None = None,
                 precision: str | None = None) -> None:
        super().__init__(3, in_channels, out_channels, kernel_size, stride, padding,
                         output_padding, groups, bias, dilation, dtype, seed, mode, algo,
                         precision)
