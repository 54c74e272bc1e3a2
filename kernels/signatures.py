"""Argument types of every kernel for each data dtype, for ahead-of-time checks
(``numba.cuda.compile_ptx``): the simulator runs kernels as Python and hides type errors.
Each kernel module declares its own (``SIGNATURES(t, acc)``, see kernels/__init__.py)."""

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


__all__ = ["signatures", "DTYPES"]
