"""In-place elementwise updates on device arrays.

    axpy   y += alpha * x        (summing the pieces of a split cuDNN call: ops/split.py)

Arithmetic is in the accumulation type (float32 for float16 data), rounded once into y.
"""

from .. import arrays
from ..launch import flat as flat_arg, launch


def axpy(alpha, x, y, *, stream=None):
    """``y += alpha * x`` in place; returns ``y``.

    ``y`` must be a device array (it is updated where it lies: a host array would be updated in
    a copy and the result lost); ``x`` is a device array or anything ``Parameter`` accepts,
    of y's shape and dtype, C-contiguous.
    """
    op = "axpy"
    try:
        alpha = float(alpha)
    except (TypeError, ValueError):
        raise TypeError(f"{op}: alpha must be a number; got {alpha!r}") from None
    if not (arrays.is_device_array(y) or hasattr(y, "__cuda_array_interface__")):
        raise TypeError(f"{op}: y must be a device array (it is updated in place); "
                        f"got {type(y).__name__}")
    s = arrays.as_stream(stream)
    y = arrays.device_input(op, "y", y, s)
    x = arrays.device_input(op, "x", x, s)
    arrays.same_shape(op, "y", y, x=x)
    if y.size:
        # (imported on first use: kernel modules import numba, which ``import dnnkit`` does not
        # pay for)
        from ..kernels import axpy_fwd_kernel
        acc = arrays.acc_array(y.dtype)
        blocks, threads = arrays.grid_1d(y.size)
        launch(axpy_fwd_kernel, blocks, threads, s,
               (flat_arg(x), flat_arg(y), acc.dtype.type(alpha), acc))
    return y
