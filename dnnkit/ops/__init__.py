"""Public ops, one module per family. Importing this package registers every implementation.

A family module may define ``selfcheck_cases(Case)`` returning its rows of
``python -m dnnkit check`` (dnnkit/selfcheck.py collects them from ``FAMILIES``).

Adding a family: import its module below, add it to ``FAMILIES`` and its public names to the
import list and to ``__all__``.
"""

from . import (activation as _activation, conv as _conv,
               dropout as _dropout, pool as _pool, rnn as _rnn, softmax as _softmax,
               spatial as _spatial)
from . import rnn_cudnn as _rnn_cudnn  # noqa: F401  (registers the cuDNN RNN)
from . import batchnorm_cases as _batchnorm_cases   # (imports the family, ops/batchnorm.py)
from . import batchnorm_eval_grad as _batchnorm_eval_grad  # noqa: F401  (a gradient rule)
from . import conv_grad as _conv_grad  # noqa: F401  (the convolutions' gradient rules)
from . import batchnorm_runners as _batchnorm_runners  # noqa: F401  (the memo's runners)
from . import embedding as _embedding, global_pool as _global_pool, loss as _loss
from . import matmul as _matmul
from . import lrn as _lrn
from . import conv_transpose as _conv_transpose
from . import arith as _arith, reduce as _reduce, shape as _shape
from . import opdocs as _opdocs
from ..autograd import PUBLIC as _PUBLIC
from .arith import add, divide, multiply, subtract  # noqa: F401
from .reduce import broadcast_to, mean, mean_backward, sum, sum_to  # noqa: F401,A004
# (shape.split is exported as dnnkit.split by the package: dnnkit.ops.split is the module
# that splits cuDNN calls under its 32-bit limit)
from .shape import concatenate, reshape, take_batch, take_batch_backward  # noqa: F401
from .activation import activation, activation_backward, relu, sigmoid, tanh  # noqa: F401
from .batchnorm import (batch_norm_backward, batch_norm_inference,  # noqa: F401
                        batch_norm_train)
from .conv import (conv2d, conv2d_backward_data, conv2d_backward_filter,  # noqa: F401
                   conv3d, conv3d_backward_data, conv3d_backward_filter, conv_backward_bias)
from .conv_transpose import conv_transpose2d, conv_transpose3d  # noqa: F401
from .dropout import DropoutState, dropout, dropout_backward  # noqa: F401
from .embedding import embedding, embedding_backward  # noqa: F401
from .lrn import lrn, lrn_backward  # noqa: F401
from .loss import (cross_entropy, cross_entropy_backward, mse_loss,  # noqa: F401
                   mse_loss_backward, nll_loss, nll_loss_backward)
from .matmul import linear, matmul  # noqa: F401
from .pool import pool2d, pool2d_backward, pool3d, pool3d_backward  # noqa: F401
from .global_pool import global_avg_pool  # noqa: F401
from .rnn import rnn_backward, rnn_forward  # noqa: F401
from .softmax import log_softmax, softmax, softmax_backward  # noqa: F401
from .spatial import (affine_grid, affine_grid_backward, grid_sample,  # noqa: F401
                      grid_sample_backward, spatial_transformer)

FAMILIES = [_activation, _softmax, _conv, _pool, _batchnorm_cases, _dropout, _rnn, _spatial]
FAMILIES += [_matmul, _embedding, _loss, _global_pool]
FAMILIES += [_arith, _reduce, _shape]
FAMILIES += [_lrn]
FAMILIES += [_conv_transpose]

__all__ = [
    # activation
    "activation", "activation_backward", "relu", "sigmoid", "tanh",
    # softmax
    "log_softmax", "softmax", "softmax_backward",
    # convolution
    "conv2d", "conv2d_backward_data", "conv2d_backward_filter", "conv3d",
    "conv3d_backward_data", "conv3d_backward_filter", "conv_backward_bias",
    "conv_transpose2d", "conv_transpose3d",
    # pooling
    "pool2d", "pool2d_backward", "pool3d", "pool3d_backward", "global_avg_pool",
    # batch normalization
    "batch_norm_train", "batch_norm_inference", "batch_norm_backward",
    # local response normalization
    "lrn", "lrn_backward",
    # dropout
    "dropout", "dropout_backward", "DropoutState",
    # recurrent networks
    "rnn_forward", "rnn_backward",
    # spatial transformer
    "affine_grid", "affine_grid_backward", "grid_sample", "grid_sample_backward",
    "spatial_transformer",
    # matrix products
    "matmul", "linear",
    # embedding
    "embedding", "embedding_backward",
    # losses
    "cross_entropy", "cross_entropy_backward", "nll_loss", "nll_loss_backward", "mse_loss",
    "mse_loss_backward",
    # tensor arithmetic, reductions and shapes (docs/tensor-ops.md)
    "add", "subtract", "multiply", "divide", "sum", "mean", "sum_to", "broadcast_to",
    "mean_backward", "reshape", "concatenate", "take_batch", "take_batch_backward",
]

# the docstrings' shared paragraphs (dnnkit/ops/opdocs.py), now that every family is imported
_opdocs.complete([*_PUBLIC.values(), *(globals()[n] for n in __all__)])
