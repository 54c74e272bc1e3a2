"""A trainable tensor: a leaf :class:`dnnkit.Tensor` that requires grad.

Layers keep their weights as Parameters; ``loss.backward()`` adds each one's gradient into its
``grad`` (a Tensor of the same shape and dtype), and the optimizers (dnnkit.optim) update
``data`` in place from it.
"""

from __future__ import annotations

import numpy as np

from .. import arrays
from ..hints import ArrayLike, Stream
from ..tensors import Tensor


class Parameter(Tensor):
    """``Parameter(array)``: a NumPy array (copied to the device), a Numba device array or any
    array with ``__cuda_array_interface__`` (used in place, C-contiguous), or a Tensor (its
    array, shared); float16, float32 or float64. ``requires_grad`` is True unless given."""

    __slots__ = ()

    def __init__(self, data: ArrayLike, requires_grad: bool = True, *,
                 stream: Stream = None) -> None:
        if isinstance(data, Tensor):
            data = data.data
        s = arrays.as_stream(stream)
        super().__init__(arrays.device_input("Parameter", "data", data, s), requires_grad)

    def zero_grad(self) -> None:
        self.grad = None

    def __repr__(self) -> str:
        return (f"Parameter(shape={self.shape}, dtype={np.dtype(self.dtype).name}"
                f"{'' if self.requires_grad else ', requires_grad=False'})")
