"""cuDNN's RNN weight space as cudnnGetRNNWeightParams reports it: where each linear layer's
matrix and bias lie (element offsets and shapes), for checking dnnkit's flat layout
(dnnkit/rnn_layout.py) against the library (tests/gpu/test_rnn.py). Linear layers per
pseudo-layer: cuDNN's lin ids 0 .. 2G-1, and 2G (8) for an LSTM's projection."""

import ctypes
import dataclasses
from ctypes import POINTER, c_int, c_int32, c_size_t, c_void_p

import numpy as np

from ..errors import DnnkitError
from . import api, handle
from .api import ptr
from .descriptors import Descriptor
from .rnn import check_weights, net

_p = c_void_p
_int_p = POINTER(c_int)

PROTOTYPES = {
    # cudnnStatus_t cudnnGetRNNWeightParams(cudnnHandle_t handle,
    #     cudnnRNNDescriptor_t rnnDesc, int32_t pseudoLayer, size_t weightSpaceSize,
    #     const void *weightSpace, int32_t linLayerID, cudnnTensorDescriptor_t mDesc,
    #     void **mAddr, cudnnTensorDescriptor_t bDesc, void **bAddr);
    "cudnnGetRNNWeightParams": [_p, _p, c_int32, c_size_t, _p, c_int32, _p, POINTER(_p), _p,
                                POINTER(_p)],
    # cudnnStatus_t cudnnGetTensorNdDescriptor(const cudnnTensorDescriptor_t tensorDesc,
    #     int nbDimsRequested, cudnnDataType_t *dataType, int *nbDims, int dimA[],
    #     int strideA[]);
    "cudnnGetTensorNdDescriptor": [_p, c_int, _int_p, _int_p, _int_p, _int_p],
}
api.register_prototypes(PROTOTYPES)


class _QueryTensor(Descriptor):
    """An unset tensor descriptor that cudnnGetRNNWeightParams fills in."""
    create_fn, destroy_fn = "cudnnCreateTensorDescriptor", "cudnnDestroyTensorDescriptor"

    def dims(self):
        dt, nb = c_int(), c_int()
        dims, strides = (c_int * 8)(), (c_int * 8)()
        api.call("cudnnGetTensorNdDescriptor", self.ptr, 8, ctypes.byref(dt), ctypes.byref(nb),
                 dims, strides)
        return tuple(dims[:nb.value])


@dataclasses.dataclass(frozen=True)
class WeightParam:
    """Where cuDNN keeps one linear layer's matrix and bias: element offsets into the weight
    space and shapes ((rows, cols) and (rows,)); None where there is none (the input matrices
    of layer 0 with skip input, the bias of an LSTM's projection)."""
    pseudo_layer: int          # layer * directions + direction
    lin_id: int
    matrix_offset: object
    matrix_shape: object
    bias_offset: object
    bias_shape: object


def weight_space_bytes(cfg, stream_ptr=0):
    return net(cfg, handle.get(stream_ptr)).weight_bytes


def _offset(addr, base, itemsize, what):
    if not addr.value:
        return None
    off = addr.value - base
    if off % itemsize:
        raise DnnkitError(f"cuDNN put {what} at byte {off}, not a multiple of {itemsize}")
    return off // itemsize


def weight_params(cfg, w, stream_ptr=0):
    """Every (pseudo-layer, linear layer)'s WeightParam, as cudnnGetRNNWeightParams reports
    them for the weight space ``w`` (a device array of the weight space's size)."""
    h = handle.get(stream_ptr)
    n = net(cfg, h)
    check_weights(n, w)
    base, item = (ptr(w) or 0), np.dtype(w.dtype).itemsize
    out = []
    for pl in range(cfg.num_layers * cfg.directions):
        for lin in range(cfg.lin_layers):
            m, b = c_void_p(), c_void_p()
            with _QueryTensor() as md, _QueryTensor() as bd:
                api.call("cudnnGetRNNWeightParams", h, n.rnn, pl, c_size_t(n.weight_bytes),
                         ptr(w), lin, md, ctypes.byref(m), bd, ctypes.byref(b),
                         context=f"{n.ctx}, pseudo-layer {pl}, linear layer {lin}")
                mshape = md.dims()[1:] if m.value else None     # {1, rows, cols}
                bshape = bd.dims()[1:2] if b.value else None    # {1, rows, 1}
            where = f"pseudo-layer {pl} linear layer {lin}"
            out.append(WeightParam(pl, lin, _offset(m, base, item, f"matrix of {where}"),
                                   mshape, _offset(b, base, item, f"bias of {where}"), bshape))
    return out
