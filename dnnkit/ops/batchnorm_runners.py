"""Runners of batch normalization's training forward and backward for repeated calls
(dispatch's memo; registry ``binder``), on both backends.

A training step calls them once per BatchNorm layer each, with the same shapes every step. The
full implementations (ops/batchnorm.py, ops/batchnorm_numba.py) redo per call what a
signature fixes: the Numba path its launch plan and the typing and packing of three kernels'
argument lists (~20 each), the cuDNN path its descriptor lookups, handle and function. A
runner does those once; a call allocates its outputs and then
- Numba: writes its arrays' addresses into three launches packed once (``launch.Prepared``)
  and launches them (statistics, finalize, apply);
- cuDNN: makes the one bound cuDNN call (cudnn/batchnorm.py ``bind_training``,
  ``bind_backward``).
Empty tensors keep the full implementations.
"""

from .. import arrays, device
from ..cudnn import batchnorm as cudnn_bn
from ..launch import Prepared, flat as flat_arg
from ..registry import binder
from .batchnorm_numba import ACT, geo, ncs, plan


@binder("batch_norm_train", "cudnn")
def _bind_train_cudnn(x, gamma, beta, mode, epsilon, momentum, running_mean, running_var,
                      stream, activation=None, residual=None):
    if not x.size:
        return None
    run = cudnn_bn.bind_training(x.shape, x.dtype, mode, epsilon, momentum,
                                 device.stream_pointer(stream), activation,
                                 residual is not None)
    alloc_y = arrays.allocator(x.shape, x.dtype, stream)
    alloc_stat = arrays.allocator(gamma.shape, gamma.dtype, stream)

    def batch_norm_train(x, gamma, beta, mode, epsilon, momentum, running_mean, running_var,
                         stream, activation=None, residual=None):
        y, mean, invstd = alloc_y(), alloc_stat(), alloc_stat()
        run(x, y, gamma, beta, mean, invstd, running_mean, running_var, residual)
        return y, mean, invstd, running_mean, running_var
    return batch_norm_train


@binder("batch_norm_backward", "cudnn")
def _bind_backward_cudnn(x, dy, gamma, saved_mean, saved_invstd, mode, epsilon, stream,
                         activation=None, y=None, residual=False):
    if not x.size:
        return None
    run = cudnn_bn.bind_backward(x.shape, x.dtype, mode, epsilon, device.stream_pointer(stream),
                                 activation)
    alloc_dx = arrays.allocator(x.shape, x.dtype, stream)
    alloc_param = arrays.allocator(gamma.shape, gamma.dtype, stream)
    # relu's dy for cuDNN's BN, which is the residual's gradient too (a copy of dy without an
    # activation)
    scratch = alloc_dx if activation or residual else (lambda: None)

    def batch_norm_backward(x, dy, gamma, saved_mean, saved_invstd, mode, epsilon, stream,
                            activation=None, y=None, residual=False):
        dx, dgamma, dbeta, dz = alloc_dx(), alloc_param(), alloc_param(), scratch()
        run(x, dy, dx, gamma, dgamma, dbeta, saved_mean, saved_invstd, y, dz)
        return (dx, dgamma, dbeta, dz) if residual else (dx, dgamma, dbeta)
    return batch_norm_backward


# The Numba runners pack each launch with the first call's arrays standing in for every array
# place (gamma, flat, for the per-channel ones: one Numba type), then set every place on each
# call: a packed launch lets go of the arrays set (launch.Prepared), so none outlives its call.

@binder("batch_norm_train", "numba")
def _bind_train_numba(x, gamma, beta, mode, epsilon, momentum, running_mean, running_var,
                      stream, activation=None, residual=None):
    if not x.size:
        return None
    from ..kernels import (batch_norm_apply_fwd_kernel, batch_norm_finalize_fwd_kernel,
                           batch_norm_stats_fwd_kernel)
    n, c, s = ncs(x.shape, mode)
    acc = arrays.acc_array(x.dtype)
    t, p = acc.dtype.type, plan(n, c, s)
    splits, g, m, has = p.grid[0], geo(n, c, s, p), n * s, running_mean is not None
    has_z = residual is not None
    fx, fc = flat_arg(x), flat_arg(gamma)
    stats = Prepared(batch_norm_stats_fwd_kernel, p.grid, p.threads, (fx, fc, *g, acc),
                     3 * p.threads * acc.dtype.itemsize)
    blocks, threads = arrays.grid_1d(c)
    final = Prepared(batch_norm_finalize_fwd_kernel, blocks, threads,
                     (fx, fc, splits, c, s, fc, fc, fc, fc, int(has), t(momentum),
                      t(m / (m - 1)), t(epsilon), acc))
    apply = Prepared(batch_norm_apply_fwd_kernel, p.grid, p.threads,
                     (fx, fx, fx, fc, fc, fc, fc, *g, 0, ACT[activation], int(has_z),
                      t(epsilon), acc))
    alloc_y = arrays.allocator(x.shape, x.dtype, stream)
    alloc_stat = arrays.allocator(gamma.shape, acc.dtype, stream)
    alloc_part = arrays.allocator((3 * splits * c,), acc.dtype, stream)

    def batch_norm_train(x, gamma, beta, mode, epsilon, momentum, running_mean, running_var,
                         stream, activation=None, residual=None):
        y, mean, invstd, part = alloc_y(), alloc_stat(), alloc_stat(), alloc_part()
        rm, rv = (running_mean, running_var) if has else (mean, invstd)
        stats.set_flat(0, x)
        stats.set_flat(1, part)
        stats(stream)
        for i, a in ((0, x), (1, part), (5, mean), (6, invstd), (7, rm), (8, rv)):
            final.set_flat(i, a)
        final(stream)
        for i, a in enumerate((x, residual if has_z else x, y, mean, invstd, gamma, beta)):
            apply.set_flat(i, a)
        apply(stream)
        return y, mean, invstd, running_mean, running_var
    return batch_norm_train


@binder("batch_norm_backward", "numba")
def _bind_backward_numba(x, dy, gamma, saved_mean, saved_invstd, mode, epsilon, stream,
                         activation=None, y=None, residual=False):
    if not x.size:
        return None
    from ..kernels import (batch_norm_apply_bwd_kernel, batch_norm_finalize_bwd_kernel,
                           batch_norm_reduce_bwd_kernel)
    n, c, s = ncs(x.shape, mode)
    acc = arrays.acc_array(x.dtype)
    p = plan(n, c, s)
    splits, g = p.grid[0], geo(n, c, s, p)
    fx, fc = flat_arg(x), flat_arg(gamma)
    act = ACT[activation]
    reduce = Prepared(batch_norm_reduce_bwd_kernel, p.grid, p.threads,
                      (fx, fx, fx, act, fc, fc, *g, acc), 2 * p.threads * acc.dtype.itemsize)
    blocks, threads = arrays.grid_1d(c)
    final = Prepared(batch_norm_finalize_bwd_kernel, blocks, threads,
                     (fc, splits, c, fc, fc, fc, acc))
    apply = Prepared(batch_norm_apply_bwd_kernel, p.grid, p.threads,
                     (fx, fx, fx, act, fx, fx, int(residual), fc, fc, fc, fc, fc,
                      acc.dtype.type(1.0 / (n * s)), *g, acc))
    alloc_dx = arrays.allocator(x.shape, x.dtype, stream)
    alloc_param = arrays.allocator(gamma.shape, acc.dtype, stream)
    alloc_part = arrays.allocator((2 * splits * c,), acc.dtype, stream)

    def batch_norm_backward(x, dy, gamma, saved_mean, saved_invstd, mode, epsilon, stream,
                            activation=None, y=None, residual=False):
        dx, dgamma, dbeta, part = alloc_dx(), alloc_param(), alloc_param(), alloc_part()
        dz = alloc_dx() if residual else dx    # (unwritten without the residual)
        w = y if act else dy              # (unread without the activation)
        for i, a in ((0, x), (1, dy), (2, w), (4, saved_mean), (5, part)):
            reduce.set_flat(i, a)
        reduce(stream)
        for i, a in ((0, part), (3, saved_invstd), (4, dgamma), (5, dbeta)):
            final.set_flat(i, a)
        final(stream)
        for i, a in ((0, x), (1, dy), (2, w), (4, dx), (5, dz), (7, saved_mean),
                     (8, saved_invstd), (9, gamma), (10, dgamma), (11, dbeta)):
            apply.set_flat(i, a)
        apply(stream)
        return (dx, dgamma, dbeta, dz) if residual else (dx, dgamma, dbeta)
    return batch_norm_backward
