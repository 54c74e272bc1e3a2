"""Float64 NumPy references: the definitions every backend is checked against.

One module per op family; every public function is available here as well
(``from dnnkit import reference; reference.pool_forward(...)``). NumPy only: the references
import nothing of dnnkit's but the RNN parameter layout (dnnkit/rnn_layout.py).

The family modules load on first use of one of their names (PEP 562 ``__getattr__``): the op
modules name ``reference`` at import but call it only when checking, and ``import dnnkit``
stays cheap (tests/test_packaging.py times it).
"""

from importlib import import_module as _import_module
from typing import TYPE_CHECKING

# {public name: the family module that defines it}
_WHERE = {name: module for module, names in {
    "activations": ("activation", "activation_backward", "dropout", "softmax",
                    "softmax_backward"),
    "batchnorm": ("batch_norm_backward", "batch_norm_inference", "batch_norm_train"),
    "compare": ("rel_error",),
    "conv": ("conv_backward_bias", "conv_backward_data", "conv_backward_filter",
             "conv_forward"),
    "lrn": ("lrn", "lrn_backward", "lrn_window"),
    "pool": ("pool_backward", "pool_forward", "pool_windows"),
    "rnn": ("rnn_backward", "rnn_forward"),
    "spatial": ("affine_grid", "affine_grid_backward", "grid_sample", "grid_sample_backward",
                "off_kinks", "spatial_grid_coords", "spatial_kinks", "spatial_transformer"),
}.items() for name in names}

__all__ = sorted(_WHERE)

# reference.lrn names both a module and its function: loaded here, so that the function, bound
# after the module, is what the package's attribute holds (a later import of the module
# reuses it and does not rebind the name)
from .lrn import lrn, lrn_backward, lrn_window  # noqa: E402,F401

if TYPE_CHECKING:
    from .activations import (activation, activation_backward, dropout, softmax,  # noqa: F401
                              softmax_backward)
    from .batchnorm import (batch_norm_backward, batch_norm_inference,  # noqa: F401
                            batch_norm_train)
    from .compare import rel_error  # noqa: F401
    from .conv import (conv_backward_bias, conv_backward_data,  # noqa: F401
                       conv_backward_filter, conv_forward)
    from .pool import pool_backward, pool_forward, pool_windows  # noqa: F401
    from .rnn import rnn_backward, rnn_forward  # noqa: F401
    from .spatial import (affine_grid, affine_grid_backward, grid_sample,  # noqa: F401
                          grid_sample_backward, off_kinks, spatial_grid_coords,
                          spatial_kinks, spatial_transformer)
else:
    def __getattr__(name):
        module = _WHERE.get(name)
        if module is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(_import_module(f"{__name__}.{module}"), name)
        globals()[name] = value         # later lookups are plain attribute reads
        return value


def __dir__():
    return sorted(set(globals()) | set(_WHERE))
