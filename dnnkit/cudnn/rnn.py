"""cuDNN 9 recurrent networks (cudnn_adv): RNN relu/tanh, LSTM, GRU through the v8 API.

One RNN descriptor per (device, RNNConfig, algorithm, dropout states), set with
cudnnSetRNNDescriptor_v8:
- algo: cudnnRNNAlgo_t (``ALGO``: standard, persist_static, persist_dynamic,
  persist_static_small_h; ops/rnn_cudnn.py chooses and checks); persist_dynamic also needs
  cudnnBuildRNNDynamic for the batch size, run before a call whose N differs from the last
  build's (the plan is for one minibatch size);
- biasMode CUDNN_RNN_DOUBLE_BIAS: an input and a recurrent bias per linear layer, the layout
  both backends read (dnnkit/rnn_layout.py);
- projSize = cfg.proj_size or hiddenSize (an LSTM's projection; then hy and y are P wide);
- precision (``precision()``): half data computes in float with tensor cores (mathPrec
  CUDNN_DATA_FLOAT, as PyTorch does: accumulating in half over long sequences loses too
  much); float data in float with CUDNN_FMA_MATH (no TF32, the same default as dnnkit's
  convolutions); double in double with CUDNN_DEFAULT_MATH;
- dropoutDesc: for a training forward with cfg.dropout > 0, the descriptor of an RNG-state
  entry (cudnn/rnn_dropout.py: per device, stream, seed and p; restored at offset 0, after
  which the RNN descriptor is set again so that it reads the restored states); otherwise a
  descriptor set to dropout 0 with no RNG states (cudnnSetDropoutDescriptor with a NULL state
  buffer is cheap and runs no init kernel when dropout is 0);
- auxFlags CUDNN_RNN_PADDED_IO_ENABLED: required for the padded (unpacked) data layouts.

Data: x (T, N, I) and y (T, N, D*P) are described by RNN data descriptors in layout
CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED (time-major, padded to T) with the per-sequence
lengths (any order) and padding fill 0, so y is 0 past each sequence's end; hx/hy/cx/cy by a
packed 3-D tensor descriptor (L*D, N, P) and (L*D, N, H) (P = H without a projection). cuDNN's kernels also read the lengths from device
memory (devSeqLengths, read asynchronously): each forward copies them (N int32) on its own
stream into a stream-ordered buffer, which the training state keeps for the backward. Zero
initial states and zero state gradients are passed as NULL (cuDNN reads NULL as zeros).

Buffers: the workspace comes from ``dnnkit.memory.scratch`` for the duration of the calls;
the reserve space of a training forward (cudnnGetRNNTempSpaceSizes, FWD_MODE_TRAINING) is an
array kept by the returned ``Saved`` and handed to cudnnRNNBackwardData_v8 (which updates it)
and then cudnnRNNBackwardWeights_v8. The weight gradient is accumulated by cuDNN
(CUDNN_WGRAD_MODE_ADD) into a buffer zeroed here, so dw is always fresh.

Descriptors are cached (``_nets`` per device, config, algorithm and dropout entry, ``_datas``
per device, config, T, N and lengths; small LRUs). A plan's lock serialises the calls that
change its descriptor's state (the dropout restore, the dynamic build) with the calls using it. An evicted descriptor is not destroyed by the cache: a training
state may still hold it; it is destroyed when its last reference goes (weakref.finalize).
"""

import collections
import contextlib
import ctypes
import dataclasses
import threading
from ctypes import POINTER, c_float, c_int, c_int32, c_size_t, c_uint32, c_ulonglong, c_void_p

import numpy as np

from .. import memory
from ..arrays import constant, float_name, zero_fill
from ..device import device_id, stream_pointer
from ..errors import CudnnError, DnnkitError
from . import api, handle, rnn_dropout
from .api import copy_async, ptr
from .descriptors import Descriptor, TensorDescriptor
from .dropout import DropoutDescriptor
from .enums import DATA_TYPES, MATH_DEFAULT, MATH_FMA, MATH_TENSOR_OP

_p = c_void_p
_int_p = POINTER(c_int)
_size_p = POINTER(c_size_t)

# --- enums (cudnn_adv.h) -------------------------------------------------------------------
ALGO = {"standard": 0, "persist_static": 1, "persist_dynamic": 2,   # cudnnRNNAlgo_t
        "persist_static_small_h": 3}
ALGO_STANDARD = ALGO["standard"]
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
    # cudnnStatus_t cudnnBuildRNNDynamic(cudnnHandle_t handle, cudnnRNNDescriptor_t rnnDesc,
    #     int miniBatch);
    "cudnnBuildRNNDynamic": [_p, _p, c_int],
    # cudnnStatus_t cudnnGetRNNWeightSpaceSize(cudnnHandle_t handle,
    #     cudnnRNNDescriptor_t rnnDesc, size_t *weightSpaceSize);
    "cudnnGetRNNWeightSpaceSize": [_p, _p, _size_p],
    # cudnnStatus_t cudnnGetRNNTempSpaceSizes(cudnnHandle_t handle,
    #     cudnnRNNDescriptor_t rnnDesc, cudnnForwardMode_t fwdMode,
    #     cudnnRNNDataDescriptor_t xDesc, size_t *workSpaceSize, size_t *reserveSpaceSize);
    "cudnnGetRNNTempSpaceSizes": [_p, _p, c_int, _p, _size_p, _size_p],
    # cudnnStatus_t cudnnCreateRNNDataDescriptor(cudnnRNNDataDescriptor_t *rnnDataDesc);
    "cudnnCreateRNNDataDescriptor": [POINTER(_p)],
    # cudnnStatus_t cudnnDestroyRNNDataDescriptor(cudnnRNNDataDescriptor_t rnnDataDesc);
    "cudnnDestroyRNNDataDescriptor": [_p],
    # cudnnStatus_t cudnnSetRNNDataDescriptor(cudnnRNNDataDescriptor_t rnnDataDesc,
    #     cudnnDataType_t dataType, cudnnRNNDataLayout_t layout, int maxSeqLength,
    #     int batchSize, int vectorSize, const int seqLengthArray[], void *paddingFill);
    "cudnnSetRNNDataDescriptor": [_p, c_int, c_int, c_int, c_int, c_int, _int_p, _p],
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


# --- plans ---------------------------------------------------------------------------------

def describe(cfg, algo="standard"):
    return (f"{cfg.mode} I={cfg.input_size} H={cfg.hidden_size} layers={cfg.num_layers} "
            f"{'bi' if cfg.bidirectional else 'uni'}directional input={cfg.input_mode} "
            f"{cfg.dtype}" + (f" proj={cfg.proj_size}" if cfg.proj_size else "")
            + (f" dropout={cfg.dropout}" if cfg.dropout else "") + f" algo={algo}")


@dataclasses.dataclass
class _Net:
    """The RNN descriptor of one configuration and algorithm, the dropout descriptor it refers
    to and, with dropout, its RNG-state entry (else None); ``built``: the batch size of the
    last cudnnBuildRNNDynamic (persist_dynamic)."""
    rnn: RNNDescriptor
    dropout: DropoutDescriptor
    weight_bytes: int
    ctx: str
    algo: str = "standard"
    entry: object = None
    built: object = None
    lock: object = dataclasses.field(default_factory=threading.Lock)


@dataclasses.dataclass
class _Data:
    """The data descriptors of one (config, T, N, lengths)."""
    x: RNNDataDescriptor
    y: RNNDataDescriptor
    h: TensorDescriptor
    T: int
    N: int
    lengths: tuple
    sizes: dict                # (algo, dropout, forward mode) -> (workspace, reserve bytes)
    c_desc: object = None      # cx/cy's descriptor where it differs from h's (projection)

    @property
    def c(self):
        return self.h if self.c_desc is None else self.c_desc

    @property
    def padded(self):
        """Some sequence ends before T (so dx has padding that cuDNN may leave unwritten)."""
        return min(self.lengths) < self.T


NETS_MAX, DATAS_MAX = 64, 256
_nets, _datas = collections.OrderedDict(), collections.OrderedDict()
_probed = {}                   # probe() answers
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
        _probed.clear()


def set_descriptor(n, cfg):
    """(Re)set ``n.rnn`` with cudnnSetRNNDescriptor_v8 (the module docstring's settings)."""
    dt, prec, math_t = precision(cfg.dtype)
    api.call("cudnnSetRNNDescriptor_v8", n.rnn, ALGO[n.algo], CELL_MODE[cfg.mode],
             DOUBLE_BIAS, BIDIRECTIONAL if cfg.bidirectional else UNIDIRECTIONAL,
             INPUT_MODE[cfg.input_mode], dt, prec, math_t, cfg.input_size, cfg.hidden_size,
             cfg.out_size, cfg.num_layers, n.dropout, PADDED_IO_ENABLED, context=n.ctx)
    n.built = None          # a dynamic plan is built for the descriptor as it was set


def _new_net(cfg, h, algo, entry):
    ctx = describe(cfg, algo)
    if entry is None:
        drop = DropoutDescriptor()
        api.call("cudnnSetDropoutDescriptor", drop, h, c_float(0.0), c_void_p(None),
                 c_size_t(0), c_ulonglong(0), context=f"no-dropout descriptor for {ctx}")
    else:
        drop = entry.desc
    n = _Net(RNNDescriptor(), drop, 0, ctx, algo, entry)
    set_descriptor(n, cfg)
    size = c_size_t()
    api.call("cudnnGetRNNWeightSpaceSize", h, n.rnn, ctypes.byref(size), context=ctx)
    n.weight_bytes = size.value
    return n


def net(cfg, h, algo="standard", entry=None):
    """The plan of ``cfg`` with ``algo``; ``entry``: the dropout states of a training forward
    with dropout (cudnn/rnn_dropout.py), None for a descriptor without dropout."""
    key = (device_id(), cfg, algo, None if entry is None else entry.key)
    return _cached(_nets, NETS_MAX, key, lambda: _new_net(cfg, h, algo, entry))


def build_dynamic(h, n, N):
    """cudnnBuildRNNDynamic for batch size N unless the plan was last built for it (the
    caller holds ``n.lock``)."""
    if n.algo == "persist_dynamic" and n.built != N:
        api.call("cudnnBuildRNNDynamic", h, n.rnn, int(N), context=f"{n.ctx}, N {N}")
        n.built = N


def device_lengths(lengths, stream):
    """The lengths as a device int32 array (made once per content: arrays.constant)."""
    return constant(lengths, np.int32)


def _new_data(cfg, T, N, lengths):
    H, P, LD = cfg.hidden_size, cfg.out_size, cfg.num_layers * cfg.directions
    c = TensorDescriptor((LD, N, H), cfg.dtype, min_rank=3) if P != H else None
    return _Data(RNNDataDescriptor(cfg.dtype, T, N, cfg.input_size, lengths),
                 RNNDataDescriptor(cfg.dtype, T, N, cfg.directions * P, lengths),
                 TensorDescriptor((LD, N, P), cfg.dtype, min_rank=3), T, N, lengths, {}, c)


def data(cfg, T, N, lengths):
    """The data plan; ``lengths`` None means every sequence has T steps."""
    lengths = (int(T),) * int(N) if lengths is None else tuple(int(n) for n in lengths)
    key = (device_id(), cfg, int(T), int(N), lengths)
    return _cached(_datas, DATAS_MAX, key, lambda: _new_data(cfg, int(T), int(N), lengths))


def temp_sizes(h, n, d, mode):
    """(workspace, reserve) bytes of ``mode`` (FWD_INFERENCE or FWD_TRAINING; the training
    workspace also serves both backward calls), remembered by the data plan per algorithm
    and dropout."""
    key = (n.algo, n.entry is not None, mode)
    got = d.sizes.get(key)
    if got is None:
        work, reserve = c_size_t(), c_size_t()
        api.call("cudnnGetRNNTempSpaceSizes", h, n.rnn, mode, d.x, ctypes.byref(work),
                 ctypes.byref(reserve), context=f"{n.ctx}, T {d.T}, N {d.N}, mode {mode}")
        got = d.sizes[key] = (work.value, reserve.value if mode == FWD_TRAINING else 0)
    return got


def probe(cfg, algo, T, N, lengths, training, stream):
    """None when cuDNN takes ``algo`` for this configuration and batch (the descriptor set,
    the dynamic plan built, the temporary sizes answered), else cuDNN's refusal as a sentence.
    Remembered per (device, config, algorithm, T, N, lengths, mode)."""
    key = (device_id(), cfg, algo, int(T), int(N),
           None if lengths is None else tuple(int(v) for v in lengths), bool(training))
    if key in _probed:
        return _probed[key]
    h = handle.get(stream_pointer(stream))
    reason = None
    try:
        n = net(cfg, h, algo)
        d = data(cfg, T, N, lengths)
        with n.lock:
            build_dynamic(h, n, int(N))
            temp_sizes(h, n, d, FWD_TRAINING if training else FWD_INFERENCE)
    except CudnnError as e:
        reason = f"cuDNN refuses algo {algo!r} for {describe(cfg, algo)}, N {N}: {e}"
    if len(_probed) >= 4096:
        _probed.clear()
    _probed[key] = reason
    return reason


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


def check_weights(n, w):
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


def forward(cfg, w, x, hx, cx, y, hy, cy, lengths, training, stream, algo="standard",
            seed=None, offset=0):
    """y, hy and cy (LSTM) from x, w and the initial states (None: zeros) with ``algo``; a
    training forward with cfg.dropout > 0 drops with the masks of call ``offset`` of ``seed``
    (cudnn/rnn_dropout.py). Returns the Saved state for :func:`backward` when ``training``,
    else None."""
    sp = stream_pointer(stream)
    h = handle.get(sp)
    drop = training and cfg.dropout > 0 and cfg.num_layers > 1
    entry = rnn_dropout.entry(h, cfg.dropout, seed, stream) if drop else None
    n = net(cfg, h, algo, entry)
    check_weights(n, w)
    T, N = int(x.shape[0]), int(x.shape[1])
    d = data(cfg, T, N, lengths)
    mode = FWD_TRAINING if training else FWD_INFERENCE
    dev_lengths = device_lengths(d.lengths, stream)
    with n.lock, (entry.lock if drop else contextlib.nullcontext()):
        if drop and rnn_dropout.restore(entry, h, offset, stream):
            set_descriptor(n, cfg)
        build_dynamic(h, n, N)
        work, nres = temp_sizes(h, n, d, mode)
        reserve = reserve_array(nres, stream) if training else None
        with scratch_buffer(work, sp) as ws:
            api.call("cudnnRNNForward", h, n.rnn, mode, ptr(dev_lengths), d.x, ptr(x), d.y,
                     ptr(y), d.h, _null(hx), ptr(hy), d.c, _null(cx), _null(cy),
                     c_size_t(n.weight_bytes), ptr(w), c_size_t(work), c_void_p(ws),
                     c_size_t(nres), _null(reserve),
                     context=f"{n.ctx}, T {T}, N {N}, "
                             f"{'training' if training else 'inference'}")
        if drop:
            entry.next = offset + 1
    return Saved(n, d, reserve, nres, dev_lengths) if training else None


def backward(cfg, w, x, y, dy, dhy, dcy, hx, cx, dx, dhx, dcx, dw, saved, stream):
    """dx, dhx, dcx (LSTM) and dw (zeroed here, then accumulated by cuDNN) from the Saved
    state of a training forward with the same w, x, hx, cx and lengths."""
    sp = stream_pointer(stream)
    h = handle.get(sp)
    n, d = saved.net, saved.data
    check_weights(n, w)
    ctx = f"{n.ctx}, T {d.T}, N {d.N}"
    zero_fill(dw, stream)
    if d.padded:
        zero_fill(dx, stream)
    # cudnnRNNBackwardData_v8 writes into the reserve space (measured on an H200: a second
    # backward from the same reserve gave a different dx), so each backward runs on a copy and
    # the state stays reusable; the copy is one device-to-device pass over the reserve bytes.
    # The plan's lock: a dynamic plan must stay built for this N through both calls.
    with n.lock:
        build_dynamic(h, n, d.N)
        work, _ = temp_sizes(h, n, d, FWD_TRAINING)
        with scratch_buffer(work, sp) as ws, scratch_buffer(saved.reserve_bytes, sp) as res:
            copy_async(res, saved.reserve, saved.reserve_bytes, sp)
            api.call("cudnnRNNBackwardData_v8", h, n.rnn, ptr(saved.dev_lengths), d.y,
                     ptr(y), ptr(dy), d.x, ptr(dx), d.h, _null(hx), _null(dhy), ptr(dhx), d.c,
                     _null(cx), _null(dcy), _null(dcx), c_size_t(n.weight_bytes), ptr(w),
                     c_size_t(work), c_void_p(ws), c_size_t(saved.reserve_bytes),
                     c_void_p(res), context=ctx)
            api.call("cudnnRNNBackwardWeights_v8", h, n.rnn, WGRAD_MODE_ADD,
                     ptr(saved.dev_lengths), d.x, ptr(x), d.h, _null(hx), d.y, ptr(y),
                     c_size_t(n.weight_bytes), ptr(dw), c_size_t(work), c_void_p(ws),
                     c_size_t(saved.reserve_bytes), c_void_p(res), context=ctx)
