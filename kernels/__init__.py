"""Pure ``@cuda.jit`` kernels (installed as ``dnnkit.kernels``).

Kernels take preallocated outputs, never allocate and never read configuration.

Every kernel is declared with ``cache=True``: Numba keeps each compiled kernel on disk (in
``__pycache__`` beside its source, else ``$NUMBA_CACHE_DIR`` or ``~/.cache/numba``), keyed by
the argument types, the compute capability and, for kernels built by a factory, the values the
factory closed over; a second process loads the cubin instead of compiling (about a second per
kernel family on an H100; validation/bench.py measures both).

Precision: each kernel takes ``acc``, a one-element device array holding 0 in the accumulation
type (float32 for float16 and float32 data, float64 for float64). ``zero = acc[0]`` and
``x[i] + zero`` promote every load to that type, ``cuda.shared.array(..., dtype=acc.dtype)``
types the scratch, and scalar arguments (``coef``) are passed in that type by the ops. Literal
constants are written ``float32(c)``: a Python literal would promote float32 math to float64.

Device functions are ``@bounds.inlined``: compiled once per signature and inlined by LLVM
(Numba's own IR inlining, ``inline=True``, re-types a function's IR in every caller and doubled
the GEMM's compile time), except the three whose kernels' machine code came out different that
way (batchnorm.py ``_merge``, pool.py ``_walk``, rnn.py ``_time``) and a function returning an
array it declares, which keep ``inline=True``.

Geometry: a kernel takes its sizes packed in one tuple of int64, ``geo`` (each module documents
its layout); the ops build it from their geometry objects (``geom``).

Every kernel module defines ``SIGNATURES(t, acc)``: {kernel name: argument types} for data type
``t`` accumulating in ``acc`` (Numba types), used by the ahead-of-time PTX checks
(kernels/signatures.py). Its kernels are found by name (``*_kernel``) or, for kernels built by
a factory at run time, through the module's ``VARIANTS`` {name: kernel}.
"""

import importlib

# One module per op family; adding a family = adding its module here. (Helpers shared between
# families live in common.py, bounds.py and tensorcore.py: no kernels of their own.)
MODULES = ("activation", "softmax", "conv", "conv_direct", "gemm", "hmma", "pool", "batchnorm",
           "dropout", "rnn", "spatial", "optim", "loss", "winograd", "arith", "reduce", "shape",
           "embedding", "lrn")

FAMILY_MODULES = tuple(importlib.import_module(f".{m}", __name__) for m in MODULES)


def _is_kernel(module, name):
    # a compiled-on-demand kernel (not a factory such as gemm.gemm_kernel)
    return (name.endswith("_kernel") and not name.startswith("_")
            and hasattr(getattr(module, name), "py_func"))


for _m in FAMILY_MODULES:
    for _name in dir(_m):
        if _is_kernel(_m, _name):
            globals()[_name] = getattr(_m, _name)

ALL_KERNELS = tuple(n for _m in FAMILY_MODULES for n in dir(_m) if _is_kernel(_m, n))


def all_kernels():
    """{name: kernel} of every kernel, factory-built variants included."""
    out = {n: globals()[n] for n in ALL_KERNELS}
    for m in FAMILY_MODULES:
        out.update(getattr(m, "VARIANTS", {}))
    return out
