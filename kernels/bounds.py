"""``cuda.jit`` variants the simulator's jit lacks: kernels with launch bounds (``bounded_jit``)
and device functions inlined by LLVM (``inlined``)."""

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


def inlined(fn):
    """A device function compiled once per signature and inlined by LLVM at each call
    (``forceinline``: the alwaysinline attribute), in place of Numba's IR inlining
    (``inline=True``), which copies and re-types the function's IR into every caller. A GEMM
    variant reaches PTX in 1.1-1.6 s so, 2.0-2.5 s the other way, with the same machine code
    (validation/notes/cold-start.md). A device function returning an array it declares (a
    shared array) must stay ``inline=True``: Numba returns only arrays passed in."""
    if config.ENABLE_CUDASIM:
        return cuda.jit(device=True)(fn)
    return cuda.jit(device=True, forceinline=True)(fn)
