"""Convolution (2-D as 3-D, and 3-D) by im2col + GEMM (kernels/gemm.py), with col2im for the
data gradient.

Layouts (dnnkit/geometry.py), C-contiguous and passed flat: x (N, C, D, H, W),
w (K, C/G, T, R, S), y (N, K, OD, OH, OW). A chunk of nc images goes through a column buffer
col (C*T*R*S rows, nc*O columns; O = OD*OH*OW), row (c, t, r, s), column (n, od, oh, ow):

    col[(c,t,r,s), (n,o)] = x[n, c, od*sd + t'*dd - pd, oh*sh + r'*dh - ph, ow*sw + s'*dw - pw]

(0 outside x), with (t', r', s') = (T-1-t, R-1-r, S-1-s) for a true convolution (flip) and
(t, r, s) otherwise. Group g owns the rows of its Cg channels and filters g*Kg.., so per group

    forward          y_g[n]   = W_g col_g[n]            (Kg x CgTRS) . (CgTRS x O)
    data gradient    dcol_g[n] = W_g^T dy_g[n];   dx = col2im(dcol)
    filter gradient  dW_g     = sum_n dy_g[n] col_g[n]^T

``geo`` packs the geometry as 20 int64:
(C, D, H, W, T, R, S, OD, OH, OW, sd, sh, sw, pd, ph, pw, dd, dh, dw, flip).
"""

from numba import cuda

from .bounds import bounded_jit
from .common import (EPI_BIAS, REDUCE_SUM, axis_tap, axis_taps, block_reduce, clip, relu_floor,
                     tap_period, tap_rows)


@cuda.jit(cache=True)
def conv_im2col_fwd_kernel(x, col, geo, nc, acc):
    """col (C*T*R*S, nc*O) from the nc images of x (x flat from the chunk's first image).
    Thread mapping: x threads walk the chunk's nc*O columns j = (image, output position)
    (grid-stride), the grid's y dimension walks the channels (grid-stride); a thread decodes
    its column (four divisions) once and reuses it for every channel it visits, writing the
    T*R*S taps of each. Consecutive threads write consecutive columns (coalesced, across
    images too: a small image's few positions no longer leave a block's threads idle) and read
    x at stride sw (coalesced for stride 1). Traffic: x read ~TRS/stride^3 times (mostly from
    cache), col written once."""
    c_, d_, h_, w_, t_, r_, s_, od_, oh_, ow_, sd, sh, sw, pd, ph, pw, dd, dh, dw, flip = geo
    zero = acc[0]
    o_, hw = od_ * oh_ * ow_, oh_ * ow_
    ncol, taps, dhw = nc * o_, t_ * r_ * s_, d_ * h_ * w_
    for j in range(cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x, ncol,
                   cuda.gridDim.x * cuda.blockDim.x):
        n, p = j // o_, j % o_
        zo, yo, xo = p // hw, (p % hw) // ow_, p % ow_
        for c in range(cuda.blockIdx.y, c_, cuda.gridDim.y):
            src = (n * c_ + c) * dhw
            dst = c * taps * ncol + j
            for t in range(t_):
                iz = axis_tap(zo, sd, t, t_, dd, pd, flip)
                for r in range(r_):
                    iy = axis_tap(yo, sh, r, r_, dh, ph, flip)
                    row = src + (iz * h_ + iy) * w_
                    ok = 0 <= iz < d_ and 0 <= iy < h_
                    # three taps' loads before their stores: the compiler cannot move a load
                    # above a store to col (it may alias x), so one tap at a time waited for
                    # each load in turn
                    for s in range(0, s_, 3):
                        ix0 = axis_tap(xo, sw, s, s_, dw, pw, flip)
                        ix1 = axis_tap(xo, sw, s + 1, s_, dw, pw, flip)
                        ix2 = axis_tap(xo, sw, s + 2, s_, dw, pw, flip)
                        v0 = x[row + ix0] if ok and 0 <= ix0 < w_ else zero
                        v1 = x[row + ix1] if ok and s + 1 < s_ and 0 <= ix1 < w_ else zero
                        v2 = x[row + ix2] if ok and s + 2 < s_ and 0 <= ix2 < w_ else zero
                        col[dst] = v0
                        if s + 1 < s_:
                            col[dst + ncol] = v1
                        if s + 2 < s_:
                            col[dst + 2 * ncol] = v2
                        dst += min(3, s_ - s) * ncol


def conv_col2im_bwd_kernel(dcol, dx, geo, nc, acc):
    """dx (the chunk's nc images, flat) from dcol (C*T*R*S, nc*O), in gather form:
    dx[n, c, i] = sum over taps (t, r, s) and outputs o with o*stride + t'*dil - pad = i of
    dcol[(c,t,r,s), (n,o)]. Thread mapping: x threads walk the chunk's nc*DHW (image, input
    position) pairs (grid-stride), the grid's y dimension the channels (grid-stride); a thread
    decodes its pair and the valid taps of each axis (``axis_taps``) once and reuses them for
    every channel it visits, which then visit only valid taps, with no division. Consecutive
    threads on consecutive x positions (coalesced writes); each element sums its taps in
    increasing (t, r, s) order: deterministic, no atomics. Traffic: dcol read once, dx
    written once."""
    c_, d_, h_, w_, t_, r_, s_, od_, oh_, ow_, sd, sh, sw, pd, ph, pw, dd, dh, dw, flip = geo
    zero = acc[0]
    dhw, o_ = d_ * h_ * w_, od_ * oh_ * ow_
    ncol, taps = nc * o_, t_ * r_ * s_
    qt, qr, qs = tap_period(dd, sd), tap_period(dh, sh), tap_period(dw, sw)
    for j in range(cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x, nc * dhw,
                   cuda.gridDim.x * cuda.blockDim.x):
        n, p = j // dhw, j % dhw
        iz, iy, ix = p // (h_ * w_), (p // w_) % h_, p % w_
        t0, z0, zs, ct = axis_taps(iz, pd, t_, dd, sd, od_, flip, qt)
        r0, y0, ys, cr = axis_taps(iy, ph, r_, dh, sh, oh_, flip, qr)
        s0, x0, xs, cs = axis_taps(ix, pw, s_, dw, sw, ow_, flip, qs)
        for c in range(cuda.blockIdx.y, c_, cuda.gridDim.y):
            base = c * taps * ncol + n * o_          # row (c, 0, 0, 0), column (n, 0)
            total = zero
            for a in range(ct):
                for b in range(cr):
                    orow, krow = tap_rows(a, b, (t0, z0, zs, qt), (r0, y0, ys, qr), oh_, ow_,
                                          r_, s_)
                    row, col = krow + s0, orow + x0
                    for e in range(cs):
                        total += dcol[base + (row + e * qs) * ncol + col + e * xs] + zero
            dx[(n * c_ + c) * dhw + p] = total


# 80 registers (three blocks of 256 per SM): unbounded, the per-axis taps took 124 and the
# stride-1 layers ran 4-36% slower than the per-tap kernel before them; bounded, 0.85-1.23x
# its time at stride 1 and 1.3-4.2x faster at stride 2 (H100, validation/notes/conv-numba.md)
conv_col2im_bwd_kernel = bounded_jit(conv_col2im_bwd_kernel, 256, 3)


@cuda.jit(cache=True)
def conv_bias_bwd_kernel(dy, db, n, k, s, acc):
    """db[ch] = sum over n and s of dy[n, ch, s] (dy flat (n, k, s)). Thread mapping: a block
    of (1, by) threads per channel (grid-stride over channels); its threads stride over the
    n*s elements, consecutive threads on consecutive positions (coalesced), then a
    shared-memory tree of by (a power of two) entries: a fixed order, deterministic.
    Traffic: dy read once."""
    red = cuda.shared.array(0, dtype=acc.dtype)   # by elements, sized at launch
    zero = acc[0]
    tid, nt = cuda.threadIdx.y, cuda.blockDim.y
    for ch in range(cuda.blockIdx.x, k, cuda.gridDim.x):
        part = zero
        for e in range(tid, n * s, nt):
            part += dy[((e // s) * k + ch) * s + e % s] + zero
        total = block_reduce(red, part, REDUCE_SUM)
        if tid == 0:
            db[ch] = total


@cuda.jit(cache=True)
def conv_partsum_fwd_kernel(ws, out, parts, size, bias, per, k, epi, acc):
    """out[i] = sum_{p < parts} ws[p*size + i] (+ bias[(i // per) % k], then relu, as ``epi``
    says: kernels/common.py's EPILOGUE): the partial sums of a split GEMM added in a fixed order
    (deterministic) and cast to out's type. Serves the split-k forward (y with its bias and
    activation; y flat (n, k, per)) and the split-batch filter gradient (dw, epi = 0). Thread
    mapping: grid-stride loop, one element per thread, coalesced. Traffic: ws read once, out
    written once (bias from cache)."""
    zero = acc[0]
    lo = relu_floor(epi, zero)
    for i in range(cuda.grid(1), size, cuda.gridsize(1)):
        total = zero
        for p in range(parts):
            total += ws[p * size + i]
        if epi & EPI_BIAS:
            total += bias[(i // per) % k] + zero
        out[i] = clip(total, lo)


def SIGNATURES(t, acc):
    from numba import int64
    from numba.core.types import UniTuple
    a, z = t[::1], acc[::1]
    geo = UniTuple(int64, 20)                     # the geometry tuple
    return {
        "conv_im2col_fwd_kernel": (a, a, geo, int64, z),
        "conv_col2im_bwd_kernel": (z, a, geo, int64, z),
        "conv_bias_bwd_kernel": (a, a, int64, int64, int64, z),
        "conv_partsum_fwd_kernel": (z, a, int64, int64, a, int64, int64, int64, z),
    }
