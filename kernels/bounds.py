"""``cuda.jit`` with launch bounds, for the kernels that declare them."""

from numba import cuda
from numba.core import config


def bounded_jit(kernel, threads, blocks):
    """``cuda.jit(kernel, cache=True)`` compiled for blocks of at most ``threads`` threads, at
    least ``blocks`` of them resident per SM: ptxas then keeps to 65536 / (threads * blocks)
    registers (rounded down to a multiple of 8). The bounds are recorded on the Python
    function (``launch_bounds``) for the ahead-of-time checks (tests/kernels/test_ptx.py,
    validation/kernel_resources.py). The simulator's jit takes no bounds."""
    kernel.launch_bounds = (threads, blocks)
    if config.ENABLE_CUDASIM:
        return cuda.jit(kernel, cache=True)
    return cuda.jit(kernel, launch_bounds=kernel.launch_bounds, cache=True)
