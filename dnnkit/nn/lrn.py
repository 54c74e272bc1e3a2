"""Local response normalization across channels as a layer (``dnnkit.lrn``): no parameters,
the same in training and eval."""

from __future__ import annotations

from .. import ops
from ..hints import ArrayLike
from ..ops.lrn import check_params
from ..tensors import Tensor
from .checks import as_input
from .module import Module


class LocalResponseNorm(Module):
    """y[c] = x[c] / (k + alpha/size * sum of x[c']^2 over the window of c)^beta over the
    channels (dim 1) of (N, C, L), (N, C, H, W) or (N, C, D, H, W); the window is [c -
    (size-1)//2, c + size//2] clipped to the channels (cuDNN's). PyTorch's LocalResponseNorm
    has the same window for an odd size (AlexNet's, GoogLeNet's 5) and one channel earlier for
    an even size. cudnn.torch's SpatialCrossMapLRN(size, alpha, beta, k) is the same layer."""

    def __init__(self, size: int, alpha: float = 1e-4, beta: float = 0.75,
                 k: float = 1.0) -> None:
        super().__init__()
        self.size, self.alpha, self.beta, self.k = check_params("LocalResponseNorm", size,
                                                                alpha, beta, k)

    def extra_repr(self) -> str:
        return f"{self.size}, alpha={self.alpha}, beta={self.beta}, k={self.k}"

    def forward(self, x: ArrayLike) -> Tensor:
        x = as_input("LocalResponseNorm", x)
        if x.ndim not in (3, 4, 5):
            raise ValueError(f"LocalResponseNorm: input must be 3-D to 5-D (N, C, ...); got "
                             f"shape {x.shape}")
        return ops.lrn(x, self.size, self.alpha, self.beta, self.k, backend=self.backend)
