"""Activation and softmax layers (``dnnkit.activation``, ``dnnkit.softmax``).

``inplace=True`` (PyTorch's and cudnn.torch's option) writes the activation over its input
(``out=x``): no new array, and the input Tensor comes back changed, its version bumped.
Backward then has only y, which gives the exact slope of ReLU, Tanh, Sigmoid and ELU with
alpha > 0; ClippedReLU (y == ceiling for every x >= ceiling) needs x, so its backward after an
in-place forward raises RuntimeError (inference under ``no_grad`` is fine). A graph that saved
the input's old value (a Sigmoid's output, say, feeding an in-place ReLU) refuses to
differentiate it, with a RuntimeError naming the op, instead of a silently wrong gradient.
"""

from __future__ import annotations

import numpy as np

from .. import ops
from ..hints import ArrayLike
from ..tensors import Tensor
from . import checks
from .checks import as_input
from .module import Module


class _Activation(Module):
    mode, coef = "relu", 0.0

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.inplace = checks.flag(type(self).__name__, "inplace", inplace)

    def extra_repr(self) -> str:
        return "inplace=True" if self.inplace else ""

    def forward(self, x: ArrayLike) -> Tensor:
        x = as_input(type(self).__name__, x)
        if self.inplace:
            return ops.activation(x, self.mode, self.coef, out=x, backend=self.backend)
        return ops.activation(x, self.mode, self.coef, backend=self.backend)


class ReLU(_Activation):
    """max(x, 0); ``inplace=True`` overwrites x (backward exact, from y)."""
    mode = "relu"


class Tanh(_Activation):
    """tanh(x); ``inplace=True`` overwrites x (backward exact, from y)."""
    mode = "tanh"


class Sigmoid(_Activation):
    """1 / (1 + exp(-x)); ``inplace=True`` overwrites x (backward exact, from y)."""
    mode = "sigmoid"


class ClippedReLU(_Activation):
    """min(max(x, 0), ceiling). ``inplace=True`` overwrites x: inference only, since the
    gradient needs x (y == ceiling for every x >= ceiling)."""
    mode = "clipped_relu"

    def __init__(self, ceiling: float, inplace: bool = False) -> None:
        super().__init__(inplace)
        self.coef = checks.real("ClippedReLU", "ceiling", ceiling, low=0.0, low_open=True)

    def extra_repr(self) -> str:
        return f"ceiling={self.coef}" + (", inplace=True" if self.inplace else "")


class ELU(_Activation):
    """x if x > 0 else alpha (exp(x) - 1). ``inplace=True`` overwrites x; backward from y is
    exact for alpha > 0 (y < 0 exactly where x < 0)."""
    mode = "elu"

    def __init__(self, alpha: float = 1.0, inplace: bool = False) -> None:
        super().__init__(inplace)
        self.coef = checks.real("ELU", "alpha", alpha)

    def extra_repr(self) -> str:
        return f"alpha={self.coef}" + (", inplace=True" if self.inplace else "")


class Softmax(Module):
    """Softmax over the channels ("channel": dim 1 at every position) or over everything but
    the batch ("instance"), of (N, C), (N, C, H, W) or (N, C, D, H, W) (``dnnkit.softmax``;
cudnn.torch's SpatialSoftMax and VolumetricSoftMax are the channel mode of 4-D and 5-D).

    ``algo``: "accurate" (default; the maximum is subtracted first, so it never overflows),
    "fast" (no subtraction, cuDNN's FAST: overflows for logits above ~88 in float32) or "log"
    (log-softmax, as LogSoftmax). ``dim``: PyTorch's spelling of the channel mode, 1 (or -1 of
    a 2-D input): the one dimension the op normalises alone; None (default) follows ``mode``."""
    ALGOS = ("fast", "accurate", "log")
    DEFAULT_ALGO = "accurate"

    def __init__(self, mode: str = "channel", *, algo: str | None = None,
                 dim: int | None = None) -> None:
        super().__init__()
        cls = type(self).__name__
        if not isinstance(mode, str) or mode not in ("channel", "instance"):
            raise ValueError(f"{cls}: mode must be 'channel' or 'instance'; got {mode!r}")
        algo = self.DEFAULT_ALGO if algo is None else algo
        if not isinstance(algo, str) or algo not in self.ALGOS:
            raise ValueError(f"{cls}: algo must be {' or '.join(map(repr, self.ALGOS))}; got "
                             f"{algo!r}")
        if dim is not None:
            if isinstance(dim, (bool, np.bool_)) or not isinstance(dim, (int, np.integer)):
                raise TypeError(f"{cls}: dim must be an int or None; got {dim!r}")
            if (dim >= 0 and dim != 1) or mode != "channel":
                raise ValueError(f"{cls}: dim={dim!r} with mode={mode!r}: the op normalises "
                                 f"over dim 1 (the channels; -1 of a 2-D input) or, with "
                                 f"mode='instance' and no dim, over all but the batch")
            dim = int(dim)
        self.mode, self.algo, self.dim = mode, algo, dim

    def extra_repr(self) -> str:
        dim = "" if self.dim is None else f", dim={self.dim}"
        return f"mode={self.mode!r}, algo={self.algo!r}{dim}"

    def forward(self, x: ArrayLike) -> Tensor:
        cls = type(self).__name__
        x = as_input(cls, x)
        if self.dim is not None:
            d = self.dim + x.ndim if self.dim < 0 else self.dim
            if d != 1:
                which = f"dimension {d}" if 0 <= d < x.ndim else "out of range"
                raise ValueError(f"{cls}: dim={self.dim} of a {x.ndim}-D input is {which}; the "
                                 f"op normalises over dim 1 (the channels) only")
        return ops.softmax(x, self.algo, self.mode, backend=self.backend)


class LogSoftmax(Softmax):
    """Log-softmax (``dnnkit.softmax(x, "log", mode)``); ``mode`` and ``dim`` as Softmax's."""
    ALGOS = ("log",)
    DEFAULT_ALGO = "log"
