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

Device-side scales (dnnkit/ops/loss.py: a loss and its gradient with no read back to the
host): ``loss_finish_kernel`` turns the sum and count into the 0-d loss (mean: divided on the
device; NaN for a count of 0); ``nll_bwd_scaled_kernel`` and ``mse_bwd_scaled_kernel`` read
the upstream gradient and the count from device memory (reduction none, sum or mean), the
former for cross-entropy (softmax - onehot, from logp) or for nll (-onehot); a target outside
[0, C) gives a NaN row. ``nll_none_fwd_kernel`` and ``mse_none_fwd_kernel`` give the
per-position losses (reduction "none").

``acc`` is the one-element accumulation-type array (see kernels/__init__.py); the block scratch
is dynamic shared memory of blockDim.x acc elements (sized by the launcher: Numba's simulator
allocates static shared arrays racily). blockDim.x must be a power of two.
"""

import math

from numba import cuda, float32, int64

from .bounds import inlined


@inlined
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


@inlined
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


# ---------------------------------------------------------------- device-side scales
# The kernels below take the reduction's count and the upstream gradient from device memory,
# so that a loss and its gradient run with no read back to the host (dnnkit/ops/loss.py).
# ``reduction``: 0 none (per position), 1 sum, 2 mean.

@inlined
def _as_acc(count, zero):
    """An int64 count in the accumulation type: two pieces exact in float32 (count >> 24 and
    the low 24 bits), so a float64 count is exact up to 2**48 and a float32 one rounded once."""
    return (zero + float32(count >> 24)) * float32(16777216) + float32(count & 16777215)


@cuda.jit(cache=True)
def loss_finish_kernel(out, out_cnt, y, mean, acc):
    """y[0] = out[0] / out_cnt[0] (mean != 0; NaN for a count of 0, as 0/0) or out[0], rounded
    once to y's type. One thread: the last step of the two-kernel reduction above."""
    zero = acc[0]
    if cuda.grid(1) == 0:
        total = out[0] + zero
        if mean != 0:
            if out_cnt[0] == 0:
                total = zero + float32(math.nan)
            else:
                total = total / _as_acc(out_cnt[0], zero)
        y[0] = total


@cuda.jit(cache=True)
def nll_none_fwd_kernel(logp, target, y, n, c, s, ignore, acc):
    """Per position: y[n, s] = -logp[n, target, s]; 0 where target == ignore, NaN for a
    target outside [0, C). Grid-stride over the n*s positions."""
    zero = acc[0]
    for p in range(cuda.grid(1), n * s, cuda.gridsize(1)):
        t = target[p]
        if t == ignore:
            y[p] = zero
        elif t < 0 or t >= c:
            y[p] = zero + float32(math.nan)
        else:
            y[p] = -(logp[((p // s) * c + t) * s + p % s] + zero)


@cuda.jit(cache=True)
def mse_none_fwd_kernel(x, t, y, acc):
    """Per element: y = (x - t)^2. Grid-stride, coalesced."""
    zero = acc[0]
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        d = x[i] + zero - (t[i] + zero)
        y[i] = d * d


@cuda.jit(cache=True)
def nll_bwd_scaled_kernel(logp, target, dx, n, c, s, ignore, dy, cnt, reduction, softmax, acc):
    """softmax != 0 (cross-entropy, wrt the logits): dx = g * (exp(logp) - onehot(target));
    softmax == 0 (nll, wrt logp): dx = -g * onehot(target). 0 at ignored positions, NaN where
    the target is outside [0, C). g = dy[0] / cnt[0] (mean; 0 when nothing counts),
    dy[0] (sum) or dy[n, s] (none). Grid-stride over the n*c*s elements (coalesced)."""
    zero = acc[0]
    one = zero + float32(1)
    g = zero
    if reduction == 2:
        if cnt[0] > 0:
            g = (dy[0] + zero) / _as_acc(cnt[0], zero)
    elif reduction == 1:
        g = dy[0] + zero
    for i in range(cuda.grid(1), n * c * s, cuda.gridsize(1)):
        q = (i // (c * s)) * s + i % s      # the position (n, s)
        t = target[q]
        if t == ignore:
            dx[i] = zero
        elif t < 0 or t >= c:
            dx[i] = zero + float32(math.nan)
        else:
            v = math.exp(logp[i] + zero) if softmax != 0 else zero
            if (i // s) % c == t:
                v -= one
            dx[i] = (dy[q] + zero if reduction == 0 else g) * v


@cuda.jit(cache=True)
def mse_bwd_scaled_kernel(x, t, dx, dy, reduction, acc):
    """dx = 2 g (x - t) with g = dy[0] / x.size (mean), dy[0] (sum) or dy[i] (none).
    Grid-stride, coalesced."""
    zero = acc[0]
    two = zero + float32(2)
    g = zero
    if reduction == 2:
        if x.size > 0:
            g = two * (dy[0] + zero) / _as_acc(int64(x.size), zero)
    elif reduction == 1:
        g = two * (dy[0] + zero)
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        gi = two * (dy[i] + zero) if reduction == 0 else g
        dx[i] = gi * (x[i] + zero - (t[i] + zero))


def SIGNATURES(t, acc):
    a, z, i = t[::1], acc[::1], int64[::1]
    return {"nll_fwd_kernel": (a, i, z, i, int64, int64, int64, int64, z),
            "mse_fwd_kernel": (a, a, z, i, z),
            "loss_sum_fwd_kernel": (z, i, z, i, z),
            "nll_bwd_kernel": (a, i, a, int64, int64, int64, int64, acc, z),
            "mse_bwd_kernel": (a, a, a, acc, z),
            "loss_finish_kernel": (z, i, a, int64, z),
            "nll_none_fwd_kernel": (a, i, a, int64, int64, int64, int64, z),
            "mse_none_fwd_kernel": (a, a, a, z),
            "nll_bwd_scaled_kernel": (a, i, a, int64, int64, int64, int64, a, i, int64, int64,
                                      z),
            "mse_bwd_scaled_kernel": (a, a, a, a, int64, z)}
