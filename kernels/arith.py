"""Elementwise binary arithmetic with NumPy broadcasting: y = a (op) b.

Ops (integers shared with dnnkit.ops.arith): 0 add, 1 subtract, 2 multiply, 3 divide, 4 copy
(y = a: broadcast_to). Arithmetic is in the accumulation type (float32 for float16 data),
rounded once into y; division follows IEEE (x / 0 = +-inf, 0 / 0 = NaN: Numba's CUDA target
compiles with the NumPy error model).

Broadcasting by strides: y is walked in C order as an ``nd``-dimensional array (nd <= MAXDIM,
after the ops merge adjacent dimensions that broadcast alike); each operand has one element
stride per dimension, 0 where it is broadcast. An operand that is a scalar is passed as a
value (``sa``, ``sb`` in the accumulation type) with its flag in ``geo`` off; its array
argument is then a placeholder, never read.

geo = (nd, use_a, use_b, shape[MAXDIM], a_strides[MAXDIM], b_strides[MAXDIM]): 27 int64.

Traffic: each operand read once per output (a broadcast operand's repeats come from cache),
y written once.
"""

from numba import cuda, uint64

from .bounds import inlined

MAXDIM = 8
ADD, SUBTRACT, MULTIPLY, DIVIDE, COPY = range(5)
SHAPE, A_STRIDES, B_STRIDES = 3, 3 + MAXDIM, 3 + 2 * MAXDIM     # offsets into geo
GEO_LEN = 3 + 3 * MAXDIM


@inlined
def offsets(i, geo):
    """(offset into a, offset into b) of y's flat index i: its C-order coordinates (the last
    dimension fastest) times each operand's strides. One dimension needs no division."""
    nd = geo[0]
    ia = 0
    ib = 0
    for k in range(nd - 1, 0, -1):
        n = geo[SHAPE + k]
        c = i % n
        i //= n
        ia += c * geo[A_STRIDES + k]
        ib += c * geo[B_STRIDES + k]
    return ia + i * geo[A_STRIDES], ib + i * geo[B_STRIDES]


@inlined
def apply(va, vb, op):
    if op == ADD:
        return va + vb
    if op == SUBTRACT:
        return va - vb
    if op == MULTIPLY:
        return va * vb
    if op == DIVIDE:
        return va / vb
    return va


@inlined
def _load(x, off, use, s, zero):
    return x[uint64(off)] + zero if use else s


@cuda.jit(cache=True)
def arith_fwd_kernel(a, b, y, sa, sb, op, geo, acc):
    """y[i] = a[ia] (op) b[ib] over y's flat indices. Thread mapping: grid-stride loop,
    consecutive threads on consecutive outputs (y written coalesced; a full-shape operand
    read coalesced), four outputs a grid stride apart per trip with their loads issued
    before the first result (kernels/common.py UNROLL); the tail one per trip."""
    zero = acc[0]
    ua, ub = geo[1] != 0, geo[2] != 0
    i, step, n = cuda.grid(1), cuda.gridsize(1), y.size
    while i + 3 * step < n:
        a0, b0 = offsets(i, geo)
        a1, b1 = offsets(i + step, geo)
        a2, b2 = offsets(i + 2 * step, geo)
        a3, b3 = offsets(i + 3 * step, geo)
        x0, x1 = _load(a, a0, ua, sa, zero), _load(a, a1, ua, sa, zero)
        x2, x3 = _load(a, a2, ua, sa, zero), _load(a, a3, ua, sa, zero)
        w0, w1 = _load(b, b0, ub, sb, zero), _load(b, b1, ub, sb, zero)
        w2, w3 = _load(b, b2, ub, sb, zero), _load(b, b3, ub, sb, zero)
        y[uint64(i)] = apply(x0, w0, op)
        y[uint64(i + step)] = apply(x1, w1, op)
        y[uint64(i + 2 * step)] = apply(x2, w2, op)
        y[uint64(i + 3 * step)] = apply(x3, w3, op)
        i += 4 * step
    while i < n:
        ia, ib = offsets(i, geo)
        y[uint64(i)] = apply(_load(a, ia, ua, sa, zero), _load(b, ib, ub, sb, zero), op)
        i += step


def SIGNATURES(t, acc):
    from numba import int64
    from numba.core.types import UniTuple
    a, z = t[::1], acc[::1]
    return {"arith_fwd_kernel": (a, a, a, acc, acc, int64, UniTuple(int64, GEO_LEN), z)}
