"""Batch normalization layers: ``batch_norm_train`` in training mode (batch statistics, running
statistics updated in place on the device), ``batch_norm_inference`` in eval mode (the running
statistics).

An eval-mode call whose output needs a gradient (the input or gamma/beta require grad and
gradients are on: fine-tuning with frozen statistics, or evaluating outside ``no_grad``) is
the same affine map written with differentiable ops, per channel c:

    scale = gamma / sqrt(running_var + eps)      (1/sqrt by batch_norm_inference of ones)
    y = x * scale + (beta - running_mean * scale)

State, as PyTorch's: ``weight`` (gamma), ``bias`` (beta), ``running_mean``, ``running_var``
(buffers on the device) and ``num_batches_tracked`` (a host count of training calls).
Parameters and statistics are float32 for float16 and float32 data, float64 for float64 (the
op's rule).
"""

import numpy as np

from .. import arrays, ops
from ..autograd import is_grad_enabled
from . import checks
from .checks import as_input
from .module import Module, Slot
from .parameter import Parameter


class _BatchNorm(Module):
    def __init__(self, ndims, num_features, eps, momentum, dtype):
        super().__init__()
        cls = type(self).__name__
        self.num_features = checks.integer(cls, "num_features", num_features, 1)
        self.eps = checks.real(cls, "eps", eps, low=0.0, low_open=True)
        self.momentum = checks.real(cls, "momentum", momentum, low=0.0, high=1.0)
        dtype = checks.float_dtype(cls, dtype)
        self.ndims = ndims
        pdt = arrays.acc_dtype(np.dtype(dtype))
        c = self.num_features
        self.weight = Parameter(np.ones(c, pdt))
        self.bias = Parameter(np.zeros(c, pdt))
        self.register_buffer("running_mean", np.zeros(c, pdt))
        self.register_buffer("running_var", np.ones(c, pdt))
        self.num_batches_tracked = 0

    def extra_repr(self):
        return f"{self.num_features}, eps={self.eps}, momentum={self.momentum}"

    def _state_slots(self):
        out = super()._state_slots()

        def write(h):
            self.num_batches_tracked = int(h)
        out["num_batches_tracked"] = Slot((), np.dtype(np.int64),
                                          lambda: np.array(self.num_batches_tracked, np.int64),
                                          write)
        return out

    def forward(self, x):
        cls = type(self).__name__
        x = as_input(cls, x)
        if x.ndim not in self.ndims:
            raise ValueError(f"{cls}: input must be {' or '.join(f'{n}-D' for n in self.ndims)}"
                             f" (N, C{', ...' if max(self.ndims) > 2 else ''}); got shape "
                             f"{x.shape}")
        if x.shape[1] != self.num_features:
            raise ValueError(f"{cls}: input has {x.shape[1]} channels (dim 1), the layer "
                             f"{self.num_features}; shape {x.shape}")
        if self.training:
            y, _, _ = ops.batch_norm_train(
                x, self.weight, self.bias, epsilon=self.eps, momentum=self.momentum,
                running_mean=self.running_mean.data, running_var=self.running_var.data,
                backend=self.backend)
            self.num_batches_tracked += 1
            return y
        rm, rv = self.running_mean.data, self.running_var.data
        if not (is_grad_enabled() and (x.requires_grad or self.weight.requires_grad or
                                       self.bias.requires_grad)):
            return ops.batch_norm_inference(x, self.weight.data, self.bias.data, rm, rv,
                                            epsilon=self.eps, backend=self.backend)
        if x.dtype != self.weight.dtype:
            raise RuntimeError(
                f"{cls}: an eval-mode forward of {x.dtype} data that records a gradient is "
                f"not supported (its statistics are {self.weight.dtype}); run it under "
                f"dnnkit.no_grad() or in training mode")
        c, kw = self.num_features, dict(backend=self.backend)
        pdt = self.weight.dtype
        one = arrays.constant(np.ones((1, c)), pdt)
        zero = arrays.constant(np.zeros(c), pdt)
        ones = arrays.constant(np.ones(c), pdt)
        inv = ops.batch_norm_inference(one, ones, zero, zero, rv, epsilon=self.eps, **kw)
        scale = ops.multiply(self.weight, ops.reshape(inv, (c,), **kw), **kw)
        shift = ops.subtract(self.bias, ops.multiply(rm, scale, **kw), **kw)
        shape = (1, c) + (1,) * (x.ndim - 2)
        return ops.add(ops.multiply(x, ops.reshape(scale, shape, **kw), **kw),
                       ops.reshape(shift, shape, **kw), **kw)


class BatchNorm1d(_BatchNorm):
    """Over (N, C) or (N, C, L): one statistic per channel."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, *, dtype="float32"):
        super().__init__((2, 3), num_features, eps, momentum, dtype)


class BatchNorm2d(_BatchNorm):
    """Over (N, C, H, W): one statistic per channel."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, *, dtype="float32"):
        super().__init__((4,), num_features, eps, momentum, dtype)


class BatchNorm3d(_BatchNorm):
    """Over (N, C, D, H, W): one statistic per channel."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, *, dtype="float32"):
        super().__init__((5,), num_features, eps, momentum, dtype)
