"""The Numba launches of the losses (dnnkit/ops/loss.py): the deterministic two-kernel sum
and the one-thread finish of kernels/loss.py, and the elementwise forward ("none") and
backward kernels, all reading their scales (the count, the upstream gradient) on the device.

Launch shapes: the partial sums take up to 4096 blocks of up to 256 threads (a power of two,
their shared-memory tree), the final sum one block over the partials, the finish one thread;
the elementwise kernels a grid-stride 1-D grid (arrays.grid_1d).

The kernels are imported inside the functions: they import numba, which ``import dnnkit`` does
not pay for.
"""

import numpy as np

from .. import arrays
from ..launch import launch, pow2_at_most

REDUCTION_ID = {"none": 0, "sum": 1, "mean": 2}     # kernels/loss.py
_MAX_THREADS, _MAX_BLOCKS = 256, 4096


def ncs(x):
    """(N, C, S) of a (N, C, d1, ...) input: S = d1 * d2 * ..."""
    n, c = x.shape[0], x.shape[1]
    return n, c, (x.size // (n * c) if n * c else int(np.prod(tuple(x.shape)[2:])))


def reduce_sum(kernel, args, positions, acc, stream):
    """The two-kernel deterministic sum (kernels/loss.py) of ``kernel``'s partials: (total,
    count) as one-element device arrays (acc type, int64). ``args``: the kernel's arguments
    before and after its (part, cnt) pair, split at 2."""
    from ..kernels import loss_sum_fwd_kernel
    threads = pow2_at_most(max(positions, 1), _MAX_THREADS)
    blocks = max(1, min(_MAX_BLOCKS, -(-positions // threads)))
    size = acc.dtype.itemsize
    part = arrays.cuda_empty((blocks,), acc.dtype, stream)
    cnt = arrays.cuda_empty((blocks,), np.int64, stream)
    launch(kernel, blocks, threads, stream, (*args[:2], part, cnt, *args[2:], acc),
           threads * size)
    out = arrays.cuda_empty((1,), acc.dtype, stream)
    out_cnt = arrays.cuda_empty((1,), np.int64, stream)
    t2 = pow2_at_most(blocks, _MAX_THREADS)
    launch(loss_sum_fwd_kernel, 1, t2, stream, (part, cnt, out, out_cnt, acc), t2 * size)
    return out, out_cnt


def finish(out, out_cnt, dtype, mean, stream):
    """The 0-d loss: out / count (mean) or out, divided and rounded on the device."""
    from ..kernels import loss_finish_kernel
    y = arrays.cuda_empty((1,), dtype, stream)
    launch(loss_finish_kernel, 1, 1, stream,
           (out, out_cnt, y, int(mean), arrays.acc_array(dtype)))
    return arrays.reshaped(y, ())


def _launch_1d(kernel, n, stream, args):
    if n:
        blocks, threads = arrays.grid_1d(n)
        launch(kernel, blocks, threads, stream, args)


def nll_forward(logp, target, reduction, ignore, stream):
    """The nll of logp (N, C, ...) at the targets, reduced."""
    from ..kernels import nll_fwd_kernel, nll_none_fwd_kernel
    n, c, sp = ncs(logp)
    acc = arrays.acc_array(logp.dtype)
    ft = arrays.flat(target)
    if reduction == "none":
        y = arrays.cuda_empty(tuple(target.shape), logp.dtype, stream)
        _launch_1d(nll_none_fwd_kernel, n * sp, stream,
                   (arrays.flat(logp), ft, arrays.flat(y), n, c, sp, ignore, acc))
        return y
    out, cnt = reduce_sum(nll_fwd_kernel, (arrays.flat(logp), ft, n, c, sp, ignore), n * sp,
                          acc, stream)
    return finish(out, cnt, logp.dtype, reduction == "mean", stream)


def nll_backward(logp, target, dy, reduction, ignore, softmax_flag, stream):
    """dlogits (softmax_flag 1) or dlogp (0) from logp, on the device (kernels/loss.py)."""
    from ..kernels import nll_bwd_scaled_kernel, nll_fwd_kernel
    n, c, sp = ncs(logp)
    acc = arrays.acc_array(logp.dtype)
    dx = arrays.empty_like(logp, stream)
    ft = arrays.flat(target)
    if reduction == "mean":     # the count of the positions that count, on the device
        _, cnt = reduce_sum(nll_fwd_kernel, (arrays.flat(logp), ft, n, c, sp, ignore),
                            n * sp, acc, stream)
    else:
        cnt = arrays.constant(np.zeros(1), np.int64)    # not read
    _launch_1d(nll_bwd_scaled_kernel, n * c * sp, stream,
               (arrays.flat(logp), ft, arrays.flat(dx), n, c, sp, ignore, arrays.flat(dy), cnt,
                REDUCTION_ID[reduction], softmax_flag, acc))
    return dx


def mse_forward(x, target, reduction, stream):
    """(x - target)^2 per element, or its mean or sum as a 0-d array."""
    from ..kernels import mse_fwd_kernel, mse_none_fwd_kernel
    acc = arrays.acc_array(x.dtype)
    if reduction == "none":
        y = arrays.empty_like(x, stream)
        _launch_1d(mse_none_fwd_kernel, x.size, stream,
                   (arrays.flat(x), arrays.flat(target), arrays.flat(y), acc))
        return y
    out, cnt = reduce_sum(mse_fwd_kernel, (arrays.flat(x), arrays.flat(target)), x.size, acc,
                          stream)
    return finish(out, cnt, x.dtype, reduction == "mean", stream)


def mse_backward(x, target, dy, reduction, stream):
    """2 g (x - target), g read from dy on the device."""
    from ..kernels import mse_bwd_scaled_kernel
    dx = arrays.empty_like(x, stream)
    _launch_1d(mse_bwd_scaled_kernel, x.size, stream,
               (arrays.flat(x), arrays.flat(target), arrays.flat(dx), arrays.flat(dy),
                REDUCTION_ID[reduction], arrays.acc_array(x.dtype)))
    return dx
