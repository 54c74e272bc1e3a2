"""Optimizer updates and axpy, elementwise and in place on flat arrays.

Every kernel is one read-modify-write pass: element i depends on element i of its inputs only,
so there is no cross-thread traffic. Arithmetic is in the accumulation type (``acc``): a float16
parameter is widened, updated in float32 and rounded once when stored. State buffers (momentum,
Adam's m and v) are kept in the accumulation type, so their rounding does not compound over
steps at float16 precision. Scalars arrive in the accumulation type, computed on the host in
float64 (e.g. ``1 - beta2`` and the bias corrections: ``1 - float32(0.999)`` is off by 1.3e-5
relative, rounding ``0.001`` once by 5e-8).

Thread mapping (axpy): grid-stride loop, one element per thread per iteration, consecutive
threads on consecutive elements (coalesced). The optimizer kernels are multi-tensor (PyTorch's
foreach kernels, apex's multi_tensor_apply): their arrays come as tuples of TENSORS flat
parameters (padded by repeating the last), and the 1-D grid is cut into chunks of blocks, one
run per tensor: ``ends[t]`` is the block after tensor t's last (non-decreasing, padded by
repeating the last), so block b updates the first tensor t with b < ends[t], its chunk
b - ends[t-1] of ``per * blockDim.x`` elements, each thread ``per`` of them a block-width
apart (coalesced). Every block has work: a grid sized by the largest tensor for every tensor
(a 2-D grid of row per tensor) would launch mostly empty blocks beside a large weight. One
launch steps up to TENSORS parameters, instead of one launch each. Memory traffic per
element: axpy reads x, y and writes y; SGD reads p, g (and buf) and writes p (and buf); Adam
reads p, g, m, v and writes p, m, v.
"""

import math

from numba import cuda, int64, types

from .bounds import inlined

# Parameters per launch of a multi-tensor kernel. Each 1-D array is 56 bytes of kernel
# parameters: Adam's four tuples of 12 take 2.7 KB of the 4 KB parameter space.
TENSORS = 12     # _chunk's compares are written out for this many


@cuda.jit(cache=True)
def axpy_fwd_kernel(x, y, alpha, acc):
    """y[i] += alpha * x[i] (BLAS axpy, in place on y)."""
    zero = acc[0]
    start, step = cuda.grid(1), cuda.gridsize(1)
    for i in range(start, y.size, step):
        y[i] = (y[i] + zero) + alpha * (x[i] + zero)


@inlined
def _chunk(ends, per):
    """(this block's tensor t, the index in it of this thread's first element): the first t
    with blockIdx.x < ends[t], and the block's chunk within t's run of blocks. The ends are
    non-decreasing, so the last end the block is past is tensor t - 1's: a chain of compares
    with constant indices (a tuple indexed by a run-time value compiles to a local-memory copy,
    and numba-cuda cannot type it without a driver, which the PTX check runs without); one
    compare per tensor but the last, TENSORS = 12."""
    b = cuda.blockIdx.x
    t, first = 0, 0
    if b >= ends[0]:
        t, first = 1, ends[0]
    if b >= ends[1]:
        t, first = 2, ends[1]
    if b >= ends[2]:
        t, first = 3, ends[2]
    if b >= ends[3]:
        t, first = 4, ends[3]
    if b >= ends[4]:
        t, first = 5, ends[4]
    if b >= ends[5]:
        t, first = 6, ends[5]
    if b >= ends[6]:
        t, first = 7, ends[6]
    if b >= ends[7]:
        t, first = 8, ends[7]
    if b >= ends[8]:
        t, first = 9, ends[8]
    if b >= ends[9]:
        t, first = 10, ends[9]
    if b >= ends[10]:
        t, first = 11, ends[10]
    return t, (b - first) * per * cuda.blockDim.x + cuda.threadIdx.x


@cuda.jit(cache=True)
def sgd_fwd_kernel(ps, gs, bufs, ends, per, lr, momentum, damp, wd, first, nesterov, acc):
    """One SGD step (PyTorch's torch.optim.SGD) of parameter p = ps[t] with gradient
    g = gs[t], in place on p and buf = bufs[t], t this block's tensor (``ends``, ``per``:
    the module docstring's mapping):

        d = g + wd * p
        buf = d                                   (first step: first != 0)
        buf = momentum * buf + damp * d           (later steps; damp = 1 - dampening)
        d = d + momentum * buf   if nesterov   else   buf
        p = p - lr * d

    With momentum == 0 there is no buffer (``buf`` is not touched, any acc-typed array will
    do) and the step is p -= lr * d.
    """
    zero = acc[0]
    t, i0 = _chunk(ends, per)
    p, g, buf = ps[t], gs[t], bufs[t]
    for j in range(per):
        i = i0 + j * cuda.blockDim.x
        if i >= p.size:
            return
        w = p[i] + zero
        d = (g[i] + zero) + wd * w
        if momentum != zero:
            b = d if first != 0 else momentum * (buf[i] + zero) + damp * d
            buf[i] = b
            d = d + momentum * b if nesterov != 0 else b
        p[i] = w - lr * d


@cuda.jit(cache=True)
def adam_fwd_kernel(ps, gs, ms, vs, ends, per, step_size, b1, c1, b2, c2, rsqrt_bc2, eps, wd,
                    acc):
    """One Adam step (PyTorch's torch.optim.Adam, amsgrad off) of parameter p = ps[t] with
    gradient g = gs[t], in place on p, m = ms[t] and v = vs[t], t this block's tensor:

        d = g + wd * p
        m = b1 * m + c1 * d                       (c1 = 1 - b1)
        v = b2 * v + c2 * d * d                   (c2 = 1 - b2)
        p = p - step_size * m / (sqrt(v) * rsqrt_bc2 + eps)

    with the bias corrections folded in by the host: step_size = lr / (1 - b1^t),
    rsqrt_bc2 = 1 / sqrt(1 - b2^t), so that sqrt(v) * rsqrt_bc2 = sqrt(v / (1 - b2^t)) and
    m * step_size / lr = m / (1 - b1^t): the update lr * mhat / (sqrt(vhat) + eps).
    """
    zero = acc[0]
    t, i0 = _chunk(ends, per)
    p, g, m, v = ps[t], gs[t], ms[t], vs[t]
    for j in range(per):
        i = i0 + j * cuda.blockDim.x
        if i >= p.size:
            return
        w = p[i] + zero
        d = (g[i] + zero) + wd * w
        mi = b1 * (m[i] + zero) + c1 * d
        vi = b2 * (v[i] + zero) + c2 * d * d
        m[i] = mi
        v[i] = vi
        p[i] = w - step_size * mi / (math.sqrt(vi) * rsqrt_bc2 + eps)


def SIGNATURES(t, acc):
    a, z = t[::1], acc[::1]
    ta, tz = types.UniTuple(a, TENSORS), types.UniTuple(z, TENSORS)
    ends = types.UniTuple(int64, TENSORS)
    return {"axpy_fwd_kernel": (a, a, acc, z),
            "sgd_fwd_kernel": (ta, ta, tz, ends, int64, acc, acc, acc, acc, int64, int64, z),
            "adam_fwd_kernel": (ta, ta, tz, tz, ends, int64, acc, acc, acc, acc, acc, acc, acc,
                                acc, z)}
