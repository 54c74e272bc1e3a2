"""Softmax over one axis, forward and backward.

Every input is viewed as (N, C, S) flat in memory: the reduction runs over C at stride S, for
each of the N*S rows r = n*S + s (row r starts at n*C*S + s). Channel mode on NCHW is
(N, C, H*W); instance mode and 2-D input are (N, C*H*W, 1).

    forward (algo 0 fast, 1 accurate, 2 log), M = max_c x (accurate, log) or 0 (fast):
        y = exp(x - M) / sum_c exp(x - M)          or  y = x - M - log(sum_c exp(x - M))
    backward, from y and dy:
        softmax: dx = y * (dy - sum_c dy * y)      log: dx = dy - exp(y) * sum_c dy

Thread mapping: a block is (bx, by) threads. Lane tx owns row tile*bx + tx of the block's row
tile (blocks walk tiles in a grid-stride loop): with S > 1 consecutive lanes own consecutive s
positions (a tile may straddle two samples n), so a warp reads runs of consecutive
addresses; with S == 1 the launcher uses bx = 1, one row per block, and consecutive ty read
consecutive addresses. The by threads of a row take its
elements c = ty + j*by, j = 0, 1, ...: K of them at a time ("a chunk": K loads issued before
any is used, so each thread keeps K requests in flight), into registers.

Three variants per K (``softmax_kernels(K, cached, BY)``, compile-time constants):
- cached: the launcher guarantees C <= K*by, so one chunk holds the whole row; it stays in
  registers from the statistics to the output. Forward: M = the block's max of the values,
  then e = exp(v - M) kept in place of v (log keeps v), t = sum e, the block's total, and
  y = e * (1 / total) (log: v - M - log total): one exp per element. Traffic: forward reads x once
  and writes y; backward reads y and dy once and writes dx (the minimum).
- streaming (any C): the statistics walk the row chunk by chunk, then the output pass reads it
  again. Forward reads x twice; backward reads dy (and y, except log) then y and dy again.
- row-block (cached, S == 1, one block of ROW_BY threads per row; ``softmax_kernels``' BY):
  the cached kernel with the block height a compile-time constant, so a thread's K addresses
  are immediate offsets from one pointer and the reductions unroll (sm_90 float32, K = 16:
  1,216 SASS instructions against 2,120; about 10 fewer index instructions per load).

The streaming forward's statistics are online (one read of x gives both maximum and sum): a
thread keeps its running maximum m and t = sum exp(v - m~) over the values v it has seen,
where m~ = m, or 0 while m = -inf (every value so far -inf, or none; then t = 0). A chunk of
maximum cm gives m' = max(m, cm) and t' = t * exp(m - m'~) + sum_chunk exp(v - m'~): one exp
per element and one per chunk, and m'~ is never -inf, so no -inf - -inf NaN appears while
some value is finite. The block then reduces the row's M = max m and total = sum of
t * exp(m - M) over its threads; the output pass computes exp(x - M) / total again.
Every variant gives the special values of dnnkit.reference: a NaN anywhere makes the row NaN
(the max lets NaN win); M = +inf makes the total NaN (the term exp(inf - inf)); an all -inf
row is NaN (exp(-inf - -inf)); -inf elements of other rows give 0 (log: -inf). Fast has no
maximum: M = 0.

Block reduction (``_reduce``): through dynamic shared memory (Numba's simulator has no warp
shuffles), two levels: each thread stores its value, G = 2^ceil(log2(by)/2) threads per
column fold by/G values each (rows g, g + G, ...: consecutive threads read consecutive
words), then every thread folds the G results. Two barriers, whatever by. The scratch has two
halves used in turn, so a reduction never overwrites values the previous one is still reading
(no trailing barrier); the launcher sizes it 2*bx*by elements (a static array would do on the
GPU, but the simulator allocates static shared arrays racily).

``acc`` is a one-element array holding 0 in the accumulation type (float32 for float16 and
float32 data, float64 for float64): it types the arithmetic (``x[i] + zero``), the registers
and the scratch (``dtype=acc.dtype``), so one kernel serves every dtype. Row offsets and
indices are int64 (the arguments are).
"""

import functools
import math

from numba import cuda, float32, int64, uint32, uint64

from .bounds import bounded_jit, inlined
from .common import MAX_THREADS, REDUCE_MAX, REDUCE_SUM, nanmax

FAST, ACCURATE, LOG = 0, 1, 2
CACHED_K = (4, 16, 32)      # register-cached variants: K values per thread (launcher's choice)
STREAM_K = 8                # chunk of the streaming variant
ROW_BY = MAX_THREADS        # blockDim.y of the row-block variants (softmax_kernels' BY)
MIN_BLOCKS = {4: 4, 8: 3, 16: 4, 32: 2}     # launch bounds (blocks per SM) by K; see _jit
# The row-block forward of K = 16 fits 5 blocks (48 registers, no spills; its constant strides
# free the index registers): 0.102 ms against 0.110 at 4 blocks (H100, 8192 x 4096 float32).
# Its backward spills at 5 (0.258 ms against 0.138): it keeps MIN_BLOCKS.
ROW_FWD_BLOCKS = {16: 5}


@inlined
def _reduce(red, val, op, turn, by):
    """Combine ``val`` over threadIdx.y for each threadIdx.x (``op`` REDUCE_MAX or
    REDUCE_SUM); every thread gets its column's result. Two levels, two barriers (module
    docstring); ``turn`` (0 or 1) picks the half of ``red`` (2*bx*by elements): consecutive
    calls alternate. ``by`` is blockDim.y (a constant in the row-block variant: the loops
    unroll). Shared-memory indices are unsigned (Numba adds a negative-index fix-up to signed
    ones)."""
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    bx = cuda.blockDim.x
    g = 1
    while g * g < by:
        g *= 2
    col = uint32(turn * bx * by + tx)
    red[col + uint32(ty * bx)] = val
    cuda.syncthreads()
    if ty < g:
        v = val
        r = ty + g
        while r < by:
            w = red[col + uint32(r * bx)]
            v = nanmax(v, w) if op == REDUCE_MAX else v + w
            r += g
        red[col + uint32(ty * bx)] = v      # row ty is read and written by this thread only
    cuda.syncthreads()
    out = red[col]
    r = 1
    while r < g:
        w = red[col + uint32(r * bx)]
        out = nanmax(out, w) if op == REDUCE_MAX else out + w
        r += 1
    return out


@inlined
def _tiles(n, s):
    """(this block's first row tile, number of tiles of bx rows, 0): blocks walk the tiles in
    a grid-stride loop; the 0 starts the kernel's reduction turn."""
    bx = cuda.blockDim.x
    return int64(cuda.blockIdx.x), (n * s + bx - 1) // bx, 0


@inlined
def _lane(tile, n, c, s, by):
    """(live, first, step, rest, next tile) of this thread in row tile ``tile`` (``by`` is
    blockDim.y): its row is tile*bx + tx, starting at n*C*S + s_pos; its elements ty + j*by
    of the row are at first + j*step; rest = C - ty elements of the row from its first on. A
    lane past the last row is dead (live False, rest 0): it loads nothing but joins the
    block's barriers."""
    ty = cuda.threadIdx.y
    r = tile * cuda.blockDim.x + cuda.threadIdx.x
    if s == 1:
        live, base = r < n, r * c           # no division for contiguous rows
    else:
        q = int64(uint64(r) // uint64(s))   # unsigned: no floor-division sign fix-ups
        live, base = r < n * s, q * (c * s) + (r - q * s)
    return live, base + ty * s, by * s, (c - ty if live else 0), tile + cuda.gridDim.x


def _jit(K, blocks=None):
    """``cuda.jit`` with launch bounds MAX_THREADS threads and ``blocks`` (default
    MIN_BLOCKS[K]) blocks per SM (at most 65536 / (256 * blocks) registers). Unbounded,
    ptxas takes 127-196 registers for K = 16-32 (2 blocks of 256 per SM). Bounded (sm_90,
    float32, fwd / bwd): K = 4 62 / 56 registers, K = 8 80 / 80, K = 16 64 / 64 and K = 32
    128 / 128, no spills in the forward and 16-20 bytes in the backward of K = 16 and 32
    (the row-block backward of K = 16: 28)."""
    return lambda kernel: bounded_jit(kernel, MAX_THREADS, blocks or MIN_BLOCKS.get(K, 4))


@functools.lru_cache(maxsize=None)
def softmax_kernels(K, cached, BY=0):
    """(forward, backward) kernels taking K values per thread at a time; ``cached``: the
    launcher guarantees C <= K*blockDim.y (one chunk holds the row, kept in registers).
    ``BY`` > 0 (the row-block variant): the launcher also guarantees S == 1 and blockDim.y ==
    BY, so a thread's stride BY*S is a compile-time constant. Its K addresses are then
    immediate offsets from one pointer, and the bounds checks and reductions unroll. With a
    runtime stride, each load took about 10 instructions of 64-bit index arithmetic (sm_90
    SASS, K = 16).

    Within a chunk, this thread's elements are j = 0..K-1 at index at + j*step (step = by*S),
    of which those with j*by < lim exist (lim = elements of the row from the chunk's first
    one on; 0 for a dead lane). Indices are int64 arithmetic, cast to uint64 for indexing
    (no negative-index fix-up)."""

    @inlined
    def load(src, v, at, step, lim, by, pad, zero):
        """v[j] = src[at + j*step] where j*by < lim, ``pad`` elsewhere: K independent loads,
        all issued before any is used (the loop unrolls: K is a constant)."""
        for j in range(K):
            v[j] = src[uint64(at + j * step)] + zero if j * by < lim else pad

    @inlined
    def _online_stats(x, v, first, step, rest, c, s, algo, zero):
        """(m, t) of this thread's elements of its row, chunk by chunk (module docstring)."""
        by = BY if BY else cuda.blockDim.y
        ninf = zero - float32(math.inf)
        m = zero if algo == FAST else ninf
        t = zero
        cb = int64(0)
        while cb < c:
            load(x, v, first + cb * s, step, rest - cb, by, ninf, zero)
            m2 = m
            if algo != FAST:
                for j in range(K):
                    m2 = nanmax(v[j], m2)
            m2t = zero if m2 == ninf else m2
            part = zero
            for j in range(K):
                part += math.exp(v[j] - m2t)
            t = t * math.exp(m - m2t) + part
            m = m2
            cb += K * by
        return m, t

    @_jit(K, ROW_FWD_BLOCKS.get(K) if BY else None)
    def forward(x, y, n, c, s, algo, acc):
        """y = softmax(x) (or log-softmax) over C for every row; flat n*c*s arrays."""
        red = cuda.shared.array(0, dtype=acc.dtype)      # 2*bx*by elements, sized at launch
        v = cuda.local.array(K, dtype=acc.dtype)         # registers (constant indices)
        zero = acc[0]
        one = zero + float32(1)
        ninf = zero - float32(math.inf)
        by = BY if BY else cuda.blockDim.y
        if BY:
            s = int64(1)
        tile, tiles, turn = _tiles(n, s)         # turn: the half of red the next reduction uses
        while tile < tiles:
            live, first, step, rest, tile = _lane(tile, n, c, s, by)
            big = zero                       # the row's maximum M (0 for fast)
            if cached:
                # the row in registers: M, then t = sum exp(v - M), the exps kept for y
                load(x, v, first, step, rest, by, ninf, zero)
                if algo != FAST:
                    m = ninf
                    for j in range(K):
                        m = nanmax(v[j], m)
                    big = _reduce(red, m, REDUCE_MAX, turn, by)
                    turn = 1 - turn
                t = zero
                if live:                     # (dead lanes: exp(-inf - -inf))
                    for j in range(K):
                        e = math.exp(v[j] - big)
                        t += e
                        if algo != LOG:
                            v[j] = e
            else:
                m, t = _online_stats(x, v, first, step, rest, c, s, algo, zero)
                if algo != FAST:
                    big = _reduce(red, m, REDUCE_MAX, turn, by)
                    turn = 1 - turn
                    if live:
                        t *= math.exp(m - big)
            total = _reduce(red, t, REDUCE_SUM, turn, by)
            turn = 1 - turn
            if not live:
                continue
            scale = big + math.log(total) if algo == LOG else one / total
            cb = int64(0)
            while cb < c:
                at, lim = first + cb * s, rest - cb
                if not cached:
                    load(x, v, at, step, lim, by, ninf, zero)
                for j in range(K):
                    if j * by < lim:
                        if algo == LOG:
                            y[uint64(at + j * step)] = v[j] - scale
                        elif cached:
                            y[uint64(at + j * step)] = v[j] * scale
                        else:
                            y[uint64(at + j * step)] = math.exp(v[j] - big) * scale
                cb += K * by

    @_jit(K)
    def backward(y, dy, dx, n, c, s, algo, acc):
        """dx from y and dy (flat n*c*s arrays) for every row."""
        red = cuda.shared.array(0, dtype=acc.dtype)      # 2*bx*by elements, sized at launch
        vy = cuda.local.array(K, dtype=acc.dtype)
        vg = cuda.local.array(K, dtype=acc.dtype)
        zero = acc[0]
        by = BY if BY else cuda.blockDim.y
        if BY:
            s = int64(1)
        tile, tiles, turn = _tiles(n, s)         # turn: the half of red the next reduction uses
        while tile < tiles:
            live, first, step, rest, tile = _lane(tile, n, c, s, by)
            t = zero
            cb = int64(0)
            while cb < c:
                at, lim = first + cb * s, rest - cb
                load(dy, vg, at, step, lim, by, zero, zero)
                # log needs y only for the output: the streaming variant reads it there
                if algo != LOG or cached:
                    load(y, vy, at, step, lim, by, zero, zero)
                for j in range(K):
                    t += vg[j] if algo == LOG else vg[j] * vy[j]
                cb += K * by
            total = _reduce(red, t, REDUCE_SUM, turn, by)
            turn = 1 - turn
            if not live:
                continue
            cb = int64(0)
            while cb < c:
                at, lim = first + cb * s, rest - cb
                if not cached:
                    load(dy, vg, at, step, lim, by, zero, zero)
                    load(y, vy, at, step, lim, by, zero, zero)
                for j in range(K):
                    if j * by < lim:
                        if algo == LOG:
                            dx[uint64(at + j * step)] = vg[j] - math.exp(vy[j]) * total
                        else:
                            dx[uint64(at + j * step)] = vy[j] * (vg[j] - total)
                cb += K * by

    return forward, backward


softmax_fwd_kernel, softmax_bwd_kernel = softmax_kernels(STREAM_K, False)


def _variant_name(K, direction, BY=0):
    return f"softmax_{'row' if BY else 'reg'}{K}_{direction}_kernel"


VARIANTS = {}
for _k in CACHED_K:
    for _by in (0, ROW_BY):
        _f, _b = softmax_kernels(_k, True, _by)
        VARIANTS[_variant_name(_k, "fwd", _by)] = _f
        VARIANTS[_variant_name(_k, "bwd", _by)] = _b


def SIGNATURES(t, acc):
    from numba import int64
    a, z = t[::1], acc[::1]
    fwd, bwd = (a, a, int64, int64, int64, int64, z), (a, a, a, int64, int64, int64, int64, z)
    out = {"softmax_fwd_kernel": fwd, "softmax_bwd_kernel": bwd}
    out.update({name: fwd if "_fwd_" in name else bwd for name in VARIANTS})
    return out


# Kernels that multiply integers in 32 bits on purpose (tests/kernels/test_ptx.py): the
# shared-memory scratch index (turn * bx * by + tx + ty * bx, _reduce) stays below the
# scratch's size (2 * 256 accumulators), so it is computed as uint32 — a shared-memory
# address is 32-bit anyway. Every global-memory index is 64-bit.
INDEX32 = ("softmax_fwd_kernel", "softmax_bwd_kernel") + tuple(VARIANTS)
