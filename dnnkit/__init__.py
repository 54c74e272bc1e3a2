"""dnnkit: deep-learning primitives for NVIDIA GPUs.

Every op has a hand-written Numba CUDA kernel and, where cuDNN can run it, a cuDNN path; the
``dnn.enabled`` flag (auto | forced | disabled) or a per-call ``backend=`` chooses.

The package is built in layers (docs/architecture.md, enforced by tests/test_layers.py): a
module imports only from its own layer or lower ones. This module is the top layer.

The subpackages a user names (``dnnkit.nn``, ``dnnkit.optim``, ``dnnkit.testing``, ...) are
attributes of the package without being imported by ``import dnnkit``: the module
``__getattr__`` below (PEP 562) imports one on first access, so ``import dnnkit`` stays fast
and does not load Numba (tests/test_layers.py, tests/test_packaging.py). The package ships
type hints (``py.typed``; dnnkit/hints.py).
"""

from importlib import import_module as _import_module
from typing import TYPE_CHECKING

# memory registers the dnn.allocator flag: imported here so that the flag exists (for
# DNNKIT_FLAGS, the rc file and config.describe()) before the first op runs
from . import config, dispatch, memory, ops, reference  # noqa: F401
from .arrays import current_stream, stream  # noqa: F401
from .dlpack import to_dlpack  # noqa: F401
from .errors import (CrosscheckError, CudnnError, CudnnUnavailableError,  # noqa: F401
                     DnnkitError, NumbaUnavailableError)
from .ops import *  # noqa: F401,F403 - the public ops (dnnkit.ops.__all__)
# dnnkit.split is the op; dnnkit.ops.split is the module that splits cuDNN calls
from .ops.shape import split  # noqa: F401
from .policy import select_backend  # noqa: F401
from .profile import profile  # noqa: F401
from .recurrent import RNN  # noqa: F401
from .autograd import enable_grad, is_grad_enabled, no_grad  # noqa: F401
from .tensors import Tensor, backward, tensor  # noqa: F401
from .tracing import trace  # noqa: F401

__version__ = "0.1.0"

# the public names (a type checker's --strict re-exports only these), then every public op
__all__ = ["CrosscheckError", "CudnnError", "CudnnUnavailableError", "DnnkitError",
           "NumbaUnavailableError", "RNN", "Tensor", "backward", "config", "enable_grad",
           "is_grad_enabled", "no_grad", "profile", "select_backend", "split", "tensor", "trace",
           "current_stream", "stream", "to_dlpack"]
__all__ += ops.__all__

# the subpackages a user names, imported on first access: dnnkit.nn.Conv2d after a plain
# `import dnnkit` (PEP 562); a type checker reads them as the imports below
_SUBMODULES = ("backends", "cudnn", "graphs", "models", "nn", "ops", "optim", "testing")

if TYPE_CHECKING:
    # (``import x as x``: re-exported, which --strict requires of names not in __all__)
    from . import backends as backends, cudnn as cudnn, graphs as graphs  # noqa: F401
    from . import models as models, nn as nn  # noqa: F401
    from . import ops as ops, optim as optim, testing as testing  # noqa: F401
else:
    def __getattr__(name):
        if name in _SUBMODULES:
            return _import_module(f"{__name__}.{name}")
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_SUBMODULES))
