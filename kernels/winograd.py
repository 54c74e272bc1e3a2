"""Winograd F(2x2, 3x3) convolution, non-fused: the transforms of dnnkit/ops/conv_winograd.py
(the products between them are a batched GEMM, kernels/gemm.py).

A 3x3 stride-1 convolution maps each 4x4 input tile d (tiles 2 apart, overlapping by 2) to a
2x2 output tile:

    Y = A^T [ sum_c (G g_kc G^T) (.) (B^T d_c B) ] A        ((.) elementwise, 4 x 4)

    B^T = | 1  0 -1  0 |     G = | 1    0    0  |     A^T = | 1  1  1  0 |
          | 0  1  1  0 |         | 1/2  1/2  1/2 |           | 0  1 -1 -1 |
          | 0 -1  1  0 |         | 1/2 -1/2  1/2 |
          | 0  1  0 -1 |         | 0    0    1  |

so the sum over channels becomes 16 independent GEMMs, one per position xi of the 4 x 4
transformed tile: M[xi] (K x P) = U[xi] (K x C) . V[xi] (C x P), P = images x tiles, with 16
multiplications per 4 outputs where the direct sum takes 36 (2.25x fewer). The filter gradient
follows by the chain rule: dM = A dY A^T per output tile (zero where the tile overhangs the
output), dU[xi] = dM[xi] . V[xi]^T summed over tiles, dg = G^T dU G. The transforms only add
and halve, so their rounding is a few ulps (measured against float64 in tests/ops and
validation/winograd_bench.py).

Layouts (all flat, C-contiguous): x (N, C, H, W) and y (N, K, OH, OW) from a chunk's first
image; the transformed arrays, position xi = 4a + b major (each kernel computes in the
accumulation type and stores in its output's type: U, V and dM are the products' operands,
float16 for float16 data, M and dU their float32 sums; dnnkit/ops/conv_winograd.py; the
operands are stored times ``scale`` and the sums read back times ``unscale`` = 1 / scale^2,
powers of two, so that float16 operands keep x's, g's and dy's range):
U[xi, k, c] (or [xi, c, k] transposed: the data gradient's filter), V[xi, c, p] and
M / dM[xi, k, p] with row stride ``ps`` >= P (columns P..ps-1 written as zeros, so a GEMM may
split its sum over p into equal parts), dU[part, xi, k, c]. Tile p = (n, ty, tx) covers input
rows 2*ty - ph .. 2*ty - ph + 3 (0 outside x: padding) and output rows 2*ty, 2*ty + 1.
"""

from numba import cuda, float32, int64, uint32

from .bounds import inlined
from .common import EPI_BIAS, clip, relu_floor


@inlined
def _bt(d0, d1, d2, d3):
    """B^T applied to a 4-vector."""
    return d0 - d2, d1 + d2, d2 - d1, d1 - d3


@inlined
def _g(g0, g1, g2):
    """G applied to a 3-vector."""
    return g0, (g0 + g1 + g2) * float32(0.5), (g0 - g1 + g2) * float32(0.5), g2


@inlined
def _at(m0, m1, m2, m3):
    """A^T applied to a 4-vector."""
    return m0 + m1 + m2, m1 - m2 - m3


@inlined
def _a(e0, e1):
    """A applied to a 2-vector."""
    return e0, e0 + e1, e0 - e1, -e1


@inlined
def _gt(u0, u1, u2, u3):
    """G^T applied to a 4-vector."""
    h = float32(0.5)
    return u0 + (u1 + u2) * h, (u1 - u2) * h, (u1 + u2) * h + u3


@inlined
def _tile(p, tiles, tw):
    """(image, the tile's first row, its first column) of tile column p (uint32): tiles are
    2 rows and 2 columns apart."""
    p, tw = uint32(p), uint32(tw)
    n = uint32(p // uint32(tiles))
    t = uint32(p - n * uint32(tiles))
    ty = uint32(t // tw)
    return n, uint32(ty + ty), uint32(uint32(t - ty * tw) * uint32(2))


@inlined
def _out_tile(p, th, tw, oh, ow):
    """(image, the output rows and columns of tile p inside the output (>= 1; 2 unless the
    tile overhangs an odd side), the tile's first element's offset in its plane)."""
    n, y0, x0 = _tile(p, th * tw, tw)
    return n, uint32(oh) - y0, uint32(ow) - x0, uint32(y0 * uint32(ow) + x0)


@inlined
def _span(first, pad, size, at, scale, out):
    """at[i] = (first + i - pad) * scale for the 4 coordinates of a tile's span, ``out``
    where the coordinate falls outside [0, size) (unsigned: one compare for both sides)."""
    for i in range(4):
        v = uint32(int64(first) + i - pad)      # (negative: wraps past size)
        at[i] = uint32(v * uint32(scale)) if v < uint32(size) else uint32(out)


@cuda.jit(cache=True)
def winograd_filter_fwd_kernel(w, u, dims, scale, acc):
    """U[xi] = scale * G g G^T for every filter g = w[k, c] (3 x 3; reversed in both axes when
    ``flip``): U[xi, k, c], or U[xi, c, k] when ``transpose``. dims = (K, C, flip, transpose).
    Thread mapping: grid-stride loop, one (k, c) per thread; reads 9 words, writes 16 (each
    store coalesced across consecutive c; K apart when transposed: a small array)."""
    k_, c_, flip, transpose = dims
    zero = acc[0]
    t = cuda.local.array((4, 3), dtype=acc.dtype)
    g = cuda.local.array(3, dtype=acc.dtype)
    kc = k_ * c_
    for e in range(cuda.grid(1), kc, cuda.gridsize(1)):
        for s in range(3):          # columns of g: t = G g
            for r in range(3):
                i = 3 * r + s
                g[r] = w[e * 9 + (8 - i if flip else i)] + zero
            t[0, s], t[1, s], t[2, s], t[3, s] = _g(g[0], g[1], g[2])
        dst = (e % c_) * k_ + e // c_ if transpose else e
        for a in range(4):          # rows: (G g) G^T
            v0, v1, v2, v3 = _g(t[a, 0], t[a, 1], t[a, 2])
            u[(4 * a) * kc + dst] = v0 * scale
            u[(4 * a + 1) * kc + dst] = v1 * scale
            u[(4 * a + 2) * kc + dst] = v2 * scale
            u[(4 * a + 3) * kc + dst] = v3 * scale


@cuda.jit(cache=True)
def winograd_input_fwd_kernel(x, v, dims, scale, acc):
    """V[xi, c, p] = scale * (B^T d B)[xi] of input tile p of channel c; 0 for p in [P, ps).
    dims = (C, H, W, TH, TW, ph, pw, P, ps): TH x TW tiles per image. Thread mapping: the grid's
    x walks tiles p (consecutive threads on consecutive tiles: the 16 stores coalesced, the
    loads 2 words apart, each input word read by up to 4 tiles from cache), y the channels
    (both grid-stride); a thread decodes its tile once for all the channels it visits. Index
    arithmetic in 32 bits: the ops keep every chunk's arrays below 2**31 elements. Traffic: x
    read ~once from DRAM, V written once (4x x's size)."""
    c_, h_, w_, th, tw, ph, pw, p_, ps = dims
    zero = acc[0]
    d = cuda.local.array((4, 4), dtype=acc.dtype)
    rows = cuda.local.array(4, dtype=uint32)    # in-plane offsets of the tile's rows
    cols = cuda.local.array(4, dtype=uint32)
    plane, stride = uint32(h_ * w_), uint32(c_ * ps)
    for p in range(cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x, ps,
                   cuda.gridDim.x * cuda.blockDim.x):
        live = p < p_
        n, y0, x0 = _tile(p, th * tw, tw)
        _span(y0, ph, h_, rows, w_, plane)
        _span(x0, pw, w_, cols, 1, w_)
        for c in range(cuda.blockIdx.y, c_, cuda.gridDim.y):
            base = uint32(uint32(n * uint32(c_) + uint32(c)) * plane)
            for a in range(4):
                for b in range(4):
                    inside = live and rows[a] < plane and cols[b] < uint32(w_)
                    d[a, b] = x[uint32(base + rows[a] + cols[b])] + zero if inside else zero
            for b in range(4):
                d[0, b], d[1, b], d[2, b], d[3, b] = _bt(d[0, b], d[1, b], d[2, b], d[3, b])
            for a in range(4):
                d[a, 0], d[a, 1], d[a, 2], d[a, 3] = _bt(d[a, 0], d[a, 1], d[a, 2], d[a, 3])
            at = uint32(uint32(c) * uint32(ps) + uint32(p))
            for i in range(16):
                v[uint32(at + uint32(i) * stride)] = d[i // 4, i % 4] * scale


@cuda.jit(cache=True)
def winograd_output_fwd_kernel(m, y, bias, dims, epi, unscale, acc):
    """y's 2x2 tile p of channel k = A^T (unscale M[., k, p]) A (+ bias[k], then relu, as
    ``epi`` says: kernels/common.py's EPILOGUE); the tile's rows
    and columns past the output (OH, OW odd) are not written. dims = (K, OH, OW, TH, TW, P,
    ps). Thread mapping: x walks tiles (the 16 loads coalesced), y the channels (grid-stride),
    the tile decoded once; 32-bit indices (winograd_input_fwd_kernel). Traffic: M read once,
    y written once."""
    k_, oh, ow, th, tw, p_, ps = dims
    zero = acc[0]
    lo = relu_floor(epi, zero)
    t = cuda.local.array((4, 4), dtype=acc.dtype)
    plane, stride = uint32(oh * ow), uint32(k_ * ps)
    for p in range(cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x, p_,
                   cuda.gridDim.x * cuda.blockDim.x):
        n, rows, cols, corner = _out_tile(p, th, tw, oh, ow)
        for k in range(cuda.blockIdx.y, k_, cuda.gridDim.y):
            at = uint32(uint32(k) * uint32(ps) + uint32(p))
            for i in range(16):
                t[i // 4, i % 4] = m[uint32(at + uint32(i) * stride)] * unscale
            for b in range(4):
                t[0, b], t[1, b] = _at(t[0, b], t[1, b], t[2, b], t[3, b])
            for a in range(2):
                t[a, 0], t[a, 1] = _at(t[a, 0], t[a, 1], t[a, 2], t[a, 3])
            add = bias[k] + zero if epi & EPI_BIAS else zero
            base = uint32(uint32(n * uint32(k_) + uint32(k)) * plane + corner)
            for a in range(2):
                for b in range(2):
                    if uint32(a) < rows and uint32(b) < cols:
                        y[uint32(base + uint32(a) * uint32(ow) + uint32(b))] = clip(
                            t[a, b] + add, lo)


@cuda.jit(cache=True)
def winograd_grad_bwd_kernel(dy, dm, dims, scale, acc):
    """dM[xi, k, p] = scale * (A e A^T)[xi] for the 2x2 tile e of dy at tile p of channel k (0 where
    the tile overhangs the output, and for p in [P, ps)). dims = (K, OH, OW, TH, TW, P, ps).
    Thread mapping, 32-bit indices and traffic as winograd_input_fwd_kernel's (dy read once,
    dM written once)."""
    k_, oh, ow, th, tw, p_, ps = dims
    zero = acc[0]
    t = cuda.local.array((4, 4), dtype=acc.dtype)
    plane, stride = uint32(oh * ow), uint32(k_ * ps)
    for p in range(cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x, ps,
                   cuda.gridDim.x * cuda.blockDim.x):
        live = p < p_
        n, rows, cols, corner = _out_tile(p, th, tw, oh, ow)
        for k in range(cuda.blockIdx.y, k_, cuda.gridDim.y):
            base = uint32(uint32(n * uint32(k_) + uint32(k)) * plane + corner)
            for a in range(2):
                for b in range(2):
                    inside = live and uint32(a) < rows and uint32(b) < cols
                    t[a, b] = dy[uint32(base + uint32(a) * uint32(ow) + uint32(b))] + zero \
                        if inside else zero
            for b in range(2):
                t[0, b], t[1, b], t[2, b], t[3, b] = _a(t[0, b], t[1, b])
            for a in range(4):
                t[a, 0], t[a, 1], t[a, 2], t[a, 3] = _a(t[a, 0], t[a, 1])
            at = uint32(uint32(k) * uint32(ps) + uint32(p))
            for i in range(16):
                dm[uint32(at + uint32(i) * stride)] = t[i // 4, i % 4] * scale


@cuda.jit(cache=True)
def winograd_filter_bwd_kernel(du, dw, dims, unscale, acc):
    """dw[k, c] = G^T dU G, dU[xi] = unscale x the sum of the ``parts`` partial sums
    du[part, xi, k, c] (added in a fixed order: deterministic); reversed in both axes when
    ``flip``.
    dims = (K, C, flip, parts). Thread mapping: grid-stride loop, one (k, c) per thread (the
    loads coalesced across c). Traffic: du read once, dw written once."""
    k_, c_, flip, parts = dims
    zero = acc[0]
    t = cuda.local.array((4, 4), dtype=acc.dtype)
    kc = k_ * c_
    for e in range(cuda.grid(1), kc, cuda.gridsize(1)):
        for i in range(16):
            total = zero
            for q in range(parts):
                total += du[(q * 16 + i) * kc + e]
            t[i // 4, i % 4] = total * unscale
        for b in range(4):
            t[0, b], t[1, b], t[2, b] = _gt(t[0, b], t[1, b], t[2, b], t[3, b])
        for a in range(3):
            t[a, 0], t[a, 1], t[a, 2] = _gt(t[a, 0], t[a, 1], t[a, 2], t[a, 3])
        for r in range(3):
            for s in range(3):
                i = 3 * r + s
                dw[e * 9 + (8 - i if flip else i)] = t[r, s]


def SIGNATURES(t, acc):
    from numba import int64
    from numba.core.types import UniTuple
    a, z = t[::1], acc[::1]
    return {
        # U, V and dM in the data type (the products' operands), M and dU in acc's
        "winograd_filter_fwd_kernel": (a, a, UniTuple(int64, 4), acc, z),
        "winograd_input_fwd_kernel": (a, a, UniTuple(int64, 9), acc, z),
        "winograd_output_fwd_kernel": (z, a, a, UniTuple(int64, 7), int64, acc, z),
        "winograd_grad_bwd_kernel": (a, a, UniTuple(int64, 7), acc, z),
        "winograd_filter_bwd_kernel": (z, a, UniTuple(int64, 4), acc, z),
    }


# 32-bit index arithmetic on purpose (the ops keep each chunk's arrays below 2**31 elements)
INDEX32 = ("winograd_input_fwd_kernel", "winograd_output_fwd_kernel",
           "winograd_grad_bwd_kernel")
