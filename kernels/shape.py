"""Copies between slices along one axis (concatenate, split, take_batch's gradient).

Both arrays are viewed as 3-D (outer, rows, inner), C-contiguous: ``outer`` the product of the
dimensions before the axis, ``inner`` of those after it. The kernel copies a block of
``rows`` rows: dst[o, dst_row0 + r, k] = src[o, src_row0 + r, k].

geo = (outer, rows, inner, src_rows, src_row0, dst_rows, dst_row0): 7 int64.

A pure copy: the bits of each element are moved unchanged (no arithmetic, so no
accumulation type; ``acc`` is taken for the kernel contract only). Traffic: the block read
once from src and written once into dst.
"""

from numba import cuda, uint64


@cuda.jit(cache=True)
def slice_copy_fwd_kernel(src, dst, geo, acc):
    """Thread mapping: grid-stride over the block's flat (o, r, k) indices in C order;
    consecutive threads on consecutive k (both sides coalesced: a row of ``inner`` elements
    is contiguous in each array)."""
    outer, rows, inner = geo[0], geo[1], geo[2]
    src_rows, src_row0, dst_rows, dst_row0 = geo[3], geo[4], geo[5], geo[6]
    per = rows * inner
    i, step, n = cuda.grid(1), cuda.gridsize(1), outer * rows * inner
    while i < n:
        o = i // per
        rest = i - o * per
        r = rest // inner
        k = rest - r * inner
        dst[uint64((o * dst_rows + dst_row0 + r) * inner + k)] = \
            src[uint64((o * src_rows + src_row0 + r) * inner + k)]
        i += step


def SIGNATURES(t, acc):
    from numba import int64
    from numba.core.types import UniTuple
    a, z = t[::1], acc[::1]
    return {"slice_copy_fwd_kernel": (a, a, UniTuple(int64, 7), z)}
