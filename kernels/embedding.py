"""Embedding lookup (a row gather) and its gradient (a row scatter-add), on flat arrays.

Layout: ``ids`` holds L integer indices (int32 or int64, any shape, flat), ``w`` is the
(num, dim) table row-major, ``y`` is (L, dim): ``y[i, d] = w[ids[i], d]``.

Forward (``embedding_fwd_kernel``): a grid-stride loop over the L*dim outputs, consecutive
threads on consecutive elements: the reads of a row and the writes are coalesced; a thread
divides its flat index by dim once per element. An id outside [0, num) cannot raise on the
device: its whole output row is NaN, so the loss it reaches is NaN (a clamped or zero row
would train on silently wrong data).

Backward (``embedding_bwd_kernel``): ``dw`` (num, dim) in the accumulation type, zeroed by the
caller, gets ``dw[ids[i], d] += dy[i, d]`` by atomic adds (float32 or float64: an id repeated
k times costs k atomic adds on the same words; the order of those adds, hence the last bits of
the sum, is not fixed). Ids outside [0, num) and ids equal to ``pad`` (padding_idx; -1 for
none) add nothing. ``embedding_cast_kernel`` rounds a float32 accumulation once into a float16
gradient. Traffic: forward reads an id per element (L distinct, from cache), L*dim
weights, writes L*dim; backward reads L*dim gradients and adds L*dim words atomically (then
reads and writes num*dim once more for float16).

``acc``: the one-element accumulation-type array (kernels/__init__.py).
"""

import math

from numba import cuda, float32, int32, int64


@cuda.jit(cache=True)
def embedding_fwd_kernel(ids, w, y, num, dim, acc):
    """y[i, d] = w[ids[i], d]; a NaN row for an id outside [0, num)."""
    zero = acc[0]
    for p in range(cuda.grid(1), y.size, cuda.gridsize(1)):
        i = p // dim
        v = int64(ids[i])
        if 0 <= v < num:
            y[p] = w[v * dim + (p - i * dim)]
        else:
            y[p] = zero + float32(math.nan)


@cuda.jit(cache=True)
def embedding_bwd_kernel(ids, dy, dw, num, dim, pad, acc):
    """dw[ids[i], d] += dy[i, d] (atomic, in the accumulation type), skipping ids outside
    [0, num) and ids equal to ``pad``."""
    zero = acc[0]
    for p in range(cuda.grid(1), dy.size, cuda.gridsize(1)):
        i = p // dim
        v = int64(ids[i])
        if 0 <= v < num and v != pad:
            cuda.atomic.add(dw, v * dim + (p - i * dim), dy[p] + zero)


@cuda.jit(cache=True)
def embedding_cast_kernel(src, dst, acc):
    """dst[i] = src[i], rounded once to dst's type (float32 scratch -> float16 gradient)."""
    for i in range(cuda.grid(1), dst.size, cuda.gridsize(1)):
        dst[i] = src[i]


# int32 ids: the same kernels, named again so the ahead-of-time checks compile both index types
VARIANTS = {"embedding_fwd_i32_kernel": embedding_fwd_kernel,
            "embedding_bwd_i32_kernel": embedding_bwd_kernel}


def SIGNATURES(t, acc):
    a, z = t[::1], acc[::1]
    out = {}
    for suffix, ids in (("", int64[::1]), ("_i32", int32[::1])):
        out[f"embedding_fwd{suffix}_kernel"] = (ids, a, a, int64, int64, z)
        out[f"embedding_bwd{suffix}_kernel"] = (ids, a, z, int64, int64, int64, z)
    out["embedding_cast_kernel"] = (z, a, z)
    return out
