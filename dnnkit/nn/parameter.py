"""A trainable tensor: the device array and its gradient, shared by layers and optimizers."""

import numpy as np

from .. import arrays
from ..ops.elementwise import axpy


class Parameter:
    """``data``: a C-contiguous Numba device array (float16/32/64). ``grad``: None until a
    backward pass accumulates into it, then a device array of the same shape and dtype.
    Optimizers (dnnkit.optim) update ``data`` in place from ``grad``."""

    __slots__ = ("data", "grad")

    def __init__(self, data, *, stream=None):
        s = arrays.as_stream(stream)
        self.data = arrays.device_input("Parameter", "data", data, s)
        self.grad = None

    @property
    def shape(self):
        return tuple(self.data.shape)

    @property
    def dtype(self):
        return self.data.dtype

    def numpy(self):
        return self.data.copy_to_host()

    def zero_grad(self):
        self.grad = None

    def accumulate(self, g, stream=None):
        """grad += g (g: a device array of the parameter's shape; the first call takes it)."""
        if tuple(g.shape) != self.shape:
            raise ValueError(f"Parameter.accumulate: gradient of shape {tuple(g.shape)} for a "
                             f"parameter of shape {self.shape}")
        if self.grad is None:
            self.grad = g
            return
        axpy(1.0, g, self.grad, stream=stream)

    def __repr__(self):
        return f"Parameter(shape={self.shape}, dtype={np.dtype(self.dtype).name})"
