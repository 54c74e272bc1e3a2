"""cuDNN dropout: cudnnDropoutForward / cudnnDropoutBackward with a cached RNG state.

cuDNN's dropout draws its mask from per-thread RNG states in a device buffer
(cudnnDropoutGetStatesSize bytes) that cudnnSetDropoutDescriptor initialises from a seed by
running an init kernel (expensive: it is meant to be done once), and that every
cudnnDropoutForward advances. dnnkit promises "same seed, same mask", so:

- ``_Entry`` (one per device, seed, p; a small LRU) holds a dropout descriptor and a *pristine*
  states buffer initialised once by cudnnSetDropoutDescriptor, then synchronised so any stream
  may read it;
- each forward copies the pristine states into a working buffer (one per stream, so calls on
  one stream are ordered and two streams never share one), points the descriptor at it with
  cudnnRestoreDropoutDescriptor (which does not run the init kernel), and runs
  cudnnDropoutForward, which writes y and the mask into the reserve space
  (cudnnDropoutGetReserveSpaceSize bytes, taken per call from dnnkit's caching pool and kept by
  the caller's state);
- backward runs cudnnDropoutBackward with the same descriptor (for p) and that reserve space;
  it does not touch the RNG states.

A lock per entry serialises the calls that use its descriptor (restore + forward, backward) on
the host, since the descriptor is shared.
x is described as a packed (1, 1, 1, size) tensor: dropout is elementwise.

Numba is imported inside the functions that use it: ``import dnnkit`` must not load it.
"""

import collections
import ctypes
import threading
from ctypes import POINTER, c_float, c_size_t, c_ulonglong, c_void_p

import numpy as np

from ..device import stream_pointer
from ..memory import device_array
from . import api, handle
from .api import copy_async, ptr
from .descriptors import Descriptor, tensor

_p = c_void_p
_CACHE_MAX = 8

PROTOTYPES = {
    # cudnnStatus_t cudnnCreateDropoutDescriptor(cudnnDropoutDescriptor_t *dropoutDesc);
    "cudnnCreateDropoutDescriptor": [POINTER(_p)],
    # cudnnStatus_t cudnnDestroyDropoutDescriptor(cudnnDropoutDescriptor_t dropoutDesc);
    "cudnnDestroyDropoutDescriptor": [_p],
    # cudnnStatus_t cudnnDropoutGetStatesSize(cudnnHandle_t handle, size_t *sizeInBytes);
    "cudnnDropoutGetStatesSize": [_p, POINTER(c_size_t)],
    # cudnnStatus_t cudnnDropoutGetReserveSpaceSize(cudnnTensorDescriptor_t xdesc,
    #     size_t *sizeInBytes);
    "cudnnDropoutGetReserveSpaceSize": [_p, POINTER(c_size_t)],
    # cudnnStatus_t cudnnSetDropoutDescriptor(cudnnDropoutDescriptor_t dropoutDesc,
    #     cudnnHandle_t handle, float dropout, void *states, size_t stateSizeInBytes,
    #     unsigned long long seed);
    "cudnnSetDropoutDescriptor": [_p, _p, c_float, _p, c_size_t, c_ulonglong],
    # cudnnStatus_t cudnnRestoreDropoutDescriptor(cudnnDropoutDescriptor_t dropoutDesc,
    #     cudnnHandle_t handle, float dropout, void *states, size_t stateSizeInBytes,
    #     unsigned long long seed);
    "cudnnRestoreDropoutDescriptor": [_p, _p, c_float, _p, c_size_t, c_ulonglong],
    # cudnnStatus_t cudnnDropoutForward(cudnnHandle_t handle,
    #     const cudnnDropoutDescriptor_t dropoutDesc, const cudnnTensorDescriptor_t xdesc,
    #     const void *x, const cudnnTensorDescriptor_t ydesc, void *y, void *reserveSpace,
    #     size_t reserveSpaceSizeInBytes);
    "cudnnDropoutForward": [_p, _p, _p, _p, _p, _p, _p, c_size_t],
    # cudnnStatus_t cudnnDropoutBackward(cudnnHandle_t handle,
    #     const cudnnDropoutDescriptor_t dropoutDesc, const cudnnTensorDescriptor_t dydesc,
    #     const void *dy, const cudnnTensorDescriptor_t dxdesc, void *dx, void *reserveSpace,
    #     size_t reserveSpaceSizeInBytes);
    "cudnnDropoutBackward": [_p, _p, _p, _p, _p, _p, _p, c_size_t],
}
api.register_prototypes(PROTOTYPES)


class DropoutDescriptor(Descriptor):
    """Set by cudnnSetDropoutDescriptor (with RNG states) or cudnnRestoreDropoutDescriptor."""
    create_fn, destroy_fn = "cudnnCreateDropoutDescriptor", "cudnnDestroyDropoutDescriptor"


def _device_id():
    from numba import cuda
    return getattr(cuda.get_current_device(), "id", 0)


def _bytes(n):
    from numba import cuda
    return cuda.device_array(max(1, int(n)), dtype=np.uint8)


class _Entry:
    """A descriptor and pristine RNG states for one (device, seed, p)."""

    def __init__(self, h, p, seed):
        size = c_size_t()
        api.call("cudnnDropoutGetStatesSize", h, ctypes.byref(size))
        self.size, self.p, self.seed = size.value, p, seed
        self.pristine = _bytes(self.size)
        self.work = {}                 # stream pointer -> working states
        self.lock = threading.Lock()
        self.desc = DropoutDescriptor()
        api.call("cudnnSetDropoutDescriptor", self.desc, h, c_float(p), ptr(self.pristine),
                 c_size_t(self.size), c_ulonglong(seed),
                 context=f"dropout {p}, seed {seed}, {self.size}-byte states")
        from numba import cuda
        cuda.synchronize()             # the init kernel ran on the handle's stream

    def working(self, stream):
        """This stream's working states, reset to the pristine ones (ordered on the stream)."""
        buf = self.work.get(stream.handle_value)
        if buf is None:
            buf = self.work[stream.handle_value] = _bytes(self.size)
        copy_async(ptr(buf), self.pristine, self.size, stream.handle_value)
        return buf


_cache = collections.OrderedDict()
_cache_lock = threading.Lock()


def _entry(h, p, seed):
    key = (_device_id(), seed, p)
    with _cache_lock:
        e = _cache.get(key)
        if e is not None:
            _cache.move_to_end(key)
            return e
    e = _Entry(h, p, seed)             # outside the lock: it runs a kernel and synchronises
    with _cache_lock:
        e = _cache.setdefault(key, e)
        while len(_cache) > _CACHE_MAX:
            _cache.popitem(last=False)   # live states keep their entry alive
    return e


class _Stream:
    def __init__(self, numba_stream):
        self.numba, self.handle_value = numba_stream, stream_pointer(numba_stream)


class Saved:
    """What cuDNN's backward needs: the entry (descriptor, for p) and the reserve space."""

    def __init__(self, entry, reserve, nbytes):
        self.entry, self.reserve, self.nbytes = entry, reserve, nbytes


def _ctx(op, a, p, seed):
    return lambda: f"{op}: x {tuple(a.shape)} {a.dtype}, p {p}, seed {seed}"


def forward(x, y, p, seed, stream):
    """y = dropout(x); returns the Saved state for :func:`backward`."""
    s = _Stream(stream)
    h = handle.get(s.handle_value)
    e = _entry(h, p, seed)
    xd = tensor((1, 1, 1, x.size), x.dtype)
    n = c_size_t()
    api.call("cudnnDropoutGetReserveSpaceSize", xd, ctypes.byref(n))
    # the reserve space (mask) from dnnkit's caching pool, on the call's stream: a fresh
    # cudaMalloc per call (and Numba's deferred frees) holds the host ~0.3 ms a call at
    # 64x256x56x56 (H100: 0.41 ms host time per call against the Numba path's 0.10)
    reserve = device_array((max(1, n.value),), np.uint8, stream)
    with e.lock:
        work = e.working(s)
        api.call("cudnnRestoreDropoutDescriptor", e.desc, h, c_float(p), ptr(work),
                 c_size_t(e.size), c_ulonglong(seed), context=_ctx("dropout", x, p, seed))
        api.call("cudnnDropoutForward", h, e.desc, xd, ptr(x), xd, ptr(y), ptr(reserve),
                 c_size_t(n.value), context=_ctx("dropout", x, p, seed))
    return Saved(e, reserve, n.value)


def backward(dy, dx, saved, stream):
    s = _Stream(stream)
    h = handle.get(s.handle_value)
    e = saved.entry
    dd = tensor((1, 1, 1, dy.size), dy.dtype)
    with e.lock:
        api.call("cudnnDropoutBackward", h, e.desc, dd, ptr(dy), dd, ptr(dx),
                 ptr(saved.reserve), c_size_t(saved.nbytes),
                 context=_ctx("dropout_backward", dy, e.p, e.seed))
