"""Float64 NumPy references: the definitions every backend is checked against.

One module per op family; every public function is available here as well
(``from dnnkit import reference; reference.pool_forward(...)``). NumPy only: the references
import nothing of dnnkit's but the RNN parameter layout (dnnkit/rnn_layout.py).
"""

from .activations import (activation, activation_backward, dropout, softmax,  # noqa: F401
                          softmax_backward)
from .batchnorm import (batch_norm_backward, batch_norm_inference,  # noqa: F401
                        batch_norm_train)
from .compare import rel_error  # noqa: F401
from .conv import (conv_backward_bias, conv_backward_data, conv_backward_filter,  # noqa: F401
                   conv_forward)
from .lrn import lrn, lrn_backward, lrn_window  # noqa: F401
from .pool import pool_backward, pool_forward, pool_windows  # noqa: F401
from .rnn import rnn_backward, rnn_forward  # noqa: F401
from .spatial import (affine_grid, affine_grid_backward, grid_sample,  # noqa: F401
                      grid_sample_backward, off_kinks, spatial_grid_coords, spatial_kinks,
                      spatial_transformer)
