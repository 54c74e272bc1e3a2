"""cuDNN dropout: cudnnDropoutForward / cudnnDropoutBackward with cached RNG states.

cuDNN's dropout draws its mask from per-thread RNG states in a device buffer
(cudnnDropoutGetStatesSize bytes) that cudnnSetDropoutDescriptor initialises from a seed by
running an init kernel (expensive: it is meant to be done once), and that every
cudnnDropoutForward advances. dnnkit's masks are named by (seed, offset): the offset-th mask of
the sequence the seed starts. So:

- ``_Entry`` (one per device, stream, seed and p; a small LRU) holds a dropout descriptor, the
  *pristine* states that cudnnSetDropoutDescriptor initialised once from the seed on the
  entry's stream (stream-ordered: no host synchronisation, and no other stream reads them), the
  *working* states, and the offset the working states stand at;
- offset 0 copies the pristine states into the working ones (ordered on the stream) and points
  the descriptor at them with cudnnRestoreDropoutDescriptor (which does not run the init
  kernel); the next offset simply runs on the working states, which the previous forward
  advanced. Any other offset cannot be reached without replaying the calls before it:
  ``reachable()`` says why, and the dispatcher runs Numba (``auto``) or raises (``forced``).
  A module's dropout (nn.Dropout: offset = its call count) thus costs one init kernel per run;
- cudnnDropoutForward writes y and the mask into the reserve space
  (cudnnDropoutGetReserveSpaceSize bytes, taken per call from dnnkit's caching pool and kept by
  the caller's state); backward runs cudnnDropoutBackward with the same descriptor (for p) and
  that reserve space; it does not touch the RNG states.

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

from ..device import on_thread_end, stream_key, stream_pointer
from ..memory import device_array
from ..seeds import fresh_seed
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


class _Entry:
    """A descriptor, pristine and working RNG states for one (device, stream, seed, p)."""

    def __init__(self, h, p, seed, stream):
        size = c_size_t()
        api.call("cudnnDropoutGetStatesSize", h, ctypes.byref(size))
        self.size, self.p, self.seed = size.value, p, seed
        if seed is None:               # the anonymous generator: a fresh seed, once
            seed = fresh_seed()
        self.init_seed = seed
        # from the caching pool on the entry's stream: the init kernel below runs on it too
        # (h is bound to it), so the states are ready in stream order, with no host wait
        self.pristine = device_array((max(1, self.size),), np.uint8, stream)
        self.work = device_array((max(1, self.size),), np.uint8, stream)
        self.next = 0                  # the offset the working states stand at (0: pristine)
        self.lock = threading.Lock()
        self.desc = DropoutDescriptor()
        api.call("cudnnSetDropoutDescriptor", self.desc, h, c_float(p), ptr(self.pristine),
                 c_size_t(self.size), c_ulonglong(seed),
                 context=f"dropout {p}, seed {seed}, {self.size}-byte states")


_cache = collections.OrderedDict()
_cache_lock = threading.Lock()


def forget_stream(cache, lock, skey):
    """Drop the entries of ``cache`` (keys (device, stream key, ...)) for stream key ``skey``:
    an ended thread's per-thread default stream draws no more masks (device.on_thread_end)."""
    with lock:
        for key in [k for k in cache if k[1] == skey]:
            del cache[key]


on_thread_end(lambda skey: forget_stream(_cache, _cache_lock, skey))


def _key(p, seed, stream_value):
    return (_device_id(), stream_key(stream_value), seed, p)


def standing(cache, key, offset, seed):
    """None when generator states kept in ``cache`` under ``key`` can draw call ``offset`` of
    ``seed`` now (offset 0, seed None, or the call after the states' last one); else the
    offset the states stand at (cuDNN's generators only move forward, one call at a time)."""
    if offset == 0 or seed is None:
        return None
    e = cache.get(key)
    at = 0 if e is None else e.next
    return None if offset == at else at


def reachable(p, seed, offset, stream):
    """None when cuDNN can draw mask ``offset`` of ``seed`` on ``stream`` now (offset 0, or the
    offset after this stream's previous call with the seed); else the reason."""
    at = standing(_cache, _key(p, seed, stream_pointer(stream)), offset, seed)
    if at is None:
        return None
    return (f"cuDNN's dropout generator advances one call at a time: mask {offset} of seed "
            f"{seed} follows mask {offset - 1}, but this stream's states stand at {at}")


def _entry(h, p, seed, stream, stream_value):
    key = _key(p, seed, stream_value)
    with _cache_lock:
        e = _cache.get(key)
        if e is not None:
            _cache.move_to_end(key)
            return e
    e = _Entry(h, p, seed, stream)     # outside the lock: it queues the init kernel
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


def forward(x, y, p, seed, offset, stream):
    """y = dropout(x), mask ``offset`` of ``seed`` (``reachable()`` said yes; seed None: the next
    mask of this stream's generator seeded once at random); returns the Saved state for
    :func:`backward`."""
    s = _Stream(stream)
    h = handle.get(s.handle_value)
    e = _entry(h, p, seed, stream, s.handle_value)
    if seed is None:
        offset = e.next                # restored once: then each call advances the generator
    xd = tensor((1, 1, 1, x.size), x.dtype)
    n = c_size_t()
    api.call("cudnnDropoutGetReserveSpaceSize", xd, ctypes.byref(n))
    # the reserve space (mask) from dnnkit's caching pool, on the call's stream: a fresh
    # cudaMalloc per call (and Numba's deferred frees) holds the host ~0.3 ms a call at
    # 64x256x56x56 (H100: 0.41 ms host time per call against the Numba path's 0.10)
    reserve = device_array((max(1, n.value),), np.uint8, stream)
    with e.lock:
        if offset == 0:                # back to the seed's first mask
            copy_async(ptr(e.work), e.pristine, e.size, s.handle_value)
            api.call("cudnnRestoreDropoutDescriptor", e.desc, h, c_float(p), ptr(e.work),
                     c_size_t(e.size), c_ulonglong(e.init_seed),
                     context=_ctx("dropout", x, p, seed))
        elif offset != e.next:
            raise ValueError(reachable(p, seed, offset, stream))
        api.call("cudnnDropoutForward", h, e.desc, xd, ptr(x), xd, ptr(y), ptr(reserve),
                 c_size_t(n.value), context=_ctx("dropout", x, p, seed))
        e.next = offset + 1
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
