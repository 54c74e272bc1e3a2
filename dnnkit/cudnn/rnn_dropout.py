"""The dropout states of cuDNN's RNNs: the dropout between layers that cudnnRNNForward applies in
training mode, drawn from the RNG states of the dropout descriptor the RNN descriptor names
(cudnnSetRNNDescriptor_v8's dropoutDesc).

The scheme of cudnn/dropout.py, with entries of their own (so that an RNN and dnnkit.dropout
using one seed on one stream do not advance each other's states): one :class:`Entry` per
(device, stream, seed, p), a small LRU, holding a dropout descriptor, the *pristine* states
that cudnnSetDropoutDescriptor initialised once from the seed (its init kernel runs on the
entry's stream: stream-ordered, no host wait), the *working* states and the offset they stand
at. Call ``offset`` of a seed's sequence is reached from offset 0 (``restore``: the pristine
states copied into the working ones on the stream and the descriptor pointed at them with
cudnnRestoreDropoutDescriptor, no init kernel) or from the call before it on the same stream
(each training forward advances the working states); any other offset cannot be reached without
replaying the calls before it (``reachable`` says why; the dispatcher then runs Numba under
``auto``). Seed None: one generator per (device, stream, p) seeded once at random, advanced by
every call. The backward reads the masks from the forward's reserve space, not the states.
"""

import collections
import ctypes
import threading
from ctypes import c_float, c_size_t, c_ulonglong

import numpy as np

from ..device import device_id, on_thread_end, stream_key, stream_pointer
from ..memory import device_array
from ..seeds import fresh_seed
from . import api
from .api import copy_async, ptr
from .dropout import DropoutDescriptor, forget_stream, standing

CACHE_MAX = 8


class Entry:
    """A dropout descriptor with pristine and working RNG states for one (device, stream,
    seed, p); ``lock`` serialises the calls that use it (restore, forward) on the host."""

    def __init__(self, h, p, seed, stream, key):
        size = c_size_t()
        api.call("cudnnDropoutGetStatesSize", h, ctypes.byref(size))
        self.size, self.p, self.seed, self.key = size.value, p, seed, key
        self.init_seed = fresh_seed() if seed is None else seed
        self.pristine = device_array((max(1, self.size),), np.uint8, stream)
        self.work = device_array((max(1, self.size),), np.uint8, stream)
        self.next = 0                  # the offset the working states stand at
        self.lock = threading.Lock()
        self.desc = DropoutDescriptor()
        api.call("cudnnSetDropoutDescriptor", self.desc, h, c_float(p), ptr(self.pristine),
                 c_size_t(self.size), c_ulonglong(self.init_seed),
                 context=f"RNN dropout {p}, seed {seed}, {self.size}-byte states")


_cache = collections.OrderedDict()
_lock = threading.Lock()


on_thread_end(lambda skey: forget_stream(_cache, _lock, skey))


def _key(p, seed, stream_value):
    return (device_id(), stream_key(stream_value), seed, float(p))


def reachable(p, seed, offset, stream):
    """None when a training forward can draw the masks of call ``offset`` of ``seed`` on
    ``stream`` now (offset 0, the call after this stream's previous one, or seed None); else
    the reason."""
    at = standing(_cache, _key(p, seed, stream_pointer(stream)), offset, seed)
    if at is None:
        return None
    return (f"cuDNN's RNN dropout generator advances one training forward at a time: call "
            f"{offset} of seed {seed} follows call {offset - 1}, but this stream's states "
            f"stand at {at}")


def entry(h, p, seed, stream):
    """The Entry of (this device, ``stream``, ``seed``, ``p``), made on first use."""
    key = _key(p, seed, stream_pointer(stream))
    with _lock:
        e = _cache.get(key)
        if e is not None:
            _cache.move_to_end(key)
            return e
    e = Entry(h, p, seed, stream, key)     # outside the lock: it queues the init kernel
    with _lock:
        e = _cache.setdefault(key, e)
        while len(_cache) > CACHE_MAX:
            _cache.popitem(last=False)      # an RNN plan using an entry keeps it alive
    return e


def restore(e, h, offset, stream):
    """Bring ``e``'s states to call ``offset`` (the caller holds ``e.lock``); True when they
    were restored to the seed's start (the RNN descriptor is then set again, so that it reads
    them). Raises ValueError for an offset ``reachable`` refuses."""
    if e.seed is None:
        return False
    if offset == 0:
        copy_async(ptr(e.work), e.pristine, e.size, stream_pointer(stream))
        api.call("cudnnRestoreDropoutDescriptor", e.desc, h, c_float(e.p), ptr(e.work),
                 c_size_t(e.size), c_ulonglong(e.init_seed),
                 context=f"RNN dropout {e.p}, seed {e.seed}")
        return True
    if offset != e.next:
        raise ValueError(reachable(e.p, e.seed, offset, stream))
    return False


def clear():
    with _lock:
        _cache.clear()
