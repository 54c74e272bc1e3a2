"""cuDNN 9 recurrent networks (cudnn_adv): RNN relu/tanh, LSTM, GRU through the v8 API.

One RNN descriptor per (device, RNNConfig), set with cudnnSetRNNDescriptor_v8:
- algo CUDNN_RNN_ALGO_STANDARD (the persistent algorithms need fixed batch sizes, or do not
  take variable lengths; STANDARD takes every configuration);
- biasMode CUDNN_RNN_DOUBLE_BIAS: an input and a recurrent bias per linear layer, the layout
  both backends read (dnnkit/rnn_layout.py);
- projSize = hiddenSize (no LSTM projection);
- precision (``precision()``): half data computes in float with tensor cores (mathPrec
  CUDNN_DATA_FLOAT, as PyTorch does: accumulating in half over long sequences loses too
  much); float data in float with CUDNN_FMA_MATH (no TF32, the same default as dnnkit's
  convolutions); double in double with CUDNN_DEFAULT_MATH;
- a dropout descriptor set to dropout 0 with no RNG states (cudnnSetDropoutDescriptor with a
  NULL state buffer is cheap and runs no init kernel when dropout is 0);
- auxFlags CUDNN_RNN_PADDED_IO_ENABLED: required for the padded (unpacked) data layouts.

Data: x (T, N, I) and y (T, N, D*H) are described by RNN data descriptors in layout
CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED (time-major, padded to T) with the per-sequence
lengths (any order) and padding fill 0, so y is 0 past each sequence's end; hx/hy/cx/cy by a
packed 3-D tensor descriptor (L*D, N, H). cuDNN's kernels also read the lengths from device
memory (devSeqLengths, read asynchronously): each forward copies them (N int32) on its own
stream into a stream-ordered buffer, which the training state keeps for the backward. Zero
initial states and zero state gradients are passed as NULL (cuDNN reads NULL as zeros).

Buffers: the workspace comes from ``dnnkit.memory.scratch`` for the duration of the calls;
the reserve space of a training forward (cudnnGetRNNTempSpaceSizes, FWD_MODE_TRAINING) is an
array kept by the returned ``Saved`` and handed to cudnnRNNBackwardData_v8 (which updates it)
and then cudnnRNNBackwardWeights_v8. The weight gradient is accumulated by cuDNN
(CUDNN_WGRAD_MODE_ADD) into a buffer zeroed here, so dw is always fresh.

Descriptors are cached (``_nets`` per device and config, ``_datas`` per device, config, T, N
and lengths; small LRUs). An evicted descriptor is not destroyed by the cache: a training
state may still hold it; it is destroyed when its last reference goes (weakref.finalize).
"""

import collections
import ctypes
import dataclasses
import threading
from ctypes import POINTER, c_float, c_int, c_int32, c_size_t, c_uint32, c_ulonglong, c_void_p

import numpy as np

from .. import memory
from ..arrays import constant, float_name, zero_fill
from ..device import device_id, stream_pointer
from ..errors import DnnkitError
from . import api, handle
from .api import copy_async, ptr
from .descriptors import INT_MAX, Descriptor, TensorDescriptor
from .dropout import DropoutDescriptor
from .enums import DATA_TYPES, MATH_DEFAULT, MATH_FMA, MATH_TENSOR_OP

_p = c_void_p
_int_p = POINTER(c_int)
_size_p = POINTER(c_size_t)

# --- enums (cudnn_adv.h) -------------------------------------------------------------------
ALGO_STANDARD = 0                                   # cudnnRNNAlgo_t
FWD_INFERENCE, FWD_TRAINING = 0, 1                  # cudnnForwardMode_t
CELL_MODE = {"rnn_relu": 0, "rnn_tanh": 1, "lstm": 2, "gru": 3}   # cudnnRNNMode_t
DOUBLE_BIAS = 2                                     # cudnnRNNBiasMode_t
UNIDIRECTIONAL, BIDIRECTIONAL = 0, 1                # cudnnDirectionMode_t
INPUT_MODE = {"linear": 0, "skip": 1}               # cudnnRNNInputMode_t
SEQ_MAJOR_UNPACKED = 0                              # cudnnRNNDataLayout_t
PADDED_IO_ENABLED = 1                               # (1U << 0), auxFlags
WGRAD_MODE_ADD = 0                                  # cudnnWgradMode_t

PROTOTYPES = {
    # cudnnStatus_t cudnnCreateRNNDescriptor(cudnnRNNDescriptor_t *rnnDesc);
    "cudnnCreateRNNDescriptor": [POINTER(_p)],
    # cudnnStatus_t cudnnDestroyRNNDescriptor(cudnnRNNDescriptor_t rnnDesc);
    "cudnnDestroyRNNDescriptor": [_p],
    # cudnnStatus_t cudnnSetRNNDescriptor_v8(cudnnRNNDescriptor_t rnnDesc,
    #     cudnnRNNAlgo_t algo, cudnnRNNMode_t cellMode, cudnnRNNBiasMode_t biasMode,
    #     cudnnDirectionMode_t dirMode, cudnnRNNInputMode_t inputMode,
    #     cudnnDataType_t dataType, cudnnDataType_t mathPrec, cudnnMathType_t mathType,
    #     int32_t inputSize, int32_t hiddenSize, int32_t projSize, int32_t numLayers,
    #     cudnnDropoutDescriptor_t dropoutDesc, uint32_t auxFlags);
    "cudnnSetRNNDescriptor_v8": [_p, c_int, c_int, c_int, c_int, c_int, c_int, c_int, c_int,
                                 c_int32, c_int32, c_int32, c_int32, _p, c_uint32],
    # cudnnStatus_t cudnnGetRNNWeightSpaceSize(cudnnHandle_t handle,
    #     cudnnRNNDescriptor_t rnnDesc, size_t *weightSpaceSize);
    "cudnnGetRNNWeightSpaceSize": [_p, _p, _size_p],
    # cudnnStatus_t cudnnGetRNNTempSpaceSizes(cudnnHandle_t handle,
    #     cudnnRNNDescriptor_t rnnDesc, cudnnForwardMode_t fwdMode,
    #     cudnnRNNDataDescriptor_t xDesc, size_t *workSpaceSize, size_t *reserveSpaceSize);
    "cudnnGetRNNTempSpaceSizes": [_p, _p, c_int, _p, _size_p, _size_p],
    # cudnnStatus_t cudnnGetRNNWeightParams(cudnnHandle_t handle,
    #     cudnnRNNDescriptor_t rnnDesc, int32_t pseudoLayer, size_t weightSpaceSize,
    #     const void *weightSpace, int32_t linLayerID, cudnnTensorDescriptor_t mDesc,
    #     void **mAddr, cudnnTensorDescriptor_t bDesc, void **bAddr);
    "cudnnGetRNNWeightParams": [_p, _p, c_int32, c_size_t, _p, c_int32, _p, POINTER(_p), _p,
                                POINTER(_p)],
    # cudnnStatus_t cudnnCreateRNNDataDescriptor(cudnnRNNDataDescriptor_t *rnnDataDesc);
    "cudnnCreateRNNDataDescriptor": [POINTER(_p)],
    # cudnnStatus_t cudnnDestroyRNNDataDescriptor(cudnnRNNDataDescriptor_t rnnDataDesc);
    "cudnnDestroyRNNDataDescriptor": [_p],
    # cudnnStatus_t cudnnSetRNNDataDescriptor(cudnnRNNDataDescriptor_t rnnDataDesc,
    #     cudnnDataType_t dataType, cudnnRNNDataLayout_t layout, int maxSeqLength,
    #     int batchSize, int vectorSize, const int seqLengthArray[], void *paddingFill);
    "cudnnSetRNNDataDescriptor": [_p, c_int, c_int, c_int, c_int, c_int, _int_p, _p],
    # cudnnStatus_t cudnnGetTensorNdDescriptor(const cudnnTensorDescriptor_t tensorDesc,
    #     int nbDimsRequested, cudnnDataType_t *dataType, int *nbDims, int dimA[],
    #     int strideA[]);
    "cudnnGetTensorNdDescriptor": [_p, c_int, _int_p, _int_p, _int_p, _int_p],
    # cudnnStatus_t cudnnRNNForward(cudnnHandle_t handle, cudnnRNNDescriptor_t rnnDesc,
    #     cudnnForwardMode_t fwdMode, const int32_t devSeqLengths[],
    #     cudnnRNNDataDescriptor_t xDesc, const void *x, cudnnRNNDataDescriptor_t yDesc,
    #     void *y, cudnnTensorDescriptor_t hDesc, const void *hx, void *hy,
    #     cudnnTensorDescriptor_t cDesc, const void *cx, void *cy, size_t weightSpaceSize,
    #     const void *weightSpace, size_t workSpaceSize, void *workSpace,
    #     size_t reserveSpaceSize, void *reserveSpace);
    "cudnnRNNForward": [_p, _p, c_int, _p, _p, _p, _p, _p, _p, _p, _p, _p, _p, _p, c_size_t,
                        _p, c_size_t, _p, c_size_t, _p],
    # cudnnStatus_t cudnnRNNBackwardData_v8(cudnnHandle_t handle,
    #     cudnnRNNDescriptor_t rnnDesc, const int32_t devSeqLengths[],
    #     cudnnRNNDataDescriptor_t yDesc, const void *y, const void *dy,
    #     cudnnRNNDataDescriptor_t xDesc, void *dx, cudnnTensorDescriptor_t hDesc,
    #     const void *hx, const void *dhy, void *dhx, cudnnTensorDescriptor_t cDesc,
    #     const void *cx, const void *dcy, void *dcx, size_t weightSpaceSize,
    #     const void *weightSpace, size_t workSpaceSize, void *workSpace,
    #     size_t reserveSpaceSize, void *reserveSpace);
    "cudnnRNNBackwardData_v8": [_p, _p, _p, _p, _p, _p, _p, _p, _p, _p, _p, _p, _p, _p, _p,
                                _p, c_size_t, _p, c_size_t, _p, c_size_t, _p],
    # cudnnStatus_t cudnnRNNBackwardWeights_v8(cudnnHandle_t handle,
    #     cudnnRNNDescriptor_t rnnDesc, cudnnWgradMode_t addGrad,
    #     const int32_t devSeqLengths[], cudnnRNNDataDescriptor_t xDesc, const void *x,
    #     cudnnTensorDescriptor_t hDesc, const void *hx, cudnnRNNDataDescriptor_t yDesc,
    #     const void *y, size_t weightSpaceSize, void *dweightSpace, size_t workSpaceSize,
    #     void *workSpace, size_t reserveSpaceSize, void *reserveSpace);
    "cudnnRNNBackwardWeights_v8": [_p, _p, c_int, _p, _p, _p, _p, _p, _p, _p, c_size_t, _p,
                                   c_size_t, _p, c_size_t, _p],
}
api.register_prototypes(PROTOTYPES)


def precision(dtype):
    """(dataType, mathPrec, mathType) for data of ``dtype`` (see the module docstring)."""
    dt = float_name(dtype)
    if dt == "float16":
        return DATA_TYPES["float16"], DATA_TYPES["float32"], MATH_TENSOR_OP
    if dt == "float32":
        return DATA_TYPES["float32"], DATA_TYPES["float32"], MATH_FMA
    if dt == "float64":
        return DATA_TYPES["float64"], DATA_TYPES["float64"], MATH_DEFAULT
    raise ValueError(f"cuDNN RNN: data type {dtype} (cuDNN takes float16, float32, float64)")


# --- descriptors ---------------------------------------------------------------------------

class RNNDescriptor(Descriptor):
    """Set by cudnnSetRNNDescriptor_v8 (see the module docstring)."""
    create_fn, destroy_fn = "cudnnCreateRNNDescriptor", "cudnnDestroyRNNDescriptor"


class RNNDataDescriptor(Descriptor):
    """A time-major padded batch: T steps of N vectors of ``vector`` elements; sequence n has
    ``lengths[n]`` valid steps and its output is filled with 0 past them."""
    create_fn, destroy_fn = "cudnnCreateRNNDataDescriptor", "cudnnDestroyRNNDataDescriptor"

    def __init__(self, dtype, T, N, vector, lengths):
        super().__init__()
        # The fill is read as one element of the data type; 8 zero bytes are 0.0 in half,
        # float and double alike, whatever width cuDNN reads.
        fill = ctypes.c_double(0.0)
        try:
            api.call("cudnnSetRNNDataDescriptor", self.ptr, precision(dtype)[0],
                     SEQ_MAJOR_UNPACKED, int(T), int(N), int(vector),
                     (c_int * len(lengths))(*lengths), ctypes.byref(fill),
                     context=f"T {T}, N {N}, vector {vector}, {float_name(dtype)}")
        except Exception:
            self.close()
            raise


class _QueryTensor(Descriptor):
    """An unset tensor descriptor that cudnnGetRNNWeightParams fills in."""
    create_fn, destroy_fn = "cudnnCreateTensorDescriptor", "cudnnDestroyTensorDescriptor"

    def dims(self):
        dt, nb = c_int(), c_int()
        dims, strides = (c_int * 8)(), (c_int * 8)()
        api.call("cudnnGetTensorNdDescriptor", self.ptr, 8, ctypes.byref(dt), ctypes.byref(nb),
                 dims, strides)
        return tuple(dims[:nb.value])


# --- plans ---------------------------------------------------------------------------------

def describe(cfg):
    return (f"{cfg.mode} I={cfg.input_size} H={cfg.hidden_size} layers={cfg.num_layers} "
            f"{'bi' if cfg.bidirectional else 'uni'}directional input={cfg.input_mode} "
            f"{cfg.dtype}")


@dataclasses.dataclass
class _Net:
    """The RNN descriptor of one configuration (and the dropout descriptor it refers to)."""
    rnn: RNNDescriptor
    dropout: DropoutDescriptor
    weight_bytes: int
    ctx: str


@dataclasses.dataclass
class _Data:
    """The data descriptors of one (config, T, N, lengths)."""
    x: RNNDataDescriptor
    y: RNNDataDescriptor
    h: TensorDescriptor
    T: int
    N: int
    lengths: tuple
    sizes: dict                # forward mode -> (workspace bytes, reserve bytes)

    @property
    def padded(self):
        """Some sequence ends before T (so dx has padding that cuDNN may leave unwritten)."""
        return min(self.lengths) < self.T


NETS_MAX, DATAS_MAX = 64, 256
_nets, _datas = collections.OrderedDict(), collections.OrderedDict()
_lock = threading.Lock()


def _cached(table, limit, key, make):
    with _lock:
        v = table.get(key)
        if v is not None:
            table.move_to_end(key)
            return v
    v = make()
    with _lock:
        v = table.setdefault(key, v)
        while len(table) > limit:
            table.popitem(last=False)  # destroyed with its last reference (see the docstring)
    return v


def clear_plans():
    with _lock:
        _nets.clear()
        _datas.clear()


def _new_net(cfg, h):
    ctx = describe(cfg)
    dt, prec, math_t = precision(cfg.dtype)
    drop = DropoutDescriptor()
    api.call("cudnnSetDropoutDescriptor", drop, h, c_float(0.0), c_void_p(None), c_size_t(0),
             c_ulonglong(0), context=f"no-dropout descriptor for {ctx}")
    rnn = RNNDescriptor()
    api.call("cudnnSetRNNDescriptor_v8", rnn, ALGO_STANDARD, CELL_MODE[cfg.mode], DOUBLE_BIAS,
             BIDIRECTIONAL if cfg.bidirectional else UNIDIRECTIONAL, INPUT_MODE[cfg.input_mode],
             dt, prec, math_t, cfg.input_size, cfg.hidden_size, cfg.hidden_size,
             cfg.num_layers, drop, PADDED_IO_ENABLED, context=ctx)
    size = c_size_t()
    api.call("cudnnGetRNNWeightSpaceSize", h, rnn, ctypes.byref(size), context=ctx)
    return _Net(rnn, drop, size.value, ctx)


def net(cfg, h):
    return _cached(_nets, NETS_MAX, (device_id(), cfg), lambda: _new_net(cfg, h))


def device_lengths(lengths, stream):
    """The lengths as a device int32 array (made once per content: arrays.constant)."""
    return constant(lengths, np.int32)


def _new_data(cfg, T, N, lengths):
    H = cfg.hidden_size
    return _Data(RNNDataDescriptor(cfg.dtype, T, N, cfg.input_size, lengths),
                 RNNDataDescriptor(cfg.dtype, T, N, cfg.directions * H, lengths),
                 TensorDescriptor((cfg.num_layers * cfg.directions, N, H), cfg.dtype, min_rank=3),
                 T, N, lengths, {})


def data(cfg, T, N, lengths):
    """The data plan; ``lengths`` None means every sequence has T steps."""
    lengths = (int(T),) * int(N) if lengths is None else tuple(int(n) for n in lengths)
    key = (device_id(), cfg, int(T), int(N), lengths)
    return _cached(_datas, DATAS_MAX, key, lambda: _new_data(cfg, int(T), int(N), lengths))


def temp_sizes(h, n, d, mode):
    """(workspace, reserve) bytes of ``mode`` (FWD_INFERENCE or FWD_TRAINING; the training
    workspace also serves both backward calls), remembered by the data plan."""
    got = d.sizes.get(mode)
    if got is None:
        work, reserve = c_size_t(), c_size_t()
        api.call("cudnnGetRNNTempSpaceSizes", h, n.rnn, mode, d.x, ctypes.byref(work),
                 ctypes.byref(reserve), context=f"{n.ctx}, T {d.T}, N {d.N}, mode {mode}")
        got = d.sizes[mode] = (work.value, reserve.value if mode == FWD_TRAINING else 0)
    return got


# --- calls ---------------------------------------------------------------------------------

@dataclasses.dataclass
class Saved:
    """What backward needs from a training forward: its descriptors, reserve space and the
    device copy of the lengths."""
    net: _Net
    data: _Data
    reserve: object
    reserve_bytes: int
    dev_lengths: object


def _null(a):
    return c_void_p(None) if a is None else ptr(a)


def _nbytes(a):
    return int(a.size) * np.dtype(a.dtype).itemsize


def _check_weights(n, w):
    if _nbytes(w) != n.weight_bytes:
        raise DnnkitError(
            f"cuDNN RNN {n.ctx}: cuDNN's weight space is {n.weight_bytes} bytes but w has "
            f"{_nbytes(w)} ({w.size} elements): dnnkit's flat layout (param_size) does not "
            "match this cuDNN")


def scratch_buffer(nbytes, stream_ptr):
    """A scratch block of ``nbytes`` on the raw stream (a context: its pointer when entered)."""
    return memory.scratch(int(nbytes), stream_ptr)


def reserve_array(nbytes, stream):
    """A training forward's reserve space: a device byte array kept by its Saved state."""
    return memory.device_array((max(1, int(nbytes)),), np.uint8, stream)


def forward(cfg, w, x, hx, cx, y, hy, cy, lengths, training, stream):
    """y, hy and cy (LSTM) from x, w and the initial states (None: zeros). Returns the Saved
    state for :func:`backward` when ``training``, else None."""
    sp = stream_pointer(stream)
    h = handle.get(sp)
    n = net(cfg, h)
    _check_weights(n, w)
    T, N = int(x.shape[0]), int(x.shape[1])
    d = data(cfg, T, N, lengths)
    mode = FWD_TRAINING if training else FWD_INFERENCE
    work, nres = temp_sizes(h, n, d, mode)
    reserve = reserve_array(nres, stream) if training else None
    dev_lengths = device_lengths(d.lengths, stream)
    with scratch_buffer(work, sp) as ws:
        api.call("cudnnRNNForward", h, n.rnn, mode, ptr(dev_lengths), d.x, ptr(x), d.y,
                 ptr(y), d.h, _null(hx), ptr(hy), d.h, _null(cx), _null(cy),
                 c_size_t(n.weight_bytes), ptr(w), c_size_t(work), c_void_p(ws),
                 c_size_t(nres), _null(reserve),
                 context=f"{n.ctx}, T {T}, N {N}, {'training' if training else 'inference'}")
    return Saved(n, d, reserve, nres, dev_lengths) if training else None


def backward(cfg, w, x, y, dy, dhy, dcy, hx, cx, dx, dhx, dcx, dw, saved, stream):
    """dx, dhx, dcx (LSTM) and dw (zeroed here, then accumulated by cuDNN) from the Saved
    state of a training forward with the same w, x, hx, cx and lengths."""
    sp = stream_pointer(stream)
    h = handle.get(sp)
    n, d = saved.net, saved.data
    _check_weights(n, w)
    work, _ = temp_sizes(h, n, d, FWD_TRAINING)
    ctx = f"{n.ctx}, T {d.T}, N {d.N}"
    zero_fill(dw, stream)
    if d.padded:
        zero_fill(dx, stream)
    # cudnnRNNBackwardData_v8 writes into the reserve space (measured on an H200: a second
    # backward from the same reserve gave a different dx), so each backward runs on a copy and
    # the state stays reusable; the copy is one device-to-device pass over the reserve bytes.
    with scratch_buffer(work, sp) as ws, scratch_buffer(saved.reserve_bytes, sp) as res:
        copy_async(res, saved.reserve, saved.reserve_bytes, sp)
        api.call("cudnnRNNBackwardData_v8", h, n.rnn, ptr(saved.dev_lengths), d.y, ptr(y),
                 ptr(dy), d.x, ptr(dx), d.h, _null(hx), _null(dhy), ptr(dhx), d.h,
                 _null(cx), _null(dcy), _null(dcx), c_size_t(n.weight_bytes), ptr(w),
                 c_size_t(work), c_void_p(ws), c_size_t(saved.reserve_bytes),
                 c_void_p(res), context=ctx)
        api.call("cudnnRNNBackwardWeights_v8", h, n.rnn, WGRAD_MODE_ADD,
                 ptr(saved.dev_lengths),
                 d.x, ptr(x), d.h, _null(hx), d.y, ptr(y), c_size_t(n.weight_bytes),
                 ptr(dw), c_size_t(work), c_void_p(ws), c_size_t(saved.reserve_bytes),
                 c_void_p(res), context=ctx)


# --- the weight space ----------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class WeightParam:
    """Where cuDNN keeps one linear layer's matrix and bias: element offsets into the weight
    space and shapes ((rows, cols) and (rows,)); None where there is none (the input matrices
    of layer 0 with skip input)."""
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
    _check_weights(n, w)
    base, item = (ptr(w) or 0), np.dtype(w.dtype).itemsize
    out = []
    for pl in range(cfg.num_layers * cfg.directions):
        for lin in range(2 * cfg.gates):
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


def size_reason(cfg, T, N):
    """Why cuDNN's 32-bit sizes cannot describe this problem, or None (pure)."""
    D, H, L = cfg.directions, cfg.hidden_size, cfg.num_layers
    counts = {"x": T * N * cfg.input_size, "y": T * N * D * H, "hx": L * D * N * H,
              "a layer's gates": cfg.gates * H * max(cfg.input_size, D * H)}
    for name, n in counts.items():
        if n > INT_MAX:
            return (f"{name} has {n} elements; cuDNN's RNN describes tensors with 32-bit "
                    "integers (at most 2**31 - 1)")
    return None
