"""Softmax over one axis, forward and backward.

Every input is viewed as (N, C, S) flat in memory: the reduction runs over C at stride S, for
each of the N*S (n, s) rows. Channel mode on NCHW is (N, C, H*W); instance mode and 2-D input
are (N, C*H*W, 1).

Thread mapping: a block is (bx, by) threads; threadIdx.x walks bx consecutive s positions (so a
warp reads consecutive addresses when S > 1) and the by threads of a column stride over C,
combining partial results through a shared-memory tree. With S == 1 the launcher uses bx = 1
and by = 256: one block per row. Blocks walk (n, s-tile) pairs in a grid-stride loop.

Forward (algo 0 fast, 1 accurate, 2 log), with m = max_c x (accurate/log) or 0 (fast):
    y = exp(x - m) / sum_c exp(x - m)          or  y = x - m - log(sum_c exp(x - m))
Backward, from y and dy:
    softmax: dx = y * (dy - sum_c dy * y)      log: dx = dy - exp(y) * sum_c dy
Memory traffic: forward reads x three times (max, sum, write; two for fast) and writes y once;
backward reads y and dy twice and writes dx once.

``acc`` is a one-element array holding 0 in the accumulation type (float32 for float16 and
float32 data, float64 for float64): it types both the arithmetic (``x[i] + zero``) and the
shared-memory scratch (``dtype=acc.dtype``), so one kernel serves every dtype. The scratch is
dynamic shared memory of bx*by elements (the launcher passes its size); a static array would do
on the GPU, but Numba's simulator allocates static shared arrays racily (two threads of a block
can each create their own), which breaks the reduction there.
"""

import math

from numba import cuda, float32

FAST, ACCURATE, LOG = 0, 1, 2
MAX_THREADS = 256
_MAX, _SUM = 0, 1


@cuda.jit(device=True, inline=True)
def _block_reduce(red, val, op):
    """Combine ``val`` over threadIdx.y for each threadIdx.x; every thread gets its column's
    result. ``blockDim.y`` must be a power of two."""
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    bx, by = cuda.blockDim.x, cuda.blockDim.y
    red[ty * bx + tx] = val
    cuda.syncthreads()
    half = by // 2
    while half > 0:
        if ty < half:
            a, b = red[ty * bx + tx], red[(ty + half) * bx + tx]
            if op == _MAX:
                # NaN wins, so a NaN anywhere in the row makes the whole row NaN.
                red[ty * bx + tx] = a if (a > b or a != a) else b
            else:
                red[ty * bx + tx] = a + b
        cuda.syncthreads()
        half //= 2
    out = red[tx]
    cuda.syncthreads()  # red is reused by the next reduction
    return out


@cuda.jit(cache=True)
def softmax_fwd_kernel(x, y, n, c, s, algo, acc):
    """x, y: flat arrays of n*c*s elements; see the module docstring for the mapping."""
    red = cuda.shared.array(0, dtype=acc.dtype)  # bx*by elements, sized at launch
    zero = acc[0]
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    bx, by = cuda.blockDim.x, cuda.blockDim.y
    tiles = (s + bx - 1) // bx
    for tile in range(cuda.blockIdx.x, n * tiles, cuda.gridDim.x):
        si = (tile % tiles) * bx + tx
        live = si < s
        base = (tile // tiles) * c * s + si
        m = zero
        if algo != FAST:
            # Start from an element of the row (not -inf) so m keeps the accumulation type.
            m = x[base] + zero if live else zero
            if live:
                for ci in range(ty, c, by):
                    v = x[base + ci * s] + zero
                    if v > m or v != v:
                        m = v
            m = _block_reduce(red, m, _MAX)
        part = zero
        if live:
            for ci in range(ty, c, by):
                part += math.exp(x[base + ci * s] + zero - m)
        total = _block_reduce(red, part, _SUM)
        if live:
            if algo == LOG:
                shift = m + math.log(total)
                for ci in range(ty, c, by):
                    y[base + ci * s] = x[base + ci * s] + zero - shift
            else:
                inv = (zero + float32(1)) / total
                for ci in range(ty, c, by):
                    y[base + ci * s] = math.exp(x[base + ci * s] + zero - m) * inv


@cuda.jit(cache=True)
def softmax_bwd_kernel(y, dy, dx, n, c, s, algo, acc):
    """dx from y and dy (flat, n*c*s elements); same mapping as the forward kernel."""
    red = cuda.shared.array(0, dtype=acc.dtype)  # bx*by elements, sized at launch
    zero = acc[0]
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    bx, by = cuda.blockDim.x, cuda.blockDim.y
    tiles = (s + bx - 1) // bx
    for tile in range(cuda.blockIdx.x, n * tiles, cuda.gridDim.x):
        si = (tile % tiles) * bx + tx
        live = si < s
        base = (tile // tiles) * c * s + si
        part = zero
        if live:
            for ci in range(ty, c, by):
                g = dy[base + ci * s] + zero
                part += g if algo == LOG else g * (y[base + ci * s] + zero)
        total = _block_reduce(red, part, _SUM)
        if live:
            for ci in range(ty, c, by):
                i = base + ci * s
                w = y[i] + zero
                if algo == LOG:
                    dx[i] = dy[i] + zero - math.exp(w) * total
                else:
                    dx[i] = w * (dy[i] + zero - total)


def SIGNATURES(t, acc):
    from numba import int64
    a, z = t[::1], acc[::1]
    return {"softmax_fwd_kernel": (a, a, int64, int64, int64, int64, z),
            "softmax_bwd_kernel": (a, a, a, int64, int64, int64, int64, z)}
