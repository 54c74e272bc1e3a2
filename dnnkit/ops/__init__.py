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

from . import pool as _pool  # noqa: E402
from .pool import pool2d, pool2d_backward, pool3d, pool3d_backward  # noqa: E402,F401
FAMILIES.append(_pool)
__all__ += ["pool2d", "pool2d_backward", "pool3d", "pool3d_backward"]

from . import batchnorm as _batchnorm, dropout as _dropout  # noqa: E402
from .batchnorm import (batch_norm_backward, batch_norm_inference,  # noqa: E402,F401
                        batch_norm_train)
from .dropout import DropoutState, dropout, dropout_backward  # noqa: E402,F401
FAMILIES += [_batchnorm, _dropout]
__all__ += ["batch_norm_train", "batch_norm_inference", "batch_norm_backward",
            "dropout", "dropout_backward", "DropoutState"]
from . import rnn_cudnn as _rnn_cudnn  # noqa: E402,F401  (registers the cuDNN RNN)

from . import rnn as _rnn  # noqa: E402
from .rnn import rnn_backward, rnn_forward  # noqa: E402,F401
FAMILIES.append(_rnn)
__all__ += ["rnn_forward", "rnn_backward"]

from . import spatial as _spatial  # noqa: E402
from .spatial import (affine_grid, affine_grid_backward, grid_sample,  # noqa: E402,F401
                      grid_sample_backward, spatial_transformer)
FAMILIES.append(_spatial)
__all__ += ["affine_grid", "affine_grid_backward", "grid_sample", "grid_sample_backward",
            "spatial_transformer"]
