"""cuDNN workspaces: scratch blocks from dnnkit's per-stream cache, and out-of-memory as an
answer (the caller then picks an algorithm or plan that needs less) rather than an error.

The largest workspace asked for on each (device, stream) so far is kept (a block of the caching
allocator not given back) and handed to every later call on that stream that fits in it: a
training step's ~60 cuDNN calls with a workspace cost no allocator traffic (a pool round trip
per call cost ~10 us of host time on an H100 machine's host). Calls on one stream are
ordered, whichever thread queues them, so they can share it; a larger request retires the
kept block (given back once the calls that hold it have queued their work) and keeps the new
one. PyTorch likewise keeps its cuDNN workspace.

Not kept: inside a CUDA-graph capture (memory.private_pool: the graph's own pool serves it),
under ``dnn.allocator = numba``, on the simulator. On a stream that a capture dnnkit does not
know of is recording, refused as the allocator refuses its blocks. ``memory.empty_cache()``
(and so an out-of-memory retry) gives every kept block back first; ``memory.stats()`` counts
them as ``held_bytes``."""

import contextlib
import threading

from .. import config, memory
from ..device import device_id, on_thread_end, refuse_foreign_capture, simulator, stream_key
from ..errors import DnnkitError


class OutOfMemory(DnnkitError):
    """A workspace of ``nbytes`` could not be allocated."""

    def __init__(self, nbytes):
        super().__init__(f"cannot allocate a {nbytes}-byte cuDNN workspace")
        self.nbytes = nbytes


def is_oom(e):
    """Out of device memory? (Numba's CudaAPIError carries CUDA_ERROR_OUT_OF_MEMORY = 2;
    an external memory manager may raise MemoryError or name the CUDA error.)"""
    if isinstance(e, MemoryError):
        return True
    code = getattr(e, "code", None)
    if type(e).__name__ == "CudaAPIError" and code is not None:
        try:
            return int(code) == 2
        except (TypeError, ValueError):
            return str(code).endswith("OUT_OF_MEMORY")
    text = str(e).lower()
    return "out of memory" in text or "out_of_memory" in text


class _Kept:
    """The workspace kept for one (device, stream): a context whose value is its pointer.
    ``users``: calls between alloc() and the end of their ``with`` (their work is not queued
    yet); ``retired``: no longer handed out, given back when its last user is done."""

    __slots__ = ("nbytes", "ptr", "scratch", "users", "retired")

    def __init__(self, scratch, nbytes):
        self.scratch, self.nbytes = scratch, nbytes
        self.ptr = scratch.__enter__()
        self.users, self.retired = 0, False

    def __enter__(self):
        return self.ptr

    def __exit__(self, *exc):
        with _lock:
            self.users -= 1
            if self.retired and not self.users:
                self.scratch.__exit__(None, None, None)
        return False

    def retire(self):
        """Give the block back now, or (in use) when its last user is done. Under _lock."""
        self.retired = True
        if not self.users:
            self.scratch.__exit__(None, None, None)


# (device, stream key) -> _Kept, shared by the threads: calls on one stream are ordered
# whichever thread queues them (device.stream_key: each thread's per-thread default stream
# its own). Reentrant: an allocation under it may empty the cache (release_kept).
_kept = {}
_lock = threading.RLock()
_local = threading.local()     # .on: whether this thread's flags keep workspaces; .merged,
                               # .epoch: the flags it was decided for


def _keeping():
    """Whether this call may use a kept workspace: not inside a graph capture's pool, not
    under ``dnn.allocator = numba``, not on the simulator (decided once per thread and flags)."""
    if memory.in_private_pool():
        return False
    d, st = _local.__dict__, config.state
    merged, epoch = st.merged, st.local.__dict__.get("epoch")
    if merged is None or d.get("merged") is not merged or d.get("epoch") != epoch:
        on = not simulator() and config.get("dnn.allocator") == "caching"
        if merged is not None and merged is st.merged:    # no flag changed meanwhile
            d["merged"], d["epoch"], d["on"] = merged, epoch, on
        return on
    return d["on"]


def release_kept():
    """Give every kept workspace back to the caching allocator (one in use: when its call is
    queued); memory.empty_cache() calls it first, so they are freed with the cache."""
    with _lock:
        for k in _kept.values():
            k.retire()
        _kept.clear()


def kept_bytes():
    """Bytes of the kept workspaces (memory.stats()'s ``held_bytes``; an out-of-memory
    retry empties the cache when there are any)."""
    with _lock:
        return sum(k.nbytes for k in _kept.values())


memory.register_holder(release_kept, kept_bytes)


def _thread_ended(skey):
    """An ended thread's per-thread default stream gets no more calls: its workspace goes."""
    with _lock:
        for key in [k for k in _kept if k[1] == skey]:
            _kept.pop(key).retire()


on_thread_end(_thread_ended)


def alloc(nbytes, stream):
    """A workspace context of ``nbytes`` (None for 0; ``with held(ws) as ptr``) for work on
    stream pointer ``stream``, or None when the device is out of memory: the workspace kept
    for that stream when it is large enough (module docstring), else a
    ``dnnkit.memory.scratch`` from the per-stream cache. A caller enters ``held(ws)`` at
    once."""
    if not nbytes:
        return None
    if not _keeping():
        return _scratch(nbytes, stream)
    if stream:    # as memory refuses a block of its shared pool to a foreign capture
        refuse_foreign_capture(stream)
    key = (device_id(), stream_key(stream))
    with _lock:
        k = _kept.get(key)
        if k is not None and k.nbytes >= nbytes:
            k.users += 1
            return k
        if k is not None:     # too small: it goes back first (or when its users are done)
            del _kept[key]
            k.retire()
        ws = _scratch(nbytes, stream)
        if ws is None or ws.key is None:    # none, or not the pool's (the flag changed since)
            return ws
        k = _kept[key] = _Kept(ws, ws.key[2])        # the block's own (rounded) size
        k.users += 1
        return k


def _scratch(nbytes, stream):
    try:
        return memory.scratch(int(nbytes), stream)
    except Exception as e:  # noqa: BLE001 - anything but out-of-memory is re-raised
        if not is_oom(e):
            raise
        return None


_NONE = contextlib.nullcontext()     # reusable: entering it gives None


def held(ws):
    """The scratch as a context (its pointer when entered), or a null context for none."""
    return _NONE if ws is None else ws
