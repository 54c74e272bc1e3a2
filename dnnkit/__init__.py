"""dnnkit: deep-learning primitives for NVIDIA GPUs.

Every op has a hand-written Numba CUDA kernel and, where cuDNN can run it, a cuDNN path; the
``dnn.enabled`` flag (auto | forced | disabled) or a per-call ``backend=`` chooses.

The package is built in layers (docs/architecture.md, enforced by tests/test_layers.py): a
module imports only from its own layer or lower ones. This module is the top layer.
"""

# memory registers the dnn.allocator flag: imported here so that the flag exists (for
# DNNKIT_FLAGS, the rc file and config.describe()) before the first op runs
from . import backends, config, dispatch, memory, reference, testing  # noqa: F401
from .errors import (CrosscheckError, CudnnError, CudnnUnavailableError,  # noqa: F401
                     DnnkitError, NumbaUnavailableError)
from .ops import *  # noqa: F401,F403 - the public ops (dnnkit.ops.__all__)
from .policy import select_backend  # noqa: F401
from .profile import profile  # noqa: F401
from .recurrent import RNN  # noqa: F401
from .tracing import trace  # noqa: F401

__version__ = "0.1.0"
