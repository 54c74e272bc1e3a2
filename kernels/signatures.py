"""Argument types of every kernel for each data dtype, for ahead-of-time checks
(``numba.cuda.compile_ptx``): the simulator runs kernels as Python and hides type errors."""

from numba import float32, float64, int64
from numba.core.types import UniTuple, float16

# data type -> accumulation type (see kernels/__init__.py)
DTYPES = {"float16": (float16, float32), "float32": (float32, float32),
          "float64": (float64, float64)}


def signatures(dtype):
    """{kernel name: argument types} for data of ``dtype``."""
    t, acc = DTYPES[dtype]
    a, z = t[::1], acc[::1]
    geo = UniTuple(int64, 20)                     # kernels/conv.py's geometry tuple
    gemm_ints = (UniTuple(int64, 3),) * 3 + (UniTuple(int64, 8), UniTuple(int64, 3))
    return {
        "activation_fwd_kernel": (a, a, int64, acc, z),
        "activation_bwd_kernel": (a, a, a, a, int64, acc, z),
        "softmax_fwd_kernel": (a, a, int64, int64, int64, int64, z),
        "softmax_bwd_kernel": (a, a, a, int64, int64, int64, int64, z),
        "conv_im2col_fwd_kernel": (a, a, geo, int64, z),
        "conv_col2im_bwd_kernel": (z, a, geo, int64, z),
        "conv_gemm_fwd_kernel": (a, a, a, a) + gemm_ints + (acc, acc, z),
        "conv_gemm_bwd_kernel": (a, a, z, a) + gemm_ints + (acc, acc, z),
        "conv_bias_bwd_kernel": (a, a, int64, int64, int64, z),
        "conv_wsum_bwd_kernel": (z, a, int64, int64, z),
    }


__all__ = ["signatures", "DTYPES"]
