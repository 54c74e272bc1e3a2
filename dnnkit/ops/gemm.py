"""The Numba GEMM (kernels/gemm.py) for the ops: tile choice and launch.

``gemm(layout, a, b, c, dims, lds, grps, batch, beta=, bias=, stream=)`` computes, for every
batch entry z = (z1, z2),

    C_z = op(A_z) . op(B_z) (+ bias[z1*m:]) (+ beta * C_z), then relu when ``relu=True``

on flat device arrays, with layout "00" (A m x k and B k x n both row-major), "10" (A stored
k x m: transposed) or "01" (B stored n x k: transposed); ``dims`` = (m, n, k), ``lds`` = the
three leading dimensions, ``grps`` = the grouped-index pairs (grp, gstride) of A's, B's and C's
fast index (``PLAIN`` for none), ``batch`` = (nz1, nz2, a1, a2, b1, b2, c1, c2) offsets. See
kernels/gemm.py for the exact addressing. Accumulation in float32 for float16/float32 data,
float64 for float64; C in the data type or in the accumulation type. Launch plans (kernel,
grid, tile) are remembered by shape: the per-step GEMMs of an RNN cost only their launch.

Tensor cores. Where ``TENSOR_CORES`` is true (the default), the data float32 or float16 and
the GPU of compute capability 8.0 or later, the products run on tensor cores
(kernels/tensorcore.py), in the ``math`` the caller asks for:

  - float32, math "3xtf32" (the default): each float32 product split into three TF32
    products, each k-step's sum added to the accumulator in float32, for errors of float32's
    order (max error / max |C| against float64 about 1e-6 to 1e-5 at k = 576 to 4608, where
    FP32 FMA gives 1e-6 to 3e-6: validation/gemm_bench.py);
  - float32, math "tf32": one TF32 product (A and B rounded to 10 mantissa bits, errors of
    order 2^-11 = 5e-4 of |C|), a third of the mma: the convolution's ``dnn.conv.allow_tf32``;
  - float16 (any math): HMMA, ``mma.m16n8k16`` with float32 accumulators; float16 products
    are exact, so the error is float32 accumulation's, then C's rounding to float16. Where no
    operand walks a grouped k and B is not read from a convolution's input (implicit), the
    pipelined kernel of kernels/hmma.py runs it (2.5-3x the rate of
    kernels/gemm.py's HMMA variants).

Set it False for plain FP32 FMA (IEEE Inf arithmetic: with tensor cores an Inf operand of a
3xTF32 product gives NaN). The simulator and float64 always take FP32 FMA.
"""

import sys
import types

import numpy as np

from .. import arrays, device, fastpath
from ..launch import Prepared, launch

# kernels/gemm.py (dnnkit.kernels.gemm) and numba are imported inside the functions that read
# them: ``import dnnkit`` must not pay for numba.

PLAIN = (1 << 62, 0)         # an ungrouped GEMM index (kernels/gemm.py)
TENSOR_CORES = True          # tensor cores where it can (module docstring)


class _Switches(types.ModuleType):
    """This module's class: setting TENSOR_CORES drops the memo's runners, which keep the GEMM
    plan their first call chose (ops/conv_prepared.py), as conv_tuning's switches do."""

    def __setattr__(self, name, value):
        super().__setattr__(name, value)
        if name == "TENSOR_CORES":
            fastpath.invalidate()


sys.modules[__name__].__class__ = _Switches
NO_BATCH = (1, 1, 0, 0, 0, 0, 0, 0)
# Products of at most this many rows take the 32-row tiles (gemm_config).
TINY_ROWS = 32


def gemm_config(m, n=1 << 30, batch=1):
    """Tile configuration (kernels/gemm.py CONFIGS) for a GEMM of m x n, ``batch`` times:
    128 x 128 tiles where they make at least two blocks per SM of the GPU (measured best on
    large products on an H100/H200), 32 x 128 for m <= 32 (TINY_ROWS), else 64 x 128
    (measured best for m <= 64 and for products too small to fill the GPU with the large
    tiles; validation/gemm_bench.py)."""
    if device.simulator():
        return "sim"
    if m <= TINY_ROWS:
        return "tiny"
    large_blocks = -(-m // 128) * -(-n // 128) * batch
    return "large" if m > 64 and large_blocks >= 2 * device.sm_count() else "small"


def launch_grid(m, n, batch=1):
    """(configuration name, grid) of the launch for an m x n product ``batch`` times (blocks
    beyond a grid dimension's 65535 loop inside the kernel)."""
    from ..kernels.gemm import CONFIGS
    name = gemm_config(m, n, batch)
    wm, wn, tx, ty, _ = CONFIGS[name]
    return name, (-(-n // (tx * wn)), min(-(-m // (ty * wm)), 65535), min(batch, 65535))


_plans = {}      # (layout, dims, batch sizes, dtype, device) -> (kernel, grid, block, shared, acc)


MATHS = ("3xtf32", "tf32")


def gemm(layout, a, b, c, dims, lds, grps, batch, *, beta=0.0, bias=None, stream, site=None,
         conv=None, math="3xtf32", relu=False):
    """Launch kernels/gemm.py's kernel for ``layout`` (see its docstring for the arguments).
    a, b, c, bias: flat device arrays or ``launch.At`` offsets into them. ``site``: a
    ``launch.Site`` for a loop's repeated call with arguments of unchanging types. ``conv``:
    (table, cg) of the implicit convolution (B read from x as its im2col matrix; layout 00).
    ``math``: float32's tensor-core products, "3xtf32" or "tf32" (module docstring)."""
    kernel, grid, block, shared, args = _launch_of(layout, a, b, c, dims, lds, grps, batch,
                                                   beta, bias, conv, math, relu)
    (site or launch)(kernel, grid, block, stream, args, shared)


def prepared(layout, a, b, c, dims, lds, grps, batch, *, beta=0.0, bias=None, conv=None,
             math="3xtf32", relu=False):
    """``gemm``'s launch as a ``launch.Prepared`` (a runner's, packed once): arguments 0, 1,
    2 and 3 are a, b, c and the bias (a when there is none: the kernel reads it only with a
    bias), to be replaced with ``set_flat`` per call; ``prepared(stream)`` launches."""
    kernel, grid, block, shared, args = _launch_of(layout, a, b, c, dims, lds, grps, batch,
                                                   beta, bias, conv, math, relu)
    return Prepared(kernel, grid, block, args, shared)


def _launch_of(layout, a, b, c, dims, lds, grps, batch, beta, bias, conv, math, relu):
    """(kernel, grid, block, shared bytes, arguments) of one GEMM, its plan remembered."""
    # A's and B's k plain where k is their fast index (the pipelined float16 kernel's
    # condition: layout 00's A, 01's A and B)
    plain = (layout[0] == "1" or grps[0] >= dims[2]) and (layout[1] == "0" or
                                                          grps[2] >= dims[2])
    # the pipelined float16 kernel's variant for strides and extents that are multiples of 4
    # elements, not all of 8 (kernels/hmma.py ``narrow``: 8-byte copies): their low bits,
    # ORed (addresses are checked by the kernel itself, per block)
    low = (lds[0] | lds[1] | dims[0] | dims[1] | dims[2] | grps[0] | grps[1] | grps[2]
           | grps[3] | batch[2] | batch[3] | batch[4] | batch[5]) & 7
    key = (layout, dims, batch[0], batch[1], a.dtype, device.device_id(), conv is not None,
           TENSOR_CORES, math, plain, low == 4, relu)
    plan = _plans.get(key)
    if plan is None:
        if math not in MATHS:
            raise ValueError(f"gemm: math must be one of {MATHS}, got {math!r}")
        if len(_plans) >= 4096:
            _plans.clear()
        plan = _plans[key] = _plan(layout, dims, batch, a.dtype, conv is not None, math, plain,
                                   low == 4, relu)
    kernel, grid, block, shared, acc, dummy = plan
    table, cg = conv or dummy
    return kernel, grid, block, shared, (
        a, b, c, a if bias is None else bias, dims, lds, grps, batch, acc.dtype.type(beta),
        epilogue(bias is not None, relu), acc, table, cg)


# kernels/common.py's EPILOGUE bits (tests/ops/test_conv_relu.py checks they agree): what the
# forward convolution and GEMM kernels do to a value before its store
EPI_BIAS, EPI_RELU = 1, 2


def epilogue(has_bias, relu):
    """The kernels' ``epi`` int: + bias, then relu."""
    return (EPI_BIAS if has_bias else 0) | (EPI_RELU if relu else 0)


def tensor_cores(dtype):
    """Whether this device's GEMMs of ``dtype`` data run on tensor cores (module docstring)."""
    if not TENSOR_CORES or device.simulator() or np.dtype(dtype) == np.float64:
        return False
    dev = device.device_id()
    cc = _capability.get(dev)
    if cc is None:
        from numba import cuda
        cc = _capability[dev] = tuple(cuda.get_current_device().compute_capability)
    return cc >= (8, 0)


_capability = {}    # device ordinal -> compute capability


def tc_prefix(dtype, math="3xtf32"):
    """The kernels/gemm.py CONFIGS prefix of this device's GEMM of ``dtype`` data in ``math``:
    "hmma" (float16), "tc" (float32, 3xTF32), "tf32" (float32, one TF32 product), or None
    (no tensor cores: FP32 FMA)."""
    if not tensor_cores(dtype):
        return None
    if np.dtype(dtype) == np.float16:
        return "hmma"
    return "tf32" if math == "tf32" else "tc"


def _plan(layout, dims, batch, dtype, implicit, math, plain, narrow=False, relu=False):
    from ..kernels.gemm import CG_LEN, CONFIGS, VARIANTS, config_options, shared_bytes
    m, n, _ = dims
    name, grid = launch_grid(m, n, batch[0] * batch[1])
    prefix = tc_prefix(dtype, math)
    acc = arrays.acc_array(dtype)
    # the implicit convolution's arguments, unused by the other variants: a 4-entry table
    dummy = None if implicit else (arrays.constant(np.zeros(4), np.int32), (0,) * CG_LEN)
    if prefix == "hmma" and plain and not implicit:
        # float16, k plain: the pipelined kernel (kernels/hmma.py), its 64-row tiles
        # where 128-row ones would not make two blocks per SM (measured: validation/notes/gemm.md)
        from ..kernels import hmma
        bm = 128 if name == "large" else 64
        grid = (-(-n // hmma.BN), min(-(-m // bm), 65535), grid[2])
        name = f"gemm_{layout}_hmma{bm}{'n' if narrow else ''}_kernel"
        return (hmma.VARIANTS[name], grid, (hmma.THREADS, 1),      # (its relu: epi's bit)
                hmma.shared_bytes(bm), acc, dummy)
    if prefix is not None:
        name = f"{prefix}_{name}"   # the same tiles (kernels/gemm.py CONFIGS)
    wm, wn, tx, ty, _ = CONFIGS[name]
    # kernels/gemm.py's relu is a variant (compile time): the forward convolution's and
    # linear's layouts have one
    variant = f"gemm_{layout}_{name}{'_implicit' if implicit else ''}{'_relu' if relu else ''}"
    if variant + "_kernel" not in VARIANTS:
        raise ValueError(f"gemm: no kernel {variant}_kernel (a relu on layout {layout})")
    kernel = VARIANTS[variant + "_kernel"]
    return (kernel, grid, (tx, ty),
            shared_bytes(wm, wn, tx, ty, acc.dtype.itemsize, **config_options(name)), acc, dummy)
