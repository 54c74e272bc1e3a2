"""Batch normalization on the Numba kernels (kernels/batchnorm.py): the launch plan and the
three ops' implementations. Welford statistics merged in a fixed order: deterministic.

The kernels are imported inside the functions: they import numba, which ``import dnnkit``
does not pay for.
"""

import collections

import numpy as np

from .. import arrays, device
from ..launch import flat as flat_arg, launch, pow2_at_most
from ..registry import register
from . import inplace

THREADS = 256               # block size, at most: <= kernels.batchnorm.MAX_THREADS
MAX_GRID_Y = 65535
_THREADS_PER_SM = 2048      # resident threads per SM, at most (sm_80, sm_90)
_SIMULATED_SMS = 132        # the simulator plans as an H100 does, so its tests see the splits
ACT = {None: 0, "relu": 1}   # the kernels' ``act`` argument
TOL = {"float16": (2e-3, 1e-3), "float32": (1e-5, 1e-6), "float64": (1e-12, 1e-14)}
# dgamma/dbeta are long sums: the two backends add in different orders.
TOL_BWD = {"float16": (5e-3, 2e-3), "float32": (1e-4, 1e-5), "float64": (1e-10, 1e-12)}


def ncs(shape, mode):
    """(N, C, S): statistics per c over (n, s); per-activation is spatial on (N, C*S, 1)."""
    s = int(np.prod(shape[2:], dtype=np.int64))
    return (shape[0], shape[1] * s, 1) if mode == "per-activation" else (shape[0], shape[1], s)


def flat_copy(a, stream):
    """A flat device copy of ``a`` (None for None): the running statistics a call updates."""
    if a is None:
        return None
    return arrays.copy_into(arrays.cuda_empty((a.size,), a.dtype, stream), a, stream)


Plan = collections.namedtuple("Plan", "threads sw cw splits_i grid")


def _target_threads():
    """Threads to keep resident: the power of two at most SMs x 2048 (2**18 on the 132 SMs of
    an H100 or H200)."""
    sms = _SIMULATED_SMS if device.simulator() else device.sm_count()
    return 1 << ((sms * _THREADS_PER_SM).bit_length() - 1)


def plan(n, c, s):
    """Block shape and grid of the kernels that walk x (mapping: kernels/batchnorm.py). Splits
    give each channel more blocks when there are few channels, but leave every thread a few
    unrolled trips. Depends only on the shape and the GPU, so results are bitwise repeatable."""
    from ..kernels.batchnorm import MAX_THREADS, UNROLL
    assert THREADS <= MAX_THREADS, "blocks larger than the kernels' launch bound"
    sw = pow2_at_most(s, THREADS)
    cw = pow2_at_most(c, THREADS // sw)
    by = pow2_at_most(n, THREADS // (sw * cw))
    threads = sw * cw * by
    cgroups = -(-c // cw)
    want = -(-max(1, _target_threads() // threads) // cgroups)
    if s > sw:   # long rows: split the samples, then the positions
        so = max(1, min(want, n))
        si = max(1, min(-(-want // so), -(-s // (sw * UNROLL))))
    else:
        so, si = max(1, min(want, -(-n // (by * UNROLL)))), 1
    return Plan(threads, sw, cw, si, (so * si, min(cgroups, MAX_GRID_Y)))


def geo(n, c, s, p):
    return (n, c, s, p.sw, p.cw, p.splits_i)


def _launch_1d(kernel, n, stream, args):
    blocks, threads = arrays.grid_1d(n)
    launch(kernel, blocks, threads, stream, args)


@register("batch_norm_train", "numba", tolerance=TOL, updates=("running_mean", "running_var"))
def _train_numba(x, gamma, beta, mode, epsilon, momentum, running_mean, running_var, stream,
                 activation=None, residual=None):
    from ..kernels import (batch_norm_apply_fwd_kernel, batch_norm_finalize_fwd_kernel,
                           batch_norm_stats_fwd_kernel)
    n, c, s = ncs(x.shape, mode)
    acc = arrays.acc_array(x.dtype)
    t = acc.dtype.type
    y = arrays.empty_like(x, stream)
    # shaped as gamma (c values, read flat by the kernels): no view per call
    mean, invstd = (arrays.cuda_empty(gamma.shape, acc.dtype, stream) for _ in range(2))
    rm, rv = running_mean, running_var        # updated in place (registered as updates)
    if x.size:
        p = plan(n, c, s)
        splits = p.grid[0]
        part = arrays.cuda_empty((3 * splits * c,), acc.dtype, stream)
        launch(batch_norm_stats_fwd_kernel, p.grid, p.threads, stream,
               (flat_arg(x), part, *geo(n, c, s, p), acc),
               3 * p.threads * acc.dtype.itemsize)
        m = n * s
        has = rm is not None
        fm, fi = flat_arg(mean), flat_arg(invstd)
        _launch_1d(batch_norm_finalize_fwd_kernel, c, stream,
                   (flat_arg(x), part, splits, c, s, fm, fi,
                    flat_arg(rm) if has else fm, flat_arg(rv) if has else fi,
                    int(has), t(momentum), t(m / (m - 1)), t(epsilon), acc))
        has_z = residual is not None
        launch(batch_norm_apply_fwd_kernel, p.grid, p.threads, stream,
               (flat_arg(x), flat_arg(residual if has_z else x), flat_arg(y), fm, fi,
                flat_arg(gamma), flat_arg(beta), *geo(n, c, s, p), 0, ACT[activation],
                int(has_z), t(epsilon), acc))
    return y, mean, invstd, rm, rv


@register("batch_norm_inference", "numba", tolerance=TOL)
def _inference_numba(x, gamma, beta, mean, var, mode, epsilon, stream, out=None,
                     activation=None, residual=None):
    from ..kernels import batch_norm_apply_fwd_kernel
    n, c, s = ncs(x.shape, mode)
    acc = arrays.acc_array(x.dtype)
    y = inplace.result(out, x, stream)       # elementwise: each x[i] read before y[i] written
    if x.size:
        p = plan(n, c, s)
        has_z = residual is not None      # (read at i before y[i] is written, as x)
        launch(batch_norm_apply_fwd_kernel, p.grid, p.threads, stream,
               (flat_arg(x), flat_arg(residual if has_z else x), flat_arg(y), flat_arg(mean),
                flat_arg(var), flat_arg(gamma), flat_arg(beta), *geo(n, c, s, p), 1,
                ACT[activation], int(has_z), acc.dtype.type(epsilon), acc))
    return y


@register("batch_norm_backward", "numba", tolerance=TOL_BWD)
def _backward_numba(x, dy, gamma, saved_mean, saved_invstd, mode, epsilon, stream,
                    activation=None, y=None, residual=False):
    from ..kernels import (batch_norm_apply_bwd_kernel, batch_norm_finalize_bwd_kernel,
                           batch_norm_reduce_bwd_kernel)
    n, c, s = ncs(x.shape, mode)
    acc = arrays.acc_array(x.dtype)
    dx = arrays.empty_like(x, stream)
    dgamma, dbeta = (arrays.cuda_empty(gamma.shape, acc.dtype, stream) for _ in range(2))
    dz = arrays.empty_like(x, stream) if residual else None
    if x.size:
        p = plan(n, c, s)
        splits = p.grid[0]
        part = arrays.cuda_empty((2 * splits * c,), acc.dtype, stream)
        f = flat_arg
        act = ACT[activation]
        fy = f(y) if act else f(dy)       # (unread without the activation)
        launch(batch_norm_reduce_bwd_kernel, p.grid, p.threads, stream,
               (f(x), f(dy), fy, act, f(saved_mean), part, *geo(n, c, s, p), acc),
               2 * p.threads * acc.dtype.itemsize)
        _launch_1d(batch_norm_finalize_bwd_kernel, c, stream,
                   (part, splits, c, f(saved_invstd), f(dgamma), f(dbeta), acc))
        launch(batch_norm_apply_bwd_kernel, p.grid, p.threads, stream,
               (f(x), f(dy), fy, act, f(dx), f(dz if residual else dx), int(residual),
                f(saved_mean), f(saved_invstd), f(gamma), f(dgamma), f(dbeta),
                acc.dtype.type(1.0 / (n * s)), *geo(n, c, s, p), acc))
    else:        # (C = 0 or an empty image) the parameter gradients sum nothing
        arrays.zero_fill(dgamma, stream)
        arrays.zero_fill(dbeta, stream)
    return (dx, dgamma, dbeta, dz) if residual else (dx, dgamma, dbeta)
