"""Recurrent cells (rnn_relu, rnn_tanh, lstm, gru), forward and backward through time.

The ops (dnnkit/ops/rnn_numba.py) do the matrix products with the GEMM (kernels/gemm.py): the
input projection of all steps at once before the time loop, per step the recurrent product
h . R^T; these kernels do the rest. Per step, both directions of a layer advance together:
direction 0 is at time t = s, direction 1 at t = len_n - 1 - s (each sequence reversed over
its own valid steps); sequence n is inactive at steps s >= len_n, where its state is carried
unchanged and its output y[s, n] is zero.

Buffers (flat, C order; D directions, T steps, N sequences, H units, G gates, S = G for rnn
and lstm, 4 for gru):
    ws   (D, T, N, S*H) acc, time-indexed: the GEMM's input projection W x (pre-activation);
         the cell overwrites it with what backward needs: rnn h'; lstm i, f, g, o; gru r, z,
         n and hn = R_n h + b_Rn
    gr   (P, D, N, G*H) acc: this step's h . R^T (no bias) as P partial sums over slices of
         H (split-k: the per-step GEMM alone has too few output tiles to fill the GPU)
    hp   (D, slots, N, H) data: the h state; step s reads slot ``hin`` and writes ``hout``
         (training: slots = T + 1, hin = s, hout = s + 1, so hp keeps every step's h_prev in
         step order for the weight gradient; inference: one slot updated in place)
    cp   (D, slots, N, H) acc: the lstm c state, same slots
    dgx  (D, T, N, G*H) acc, time-indexed: gradient of the input pre-activations
    dgr  (D, T, N, G*H) acc, step-indexed: gradient of the recurrent pre-activations (for gru
         the n slot holds d(hn), which differs from the input side's d(n pre-activation))
An LSTM with a projection (P = proj_size) adds, with h P wide (hp, h0, hy, y, dh):
    hc   (D, T or 1, N, H) data: o*tanh(c') of each step (training keeps all T), which the
         projection GEMM reads: pr (D, N, P) acc = hc_s . W_hr^T, turned into h', y and hy by
         rnn_proj_fwd_kernel
    dpr  (D, T, N, P) acc, step-indexed: dL/dh' (rnn_proj_bwd_kernel), from which a GEMM gives
         d(hc) (D, N, H), the E the cell backward reads with PROJB
Weights and biases are read from the flat parameter buffer w (layout: dnnkit/rnn_layout.py):
a direction's 2G biases are contiguous, input ones first, from ``boff + d*pstride``.

Mode ids: 0 rnn_relu, 1 rnn_tanh, 2 lstm, 3 gru (dnnkit/ops/rnn_numba.py).
"""

import math

from numba import cuda, float32

from .bounds import inlined
from .common import REDUCE_SUM, block_reduce, sigmoid

RELU, TANH, LSTM, GRU = 0, 1, 2, 3
# forward flags
SKIP, REC, H0, C0, PROJ = 1, 2, 4, 8, 16
# backward flags
DHY, DCY, PROJB = 1, 2, 4


@inlined
def _gates(mode):
    return 4 if mode == LSTM else (3 if mode == GRU else 1)


@cuda.jit(device=True, inline=True)   # LLVM's inlining (bounds.inlined) changed the code
def _time(d, s, ln):
    return s if d == 0 else ln - 1 - s


@inlined
def _element(e, nh, nb, lens):
    """(unit, sequence, direction, the sequence's length, the (d, n, u) offset in hx/hy-like
    arrays) of flat element e of a (D, N, H) step, unit fastest."""
    u = e % nh
    n = (e // nh) % nb
    d = e // (nh * nb)
    return u, n, d, lens[n], (d * nb + n) * nh + u


@cuda.jit(cache=True)
def rnn_cell_fwd_kernel(ws, gr, w, x, h0, c0, hp, cp, y, hy, cy, lens, geo, acc):
    """One time step of one layer, both directions: gates (pre-activations = input projection
    or, with SKIP, x itself + input bias + recurrent product (REC, else 0: step 0 with no hx)
    + recurrent bias), activations, state update, output y, and at the last step hy/cy.

        rnn:  h' = act(a)                       lstm: c' = f*c + i*g,  h' = o*tanh(c')
        gru:  r, z = sigmoid(.), hn = R_n h + b_Rn, n = tanh(W_n x + b_Wn + r*hn),
              h' = (1 - z)*n + z*h
    With PROJ (an LSTM with a projection, h P wide: hp, h0 and hy hold P units per sequence)
    the kernel writes o*tanh(c') into ``y`` as the buffer hc (D, T or 1, N, H) (0 past a
    sequence's end) for the projection GEMM, and leaves hp, y and hy to rnn_proj_fwd_kernel;
    at step 0 of a training forward it still copies h0 into hp's slot 0 (its first P units).
    Thread mapping: one thread per (d, n, unit) element, unit fastest (coalesced), in a
    grid-stride loop over D*N*H. Traffic per element: reads G pre-activations, P*G partial
    recurrent products, 2G biases (cached), h (and c); writes S stored values, y, h (and c).
    geo = (mode, s, T, N, H, D, S, flags, hin, hout, slots, boff, pstride, P, Hp), Hp the
    width of h (H, or the projection's)."""
    zero = acc[0]
    one = zero + float32(1)
    mode, s, nt, nb, nh, nd, ns, flags, hin, hout, slots, boff, pstride, parts, np_ = geo
    g = _gates(mode)
    gh = g * nh
    proj = flags & PROJ
    for e in range(cuda.grid(1), nd * nb * nh, cuda.gridsize(1)):
        u, n, d, ln, k = _element(e, nh, nb, lens)
        st = d * slots * nb * nh + n * nh + u          # (d, slot 0, n, u) in cp (and hp)
        stp = d * slots * nb * np_ + n * np_ + u       # the same in a P-wide hp
        kp = (d * nb + n) * np_ + u                    # (d, n, u) in h0 / hy
        if s == 0:
            hprev = h0[kp] + zero if (flags & H0 and u < np_) else zero
            cprev = c0[k] + zero if (mode == LSTM and flags & C0) else zero
            if hin != hout:                            # training: keep h_prev, c_prev of step 0
                if u < np_:
                    hp[stp + hin * nb * np_] = hprev
                if mode == LSTM:
                    cp[st + hin * nb * nh] = cprev
        else:
            hprev = hp[st + hin * nb * nh] + zero if not proj else zero
            cprev = cp[st + hin * nb * nh] + zero if mode == LSTM else zero
        hnew, cnew = hprev, cprev
        hc = zero
        if s < ln:
            t = _time(d, s, ln)
            row = ((d * nt + t) * nb + n) * ns * nh + u
            bw = boff + d * pstride + u
            rr = (d * nb + n) * gh + u
            # a[q] = input term + input bias + recurrent term + recurrent bias, gate q
            a0 = zero
            a1 = zero
            a2 = zero
            a3 = zero
            for q in range(g):
                v = x[(t * nb + n) * nh + u] + zero if flags & SKIP else ws[row + q * nh]
                v += w[bw + q * nh] + zero
                rec = w[bw + gh + q * nh] + zero
                if flags & REC:
                    for p in range(parts):
                        rec += gr[p * nd * nb * gh + rr + q * nh]
                if mode == GRU and q == 2:
                    a3 = rec                           # hn: enters through the reset gate
                    a2 = v
                else:
                    v += rec
                    if q == 0:
                        a0 = v
                    elif q == 1:
                        a1 = v
                    elif q == 2:
                        a2 = v
                    else:
                        a3 = v
            if mode == RELU:
                hnew = a0 if a0 > zero else zero
                ws[row] = hnew
            elif mode == TANH:
                hnew = math.tanh(a0)
                ws[row] = hnew
            elif mode == LSTM:
                gi, gf = sigmoid(a0, one), sigmoid(a1, one)
                gg, go = math.tanh(a2), sigmoid(a3, one)
                cnew = gf * cprev + gi * gg
                hnew = go * math.tanh(cnew)
                hc = hnew
                ws[row] = gi
                ws[row + nh] = gf
                ws[row + 2 * nh] = gg
                ws[row + 3 * nh] = go
            else:
                gr_, gz = sigmoid(a0, one), sigmoid(a1, one)
                gn = math.tanh(a2 + gr_ * a3)
                hnew = (one - gz) * gn + gz * hprev
                ws[row] = gr_
                ws[row + nh] = gz
                ws[row + 2 * nh] = gn
                ws[row + 3 * nh] = a3
            if not proj:
                y[(t * nb + n) * nd * nh + d * nh + u] = hnew
        elif not proj:
            y[(s * nb + n) * nd * nh + d * nh + u] = zero   # past the end: every s >= len once
        if proj:                                       # hc (D, T or 1, N, H)
            hs = s if hin != hout else 0
            y[((d * (nt if hin != hout else 1) + hs) * nb + n) * nh + u] = hc
        else:
            hp[st + hout * nb * nh] = hnew
        if mode == LSTM:
            cp[st + hout * nb * nh] = cnew
        if s == nt - 1:                                # carried past the end: own last step
            if not proj:
                hy[k] = hnew
            if mode == LSTM:
                cy[k] = cnew


@cuda.jit(cache=True)
def rnn_proj_fwd_kernel(pr, hp, y, hy, lens, geo):
    """The projected LSTM's step, after the projection GEMM wrote pr (D, N, P) = hc . W_hr^T:
    h' = pr for a sequence still running (to y at its time, the state's slot ``hout``, and hy
    at the last step), else h carried from slot ``hin`` and y 0 (every s >= len once).
    One thread per (d, n, unit) element, unit fastest. Traffic: reads pr (or h), writes h, y.
    geo = (s, T, N, P, D, hin, hout, slots)."""
    s, nt, nb, np_, nd, hin, hout, slots = geo
    for e in range(cuda.grid(1), nd * nb * np_, cuda.gridsize(1)):
        u, n, d, ln, k = _element(e, np_, nb, lens)
        st = d * slots * nb * np_ + n * np_ + u
        if s < ln:
            v = pr[k]
            hp[st + hout * nb * np_] = v
            y[(_time(d, s, ln) * nb + n) * nd * np_ + d * np_ + u] = v
        else:
            hp[st + hout * nb * np_] = hp[st + hin * nb * np_]
            y[(s * nb + n) * nd * np_ + d * np_ + u] = 0
        if s == nt - 1:
            hy[k] = hp[st + hout * nb * np_]


@cuda.jit(cache=True)
def rnn_proj_bwd_kernel(dy, dh, dhy, dhx, dpr, lens, geo, acc):
    """The projected LSTM's backward step, first of the step's launches: E = the gradient
    reaching h' (dhy at s = T-1, else dh's slot 0 plus the split-k partial sums of the later
    step's dgr . R) + dy at the step's time, written to dpr (D, T, N, P) step-indexed (then
    d(hc) = dpr_s . W_hr by a GEMM, dW_hr = dpr^T . hc after the loop); the part of d(h_prev)
    not through R (0 for a running sequence, E itself carried past its end, where dpr is 0)
    goes to dh's slot 0 (at s = 0 to dhx). One thread per (d, n, unit), unit fastest.
    Traffic: reads the carries and dy, writes dpr and the carry. geo = (s, T, N, P, D, flags,
    parts)."""
    zero = acc[0]
    s, nt, nb, np_, nd, flags, parts = geo
    for e in range(cuda.grid(1), nd * nb * np_, cuda.gridsize(1)):
        u, n, d, ln, k = _element(e, np_, nb, lens)
        if s == nt - 1:
            ein = dhy[k] + zero if flags & DHY else zero
        else:
            ein = dh[k]
            for p in range(parts):
                ein += dh[(p + 1) * nd * nb * np_ + k]
        row = ((d * nt + s) * nb + n) * np_ + u
        direct = zero
        if s < ln:
            dpr[row] = ein + dy[(_time(d, s, ln) * nb + n) * nd * np_ + d * np_ + u]
        else:
            dpr[row] = zero
            direct = ein
        if s == 0:
            dhx[k] = direct
        else:
            dh[k] = direct


@cuda.jit(cache=True)
def rnn_cell_bwd_kernel(ws, hp, cp, dy, dh, dc, dhy, dcy, dhx, dcx, dgx, dgr, lens, geo, acc):
    """One step of backpropagation through time (steps in reverse), both directions. Before
    step s, dh/dc hold the gradient reaching h'/c' of step s from later steps (at s = T - 1:
    dhy/dcy); E = that + dy at the step's time. Writes dgx (time-indexed) and dgr (step-
    indexed), and the part of d(h_prev) that does not go through R (gru: z*E; carried: E) into
    dh's slot 0 (at s = 0 into dhx); the caller's GEMM then writes dgr . R into dh's slots
    1..P (at s = 0: adds it to dhx). Inactive steps carry
    dh/dc and write zero gradients. Derivatives (from the stored activations):
        rnn:  da = E * act'(h')
        lstm: dc~ = dc + E*o*(1 - tanh(c')^2); di, df, dg, do = dc~*g, dc~*c, dc~*i, E*tanh(c');
              pre-activation gradients times sigmoid'/tanh'; d(c_prev) = dc~*f
        gru:  dn = E*(1 - z)*(1 - n^2); dr = dn*hn*r*(1 - r); dz = E*(h - n)*z*(1 - z);
              input side [dr, dz, dn], recurrent side [dr, dz, dn*r]; d(h_prev) direct = E*z
    dh is (1 + P, D, N, H): slot 0 the direct part, slots 1..P the GEMM's split-k partial
    sums of dgr . R (summed here). With PROJB (a projected LSTM) E is dh itself, (D, N, H):
    d(o*tanh(c')) from rnn_proj_bwd_kernel and the GEMM after it, and the kernel writes only
    the c carry (dc, at s = 0 dcx). Thread mapping as the forward kernel. Traffic per element:
    reads S stored values, dy, h or c, the carries; writes 2G gradients and the carries.
    geo = (mode, s, T, N, H, D, S, flags, slots, P)."""
    zero = acc[0]
    one = zero + float32(1)
    mode, s, nt, nb, nh, nd, ns, flags, slots, parts = geo
    g = _gates(mode)
    gh = g * nh
    proj = flags & PROJB
    for e in range(cuda.grid(1), nd * nb * nh, cuda.gridsize(1)):
        u, n, d, ln, k = _element(e, nh, nb, lens)
        if proj:
            ein = dh[k] + zero
        elif s == nt - 1:
            ein = dhy[k] + zero if flags & DHY else zero
        else:
            ein = dh[k]
            for p in range(parts):
                ein += dh[(p + 1) * nd * nb * nh + k]
        if s == nt - 1:
            cin = dcy[k] + zero if (mode == LSTM and flags & DCY) else zero
        else:
            cin = dc[k] if mode == LSTM else zero
        rrow = ((d * nt + s) * nb + n) * gh + u        # step-indexed dgr row
        dout, cout = ein, cin
        if s >= ln:
            for q in range(g):
                dgr[rrow + q * nh] = zero
                dgx[rrow + q * nh] = zero              # time s >= len: every such t once
        else:
            t = _time(d, s, ln)
            E = ein if proj else ein + dy[(t * nb + n) * nd * nh + d * nh + u]
            row = ((d * nt + t) * nb + n) * ns * nh + u
            xrow = ((d * nt + t) * nb + n) * gh + u
            st = (d * slots + s) * nb * nh + n * nh + u
            if mode == RELU or mode == TANH:
                hv = ws[row]
                if mode == RELU:
                    da = E if hv > zero else zero
                else:
                    da = E * (one - hv * hv)
                dgx[xrow] = da
                dgr[rrow] = da
                dout = zero
            elif mode == LSTM:
                gi, gf, gg, go = ws[row], ws[row + nh], ws[row + 2 * nh], ws[row + 3 * nh]
                cprev = cp[st]
                tc = math.tanh(cp[st + nb * nh])       # c' of this step: the next slot
                dct = cin + E * go * (one - tc * tc)
                vi = dct * gg * gi * (one - gi)
                vf = dct * cprev * gf * (one - gf)
                vg = dct * gi * (one - gg * gg)
                vo = E * tc * go * (one - go)
                dgx[xrow] = vi
                dgx[xrow + nh] = vf
                dgx[xrow + 2 * nh] = vg
                dgx[xrow + 3 * nh] = vo
                dgr[rrow] = vi
                dgr[rrow + nh] = vf
                dgr[rrow + 2 * nh] = vg
                dgr[rrow + 3 * nh] = vo
                dout = zero
                cout = dct * gf
            else:
                gr_, gz, gn, hn = ws[row], ws[row + nh], ws[row + 2 * nh], ws[row + 3 * nh]
                hprev = hp[st] + zero
                dn = E * (one - gz) * (one - gn * gn)
                vr = dn * hn * gr_ * (one - gr_)
                vz = E * (hprev - gn) * gz * (one - gz)
                dgx[xrow] = vr
                dgx[xrow + nh] = vz
                dgx[xrow + 2 * nh] = dn
                dgr[rrow] = vr
                dgr[rrow + nh] = vz
                dgr[rrow + 2 * nh] = dn * gr_
                dout = E * gz
        if s == 0:
            if not proj:
                dhx[k] = dout
            if mode == LSTM:
                dcx[k] = cout
        else:
            if not proj:
                dh[k] = dout
            if mode == LSTM:
                dc[k] = cout


@cuda.jit(cache=True)
def rnn_bias_bwd_kernel(dgx, dgr, dw, geo, acc):
    """Bias gradients of one layer: column sums over the T*N rows of dgx (input biases) and
    dgr (recurrent biases), written to dw at ``boff + d*pstride`` (2G*H per direction).
    Thread mapping: blockIdx.y walks directions; a block of (bx, by) threads takes bx
    consecutive columns (coalesced row reads), its by threads of a column stride over the
    rows and combine through a shared tree (bx*by acc elements, sized at launch); blocks
    walk column tiles in a grid-stride loop. Traffic: reads dgx and dgr once.
    geo = (rows, GH, D, boff, pstride)."""
    red = cuda.shared.array(0, dtype=acc.dtype)
    zero = acc[0]
    rows, gh, nd, boff, pstride = geo
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    bx, by = cuda.blockDim.x, cuda.blockDim.y
    for d in range(cuda.blockIdx.y, nd, cuda.gridDim.y):
        for j0 in range(cuda.blockIdx.x * bx, 2 * gh, cuda.gridDim.x * bx):
            j = j0 + tx
            part = zero
            if j < 2 * gh:
                col = d * rows * gh + j % gh
                for r in range(ty, rows, by):
                    part += dgx[col + r * gh] if j < gh else dgr[col + r * gh]
            total = block_reduce(red, part, REDUCE_SUM)
            if ty == 0 and j < 2 * gh:
                dw[boff + d * pstride + j] = total


@cuda.jit(cache=True)
def rnn_skip_bwd_kernel(dgx, dx, geo, acc):
    """dx of a "skip" layer (its input enters every gate as it is): dx[t, n, u] =
    sum over directions and gates of dgx[d, t, n, q*H + u]. One thread per (t, n, u) in a
    grid-stride loop (coalesced). Traffic: reads dgx once, writes dx. geo = (T, N, H, D, G)."""
    zero = acc[0]
    nt, nb, nh, nd, g = geo
    for e in range(cuda.grid(1), nt * nb * nh, cuda.gridsize(1)):
        u = e % nh
        tn = e // nh
        v = zero
        for d in range(nd):
            for q in range(g):
                v += dgx[(d * nt * nb + tn) * g * nh + q * nh + u]
        dx[e] = v


@cuda.jit(cache=True)
def rnn_transpose_fwd_kernel(src, dst, geo):
    """dst (B, A, F) = src (A, B, F) with the first two axes swapped (batch_first <->
    time-major). One thread per destination element, consecutive threads on consecutive
    destination elements (the F axis is contiguous in both). geo = (A, B, F)."""
    na, nb, nf = geo
    for e in range(cuda.grid(1), na * nb * nf, cuda.gridsize(1)):
        f = e % nf
        a = (e // nf) % na
        b = e // (nf * na)
        dst[e] = src[(a * nb + b) * nf + f]


def SIGNATURES(t, acc):
    from numba import int32, int64
    from numba.core.types import UniTuple
    a, z, i = t[::1], acc[::1], int32[::1]
    return {"rnn_cell_fwd_kernel": (z, z, a, a, a, a, a, z, a, a, a, i, UniTuple(int64, 15), z),
            "rnn_proj_fwd_kernel": (z, a, a, a, i, UniTuple(int64, 8)),
            "rnn_proj_bwd_kernel": (a, z, a, a, z, i, UniTuple(int64, 7), z),
            "rnn_cell_bwd_kernel": (z, a, z, a, z, z, a, a, a, a, z, z, i,
                                    UniTuple(int64, 10), z),
            "rnn_bias_bwd_kernel": (z, z, a, UniTuple(int64, 5), z),
            "rnn_skip_bwd_kernel": (z, a, UniTuple(int64, 5), z),
            "rnn_transpose_fwd_kernel": (a, a, UniTuple(int64, 3))}
