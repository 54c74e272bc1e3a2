"""Direct convolution kernels (no column buffer, no GEMM) for convolutions whose groups have
few channels, where a GEMM per group would run nearly empty tiles behind a column buffer
T*R*S times the input: depthwise convolutions (one input channel per group: every pass) and
convolutions with a few channels per group, grouped (ResNeXt's 4-16) or not (a first layer's
3): their forward and data gradient.

Layouts and ``geo`` as kernels/conv.py's: x (N, C, D, H, W), w (K, C/G, T, R, S), y (N, K, OD,
OH, OW), C-contiguous and passed flat; ``geo`` = (C, D, H, W, T, R, S, OD, OH, OW, sd, sh, sw,
pd, ph, pw, dd, dh, dw, flip). A tap t of an axis reads input coordinate o*stride - pad +
t'*dil for output coordinate o, t' = ksize - 1 - t for a true convolution (flip), t otherwise.
"""

from numba import cuda, int64, uint64

from .bounds import bounded_jit, inlined
from .common import EPI_BIAS, axis_tap, axis_taps, clip, relu_floor, tap_period, tap_rows


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


def conv_depthwise_fwd_kernel(x, w, y, bias, geo, n_, mult, epi, acc):
    """y[n, k, o] = sum over taps of x[n, k // mult, o*stride - pad + tap'*dil] w[k, tap] (+
    bias[k]), then relu, as ``epi`` says (kernels/common.py's EPILOGUE); tap' the tap reversed
    in every axis for a true convolution (flip): the flat tap index T*R*S - 1 - tap. Thread
    mapping: x threads walk the output plane's OD*OH*OW positions (grid-stride), each decoding
    its position and the in-bounds tap range of every axis once; the grid's y the (image group,
    filter) pairs, DW_IMAGES images a thread (grid-stride). Consecutive threads on consecutive
    outputs: coalesced stores and loads (stride 1). Traffic: x read about once (the taps'
    overlap from cache), y written once, w from cache."""
    c_, d_, h_, w_, t_, r_, s_, od_, oh_, ow_, sd, sh, sw, pd, ph, pw, dd, dh, dw, flip = geo
    zero = acc[0]
    lo = relu_floor(epi, zero)
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
            add = bias[k] + zero if epi & EPI_BIAS else zero
            at = (n0 * k_ + k) * o_ + p
            y[at] = clip(a0 + add, lo)
            if nv > 1:
                y[at + k_ * o_] = clip(a1 + add, lo)
            if nv > 2:
                y[at + 2 * k_ * o_] = clip(a2 + add, lo)
            if nv > 3:
                y[at + 3 * k_ * o_] = clip(a3 + add, lo)


def conv_depthwise_bwd_data_kernel(dy, w, dx, geo, n_, mult, acc):
    """dx[n, c, i] = sum over the filters k = c*mult + j, taps and outputs o with
    o*stride - pad + tap'*dil = i of dy[n, k, o] w[k, tap] (col2im's gather with the
    column matrix's products done in place). Thread mapping: x threads walk the input plane's
    D*H*W positions, each finding its valid taps per axis once (``axis_taps``); the grid's y the
    (image group, channel) pairs, DW_IMAGES images a thread (grid-stride). Traffic: dy read
    about once per filter of the channel (the taps' overlap from cache), dx written once."""
    c_, d_, h_, w_, t_, r_, s_, od_, oh_, ow_, sd, sh, sw, pd, ph, pw, dd, dh, dw, flip = geo
    zero = acc[0]
    dhw, o_, taps, k_ = d_ * h_ * w_, od_ * oh_ * ow_, t_ * r_ * s_, c_ * mult
    quads = -(-n_ // DW_IMAGES) * c_
    qt, qr, qs = tap_period(dd, sd), tap_period(dh, sh), tap_period(dw, sw)
    for p in range(cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x, dhw,
                   cuda.gridDim.x * cuda.blockDim.x):
        iz, iy, ix = p // (h_ * w_), (p // w_) % h_, p % w_
        t0, z0, zs, ct = axis_taps(iz, pd, t_, dd, sd, od_, flip, qt)
        r0, y0, ys, cr = axis_taps(iy, ph, r_, dh, sh, oh_, flip, qr)
        s0, x0, xs, cs = axis_taps(ix, pw, s_, dw, sw, ow_, flip, qs)
        for q in range(cuda.blockIdx.y, quads, cuda.gridDim.y):
            g, n0, nv, i1, i2, i3 = _images(q, c_, n_, k_ * o_)
            c = q - g * c_
            a0 = a1 = a2 = a3 = zero
            for j in range(mult):
                k = c * mult + j
                dyb, wb = (n0 * k_ + k) * o_ + x0, k * taps + s0
                # the tap rows inline: through common.tap_rows (as col2im and the direct data
                # gradient take them) the float16 kernel ran 1.03-1.04x the time (H100)
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
        offs[0, j] = axis_tap(0, sd, t, t_, dd, 0, flip)
        offs[1, j] = axis_tap(0, sh, r, r_, dh, 0, flip)
        offs[2, j] = axis_tap(0, sw, s, s_, dw, 0, flip)
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


# ---------------------------------------------------------------- few channels per group
# Group g owns channels g*cg.. and filters g*kg..; a thread holds a TILE x TILE block of sums:
# DW_IMAGES images by TILE filters (forward) or channels (data gradient) of one position, so
# each of its loads (four of x or dy, four of w) serves four multiply-adds: the direct sum's
# work in registers, where a GEMM per group would have cg or kg rows.
TILE = 4


@inlined
def _four(a, i, o1, o2, o3, zero):
    """a[i], a[i + o1], a[i + o2], a[i + o3] in the accumulation type (unsigned indices: no
    negative-index fix-up)."""
    return a[i] + zero, a[i + o1] + zero, a[i + o2] + zero, a[i + o3] + zero


@inlined
def _step(s, d, e, i1, i2, i3, w, u, u1, u2, u3, zero):
    """One step of the direct sum: s + the outer product of d's four images at e (offsets i1..
    i3) and w's four filters or channels at u (offsets u1..u3)."""
    w0, w1, w2, w3 = _four(w, u, u1, u2, u3, zero)
    d0, d1, d2, d3 = _four(d, e, i1, i2, i3, zero)
    return _outer(s, d0, d1, d2, d3, w0, w1, w2, w3)


@inlined
def _outer(s, d0, d1, d2, d3, w0, w1, w2, w3):
    """s (16 sums, image-major) + the outer product of (d0..d3) and (w0..w3)."""
    return (s[0] + d0 * w0, s[1] + d0 * w1, s[2] + d0 * w2, s[3] + d0 * w3,
            s[4] + d1 * w0, s[5] + d1 * w1, s[6] + d1 * w2, s[7] + d1 * w3,
            s[8] + d2 * w0, s[9] + d2 * w1, s[10] + d2 * w2, s[11] + d2 * w3,
            s[12] + d3 * w0, s[13] + d3 * w1, s[14] + d3 * w2, s[15] + d3 * w3)


@inlined
def _offsets(count, step):
    """The offsets (unsigned) of items 1, 2, 3 of a tile of ``count`` items ``step`` apart: an
    item past the count repeats item 0 (its loads stay in bounds; nothing is stored)."""
    return (uint64(step if count > 1 else 0), uint64(2 * step if count > 2 else 0),
            uint64(3 * step if count > 3 else 0))


@inlined
def _store4(out, e, step, cv, v0, v1, v2, v3):
    """v0..v3 to out[e], out[e + step], ... for the cv items that exist."""
    out[e] = v0
    if cv > 1:
        out[e + step] = v1
    if cv > 2:
        out[e + 2 * step] = v2
    if cv > 3:
        out[e + 3 * step] = v3


@inlined
def _store(out, at, image, step, nv, cv, s, add0, add1, add2, add3, lo):
    """The tile's sums s (+ add, then clipped at ``lo``: relu_floor) into out: image i, item
    j at at + i*image + j*step, for the nv images and cv items that exist (unrolled: a tuple
    indexed by a loop variable would go through local memory)."""
    _store4(out, at, step, cv, clip(s[0] + add0, lo), clip(s[1] + add1, lo),
            clip(s[2] + add2, lo), clip(s[3] + add3, lo))
    if nv > 1:
        _store4(out, at + image, step, cv, clip(s[4] + add0, lo),
                clip(s[5] + add1, lo), clip(s[6] + add2, lo),
                clip(s[7] + add3, lo))
    if nv > 2:
        _store4(out, at + 2 * image, step, cv, clip(s[8] + add0, lo),
                clip(s[9] + add1, lo), clip(s[10] + add2, lo),
                clip(s[11] + add3, lo))
    if nv > 3:
        _store4(out, at + 3 * image, step, cv, clip(s[12] + add0, lo),
                clip(s[13] + add1, lo), clip(s[14] + add2, lo),
                clip(s[15] + add3, lo))


@inlined
def _tile(q, tiles, per_group, groups, n_):
    """(group, first item of the group's tile, first image, images, items) of tile q: tiles
    run over (image group, group, tile of TILE items of the group's per_group)."""
    per_image = groups * tiles
    ig = q // per_image
    g = (q - ig * per_image) // tiles
    j0 = (q - ig * per_image - g * tiles) * TILE
    n0 = ig * DW_IMAGES
    return g, j0, n0, min(DW_IMAGES, n_ - n0), min(TILE, per_group - j0)


def conv_direct_fwd_kernel(x, w, y, bias, geo, n_, cg, kg, epi, acc):
    """y[n, k, o] = sum over the channels c < cg of k's group g and the taps of
    x[n, g*cg + c, o*stride - pad + tap'*dil] w[k, c, tap] (+ bias[k]), then relu, as ``epi``
    says (kernels/common.py's EPILOGUE). Thread mapping: one
    output position a thread (x), its in-bounds tap range per axis found once (``_span``);
    the grid's y the (image group, group, tile of TILE filters) tiles (grid-stride). The
    channel loop is innermost: each step moves x's and w's addresses by a constant. Traffic:
    x read about once per filter tile (the taps' overlap from cache), y written once."""
    c_, d_, h_, w_, t_, r_, s_, od_, oh_, ow_, sd, sh, sw, pd, ph, pw, dd, dh, dw, flip = geo
    zero = acc[0]
    hw, o_, taps = h_ * w_, od_ * oh_ * ow_, t_ * r_ * s_
    groups = c_ // cg
    tiles = -(-kg // TILE)
    quads = -(-n_ // DW_IMAGES) * groups * tiles
    p = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    if p >= o_:
        return
    oz, oy, ox = p // (oh_ * ow_), (p // ow_) % oh_, p % ow_
    z0, tlo, thi = _span(oz, sd, pd, dd, t_, d_)
    y0, rlo, rhi = _span(oy, sh, ph, dh, r_, h_)
    x0, slo, shi = _span(ox, sw, pw, dw, s_, w_)
    xstep, wstep = uint64(d_ * hw), uint64(taps)
    for q in range(cuda.blockIdx.y, quads, cuda.gridDim.y):
        g, j0, n0, nv, kv = _tile(q, tiles, kg, groups, n_)
        k0 = g * kg + j0
        i1, i2, i3 = _offsets(nv, c_ * d_ * hw)
        u1, u2, u3 = _offsets(kv, cg * taps)
        xb, wb = (n0 * c_ + g * cg) * d_ * hw + x0, k0 * cg * taps
        s = (zero, zero, zero, zero, zero, zero, zero, zero,
             zero, zero, zero, zero, zero, zero, zero, zero)
        for t in range(tlo, thi):
            for r in range(rlo, rhi):
                row = xb + (z0 + t * dd) * hw + (y0 + r * dh) * w_
                tap = (t * r_ + r) * s_
                for f in range(slo, shi):
                    e = uint64(row + f * dw)
                    u = uint64(wb + (taps - 1 - tap - f if flip else tap + f))
                    for c in range(cg):
                        s = _step(s, x, e, i1, i2, i3, w, u, u1, u2, u3, zero)
                        e += xstep
                        u += wstep
        b1, b2, b3 = _offsets(kv, 1)
        bias_on = epi & EPI_BIAS
        add0 = bias[k0] + zero if bias_on else zero
        add1 = bias[k0 + b1] + zero if bias_on else zero
        add2 = bias[k0 + b2] + zero if bias_on else zero
        add3 = bias[k0 + b3] + zero if bias_on else zero
        _store(y, (n0 * groups * kg + k0) * o_ + p, groups * kg * o_, o_, nv, kv, s,
               add0, add1, add2, add3, relu_floor(epi, zero))


def conv_direct_bwd_data_kernel(dy, w, dx, geo, n_, cg, kg, acc):
    """dx[n, c, i] = sum over the filters k of c's group g, the taps and the outputs o with
    o*stride - pad + tap'*dil = i of dy[n, k, o] w[k, c - g*cg, tap] (col2im's gather with the
    products done in place). Thread mapping: one input position a thread (x), its valid taps
    per axis found once (``axis_taps``); the grid's y the (image group, group, tile of TILE
    channels) tiles (grid-stride). The filter loop is innermost: each step moves dy's and w's
    addresses by a constant. Traffic: dy read about once per channel tile (the taps' overlap
    from cache), dx written once."""
    c_, d_, h_, w_, t_, r_, s_, od_, oh_, ow_, sd, sh, sw, pd, ph, pw, dd, dh, dw, flip = geo
    zero = acc[0]
    dhw, o_, taps = d_ * h_ * w_, od_ * oh_ * ow_, t_ * r_ * s_
    groups = c_ // cg
    tiles = -(-cg // TILE)
    quads = -(-n_ // DW_IMAGES) * groups * tiles
    qt, qr, qs = tap_period(dd, sd), tap_period(dh, sh), tap_period(dw, sw)
    p = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    if p >= dhw:
        return
    iz, iy, ix = p // (h_ * w_), (p // w_) % h_, p % w_
    t0, z0, zs, ct = axis_taps(iz, pd, t_, dd, sd, od_, flip, qt)
    r0, y0, ys, cr = axis_taps(iy, ph, r_, dh, sh, oh_, flip, qr)
    s0, x0, xs, cs = axis_taps(ix, pw, s_, dw, sw, ow_, flip, qs)
    ostep, wstep = uint64(o_), uint64(cg * taps)
    for q in range(cuda.blockIdx.y, quads, cuda.gridDim.y):
        g, c0, n0, nv, cv = _tile(q, tiles, cg, groups, n_)
        i1, i2, i3 = _offsets(nv, groups * kg * o_)
        u1, u2, u3 = _offsets(cv, taps)
        dyb = (n0 * groups * kg + g * kg) * o_ + x0
        wb = (g * kg * cg + c0) * taps + s0
        s = (zero, zero, zero, zero, zero, zero, zero, zero,
             zero, zero, zero, zero, zero, zero, zero, zero)
        for a in range(ct):
            for b in range(cr):
                orow, krow = tap_rows(a, b, (t0, z0, zs, qt), (r0, y0, ys, qr), oh_, ow_,
                                      r_, s_)
                row, wrow = dyb + orow, wb + krow
                for f in range(cs):
                    e, u = uint64(row + f * xs), uint64(wrow + f * qs)
                    for j in range(kg):
                        s = _step(s, dy, e, i1, i2, i3, w, u, u1, u2, u3, zero)
                        e += ostep
                        u += wstep
        _store(dx, (n0 * c_ + g * cg + c0) * dhw + p, c_ * dhw, dhw, nv, cv, s,
               zero, zero, zero, zero, relu_floor(0, zero))


# At most 128 registers (two blocks of 256 per SM; ptxas then spills 64 bytes (forward) and
# 240 (data gradient) in float32): unbounded the data gradient took ~190 registers, one block
# of 256 per SM, and on an H100 took 1.35-1.4x the bounded kernel's time on the large layers
# (the stem, ResNeXt's 128 x 56^2), 0.9x on the smallest (a CIFAR first layer)
# (validation/notes/conv-numba.md).
conv_direct_fwd_kernel = bounded_jit(conv_direct_fwd_kernel, 256, 2)
conv_direct_bwd_data_kernel = bounded_jit(conv_direct_bwd_data_kernel, 256, 2)


def SIGNATURES(t, acc):
    from numba import int64
    from numba.core.types import UniTuple
    a, z = t[::1], acc[::1]
    geo = UniTuple(int64, 20)                     # kernels/conv.py's geometry tuple
    return {
        "conv_depthwise_fwd_kernel": (a, a, a, a, geo, int64, int64, int64, z),
        "conv_depthwise_bwd_data_kernel": (a, a, a, geo, int64, int64, z),
        "conv_depthwise_bwd_filter_kernel": (a, a, z, geo, int64, int64, int64, int64, z),
        "conv_direct_fwd_kernel": (a, a, a, a, geo, int64, int64, int64, int64, z),
        "conv_direct_bwd_data_kernel": (a, a, a, geo, int64, int64, int64, z),
    }
