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

from numba import cuda, int64

from .bounds import bounded_jit, inlined
from .common import REDUCE_SUM, block_reduce


@inlined
def _tap(o, stride, k, ksize, dil, pad, flip):
    """Input coordinate read by output coordinate o through kernel tap k."""
    return o * stride + ((ksize - 1 - k) if flip else k) * dil - pad


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
                iz = _tap(zo, sd, t, t_, dd, pd, flip)
                for r in range(r_):
                    iy = _tap(yo, sh, r, r_, dh, ph, flip)
                    row = src + (iz * h_ + iy) * w_
                    ok = 0 <= iz < d_ and 0 <= iy < h_
                    # three taps' loads before their stores: the compiler cannot move a load
                    # above a store to col (it may alias x), so one tap at a time waited for
                    # each load in turn
                    for s in range(0, s_, 3):
                        ix0 = _tap(xo, sw, s, s_, dw, pw, flip)
                        ix1 = _tap(xo, sw, s + 1, s_, dw, pw, flip)
                        ix2 = _tap(xo, sw, s + 2, s_, dw, pw, flip)
                        v0 = x[row + ix0] if ok and 0 <= ix0 < w_ else zero
                        v1 = x[row + ix1] if ok and s + 1 < s_ and 0 <= ix1 < w_ else zero
                        v2 = x[row + ix2] if ok and s + 2 < s_ and 0 <= ix2 < w_ else zero
                        col[dst] = v0
                        if s + 1 < s_:
                            col[dst + ncol] = v1
                        if s + 2 < s_:
                            col[dst + 2 * ncol] = v2
                        dst += min(3, s_ - s) * ncol


@inlined
def _taps(i, pad, ksize, dil, stride, osize, flip, q):
    """The taps of one axis that read input coordinate i, in increasing tap order: (first
    tap, its output coordinate, output step, count; the tap step is q = ``_period``). Before
    the flip, tap k' reads i where i + pad - k'*dil = o*stride with 0 <= o < osize: one residue
    class of k' modulo q = stride / gcd(dil, stride), o falling by dil*q/stride per step. So a
    thread divides per axis, not per tap and channel (col2im was bound by a 64-bit remainder
    and quotient per tap); an undilated stride-1 axis divides nothing."""
    base = i + pad
    k0 = -1
    for k in range(min(ksize, q)):          # the residue class's first tap, if any
        rem = base - k * dil
        if rem >= 0 and (stride == 1 or rem % stride == 0):
            k0 = k
            break
    if k0 < 0:
        return 0, 0, 0, 0
    if stride == 1 and dil == 1:
        o0, do, hi = base, 1, min(ksize, base + 1)
    else:
        o0 = (base - k0 * dil) // stride
        do = q * dil // stride
        hi = min((ksize - k0 + q - 1) // q, o0 // do + 1)
    lo = 0 if o0 < osize else (o0 - osize + do) // do      # steps until o < osize
    if hi <= lo:
        return 0, 0, 0, 0
    if flip:        # tap ksize-1-k': increasing taps are decreasing steps, o rising
        return ksize - 1 - (k0 + (hi - 1) * q), o0 - (hi - 1) * do, do, hi - lo
    return k0 + lo * q, o0 - lo * do, -do, hi - lo


@inlined
def _period(dil, stride):
    """stride / gcd(dil, stride): the tap period of col2im's valid taps on an axis."""
    a, b = dil, stride
    while b != 0:
        a, b = b, a % b
    return stride // a


def conv_col2im_bwd_kernel(dcol, dx, geo, nc, acc):
    """dx (the chunk's nc images, flat) from dcol (C*T*R*S, nc*O), in gather form:
    dx[n, c, i] = sum over taps (t, r, s) and outputs o with o*stride + t'*dil - pad = i of
    dcol[(c,t,r,s), (n,o)]. Thread mapping: x threads walk the chunk's nc*DHW (image, input
    position) pairs (grid-stride), the grid's y dimension the channels (grid-stride); a thread
    decodes its pair and the valid taps of each axis (``_taps``) once and reuses them for
    every channel it visits, which then visit only valid taps, with no division. Consecutive
    threads on consecutive x positions (coalesced writes); each element sums its taps in
    increasing (t, r, s) order: deterministic, no atomics. Traffic: dcol read once, dx
    written once."""
    c_, d_, h_, w_, t_, r_, s_, od_, oh_, ow_, sd, sh, sw, pd, ph, pw, dd, dh, dw, flip = geo
    zero = acc[0]
    dhw, o_ = d_ * h_ * w_, od_ * oh_ * ow_
    ncol, taps = nc * o_, t_ * r_ * s_
    qt, qr, qs = _period(dd, sd), _period(dh, sh), _period(dw, sw)
    for j in range(cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x, nc * dhw,
                   cuda.gridDim.x * cuda.blockDim.x):
        n, p = j // dhw, j % dhw
        iz, iy, ix = p // (h_ * w_), (p // w_) % h_, p % w_
        t0, z0, zs, ct = _taps(iz, pd, t_, dd, sd, od_, flip, qt)
        r0, y0, ys, cr = _taps(iy, ph, r_, dh, sh, oh_, flip, qr)
        s0, x0, xs, cs = _taps(ix, pw, s_, dw, sw, ow_, flip, qs)
        for c in range(cuda.blockIdx.y, c_, cuda.gridDim.y):
            base = c * taps * ncol + n * o_          # row (c, 0, 0, 0), column (n, 0)
            total = zero
            for a in range(ct):
                t, zo = t0 + a * qt, z0 + a * zs
                for b in range(cr):
                    r, yo = r0 + b * qr, y0 + b * ys
                    row = (t * r_ + r) * s_ + s0
                    col = (zo * oh_ + yo) * ow_ + x0
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
def conv_partsum_fwd_kernel(ws, out, parts, size, bias, per, k, acc):
    """out[i] = sum_{p < parts} ws[p*size + i] (+ bias[(i // per) % k] when per > 0): the
    partial sums of a split GEMM added in a fixed order (deterministic) and cast to out's
    type. Serves the split-k forward (y with its bias; y flat (n, k, per)) and the split-batch
    filter gradient (dw, per = 0). Thread mapping: grid-stride loop, one element per thread,
    coalesced. Traffic: ws read once, out written once (bias from cache)."""
    zero = acc[0]
    for i in range(cuda.grid(1), size, cuda.gridsize(1)):
        total = zero
        for p in range(parts):
            total += ws[p * size + i]
        if per > 0:
            total += bias[(i // per) % k] + zero
        out[i] = total


# ---------------------------------------------------------------- depthwise (groups = C)
# One input channel per filter: filter k reads channel k // mult (K = mult * C). Direct
# kernels, memory-bound: a GEMM per group would have one row. Each thread works on DW_IMAGES
# images at once for the same filter and position: their loads are independent (a thread on
# one image waited for each tap's load in turn, ~0.16 ms for 16 x 256 x 28^2 on an H100),
# and the tap's weight and index arithmetic serve all of them.

DW_TAPS = 32            # taps per filter-gradient block (its shared partial sums)
DW_IMAGES = 4           # images per thread


@inlined
def _span(o, stride, pad, dil, ksize, size):
    """(the input coordinate of tap 0, [lo, hi) of the taps k with o*stride - pad + k*dil in
    [0, size)) on one axis of the forward; an undilated axis divides nothing."""
    i0 = o * stride - pad
    if dil == 1:
        lo, hi = max(0, -i0), min(ksize, size - i0)
    else:
        lo = (dil - 1 - i0) // dil if i0 < 0 else 0
        hi = min(ksize, (size - i0 + dil - 1) // dil)
    return i0, lo, max(lo, hi)


@inlined
def _images(q, groups, n_, per_image):
    """(group index, first image, how many of the group's DW_IMAGES images exist, the offsets
    of images 1, 2 and 3) of pair q: an image past the batch repeats the first one's offset
    (its loads stay in bounds; nothing is stored for it)."""
    g = q // groups
    n0 = g * DW_IMAGES
    return g, n0, min(DW_IMAGES, n_ - n0), (per_image if n0 + 1 < n_ else 0), \
        (2 * per_image if n0 + 2 < n_ else 0), (3 * per_image if n0 + 3 < n_ else 0)


def conv_depthwise_fwd_kernel(x, w, y, bias, geo, n_, mult, use_bias, acc):
    """y[n, k, o] = sum over taps of x[n, k // mult, o*stride - pad + tap'*dil] w[k, tap]
    (+ bias[k]); tap' the tap reversed in every axis for a true convolution (flip): the flat
    tap index T*R*S - 1 - tap. Thread mapping: x threads walk the output plane's OD*OH*OW
    positions (grid-stride), each decoding its position and the in-bounds tap range of every
    axis once; the grid's y the (image group, filter) pairs, DW_IMAGES images a thread
    (grid-stride). Consecutive threads on consecutive outputs: coalesced stores and loads
    (stride 1). Traffic: x read about once (the taps' overlap from cache), y written once,
    w from cache."""
    c_, d_, h_, w_, t_, r_, s_, od_, oh_, ow_, sd, sh, sw, pd, ph, pw, dd, dh, dw, flip = geo
    zero = acc[0]
    hw, o_, taps, k_ = h_ * w_, od_ * oh_ * ow_, t_ * r_ * s_, c_ * mult
    img = c_ * d_ * hw
    quads = -(-n_ // DW_IMAGES) * k_
    for p in range(cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x, o_,
                   cuda.gridDim.x * cuda.blockDim.x):
        oz, oy, ox = p // (oh_ * ow_), (p // ow_) % oh_, p % ow_
        z0, tlo, thi = _span(oz, sd, pd, dd, t_, d_)
        y0, rlo, rhi = _span(oy, sh, ph, dh, r_, h_)
        x0, slo, shi = _span(ox, sw, pw, dw, s_, w_)
        for q in range(cuda.blockIdx.y, quads, cuda.gridDim.y):
            g, n0, nv, i1, i2, i3 = _images(q, k_, n_, img)
            k = q - g * k_
            xb, wb = (n0 * c_ + k // mult) * d_ * hw + x0, k * taps
            a0 = a1 = a2 = a3 = zero
            for t in range(tlo, thi):
                for r in range(rlo, rhi):
                    row = xb + (z0 + t * dd) * hw + (y0 + r * dh) * w_
                    tap = (t * r_ + r) * s_
                    for s in range(slo, shi):
                        wv = w[wb + (taps - 1 - tap - s if flip else tap + s)] + zero
                        e = row + s * dw
                        a0 += (x[e] + zero) * wv
                        a1 += (x[e + i1] + zero) * wv
                        a2 += (x[e + i2] + zero) * wv
                        a3 += (x[e + i3] + zero) * wv
            add = bias[k] + zero if use_bias else zero
            at = (n0 * k_ + k) * o_ + p
            y[at] = a0 + add
            if nv > 1:
                y[at + k_ * o_] = a1 + add
            if nv > 2:
                y[at + 2 * k_ * o_] = a2 + add
            if nv > 3:
                y[at + 3 * k_ * o_] = a3 + add


def conv_depthwise_bwd_data_kernel(dy, w, dx, geo, n_, mult, acc):
    """dx[n, c, i] = sum over the filters k = c*mult + j, taps and outputs o with
    o*stride - pad + tap'*dil = i of dy[n, k, o] w[k, tap] (col2im's gather with the
    column matrix's products done in place). Thread mapping: x threads walk the input plane's
    D*H*W positions, each finding its valid taps per axis once (``_taps``); the grid's y the
    (image group, channel) pairs, DW_IMAGES images a thread (grid-stride). Traffic: dy read
    about once per filter of the channel (the taps' overlap from cache), dx written once."""
    c_, d_, h_, w_, t_, r_, s_, od_, oh_, ow_, sd, sh, sw, pd, ph, pw, dd, dh, dw, flip = geo
    zero = acc[0]
    dhw, o_, taps, k_ = d_ * h_ * w_, od_ * oh_ * ow_, t_ * r_ * s_, c_ * mult
    quads = -(-n_ // DW_IMAGES) * c_
    qt, qr, qs = _period(dd, sd), _period(dh, sh), _period(dw, sw)
    for p in range(cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x, dhw,
                   cuda.gridDim.x * cuda.blockDim.x):
        iz, iy, ix = p // (h_ * w_), (p // w_) % h_, p % w_
        t0, z0, zs, ct = _taps(iz, pd, t_, dd, sd, od_, flip, qt)
        r0, y0, ys, cr = _taps(iy, ph, r_, dh, sh, oh_, flip, qr)
        s0, x0, xs, cs = _taps(ix, pw, s_, dw, sw, ow_, flip, qs)
        for q in range(cuda.blockIdx.y, quads, cuda.gridDim.y):
            g, n0, nv, i1, i2, i3 = _images(q, c_, n_, k_ * o_)
            c = q - g * c_
            a0 = a1 = a2 = a3 = zero
            for j in range(mult):
                k = c * mult + j
                dyb, wb = (n0 * k_ + k) * o_ + x0, k * taps + s0
                for a in range(ct):
                    t, zo = t0 + a * qt, z0 + a * zs
                    for b in range(cr):
                        r, yo = r0 + b * qr, y0 + b * ys
                        row, wrow = dyb + (zo * oh_ + yo) * ow_, wb + (t * r_ + r) * s_
                        for f in range(cs):
                            wv = w[wrow + f * qs] + zero
                            e = row + f * xs
                            a0 += (dy[e] + zero) * wv
                            a1 += (dy[e + i1] + zero) * wv
                            a2 += (dy[e + i2] + zero) * wv
                            a3 += (dy[e + i3] + zero) * wv
            at = (n0 * c_ + c) * dhw + p
            dx[at] = a0
            if nv > 1:
                dx[at + c_ * dhw] = a1
            if nv > 2:
                dx[at + 2 * c_ * dhw] = a2
            if nv > 3:
                dx[at + 3 * c_ * dhw] = a3


# At most 128 registers (two blocks of 256 per SM): unbounded, ptxas took 128-163, and the
# bounded kernels ran 0.70-0.94x their time on an H100 (validation/notes/conv-numba.md).
conv_depthwise_fwd_kernel = bounded_jit(conv_depthwise_fwd_kernel, 256, 2)
conv_depthwise_bwd_data_kernel = bounded_jit(conv_depthwise_bwd_data_kernel, 256, 2)


@cuda.jit(cache=True)
def conv_depthwise_bwd_filter_kernel(x, dy, ws, geo, n_, mult, per_part, per_pos, acc):
    """ws[part, k, tap] = sum over images n of image slice i (per_part images each, a
    multiple of DW_IMAGES) and outputs o of position slice j (per_pos positions each) of
    dy[n, k, o] x[n, k // mult, o*stride - pad + tap'*dil], part = i * (position slices) +
    j, for the DW_TAPS taps from blockIdx.z * DW_TAPS; the parts are summed afterwards in a
    fixed order (conv_partsum_fwd_kernel). Position slices give a small batch (or few filters)
    enough blocks to fill the GPU. Thread mapping: blocks over (k, part, tap chunk),
    grid-stride over k; threads walk the part's output positions,
    DW_IMAGES images at a time, loading their dy once for all the chunk's taps and adding
    each tap's products into the thread's own column of shared partial sums (dynamic shared
    memory, DW_TAPS x blockDim.x), which one thread per tap then sums in a fixed order:
    deterministic, no atomics. The taps' (flipped, dilated) offsets are tabled in shared
    memory once per block. Traffic: dy read once per tap chunk, x about once (from cache)."""
    c_, d_, h_, w_, t_, r_, s_, od_, oh_, ow_, sd, sh, sw, pd, ph, pw, dd, dh, dw, flip = geo
    part = cuda.shared.array(0, dtype=acc.dtype)
    offs = cuda.shared.array((3, DW_TAPS), dtype=int64)
    zero = acc[0]
    hw, o_, taps, k_ = h_ * w_, od_ * oh_ * ow_, t_ * r_ * s_, c_ * mult
    img = c_ * d_ * hw
    tid, nt = cuda.threadIdx.x, cuda.blockDim.x
    tap0 = cuda.blockIdx.z * DW_TAPS
    tc = min(DW_TAPS, taps - tap0)
    for j in range(tid, tc, nt):    # each tap's input offset from the output's corner
        tap = tap0 + j
        t, r, s = tap // (r_ * s_), (tap // s_) % r_, tap % s_
        offs[0, j] = _tap(0, sd, t, t_, dd, 0, flip)
        offs[1, j] = _tap(0, sh, r, r_, dh, 0, flip)
        offs[2, j] = _tap(0, sw, s, s_, dw, 0, flip)
    pos_parts = -(-o_ // per_pos)
    ip = cuda.blockIdx.y // pos_parts
    p_lo = (cuda.blockIdx.y - ip * pos_parts) * per_pos
    p_hi = min(o_, p_lo + per_pos)
    n_lo = ip * per_part
    n_hi = min(n_, n_lo + per_part)
    ko = k_ * o_                        # dy's image stride
    for k in range(cuda.blockIdx.x, k_, cuda.gridDim.x):
        cuda.syncthreads()          # the offsets tabled; the last k's sums read
        for j in range(tc):         # each thread adds into its own column only
            part[j * nt + tid] = zero
        for n0 in range(n_lo, n_hi, DW_IMAGES):
            xb, dyb = (n0 * c_ + k // mult) * d_ * hw, (n0 * k_ + k) * o_
            nv = min(DW_IMAGES, n_hi - n0)          # the images of this group in the slice
            for p in range(p_lo + tid, p_hi, nt):
                oz, oy, ox = p // (oh_ * ow_), (p // ow_) % oh_, p % ow_
                z0, y0, x0 = oz * sd - pd, oy * sh - ph, ox * sw - pw
                g0 = dy[dyb + p] + zero
                g1 = dy[dyb + p + ko] + zero if nv > 1 else zero
                g2 = dy[dyb + p + 2 * ko] + zero if nv > 2 else zero
                g3 = dy[dyb + p + 3 * ko] + zero if nv > 3 else zero
                for j in range(tc):
                    iz, iy, ix = z0 + offs[0, j], y0 + offs[1, j], x0 + offs[2, j]
                    if 0 <= iz < d_ and 0 <= iy < h_ and 0 <= ix < w_:
                        e = xb + iz * hw + iy * w_ + ix
                        v = g0 * (x[e] + zero)
                        if nv > 1:      # (uniform over the block)
                            v += g1 * (x[e + img] + zero)
                        if nv > 2:
                            v += g2 * (x[e + 2 * img] + zero)
                        if nv > 3:
                            v += g3 * (x[e + 3 * img] + zero)
                        part[j * nt + tid] += v
        cuda.syncthreads()
        for j in range(tid, tc, nt):
            total = zero
            for i in range(nt):
                total += part[j * nt + i]
            ws[(cuda.blockIdx.y * k_ + k) * taps + tap0 + j] = total


def SIGNATURES(t, acc):
    from numba import int64
    from numba.core.types import UniTuple
    a, z = t[::1], acc[::1]
    geo = UniTuple(int64, 20)                     # the geometry tuple
    return {
        "conv_im2col_fwd_kernel": (a, a, geo, int64, z),
        "conv_col2im_bwd_kernel": (z, a, geo, int64, z),
        "conv_bias_bwd_kernel": (a, a, int64, int64, int64, z),
        "conv_partsum_fwd_kernel": (z, a, int64, int64, a, int64, int64, z),
        "conv_depthwise_fwd_kernel": (a, a, a, a, geo, int64, int64, int64, z),
        "conv_depthwise_bwd_data_kernel": (a, a, a, geo, int64, int64, z),
        "conv_depthwise_bwd_filter_kernel": (a, a, z, geo, int64, int64, int64, int64, z),
    }
