"""A pipelined float16 GEMM on tensor cores: asynchronous copies, ldmatrix, HMMA.

    C_z[i, j] = act(sum_k op(A_z)[i, k] * op(B_z)[k, j] (+ bias[z1*m + i]) (+ beta * C_z[i, j]))

with kernels/gemm.py's arguments, layouts and batch offsets, for float16 A and B and float32
accumulation; an operand's fast index may be grouped (kernels/gemm.py) where it is not k (C's
may be). kernels/gemm.py's tensor-core variants stage one 16-deep slab at a time through
registers, element by element: a block's 8 warps run 16 mma each between two barriers, too
little to hide a global load, and HMMA ran at 13-35 TFLOP/s there (this kernel: 90-260 on an
H100, validation/notes/gemm.md). Here (the scheme of CUTLASS's sm_80 GEMMs):

  - Tiles of bm x 128 (bm 128 or 64), slabs 32 deep, 256 threads: 8 warps of 2 (rows) x 4
    (columns), each warp a (bm/2) x 32 piece = bm/32 x 4 ``mma.m16n8k16`` tiles; 64 (32)
    float32 accumulators per thread.
  - Three stages in shared memory (3 x 16 KB for bm = 128: the 48 KB a launch gets without
    opting in).
    Each thread issues its 16-byte ``cp.async`` copies of slab s + 2 while the warps multiply
    slab s: global latency hides behind two slabs of mma, with no staging registers.
  - An operand is stored in shared memory as it lies in global memory: k-major ([rows][32]: A
    with ta == 0, B with tb == 1) or row-major in its other index ([32 k][128]); fragments are
    read with ``ldmatrix.x4`` (k-major) or ``ldmatrix.x4.trans``, 6 instructions per warp per
    16-deep k-step for its 16 mma (bm = 128). 16-byte chunks are XOR-swizzled within each
    group of eight (k-major: chunk c of row r at c ^ ((r >> 1) & 3), 4 chunks a row;
    otherwise c ^ (r & 7), bm/8 or 16 a row), so the 8 rows one ldmatrix matrix reads fall
    on 8 distinct 16-byte bank groups, and the copies on none twice.
  - C leaves through shared memory (64 rows a pass: ``_spill``, ``_write``), each thread
    writing one column, so the accumulators keep constant indices (in registers).
  - An operand whose rows are not 16-byte aligned (its address, leading dimension, batch
    offset, or fast extent not a multiple of 8 elements; a grouped index's group or stride)
    is copied by 8-byte ``cp.async.ca`` copies (two a chunk) where those are aligned, in the
    kernels' ``narrow`` variants (a 1x1 convolution's 14 x 14 maps: groups of 196 columns),
    else staged by each thread element by element into the same layout (decided per operand
    once per block: no divergence), the other still by 16-byte copies. Elements past the
    matrix are zeros either way (``cp.async`` with 0 source bytes).

Traffic as kernels/gemm.py's: A read ceil(n/128) times, B ceil(m/bm) times, C written once.
"""

import functools

from numba import boolean, cuda, float32, int64, uint32, uint64
from numba.core.types import float16

from .bounds import bounded_jit, inlined
from .common import EPI_BIAS, clip, relu_floor
from .tensorcore import (address, cp_async8, cp_async16, cp_async_commit,
                         cp_async_wait0, cp_async_wait1, ldmatrix_x4, ldmatrix_x4_trans,
                         mma_f16, shared_address)

BN = 128
BK = 32
THREADS = 256
STAGES = 3
CP = 132        # C's staging rows in the epilogue (words; 2-way bank conflicts at most)
NT8 = 4         # a warp's 8-column mma tiles across


def shared_bytes(bm):
    """Dynamic shared memory of the kernel with bm-row tiles: STAGES slabs of A and B (and at
    least the epilogue's 64 x CP float32 staging)."""
    return max(STAGES * (bm + BN) * BK * 2, 64 * CP * 4)


@cuda.jit(device=True, inline=True)     # returns the array it declares (bounds.inlined)
def _slabs():
    return cuda.shared.array(0, dtype=float16, alignment=16)


@cuda.jit(device=True, inline=True)     # returns the array it declares (bounds.inlined)
def _words():
    return cuda.shared.array(0, dtype=float32, alignment=16)


@inlined
def _chunk_at(kmajor, row, c, width):
    """Byte offset within one operand's slab of 16-byte chunk ``c`` of stored row ``row``
    (module docstring): rows of 32 k (4 chunks), or of ``width`` chunks (8 or 16) of the other
    index; swizzled within groups of 8 rows."""
    if kmajor:
        return row * 64 + ((c ^ ((row >> 1) & 3)) << 4)
    return row * (width << 4) + ((c ^ (row & 7)) << 4)


@inlined
def _mma(c_reg, mt, j, af, b0, b1):
    c_reg[mt, j, 0], c_reg[mt, j, 1], c_reg[mt, j, 2], c_reg[mt, j, 3] = mma_f16(
        af[mt, 0], af[mt, 1], af[mt, 2], af[mt, 3], b0, b1, c_reg[mt, j, 0], c_reg[mt, j, 1],
        c_reg[mt, j, 2], c_reg[mt, j, 3])


@inlined
def _place(h, kmajor, width, r0):
    """(stored row, chunk in it, the operand's m or n, k within the slab) of this thread's
    chunk h: k-major, 4 chunks of 8 k a row (row = the m or n from r0); else rows of k,
    ``width`` chunks of 8 consecutive m or n."""
    ch = cuda.threadIdx.x + THREADS * h
    if kmajor:
        row, c = ch >> 2, ch & 3
        return row, c, r0 + row, c << 3
    row, c = ch // width, ch % width
    return row, c, r0 + (c << 3), row


@inlined
def _chunks(gbase, off, ld, rows, fast, r0, kmajor, tile, count, sbase, gp, sd, kc, ok, grp,
            gstride):
    """Once per tile, this thread's ``count`` chunks of an operand's slabs (``tile`` rows of
    m or n): gp[h] the global byte address of chunk h at k = 0, sd[h] its shared address in
    stage 0, kc[h] its k within a slab, ok[h] whether its m or n lies inside the operand (k is
    checked per slab). Element (r, k) is at off + r*ld + k (k-major) or off + k*ld + g(r), r
    grouped as kernels/gemm.py's fast indices: g(r) = (r // grp)*gstride + r % grp (grp a
    multiple of 8: a chunk lies in one group)."""
    width = tile >> 3
    for h in range(count):
        row, c, r, kc[h] = _place(h, kmajor, width, r0)
        if kmajor:
            e, ok[h] = off + r * ld + kc[h], r < rows
        else:
            e, ok[h] = off + kc[h] * ld + (r // grp) * gstride + r % grp, r < fast
        gp[h] = gbase + uint64(2 * e)
        sd[h] = uint32(sbase + uint32(_chunk_at(kmajor, row, c, width)))


@inlined
def _issue(gp, sd, kc, ok, count, k0, kdim, step, at, gbase):
    """cp.async this thread's chunks of the slab at k0 into the stage at byte ``at``
    (``step``: bytes per k of the operand's chunks); 0 source bytes (zeros) past k or the
    rows, from ``gbase`` (the batch entry's first element: 16-byte aligned, as every copy's
    source must be, where the array's own start need not be)."""
    for h in range(count):
        inside = ok[h] and k0 + kc[h] < kdim
        src = gp[h] + uint64(k0) * step if inside else gbase
        cp_async16(uint32(sd[h] + at), src, uint32(16 if inside else 0))


@inlined
def _stage_scalar(src, off, ld, rows, fast, r0, k0, kdim, kmajor, tile, count, sh, at, grp,
                  gstride):
    """The unaligned operand's slab at k0, element by element into the same layout (a
    grouped fast index walked element by element: no division)."""
    width = tile >> 3
    for h in range(count):
        row, c, r, kc = _place(h, kmajor, width, r0)
        kk = k0 + kc
        if kmajor:
            e, rest, good = off + r * ld + kk, fast - kk, r < rows
            q, rr = 0, 0
        else:
            e, rest, good = off + kk * ld, fast - r, kk < rows
            q, rr = r // grp, r % grp
        dst = (at + _chunk_at(kmajor, row, c, width)) >> 1
        for v in range(8):
            at_v = e + v if kmajor else e + q * gstride + rr
            sh[uint64(dst + v)] = src[uint64(at_v)] if good and v < rest else float16(0)
            if not kmajor:
                rr += 1
                if rr == grp:
                    rr = 0
                    q += 1


@inlined
def _aligned(gbase, off, ld, fast, grp, gstride, span):
    """Whether every ``span`` elements of an operand's 8-element chunks (8: the chunk, 4: its
    halves) start on 2 * span bytes and lie wholly inside or outside its rows (and, for a
    grouped fast index, within one group): its copies of that many bytes."""
    ok = (gbase + uint64(2 * off)) % uint64(2 * span) == uint64(0) and ld % span == 0 \
        and fast % span == 0
    return ok and (grp >= fast or grp % span == 0 and gstride % span == 0)


@inlined
def _stage_halves(gbase, off, ld, rows, fast, r0, k0, kmajor, tile, count, sat, grp, gstride):
    """The slab at k0 of an operand whose chunks are not 16-byte aligned but whose halves are
    (``_aligned`` with span 4): each chunk by two 8-byte ``cp.async.ca`` copies into the same
    layout (``sat``: the stage's shared address), zeros past k or the rows (read from
    ``gbase + 2 * off``, as ``_issue``'s); a grouped chunk's halves may lie in two groups.
    Asynchronous as the 16-byte copies, where the element-by-element staging waits for each
    load (a 1x1 convolution on 14 x 14 maps, groups of 196 columns, ran at 0.16-0.26 of cuDNN
    so on an H100)."""
    width = tile >> 3
    for h in range(count):
        row, c, r, kc = _place(h, kmajor, width, r0)
        kk = k0 + kc
        dst = uint32(sat + uint32(_chunk_at(kmajor, row, c, width)))
        if kmajor:
            e, good = off + r * ld + kk, r < rows
            q, rr = 0, 0
        else:
            e, good = off + kk * ld, kk < rows
            q, rr = r // grp, r % grp
        for v in range(0, 8, 4):
            if kmajor:
                at_v, inside = e + v, good and kk + v < fast
            else:
                at_v, inside = e + q * gstride + rr, good and r + v < fast
                rr += 4
                if rr == grp:
                    rr = 0
                    q += 1
            src = gbase + uint64(2 * (at_v if inside else off))
            cp_async8(uint32(dst + uint32(2 * v)), src, uint32(8 if inside else 0))


@functools.lru_cache(maxsize=None)
def hmma_kernel(ta, tb, bm=128, narrow=False):
    """The pipelined float16 GEMM for layout (ta, tb) (kernels/gemm.py's; A k-major when
    ta == 0, B k-major when tb == 1) with bm x 128 tiles (bm 128 or 64), two blocks resident
    per SM (launch bounds: 128 registers). ``narrow``: an operand that is not 16-byte aligned
    is copied by 8-byte cp.async where it can be (``_stage_halves``), not element by element:
    a variant of its own, so that the aligned GEMMs keep their registers (ptxas, sm_90: the
    plain variants' spills are as before it; with 4-byte copies too, layout 10's 128-row
    tiles spilled 1428 bytes in place of 316, so those were left out)."""
    a_kmaj, b_kmaj = ta == 0, tb == 1
    if bm not in (64, 128):
        raise ValueError(f"hmma_kernel: tile rows must be 64 or 128, not {bm}")
    MT = bm // 32           # noqa: N806 -- a warp's 16-row mma tiles down
    WM = bm // 2            # noqa: N806 -- a warp's rows
    ACH = bm // 64          # noqa: N806 -- A chunks per thread per slab
    A_BYTES = bm * BK * 2   # noqa: N806
    STAGE = A_BYTES + BN * BK * 2   # noqa: N806

    @inlined
    def fill(a, b, abase, bbase, offa, offb, lda, ldb, i0, j0, k0, at, vec, va, vb, am, afast,
             bn_, bfast, astep, bstep, kdim, sh, sbase, gpa, sda, kca, oka, gpb, sdb, kcb, okb,
             ga, gsa, gb, gsb, na, nb):
        """The slabs of A and B at k0 into the stage at byte ``at``: by 16-byte cp.async
        (``vec`` both, else each operand whose alignment ``va`` / ``vb`` allows), by 8-byte
        halves where ``na`` / ``nb`` (the narrow variant) or element by element."""
        if vec or va:
            _issue(gpa, sda, kca, oka, ACH, k0, kdim, astep, uint32(at),
                   abase + uint64(2 * offa))
        elif narrow and na:
            _stage_halves(abase, offa, lda, am, afast, i0, k0, a_kmaj, bm, ACH,
                          uint32(sbase + uint32(at)), ga, gsa)
        else:
            _stage_scalar(a, offa, lda, am, afast, i0, k0, kdim, a_kmaj, bm, ACH, sh, at, ga,
                          gsa)
        if vec or vb:
            _issue(gpb, sdb, kcb, okb, 2, k0, kdim, bstep, uint32(at),
                   bbase + uint64(2 * offb))
        elif narrow and nb:
            _stage_halves(bbase, offb, ldb, bn_, bfast, j0, k0, b_kmaj, BN, 2,
                          uint32(sbase + uint32(at + A_BYTES)), gb, gsb)
        else:
            _stage_scalar(b, offb, ldb, bn_, bfast, j0, k0, kdim, b_kmaj, BN, 2, sh,
                          at + A_BYTES, gb, gsb)

    @inlined
    def mainloop(a, b, abase, bbase, offa, offb, lda, ldb, m, n, kdim, i0, j0, vec, sh, sbase,
                 c_reg, af, gpa, sda, kca, oka, gpb, sdb, kcb, okb, a_row, a_sub, b_row, b_sub,
                 grps, va, vb, na, nb):
        """One tile's k loop: ``vec`` (a compile-time constant) both operands by 16-byte
        cp.async, else each as its alignment allows (``fill``)."""
        ga, gsa, gb, gsb = grps[0], grps[1], grps[2], grps[3]
        am, afast = (m, kdim) if a_kmaj else (kdim, m)       # (rows, contiguous extent)
        bn_, bfast = (n, kdim) if b_kmaj else (kdim, n)
        astep = uint64(2) if a_kmaj else uint64(2 * lda)
        bstep = uint64(2) if b_kmaj else uint64(2 * ldb)
        nk = (kdim + BK - 1) // BK
        _chunks(abase, offa, lda, am, afast, i0, a_kmaj, bm, ACH, sbase, gpa, sda, kca, oka,
                ga, gsa)
        _chunks(bbase, offb, ldb, bn_, bfast, j0, b_kmaj, BN, 2, sbase + uint32(A_BYTES), gpb,
                sdb, kcb, okb, gb, gsb)
        for s in range(STAGES - 1):
            if s < nk:
                fill(a, b, abase, bbase, offa, offb, lda, ldb, i0, j0, s * BK, s * STAGE, vec,
                     va, vb, am, afast, bn_, bfast, astep, bstep, kdim, sh, sbase, gpa, sda, kca,
                     oka, gpb, sdb, kcb, okb, ga, gsa, gb, gsb, na, nb)
            cp_async_commit()
        for kt in range(nk):
            cp_async_wait1()        # slab kt has landed (this thread's copies) ...
            cuda.syncthreads()      # ... everyone's, and slab kt-1 is consumed
            nxt = kt + STAGES - 1
            if nxt < nk:
                fill(a, b, abase, bbase, offa, offb, lda, ldb, i0, j0, nxt * BK,
                     (nxt % STAGES) * STAGE, vec, va, vb, am, afast, bn_, bfast, astep, bstep,
                     kdim, sh, sbase, gpa, sda, kca, oka, gpb, sdb, kcb, okb, ga, gsa, gb, gsb,
                     na, nb)
            cp_async_commit()
            sa = uint32(sbase + uint32((kt % STAGES) * STAGE))
            sb = uint32(sa + uint32(A_BYTES))
            for ks in range(BK // 16):
                for mt in range(MT):
                    if a_kmaj:
                        p = _chunk_at(True, a_row + 16 * mt, a_sub + 2 * ks, 4)
                        af[mt, 0], af[mt, 1], af[mt, 2], af[mt, 3] = \
                            ldmatrix_x4(uint32(sa + uint32(p)))
                    else:
                        p = _chunk_at(False, a_row + 16 * ks, a_sub + 2 * mt, bm >> 3)
                        af[mt, 0], af[mt, 1], af[mt, 2], af[mt, 3] = \
                            ldmatrix_x4_trans(uint32(sa + uint32(p)))
                for np_ in range(NT8 // 2):     # two 8-column tiles at a time
                    if b_kmaj:
                        p = _chunk_at(True, b_row + 16 * np_, b_sub + 2 * ks, 4)
                        b0, b1, b2, b3 = ldmatrix_x4(uint32(sb + uint32(p)))
                    else:
                        p = _chunk_at(False, b_row + 16 * ks, b_sub + 2 * np_, BN >> 3)
                        b0, b1, b2, b3 = ldmatrix_x4_trans(uint32(sb + uint32(p)))
                    for mt in range(MT):
                        _mma(c_reg, mt, 2 * np_, af, b0, b1)
                        _mma(c_reg, mt, 2 * np_ + 1, af, b2, b3)
        cp_async_wait0()
        cuda.syncthreads()      # the slabs are free: C goes out through them

    @inlined
    def drain(c, c_reg, out, coff, ldc, m, n, i0, j0, h, wy, wx, g, q, beta, bias, boff,
              epi, zero):
        _spill(c_reg, out, h, wy, wx, g, q)
        cuda.syncthreads()
        _write(c, out, coff, ldc, m, n, i0, j0, h, WM, beta, bias, boff, epi, zero)
        cuda.syncthreads()

    def kernel(a, b, c, bias, dims, lds, grps, batch, beta, epi, acc, table, cg):
        sh = _slabs()
        sbase = shared_address(sh)
        zero = acc[0]
        m, n, kdim = dims
        lda, ldb, ldc = lds
        gc, gsc = grps[4], grps[5]
        nz1, nz2, a1, a2, b1, b2, c1, c2 = batch
        t = cuda.threadIdx.x
        lane = t & 31
        wy, wx = t >> 7, (t >> 5) & 3
        g, q = lane >> 2, lane & 3
        # this lane's ldmatrix rows (module docstring): A's 16 x 16 pieces as matrices
        # (rows 0-7 | 8-15) x (k 0-7 | 8-15) in the order of the mma's a0..a3; B's two 8-column
        # tiles as (k 0-7, k 8-15) of columns 0-7, then of columns 8-15
        lr, lj = lane & 7, lane >> 3
        a_row = wy * WM + lr + 8 * (lj & 1) if a_kmaj else lr + 8 * (lj >> 1)
        a_sub = lj >> 1 if a_kmaj else (wy * WM + 8 * (lj & 1)) >> 3
        b_row = wx * 32 + lr + 8 * (lj >> 1) if b_kmaj else lr + 8 * (lj & 1)
        b_sub = lj & 1 if b_kmaj else (wx * 32 + 8 * (lj >> 1)) >> 3
        abase, bbase = address(a), address(b)
        c_reg = cuda.local.array((MT, NT8, 4), dtype=float32)
        af = cuda.local.array((MT, 4), dtype=uint32)
        gpa = cuda.local.array(ACH, dtype=uint64)
        gpb = cuda.local.array(2, dtype=uint64)
        sda = cuda.local.array(ACH, dtype=uint32)
        sdb = cuda.local.array(2, dtype=uint32)
        kca = cuda.local.array(ACH, dtype=int64)
        kcb = cuda.local.array(2, dtype=int64)
        oka = cuda.local.array(ACH, dtype=boolean)
        okb = cuda.local.array(2, dtype=boolean)
        afast = kdim if a_kmaj else m
        bfast = kdim if b_kmaj else n
        for z in range(cuda.blockIdx.z, nz1 * nz2, cuda.gridDim.z):
            z1, z2 = z // nz2, z % nz2
            offa, offb = z1 * a1 + z2 * a2, z1 * b1 + z2 * b2
            # 16-byte copies need every chunk 16-byte aligned and wholly in or out of its row;
            # 8-byte ones, every half of it
            va = _aligned(abase, offa, lda, afast, grps[0], grps[1], 8)
            vb = _aligned(bbase, offb, ldb, bfast, grps[2], grps[3], 8)
            na = narrow and _aligned(abase, offa, lda, afast, grps[0], grps[1], 4)
            nb = narrow and _aligned(bbase, offb, ldb, bfast, grps[2], grps[3], 4)
            for i0 in range(cuda.blockIdx.y * bm, m, cuda.gridDim.y * bm):
                for j0 in range(cuda.blockIdx.x * BN, n, cuda.gridDim.x * BN):
                    for i in range(MT):
                        for j in range(NT8):
                            for r in range(4):
                                c_reg[i, j, r] = zero
                    if va and vb:   # (two calls: the common loop compiled without the other)
                        mainloop(a, b, abase, bbase, offa, offb, lda, ldb, m, n, kdim, i0, j0,
                                 True, sh, sbase, c_reg, af, gpa, sda, kca, oka, gpb, sdb, kcb,
                                 okb, a_row, a_sub, b_row, b_sub, grps, va, vb, na, nb)
                    else:
                        mainloop(a, b, abase, bbase, offa, offb, lda, ldb, m, n, kdim, i0, j0,
                                 False, sh, sbase, c_reg, af, gpa, sda, kca, oka, gpb, sdb, kcb,
                                 okb, a_row, a_sub, b_row, b_sub, grps, va, vb, na, nb)
                    out = _words()
                    coff = z1 * c1 + z2 * c2 + (j0 + (t & 127)) // gc * gsc \
                        + (j0 + (t & 127)) % gc
                    # 32 rows of each warp a pass, h a constant in each call (c_reg's
                    # indices stay constants: registers)
                    drain(c, c_reg, out, coff, ldc, m, n, i0, j0, 0, wy, wx, g, q, beta, bias,
                          z1 * m, epi, zero)
                    if MT == 4:
                        drain(c, c_reg, out, coff, ldc, m, n, i0, j0, 1, wy, wx, g, q, beta,
                              bias, z1 * m, epi, zero)

    kernel.__name__ = kernel.__qualname__ = \
        f"gemm_{ta}{tb}_{bm}x{BN}_hmma_pipe{'_narrow' if narrow else ''}"
    return bounded_jit(kernel, THREADS, 2)


@inlined
def _spill(c_reg, out, h, wy, wx, g, q):
    """Rows 32h .. 32h + 31 of each warp's accumulators into ``out`` (float32, rows of CP
    words: row wy*32 + r, column wx*32 + c): the mma's fragment layout, lane 4g + q at rows
    g, g + 8 and columns 2q, 2q + 1 of each 16 x 8 tile."""
    for mt in range(2):
        for j in range(NT8):
            for r in range(4):
                row = wy * 32 + mt * 16 + g + 8 * (r >> 1)
                out[uint64(row * CP + wx * 32 + j * 8 + 2 * q + (r & 1))] = \
                    c_reg[2 * h + mt, j, r]


@inlined
def _write(c, out, coff, ldc, m, n, i0, j0, h, wm, beta, bias, boff, epi, zero):
    """C = act(``out``'s 64 x 128 rows (+ bias) (+ beta * C, read only where beta != 0, so an
    uninitialised C may hold NaN)), ``epi`` as kernels/common.py's EPILOGUE says: thread t writes
    column t % 128 (C's offset ``coff``, its grouped index computed once) of rows t // 128 + 2e,
    consecutive threads to consecutive columns; staged row rs is row (rs // 32)*wm + 32h + rs % 32
    of the tile."""
    t = cuda.threadIdx.x
    col = t & 127
    lo = relu_floor(epi, zero)
    if j0 + col < n:
        for e in range(64 * BN // THREADS):
            rs = (t >> 7) + 2 * e
            gi = i0 + (rs >> 5) * wm + 32 * h + (rs & 31)
            if gi < m:
                v = out[uint64(rs * CP + col)]
                if epi & EPI_BIAS:
                    v += bias[gi + boff] + zero
                at = uint64(coff + gi * ldc)
                if beta != zero:
                    v += beta * (c[at] + zero)
                c[at] = clip(v, lo)


LAYOUTS = ((0, 0), (1, 0), (0, 1))
VARIANTS = {f"gemm_{ta}{tb}_hmma{bm}{'n' if narrow else ''}_kernel":
            hmma_kernel(ta, tb, bm, narrow)
            for ta, tb in LAYOUTS for bm in (128, 64) for narrow in (False, True)}
# the same kernels under the names of their other C type, for the PTX checks (C in float16,
# or in float32: the gradients' and the split forward's workspace, kernels/gemm.py)
VARIANTS.update({name.replace("_kernel", "_acc_kernel"): k for name, k in VARIANTS.items()})


def SIGNATURES(t, acc):  # noqa: N802 -- kernels/__init__.py's convention
    """float16 data only; C in the data type or (the *_acc names) the accumulation type."""
    if str(t) != "float16":
        return {}
    from numba import int32
    from numba.core.types import UniTuple
    a, z = t[::1], acc[::1]
    ints = (UniTuple(int64, 3), UniTuple(int64, 3), UniTuple(int64, 6), UniTuple(int64, 8))
    tail = (acc, int64, z, int32[::1], UniTuple(int64, 13))
    return {name: (a, a, z if name.endswith("_acc_kernel") else a, a) + ints + tail
            for name in VARIANTS}


ONLY_DTYPES = {name: ("float16",) for name in VARIANTS}   # HMMA: float16 data only
NO_FLOAT64 = tuple(VARIANTS)
# 32-bit products on purpose: shared-memory offsets (a stage's, below 48 KB)
INDEX32 = tuple(VARIANTS)
