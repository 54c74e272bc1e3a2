"""``torch.cuda.graph`` for models converted to dnnkit.

A converted model's ops allocate their outputs and workspaces from dnnkit's caching pool, not
PyTorch's. Inside a capture those blocks must come from a pool private to the graph: the graph
writes their addresses on every replay, so no eager call may be handed one while the graph
lives (PyTorch's graph pool does the same for its own tensors), and a block the capture needs
anew must be allocated with the capture mode relaxed for that one call (a plain cuMemAlloc
invalidates a capture). :func:`graph` enters ``torch.cuda.graph`` and dnnkit's private pool
together and keeps that pool with the ``CUDAGraph`` object (attribute ``dnnkit_pool``). The
backward runs on PyTorch's autograd thread, on the capturing stream: the converted modules'
functions find the pool by that stream (``bridge.CAPTURES``, ``bridge.pooled``).

    g = torch.cuda.CUDAGraph()
    with dnnkit.torch.graph(g):
        loss = step(static_x, static_y)
    g.replay()

Warm the step up first on a side stream, as PyTorch asks for any capture: dnnkit then makes its
backend and algorithm choices, kernel compilations and cached constants before the capture.
What dnnkit cannot capture (dropout, whose seed is fixed on the host; a cuDNN algorithm timing
run) raises dnnkit.errors.CaptureError naming it.
"""

from __future__ import annotations

import contextlib

import torch

from .. import memory
from . import bridge


@contextlib.contextmanager
def graph(cuda_graph, pool=None, stream=None, capture_error_mode="global"):
    """``torch.cuda.graph(cuda_graph, pool, stream, capture_error_mode)`` with dnnkit's
    allocations inside it served by a pool private to the graph (module docstring)."""
    if not isinstance(cuda_graph, torch.cuda.CUDAGraph):
        raise TypeError(f"dnnkit.torch.graph: cuda_graph must be a torch.cuda.CUDAGraph; got "
                        f"{type(cuda_graph).__name__}")
    private = getattr(cuda_graph, "dnnkit_pool", None) or memory.new_pool()
    cuda_graph.dnnkit_pool = private
    with torch.cuda.graph(cuda_graph, pool=pool, stream=stream,
                          capture_error_mode=capture_error_mode):
        raw = int(torch.cuda.current_stream().cuda_stream)       # the capturing stream
        bridge.CAPTURES[raw] = private
        try:
            with memory.private_pool(private):
                yield cuda_graph
        finally:
            bridge.CAPTURES.pop(raw, None)
