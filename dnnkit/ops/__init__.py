"""Public ops, one module per family. Importing this package registers every implementation.

A family module may define ``selfcheck_cases(Case)`` returning its rows of
``python -m dnnkit check`` (dnnkit/selfcheck.py collects them from ``FAMILIES``).
"""

from . import activation as _activation, conv as _conv, softmax as _softmax
from .activation import activation, activation_backward, relu, sigmoid, tanh  # noqa: F401
from .softmax import log_softmax, softmax, softmax_backward  # noqa: F401
from .conv import (conv2d, conv2d_backward_data, conv2d_backward_filter,  # noqa: F401
                   conv3d, conv3d_backward_data, conv3d_backward_filter, conv_backward_bias)

FAMILIES = [_activation, _softmax, _conv]

__all__ = ["activation", "activation_backward", "relu", "sigmoid", "tanh",
           "log_softmax", "softmax", "softmax_backward",
           "conv2d", "conv2d_backward_data", "conv2d_backward_filter", "conv3d",
           "conv3d_backward_data", "conv3d_backward_filter", "conv_backward_bias"]

# New families: import the module, append it to FAMILIES and its public names to __all__.
