"""cuDNN workspaces: scratch blocks from dnnkit's per-stream cache, and out-of-memory as an
answer (the caller then picks an algorithm or plan that needs less) rather than an error.

Each thread keeps, per (device, stream), the largest workspace it was asked for so far (a
block of the caching allocator it does not give back) and hands it to every later call on that
stream that fits in it: a training step's ~60 cuDNN calls with a workspace cost no allocator
traffic (a pool round trip per call cost ~10 us of host time on an H100 machine's host). Calls
on one stream are ordered, so they can share it; a larger request gives the kept block back
and keeps the new one. PyTorch likewise keeps its cuDNN workspace. Not inside a CUDA-graph
capture (memory.private_pool: the graph's own pool serves it), not under
``dnn.allocator = numba``, not on the simulator; ``memory.empty_cache()`` gives this thread's
kept blocks back (other threads' when they next ask, once a flag changes or the cache is
emptied)."""

import contextlib
import threading

from .. import config, memory
from ..device import device_id, simulator
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
    """A workspace this thread keeps for one (device, stream): a context whose value is its
    pointer; leaving it keeps the block."""

    __slots__ = ("nbytes", "ptr", "scratch")

    def __init__(self, scratch, nbytes):
        self.scratch, self.nbytes = scratch, nbytes
        self.ptr = scratch.__enter__()

    def __enter__(self):
        return self.ptr

    def __exit__(self, *exc):
        return False

    def release(self):
        self.scratch.__exit__(None, None, None)


_local = threading.local()     # .kept {(device, stream): _Kept}; what it is for:
                               # .merged, .epoch (the flags), .gen
_generation = [0]              # bumped by empty_cache: other threads give theirs back


def _kept_here():
    """This thread's kept workspaces, or None where none are kept (inside a graph capture's
    pool, ``dnn.allocator = numba``, the simulator); emptied when a flag changes."""
    if memory.in_private_pool():
        return None
    d, st = _local.__dict__, config.state
    merged = st.merged
    if merged is None or d.get("merged") is not merged or \
            d.get("epoch") != st.local.__dict__.get("epoch") or d["gen"] != _generation[0]:
        _release(d.get("kept"))
        on = not simulator() and config.get("dnn.allocator") == "caching"
        d["kept"] = {} if on else None
        # (config.get merged the flags)
        d["merged"], d["epoch"], d["gen"] = (st.merged, st.local.__dict__.get("epoch"),
                                             _generation[0])
    return d["kept"]


def _release(kept):
    if kept:
        for k in kept.values():
            k.release()
        kept.clear()


def release_kept():
    """Give the calling thread's kept workspaces back to the caching allocator, and have
    every other thread give its own back at its next request (memory.empty_cache calls it
    before emptying the cache)."""
    _generation[0] += 1
    d = _local.__dict__
    _release(d.get("kept"))
    d.pop("merged", None)


memory.before_empty_cache(release_kept)


def alloc(nbytes, stream):
    """A workspace context of ``nbytes`` (None for 0; ``with held(ws) as ptr``) for work on
    stream pointer ``stream``, or None when the device is out of memory: the thread's kept
    workspace for that stream when it is large enough (module docstring), else a
    ``dnnkit.memory.scratch`` from the per-stream cache."""
    if not nbytes:
        return None
    kept = _kept_here()
    if kept is not None:
        key = (device_id(), stream)
        k = kept.get(key)
        if k is not None and k.nbytes >= nbytes:
            return k
        if k is not None:             # too small: give it back before taking a larger one
            del kept[key]
            k.release()
        ws = _scratch(nbytes, stream)
        if ws is None:
            return None
        k = kept[key] = _Kept(ws, memory.rounded(int(nbytes)))
        return k
    return _scratch(nbytes, stream)


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
