"""Public ops, one module per family. Importing this package registers every implementation."""

from .activation import activation, activation_backward, relu, sigmoid, tanh  # noqa: F401
from .softmax import log_softmax, softmax, softmax_backward  # noqa: F401
from .conv import (conv2d, conv2d_backward_data, conv2d_backward_filter,  # noqa: F401
                   conv3d, conv3d_backward_data, conv3d_backward_filter, conv_backward_bias)
