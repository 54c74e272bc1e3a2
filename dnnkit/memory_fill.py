"""``dnn.debug.fill_uninitialized``: every new array of dnnkit's allocator (dnnkit/memory.py)
filled with 0xFF bytes, so that an output element no kernel wrote reads as NaN (PyTorch's
``fill_uninitialized_memory``). cuDNN workspaces are not filled."""

import numpy as np

from . import config
from .device import driver, simulator, stream_pointer
from .errors import DnnkitError


config.register_flag("dnn.debug.fill_uninitialized", "off", config.enum("off", "nan"),
                     "off, or nan: every new array of dnnkit's allocator starts as all-0xFF "
                     "bytes (NaN in every float dtype), so an output element no kernel wrote "
                     "shows as NaN")

# The fill byte: 0xFF in every byte is a NaN in float16, float32 and float64 alike (exponent
# all ones, mantissa not zero) and -1 / the largest value in the integer types.
FILL_BYTE = 0xFF


def fill(a, stream):
    """Every byte of the new C-contiguous array ``a`` set to FILL_BYTE: one cuMemsetD8Async
    on ``stream`` (a Numba stream or raw handle), no host synchronisation."""
    nbytes = int(a.size) * a.dtype.itemsize
    if not nbytes:
        return a
    if simulator():
        host = np.full(nbytes, FILL_BYTE, np.uint8).view(a.dtype).reshape(a.shape)
        a.copy_to_device(host, stream=0 if isinstance(stream, int) else stream)
        return a
    ptr = stream if isinstance(stream, int) else stream_pointer(stream)
    (err,) = driver().cuMemsetD8Async(a.device_ctypes_pointer.value, FILL_BYTE, nbytes, ptr)
    if int(err):
        raise DnnkitError(f"cuMemsetD8Async failed with {err} filling {nbytes} bytes "
                           "(dnn.debug.fill_uninitialized)")
    return a
