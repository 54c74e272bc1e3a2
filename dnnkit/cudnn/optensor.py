"""cuDNN tensor arithmetic: cudnnOpTensor, cudnnAddTensor, cudnnSetTensor, cudnnReduceTensor
and cudnnTransformTensor (the calls behind dnnkit.ops.arith, .reduce and .shape).

    op_tensor     C = op(alpha1 A, alpha2 B) + beta C    op: add, mul; B's dims equal C's or 1
    add_tensor    C = alpha A + beta C                    A's dims equal C's or 1 (broadcast)
    set_tensor    C = value
    reduce        C = reduce(A) over the dims where C has 1   add or avg; no indices
    transform     C = alpha A + beta C between strided descriptors (copies into and out of
                  slices)

NaN propagates (CUDNN_PROPAGATE_NAN). The compute type is float32 for float16 and float32 data
and float64 for float64 (cuDNN's rule for these calls); host scalars are double for double
data and float otherwise. Arrays are described by the dims the ops pass (already merged and
checked: at most 5 dims for op_tensor and add_tensor, 8 for the others, each tensor under
cuDNN's 32-bit limit); ``stream`` is the raw cudaStream_t.
"""

import ctypes
from ctypes import POINTER, c_double, c_float, c_int, c_size_t, c_void_p

import numpy as np

from .. import arrays
from . import api, handle, workspace
from . import conv  # noqa: F401  (declares cudnnAddTensor's prototype, used by add_tensor)
from .api import ptr
from .descriptors import Descriptor, DescriptorCache, INT_MAX, scalar_refs, tensor
from .enums import DATA_TYPES, PROPAGATE_NAN

_p = c_void_p
_int_p = POINTER(c_int)

PROTOTYPES = {
    # cudnnStatus_t cudnnCreateOpTensorDescriptor(cudnnOpTensorDescriptor_t *opTensorDesc);
    "cudnnCreateOpTensorDescriptor": [POINTER(_p)],
    # cudnnStatus_t cudnnDestroyOpTensorDescriptor(cudnnOpTensorDescriptor_t opTensorDesc);
    "cudnnDestroyOpTensorDescriptor": [_p],
    # cudnnStatus_t cudnnSetOpTensorDescriptor(cudnnOpTensorDescriptor_t opTensorDesc,
    #     cudnnOpTensorOp_t opTensorOp, cudnnDataType_t opTensorCompType,
    #     cudnnNanPropagation_t opTensorNanOpt);
    "cudnnSetOpTensorDescriptor": [_p, c_int, c_int, c_int],
    # cudnnStatus_t cudnnOpTensor(cudnnHandle_t handle,
    #     const cudnnOpTensorDescriptor_t opTensorDesc, const void *alpha1,
    #     const cudnnTensorDescriptor_t aDesc, const void *A, const void *alpha2,
    #     const cudnnTensorDescriptor_t bDesc, const void *B, const void *beta,
    #     const cudnnTensorDescriptor_t cDesc, void *C);
    "cudnnOpTensor": [_p] * 11,
    # cudnnStatus_t cudnnSetTensor(cudnnHandle_t handle, const cudnnTensorDescriptor_t yDesc,
    #     void *y, const void *valuePtr);
    "cudnnSetTensor": [_p] * 4,
    # cudnnStatus_t cudnnTransformTensor(cudnnHandle_t handle, const void *alpha,
    #     const cudnnTensorDescriptor_t xDesc, const void *x, const void *beta,
    #     const cudnnTensorDescriptor_t yDesc, void *y);
    "cudnnTransformTensor": [_p] * 7,
    # cudnnStatus_t cudnnCreateReduceTensorDescriptor(
    #     cudnnReduceTensorDescriptor_t *reduceTensorDesc);
    "cudnnCreateReduceTensorDescriptor": [POINTER(_p)],
    # cudnnStatus_t cudnnDestroyReduceTensorDescriptor(
    #     cudnnReduceTensorDescriptor_t reduceTensorDesc);
    "cudnnDestroyReduceTensorDescriptor": [_p],
    # cudnnStatus_t cudnnSetReduceTensorDescriptor(cudnnReduceTensorDescriptor_t reduceTensorDesc,
    #     cudnnReduceTensorOp_t reduceTensorOp, cudnnDataType_t reduceTensorCompType,
    #     cudnnNanPropagation_t reduceTensorNanOpt, cudnnReduceTensorIndices_t reduceTensorIndices,
    #     cudnnIndicesType_t reduceTensorIndicesType);
    "cudnnSetReduceTensorDescriptor": [_p, c_int, c_int, c_int, c_int, c_int],
    # cudnnStatus_t cudnnGetReductionWorkspaceSize(cudnnHandle_t handle,
    #     const cudnnReduceTensorDescriptor_t reduceTensorDesc,
    #     const cudnnTensorDescriptor_t aDesc, const cudnnTensorDescriptor_t cDesc,
    #     size_t *sizeInBytes);
    "cudnnGetReductionWorkspaceSize": [_p, _p, _p, _p, POINTER(c_size_t)],
    # cudnnStatus_t cudnnReduceTensor(cudnnHandle_t handle,
    #     const cudnnReduceTensorDescriptor_t reduceTensorDesc, void *indices,
    #     size_t indicesSizeInBytes, void *workspace, size_t workspaceSizeInBytes,
    #     const void *alpha, const cudnnTensorDescriptor_t aDesc, const void *A,
    #     const void *beta, const cudnnTensorDescriptor_t cDesc, void *C);
    "cudnnReduceTensor": [_p, _p, _p, c_size_t, _p, c_size_t, _p, _p, _p, _p, _p, _p],
}
api.register_prototypes(PROTOTYPES)

OP_TENSOR = {"add": 0, "mul": 1}            # cudnnOpTensorOp_t
REDUCE_OP = {"add": 0, "avg": 5}            # cudnnReduceTensorOp_t (cudnn_graph.h)
NO_INDICES, INDICES_32BIT = 0, 0            # cudnnReduceTensorIndices_t, cudnnIndicesType_t


def _compute_type(dtype):
    return DATA_TYPES["float64" if np.dtype(dtype) == np.float64 else "float32"]


def _scalar(dtype, value):
    """A host scalar for alpha/beta: double for double data, float otherwise. Made per call
    (user scalars vary; descriptors.scalar_refs caches only the fixed ones)."""
    t = c_double if np.dtype(dtype) == np.float64 else c_float
    return ctypes.byref(t(value))


class OpTensorDescriptor(Descriptor):
    """The operation (add, mul), its compute type, NaN propagated (cudnnSetOpTensorDescriptor)."""
    create_fn, destroy_fn = "cudnnCreateOpTensorDescriptor", "cudnnDestroyOpTensorDescriptor"

    def __init__(self, op_id, comp):
        super().__init__()
        try:
            api.call("cudnnSetOpTensorDescriptor", self.ptr, op_id, comp, PROPAGATE_NAN,
                     context=f"op {op_id}, compute type {comp}")
        except Exception:
            self.close()
            raise


class ReduceTensorDescriptor(Descriptor):
    """The reduction (add, avg), its compute type, no indices (cudnnSetReduceTensorDescriptor)."""
    create_fn = "cudnnCreateReduceTensorDescriptor"
    destroy_fn = "cudnnDestroyReduceTensorDescriptor"

    def __init__(self, op_id, comp):
        super().__init__()
        try:
            api.call("cudnnSetReduceTensorDescriptor", self.ptr, op_id, comp, PROPAGATE_NAN,
                     NO_INDICES, INDICES_32BIT, context=f"reduce op {op_id}, compute {comp}")
        except Exception:
            self.close()
            raise


class StridedTensorDescriptor(Descriptor):
    """A tensor of 4 to 8 dims with explicit element strides (a slice of a larger array);
    ranks below 4 are padded with trailing 1s of stride 1."""
    create_fn, destroy_fn = "cudnnCreateTensorDescriptor", "cudnnDestroyTensorDescriptor"

    def __init__(self, dims, strides, dtype):
        pad = max(0, 4 - len(dims))
        dims, strides = list(dims) + [1] * pad, list(strides) + [1] * pad
        if max(dims + strides) > INT_MAX:
            raise ValueError(f"tensor dims {tuple(dims)} strides {tuple(strides)} exceed "
                             "cuDNN's 32-bit limit")
        super().__init__()
        n = len(dims)
        try:
            api.call("cudnnSetTensorNdDescriptor", self.ptr, DATA_TYPES[np.dtype(dtype).name],
                     n, (c_int * n)(*dims), (c_int * n)(*strides),
                     context=f"dims {tuple(dims)}, strides {tuple(strides)}")
        except Exception:
            self.close()
            raise


_ops = DescriptorCache(OpTensorDescriptor)
_reductions = DescriptorCache(ReduceTensorDescriptor)
_strided = DescriptorCache(StridedTensorDescriptor)


def op_tensor(op, alpha1, a, a_dims, alpha2, b, b_dims, c, c_dims, stream):
    """c = op(alpha1 * a, alpha2 * b); a's dims are c's, b's equal c's or 1."""
    dt = c.dtype
    od = _ops.get(OP_TENSOR[op], _compute_type(dt))
    _, beta = scalar_refs(dt)
    api.call("cudnnOpTensor", handle.get(stream), od, _scalar(dt, alpha1),
             tensor(a_dims, dt), ptr(a), _scalar(dt, alpha2), tensor(b_dims, dt), ptr(b), beta,
             tensor(c_dims, dt), ptr(c),
             context=lambda: f"op_tensor {op}: a {a_dims} * {alpha1}, b {b_dims} * {alpha2}, "
                             f"c {c_dims} {np.dtype(dt).name}")


def add_tensor(alpha, a, a_dims, beta, c, c_dims, stream):
    """c = alpha * a + beta * c; a's dims equal c's or 1 (a is broadcast). With beta = 0, c is
    only written."""
    dt = c.dtype
    api.call("cudnnAddTensor", handle.get(stream), _scalar(dt, alpha), tensor(a_dims, dt),
             ptr(a), _scalar(dt, beta), tensor(c_dims, dt), ptr(c),
             context=lambda: f"add_tensor: a {a_dims} * {alpha}, c {c_dims} * {beta} "
                             f"{np.dtype(dt).name}")


def set_tensor(c, dims, value, stream):
    """c = value everywhere. float16 takes cudnnAddTensor of a one-element constant broadcast
    over c (beta = 0: c is only written): cudnnSetTensor, whose header says the value has c's
    type, filled a float16 tensor with 0 when handed float16 -inf on an H100 (cuDNN 9.19), as
    if it read a float; the broadcast add has no such ambiguity (its alpha is a float, its
    operand a float16 array)."""
    dt = np.dtype(c.dtype)
    if dt == np.float16:
        ones = (1,) * len(dims)
        add_tensor(1.0, arrays.constant(np.full(ones, value, np.float16), np.float16), ones,
                   0.0, c, dims, stream)
        return
    v = (c_double if dt == np.float64 else c_float)(value)
    api.call("cudnnSetTensor", handle.get(stream), tensor(dims, dt), ptr(c), ctypes.byref(v),
             context=lambda: f"set_tensor: c {dims} {dt.name} = {value}")


def reduce(a, a_dims, c, c_dims, op, stream):
    """c = the sum (``add``) or mean (``avg``) of a over the dims where c_dims has 1. The
    workspace comes from dnnkit's per-stream cache; no indices."""
    dt = a.dtype
    h = handle.get(stream)
    rd = _reductions.get(REDUCE_OP[op], _compute_type(dt))
    ad, cd = tensor(a_dims, dt), tensor(c_dims, dt)
    size = c_size_t(0)
    ctx = lambda: f"reduce {op}: a {a_dims} {np.dtype(dt).name} to c {c_dims}"  # noqa: E731
    api.call("cudnnGetReductionWorkspaceSize", h, rd, ad, cd, ctypes.byref(size), context=ctx)
    nbytes = int(size.value)
    ws = workspace.alloc(nbytes, stream)
    if nbytes and ws is None:
        raise workspace.OutOfMemory(nbytes)
    alpha, beta = scalar_refs(dt)
    with workspace.held(ws) as wp:
        api.call("cudnnReduceTensor", h, rd, None, 0, wp, nbytes, alpha, ad, ptr(a), beta, cd,
                 ptr(c), context=ctx)


def transform(a, a_dims, a_strides, a_offset, c, c_dims, c_strides, c_offset, stream):
    """Copy: c viewed as (c_dims, c_strides) from element c_offset = a viewed as (a_dims,
    a_strides) from element a_offset (a slice into or out of a larger array; the dims are
    equal)."""
    dt = a.dtype
    item = np.dtype(dt).itemsize
    alpha, beta = scalar_refs(dt)
    api.call("cudnnTransformTensor", handle.get(stream), alpha,
             _strided.get(tuple(a_dims), tuple(a_strides), dt), ptr(a) + a_offset * item, beta,
             _strided.get(tuple(c_dims), tuple(c_strides), dt), ptr(c) + c_offset * item,
             context=lambda: f"transform: a {a_dims} strides {a_strides} to c {c_dims} "
                             f"strides {c_strides} {np.dtype(dt).name}")
