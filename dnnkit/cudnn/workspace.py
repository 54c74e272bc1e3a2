"""cuDNN workspaces: scratch blocks from dnnkit's per-stream cache, and out-of-memory as an
answer (the caller then picks an algorithm or plan that needs less) rather than an error."""

import contextlib

from .. import memory
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


def alloc(nbytes, stream):
    """A ``dnnkit.memory.scratch`` of ``nbytes`` (None for 0) for work on ``stream``, or None
    when the device is out of memory. From the per-stream cache: the next call on the stream
    gets the same block back, so a steady loop allocates no workspace."""
    if not nbytes:
        return None
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
