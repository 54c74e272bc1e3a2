"""dnnkit inside PyTorch: a PyTorch model's layers on dnnkit's backends (docs/torch.md).

    import dnnkit.torch
    report = dnnkit.torch.convert(model, backend="numba")    # in place, same Parameters
    print(report)
    dnnkit.torch.compare(model, x, loss_fn=loss).raise_if_different()

- ``convert(model, backend="auto" | "cudnn" | "numba" | "torch", exclude=None)``
  (dnnkit/torch/convert.py);
- ``compare(model, *inputs, loss_fn=None, ...)``: PyTorch's kernels against dnnkit's, layer by
  layer (dnnkit/torch/compare.py);
- ``graph(cuda_graph)``: ``torch.cuda.graph`` for a converted model (dnnkit/torch/graph.py);
- ``fuse(model)``: a converted model's batch norms, convolutions and linear layers with the
  relu (and residual add) after them in one call each, as a ``torch.fx.GraphModule``
  (dnnkit/torch/fuse.py);
- the differentiable functions: ``conv``-family ``torch.autograd.Function`` classes
  (functions.py, functions_norm.py, functions_rnn.py) and ``activation``, ``softmax``,
  ``log_softmax``, ``dropout``, ``affine_grid``, ``grid_sample``, ``spatial_transformer``.
- the ``torch.library`` custom operators ``torch.ops.dnnkit.*`` that ``torch.compile`` traces
  (library.py, library_norm.py; PyTorch >= 2.4): converted modules call them while Dynamo
  traces (``convert(..., custom_ops=...)``).

Needs PyTorch (``pip install dnnkit[torch]``); ``import dnnkit`` never imports this package.
"""

try:
    import torch
except ImportError as e:      # (a clear message instead of a bare "No module named torch")
    raise ImportError("dnnkit.torch needs PyTorch, which is not installed: install it with "
                      "`pip install dnnkit[torch]` (the 'torch' extra) or `pip install "
                      "torch`") from e

from .compare import Comparison, compare  # noqa: E402
from .convert import Report, convert, converted  # noqa: E402
from .functions import (AffineGrid, Conv, ConvTranspose, GridSample, Linear,  # noqa: E402
                        Pool, affine_grid, grid_sample, spatial_transformer)
from .functions_norm import (Activation, BatchNormEval, BatchNormTrain, Dropout,  # noqa: E402
                             Softmax, activation, dropout, log_softmax, softmax)
from .functions_rnn import RNN  # noqa: E402
from .fuse import fuse  # noqa: E402
from .graph import graph  # noqa: E402

TORCH_VERSION = torch.__version__      # the PyTorch this package runs with

__all__ = ["Activation", "AffineGrid", "BatchNormEval", "BatchNormTrain", "Comparison", "Conv",
           "ConvTranspose", "Dropout", "GridSample", "Linear", "Pool", "RNN", "Report",
           "Softmax", "activation", "affine_grid", "compare", "convert", "converted",
           "dropout", "fuse", "graph", "grid_sample", "log_softmax", "softmax",
           "spatial_transformer"]
