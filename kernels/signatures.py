"""Argument types of every kernel for each data dtype, and ``ptx`` to compile one ahead of time
(no GPU): the simulator runs kernels as Python and hides type errors.
Each kernel module declares its own (``SIGNATURES(t, acc)``, see kernels/__init__.py)."""

import contextlib
import types

from numba import float32, float64
from numba.core.types import float16

from . import FAMILY_MODULES

# data type -> (data, accumulation) Numba types (see kernels/__init__.py)
DTYPES = {"float16": (float16, float32), "float32": (float32, float32),
          "float64": (float64, float64)}


def signatures(dtype):
    """{kernel name: argument types} for data of ``dtype``."""
    t, acc = DTYPES[dtype]
    out = {}
    for m in FAMILY_MODULES:
        out.update(m.SIGNATURES(t, acc))
    return out


@contextlib.contextmanager
def _device_functions_for(cc):
    # numba-cuda 0.30 types a call to a device function that is not inlined in Numba's IR
    # (bounds.inlined) by compiling it for get_current_device(), which needs a GPU and its
    # driver; ahead of time (a CI machine without either) they compile for ``cc`` instead.
    # A device function is compiled once per argument types, whatever the target.
    from numba.cuda import dispatcher
    plain = dispatcher.get_current_device
    dispatcher.get_current_device = lambda: types.SimpleNamespace(compute_capability=cc)
    try:
        yield
    finally:
        dispatcher.get_current_device = plain


def ptx(kernel, argtypes, cc=(9, 0)):
    """(PTX, return type) of ``kernel`` (a ``cuda.jit`` dispatcher or its Python function)
    compiled for ``argtypes`` and compute capability ``cc`` with its launch bounds, without a
    GPU: ``numba.cuda.compile_ptx`` with its device functions compiled for ``cc``."""
    from numba import cuda
    fn = getattr(kernel, "py_func", kernel)
    with _device_functions_for(cc):
        return cuda.compile_ptx(fn, argtypes, cc=cc,
                                launch_bounds=getattr(fn, "launch_bounds", None))


__all__ = ["signatures", "ptx", "DTYPES"]
