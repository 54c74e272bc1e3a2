"""cuDNN softmax: cudnnSoftmaxForward / cudnnSoftmaxBackward over a 4-D (N, C, H, W) view.

``algo`` is a key of ``enums.SOFTMAX_ALGO`` (fast, accurate, log) and ``mode`` of
``enums.SOFTMAX_MODE`` (instance: over C*H*W per sample; channel: over C per position). The op
passes ``dims``, the 4-D view of its array that cuDNN reduces over. Inputs are device arrays
exposing ``__cuda_array_interface__`` (already validated by the op); ``stream`` is the raw
``cudaStream_t`` value (0 = the legacy default stream).
"""

from ctypes import c_int, c_void_p

from . import api, descriptors, handle
from .api import ptr
from .descriptors import scalar_refs
from .enums import SOFTMAX_ALGO, SOFTMAX_MODE

_p = c_void_p

PROTOTYPES = {
    # cudnnStatus_t cudnnSoftmaxForward(cudnnHandle_t handle, cudnnSoftmaxAlgorithm_t algorithm,
    #     cudnnSoftmaxMode_t mode, const void *alpha, const cudnnTensorDescriptor_t xDesc,
    #     const void *x, const void *beta, const cudnnTensorDescriptor_t yDesc, void *y);
    "cudnnSoftmaxForward": [_p, c_int, c_int, _p, _p, _p, _p, _p, _p],
    # cudnnStatus_t cudnnSoftmaxBackward(cudnnHandle_t handle, cudnnSoftmaxAlgorithm_t algorithm,
    #     cudnnSoftmaxMode_t mode, const void *alpha, const cudnnTensorDescriptor_t yDesc,
    #     const void *y, const cudnnTensorDescriptor_t dyDesc, const void *dy,
    #     const void *beta, const cudnnTensorDescriptor_t dxDesc, void *dx);
    "cudnnSoftmaxBackward": [_p, c_int, c_int, _p, _p, _p, _p, _p, _p, _p, _p],
}
api.register_prototypes(PROTOTYPES)


def _ctx(op, detail, **arrays):
    """A function that describes the call (only formatted when cuDNN reports an error)."""
    return lambda: f"{op}: " + ", ".join(f"{k} {tuple(v.shape)} {v.dtype}"
                                         for k, v in arrays.items()) + detail()


def forward(x, y, dims, mode, algo, stream):
    """y = softmax(x); ``dims`` is the 4-D (N, C, H, W) view of x that cuDNN reduces over."""
    alpha, beta = scalar_refs(x.dtype)
    td = descriptors.tensor(dims, x.dtype)
    api.call("cudnnSoftmaxForward", handle.get(stream), SOFTMAX_ALGO[algo], SOFTMAX_MODE[mode],
             alpha, td, ptr(x), beta, td, ptr(y),
             context=_ctx("softmax", lambda: f", algo {algo}, mode {mode}", x=x))


def backward(y, dy, dx, dims, mode, algo, stream):
    """dx from y = softmax(x) and dy, on the same 4-D view."""
    alpha, beta = scalar_refs(y.dtype)
    td = descriptors.tensor(dims, y.dtype)
    api.call("cudnnSoftmaxBackward", handle.get(stream), SOFTMAX_ALGO[algo], SOFTMAX_MODE[mode],
             alpha, td, ptr(y), td, ptr(dy), beta, td, ptr(dx),
             context=_ctx("softmax_backward", lambda: f", algo {algo}, mode {mode}", y=y))
