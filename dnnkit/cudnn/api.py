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
    # --- convolution (cudnn_ops.h / cudnn_cnn.h). Every perfResults argument is a pointer to
    # an array of cudnnConvolution{Fwd,BwdData,BwdFilter}AlgoPerf_t, declared as void* here
    # (the struct lives in dnnkit.cudnn.conv); size_t* arguments are POINTER(c_size_t).
    # cudnnStatus_t cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t *filterDesc);
    "cudnnCreateFilterDescriptor": [POINTER(_p)],
    # cudnnStatus_t cudnnDestroyFilterDescriptor(cudnnFilterDescriptor_t filterDesc);
    "cudnnDestroyFilterDescriptor": [_p],
    # cudnnStatus_t cudnnSetFilterNdDescriptor(cudnnFilterDescriptor_t filterDesc,
    #     cudnnDataType_t dataType, cudnnTensorFormat_t format, int nbDims,
    #     const int filterDimA[]);
    "cudnnSetFilterNdDescriptor": [_p, c_int, c_int, c_int, _int_p],
    # cudnnStatus_t cudnnCreateConvolutionDescriptor(cudnnConvolutionDescriptor_t *convDesc);
    "cudnnCreateConvolutionDescriptor": [POINTER(_p)],
    # cudnnStatus_t cudnnDestroyConvolutionDescriptor(cudnnConvolutionDescriptor_t convDesc);
    "cudnnDestroyConvolutionDescriptor": [_p],
    # cudnnStatus_t cudnnSetConvolutionNdDescriptor(cudnnConvolutionDescriptor_t convDesc,
    #     int arrayLength, const int padA[], const int filterStrideA[], const int dilationA[],
    #     cudnnConvolutionMode_t mode, cudnnDataType_t computeType);
    "cudnnSetConvolutionNdDescriptor": [_p, c_int, _int_p, _int_p, _int_p, c_int, c_int],
    # cudnnStatus_t cudnnSetConvolutionGroupCount(cudnnConvolutionDescriptor_t convDesc,
    #     int groupCount);
    "cudnnSetConvolutionGroupCount": [_p, c_int],
    # cudnnStatus_t cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t convDesc,
    #     cudnnMathType_t mathType);
    "cudnnSetConvolutionMathType": [_p, c_int],
    # cudnnStatus_t cudnnGetConvolutionForwardAlgorithmMaxCount(cudnnHandle_t handle, int *count);
    "cudnnGetConvolutionForwardAlgorithmMaxCount": [_p, _int_p],
    # cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithmMaxCount(cudnnHandle_t handle,
    #     int *count);
    "cudnnGetConvolutionBackwardDataAlgorithmMaxCount": [_p, _int_p],
    # cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(cudnnHandle_t handle,
    #     int *count);
    "cudnnGetConvolutionBackwardFilterAlgorithmMaxCount": [_p, _int_p],
    # cudnnStatus_t cudnnGetConvolutionForwardAlgorithm_v7(cudnnHandle_t handle,
    #     const cudnnTensorDescriptor_t srcDesc, const cudnnFilterDescriptor_t filterDesc,
    #     const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t destDesc,
    #     const int requestedAlgoCount, int *returnedAlgoCount,
    #     cudnnConvolutionFwdAlgoPerf_t *perfResults);
    "cudnnGetConvolutionForwardAlgorithm_v7": [_p, _p, _p, _p, _p, c_int, _int_p, _p],
    # cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithm_v7(cudnnHandle_t handle,
    #     const cudnnFilterDescriptor_t filterDesc, const cudnnTensorDescriptor_t diffDesc,
    #     const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t gradDesc,
    #     const int requestedAlgoCount, int *returnedAlgoCount,
    #     cudnnConvolutionBwdDataAlgoPerf_t *perfResults);
    "cudnnGetConvolutionBackwardDataAlgorithm_v7": [_p, _p, _p, _p, _p, c_int, _int_p, _p],
    # cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithm_v7(cudnnHandle_t handle,
    #     const cudnnTensorDescriptor_t srcDesc, const cudnnTensorDescriptor_t diffDesc,
    #     const cudnnConvolutionDescriptor_t convDesc, const cudnnFilterDescriptor_t gradDesc,
    #     const int requestedAlgoCount, int *returnedAlgoCount,
    #     cudnnConvolutionBwdFilterAlgoPerf_t *perfResults);
    "cudnnGetConvolutionBackwardFilterAlgorithm_v7": [_p, _p, _p, _p, _p, c_int, _int_p, _p],
    # cudnnStatus_t cudnnFindConvolutionForwardAlgorithmEx(cudnnHandle_t handle,
    #     const cudnnTensorDescriptor_t xDesc, const void *x,
    #     const cudnnFilterDescriptor_t wDesc, const void *w,
    #     const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t yDesc,
    #     void *y, const int requestedAlgoCount, int *returnedAlgoCount,
    #     cudnnConvolutionFwdAlgoPerf_t *perfResults, void *workSpace,
    #     size_t workSpaceSizeInBytes);
    "cudnnFindConvolutionForwardAlgorithmEx": [_p, _p, _p, _p, _p, _p, _p, _p, c_int, _int_p,
                                               _p, _p, c_size_t],
    # cudnnStatus_t cudnnFindConvolutionBackwardDataAlgorithmEx(cudnnHandle_t handle,
    #     const cudnnFilterDescriptor_t wDesc, const void *w,
    #     const cudnnTensorDescriptor_t dyDesc, const void *dy,
    #     const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t dxDesc,
    #     void *dx, const int requestedAlgoCount, int *returnedAlgoCount,
    #     cudnnConvolutionBwdDataAlgoPerf_t *perfResults, void *workSpace,
    #     size_t workSpaceSizeInBytes);
    "cudnnFindConvolutionBackwardDataAlgorithmEx": [_p, _p, _p, _p, _p, _p, _p, _p, c_int,
                                                    _int_p, _p, _p, c_size_t],
    # cudnnStatus_t cudnnFindConvolutionBackwardFilterAlgorithmEx(cudnnHandle_t handle,
    #     const cudnnTensorDescriptor_t xDesc, const void *x,
    #     const cudnnTensorDescriptor_t dyDesc, const void *y,
    #     const cudnnConvolutionDescriptor_t convDesc, const cudnnFilterDescriptor_t dwDesc,
    #     void *dw, const int requestedAlgoCount, int *returnedAlgoCount,
    #     cudnnConvolutionBwdFilterAlgoPerf_t *perfResults, void *workSpace,
    #     size_t workSpaceSizeInBytes);
    "cudnnFindConvolutionBackwardFilterAlgorithmEx": [_p, _p, _p, _p, _p, _p, _p, _p, c_int,
                                                      _int_p, _p, _p, c_size_t],
    # cudnnStatus_t cudnnGetConvolutionForwardWorkspaceSize(cudnnHandle_t handle,
    #     const cudnnTensorDescriptor_t xDesc, const cudnnFilterDescriptor_t wDesc,
    #     const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t yDesc,
    #     cudnnConvolutionFwdAlgo_t algo, size_t *sizeInBytes);
    "cudnnGetConvolutionForwardWorkspaceSize": [_p, _p, _p, _p, _p, c_int, POINTER(c_size_t)],
    # cudnnStatus_t cudnnGetConvolutionBackwardDataWorkspaceSize(cudnnHandle_t handle,
    #     const cudnnFilterDescriptor_t wDesc, const cudnnTensorDescriptor_t dyDesc,
    #     const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t dxDesc,
    #     cudnnConvolutionBwdDataAlgo_t algo, size_t *sizeInBytes);
    "cudnnGetConvolutionBackwardDataWorkspaceSize": [_p, _p, _p, _p, _p, c_int,
                                                     POINTER(c_size_t)],
    # cudnnStatus_t cudnnGetConvolutionBackwardFilterWorkspaceSize(cudnnHandle_t handle,
    #     const cudnnTensorDescriptor_t xDesc, const cudnnTensorDescriptor_t dyDesc,
    #     const cudnnConvolutionDescriptor_t convDesc, const cudnnFilterDescriptor_t gradDesc,
    #     cudnnConvolutionBwdFilterAlgo_t algo, size_t *sizeInBytes);
    "cudnnGetConvolutionBackwardFilterWorkspaceSize": [_p, _p, _p, _p, _p, c_int,
                                                       POINTER(c_size_t)],
    # cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t handle, const void *alpha,
    #     const cudnnTensorDescriptor_t xDesc, const void *x,
    #     const cudnnFilterDescriptor_t wDesc, const void *w,
    #     const cudnnConvolutionDescriptor_t convDesc, cudnnConvolutionFwdAlgo_t algo,
    #     void *workSpace, size_t workSpaceSizeInBytes, const void *beta,
    #     const cudnnTensorDescriptor_t yDesc, void *y);
    "cudnnConvolutionForward": [_p, _p, _p, _p, _p, _p, _p, c_int, _p, c_size_t, _p, _p, _p],
    # cudnnStatus_t cudnnConvolutionBackwardData(cudnnHandle_t handle, const void *alpha,
    #     const cudnnFilterDescriptor_t wDesc, const void *w,
    #     const cudnnTensorDescriptor_t dyDesc, const void *dy,
    #     const cudnnConvolutionDescriptor_t convDesc, cudnnConvolutionBwdDataAlgo_t algo,
    #     void *workSpace, size_t workSpaceSizeInBytes, const void *beta,
    #     const cudnnTensorDescriptor_t dxDesc, void *dx);
    "cudnnConvolutionBackwardData": [_p, _p, _p, _p, _p, _p, _p, c_int, _p, c_size_t, _p, _p,
                                     _p],
    # cudnnStatus_t cudnnConvolutionBackwardFilter(cudnnHandle_t handle, const void *alpha,
    #     const cudnnTensorDescriptor_t xDesc, const void *x,
    #     const cudnnTensorDescriptor_t dyDesc, const void *dy,
    #     const cudnnConvolutionDescriptor_t convDesc, cudnnConvolutionBwdFilterAlgo_t algo,
    #     void *workSpace, size_t workSpaceSizeInBytes, const void *beta,
    #     const cudnnFilterDescriptor_t dwDesc, void *dw);
    "cudnnConvolutionBackwardFilter": [_p, _p, _p, _p, _p, _p, _p, c_int, _p, c_size_t, _p,
                                       _p, _p],
    # cudnnStatus_t cudnnConvolutionBackwardBias(cudnnHandle_t handle, const void *alpha,
    #     const cudnnTensorDescriptor_t dyDesc, const void *dy, const void *beta,
    #     const cudnnTensorDescriptor_t dbDesc, void *db);
    "cudnnConvolutionBackwardBias": [_p, _p, _p, _p, _p, _p, _p],
    # cudnnStatus_t cudnnAddTensor(cudnnHandle_t handle, const void *alpha,
    #     const cudnnTensorDescriptor_t aDesc, const void *A, const void *beta,
    #     const cudnnTensorDescriptor_t cDesc, void *C);
    "cudnnAddTensor": [_p, _p, _p, _p, _p, _p, _p],
}
RESTYPES = {"cudnnGetErrorString": ctypes.c_char_p, "cudnnGetVersion": c_size_t}


def register_prototypes(prototypes, restypes=None):
    """Add an op family's prototypes (kept beside its calls, C signatures as comments)."""
    clash = set(prototypes) & set(PROTOTYPES)
    if clash:
        raise ValueError(f"cuDNN prototypes declared twice: {sorted(clash)}")
    PROTOTYPES.update(prototypes)
    RESTYPES.update(restypes or {})

_bound = {}  # id(lib) -> {name: function with prototype set}


def library():
    """The loaded ctypes library; raises CudnnUnavailableError when cuDNN cannot be used."""
    st = loader.status()
    if not st.available:
        raise CudnnUnavailableError(f"cuDNN cannot be used: {st.describe()}", reason=st.reason)
    return st.lib


def function(name):
    lib = library()
    table = _bound.get(id(lib))
    if table is None:
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
    """Raise CudnnError unless ``status`` is CUDNN_STATUS_SUCCESS. ``context`` is a string
    or a function returning one (called only on failure: formatting shapes into a message on
    every successful call costs more than the call itself)."""
    if status != STATUS_SUCCESS:
        if callable(context):
            context = context()
        raise CudnnError(name, status, status_name(status), context)


def call(name, *args, context=""):
    """Call cuDNN function ``name`` and check its status."""
    status = function(name)(*args)
    if status != STATUS_SUCCESS:
        check(name, status, context)
