"""The collectives on device arrays and Tensors: all_reduce, broadcast, all_gather,
reduce_scatter, and the host barrier.

Each call queues one NCCL collective on the stream given (default: dnnkit's current stream,
``dnnkit.stream``), ordered after the work queued there before it, and returns without
waiting: like every dnnkit op, the result is there for the work queued after it on that
stream. Another stream must wait for it with an event (``dnnkit.device.stream_wait``), as
DataParallel's does. ``all_reduce`` and ``broadcast`` work in place (a Tensor's version is
bumped); ``all_gather`` and ``reduce_scatter`` return new arrays (Tensors for Tensors).
Collectives record no gradient (call them on detached tensors or arrays; SyncBatchNorm has
its own rule). ``group=``: the process group (default: the one ``init()`` made).

Every rank must make the same collectives in the same order with the same shapes and dtypes,
as NCCL requires; a rank that does not is caught by the watchdog's timeout, not here.
"""

import numpy as np

from .. import arrays, foreign
from ..tensors import Tensor
from . import group as group_mod
from .env import check_timeout
from .nccl import DTYPES

OPS = ("sum", "avg", "max", "min", "prod")


def _array(op, x, stream):
    """(Numba device array, Numba stream) of ``x``: a Tensor, a Numba device array or a
    CUDA array of another library (a view); host arrays are refused (the result must land
    in place, on the device)."""
    s = arrays.as_stream(stream)
    a = x.data if isinstance(x, Tensor) else x
    if not arrays.is_device_array(a):
        view = foreign.as_array(a, s) if hasattr(a, "__cuda_array_interface__") or \
            hasattr(a, "__dlpack__") else None
        if view is None or not arrays.is_device_array(view):
            raise TypeError(f"dnnkit.distributed.{op}: x must be a device array or a Tensor "
                            f"(collectives run on the GPU in place); got "
                            f"{type(x).__name__}: copy a host array with dnnkit.tensor() first")
        a = view
    if a.size and not a.is_c_contiguous():
        raise ValueError(f"dnnkit.distributed.{op}: x must be C-contiguous; got shape "
                         f"{tuple(a.shape)} with strides {tuple(a.strides)}")
    if np.dtype(a.dtype) not in DTYPES:
        raise TypeError(f"dnnkit.distributed.{op}: dtype {a.dtype} has no NCCL type; use one of "
                        f"{', '.join(sorted(d.name for d in DTYPES))}")
    return a, s


def _reduction(op, name):
    if name not in OPS:
        raise ValueError(f"dnnkit.distributed.{op}: op must be one of {', '.join(OPS)}; got "
                         f"{name!r}")
    return name


def _check_avg(op, name, a):
    if name == "avg" and np.dtype(a.dtype).kind != "f":
        raise TypeError(f"dnnkit.distributed.{op}: op='avg' needs a floating-point array; got "
                        f"{a.dtype} (sum it, then divide)")


def _group(group):
    return group if group is not None else group_mod.current()


def _like(x, out_array):
    return Tensor(out_array) if isinstance(x, Tensor) else out_array


def all_reduce(x, op="sum", *, stream=None, group=None):
    """Reduce ``x`` over every rank, in place: afterwards every rank holds the sum (``op``
    "sum"), mean ("avg", floating-point only), maximum, minimum or product, element by
    element. Returns ``x``."""
    g = _group(group)
    op = _reduction("all_reduce", op)
    a, s = _array("all_reduce", x, stream)
    _check_avg("all_reduce", op, a)
    if a.size:
        g.run("all_reduce", lambda c: c.all_reduce(a, a, op, s), s)
    if isinstance(x, Tensor):
        x.bump_version()
    return x


def broadcast(x, src=0, *, stream=None, group=None):
    """Copy rank ``src``'s ``x`` into ``x`` on every rank, in place. Returns ``x``."""
    g = _group(group)
    if isinstance(src, bool) or not isinstance(src, (int, np.integer)) or \
            not 0 <= src < g.world_size:
        raise ValueError(f"dnnkit.distributed.broadcast: src must be a rank in [0, "
                         f"{g.world_size}); got {src!r}")
    a, s = _array("broadcast", x, stream)
    if a.size:
        g.run("broadcast", lambda c: c.broadcast(a, a, int(src), s), s)
    if isinstance(x, Tensor):
        x.bump_version()
    return x


def all_gather(x, *, stream=None, group=None):
    """Every rank's ``x`` (all of one shape), concatenated along the first axis in rank order:
    a new array of shape ``(world_size * x.shape[0], *x.shape[1:])`` (a 0-d x gives
    ``(world_size,)``)."""
    g = _group(group)
    a, s = _array("all_gather", x, stream)
    shape = (g.world_size * a.shape[0],) + tuple(a.shape[1:]) if a.ndim else (g.world_size,)
    out = arrays.cuda_empty(shape, a.dtype, s)
    if a.size:
        g.run("all_gather", lambda c: c.all_gather(a, out, s), s)
    return _like(x, out)


def reduce_scatter(x, op="sum", *, stream=None, group=None):
    """Reduce ``x`` over every rank (as :func:`all_reduce`) and give rank r the r-th of
    ``world_size`` equal pieces along the first axis: a new array of shape
    ``(x.shape[0] // world_size, *x.shape[1:])``; the first axis must divide evenly."""
    g = _group(group)
    op = _reduction("reduce_scatter", op)
    a, s = _array("reduce_scatter", x, stream)
    _check_avg("reduce_scatter", op, a)
    w = g.world_size
    if a.ndim == 0 or a.shape[0] % w:
        raise ValueError(f"dnnkit.distributed.reduce_scatter: the first axis of x (shape "
                         f"{tuple(a.shape)}) must divide into {w} equal pieces, one per rank")
    out = arrays.cuda_empty((a.shape[0] // w,) + tuple(a.shape[1:]), a.dtype, s)
    if a.size:
        g.run("reduce_scatter", lambda c: c.reduce_scatter(a, out, op, s), s)
    return _like(x, out)


def barrier(*, timeout=None, group=None):
    """Wait on the host until every rank has called ``barrier()`` as often as this one. A
    rank that has exited, or does not come within ``timeout`` seconds (default: the group's
    timeout, ``dnn.distributed.timeout``), is named in the DistributedError. It orders host
    code (a file rank 0 writes, then the others read); it does not wait for queued GPU work."""
    g = _group(group)
    g.check()
    t = g.timeout if timeout is None else check_timeout("barrier", timeout)
    if g.store is not None:
        g.store.barrier("dnnkit/user", timeout=t)
