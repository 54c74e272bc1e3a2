"""Layers, models and losses on top of dnnkit's ops.

Every module has ``forward(x)`` and ``backward(grad_out)`` (returns the input gradient and
accumulates parameter gradients), ``parameters()``, ``zero_grad()``, ``train()``/``eval()``,
``state_dict()``/``load_state_dict()``, ``save``/``load`` (.npz). The backend each op ran on in
forward is recorded (``module.used``) and its gradient runs there; ``convert(model, backend)``
pins modules to "cudnn", "numba" or back to "auto".
"""

from .layers import (ELU, GRU, LSTM, RNN, AvgPool2d, BatchNorm1d, BatchNorm2d,  # noqa: F401
                     BatchNorm3d, ClippedReLU, Conv2d, Conv3d, Dropout, Flatten, Linear,
                     LogSoftmax, MaxPool2d, MaxPool3d, ReLU, Sigmoid, Softmax,
                     SpatialTransformer, Tanh)
from .loss import CrossEntropyLoss, MSELoss  # noqa: F401
from .module import Module, Sequential, convert  # noqa: F401
from .parameter import Parameter  # noqa: F401
