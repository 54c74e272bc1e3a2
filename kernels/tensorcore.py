"""Tensor-core intrinsics for the GEMM (kernels/gemm.py, ``tc``): inline PTX, sm_80 and later.
Numba has no warp-matrix API, so these emit the instructions the GEMM needs, and ``slab_mma``
builds the GEMM's multiply of one shared-memory slab in each of its three tensor-core modes:

  - "3xtf32": float32 data, errors of float32's order (below);
  - "tf32": float32 data, one TF32 product (A and B rounded to 10 mantissa bits: a relative
    error up to 2^-11 per product, as cuDNN's and cuBLAS's TF32), 3x fewer mma;
  - "f16": float16 data on ``mma.m16n8k16`` (HMMA) with float32 accumulators: the products of
    two float16 are exact in float32, so the only rounding is the float32 accumulation. Twice
    the k of a TF32 mma per instruction.

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

import functools

from llvmlite import ir
from numba import cuda, types, uint32, uint64

from .bounds import inlined
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


@intrinsic
def mma_f16(typingctx, a0, a1, a2, a3, b0, b1, c0, c1, c2, c3):
    """(d0, d1, d2, d3) = A.B + C for one warp: ``mma.sync.aligned.m16n8k16.row.col`` with
    float16 A (16 x 16) and B (16 x 8), float32 C, D (16 x 8). Each A and B register holds two
    float16 of consecutive k (the lower k in the low 16 bits). Lane l = 4g + q holds the pairs
    A[g, 2q:2q+2], A[g+8, 2q:2q+2], A[g, 2q+8:2q+10], A[g+8, 2q+8:2q+10];
    B[2q:2q+2, g], B[2q+8:2q+10, g]; C and D as in ``mma_tf32`` (PTX ISA, "Matrix Fragments
    for mma.m16n8k16 with floating point type"). In pairs of k (p = k // 2) the lane's
    registers sit where ``mma_tf32``'s elements do: A[g, p = q], A[g+8, q], A[g, q+4], ..."""
    u, f = types.uint32, types.float32
    if any(v != u for v in (a0, a1, a2, a3, b0, b1)) or any(v != f for v in (c0, c1, c2, c3)):
        return None
    sig = types.UniTuple(f, 4)(u, u, u, u, u, u, f, f, f, f)

    def codegen(context, builder, signature, args):
        f32 = ir.FloatType()
        ret = ir.LiteralStructType([f32] * 4)
        out = _asm(builder, ret, list(args),
                   "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {$0, $1, $2, $3}, "
                   "{$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};",
                   "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f")
        return context.make_tuple(builder, signature.return_type,
                                  [builder.extract_value(out, i) for i in range(4)])

    return sig, codegen


# ---------------------------------------------------------------- addresses, async copies,
# ldmatrix: the pipelined float16 GEMM (kernels/hmma.py). Each asm that reads or writes memory
# behind LLVM's back is volatile with a memory clobber, so LLVM keeps it between the barriers
# and the other accesses it is written between.

def _void_asm(context, builder, args, text, constraints):
    fnty = ir.FunctionType(ir.VoidType(), [a.type for a in args])
    builder.call(ir.InlineAsm(fnty, text, constraints, side_effect=True), args)
    return context.get_dummy_value()


@intrinsic
def address(typingctx, arr):
    """The generic address (uint64) of array ``arr``'s first element."""
    if not isinstance(arr, types.Array):
        return None

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        return builder.ptrtoint(ary.data, ir.IntType(64))

    return types.uint64(arr), codegen


@intrinsic
def shared_address(typingctx, arr):
    """The shared-window address (uint32, as ``ld.shared``, ``cp.async`` and ``ldmatrix``
    take it) of shared array ``arr``'s first element."""
    if not isinstance(arr, types.Array):
        return None

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        generic = builder.ptrtoint(ary.data, ir.IntType(64))
        return _asm(builder, ir.IntType(32), [generic],
                    "{ .reg .u64 t; cvta.to.shared.u64 t, $1; cvt.u32.u64 $0, t; }", "=r,l")

    return types.uint32(arr), codegen


def _cp_async(cache, size):
    @intrinsic
    def fn(typingctx, dst, src, nbytes):
        u32, u64 = types.uint32, types.uint64
        if (dst, src, nbytes) != (u32, u64, u32):
            return None

        def codegen(context, builder, signature, args):
            return _void_asm(context, builder, list(args),
                             f"cp.async.{cache}.shared.global [$0], [$1], {size}, $2;",
                             "r,l,r,~{memory}")

        return types.void(u32, u64, u32), codegen
    return fn


cp_async16 = _cp_async("cg", 16)
cp_async16.__doc__ = """Copy 16 bytes from global address ``src`` to shared address ``dst``
asynchronously (``cp.async.cg``: through L2 only), of which the first ``nbytes`` (0 or 16) are
read and the rest zero-filled: 0 reads nothing (an element past the matrix)."""
cp_async8 = _cp_async("ca", 8)
cp_async8.__doc__ = """Copy 8 bytes from global address ``src`` to shared address ``dst``
asynchronously (``cp.async.ca``: .cg takes 16 bytes only), of which the first ``nbytes`` (0 or
8) are read and the rest zero-filled; both addresses 8-byte aligned."""


def _cp_async_group(text, doc):
    @intrinsic
    def fn(typingctx):
        def codegen(context, builder, signature, args):
            return _void_asm(context, builder, [], text, "~{memory}")
        return types.void(), codegen
    fn.__doc__ = doc
    return fn


cp_async_commit = _cp_async_group("cp.async.commit_group;",
                                  "Close this thread's group of cp.async copies issued so far.")
cp_async_wait1 = _cp_async_group("cp.async.wait_group 1;",
                                 "Wait until at most one of this thread's copy groups is pending.")
cp_async_wait0 = _cp_async_group("cp.async.wait_group 0;",
                                 "Wait for all of this thread's copy groups.")


def _ldmatrix(trans):
    text = (f"ldmatrix.sync.aligned.m8n8.x4{'.trans' if trans else ''}.shared.b16 "
            "{$0, $1, $2, $3}, [$4];")

    @intrinsic
    def fn(typingctx, addr):
        if addr != types.uint32:
            return None
        sig = types.UniTuple(types.uint32, 4)(types.uint32)

        def codegen(context, builder, signature, args):
            i32 = ir.IntType(32)
            ret = ir.LiteralStructType([i32] * 4)
            fnty = ir.FunctionType(ret, [i32])
            out = builder.call(ir.InlineAsm(fnty, text, "=r,=r,=r,=r,r,~{memory}",
                                            side_effect=True), list(args))
            return context.make_tuple(builder, signature.return_type,
                                      [builder.extract_value(out, i) for i in range(4)])

        return sig, codegen
    return fn


# Four 8 x 8 matrices of 16-bit elements: lane 8j + r gives the shared address of matrix j's
# row r (16 bytes); each lane gets, in register j, matrix j's elements (g, 2q) and (g, 2q+1)
# (lane 4g + q), the lower in the low half -- or with .trans (2q, g) and (2q+1, g): the
# fragment of an mma operand stored the other way round.
ldmatrix_x4 = _ldmatrix(False)
ldmatrix_x4_trans = _ldmatrix(True)


MODES = ("3xtf32", "tf32", "f16")


@functools.lru_cache(maxsize=None)
def slab_mma(mode, bk, sa, sb, wmt, wnt):
    """The device function ``mma_slab(sh, pa, pb, c_reg, zero)`` of kernels/gemm.py: c_reg +=
    this warp's piece of one ``bk``-deep shared slab's product, A stored k-major with rows of
    ``sa`` and B with rows of ``sb`` (the unit below). ``pa`` / ``pb``: the offsets of A's row
    g of the warp's rows and of B's column g of its columns at k row q of the slab (lane
    4g + q). The warp's wmt x wnt tiles of 16 x 8 (c_reg[2mt:2mt+2, 2nt:2nt+2]) take
    wmt + wnt fragment loads per k-step and 3*wmt*wnt ("3xtf32") or wmt*wnt mma.

    "3xtf32" / "tf32": ``sh`` holds float32, unit one element, k-steps of 8. "f16": the slab
    is float16 stored in pairs of consecutive k (element (k, r) at half
    (k // 2)*2*rows + 2r + k % 2), read as 32-bit words (the unit: one word = one pair =
    one mma register, a single ld.shared.b32) from the dynamic shared memory's uint32 alias;
    k-steps of 16 (8 pair rows). Pair rows sa words apart with sa = 8 (mod 32) put lanes
    4g + q on 32 distinct banks, as the float32 rows do."""
    if mode not in MODES:
        raise ValueError(f"slab_mma: mode must be one of {MODES}, got {mode!r}")
    nfa, nfb = 4 * wmt, 2 * wnt     # a lane's A and B fragment words per k-step
    BK = bk     # noqa: N806 -- compile-time constants of the closures

    @inlined
    def mma_3xtf32(sh, pa, pb, c_reg, zero):
        ah = cuda.local.array(nfa, dtype=uint32)    # big and small halves of A, B
        al = cuda.local.array(nfa, dtype=uint32)
        bh = cuda.local.array(nfb, dtype=uint32)
        bl = cuda.local.array(nfb, dtype=uint32)
        for ks in range(0, BK, 8):
            for mt in range(wmt):
                for r in range(4):      # A[g + 8*(r%2), q + 4*(r//2)]
                    v = sh[uint64(pa + (ks + (r // 2) * 4) * sa + mt * 16 + (r % 2) * 8)]
                    ah[4 * mt + r], al[4 * mt + r] = tf32_split(v)
            for nt in range(wnt):
                for r in range(2):      # B[q + 4*r, g]
                    v = sh[uint64(pb + (ks + r * 4) * sb + nt * 8)]
                    bh[2 * nt + r], bl[2 * nt + r] = tf32_split(v)
            for mt in range(wmt):
                for nt in range(wnt):
                    i, j, e, f = 2 * mt, 2 * nt, 4 * mt, 2 * nt
                    # A k-step's sum starts from zero, the small terms first, and is added
                    # to c_reg in IEEE float32: the tensor core's own accumulation truncates,
                    # which into the running sum would bias it by ~2^-23 of |c| per mma
                    # (measured: errors growing with k, 10x float32's at k = 4608).
                    d0, d1, d2, d3 = mma_tf32(al[e], al[e + 1], al[e + 2], al[e + 3], bh[f],
                                              bh[f + 1], zero, zero, zero, zero)
                    d0, d1, d2, d3 = mma_tf32(ah[e], ah[e + 1], ah[e + 2], ah[e + 3], bl[f],
                                              bl[f + 1], d0, d1, d2, d3)
                    d0, d1, d2, d3 = mma_tf32(ah[e], ah[e + 1], ah[e + 2], ah[e + 3], bh[f],
                                              bh[f + 1], d0, d1, d2, d3)
                    c_reg[i, j] += d0
                    c_reg[i, j + 1] += d1
                    c_reg[i + 1, j] += d2
                    c_reg[i + 1, j + 1] += d3

    @inlined
    def mma_1xtf32(sh, pa, pb, c_reg, zero):
        # TF32's own error (2^-11 per product) dwarfs the tensor core's truncating
        # accumulation (~2^-23 of |c| per mma), so the mma accumulates into c_reg directly
        af = cuda.local.array(nfa, dtype=uint32)
        bf = cuda.local.array(nfb, dtype=uint32)
        for ks in range(0, BK, 8):
            for mt in range(wmt):
                for r in range(4):
                    v = sh[uint64(pa + (ks + (r // 2) * 4) * sa + mt * 16 + (r % 2) * 8)]
                    af[4 * mt + r] = tf32_split(v)[0]
            for nt in range(wnt):
                for r in range(2):
                    v = sh[uint64(pb + (ks + r * 4) * sb + nt * 8)]
                    bf[2 * nt + r] = tf32_split(v)[0]
            for mt in range(wmt):
                for nt in range(wnt):
                    i, j, e, f = 2 * mt, 2 * nt, 4 * mt, 2 * nt
                    c_reg[i, j], c_reg[i, j + 1], c_reg[i + 1, j], c_reg[i + 1, j + 1] = \
                        mma_tf32(af[e], af[e + 1], af[e + 2], af[e + 3], bf[f], bf[f + 1],
                                 c_reg[i, j], c_reg[i, j + 1], c_reg[i + 1, j],
                                 c_reg[i + 1, j + 1])

    @inlined
    def mma_hmma(sh, pa, pb, c_reg, zero):
        # the float16 slab as words (dynamic shared arrays all start at the same address)
        words = cuda.shared.array(0, dtype=uint32, alignment=16)
        af = cuda.local.array(nfa, dtype=uint32)
        bf = cuda.local.array(nfb, dtype=uint32)
        for ks in range(0, BK // 2, 8):     # pair rows of one k-step of 16
            for mt in range(wmt):
                for r in range(4):      # pairs A[g + 8*(r%2), p = q + 4*(r//2)]
                    af[4 * mt + r] = words[uint64(pa + (ks + (r // 2) * 4) * sa + mt * 16
                                                  + (r % 2) * 8)]
            for nt in range(wnt):
                for r in range(2):      # pairs B[p = q + 4*r, g]
                    bf[2 * nt + r] = words[uint64(pb + (ks + r * 4) * sb + nt * 8)]
            for mt in range(wmt):
                for nt in range(wnt):
                    # float32 accumulation straight into c_reg (as cuDNN's HMMA kernels): the
                    # tensor core's accumulation error (~2^-23 of |c| per mma) is far below
                    # float16's 2^-11
                    i, j, e, f = 2 * mt, 2 * nt, 4 * mt, 2 * nt
                    c_reg[i, j], c_reg[i, j + 1], c_reg[i + 1, j], c_reg[i + 1, j + 1] = \
                        mma_f16(af[e], af[e + 1], af[e + 2], af[e + 3], bf[f], bf[f + 1],
                                c_reg[i, j], c_reg[i, j + 1], c_reg[i + 1, j],
                                c_reg[i + 1, j + 1])

    return {"3xtf32": mma_3xtf32, "tf32": mma_1xtf32, "f16": mma_hmma}[mode]


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
for _name in ("mma_f16", "address", "shared_address", "cp_async16", "cp_async8",
              "cp_async_commit",
              "cp_async_wait1", "cp_async_wait0", "ldmatrix_x4", "ldmatrix_x4_trans"):
    _stable_uuid(globals()[_name], _name)
