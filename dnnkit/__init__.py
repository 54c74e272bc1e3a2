"""dnnkit: deep-learning primitives for NVIDIA GPUs.

Every op has a hand-written Numba CUDA kernel and, where cuDNN can run it, a cuDNN path; the
``dnn.enabled`` flag (auto | forced | disabled) or a per-call ``backend=`` chooses.
"""

from . import backends, config, dispatch, reference, testing  # noqa: F401
from .dispatch import select_backend, trace  # noqa: F401
from .errors import (CrosscheckError, CudnnError, CudnnUnavailableError,  # noqa: F401
                     DnnkitError, NumbaUnavailableError)
from .ops import (activation, activation_backward, conv2d, conv2d_backward_data,  # noqa: F401
                  conv2d_backward_filter, conv3d, conv3d_backward_data, conv3d_backward_filter,
                  conv_backward_bias, log_softmax, relu, sigmoid, softmax, softmax_backward,
                  tanh)

__version__ = "0.1.0"
