"""The Numba backend of the spatial transformer ops (dnnkit/ops/spatial.py has the public
functions, their checks and the cuDNN backend): the grid generator, its backward (a reduction
in parts), and the bilinear samplers of kernels/spatial.py, forward and backward.
"""

import numpy as np

from .. import arrays, config, device
from ..launch import launch, pow2_at_most
from ..registry import register
from ..tracing import note_algo

TOLERANCE = {"float16": (1e-2, 1e-2), "float32": (1e-5, 1e-5), "float64": (1e-12, 1e-12)}

# (The kernels are imported inside the functions: they import numba, which ``import dnnkit``
# does not pay for.)

def _launch(kernel, n, stream, args, threads=256):
    if n:
        blocks, threads = arrays.grid_1d(n, threads=32 if device.simulator() else threads)
        launch(kernel, blocks, threads, stream, args)


def kernel_geo(op, img, oh, ow):
    """The samplers' ``geo`` (N, C, H, W, H', W'). They index within an image plane in 32 bits
    (kernels/spatial.py, ``_axis`` and ``_taps``): H*W under 2**32 and each side under 2**31
    (cuDNN's own limit is 2**31 elements per tensor)."""
    n, c, h, w = (int(v) for v in img.shape)
    if h * w >= 2**32 or max(h, w) >= 2**31 - 1:
        raise ValueError(f"{op}: the Numba sampler takes image planes of fewer than 2**32 "
                         f"pixels, each side under 2**31 - 1; got H={h}, W={w}")
    return n, c, h, w, int(oh), int(ow)


@register("affine_grid", "numba", tolerance=TOLERANCE)
def _grid_numba(theta, out_shape, stream):
    from ..kernels import spatial_grid_fwd_kernel
    n, _, oh, ow = out_shape
    grid = arrays.cuda_empty((n, oh, ow, 2), theta.dtype, stream)
    _launch(spatial_grid_fwd_kernel, n * oh * ow, stream,
            (arrays.flat(theta), arrays.flat(grid), n, oh, ow, arrays.acc_array(theta.dtype)))
    return grid


@register("affine_grid_backward", "numba", tolerance=TOLERANCE)
def _grid_backward_numba(dgrid, stream):
    from ..kernels import conv_partsum_fwd_kernel, spatial_grid_bwd_kernel
    n, oh, ow, _ = dgrid.shape
    dtheta = arrays.cuda_empty((n, 2, 3), dgrid.dtype, stream)
    if n:
        acc = arrays.acc_array(dgrid.dtype)
        sim = device.simulator()
        t = max(pow2_at_most(oh * ow, 8 if sim else 256), 8)   # threads 0..5 write
        # blocks per image: ~16 points per thread (4 on the simulator, so that its small
        # tests split), at most 64. A function of the image's size only, not of N: an
        # image's dtheta is the same sum, in the same order, in any batch.
        parts = max(1, min(64, oh * ow // ((4 if sim else 16) * t)))
        part = arrays.cuda_empty((n * parts * 6,), acc.dtype, stream)
        launch(spatial_grid_bwd_kernel, n * parts, t, stream,
               (arrays.flat(dgrid), part, n, oh, ow, parts, acc), 6 * t * acc.dtype.itemsize)
        # dtheta = the parts added in order (the split GEMMs' partial-sum kernel; no bias)
        out = arrays.flat(dtheta)
        _launch(conv_partsum_fwd_kernel, n * 6, stream,
                (part, out, parts, n * 6, out, 0, 1, 0, acc))
    return dtheta


def _samplers(c, dtype):
    """(forward, backward) sampler kernels for c channels of ``dtype``: min(c, 4) channels per
    trip, launch bounds for 8-byte data apart (kernels/spatial.py)."""
    from ..kernels.spatial import MAX_CB, sampler_kernels
    return sampler_kernels(max(1, min(c, MAX_CB)), np.dtype(dtype).itemsize > 4)


def _sample(op, img, grid, theta, out_shape, stream):
    """y (N, C, H', W') sampled from img at grid, or at theta's grid computed in place."""
    from ..kernels.spatial import FWD_BLOCK
    n, c, oh, ow = out_shape
    y = arrays.cuda_empty(out_shape, img.dtype, stream)
    if y.size:
        from_theta = grid is None
        src = arrays.flat(theta if from_theta else grid)
        # (the simulator's grid is capped small so that tests walk the grid-stride loops)
        sim = device.simulator()
        bx, by = (8, 2) if sim else FWD_BLOCK
        blocks = (-(-ow // bx), min(-(-oh // by), 2 if sim else 65535),
                  min(n, 1 if sim else 65535))
        launch(_samplers(c, img.dtype)[0], blocks, (bx, by), stream,
               (arrays.flat(img), src, src, arrays.flat(y), kernel_geo(op, img, oh, ow),
                int(from_theta), arrays.acc_array(img.dtype)))
    return y


@register("grid_sample", "numba", tolerance=TOLERANCE)
def _sample_numba(img, grid, stream):
    out_shape = tuple(img.shape[:2]) + tuple(grid.shape[1:3])
    return _sample("grid_sample", img, grid, None, out_shape, stream)


@register("grid_sample_backward", "numba", tolerance=TOLERANCE)
def _sample_backward_numba(img, grid, dy, stream):
    from ..kernels import (spatial_cast_bwd_kernel, spatial_dimg_det_bwd_kernel,
                           spatial_fill_bwd_kernel)
    _, _, oh, ow = dy.shape
    geo = kernel_geo("grid_sample_backward", img, oh, ow)
    acc = arrays.acc_array(img.dtype)
    dimg = arrays.empty_like(img, stream)
    dgrid = arrays.empty_like(grid, stream)
    # dimg accumulates in acc's type: dimg itself, or a float32 buffer for float16 data
    buf = dimg if acc.dtype == img.dtype else arrays.cuda_empty(img.shape, acc.dtype, stream)
    det = config.get("dnn.deterministic")
    note_algo("gather_rows" if det else "atomic")
    if det:
        _launch(spatial_dimg_det_bwd_kernel, img.shape[0] * img.shape[2], stream,
                (arrays.flat(grid), arrays.flat(dy), arrays.flat(buf), geo, acc),
                threads=64)   # few threads (N*H): small blocks spread them over every SM
    else:
        _launch(spatial_fill_bwd_kernel, buf.size, stream, (arrays.flat(buf), acc.dtype.type(0)))
    from ..kernels.spatial import SAMPLER_THREADS      # (its launch bound)
    _launch(_samplers(img.shape[1], img.dtype)[1], grid.size // 2, stream,
            (arrays.flat(img), arrays.flat(grid), arrays.flat(dy),
             acc if det else arrays.flat(buf), arrays.flat(dgrid), geo, 0 if det else 1, acc),
            threads=SAMPLER_THREADS)
    if buf is not dimg:
        _launch(spatial_cast_bwd_kernel, dimg.size, stream, (arrays.flat(buf), arrays.flat(dimg)))
    return dimg, dgrid


@register("spatial_transformer", "numba", tolerance=TOLERANCE)
def _st_numba(img, theta, out_shape, stream):
    # the grid computed inside the sampler: no grid written and read back (at 64x3x224x224
    # float32: 77 MB moved, where affine_grid + grid_sample move 128)
    out_shape = tuple(img.shape[:2]) + tuple(out_shape[2:])
    return _sample("spatial_transformer", img, None, theta, out_shape, stream)
