"""Layers, containers and losses on top of dnnkit's ops, called on Tensors.

``y = model(x)`` runs the ops and records the graph; ``loss.backward()`` fills every
``Parameter.grad``; an optimizer (dnnkit.optim) updates the parameters. Modules have
``parameters()``, ``named_modules()``, ``apply(fn)``, ``requires_grad_()``, ``zero_grad()``,
``train()``/``eval()``, ``state_dict()``/``load_state_dict()`` (PyTorch's names and layouts),
``save``/``load`` (.npz). ``convert(model, backend)`` pins modules to "cudnn", "numba" or back to
"auto"; each op's gradient runs on the backend its forward ran on.
"""

from .containers import ModuleList, Sequential  # noqa: F401
from .layers import (ELU, AdaptiveAvgPool2d, AvgPool2d, ClippedReLU, Conv2d,  # noqa: F401
                     Conv3d, Dropout, Embedding, Flatten, GlobalAvgPool2d, Identity, Linear,
                     LogSoftmax, MaxPool2d, MaxPool3d, ReLU, Sigmoid, Softmax,
                     SpatialTransformer, Tanh)
from .loss import CrossEntropyLoss, MSELoss, NLLLoss  # noqa: F401
from .module import Module, convert  # noqa: F401
from .norm import BatchNorm1d, BatchNorm2d, BatchNorm3d  # noqa: F401
from .parameter import Parameter  # noqa: F401
from .rnn import GRU, LSTM, RNN  # noqa: F401
