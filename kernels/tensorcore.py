"""Tensor-core intrinsics for the GEMM (kernels/gemm.py, ``tc=True``): inline PTX, sm_80 and
later. Numba has no warp-matrix API, so these emit the two instructions the GEMM needs.

3xTF32. A float32 x splits into big = tf32(x) (rounded to nearest, 10 mantissa bits) and
small = x - big; then a*b = big_a*big_b + big_a*small_b + small_a*big_b + small_a*small_b, where
the last term (below 2^-22 |a*b|) is dropped and the tensor core truncates small to TF32 (an
error below 2^-21 |a*b|, of either sign as a*b's sign varies). Summed over k products these
errors grow like sqrt(k) 2^-21 |a*b|, against float32 FMA's rounding of the running sum,
about sqrt(k) 2^-24 |sum| ~ k 2^-24 |a*b|: the same order at k in the hundreds (measured
against float64 in validation/gemm_bench.py). A warp's one ``mma.sync`` does 16*8*8 = 1024
multiply-adds where one FFMA does 32. Not IEEE in one respect: an Inf operand gives NaN, not
Inf (its small part is Inf - Inf), as in any split-precision product.

Not in the CUDA simulator: it runs kernels as Python threads and has no warp-wide matrix
instruction; the GEMM takes these only on a real GPU (ops/gemm.py).
"""

from llvmlite import ir
from numba import types
from numba.cuda.extending import intrinsic


def _asm(builder, ret, args, text, constraints):
    fnty = ir.FunctionType(ret, [a.type for a in args])
    return builder.call(ir.InlineAsm(fnty, text, constraints), args)


@intrinsic
def tf32_split(typingctx, x):
    """(big, small) of float32 x as bit patterns (uint32) for ``mma_tf32``: big = x rounded to
    TF32 (to nearest, ties away: add half of TF32's last place to the bits, clear the 13 low
    bits), small = x - big (exact), whose low 13 bits the tensor core ignores (truncates).
    Three integer/float operations; an Inf or NaN x gives a NaN small part (module
    docstring)."""
    if x != types.float32:
        return None
    sig = types.UniTuple(types.uint32, 2)(types.float32)

    def codegen(context, builder, signature, args):
        i32, f32 = ir.IntType(32), ir.FloatType()
        bits = builder.bitcast(args[0], i32)
        big = builder.and_(builder.add(bits, ir.Constant(i32, 0x1000)),
                           ir.Constant(i32, 0xFFFFE000))
        small = builder.fsub(args[0], builder.bitcast(big, f32))
        return context.make_tuple(builder, signature.return_type,
                                  [big, builder.bitcast(small, i32)])

    return sig, codegen


@intrinsic
def mma_tf32(typingctx, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
    """(d0, d1, d2, d3) = A.B + C for one warp: ``mma.sync.aligned.m16n8k8.row.col`` with
    TF32 A (16 x 8) and B (8 x 8) and float32 C, D (16 x 8). Lane l = 4g + q holds
    A[g, q], A[g+8, q], A[g, q+4], A[g+8, q+4]; B[q, g], B[q+4, g]; C and D at
    [g, 2q], [g, 2q+1], [g+8, 2q], [g+8, 2q+1] (PTX ISA, "Matrix Fragments for mma.m16n8k8")."""
    u, f = types.uint32, types.float32
    if any(v != u for v in (a0, a1, a2, a3, b0, b1)) or any(v != f for v in (c0, c1, c2, c3)):
        return None
    sig = types.UniTuple(f, 4)(u, u, u, u, u, u, f, f, f, f)

    def codegen(context, builder, signature, args):
        f32 = ir.FloatType()
        ret = ir.LiteralStructType([f32] * 4)
        out = _asm(builder, ret, list(args),
                   "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {$0, $1, $2, $3}, "
                   "{$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};",
                   "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f")
        return context.make_tuple(builder, signature.return_type,
                                  [builder.extract_value(out, i) for i in range(4)])

    return sig, codegen


def _stable_uuid(fn, name):
    """Give intrinsic ``fn`` a fixed uuid. Numba keys a kernel's on-disk cache by the pickled
    bytes of its closure (numba.core.caching, ``_index_key``), and an intrinsic pickles with a
    uuid drawn afresh in each process: without a fixed one, every GEMM kernel that calls these
    (through its ``mma_slab`` closure) gets a new key per process and no process finds it in
    the cache (the first conv of a second process recompiles: 5.2 s, against 0.8 s for the
    GEMM without tensor cores loaded from the cache; H100). tests/kernels/test_cache.py checks
    the keys are stable."""
    set_uuid = getattr(fn, "_set_uuid", None)     # (the simulator's intrinsics have none)
    if set_uuid is not None:
        set_uuid(f"dnnkit.kernels.tensorcore.{name}")


_stable_uuid(tf32_split, "tf32_split")
_stable_uuid(mma_tf32, "mma_tf32")
