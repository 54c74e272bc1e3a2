"""Convolution (2-D as 3-D, and 3-D) by im2col + GEMM, with col2im for the data gradient.

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

from .softmax import _SUM, _block_reduce

TM, TN = 8, 8   # register tile of one GEMM thread (rows x columns of C)
BK = 8          # depth of the k-slab staged in shared memory per step
PAD = 4         # shared row padding: k-major tile stores hit distinct banks
LD = 8          # global loads a GEMM thread keeps in flight while staging a slab


@cuda.jit(device=True, inline=True)
def _tap(o, stride, k, ksize, dil, pad, flip):
    """Input coordinate read by output coordinate o through kernel tap k."""
    return o * stride + ((ksize - 1 - k) if flip else k) * dil - pad


@cuda.jit
def conv_im2col_fwd_kernel(x, col, geo, nc, acc):
    """col (C*T*R*S, nc*O) from the nc images of x (x flat from the chunk's first image).
    Thread mapping: grid-stride loop over (c, n, o), o fastest; a thread writes the T*R*S taps
    of one (channel, output) pair. Consecutive threads write consecutive columns (coalesced)
    and read x at stride sw (coalesced for stride 1). Traffic: x read ~TRS/stride^3 times
    (cached), col written once."""
    c_, d_, h_, w_, t_, r_, s_, od_, oh_, ow_, sd, sh, sw, pd, ph, pw, dd, dh, dw, flip = geo
    zero = acc[0]
    o_, hw = od_ * oh_ * ow_, oh_ * ow_
    ncol = nc * o_
    for e in range(cuda.grid(1), c_ * ncol, cuda.gridsize(1)):
        c, j = e // ncol, e % ncol
        n, p = j // o_, j % o_
        zo, yo, xo = p // hw, (p % hw) // ow_, p % ow_
        src = (n * c_ + c) * d_ * h_ * w_
        dst = c * t_ * r_ * s_ * ncol + j
        for t in range(t_):
            iz = _tap(zo, sd, t, t_, dd, pd, flip)
            for r in range(r_):
                iy = _tap(yo, sh, r, r_, dh, ph, flip)
                for s in range(s_):
                    ix = _tap(xo, sw, s, s_, dw, pw, flip)
                    inside = 0 <= iz < d_ and 0 <= iy < h_ and 0 <= ix < w_
                    col[dst] = x[src + (iz * h_ + iy) * w_ + ix] if inside else zero
                    dst += ncol


@cuda.jit(device=True, inline=True)
def _out(i, pad, k, ksize, dil, stride, osize, flip):
    """Output coordinate whose tap k reads input coordinate i, or -1 if none."""
    q = i + pad - ((ksize - 1 - k) if flip else k) * dil       # = o * stride
    if q < 0 or q % stride != 0 or q // stride >= osize:
        return -1
    return q // stride


@cuda.jit
def conv_col2im_bwd_kernel(dcol, dx, geo, nc, acc):
    """dx (the chunk's nc images, flat) from dcol (C*T*R*S, nc*O), in gather form:
    dx[n, c, i] = sum over taps (t, r, s) and outputs o with o*stride + t'*dil - pad = i of
    dcol[(c,t,r,s), (n,o)]. Thread mapping: grid-stride loop, one thread per dx element
    (consecutive threads on consecutive x positions, coalesced writes), summing in a fixed
    order: deterministic, no atomics. Traffic: dcol read once, dx written once."""
    c_, d_, h_, w_, t_, r_, s_, od_, oh_, ow_, sd, sh, sw, pd, ph, pw, dd, dh, dw, flip = geo
    zero = acc[0]
    dhw, o_ = d_ * h_ * w_, od_ * oh_ * ow_
    ncol = nc * o_
    for e in range(cuda.grid(1), nc * c_ * dhw, cuda.gridsize(1)):
        nci, p = e // dhw, e % dhw                  # nci = n*C + c
        n, c = nci // c_, nci % c_
        iz, iy, ix = p // (h_ * w_), (p // w_) % h_, p % w_
        total = zero
        for t in range(t_):
            zo = _out(iz, pd, t, t_, dd, sd, od_, flip)
            if zo < 0:
                continue
            for r in range(r_):
                yo = _out(iy, ph, r, r_, dh, sh, oh_, flip)
                if yo < 0:
                    continue
                for s in range(s_):
                    xo = _out(ix, pw, s, s_, dw, sw, ow_, flip)
                    if xo >= 0:
                        row = ((c * t_ + t) * r_ + r) * s_ + s
                        total += dcol[row * ncol + n * o_ + (zo * oh_ + yo) * ow_ + xo] + zero
        dx[e] = total


# A GEMM operand: op = (off, ld, kmajor, rows, r0, tile). Element (r, k) of op(src) is
# src[off + r*ld + k] if kmajor else src[off + k*ld + r]; the block stages rows r0..r0+tile of
# a BK-deep slab at shared offset base, as sh[base + kk*(tile+PAD) + r]. Threads take the slab
# in memory order (k fastest if kmajor, else r), so consecutive threads read consecutive
# addresses: a thread's elements are (slow, fast) positions tid, tid + nthreads, ..., walked
# incrementally from walk = (s0, f0, ds, df) (see _walk), LD of them per round.

@cuda.jit(device=True, inline=True)
def _walk(fast):
    """(s0, f0, ds, df): divmod of the thread index and of the thread count by ``fast``."""
    tid = cuda.threadIdx.y * cuda.blockDim.x + cuda.threadIdx.x
    nthr = cuda.blockDim.x * cuda.blockDim.y
    return tid // fast, tid % fast, nthr // fast, nthr % fast


@cuda.jit(device=True, inline=True)
def _step(s, f, walk, nfast):
    s, f = s + walk[2], f + walk[3]
    if f >= nfast:
        s, f = s + 1, f - nfast
    return s, f


@cuda.jit(device=True, inline=True)
def _fetch(src, op, s, f, walk, k0, kdim, buf, zero):
    """buf = the LD elements of the slab at k0 from position (s, f) on (zero outside op(src));
    the loads are independent, so their latencies overlap."""
    off, ld, kmajor, rows, r0, tile = op
    nslow, nfast = (tile, BK) if kmajor else (BK, tile)
    for q in range(LD):
        r, kk = (s, f) if kmajor else (f, s)
        v = zero
        if s < nslow and r0 + r < rows and k0 + kk < kdim:
            v = src[off + ((r0 + r) * ld + k0 + kk if kmajor else (k0 + kk) * ld + r0 + r)] + zero
        buf[q] = v
        s, f = _step(s, f, walk, nfast)


@cuda.jit(device=True, inline=True)
def _stash(sh, base, op, s, f, walk, buf):
    """Store buf, fetched from position (s, f), into the shared slab; the position after."""
    kmajor, tile = op[2], op[5]
    nslow, nfast = (tile, BK) if kmajor else (BK, tile)
    for q in range(LD):
        if s < nslow:
            r, kk = (s, f) if kmajor else (f, s)
            sh[base + kk * (tile + PAD) + r] = buf[q]
        s, f = _step(s, f, walk, nfast)
    return s, f


@cuda.jit(device=True, inline=True)
def _load_now(src, op, walk, k0, kdim, sh, base, buf, zero):
    """Stage the whole slab at k0, a round of LD loads at a time."""
    s, f = walk[0], walk[1]
    while s < (op[5] if op[2] else BK):
        _fetch(src, op, s, f, walk, k0, kdim, buf, zero)
        s, f = _stash(sh, base, op, s, f, walk, buf)


@cuda.jit(device=True, inline=True)
def _col(j, tx, bx):
    """Tile column of the thread's register column j: TN/2 consecutive columns in each half of
    the tile (a warp's B reads hit distinct banks two ways at most, and fold to immediates)."""
    h = TN // 2
    return (j // h) * bx * h + tx * h + j % h


@cuda.jit(device=True, inline=True)
def _slab_mma(sh, sb0, sla, slb, c_reg, a_reg, b_reg):
    """c_reg += the thread's TM x TN block of A_slab . B_slab: thread (tx, ty) owns tile rows
    ty*TM + i and columns _col(j, tx, bx). Per slab: BK*(TM+TN) shared loads for BK*TM*TN
    multiply-adds. The rows are read through slices so that the constant offsets i, j need no
    negative-index fix-up (Numba wraps every computed signed index)."""
    h = TN // 2
    a0 = cuda.threadIdx.y * TM
    b0 = sb0 + cuda.threadIdx.x * h
    b1 = b0 + cuda.blockDim.x * h
    for _ in range(BK):
        av, bl, bh = sh[a0:a0 + TM], sh[b0:b0 + h], sh[b1:b1 + h]
        for i in range(TM):
            a_reg[i] = av[i]
        for j in range(h):
            b_reg[j] = bl[j]
            b_reg[h + j] = bh[j]
        for i in range(TM):
            for j in range(TN):
                c_reg[i, j] += a_reg[i] * b_reg[j]
        a0 += sla
        b0 += slb
        b1 += slb


@cuda.jit(device=True, inline=True)
def _store(c, off, ldc, m, n, i0, j0, c_reg, alpha, beta, bias, boff, use_bias, zero):
    """c = alpha*c_reg (+ bias[boff + row]) (+ beta*c, only read when beta != 0, so an
    uninitialised c may hold NaN)."""
    tx, bx = cuda.threadIdx.x, cuda.blockDim.x
    for i in range(TM):
        gi = i0 + cuda.threadIdx.y * TM + i
        if gi < m:
            add = bias[boff + gi] + zero if use_bias else zero
            for j in range(TN):
                gj = j0 + _col(j, tx, bx)
                if gj < n:
                    v = alpha * c_reg[i, j] + add
                    if beta != zero:
                        v += beta * (c[off + gi * ldc + gj] + zero)
                    c[off + gi * ldc + gj] = v


def _gemm(a, b, c, bias, shape, lds, flags, batch, red, alpha, beta, acc):
    """Batched, batch-reduce GEMM: for z = (z1, z2) < (nz1, nz2)

        C_z = alpha * sum_{q < nred} op(A_{z,q}) . op(B_{z,q}) (+ bias_z) + beta * C_z

    with op(A) m x k, op(B) k x n, C m x n row-major (ld ldc), flags = (transpose A,
    transpose B, use bias): op(A)[i, k] = A[i*lda + k] or A[k*lda + i], op(B)[k, j] =
    B[k*ldb + j] or B[j*ldb + k]. Offsets: A_{z,q} at z1*a1 + z2*a2 + q*ra, B_{z,q} at
    z1*b1 + z2*b2 + q*rb, C_z at z1*c1 + z2*c2, bias_z at z1*m;
    batch = (nz1, nz2, a1, a2, b1, b2, c1, c2), red = (nred, ra, rb).

    Thread mapping: a block of (bx, by) threads computes (by*TM) x (bx*TN) tiles of C, each
    thread a TM x TN register tile (see _slab_mma); blocks walk the tiles
    and the batch index z in grid-stride loops over (gridDim.x, gridDim.y, gridDim.z), so any
    grid is correct. The k loop stages BK-deep slabs of A and B in dynamic shared memory
    (BK*(bm+PAD) + BK*(bn+PAD) elements of acc's type, sized at launch), two barriers per slab;
    where each thread's share of a slab is at most LD elements (bx, by >= 8) the next slab's
    global loads are issued before the current slab's multiply, hiding their latency.
    Accumulation in acc's type (float32 for float16). Traffic: A and B are each read n/bn and
    m/bm times (mostly from L2), C written once (read too where beta != 0).
    """
    sh = cuda.shared.array(0, dtype=acc.dtype)
    zero = acc[0]
    m, n, kdim = shape
    lda, ldb, ldc = lds
    ta, tb, use_bias = flags
    nz1, nz2, a1, a2, b1, b2, c1, c2 = batch
    nred, ra, rb = red
    bm, bn = cuda.blockDim.y * TM, cuda.blockDim.x * TN
    sb0 = BK * (bm + PAD)           # B's slab follows A's in the shared array
    c_reg = cuda.local.array((TM, TN), dtype=acc.dtype)
    a_reg = cuda.local.array(TM, dtype=acc.dtype)
    b_reg = cuda.local.array(TN, dtype=acc.dtype)
    buf_a = cuda.local.array(LD, dtype=acc.dtype)
    buf_b = cuda.local.array(LD, dtype=acc.dtype)
    walk_a = _walk(BK if ta == 0 else bm)
    walk_b = _walk(BK if tb != 0 else bn)
    # One round per slab for every thread: prefetch the next slab during the multiply.
    nthr = cuda.blockDim.x * cuda.blockDim.y
    single = bm * BK <= LD * nthr and bn * BK <= LD * nthr
    for z in range(cuda.blockIdx.z, nz1 * nz2, cuda.gridDim.z):
        z1, z2 = z // nz2, z % nz2
        for i0 in range(cuda.blockIdx.y * bm, m, cuda.gridDim.y * bm):
            for j0 in range(cuda.blockIdx.x * bn, n, cuda.gridDim.x * bn):
                for i in range(TM):
                    for j in range(TN):
                        c_reg[i, j] = zero
                for q in range(nred):
                    opa = (z1 * a1 + z2 * a2 + q * ra, lda, ta == 0, m, i0, bm)
                    opb = (z1 * b1 + z2 * b2 + q * rb, ldb, tb != 0, n, j0, bn)
                    for k0 in range(0, kdim, BK):
                        if not single:
                            _load_now(a, opa, walk_a, k0, kdim, sh, 0, buf_a, zero)
                            _load_now(b, opb, walk_b, k0, kdim, sh, sb0, buf_b, zero)
                        else:
                            if k0 == 0:
                                _fetch(a, opa, walk_a[0], walk_a[1], walk_a, 0, kdim, buf_a,
                                       zero)
                                _fetch(b, opb, walk_b[0], walk_b[1], walk_b, 0, kdim, buf_b,
                                       zero)
                            _stash(sh, 0, opa, walk_a[0], walk_a[1], walk_a, buf_a)
                            _stash(sh, sb0, opb, walk_b[0], walk_b[1], walk_b, buf_b)
                        cuda.syncthreads()
                        if single and k0 + BK < kdim:
                            _fetch(a, opa, walk_a[0], walk_a[1], walk_a, k0 + BK, kdim, buf_a,
                                   zero)
                            _fetch(b, opb, walk_b[0], walk_b[1], walk_b, k0 + BK, kdim, buf_b,
                                   zero)
                        _slab_mma(sh, sb0, bm + PAD, bn + PAD, c_reg, a_reg, b_reg)
                        cuda.syncthreads()
                _store(c, z1 * c1 + z2 * c2, ldc, m, n, i0, j0, c_reg, alpha, beta, bias,
                       z1 * m, use_bias, zero)


# One body, two entry points, so that the ahead-of-time checks compile both type patterns:
# the forward pass writes y in the data type, the backward passes write buffers in acc's type.
conv_gemm_fwd_kernel = cuda.jit(_gemm)
conv_gemm_bwd_kernel = cuda.jit(_gemm)


@cuda.jit
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
        total = _block_reduce(red, part, _SUM)
        if tid == 0:
            db[ch] = total


@cuda.jit
def conv_wsum_bwd_kernel(ws, dw, parts, size, acc):
    """dw[i] = sum_{p < parts} ws[p*size + i]: the split-batch partial filter gradients summed
    in a fixed order and cast to dw's type. Thread mapping: grid-stride loop, one element per
    thread, coalesced. Traffic: ws read once, dw written once."""
    zero = acc[0]
    for i in range(cuda.grid(1), size, cuda.gridsize(1)):
        total = zero
        for p in range(parts):
            total += ws[p * size + i]
        dw[i] = total
