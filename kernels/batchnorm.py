"""Batch normalization, forward (training and inference) and backward.

Every input is viewed as (N, C, S) flat in memory, with the statistics per channel c over the
N*S elements (n, s). Spatial mode on (N, C, *spatial) is (N, C, prod(spatial)); per-activation
mode is spatial mode on (N, C*prod(spatial), 1). Parameters and statistics are flat (C,) arrays
in the accumulation type (float32 for float16 and float32 data, float64 for float64).

Thread mapping, shared by every kernel that walks x (``_lanes``/``_loops``): a 1-D block of
T = sw*cw*by threads, thread t = (yi*cw + ci)*sw + si, where sw (a power of two) lanes walk
positions s, cw channels sit side by side and by lanes walk samples n. blockIdx.y (grid-stride)
picks a group of cw channels, blockIdx.x one of ``gridDim.x`` splits of the channel's elements.
- short rows (S <= sw): thread (si, ci, yi) owns position s = si of channel c and walks the
  samples n = yi + split*by, step by*splits. A warp reads sw consecutive positions of cw
  consecutive channels: with S == sw (e.g. S == 1, per-activation) fully contiguous addresses.
- long rows (S > sw; then sw = T, cw = by = 1): the block owns one channel; split = (so, sk)
  walks samples n = so, step splits_o, and within a row positions s = si + sk*T, step
  T*splits_i: a warp reads 32 consecutive elements.
The inner walk is unrolled by 4 (four independent loads in flight per thread) with a remainder
loop. Only the row start is computed per row: no division per element. Indices are int64.

Training forward = three kernels:
  1. ``batch_norm_stats_fwd_kernel``: each thread keeps Welford's (count, mean, M2) of
     x - k, k = the channel's first element (a pivot: x - k is exact when x is near k, so
     every later rounding is relative to the spread, not to |mean|). It takes four loads at a
     time as a group (group mean and M2 two-pass on registers, then Chan's update:
     delta = mg - m; m += delta*4/n'; M2 += M2g + delta^2*n*4/n', one division per four
     elements). The block merges its threads' triples with Chan's formula in a fixed
     shared-memory tree and writes one partial per (channel, split). No sum of squares is
     formed: E[x^2] - E[x]^2 in float32 loses every digit at mean 1e4, std 1. Reads x once.
  2. ``batch_norm_finalize_fwd_kernel``: one thread per channel merges its ``splits`` partials
     in split order: saved mean (k + the merged mean), saved 1/sqrt(var + eps) (biased var),
     running statistics (unbiased var: var * m/(m-1)). No float atomics anywhere, so results
     are bitwise repeatable for a given shape.
  3. ``batch_norm_apply_fwd_kernel``: y = (x - mean) * (gamma * invstd) + beta; also inference
     (``from_var``: invstd = 1/sqrt(var + eps), computed once per thread and channel).
     Subtracting the mean before scaling keeps y accurate when |mean| >> std. Reads x, writes y.
Backward = three kernels: ``batch_norm_reduce_bwd_kernel`` (per thread and tree sums of dy and
dy*(x - mean); reads x and dy), ``batch_norm_finalize_bwd_kernel`` (dbeta = sum dy, dgamma =
invstd * sum dy*(x - mean)), ``batch_norm_apply_bwd_kernel``:
    dx = gamma*invstd * (dy - dbeta/m - (x - mean) * invstd * dgamma/m)        (m = N*S)
reading x and dy, writing dx. Traffic: training forward 3 passes (x, x, y), inference 2,
backward 5 (x, dy, x, dy, dx); the per-channel partials are negligible.

Fused relu (``act`` = 1; ops.batch_norm_*(activation="relu")): the apply kernel writes
max(y, 0) in its one pass, and the two backward kernels that read dy take it through relu's
slope from the forward's output y (two more reads) — against a separate relu's 2 passes
forward and 3 backward (y, dy, dx), and one launch less each way. A residual (``has_z``; the
ops' ``residual``): the apply kernel adds z before the relu (one more read, against an add's
3 passes), and the backward's apply kernel writes the residual's gradient (the dy it takes).

The tree scratch is dynamic shared memory (3*T or 2*T elements of the accumulation type, sized
at launch; Numba's simulator allocates static shared arrays racily). ``acc`` is the
one-element array giving the accumulation type (see kernels/__init__.py).
"""

import math

from numba import cuda, float32, uint64

from .bounds import bounded_jit, inlined

UNROLL = 4          # the launcher sizes splits so each thread gets a few unrolled trips
MAX_THREADS = 256   # launch bound of the kernels that walk x: blocks of at most 256 threads
MIN_BLOCKS = 4      # ... and 4 of them per SM (50% occupancy): at most 64 registers. ptxas
                    # then spills 48-64 bytes of the float32 stats/reduce kernels (none of
                    # the apply kernels); unbounded they take 72-80. Measure before changing.


def _walker(kernel):
    """``cuda.jit`` with the launch bounds above (the simulator's jit takes none)."""
    return bounded_jit(kernel, MAX_THREADS, MIN_BLOCKS)


# ---------------------------------------------------------------- thread mapping

@inlined
def _lanes(sw, cw):
    """(si, ci, yi, by): this thread's position lane, channel slot and sample lane."""
    t = cuda.threadIdx.x
    return t % sw, (t // sw) % cw, t // (sw * cw), cuda.blockDim.x // (sw * cw)


@inlined
def _loops(n, c, s, sw, cw, splits_i):
    """This thread's walk over the elements of its channel (module docstring), as
    (first, rows, row_step, a0, a_main, a_end, d): ``rows`` rows starting at
    base = ch*s + first, then base += row_step; in a row, the elements base + a0 + j*d below
    base + a_end, four at a time while below base + a_main, then one at a time from where the
    unrolled loop stopped. ``while`` loops over offsets: a ``range`` with a run-time step
    costs a 64-bit division per row to count its trips."""
    si, ci, yi, by = _lanes(sw, cw)
    split = cuda.blockIdx.x
    if s > sw:   # long rows: samples outside, positions inside
        so, sk = split // splits_i, split % splits_i
        o_step = cuda.gridDim.x // splits_i
        rows = (n - so + o_step - 1) // o_step if so < n else 0
        k0, k_step, k_stride, k_end = si + sk * sw, sw * splits_i, 1, s
        first, row_step = so * c * s, o_step * c * s
    else:        # short rows: one position, samples inside
        rows = 1 if si < s else 0
        k0, k_step, k_stride, k_end = yi + split * by, by * cuda.gridDim.x, c * s, n
        first, row_step = si, 0
    d = k_step * k_stride
    return first, rows, row_step, k0 * k_stride, (k_end - 3 * k_step) * k_stride, \
        k_end * k_stride, d


@inlined
def _four(p, d):
    """The unrolled loop's four indices, unsigned: Numba then skips the negative-index
    wraparound (a compare and select per access, and registers to hold the array sizes)."""
    return uint64(p), uint64(p + d), uint64(p + 2 * d), uint64(p + 3 * d)


# ---------------------------------------------------------------- Welford / Chan

@cuda.jit(device=True, inline=True)   # LLVM's inlining (bounds.inlined) changed the code
def _merge(na, ma, qa, nb, mb, qb):
    """Chan et al.'s merge of two (count, mean, M2) triples; an empty b leaves a unchanged."""
    if nb == na - na:
        return na, ma, qa
    n = na + nb
    d = mb - ma
    r = nb / n
    return n, ma + d * r, qa + qb + d * d * na * r


@inlined
def _merge4(n, m, q, v0, v1, v2, v3):
    """Add four values: their exact-ish two-pass group statistics, then one Chan update (one
    division per four elements)."""
    quarter = float32(0.25)
    mg = ((v0 + v1) + (v2 + v3)) * quarter
    d0, d1, d2, d3 = v0 - mg, v1 - mg, v2 - mg, v3 - mg
    qg = (d0 * d0 + d1 * d1) + (d2 * d2 + d3 * d3)
    return _merge(n, m, q, n - n + float32(4), mg, qg)


@inlined
def _tree(sh, width, lane, slot, cw, by_lanes):
    """In-place fixed-order tree over the ``by_lanes`` lanes of each channel slot, for
    ``width`` interleaved arrays (3: Welford merge, 2: plain sums). Result at lane 0."""
    half = by_lanes // 2
    while half > 0:
        if lane < half:
            o = slot + half * cw
            t = cuda.blockDim.x
            if width == 3:
                a, b, c = _merge(sh[slot], sh[t + slot], sh[2 * t + slot],
                                 sh[o], sh[t + o], sh[2 * t + o])
                sh[slot], sh[t + slot], sh[2 * t + slot] = a, b, c
            else:
                sh[slot] += sh[o]
                sh[t + slot] += sh[t + o]
        cuda.syncthreads()
        half //= 2


# ---------------------------------------------------------------- forward

@_walker
def batch_norm_stats_fwd_kernel(x, part, n, c, s, sw, cw, splits_i, acc):
    """Per (channel, split) Welford partials of x - pivot: part[(q*splits + split)*c + ch] for
    q = 0 count, 1 mean, 2 M2 (splits = gridDim.x)."""
    sh = cuda.shared.array(0, dtype=acc.dtype)   # 3*T elements, sized at launch
    zero = acc[0]
    si, ci, yi, by = _lanes(sw, cw)
    first, rows, row_step, a0, a_main, a_end, d = _loops(n, c, s, sw, cw, splits_i)
    lane = yi * sw + si
    slot = lane * cw + ci
    t = cuda.blockDim.x
    splits = cuda.gridDim.x
    for g in range(cuda.blockIdx.y, (c + cw - 1) // cw, cuda.gridDim.y):
        ch = g * cw + ci
        cnt, mean, m2 = zero, zero, zero
        if ch < c:
            k = x[ch * s] + zero   # the channel's pivot (module docstring)
            base = ch * s + first
            for _ in range(rows):
                p = base + a0
                # eight loads in flight per thread before the two merges (with four, the
                # bytes in flight per SM bound it to ~2 TB/s on an H200: Little's law)
                while p < base + a_main - 4 * d:
                    i0, i1, i2, i3 = _four(p, d)
                    j0, j1, j2, j3 = _four(p + 4 * d, d)
                    v0, v1, v2, v3 = x[i0] + zero, x[i1] + zero, x[i2] + zero, x[i3] + zero
                    w0, w1, w2, w3 = x[j0] + zero, x[j1] + zero, x[j2] + zero, x[j3] + zero
                    cnt, mean, m2 = _merge4(cnt, mean, m2, v0 - k, v1 - k, v2 - k, v3 - k)
                    cnt, mean, m2 = _merge4(cnt, mean, m2, w0 - k, w1 - k, w2 - k, w3 - k)
                    p += 8 * d
                while p < base + a_main:
                    i0, i1, i2, i3 = _four(p, d)
                    cnt, mean, m2 = _merge4(cnt, mean, m2, x[i0] + zero - k, x[i1] + zero - k,
                                            x[i2] + zero - k, x[i3] + zero - k)
                    p += 4 * d
                while p < base + a_end:   # Welford, one element at a time
                    v = x[uint64(p)] + zero - k
                    cnt += float32(1)
                    delta = v - mean
                    mean += delta / cnt
                    m2 += delta * (v - mean)
                    p += d
                base += row_step
        sh[slot], sh[t + slot], sh[2 * t + slot] = cnt, mean, m2
        cuda.syncthreads()
        _tree(sh, 3, lane, slot, cw, sw * by)
        if lane == 0 and ch < c:
            q = cuda.blockIdx.x
            part[q * c + ch] = sh[slot]
            part[(splits + q) * c + ch] = sh[t + slot]
            part[(2 * splits + q) * c + ch] = sh[2 * t + slot]
        cuda.syncthreads()   # sh is reused by the next channel group


@cuda.jit(cache=True)
def batch_norm_finalize_fwd_kernel(x, part, splits, c, s, mean, invstd, run_mean, run_var,
                                   has_running, momentum, unbias, eps, acc):
    """One thread per channel (grid-stride): merge the partials in split order; write the
    saved mean (pivot + mean of x - pivot) and 1/sqrt(var + eps); with ``has_running``,
    update the running statistics in place: r = (1 - momentum) * r + momentum * batch value
    (the variance times ``unbias`` = m/(m-1))."""
    zero = acc[0]
    one = zero + float32(1)
    for ch in range(cuda.grid(1), c, cuda.gridsize(1)):
        cnt, m, q = zero, zero, zero
        for k in range(splits):
            cnt, m, q = _merge(cnt, m, q, part[k * c + ch], part[(splits + k) * c + ch],
                               part[(2 * splits + k) * c + ch])
        var = q / cnt
        m += x[ch * s] + zero
        mean[ch] = m
        invstd[ch] = one / math.sqrt(var + eps)
        if has_running:
            run_mean[ch] = (one - momentum) * run_mean[ch] + momentum * m
            run_var[ch] = (one - momentum) * run_var[ch] + momentum * (var * unbias)


@inlined
def _act(v, act, zero):
    """relu when ``act`` (the same select as kernels/activation.py's relu)."""
    return zero if (act and v <= zero) else v


@inlined
def _masked(g, w, act, zero):
    """dy through relu's slope, from its output w (slope 1 for w > 0 only: a NaN gives 0, a
    select, so an Inf dy where the slope is 0 gives 0, as cuDNN and kernels/activation.py)."""
    return g if (not act or w > zero) else zero


@inlined
def _grads4(dy, y, act, i0, i1, i2, i3, zero):
    """Four dy values, through relu's slope from y when ``act`` (y is not read otherwise)."""
    g0, g1, g2, g3 = dy[i0] + zero, dy[i1] + zero, dy[i2] + zero, dy[i3] + zero
    if act:
        g0 = _masked(g0, y[i0] + zero, act, zero)
        g1 = _masked(g1, y[i1] + zero, act, zero)
        g2 = _masked(g2, y[i2] + zero, act, zero)
        g3 = _masked(g3, y[i3] + zero, act, zero)
    return g0, g1, g2, g3


@_walker
def batch_norm_apply_fwd_kernel(x, z, y, mean, sd, gamma, beta, n, c, s, sw, cw, splits_i,
                                from_var, act, has_z, eps, acc):
    """y = (x - mean) * gamma * invstd + beta, with invstd = sd (training) or
    1/sqrt(sd + eps) (``from_var``: sd is the variance, inference); ``has_z``: + z (a
    residual, x's shape; unread otherwise); ``act`` = 1: then y = max(y, 0) (relu, as
    kernels/activation.py: a NaN stays NaN); all in the same pass."""
    zero = acc[0]
    one = zero + float32(1)
    si, ci, yi, by = _lanes(sw, cw)
    first, rows, row_step, a0, a_main, a_end, d = _loops(n, c, s, sw, cw, splits_i)
    for g in range(cuda.blockIdx.y, (c + cw - 1) // cw, cuda.gridDim.y):
        ch = g * cw + ci
        if ch >= c:
            continue
        inv = sd[ch]
        if from_var:
            inv = one / math.sqrt(inv + eps)
        sc, mu, b = gamma[ch] * inv, mean[ch], beta[ch]
        base = ch * s + first
        for _ in range(rows):
            p = base + a0
            while p < base + a_main:   # four loads before any store: they overlap
                i0, i1, i2, i3 = _four(p, d)
                v0, v1, v2, v3 = x[i0] + zero, x[i1] + zero, x[i2] + zero, x[i3] + zero
                w0, w1, w2, w3 = (v0 - mu) * sc + b, (v1 - mu) * sc + b, \
                    (v2 - mu) * sc + b, (v3 - mu) * sc + b
                if has_z:
                    w0, w1 = w0 + (z[i0] + zero), w1 + (z[i1] + zero)
                    w2, w3 = w2 + (z[i2] + zero), w3 + (z[i3] + zero)
                y[i0] = _act(w0, act, zero)
                y[i1] = _act(w1, act, zero)
                y[i2] = _act(w2, act, zero)
                y[i3] = _act(w3, act, zero)
                p += 4 * d
            while p < base + a_end:
                i0 = uint64(p)
                w0 = (x[i0] + zero - mu) * sc + b
                if has_z:
                    w0 = w0 + (z[i0] + zero)
                y[i0] = _act(w0, act, zero)
                p += d
            base += row_step


# ---------------------------------------------------------------- backward

@_walker
def batch_norm_reduce_bwd_kernel(x, dy, y, act, mean, part, n, c, s, sw, cw, splits_i, acc):
    """Per (channel, split) sums of dy (q = 0) and dy*(x - mean) (q = 1) into
    part[(q*splits + split)*c + ch]; ``act`` = 1: dy is first taken through relu's slope
    from the forward's output y (y unread otherwise)."""
    sh = cuda.shared.array(0, dtype=acc.dtype)   # 2*T elements, sized at launch
    zero = acc[0]
    si, ci, yi, by = _lanes(sw, cw)
    first, rows, row_step, a0, a_main, a_end, d = _loops(n, c, s, sw, cw, splits_i)
    lane = yi * sw + si
    slot = lane * cw + ci
    t = cuda.blockDim.x
    splits = cuda.gridDim.x
    for g in range(cuda.blockIdx.y, (c + cw - 1) // cw, cuda.gridDim.y):
        ch = g * cw + ci
        sg, sgx = zero, zero
        if ch < c:
            mu = mean[ch]
            base = ch * s + first
            for _ in range(rows):
                p = base + a0
                while p < base + a_main:
                    i0, i1, i2, i3 = _four(p, d)
                    g0, g1, g2, g3 = _grads4(dy, y, act, i0, i1, i2, i3, zero)
                    x0, x1, x2, x3 = x[i0] + zero, x[i1] + zero, x[i2] + zero, x[i3] + zero
                    sg += (g0 + g1) + (g2 + g3)
                    sgx += (g0 * (x0 - mu) + g1 * (x1 - mu)) + (g2 * (x2 - mu) + g3 * (x3 - mu))
                    p += 4 * d
                while p < base + a_end:
                    i0 = uint64(p)
                    gv = _masked(dy[i0] + zero, y[i0] + zero, act, zero)
                    sg += gv
                    sgx += gv * (x[i0] + zero - mu)
                    p += d
                base += row_step
        sh[slot], sh[t + slot] = sg, sgx
        cuda.syncthreads()
        _tree(sh, 2, lane, slot, cw, sw * by)
        if lane == 0 and ch < c:
            q = cuda.blockIdx.x
            part[q * c + ch] = sh[slot]
            part[(splits + q) * c + ch] = sh[t + slot]
        cuda.syncthreads()


@cuda.jit(cache=True)
def batch_norm_finalize_bwd_kernel(part, splits, c, invstd, dgamma, dbeta, acc):
    """One thread per channel: dbeta = sum dy, dgamma = invstd * sum dy*(x - mean), adding
    the partials in split order."""
    zero = acc[0]
    for ch in range(cuda.grid(1), c, cuda.gridsize(1)):
        sg, sgx = zero, zero
        for k in range(splits):
            sg += part[k * c + ch]
            sgx += part[(splits + k) * c + ch]
        dbeta[ch] = sg
        dgamma[ch] = sgx * invstd[ch]


@_walker
def batch_norm_apply_bwd_kernel(x, dy, y, act, dx, dz, has_z, mean, invstd, gamma, dgamma,
                                dbeta, inv_m, n, c, s, sw, cw, splits_i, acc):
    """dx = gamma*invstd * (dy - dbeta/m - (x - mean) * invstd*dgamma/m); inv_m = 1/m;
    ``act`` = 1: dy through relu's slope from y first (as the reduce kernel); ``has_z``: also
    writes that dy to dz (the residual's gradient; unwritten otherwise)."""
    zero = acc[0]
    si, ci, yi, by = _lanes(sw, cw)
    first, rows, row_step, a0, a_main, a_end, d = _loops(n, c, s, sw, cw, splits_i)
    for g in range(cuda.blockIdx.y, (c + cw - 1) // cw, cuda.gridDim.y):
        ch = g * cw + ci
        if ch >= c:
            continue
        inv, mu = invstd[ch], mean[ch]
        k1 = gamma[ch] * inv
        mdb = dbeta[ch] * inv_m
        c2 = inv * dgamma[ch] * inv_m
        base = ch * s + first
        for _ in range(rows):
            p = base + a0
            while p < base + a_main:
                i0, i1, i2, i3 = _four(p, d)
                g0, g1, g2, g3 = _grads4(dy, y, act, i0, i1, i2, i3, zero)
                x0, x1, x2, x3 = x[i0] + zero, x[i1] + zero, x[i2] + zero, x[i3] + zero
                if has_z:
                    dz[i0], dz[i1], dz[i2], dz[i3] = g0, g1, g2, g3
                dx[i0] = k1 * (g0 - mdb - (x0 - mu) * c2)
                dx[i1] = k1 * (g1 - mdb - (x1 - mu) * c2)
                dx[i2] = k1 * (g2 - mdb - (x2 - mu) * c2)
                dx[i3] = k1 * (g3 - mdb - (x3 - mu) * c2)
                p += 4 * d
            while p < base + a_end:
                i0 = uint64(p)
                gv = _masked(dy[i0] + zero, y[i0] + zero, act, zero)
                if has_z:
                    dz[i0] = gv
                dx[i0] = k1 * (gv - mdb - (x[i0] + zero - mu) * c2)
                p += d
            base += row_step


def SIGNATURES(t, acc):
    from numba import int64
    a, z = t[::1], acc[::1]
    i = int64
    geo = (i, i, i, i, i, i)   # n, c, s, sw, cw, splits_i
    return {
        "batch_norm_stats_fwd_kernel": (a, z) + geo + (z,),
        "batch_norm_finalize_fwd_kernel": (a, z, i, i, i, z, z, z, z, i, acc, acc, acc, z),
        "batch_norm_apply_fwd_kernel": (a, a, a, z, z, z, z) + geo + (i, i, i, acc, z),
        "batch_norm_reduce_bwd_kernel": (a, a, a, i, z, z) + geo + (z,),
        "batch_norm_finalize_bwd_kernel": (z, i, i, z, z, z, z),
        "batch_norm_apply_bwd_kernel": (a, a, a, i, a, a, i, z, z, z, z, z, acc) + geo + (z,),
    }
