"""cuDNN local response normalization across channels: cudnnLRNCrossChannelForward /
cudnnLRNCrossChannelBackward (CUDNN_LRN_CROSS_CHANNEL_DIM1) with a cached LRN descriptor.

cuDNN's definition (cudnn_ops.h): y = x * (k + alpha/n * sum of x^2 over the window)^-beta,
the window of channel c being [c - lookBehind, c + lookAhead] clipped to the channels, with
lookBehind = floor((n - 1) / 2) and lookAhead = n - lookBehind - 1; cuDNN divides lrnAlpha by
the window width n itself. cudnnSetLRNDescriptor returns CUDNN_STATUS_BAD_PARAM unless
1 <= n <= 16 (CUDNN_LRN_MIN_N, CUDNN_LRN_MAX_N), k >= 1e-5 (CUDNN_LRN_MIN_K) and
beta >= 0.01 (CUDNN_LRN_MIN_BETA); alpha takes any value (probed with cuDNN 9.28: 0 and -1
are accepted). The op checks these before calling (its ``supports()``).

The normalization runs over dimension 1 whatever the spatial dims, so every tensor is
described as the 4-D (N, C, S, 1), S the product of the spatial dims. Inputs are device
arrays exposing ``__cuda_array_interface__`` (already validated by the op); ``stream`` is the
raw ``cudaStream_t`` value (0 = the legacy default stream).
"""

from ctypes import POINTER, c_double, c_int, c_uint, c_void_p

import numpy as np

from . import api, descriptors, handle
from .api import ptr
from .descriptors import Descriptor, DescriptorCache, scalar_refs

_p = c_void_p

PROTOTYPES = {
    # cudnnStatus_t cudnnCreateLRNDescriptor(cudnnLRNDescriptor_t *normDesc);
    "cudnnCreateLRNDescriptor": [POINTER(_p)],
    # cudnnStatus_t cudnnDestroyLRNDescriptor(cudnnLRNDescriptor_t lrnDesc);
    "cudnnDestroyLRNDescriptor": [_p],
    # cudnnStatus_t cudnnSetLRNDescriptor(cudnnLRNDescriptor_t normDesc, unsigned lrnN,
    #     double lrnAlpha, double lrnBeta, double lrnK);
    "cudnnSetLRNDescriptor": [_p, c_uint, c_double, c_double, c_double],
    # cudnnStatus_t cudnnLRNCrossChannelForward(cudnnHandle_t handle,
    #     cudnnLRNDescriptor_t normDesc, cudnnLRNMode_t lrnMode, const void *alpha,
    #     const cudnnTensorDescriptor_t xDesc, const void *x, const void *beta,
    #     const cudnnTensorDescriptor_t yDesc, void *y);
    "cudnnLRNCrossChannelForward": [_p, _p, c_int, _p, _p, _p, _p, _p, _p],
    # cudnnStatus_t cudnnLRNCrossChannelBackward(cudnnHandle_t handle,
    #     cudnnLRNDescriptor_t normDesc, cudnnLRNMode_t lrnMode, const void *alpha,
    #     const cudnnTensorDescriptor_t yDesc, const void *y,
    #     const cudnnTensorDescriptor_t dyDesc, const void *dy,
    #     const cudnnTensorDescriptor_t xDesc, const void *x, const void *beta,
    #     const cudnnTensorDescriptor_t dxDesc, void *dx);
    "cudnnLRNCrossChannelBackward": [_p, _p, c_int, _p, _p, _p, _p, _p, _p, _p, _p, _p, _p],
}
api.register_prototypes(PROTOTYPES)

# cudnnLRNMode_t (cudnn_ops.h)
LRN_CROSS_CHANNEL_DIM1 = 0
# cudnnSetLRNDescriptor's limits (cudnn_ops.h: CUDNN_LRN_MIN_N, _MAX_N, _MIN_K, _MIN_BETA)
MIN_N, MAX_N, MIN_K, MIN_BETA = 1, 16, 1e-5, 0.01


class LRNDescriptor(Descriptor):
    """Window width n, alpha (cuDNN divides it by n), beta and k (cudnnSetLRNDescriptor)."""
    create_fn, destroy_fn = "cudnnCreateLRNDescriptor", "cudnnDestroyLRNDescriptor"

    def __init__(self, n, alpha, beta, k):
        super().__init__()
        try:
            api.call("cudnnSetLRNDescriptor", self.ptr, int(n), float(alpha), float(beta),
                     float(k), context=f"n {n}, alpha {alpha}, beta {beta}, k {k}")
        except Exception:
            self.close()
            raise


_descs = DescriptorCache(LRNDescriptor)


def _ctx(op, dims, dtype, n, alpha, beta, k):
    """A function that describes the call (only formatted when cuDNN reports an error)."""
    return lambda: (f"{op}: (N, C, S, 1) {dims} {np.dtype(dtype).name}, n {n}, alpha {alpha}, "
                    f"beta {beta}, k {k}")


def forward(x, y, dims, n, alpha, beta, k, stream):
    """y = lrn(x); ``dims`` is the (N, C, S, 1) view of x."""
    a, b = scalar_refs(x.dtype)
    td = descriptors.tensor(dims, x.dtype)
    api.call("cudnnLRNCrossChannelForward", handle.get(stream), _descs.get(n, alpha, beta, k),
             LRN_CROSS_CHANNEL_DIM1, a, td, ptr(x), b, td, ptr(y),
             context=_ctx("lrn", dims, x.dtype, n, alpha, beta, k))


def backward(x, y, dy, dx, dims, n, alpha, beta, k, stream):
    """dx from x, y = lrn(x) and dy, on the same (N, C, S, 1) view (cuDNN's argument order:
    y, dy, x, then dx)."""
    a, b = scalar_refs(x.dtype)
    td = descriptors.tensor(dims, x.dtype)
    api.call("cudnnLRNCrossChannelBackward", handle.get(stream), _descs.get(n, alpha, beta, k),
             LRN_CROSS_CHANNEL_DIM1, a, td, ptr(y), td, ptr(dy), td, ptr(x), b, td, ptr(dx),
             context=_ctx("lrn_backward", dims, x.dtype, n, alpha, beta, k))
