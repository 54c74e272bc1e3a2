"""Layers, containers and losses on top of dnnkit's ops, called on Tensors.

``y = model(x)`` runs the ops and records the graph; ``loss.backward()`` fills every
``Parameter.grad``; an optimizer (dnnkit.optim) updates the parameters. Modules have
``parameters()``, ``named_modules()``, ``apply(fn)``, ``requires_grad_()``, ``zero_grad()``,
``train()``/``eval()``, ``state_dict()``/``load_state_dict()`` (PyTorch's names and layouts),
``save``/``load`` (.npz). ``convert(model, backend)`` pins modules to "cudnn", "numba" or back to
"auto"; each op's gradient runs on the backend its forward ran on.
"""

from .activation import (ELU, ClippedReLU, LogSoftmax, ReLU, Sigmoid,  # noqa: F401
                         Softmax, Tanh)
from .containers import ModuleList, Sequential, fuses, norm_relu  # noqa: F401
from .conv_transpose import ConvTranspose2d, ConvTranspose3d  # noqa: F401
from .layers import (AdaptiveAvgPool2d, AvgPool2d, AvgPool3d, Conv2d, Conv3d,  # noqa: F401
                     Dropout, Embedding, Flatten, GlobalAvgPool2d, Identity, Linear, MaxPool2d,
                     MaxPool3d, SpatialTransformer)
from .loss import CrossEntropyLoss, MSELoss, NLLLoss  # noqa: F401
from .lrn import LocalResponseNorm  # noqa: F401
from .module import Module, convert  # noqa: F401
from .norm import BatchNorm1d, BatchNorm2d, BatchNorm3d  # noqa: F401
from .parameter import Parameter  # noqa: F401
from .rnn import GRU, LSTM, RNN  # noqa: F401

# the public names (a type checker's --strict re-exports only these; tests/test_packaging.py
# checks the list against the imports above)
__all__ = [
    "AdaptiveAvgPool2d", "AvgPool2d", "AvgPool3d", "BatchNorm1d", "BatchNorm2d", "BatchNorm3d",
    "ClippedReLU", "Conv2d", "Conv3d", "ConvTranspose2d", "ConvTranspose3d", "CrossEntropyLoss",
    "Dropout", "ELU", "Embedding", "Flatten", "GRU", "GlobalAvgPool2d", "Identity", "LSTM",
    "Linear", "LocalResponseNorm", "LogSoftmax", "MSELoss", "MaxPool2d", "MaxPool3d", "Module",
    "ModuleList", "NLLLoss", "Parameter", "RNN", "ReLU", "Sequential", "Sigmoid", "Softmax",
    "SpatialTransformer", "Tanh", "convert", "fuses", "norm_relu",
]
