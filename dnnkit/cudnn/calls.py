"""Array-level cuDNN operations (the second layer, as CuPy's cupyx.cudnn over its bindings).

Inputs are device arrays exposing ``__cuda_array_interface__`` (already validated by the op);
``stream`` is the raw ``cudaStream_t`` value (0 = the legacy default stream).
"""

import ctypes

from . import api, handle
from .descriptors import ActivationDescriptor, TensorDescriptor, scalars
from .enums import ACTIVATION, SOFTMAX_ALGO, SOFTMAX_MODE


def _ptr(a):
    # Numba arrays: read the pointer directly (their __cuda_array_interface__ also converts
    # the array's stream, which warns under cuda-bindings 13); others through the interface.
    p = getattr(a, "device_ctypes_pointer", None)
    if p is not None:
        return ctypes.c_void_p(p.value)
    return ctypes.c_void_p(a.__cuda_array_interface__["data"][0] or None)


def _ctx(op, **arrays):
    return f"{op}: " + ", ".join(f"{k} {tuple(v.shape)} {v.dtype}" for k, v in arrays.items())


def _activation_desc(mode, coef):
    if mode == "swish":
        return ActivationDescriptor(ACTIVATION[mode], 0.0, swish_beta=coef)
    return ActivationDescriptor(ACTIVATION[mode], coef)


def activation_forward(x, y, mode, coef, stream):
    """y = f(x) elementwise; the tensor is described as (1, 1, 1, size)."""
    h = handle.get(stream)
    alpha, beta = scalars(x.dtype)
    with _activation_desc(mode, coef) as ad, TensorDescriptor((1, 1, 1, x.size), x.dtype) as td:
        api.call("cudnnActivationForward", h, ad, ctypes.byref(alpha), td, _ptr(x),
                 ctypes.byref(beta), td, _ptr(y),
                 context=_ctx("activation", x=x) + f", mode {mode}, coef {coef}")


def activation_backward(x, y, dy, dx, mode, coef, stream):
    h = handle.get(stream)
    alpha, beta = scalars(x.dtype)
    with _activation_desc(mode, coef) as ad, TensorDescriptor((1, 1, 1, x.size), x.dtype) as td:
        api.call("cudnnActivationBackward", h, ad, ctypes.byref(alpha), td, _ptr(y), td, _ptr(dy),
                 td, _ptr(x), ctypes.byref(beta), td, _ptr(dx),
                 context=_ctx("activation_backward", x=x) + f", mode {mode}, coef {coef}")


def softmax_forward(x, y, dims, mode, algo, stream):
    """``dims`` is the 4-D (N, C, H, W) view of x that cuDNN's softmax reduces over."""
    h = handle.get(stream)
    alpha, beta = scalars(x.dtype)
    with TensorDescriptor(dims, x.dtype) as td:
        api.call("cudnnSoftmaxForward", h, SOFTMAX_ALGO[algo], SOFTMAX_MODE[mode],
                 ctypes.byref(alpha), td, _ptr(x), ctypes.byref(beta), td, _ptr(y),
                 context=_ctx("softmax", x=x) + f", algo {algo}, mode {mode}")


def softmax_backward(y, dy, dx, dims, mode, algo, stream):
    h = handle.get(stream)
    alpha, beta = scalars(y.dtype)
    with TensorDescriptor(dims, y.dtype) as td:
        api.call("cudnnSoftmaxBackward", h, SOFTMAX_ALGO[algo], SOFTMAX_MODE[mode],
                 ctypes.byref(alpha), td, _ptr(y), td, _ptr(dy), ctypes.byref(beta), td, _ptr(dx),
                 context=_ctx("softmax_backward", y=y) + f", algo {algo}, mode {mode}")
