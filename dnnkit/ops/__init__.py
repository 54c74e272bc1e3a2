"""Public ops, one module per family. Importing this package registers every implementation."""

from .activation import activation, activation_backward, relu, sigmoid, tanh  # noqa: F401
from .softmax import log_softmax, softmax, softmax_backward  # noqa: F401
