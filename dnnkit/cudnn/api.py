"""Thin ctypes layer over the cuDNN 9 C API: prototypes and ``check()``.

Each prototype carries its C signature as a comment. ``call(name, *args, context=...)`` runs a
function and raises ``dnnkit.CudnnError`` with the function, status name and context (shapes,
values) when it does not return CUDNN_STATUS_SUCCESS.
"""

import ctypes
from ctypes import POINTER, c_double, c_int, c_size_t, c_void_p

from ..errors import CudnnError, CudnnUnavailableError
from . import loader
from .enums import STATUS_SUCCESS

_p = c_void_p     # every opaque handle/descriptor and every device pointer
_int_p = POINTER(c_int)

PROTOTYPES = {
    # cudnnStatus_t cudnnCreate(cudnnHandle_t *handle);
    "cudnnCreate": [POINTER(_p)],
    # cudnnStatus_t cudnnDestroy(cudnnHandle_t handle);
    "cudnnDestroy": [_p],
    # cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t streamId);
    "cudnnSetStream": [_p, _p],
    # cudnnStatus_t cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t *tensorDesc);
    "cudnnCreateTensorDescriptor": [POINTER(_p)],
    # cudnnStatus_t cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t tensorDesc);
    "cudnnDestroyTensorDescriptor": [_p],
    # cudnnStatus_t cudnnSetTensorNdDescriptor(cudnnTensorDescriptor_t tensorDesc,
    #     cudnnDataType_t dataType, int nbDims, const int dimA[], const int strideA[]);
    "cudnnSetTensorNdDescriptor": [_p, c_int, c_int, _int_p, _int_p],
    # cudnnStatus_t cudnnCreateActivationDescriptor(cudnnActivationDescriptor_t *activationDesc);
    "cudnnCreateActivationDescriptor": [POINTER(_p)],
    # cudnnStatus_t cudnnDestroyActivationDescriptor(cudnnActivationDescriptor_t activationDesc);
    "cudnnDestroyActivationDescriptor": [_p],
    # cudnnStatus_t cudnnSetActivationDescriptor(cudnnActivationDescriptor_t activationDesc,
    #     cudnnActivationMode_t mode, cudnnNanPropagation_t reluNanOpt, double coef);
    "cudnnSetActivationDescriptor": [_p, c_int, c_int, c_double],
    # cudnnStatus_t cudnnSetActivationDescriptorSwishBeta(cudnnActivationDescriptor_t activationDesc,
    #     double swish_beta);
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
    # cudnnStatus_t cudnnSoftmaxForward(cudnnHandle_t handle, cudnnSoftmaxAlgorithm_t algorithm,
    #     cudnnSoftmaxMode_t mode, const void *alpha, const cudnnTensorDescriptor_t xDesc,
    #     const void *x, const void *beta, const cudnnTensorDescriptor_t yDesc, void *y);
    "cudnnSoftmaxForward": [_p, c_int, c_int, _p, _p, _p, _p, _p, _p],
    # cudnnStatus_t cudnnSoftmaxBackward(cudnnHandle_t handle, cudnnSoftmaxAlgorithm_t algorithm,
    #     cudnnSoftmaxMode_t mode, const void *alpha, const cudnnTensorDescriptor_t yDesc,
    #     const void *y, const cudnnTensorDescriptor_t dyDesc, const void *dy,
    #     const void *beta, const cudnnTensorDescriptor_t dxDesc, void *dx);
    "cudnnSoftmaxBackward": [_p, c_int, c_int, _p, _p, _p, _p, _p, _p, _p, _p],
    # const char *cudnnGetErrorString(cudnnStatus_t status);
    "cudnnGetErrorString": [c_int],
    # size_t cudnnGetVersion(void);
    "cudnnGetVersion": [],
}
RESTYPES = {"cudnnGetErrorString": ctypes.c_char_p, "cudnnGetVersion": c_size_t}

_bound = {}  # id(lib) -> {name: function with prototype set}


def library():
    """The loaded ctypes library; raises CudnnUnavailableError when cuDNN cannot be used."""
    st = loader.status()
    if not st.available:
        raise CudnnUnavailableError(f"cuDNN cannot be used: {st.describe()}", reason=st.reason)
    return st.lib


def function(name):
    lib = library()
    table = _bound.setdefault(id(lib), {})
    fn = table.get(name)
    if fn is None:
        fn = getattr(lib, name)
        fn.argtypes = PROTOTYPES[name]
        fn.restype = RESTYPES.get(name, c_int)
        table[name] = fn
    return fn


def status_name(status):
    return loader._status_name(library(), status)


def check(name, status, context=""):
    """Raise CudnnError unless ``status`` is CUDNN_STATUS_SUCCESS."""
    if status != STATUS_SUCCESS:
        raise CudnnError(name, status, status_name(status), context)


def call(name, *args, context=""):
    """Call cuDNN function ``name`` and check its status."""
    check(name, function(name)(*args), context)
