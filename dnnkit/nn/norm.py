"""Batch normalization layers: ``batch_norm_train`` in training mode (batch statistics, running
statistics updated in place on the device), ``batch_norm_inference`` in eval mode (the running
statistics).

An eval-mode call whose output needs a gradient (fine-tuning with frozen statistics, or
evaluating outside ``no_grad``) differentiates the affine map y = (x - running_mean) r gamma +
beta, r = 1/sqrt(running_var + eps), through batch_norm_inference's gradient rule (on either
backend; the statistics get none). float16 data has float32 statistics, which that rule does
not mix: record such a gradient in training mode, or run eval under ``no_grad``.

State, as PyTorch's: ``weight`` (gamma), ``bias`` (beta), ``running_mean``, ``running_var``
(buffers on the device) and ``num_batches_tracked`` (a host count of training calls).
Parameters and statistics are float32 for float16 and float32 data, float64 for float64 (the
op's rule).

``forward(x, activation="relu", residual=z)`` fuses an addition of z (a ResNet block's
shortcut) and a ReLU after the normalization into the same op call (ops.batch_norm_*'s
``residual`` and ``activation``), y = relu(bn(x) + z); ``nn.Sequential`` calls it with the
ReLU for a BatchNorm followed by a ReLU.

``affine=False``: no ``weight`` and ``bias`` (None, and absent from the state dict); the ops get
constant ones and zeros (``arrays.constant``: made once per device), so y = xhat.
``track_running_stats=False``: no running statistics nor batch count (None, absent from the
state dict); batch statistics in eval mode too, so eval gives what training gives.
"""

from __future__ import annotations

import numpy as np

from .. import arrays, ops
from ..hints import ArrayLike, DType
from ..tensors import Tensor
from . import checks
from .checks import as_input
from .module import Module, Slot
from .parameter import Parameter


class _BatchNorm(Module):
    running_mean: Tensor | None           # buffers (register_buffer), None without tracking
    running_var: Tensor | None
    num_batches_tracked: int | None

    def __init__(self, ndims: tuple[int, ...], num_features: int, eps: float, momentum: float,
                 affine: bool, track_running_stats: bool, dtype: DType) -> None:
        super().__init__()
        cls = type(self).__name__
        self.num_features = checks.integer(cls, "num_features", num_features, 1)
        self.eps = checks.real(cls, "eps", eps, low=0.0, low_open=True)
        self.momentum = checks.real(cls, "momentum", momentum, low=0.0, high=1.0)
        self.affine = checks.flag(cls, "affine", affine)
        self.track_running_stats = checks.flag(cls, "track_running_stats", track_running_stats)
        dtype = checks.float_dtype(cls, dtype)
        self.ndims = ndims
        pdt = arrays.acc_dtype(np.dtype(dtype))
        c = self.num_features
        self.weight = Parameter(np.ones(c, pdt)) if self.affine else None
        self.bias = Parameter(np.zeros(c, pdt)) if self.affine else None
        if self.track_running_stats:
            self.register_buffer("running_mean", np.zeros(c, pdt))
            self.register_buffer("running_var", np.ones(c, pdt))
            self.num_batches_tracked = 0
        else:
            self.running_mean = self.running_var = self.num_batches_tracked = None

    def extra_repr(self) -> str:
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, "
                f"affine={self.affine}, track_running_stats={self.track_running_stats}")

    def _state_slots(self):
        out = super()._state_slots()
        if not self.track_running_stats:
            return out

        def write(h):
            self.num_batches_tracked = int(h)
        out["num_batches_tracked"] = Slot((), np.dtype(np.int64),
                                          lambda: np.array(self.num_batches_tracked, np.int64),
                                          write)
        return out

    def _gamma_beta(self, x):
        """weight and bias, or (affine=False) constant ones and zeros in x's parameter dtype."""
        if self.affine:
            return self.weight, self.bias
        c, pdt = self.num_features, arrays.acc_dtype(np.dtype(x.dtype))
        return arrays.constant(np.ones(c), pdt), arrays.constant(np.zeros(c), pdt)

    fused_activations = ("relu",)       # what forward's activation= takes (nn.Sequential)
    fused_residual = True               # and residual= (nn.norm_relu)

    def forward(self, x: ArrayLike, activation: str | None = None,
                residual: ArrayLike | None = None) -> Tensor:
        """The normalized x (+ ``residual``, then max(that, 0) with ``activation="relu"``) in
        one op call."""
        cls = type(self).__name__
        x = as_input(cls, x)
        if x.ndim not in self.ndims:
            raise ValueError(f"{cls}: input must be {' or '.join(f'{n}-D' for n in self.ndims)}"
                             f" (N, C{', ...' if max(self.ndims) > 2 else ''}); got shape "
                             f"{x.shape}")
        if x.shape[1] != self.num_features:
            raise ValueError(f"{cls}: input has {x.shape[1]} channels (dim 1), the layer "
                             f"{self.num_features}; shape {x.shape}")
        gamma, beta = self._gamma_beta(x)
        if not self.track_running_stats:
            # batch statistics in both modes; nothing to update
            y, _, _ = ops.batch_norm_train(x, gamma, beta, epsilon=self.eps,
                                           backend=self.backend, activation=activation,
                                           residual=residual)
            return y
        if self.training:
            y, _, _ = ops.batch_norm_train(
                x, gamma, beta, epsilon=self.eps, momentum=self.momentum,
                running_mean=self.running_mean.data, running_var=self.running_var.data,
                backend=self.backend, activation=activation, residual=residual)
            self.num_batches_tracked += 1
            return y
        # eval: the running statistics; a gradient (fine-tuning a frozen-statistics model)
        # flows to x, weight and bias through batch_norm_inference's rule
        return ops.batch_norm_inference(x, gamma, beta, self.running_mean.data,
                                        self.running_var.data, epsilon=self.eps,
                                        backend=self.backend, activation=activation,
                                        residual=residual)


class BatchNorm1d(_BatchNorm):
    """Over (N, C) or (N, C, L): one statistic per channel. ``affine``: a learnable weight and
    bias (default True); ``track_running_stats``: running statistics for eval mode (default
    True; False: batch statistics in eval mode too)."""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1,
                 affine: bool = True, track_running_stats: bool = True, *,
                 dtype: DType = "float32") -> None:
        super().__init__((2, 3), num_features, eps, momentum, affine, track_running_stats, dtype)


class BatchNorm2d(_BatchNorm):
    """Over (N, C, H, W): one statistic per channel. ``affine``, ``track_running_stats``: as
    BatchNorm1d's."""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1,
                 affine: bool = True, track_running_stats: bool = True, *,
                 dtype: DType = "float32") -> None:
        super().__init__((4,), num_features, eps, momentum, affine, track_running_stats, dtype)


class BatchNorm3d(_BatchNorm):
    """Over (N, C, D, H, W): one statistic per channel. ``affine``, ``track_running_stats``: as
    BatchNorm1d's."""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1,
                 affine: bool = True, track_running_stats: bool = True, *,
                 dtype: DType = "float32") -> None:
        super().__init__((5,), num_features, eps, momentum, affine, track_running_stats, dtype)
