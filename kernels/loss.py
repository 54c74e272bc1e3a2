"""Loss functions: negative log-likelihood (cross-entropy from log-probabilities) and mean
squared error, forward and backward.

Layout: log-probabilities are (N, C, S) flat in memory (class c of position (n, s) at
(n*C + c)*S + s, so (N, C) is S = 1 and NCHW is S = H*W); targets are (N, S) flat integer class
indices, ``ignore`` marking positions that do not count.

Forward is a deterministic two-kernel reduction (no float atomics):
  1. ``nll_fwd_kernel`` / ``mse_fwd_kernel``: a grid-stride loop, then a shared-memory tree per
     block, writing one partial sum part[b] and one count cnt[b] per block b.
         nll:  part[b] = sum over counted positions of -logp[n, target[n, s], s]
         mse:  part[b] = sum (x - t)^2
     The count goes through the same (acc-typed) tree: exact while a block covers at most 2^24
     positions (the launcher caps the grid at 4096 blocks: 2^36 positions in all).
  2. ``loss_sum_fwd_kernel``: one block sums the partials, each thread in a fixed stride
     order and then a fixed tree, so the result is the same bit for bit on every run. The
     counts are integers: an integer atomic add is exact, hence order-independent.
A target outside [0, C) (and not ``ignore``) adds NaN to the sum, so the host can detect it
after the fact without a second pass over a device target.

Backward is elementwise (grid-stride, consecutive threads on consecutive elements):
    nll:  dx = scale * (exp(logp) - [c == target])   (0 where target == ignore)
    mse:  dx = scale * (x - t)
with scale = 1/count (mean) or 1 (sum) for nll and 2/n or 2 for mse. exp(logp) is the softmax.
Memory traffic: nll forward reads N*S targets and N*S log-probabilities (a gather), backward
reads logp and the targets and writes dx once; mse reads x and t once in each direction.

``acc`` is the one-element accumulation-type array (see kernels/__init__.py); the block scratch
is dynamic shared memory of blockDim.x acc elements (sized by the launcher: Numba's simulator
allocates static shared arrays racily). blockDim.x must be a power of two.
"""

import math

from numba import cuda, float32, int64


@cuda.jit(device=True, inline=True)
def _block_sum(red, val):
    """Sum ``val`` over the block (a fixed tree: deterministic); every thread gets the sum."""
    tid, half = cuda.threadIdx.x, cuda.blockDim.x // 2
    red[tid] = val
    cuda.syncthreads()
    while half > 0:
        if tid < half:
            red[tid] = red[tid] + red[tid + half]
        cuda.syncthreads()
        half //= 2
    out = red[0]
    cuda.syncthreads()   # red is reused by the next reduction
    return out


@cuda.jit(device=True, inline=True)
def _write_partials(red, total, count, part, cnt):
    total = _block_sum(red, total)
    count = _block_sum(red, count)
    if cuda.threadIdx.x == 0:
        part[cuda.blockIdx.x] = total
        cnt[cuda.blockIdx.x] = int64(count)


@cuda.jit(cache=True)
def nll_fwd_kernel(logp, target, part, cnt, n, c, s, ignore, acc):
    """Per-block partial sums of -logp[n, target, s] and counts of counted positions.
    Thread mapping: grid-stride over the n*s positions p = n*S + s (consecutive threads read
    consecutive targets; the logp gather is coalesced along s when S > 1)."""
    red = cuda.shared.array(0, dtype=acc.dtype)   # blockDim.x elements, sized at launch
    zero = acc[0]
    one = zero + float32(1)
    total, count = zero, zero
    for p in range(cuda.grid(1), n * s, cuda.gridsize(1)):
        t = target[p]
        if t == ignore:
            continue
        count += one
        if t < 0 or t >= c:
            total += float32(math.nan)   # an invalid target: flagged through the sum
        else:
            total -= logp[((p // s) * c + t) * s + p % s] + zero
    _write_partials(red, total, count, part, cnt)


@cuda.jit(cache=True)
def mse_fwd_kernel(x, t, part, cnt, acc):
    """Per-block partial sums of (x - t)^2 and element counts. Thread mapping: grid-stride
    over the elements, consecutive threads on consecutive elements."""
    red = cuda.shared.array(0, dtype=acc.dtype)   # blockDim.x elements, sized at launch
    zero = acc[0]
    one = zero + float32(1)
    total, count = zero, zero
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        d = x[i] + zero - (t[i] + zero)
        total += d * d
        count += one
    _write_partials(red, total, count, part, cnt)


@cuda.jit(cache=True)
def loss_sum_fwd_kernel(part, cnt, out, out_cnt, acc):
    """out[0] = sum(part), out_cnt[0] = sum(cnt), in one block: thread i adds part[i],
    part[i + blockDim.x], ... in order, then a fixed tree (deterministic)."""
    red = cuda.shared.array(0, dtype=acc.dtype)   # blockDim.x elements, sized at launch
    zero = acc[0]
    tid = cuda.threadIdx.x
    if tid == 0:
        out_cnt[0] = 0
    total, count = zero, 0
    for b in range(tid, part.size, cuda.blockDim.x):
        total += part[b]
        count += cnt[b]
    total = _block_sum(red, total)   # its barriers also order the zeroing before the adds
    cuda.atomic.add(out_cnt, 0, count)
    if tid == 0:
        out[0] = total


@cuda.jit(cache=True)
def nll_bwd_kernel(logp, target, dx, n, c, s, ignore, scale, acc):
    """dx = scale * (exp(logp) - onehot(target)), 0 at ignored positions; flat (n, c, s)
    arrays. Thread mapping: grid-stride over the n*c*s elements (coalesced)."""
    zero = acc[0]
    one = zero + float32(1)
    for i in range(cuda.grid(1), n * c * s, cuda.gridsize(1)):
        si = i % s
        ci = (i // s) % c
        t = target[(i // (c * s)) * s + si]
        if t == ignore:
            dx[i] = zero
        else:
            g = math.exp(logp[i] + zero)
            if ci == t:
                g -= one
            dx[i] = scale * g


@cuda.jit(cache=True)
def mse_bwd_kernel(x, t, dx, scale, acc):
    """dx = scale * (x - t) (scale = 2/n or 2). Thread mapping: grid-stride, coalesced."""
    zero = acc[0]
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        dx[i] = scale * (x[i] + zero - (t[i] + zero))


def SIGNATURES(t, acc):
    a, z, i = t[::1], acc[::1], int64[::1]
    return {"nll_fwd_kernel": (a, i, z, i, int64, int64, int64, int64, z),
            "mse_fwd_kernel": (a, a, z, i, z),
            "loss_sum_fwd_kernel": (z, i, z, i, z),
            "nll_bwd_kernel": (a, i, a, int64, int64, int64, int64, acc, z),
            "mse_bwd_kernel": (a, a, a, acc, z)}
