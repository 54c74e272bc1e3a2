"""cuDNN handles: one per (device, thread), created on first use, bound to the op's stream.

A cuDNN handle is not safe to share between threads that use it at the same time, and it is
tied to the device that was current when it was created; so each thread keeps its own dict
``{device id: handle}``. When the thread ends its dict is dropped and the handles destroyed.
"""

import ctypes
import threading
import weakref

from .. import memory
from ..device import device_id
from . import api
from .descriptors import count

_local = threading.local()


def _destroy_all(handles):
    for h in handles.values():
        try:
            api.function("cudnnDestroy")(h)
        except Exception:  # pragma: no cover - best effort at thread exit
            pass
        count("Handle", destroyed=1)   # descriptors.live_counts() tracks handles too
    handles.clear()


class _PerThread:
    def __init__(self):
        self.handles = {}
        self.streams = {}         # device id -> the stream its handle is bound to
        fin = weakref.finalize(self, _destroy_all, self.handles)
        fin.atexit = False  # at interpreter exit the CUDA context may already be gone


def get(stream_ptr=0):
    """The calling thread's handle for the current device, bound to ``stream_ptr``
    (cudnnSetStream only when the stream changes)."""
    if memory.watch is not None:     # a Numba call being recorded for replays does cuDNN work
        memory.watch.untracked("a cuDNN call")
    holder = getattr(_local, "holder", None)
    if holder is None:
        holder = _local.holder = _PerThread()
    dev = device_id()
    h = holder.handles.get(dev)
    if h is None:
        h = ctypes.c_void_p()
        api.call("cudnnCreate", ctypes.byref(h), context=f"device {dev}")
        count("Handle", created=1)
        holder.handles[dev] = h
    if holder.streams.get(dev) != stream_ptr:
        api.call("cudnnSetStream", h, ctypes.c_void_p(stream_ptr or None),
                 context=f"stream 0x{stream_ptr or 0:x}")
        holder.streams[dev] = stream_ptr
    return h


def getter(stream_ptr=0):
    """``get()`` -> ``get(stream_ptr)`` for a runner that lives in this thread (dispatch's
    memo is per thread): the handle is looked up once; each call only checks that it is still
    bound to the stream (another op may have rebound it)."""
    h = get(stream_ptr)
    streams, dev = _local.holder.streams, device_id()

    def fast():
        if streams.get(dev) != stream_ptr or memory.watch is not None:
            return get(stream_ptr)
        return h
    return fast
