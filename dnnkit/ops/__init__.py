"""Public ops, one module per family. Importing this package registers every implementation.

A family module may define ``selfcheck_cases(Case)`` returning its rows of
``python -m dnnkit check`` (dnnkit/selfcheck.py collects them from ``FAMILIES``).

Adding a family: import its module below, add it to ``FAMILIES`` and its public names to the
import list and to ``__all__``.
"""

from . import (activation as _activation, batchnorm as _batchnorm, conv as _conv,
               dropout as _dropout, pool as _pool, rnn as _rnn, softmax as _softmax,
               spatial as _spatial)
from . import rnn_cudnn as _rnn_cudnn  # noqa: F401  (registers the cuDNN RNN)
from .activation import activation, activation_backward, relu, sigmoid, tanh  # noqa: F401
from .batchnorm import (batch_norm_backward, batch_norm_inference,  # noqa: F401
                        batch_norm_train)
from .conv import (conv2d, conv2d_backward_data, conv2d_backward_filter,  # noqa: F401
                   conv3d, conv3d_backward_data, conv3d_backward_filter, conv_backward_bias)
from .dropout import DropoutState, dropout, dropout_backward  # noqa: F401
from .pool import pool2d, pool2d_backward, pool3d, pool3d_backward  # noqa: F401
from .rnn import rnn_backward, rnn_forward  # noqa: F401
from .softmax import log_softmax, softmax, softmax_backward  # noqa: F401
from .spatial import (affine_grid, affine_grid_backward, grid_sample,  # noqa: F401
                      grid_sample_backward, spatial_transformer)

FAMILIES = [_activation, _softmax, _conv, _pool, _batchnorm, _dropout, _rnn, _spatial]

__all__ = [
    # activation
    "activation", "activation_backward", "relu", "sigmoid", "tanh",
    # softmax
    "log_softmax", "softmax", "softmax_backward",
    # convolution
    "conv2d", "conv2d_backward_data", "conv2d_backward_filter", "conv3d",
    "conv3d_backward_data", "conv3d_backward_filter", "conv_backward_bias",
    # pooling
    "pool2d", "pool2d_backward", "pool3d", "pool3d_backward",
    # batch normalization
    "batch_norm_train", "batch_norm_inference", "batch_norm_backward",
    # dropout
    "dropout", "dropout_backward", "DropoutState",
    # recurrent networks
    "rnn_forward", "rnn_backward",
    # spatial transformer
    "affine_grid", "affine_grid_backward", "grid_sample", "grid_sample_backward",
    "spatial_transformer",
    # matrix products
]
