"""cuDNN spatial transformer: cudnnSpatialTfGridGeneratorForward/Backward and
cudnnSpatialTfSamplerForward/Backward with a spatial transformer descriptor (bilinear sampler,
4-D NCHW output dims (N, C, H', W')).

theta (N, 2, 3), grid (N, H', W', 2) and the images are packed device arrays of one dtype; the
descriptor carries the dtype and the *output* dims. The grid functions take no tensor
descriptors (the grid's shape follows from the descriptor's N, H', W'); they use only those
dims, so the grid-only calls here pass C = 1.

alpha/beta (host scalars, double for double data, float otherwise): the forward sampler
blends y = alpha * sample + beta * y; the backward sampler has one pair for dx
(dx = alpha * dimg + beta * dx) and one for dgrid (alphaDgrid, betaDgrid). All betas are 0
here: outputs are overwritten. The coordinate convention is checked on the GPU by
tests/gpu/test_spatial.py against kernels/spatial.py's.
"""

from ctypes import POINTER, c_int, c_void_p

import numpy as np

from . import api, handle
from .api import ptr
from .descriptors import Descriptor, DescriptorCache, int_array, scalar_refs, tensor
from .enums import DATA_TYPES

_p = c_void_p
_int_p = POINTER(c_int)

PROTOTYPES = {
    # cudnnStatus_t cudnnCreateSpatialTransformerDescriptor(
    #     cudnnSpatialTransformerDescriptor_t *stDesc);
    "cudnnCreateSpatialTransformerDescriptor": [POINTER(_p)],
    # cudnnStatus_t cudnnDestroySpatialTransformerDescriptor(
    #     cudnnSpatialTransformerDescriptor_t stDesc);
    "cudnnDestroySpatialTransformerDescriptor": [_p],
    # cudnnStatus_t cudnnSetSpatialTransformerNdDescriptor(
    #     cudnnSpatialTransformerDescriptor_t stDesc, cudnnSamplerType_t samplerType,
    #     cudnnDataType_t dataType, const int nbDims, const int dimA[]);
    "cudnnSetSpatialTransformerNdDescriptor": [_p, c_int, c_int, c_int, _int_p],
    # cudnnStatus_t cudnnSpatialTfGridGeneratorForward(cudnnHandle_t handle,
    #     const cudnnSpatialTransformerDescriptor_t stDesc, const void *theta, void *grid);
    "cudnnSpatialTfGridGeneratorForward": [_p] * 4,
    # cudnnStatus_t cudnnSpatialTfGridGeneratorBackward(cudnnHandle_t handle,
    #     const cudnnSpatialTransformerDescriptor_t stDesc, const void *dgrid, void *dtheta);
    "cudnnSpatialTfGridGeneratorBackward": [_p] * 4,
    # cudnnStatus_t cudnnSpatialTfSamplerForward(cudnnHandle_t handle,
    #     cudnnSpatialTransformerDescriptor_t stDesc, const void *alpha,
    #     const cudnnTensorDescriptor_t xDesc, const void *x, const void *grid,
    #     const void *beta, cudnnTensorDescriptor_t yDesc, void *y);
    "cudnnSpatialTfSamplerForward": [_p] * 9,
    # cudnnStatus_t cudnnSpatialTfSamplerBackward(cudnnHandle_t handle,
    #     cudnnSpatialTransformerDescriptor_t stDesc, const void *alpha,
    #     const cudnnTensorDescriptor_t xDesc, const void *x, const void *beta,
    #     const cudnnTensorDescriptor_t dxDesc, void *dx, const void *alphaDgrid,
    #     const cudnnTensorDescriptor_t dyDesc, const void *dy, const void *grid,
    #     const void *betaDgrid, void *dgrid);
    "cudnnSpatialTfSamplerBackward": [_p] * 14,
}
api.register_prototypes(PROTOTYPES)

SAMPLER_BILINEAR = 0   # cudnnSamplerType_t: CUDNN_SAMPLER_BILINEAR


class SpatialTransformerDescriptor(Descriptor):
    """Bilinear sampler, data type, 4-D output dims (N, C, H', W')
    (cudnnSetSpatialTransformerNdDescriptor)."""
    create_fn = "cudnnCreateSpatialTransformerDescriptor"
    destroy_fn = "cudnnDestroySpatialTransformerDescriptor"

    def __init__(self, out_dims, dtype):
        if len(out_dims) != 4:
            raise ValueError(f"spatial transformer: output dims must be 4-D (N, C, H', W'); "
                             f"got {tuple(out_dims)}")
        dims = int_array(out_dims, "output dims")
        name = np.dtype(dtype).name
        super().__init__()   # after the checks, so a bad argument leaks nothing
        self.out_dims = tuple(out_dims)
        try:
            api.call("cudnnSetSpatialTransformerNdDescriptor", self.ptr, SAMPLER_BILINEAR,
                     DATA_TYPES[name], 4, dims,
                     context=f"bilinear, {name}, output dims {tuple(out_dims)}")
        except Exception:
            self.close()
            raise


_sts = DescriptorCache(SpatialTransformerDescriptor)


def _st(dims, dtype):
    """The shared (cached) spatial transformer descriptor of output ``dims``."""
    return _sts.get(tuple(dims), dtype)


def grid_forward(theta, grid, stream):
    """grid (N, H', W', 2) from theta (N, 2, 3)."""
    n, oh, ow, _ = grid.shape
    api.call("cudnnSpatialTfGridGeneratorForward", handle.get(stream),
             _st((n, 1, oh, ow), grid.dtype), ptr(theta), ptr(grid),
             context=lambda: f"grid forward: grid {tuple(grid.shape)} {grid.dtype}")


def grid_backward(dgrid, dtheta, stream):
    """dtheta (N, 2, 3) from dgrid (N, H', W', 2)."""
    n, oh, ow, _ = dgrid.shape
    api.call("cudnnSpatialTfGridGeneratorBackward", handle.get(stream),
             _st((n, 1, oh, ow), dgrid.dtype), ptr(dgrid), ptr(dtheta),
             context=lambda: f"grid backward: dgrid {tuple(dgrid.shape)}")


def sampler_forward(img, grid, y, stream):
    """y (N, C, H', W') = bilinear samples of img (N, C, H, W) at grid."""
    alpha, beta = scalar_refs(img.dtype)
    api.call("cudnnSpatialTfSamplerForward", handle.get(stream), _st(y.shape, y.dtype), alpha,
             tensor(img.shape, img.dtype), ptr(img), ptr(grid), beta,
             tensor(y.shape, y.dtype), ptr(y),
             context=lambda: f"sampler forward: img {tuple(img.shape)}, y {tuple(y.shape)} "
                             f"{img.dtype}")


def sampler_backward(img, grid, dy, dimg, dgrid, stream):
    """dimg and dgrid from img, grid and dy (alpha 1, beta 0 for both)."""
    alpha, beta = scalar_refs(img.dtype)
    xd = tensor(img.shape, img.dtype)
    api.call("cudnnSpatialTfSamplerBackward", handle.get(stream), _st(dy.shape, dy.dtype), alpha,
             xd, ptr(img), beta, xd, ptr(dimg), alpha, tensor(dy.shape, dy.dtype), ptr(dy),
             ptr(grid), beta, ptr(dgrid),
             context=lambda: f"sampler backward: img {tuple(img.shape)}, dy {tuple(dy.shape)} "
                             f"{img.dtype}")
