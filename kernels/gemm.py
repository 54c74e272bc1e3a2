"""A register-tiled, double-buffered shared-memory GEMM, specialised at compile time.

    C_z[i, j] = act(sum_k op(A_z)[i, k] * op(B_z)[k, j] (+ bias[z1*m + i])) (+ beta * C_z[i, j])

for i < m, j < n, k < kdim and z = (z1, z2) < (nz1, nz2); the bias where the int ``epi`` says
(kernels/common.py's EPILOGUE), act a relu in the ``relu`` variants (compile time), else
nothing. ``gemm_kernel(ta, tb, wm, wn, tx, ty)`` builds the kernel for one layout: a block of
tx*ty threads computes a BM x BN tile of C (BM = ty*wm, BN = tx*wn); thread (x, y) owns the wm
x wn register tile of rows y*wm/2 + {0..wm/2-1} in each half of the tile's rows, and likewise
columns x*wn/2 + {..} in each half of its columns: each fragment is two runs of consecutive
words, read as vector loads (ld.shared.v4 for 8 x 8), a warp's reads of A are broadcasts and
its reads of B cover consecutive banks. Every constant (layout, tile, thread count) is a
compile-time constant, so the register tile stays in registers and the index arithmetic folds.

Operands. Each of A, B, C has a *fast* index, the one contiguous in memory, which may be
*grouped*: index x lives at (x // grp) * gstride + x % grp (grp >= the dimension: plain). This
lets the convolution walk (image, position) columns straight through NCHW tensors.
  - A (m x kdim): ta == 0, k fast: A[i, k] = a[offa + i*lda + g_A(k)];
                  ta == 1, i fast: A[i, k] = a[offa + k*lda + g_A(i)].
  - B (kdim x n): tb == 0, j fast: B[k, j] = b[offb + k*ldb + g_B(j)];
                  tb == 1, k fast: B[k, j] = b[offb + j*ldb + g_B(k)].
  - C (m x n):    C[i, j] = c[offc + i*ldc + g_C(j)].
Offsets: offa = z1*a1 + z2*a2, offb = z1*b1 + z2*b2, offc = z1*c1 + z2*c2.

Implicit convolution (``implicit=True``): B is a convolution's im2col matrix (layout 00, the
forward: row (c, t, r, s), column (n, od, oh, ow)) or its transpose (layout 01, the filter
gradient: row (n, od, oh, ow), column (c, t, r, s)), read straight from x with no column
buffer. ``table`` holds per filter row (c, t, r, s) four int32 (dz, dy, dx, off): the tap's
input offsets t'*dd, r'*dh, s'*dw (t' = T-1-t for a flipped kernel) and its address offset
c*D*H*W + (dz*H + dy)*W + dx; ``cg`` = (O, OH*OW, OW, D, H, W, sd, sh, sw, pd, ph, pw,
C*D*H*W). An output position decodes to its window's corner (od*sd - pd, oh*sh - ph,
ow*sw - pw) and image base; an element then reads one table row (16 bytes, from cache) and
checks the tap against the input's bounds (0 outside, as padding):
B = x[offb + base(position) + off(filter row)]. Layout 00 decodes the tile's columns once per
tile into shared memory (``_corner_cols``); layout 01's positions are its k, which a thread walks
as (image, position) pairs like any grouped k-fast index (``gb`` = O) and decodes once per
slab. The other variants take a dummy table and cg.

Pipeline: a BK-deep slab of A (stored k-major, BM+PAD per row) and of B (BN+PAD per row) per
stage, two stages in dynamic shared memory (``shared_bytes``). While the block multiplies
stage s, each thread holds its share of the next slab's global loads in registers, then writes
them to stage s^1: one barrier per slab, and the global latency hides behind BK*wm*wn
multiply-adds per thread. Per slab a thread does BK*(wm + wn) shared loads for BK*wm*wn FMAs.
Staging maps consecutive threads to consecutive global addresses (the fast index), and the
row padding keeps the transposing stores of k-fast operands free of bank conflicts.
Traffic: A is read ceil(n/BN) times and B ceil(m/BM) times (mostly from L2), C written once
(read too where beta != 0). Accumulation in acc's type (float32 for float16 data).

Tensor cores (``tc``, the configurations named tc_, tf32_ and hmma_): the same staging, slabs
TC_BK (HMMA_BK) deep and rows padded by TC_PAD; the multiply is kernels/tensorcore.py's
``slab_mma`` in one of its modes, "3xtf32" (each 8-deep k-step's sum of three TF32 mma added to
the accumulators in float32), "tf32" (one TF32 mma) or "f16" (float16 data: ``mma.m16n8k16``
with float32 accumulators, the slab kept in float16, each pair of consecutive k in one 32-bit
word: ``_stash``), and ``_store`` maps the mma fragment layout to C.
"""

import functools

from numba import cuda, int64, uint64
from numba.core.types import float16

from .bounds import bounded_jit, inlined
from .common import EPI_BIAS, clip
# the tiles, re-exported: the ops read them from here
from .gemm_tiles import (BK, CONFIGS, SMEM_ALIGN, TC_PREFIXES, config_options, pad,  # noqa: F401
                         shared_bytes, tc_mode)
from .tensorcore import slab_mma


@inlined
def _split(x, grp):
    return x // grp, x % grp


@inlined
def _corner(pos, cg):
    """The input corner (od*sd - pd, oh*sh - ph, ow*sw - pw) of output position ``pos``'s
    window, and its offset (zb*H + yb)*W + xb (implicit convolution, module docstring)."""
    zb = (pos // cg[1]) * cg[6] - cg[9]
    yb = ((pos % cg[1]) // cg[2]) * cg[7] - cg[10]
    xb = (pos % cg[2]) * cg[8] - cg[11]
    return zb, yb, xb, (zb * cg[4] + yb) * cg[5] + xb


@inlined
def _tap(reg, q, src, at, zb, yb, xb, table, row, cg):
    """reg[q] = x at ``at`` + filter row ``row``'s offset for the window at corner
    (zb, yb, xb); zero where the tap falls outside the input (padding)."""
    e = uint64(4 * row)
    iz, iy, ix = zb + table[e], yb + table[e + 1], xb + table[e + 2]
    if 0 <= iz < cg[3] and 0 <= iy < cg[4] and 0 <= ix < cg[5]:
        reg[q] = src[uint64(at + table[e + 3])]
    else:
        reg[q] = 0


# The factory's device functions that need only its constants, taken as arguments (tx, bk, nt:
# threads across, the slab depth, threads per block; ...): one compile per signature serves
# every variant of a process (after LLVM's inlining the constants fold as the closure's did:
# the same machine code; validation/notes/cold-start.md).

@inlined
def _rows_at(off, ld, kfast, fixed, rows, r0, count, tile, roff, tx, bk, nt):
    """Once per tile, the offsets of this thread's staged rows (-1 past the operand's rows),
    so that a slab's fetch is one add and one load per element. k-fast: element (r, kk) =
    (t//bk + nt//bk*q, t%bk), roff[q] = off + (r0 + r)*ld; otherwise (r, kk) =
    (t%tile, t//tile + nt//tile*q) share one row, roff[0] = off + ``fixed`` (the row's
    offset)."""
    t = cuda.threadIdx.y * tx + cuda.threadIdx.x
    if kfast:
        for q in range(count):
            r = r0 + t // bk + (nt // bk) * q
            roff[q] = off + r * ld if r < rows else -1
    else:
        roff[0] = off + fixed if r0 + t % tile < rows else -1


@inlined
def _fetch(src, roff, ld, kfast, fixed, k0, kdim, count, tile, reg, tx, bk, nt):
    """reg[q] = this thread's q-th element of the slab at k0 (``_rows_at``; zero outside the
    operand), in the data type: nothing uses the loaded value until ``_stash``, so the load's
    latency hides behind the multiplications of the current slab (a conversion here would
    wait for it). k-fast: ``fixed`` is the offset of the element's k (walked by the
    caller)."""
    t = cuda.threadIdx.y * tx + cuda.threadIdx.x
    kin = k0 + t % bk < kdim
    for q in range(count):
        if kfast:
            ok, addr = kin and roff[q] >= 0, roff[q] + fixed
        else:
            kk = k0 + t // tile + (nt // tile) * q
            ok, addr = kk < kdim and roff[0] >= 0, roff[0] + kk * ld
        if ok:
            reg[q] = src[uint64(addr)]
        else:
            reg[q] = 0


@inlined
def _corner_cols(cols, j0, n, cg, tx, bn):
    """cols[4r..4r+3] = (base, zb, yb, xb) of the tile's column j0 + r (r < bn): the image's
    base plus the window corner's offset (negative where the corner is in the padding), and
    the corner (od*sd - pd, oh*sh - ph, ow*sw - pw); past the last column the corner's depth
    is far below 0, so every tap reads as padding. Kept in shared memory, not registers,
    through the k loop: the fetches read it once a slab."""
    t = cuda.threadIdx.y * tx + cuda.threadIdx.x
    if t < bn:
        jj = j0 + t
        img, pos = jj // cg[0], jj % cg[0]
        zb, yb, xb, at = _corner(pos, cg)
        cols[4 * t] = img * cg[12] + at
        cols[4 * t + 1] = zb if jj < n else -(1 << 62)
        cols[4 * t + 2], cols[4 * t + 3] = yb, xb


@inlined
def _fetch_conv(src, off, cols, table, cg, k0, kdim, count, reg, tx, bn, nt):
    """reg[q] = B[k, j] of the implicit convolution for this thread's staged elements
    (r, kk) = (t%bn, t//bn + nt//bn*q): column j = j0 + r from ``cols`` (``_corner_cols``),
    row k = k0 + kk from ``table``; zero outside the input (padding) and the matrix."""
    t = cuda.threadIdx.y * tx + cuda.threadIdx.x
    r = t % bn
    base, zb, yb, xb = cols[4 * r], cols[4 * r + 1], cols[4 * r + 2], cols[4 * r + 3]
    for q in range(count):
        k = k0 + t // bn + (nt // bn) * q
        if k < kdim:
            _tap(reg, q, src, off + base, zb, yb, xb, table, k, cg)
        else:
            reg[q] = 0


@inlined
def _fetch_conv_k(src, off, img_base, pos, table, cg, k0, kdim, j0, n, count, reg, tx, bk, nt):
    """Layout 01: reg[q] = B[k, j] of the implicit filter gradient for this thread's staged
    elements (r, kk) = (t//bk + nt//bk*q, t%bk): row k = k0 + kk is the output position
    ``pos`` of the image at ``img_base`` (the caller walks them), column j = j0 + r a filter
    row from ``table``."""
    t = cuda.threadIdx.y * tx + cuda.threadIdx.x
    zb, yb, xb, at = _corner(pos, cg)
    kin = k0 + t % bk < kdim
    for q in range(count):
        j = j0 + t // bk + (nt // bk) * q
        if kin and j < n:
            _tap(reg, q, src, off + img_base + at, zb, yb, xb, table, j, cg)
        else:
            reg[q] = 0


@inlined
def _stash(sh, base, kfast, count, tile, reg, tx, bk, nt, pairs, pad):
    t = cuda.threadIdx.y * tx + cuda.threadIdx.x
    for q in range(count):
        if kfast:
            r, kk = t // bk + (nt // bk) * q, t % bk
        else:
            r, kk = t % tile, t // tile + (nt // tile) * q
        if pairs:   # k pairs: (kk, r) at half (kk // 2)*2*(tile + pad) + 2r + kk % 2
            at = base + (kk // 2) * (2 * (tile + pad)) + 2 * r + kk % 2
        else:
            at = base + kk * (tile + pad) + r
        sh[uint64(at)] = reg[q]    # to the accumulation type (float16 for "f16")


@inlined
def _frag(sh, p, half, count, reg):
    """reg[i] = sh[p + (i // h)*half + i % h], h = count // 2: two runs of h consecutive words,
    which LLVM merges into vector loads (ld.shared.v4 for h = 4). Unsigned indices: Numba
    wraps a signed index with a compare and select per access, which would also block the
    merge."""
    h = count // 2
    for i in range(count):
        reg[i] = sh[uint64(p + (i // h) * half + i % h)]


@inlined
def _outer(c_reg, av, bv, wm, wn):
    for i in range(wm):
        for j in range(wn):
            c_reg[i, j] += av[i] * bv[j]


@inlined
def _koffset(k, grp, gstride):
    q, r = _split(k, grp)
    return q * gstride + r


@functools.lru_cache(maxsize=None)
def gemm_kernel(ta, tb, wm, wn, tx, ty, min_blocks=1, implicit=False, bk=BK, tc=False,
                relu=False):
    """The kernel for layout (ta, tb) with a (wm x wn)-per-thread tile and (tx, ty) threads.
    Staging needs NT = tx*ty threads to divide evenly: NT % BK == 0 for a k-fast operand, and
    NT % tile == 0 for the other (tile = BM or BN), with NT | BK*tile. ``min_blocks``: blocks
    per SM the register allocation must leave room for (CUDA launch bounds). ``implicit``: B
    is a convolution's input read as its im2col matrix (layout 00; module docstring). ``bk``:
    the slab depth (even; below, BK stands for it). ``tc``: the products on tensor cores
    (``tc_mode``: "3xtf32" or "tf32" for float32 data, "f16" for float16 data;
    kernels/tensorcore.py; float32 accumulation only): warp w of the 8 computes a
    (wm*8) x (wn*4) piece of the tile, fragment layouts of ``mma.m16n8k8`` / ``m16n8k16``.
    ``relu``: C = relu(the product + bias), decided at compile time (``_store``)."""
    BK = bk     # noqa: N806 -- the closures below take it as a compile-time constant
    store_bias = not relu       # a relu variant adds the bias before its relu (_store)
    mode = tc_mode(tc)
    tc, pairs = mode is not None, mode == "f16"     # pairs: float16 slabs in k pairs
    PAD = pad(tc)  # noqa: N806
    step = 16 if pairs else 8 if tc else 2
    if bk % step:
        raise ValueError(f"gemm_kernel: slab depth {bk} is not a multiple of {step}")
    if tc and (tx, ty) != (16, 16):
        raise ValueError(f"gemm_kernel: tensor cores take 16 x 16 threads, not {tx} x {ty}")
    wmt, wnt = wm // 2, wn // 2     # tc: a warp's 16 x 8 mma tiles down and across
    ew = 2 if pairs else 1          # shared elements per slab_mma offset unit
    if implicit and ta != 0:
        raise ValueError("gemm_kernel: the implicit convolution operand needs layout 00 or 01")
    if implicit and tb == 0 and tx * ty < tx * wn:
        raise ValueError(f"gemm_kernel: {tx * ty} threads cannot decode {tx * wn} columns")
    bm, bn, nt = ty * wm, tx * wn, tx * ty
    sa, sb = bm + PAD, bn + PAD                 # shared row lengths
    stage = BK * (sa + sb)
    la, lb = bm * BK // nt, bn * BK // nt       # staged elements per thread per slab
    ncols = 4 * bn if implicit and tb == 0 else 1     # implicit 00: decoded tile columns
    for fast, tile in ((ta == 0, bm), (tb == 1, bn)):
        if (nt % BK if fast else nt % tile) or (BK * tile) % nt:
            raise ValueError(f"gemm_kernel: {nt} threads cannot stage a {tile} x {BK} slab")

    @inlined
    def fetch_b(b, offb, roff, ldb, bq, gsb, br, k0, kdim, n, j0, cols, table, cg, reg):
        """This thread's share of B's slab at k0 (``_fetch``, or the implicit convolution's
        ``_fetch_conv`` / ``_fetch_conv_k``)."""
        if implicit and tb == 0:
            _fetch_conv(b, offb, cols, table, cg, k0, kdim, lb, reg, tx, bn, nt)
        elif implicit:
            _fetch_conv_k(b, offb, bq * gsb, br, table, cg, k0, kdim, j0, n, lb, reg, tx, BK,
                          nt)
        else:
            _fetch(b, roff, ldb, tb == 1, bq * gsb + br, k0, kdim, lb, bn, reg, tx, BK, nt)

    mma_slab = slab_mma(mode, BK, sa, sb, wmt, wnt) if tc else None

    if pairs:
        @cuda.jit(device=True, inline=True)   # returns the array it declares (bounds.inlined)
        def scratch(acc):
            return cuda.shared.array(0, dtype=float16, alignment=SMEM_ALIGN)
    else:
        @cuda.jit(device=True, inline=True)   # returns the array it declares (bounds.inlined)
        def scratch(acc):
            return cuda.shared.array(0, dtype=acc.dtype, alignment=SMEM_ALIGN)

    def kernel(a, b, c, bias, dims, lds, grps, batch, beta, epi, acc, table, cg):
        # 16-byte aligned, so the fragment reads can be vector loads
        sh = scratch(acc)
        cols = cuda.shared.array(ncols, dtype=int64)
        zero = acc[0]
        m, n, kdim = dims
        lda, ldb, ldc = lds
        ga, gsa, gb, gsb, gc, gsc = grps
        nz1, nz2, a1, a2, b1, b2, c1, c2 = batch
        x, y = cuda.threadIdx.x, cuda.threadIdx.y
        t = y * tx + x
        # tc: warp (wy, wx) of 2 x 4, lane 4g + q (mma_slab); the thread's first C row and
        # column within the tile (_store)
        wy, wx, g, q = t // 128, (t // 32) % 4, (t % 32) // 4, t % 4
        i1 = wy * (wmt * 16) + g if tc else y * (wm // 2)
        j1 = wx * (wnt * 8) + 2 * q if tc else x * (wn // 2)
        c_reg = cuda.local.array((wm, wn), dtype=acc.dtype)
        ra0 = cuda.local.array(wm, dtype=acc.dtype)    # fragments of A and B, two rows
        rb0 = cuda.local.array(wn, dtype=acc.dtype)
        ra1 = cuda.local.array(wm, dtype=acc.dtype)
        rb1 = cuda.local.array(wn, dtype=acc.dtype)
        a_buf = cuda.local.array(la, dtype=a.dtype)     # the next slab, as loaded
        b_buf = cuda.local.array(lb, dtype=b.dtype)
        roffa = cuda.local.array(la if ta == 0 else 1, dtype=int64)    # _rows_at
        roffb = cuda.local.array(lb if tb == 1 else 1, dtype=int64)
        # the k of this thread's k-fast staging elements is k0 + t % BK
        kk_a, kk_b = t % BK, t % BK
        for z in range(cuda.blockIdx.z, nz1 * nz2, cuda.gridDim.z):
            z1, z2 = z // nz2, z % nz2
            offa, offb = z1 * a1 + z2 * a2, z1 * b1 + z2 * b2
            for i0 in range(cuda.blockIdx.y * bm, m, cuda.gridDim.y * bm):
                for j0 in range(cuda.blockIdx.x * bn, n, cuda.gridDim.x * bn):
                    for i in range(wm):
                        for j in range(wn):
                            c_reg[i, j] = zero
                    # fixed (non-k) offsets of the non-k-fast operands, once per tile
                    fa = 0 if ta == 0 else _koffset(i0 + t % bm, ga, gsa)
                    fb = 0 if tb == 1 else _koffset(j0 + t % bn, gb, gsb)
                    _rows_at(offa, lda, ta == 0, fa, m, i0, la, bm, roffa, tx, BK, nt)
                    if not implicit:
                        _rows_at(offb, ldb, tb == 1, fb, n, j0, lb, bn, roffb, tx, BK, nt)
                    if implicit and tb == 0:    # the tile's columns (n, od, oh, ow)
                        _corner_cols(cols, j0, n, cg, tx, bn)
                        cuda.syncthreads()
                    # k-fast operands: (quotient, remainder) of k = k0 + kk, walked per slab
                    aq, ar = _split(kk_a, ga)
                    bq, br = _split(kk_b, gb)
                    _fetch(a, roffa, lda, ta == 0, aq * gsa + ar, 0, kdim, la, bm, a_buf, tx,
                           BK, nt)
                    fetch_b(b, offb, roffb, ldb, bq, gsb, br, 0, kdim, n, j0, cols, table, cg,
                            b_buf)
                    _stash(sh, 0, ta == 0, la, bm, a_buf, tx, BK, nt, pairs, PAD)
                    _stash(sh, BK * sa, tb == 1, lb, bn, b_buf, tx, BK, nt, pairs, PAD)
                    cuda.syncthreads()
                    phase = 0
                    for k0 in range(0, kdim, BK):
                        more = k0 + BK < kdim
                        if more:
                            if ta == 0:
                                ar += BK
                                while ar >= ga:
                                    ar -= ga
                                    aq += 1
                            if tb == 1:
                                br += BK
                                while br >= gb:
                                    br -= gb
                                    bq += 1
                            _fetch(a, roffa, lda, ta == 0, aq * gsa + ar, k0 + BK, kdim, la,
                                   bm, a_buf, tx, BK, nt)
                            fetch_b(b, offb, roffb, ldb, bq, gsb, br, k0 + BK, kdim, n, j0,
                                    cols, table, cg, b_buf)
                        if tc:      # offsets in slab_mma's unit (ew elements)
                            mma_slab(sh, phase * (stage // ew) + q * sa + wy * (wmt * 16) + g,
                                     phase * (stage // ew) + (BK // ew) * sa + q * sb
                                     + wx * (wnt * 8) + g, c_reg, zero)
                        else:
                            # Register double buffering: the fragments of row kk+1 are read
                            # while row kk multiplies (the last read runs one row past the
                            # slab, into padding, and is not used). Offsets are written as
                            # products of constants so LLVM can prove the 16-byte alignment
                            # of the vector loads.
                            pa = phase * stage + y * (wm // 2)
                            pb = phase * stage + BK * sa + x * (wn // 2)
                            _frag(sh, pa, bm // 2, wm, ra0)
                            _frag(sh, pb, bn // 2, wn, rb0)
                            for kk in range(0, BK, 2):
                                _frag(sh, pa + (kk + 1) * sa, bm // 2, wm, ra1)
                                _frag(sh, pb + (kk + 1) * sb, bn // 2, wn, rb1)
                                _outer(c_reg, ra0, rb0, wm, wn)
                                _frag(sh, pa + (kk + 2) * sa, bm // 2, wm, ra0)
                                _frag(sh, pb + (kk + 2) * sb, bn // 2, wn, rb0)
                                _outer(c_reg, ra1, rb1, wm, wn)
                        if more:
                            nxt = (1 - phase) * stage
                            _stash(sh, nxt, ta == 0, la, bm, a_buf, tx, BK, nt, pairs, PAD)
                            _stash(sh, nxt + BK * sa, tb == 1, lb, bn, b_buf, tx, BK, nt, pairs,
                                   PAD)
                            phase = 1 - phase
                        cuda.syncthreads()
                    _store(c, z1 * c1 + z2 * c2, ldc, gc, gsc, m, n, i0 + i1, j0 + j1, c_reg,
                           beta, bias, z1 * m, epi, zero)

    @inlined
    def _store(c, off, ldc, gc, gsc, m, n, i1, j1, c_reg, beta, bias, boff, epi, zero):
        """C rows i1 + (i // hm)*sm + (i % hm)*um and columns j1 + (j // hn)*sn + j % hn
        (the fragment layout: hm, sm, um = wm/2, BM/2, 1 and hn, sn = wn/2, BN/2; with tensor
        cores 2, 16, 8 and 2, 8): c = c_reg (+ bias, as epi's EPI_BIAS says) (+ beta*c, read
        only when beta != 0). A ``relu`` variant takes c_reg + bias through relu in registers
        first (NaN stays; beta's term comes after it: no caller mixes them): a select in the
        store loop kept the large tiles' stores from unrolling (c_reg on the stack). Column
        offsets come first, so the store loops unroll and c_reg stays in registers."""
        hm, sm, um = (2, 16, 8) if tc else (wm // 2, bm // 2, 1)
        hn, sn = (2, 8) if tc else (wn // 2, bn // 2)
        cols = cuda.local.array(wn, dtype=int64)
        for j in range(wn):
            gj = j1 + (j // hn) * sn + j % hn
            q, r = _split(gj, gc)
            cols[j] = off + q * gsc + r if gj < n else -1
        if relu:
            for i in range(wm):
                gi = min(i1 + (i // hm) * sm + (i % hm) * um, m - 1)   # (rows past m unused)
                add = bias[gi + boff] + zero if epi & EPI_BIAS else zero
                for j in range(wn):
                    c_reg[i, j] = clip(c_reg[i, j] + add, zero)
        for i in range(wm):
            gi = i1 + (i // hm) * sm + (i % hm) * um
            if gi < m:
                add = bias[gi + boff] + zero if store_bias and epi & EPI_BIAS else zero
                for j in range(wn):
                    if cols[j] >= 0:
                        at = uint64(cols[j] + gi * ldc)
                        v = c_reg[i, j] + add
                        if beta != zero:
                            v += beta * (c[at] + zero)
                        c[at] = v

    # the variant in the kernel's name, which its mangled name carries into profilers and
    # disassemblies (otherwise every variant reads gemm_kernel::<locals>::kernel)
    kernel.__name__ = kernel.__qualname__ = (f"gemm_{ta}{tb}_{bm}x{bn}_{mode or 'fma'}"
                                             f"{'_implicit' if implicit else ''}"
                                             f"{'_relu' if relu else ''}")
    return bounded_jit(kernel, nt, min_blocks)


LAYOUTS = ((0, 0), (1, 0), (0, 1))
VARIANTS = {f"gemm_{ta}{tb}_{cfg}_kernel": gemm_kernel(ta, tb, *CONFIGS[cfg],
                                                       **config_options(cfg))
            for ta, tb in LAYOUTS for cfg in CONFIGS}
VARIANTS.update({f"gemm_0{tb}_{cfg}_implicit_kernel":
                 gemm_kernel(0, tb, *CONFIGS[cfg], implicit=True, **config_options(cfg))
                 for tb in (0, 1) for cfg in CONFIGS})
# The fused relu's variants: the convolution's forward (00, plain and implicit), linear (01).
VARIANTS.update({f"gemm_{ta}{tb}_{cfg}{'_implicit' * imp}_relu_kernel": gemm_kernel(
    ta, tb, *CONFIGS[cfg], implicit=imp, relu=True, **config_options(cfg))
    for ta, tb, imp in ((0, 0, False), (0, 1, False), (0, 0, True)) for cfg in CONFIGS})
# The split-k forward (ops/conv_numba.py) writes layout 00's C into an accumulation-type
# workspace: the same kernels again under these names, so that the PTX checks compile them
# with that signature too (float16 data, float32 C; float32-only variants need none).
VARIANTS.update({f"gemm_00_{cfg}_acc_kernel": VARIANTS[f"gemm_00_{cfg}_kernel"]
                 for cfg in CONFIGS if cfg != "sim"
                 and TC_PREFIXES.get(cfg.split("_")[0], ("", "float16"))[1] == "float16"})
# A tensor-core variant serves one data type (TC_PREFIXES): it has no signature for the others.
ONLY_DTYPES = {name: (TC_PREFIXES[p][1],) for name in VARIANTS for p in TC_PREFIXES
               if f"_{p}_" in name}
NO_FLOAT64 = tuple(ONLY_DTYPES)
CG_LEN = 13     # the implicit convolution's cg tuple


def SIGNATURES(t, acc):
    from numba import int32, int64
    from numba.core.types import UniTuple
    a, z = t[::1], acc[::1]
    ints = (UniTuple(int64, 3), UniTuple(int64, 3), UniTuple(int64, 6), UniTuple(int64, 8))
    conv = (int32[::1], UniTuple(int64, CG_LEN))
    # The convolution's forward (layout 00) writes y in the data type, or with its k split
    # (the *_acc names) a workspace in the accumulation type, as its gradients (10, 01) do.
    # bias is read in the data type.
    def c(name):
        return a if (name.startswith("gemm_00") and not name.endswith("_acc_kernel")
                     or name.endswith("_relu_kernel")) else z
    return {name: (a, a, c(name), a) + ints + (acc, int64, z) + conv for name in VARIANTS
            if str(t) in ONLY_DTYPES.get(name, (str(t),))}
