"""Losses as modules over the loss ops (dnnkit/ops/loss.py): PyTorch's CrossEntropyLoss,
NLLLoss and MSELoss.

    CrossEntropyLoss   cross_entropy(logits, target)   log_softmax over dim 1, then NLL
    NLLLoss            nll_loss(logp, target)           -logp[n, target[n, ...], ...]
    MSELoss            mse_loss(x, target)              (x - target)^2

``reduction``: "mean" and "sum" return a 0-d Tensor on the device (nothing is read back:
``loss.item()`` reads it, which waits for the GPU), "none" the per-position losses. Logits and
log-probabilities are (N, C) or (N, C, d1, ...), targets integer class indices (N,) or
(N, d1, ...); positions whose target is ``ignore_index`` do not count. ``loss.backward()``
differentiates through the op's gradient rule. The log-softmax of cross_entropy runs on the
loss's backend (``nn.convert`` pins a loss like any layer); the reductions are Numba's
(cuDNN has none).
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from .. import ops
from ..hints import ArrayLike
from ..tensors import Tensor
from .checks import as_input
from .module import Module

REDUCTIONS = ("mean", "sum", "none")


def _reduction(cls, reduction):
    if not isinstance(reduction, str) or reduction not in REDUCTIONS:
        raise ValueError(f"{cls}: reduction must be one of {', '.join(REDUCTIONS)}; "
                         f"got {reduction!r}")
    return reduction


def _ignore_index(cls, value):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{cls}: ignore_index must be an integer; got {value!r}")
    return int(value)


class _ClassLoss(Module):
    _op: ClassVar[Any] = None

    def __init__(self, reduction: str = "mean", ignore_index: int = -100) -> None:
        super().__init__()
        cls = type(self).__name__
        self.reduction = _reduction(cls, reduction)
        self.ignore_index = _ignore_index(cls, ignore_index)

    def extra_repr(self) -> str:
        return f"reduction={self.reduction!r}, ignore_index={self.ignore_index}"

    def forward(self, scores: ArrayLike, target: ArrayLike) -> Tensor:
        scores = as_input(type(self).__name__, scores)
        return type(self)._op(scores, target, self.reduction, self.ignore_index,
                              backend=self.backend)


class CrossEntropyLoss(_ClassLoss):
    """log_softmax over dim 1 and the negative log-likelihood of ``target``."""
    _op = staticmethod(ops.cross_entropy)


class NLLLoss(_ClassLoss):
    """The negative log-likelihood of log-probabilities (a LogSoftmax's output)."""
    _op = staticmethod(ops.nll_loss)


class MSELoss(Module):
    """The mean (or sum, or each) of the squared differences."""

    def __init__(self, reduction: str = "mean") -> None:
        super().__init__()
        self.reduction = _reduction("MSELoss", reduction)

    def extra_repr(self) -> str:
        return f"reduction={self.reduction!r}"

    def forward(self, x: ArrayLike, target: ArrayLike) -> Tensor:
        x = as_input("MSELoss", x)
        return ops.mse_loss(x, target, self.reduction, backend=self.backend)
