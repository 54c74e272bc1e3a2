"""cuDNN activations: cudnnActivationForward / cudnnActivationBackward with a cached
activation descriptor, NaN propagated (CUDNN_PROPAGATE_NAN).

Modes are ``enums.ACTIVATION``'s keys; ``coef`` is the clipped ReLU's ceiling or the ELU's
alpha, and for swish its beta (cudnnSetActivationDescriptorSwishBeta). The op calls this
elementwise, so every tensor is described as (1, 1, 1, size). Inputs are device arrays exposing
``__cuda_array_interface__`` (already validated by the op); ``stream`` is the raw
``cudaStream_t`` value (0 = the legacy default stream).
"""

from ctypes import POINTER, c_double, c_int, c_void_p

import numpy as np

from . import api, descriptors, handle
from .api import ptr
from .descriptors import Descriptor, DescriptorCache, scalar_refs
from .enums import ACTIVATION, PROPAGATE_NAN

_p = c_void_p

PROTOTYPES = {
    # cudnnStatus_t cudnnCreateActivationDescriptor(cudnnActivationDescriptor_t *activationDesc);
    "cudnnCreateActivationDescriptor": [POINTER(_p)],
    # cudnnStatus_t cudnnDestroyActivationDescriptor(cudnnActivationDescriptor_t activationDesc);
    "cudnnDestroyActivationDescriptor": [_p],
    # cudnnStatus_t cudnnSetActivationDescriptor(cudnnActivationDescriptor_t activationDesc,
    #     cudnnActivationMode_t mode, cudnnNanPropagation_t reluNanOpt, double coef);
    "cudnnSetActivationDescriptor": [_p, c_int, c_int, c_double],
    # cudnnStatus_t cudnnSetActivationDescriptorSwishBeta(
    #     cudnnActivationDescriptor_t activationDesc, double swish_beta);
    "cudnnSetActivationDescriptorSwishBeta": [_p, c_double],
    # cudnnStatus_t cudnnActivationForward(cudnnHandle_t handle,
    #     cudnnActivationDescriptor_t activationDesc, const void *alpha,
    #     const cudnnTensorDescriptor_t xDesc, const void *x, const void *beta,
    #     const cudnnTensorDescriptor_t yDesc, void *y);
    "cudnnActivationForward": [_p, _p, _p, _p, _p, _p, _p, _p],
    # cudnnStatus_t cudnnActivationBackward(cudnnHandle_t handle,
    #     cudnnActivationDescriptor_t activationDesc, const void *alpha,
    #     const cudnnTensorDescriptor_t yDesc, const void *y,
    #     const cudnnTensorDescriptor_t dyDesc, const void *dy,
    #     const cudnnTensorDescriptor_t xDesc, const void *x, const void *beta,
    #     const cudnnTensorDescriptor_t dxDesc, void *dx);
    "cudnnActivationBackward": [_p] * 12,
}
api.register_prototypes(PROTOTYPES)


class ActivationDescriptor(Descriptor):
    """Mode, NaN propagated, coef, and for swish its beta (cudnnSetActivationDescriptor,
    ...SwishBeta)."""
    create_fn, destroy_fn = "cudnnCreateActivationDescriptor", "cudnnDestroyActivationDescriptor"

    def __init__(self, mode_id, coef, swish_beta=None):
        super().__init__()
        try:
            api.call("cudnnSetActivationDescriptor", self.ptr, mode_id, PROPAGATE_NAN,
                     float(coef), context=f"mode {mode_id}, coef {coef}")
            if swish_beta is not None:
                api.call("cudnnSetActivationDescriptorSwishBeta", self.ptr, float(swish_beta),
                         context=f"beta {swish_beta}")
        except Exception:
            self.close()
            raise


_descs = DescriptorCache(ActivationDescriptor)


def _descriptor(mode, coef):
    """The shared (cached) activation descriptor of ``mode`` and ``coef``."""
    if mode == "swish":
        return _descs.get(ACTIVATION[mode], 0.0, coef)
    return _descs.get(ACTIVATION[mode], coef, None)


def bind(backward, size, dtype, mode, coef, stream):
    """``run(x, y)`` (forward: y = f(x)) or ``run(x, y, dy, dx)`` (backward) for tensors of
    ``size`` elements of ``dtype`` (described as (1, 1, 1, size)): descriptors, scalars, the
    function and its checks bound once, for repeated calls of one signature."""
    alpha, beta = scalar_refs(dtype)
    tdesc = descriptors.tensor((1, 1, 1, size), dtype)
    adesc = _descriptor(mode, coef)
    td, act = tdesc.ptr.value, adesc.ptr.value   # raw addresses: no conversion per call
    name = "cudnnActivationBackward" if backward else "cudnnActivationForward"
    fn, check, get = api.function(name), api.check, handle.getter(stream)

    def context():
        return f"activation{'_backward' if backward else ''}: {size} elements " \
               f"{np.dtype(dtype).name}, mode {mode}, coef {coef}"
    if backward:
        def run(x, y, dy, dx):
            st = fn(get(), act, alpha, td, ptr(y), td, ptr(dy), td, ptr(x), beta, td, ptr(dx))
            if st:
                check(name, st, context)
    else:
        def run(x, y):
            st = fn(get(), act, alpha, td, ptr(x), beta, td, ptr(y))
            if st:
                check(name, st, context)
    run.keep = (tdesc, adesc)     # the descriptors live as long as the runner
    return run


def forward(x, y, mode, coef, stream):
    """y = f(x) elementwise; the tensor is described as (1, 1, 1, size)."""
    bind(False, x.size, x.dtype, mode, coef, stream)(x, y)


def backward(x, y, dy, dx, mode, coef, stream):
    """dx from x, y = f(x) and dy (cuDNN's argument order: y, dy, x, then dx)."""
    bind(True, x.size, x.dtype, mode, coef, stream)(x, y, dy, dx)
