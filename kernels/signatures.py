"""Argument types of every kernel for each data dtype, for ahead-of-time checks
(``numba.cuda.compile_ptx``): the simulator runs kernels as Python and hides type errors."""

from numba import float32, float64, int64
from numba.core.types import float16

# data type -> accumulation type (see kernels/__init__.py)
DTYPES = {"float16": (float16, float32), "float32": (float32, float32),
          "float64": (float64, float64)}


def signatures(dtype):
    """{kernel name: argument types} for data of ``dtype``."""
    t, acc = DTYPES[dtype]
    a, z = t[::1], acc[::1]
    return {
        "activation_fwd_kernel": (a, a, int64, acc, z),
        "activation_bwd_kernel": (a, a, a, a, int64, acc, z),
        "softmax_fwd_kernel": (a, a, int64, int64, int64, int64, z),
        "softmax_bwd_kernel": (a, a, a, int64, int64, int64, int64, z),
    }


__all__ = ["signatures", "DTYPES"]
