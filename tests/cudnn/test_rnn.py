"""cuDNN RNN layer without a GPU: prototypes and enums against the real library and headers,
the precision table, supports(), and every call's arguments with cuDNN stubbed (order,
NULLs for zero states, sizes, the workspace, the reserve space, dw zeroed, descriptors
destroyed, the descriptor caches)."""

import ctypes
import gc
import glob
import os
import re
import types

import numpy as np
import pytest

import dnnkit  # noqa: F401  (registers the ops)
from dnnkit.cudnn import api, enums, handle
from dnnkit.cudnn.descriptors import Descriptor
from dnnkit.cudnn import rnn as cr, rnn_dropout, rnn_weights as rw
from dnnkit.registry import OPS, REGISTRY
from dnnkit.errors import CudnnError, DnnkitError
from dnnkit.ops import rnn_cudnn
from dnnkit.rnn_layout import RNNConfig


def _headers(real):
    inc = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(real.path))), "include")
    text = "".join(open(f).read() for f in sorted(glob.glob(os.path.join(inc, "cudnn*.h"))))
    if "cudnnRNNForward" not in text:
        pytest.skip(f"no cuDNN headers in {inc}")
    return re.sub(r"/\*.*?\*/|//[^\n]*", "", text, flags=re.S)


PROTOTYPES = {**cr.PROTOTYPES, **rw.PROTOTYPES}


def test_every_rnn_prototype_is_in_the_real_library(real):
    lib = ctypes.CDLL(real.path)
    assert set(PROTOTYPES) <= set(api.PROTOTYPES)
    assert [n for n in PROTOTYPES if not hasattr(lib, n)] == []


def test_rnn_prototype_argument_counts_match_the_headers(real):
    text = _headers(real)
    for name, args in PROTOTYPES.items():
        m = re.search(rf"\b{name}\s*\(([^;{{]*?)\)\s*;", text)
        assert m, f"{name} not declared in the headers"
        assert m.group(1).count(",") + 1 == len(args), name


def test_rnn_enums_match_the_headers(real):
    text = _headers(real)

    def val(name):
        return int(re.search(rf"\b{name}\s*=\s*(\d+)", text).group(1))
    assert cr.ALGO_STANDARD == val("CUDNN_RNN_ALGO_STANDARD")
    assert cr.ALGO == {"standard": val("CUDNN_RNN_ALGO_STANDARD"),
                       "persist_static": val("CUDNN_RNN_ALGO_PERSIST_STATIC"),
                       "persist_dynamic": val("CUDNN_RNN_ALGO_PERSIST_DYNAMIC"),
                       "persist_static_small_h": val("CUDNN_RNN_ALGO_PERSIST_STATIC_SMALL_H")}
    assert (cr.FWD_INFERENCE, cr.FWD_TRAINING) == (val("CUDNN_FWD_MODE_INFERENCE"),
                                                   val("CUDNN_FWD_MODE_TRAINING"))
    assert cr.CELL_MODE == {"rnn_relu": val("CUDNN_RNN_RELU"), "rnn_tanh": val("CUDNN_RNN_TANH"),
                            "lstm": val("CUDNN_LSTM"), "gru": val("CUDNN_GRU")}
    assert cr.DOUBLE_BIAS == val("CUDNN_RNN_DOUBLE_BIAS")
    assert (cr.UNIDIRECTIONAL, cr.BIDIRECTIONAL) == (val("CUDNN_UNIDIRECTIONAL"),
                                                     val("CUDNN_BIDIRECTIONAL"))
    assert cr.INPUT_MODE == {"linear": val("CUDNN_LINEAR_INPUT"), "skip": val("CUDNN_SKIP_INPUT")}
    assert cr.SEQ_MAJOR_UNPACKED == val("CUDNN_RNN_DATA_LAYOUT_SEQ_MAJOR_UNPACKED")
    assert cr.WGRAD_MODE_ADD == val("CUDNN_WGRAD_MODE_ADD")
    flag = re.search(r"#define\s+CUDNN_RNN_PADDED_IO_ENABLED\s+\((\d+)U\s*<<\s*(\d+)\)", text)
    assert cr.PADDED_IO_ENABLED == int(flag.group(1)) << int(flag.group(2))
    assert [enums.DATA_FLOAT, enums.DATA_DOUBLE, enums.DATA_HALF] == [
        val("CUDNN_DATA_FLOAT"), val("CUDNN_DATA_DOUBLE"), val("CUDNN_DATA_HALF")]


def test_precision():
    assert cr.precision("float16") == (enums.DATA_HALF, enums.DATA_FLOAT, enums.MATH_TENSOR_OP)
    assert cr.precision(np.float32) == (enums.DATA_FLOAT, enums.DATA_FLOAT, enums.MATH_FMA)
    assert cr.precision("float64") == (enums.DATA_DOUBLE, enums.DATA_DOUBLE,
                                       enums.MATH_DEFAULT)
    with pytest.raises(ValueError, match="int32"):
        cr.precision("int32")


# --- supports() ----------------------------------------------------------------------------

LSTM = RNNConfig("lstm", 3, 4, 2, bidirectional=True)
GRU = RNNConfig("gru", 5, 6, 1)
# a stand-in for cudnn.rnn.Saved where only the algorithm is read
SAVED = types.SimpleNamespace(net=types.SimpleNamespace(algo="standard"), reserve_bytes=0)


class Shaped:
    """Shape and dtype only (supports() reads nothing else)."""
    def __init__(self, shape, dtype="float32"):
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self.size = int(np.prod(shape))


def fwd_reason(cfg, x, lengths=None, training=False, seed=None, offset=0, algo="auto"):
    return rnn_cudnn._supports_forward(cfg, None, x, None, None, lengths, training, seed, offset,
                                       algo, None)


def test_supports_forward():
    assert fwd_reason(LSTM, Shaped((7, 2, 3))) is None
    assert fwd_reason(LSTM, Shaped((7, 2, 3), "float16")) is None
    assert fwd_reason(LSTM, Shaped((7, 2, 3)), np.array([7, 1], np.int32)) is None
    assert "empty" in fwd_reason(LSTM, Shaped((0, 2, 3)))
    assert "empty" in fwd_reason(LSTM, Shaped((7, 0, 3)))
    assert "in [1, T=7]" in fwd_reason(LSTM, Shaped((7, 2, 3)), np.array([8, 1], np.int32))
    assert "in [1, T=7]" in fwd_reason(LSTM, Shaped((7, 2, 3)), np.array([0, 1], np.int32))
    skip = RNNConfig("rnn_tanh", 3, 4, input_mode="skip")
    assert "input_size == hidden_size" in fwd_reason(skip, Shaped((7, 2, 3)))
    big = RNNConfig("gru", 1024, 1024)
    assert "x has 2147483648 elements" in fwd_reason(big, Shaped((2**11, 2**10, 1024)))
    assert "2**31 - 1" in fwd_reason(big, Shaped((2**10, 2**11, 1024)))
    assert fwd_reason(big, Shaped((2**10, 2**10, 1024))) is None   # 2**30 elements
    wide = RNNConfig("lstm", 2**16, 2**14)
    assert "gates" in fwd_reason(wide, Shaped((1, 1, 2**16)))


def test_supports_backward_needs_a_cudnn_state():
    class NumbaState:
        backend = "numba"
    args = (LSTM, None, Shaped((7, 2, 3)), None, None, None, None, None, None, None)
    why = rnn_cudnn._supports_backward(*args, NumbaState(), None)
    assert "made by the numba backend" in why and "reserve space" in why
    state = rnn_cudnn.CudnnRNNState(LSTM, (7, 2, 3), None, SAVED)
    assert rnn_cudnn._supports_backward(*args, state, None) is None
    assert "made by the None backend" in rnn_cudnn._supports_backward(*args, None, None)


def test_registered_for_both_ops():
    assert REGISTRY["rnn_forward"]["cudnn"].fn is rnn_cudnn._forward_cudnn
    assert REGISTRY["rnn_backward"]["cudnn"].supports is rnn_cudnn._supports_backward
    assert OPS["rnn_backward"].crosscheck is False   # the state is backend-specific


# --- cuDNN stubbed -------------------------------------------------------------------------

class Dev:
    """A fake device array: shape, dtype and a pointer."""
    _next = [0x10000]

    def __init__(self, shape, dtype="float32"):
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self.size = int(np.prod(shape))
        self.ndim = len(self.shape)
        self.addr = Dev._next[0]
        Dev._next[0] += max(256, self.size * self.dtype.itemsize + 256)

    @property
    def device_ctypes_pointer(self):
        return ctypes.c_void_p(self.addr)


class FakeCudnn:
    """Records every call (name, args); answers the out-parameters; fails on request."""

    def __init__(self, monkeypatch, weight_bytes, work=1000, reserve=5000, fail=()):
        self.calls, self.fail, self.next = [], set(fail), 0x100
        self.refuse_algos = set()     # cudnnRNNAlgo_t values whose temp sizes are refused
        self.weight_bytes, self.work, self.reserve = weight_bytes, work, reserve
        self.params = {}        # (pseudo-layer, lin) -> (m addr or 0, m dims, b addr, b dims)
        self.dims = {}          # descriptor pointer -> dims
        self.zeroed, self.scratches, self.lengths, self.copies = [], [], [], []
        monkeypatch.setattr(api, "function", self.function)
        monkeypatch.setattr(api, "status_name", lambda s: f"STATUS_{s}")
        monkeypatch.setattr(handle, "get", lambda sp=0: ctypes.c_void_p(0xCAFE))
        monkeypatch.setattr(handle, "device_id", lambda: 0)
        monkeypatch.setattr(cr, "device_id", lambda: 0)
        monkeypatch.setattr(cr, "device_lengths", self.device_lengths)
        monkeypatch.setattr(cr, "zero_fill", lambda a, s: self.zeroed.append((a, s)))
        monkeypatch.setattr(cr, "copy_async", lambda *a: self.copies.append(a))
        monkeypatch.setattr(cr, "reserve_array", lambda n, s: Dev((n,), "uint8"))
        monkeypatch.setattr(cr, "scratch_buffer", self.scratch)
        monkeypatch.setattr(cr, "stream_pointer", lambda s: 0x5EA)
        monkeypatch.setattr(rnn_dropout, "device_id", lambda: 0)
        monkeypatch.setattr(rnn_dropout, "stream_pointer", lambda s: 0x5EA)
        monkeypatch.setattr(rnn_dropout, "device_array", lambda shape, dt, s: Dev(shape, dt))
        monkeypatch.setattr(rnn_dropout, "copy_async", lambda *a: self.copies.append(a))
        self.algo_of = {}           # RNN descriptor pointer -> the algo it was last set with
        cr.clear_plans()
        rnn_dropout.clear()

    def device_lengths(self, lengths, stream):
        self.lengths.append(tuple(lengths))
        return Dev((len(lengths),), "int32")

    def scratch(self, nbytes, sp):
        fake = self

        class S:
            def __enter__(self):
                fake.scratches.append((nbytes, sp))
                # the workspace at 0xBEEF, any other buffer (the reserve's copy) at 0xF00D
                return None if not nbytes else 0xBEEF if nbytes == fake.work else 0xF00D

            def __exit__(self, *e):
                pass
        return S()

    def function(self, name):
        def fn(*args):
            # descriptors recorded by their pointer: the record must not keep them alive
            self.calls.append((name, tuple(ctypes.c_void_p(a.ptr.value)
                                           if isinstance(a, Descriptor) else a
                                           for a in args)))
            if name in self.fail:
                return 2000
            if name == "cudnnSetRNNDescriptor_v8":
                self.algo_of[args[0].ptr.value] = args[1]
            if name == "cudnnGetRNNTempSpaceSizes" and \
                    self.algo_of.get(args[1].ptr.value) in self.refuse_algos:
                return 3000                 # CUDNN_STATUS_NOT_SUPPORTED
            self._answer(name, args)
            return 0
        return fn

    def _answer(self, name, args):
        if name.startswith("cudnnCreate"):
            self.next += 1
            args[0]._obj.value = self.next
        elif name == "cudnnGetRNNWeightSpaceSize":
            args[2]._obj.value = self.weight_bytes
        elif name == "cudnnDropoutGetStatesSize":
            args[1]._obj.value = 777
        elif name == "cudnnGetRNNTempSpaceSizes":
            args[4]._obj.value = self.work
            args[5]._obj.value = self.reserve
        elif name == "cudnnGetRNNWeightParams":
            m, mdims, b, bdims = self.params[(args[2], args[5])]
            base = args[4] if isinstance(args[4], int) else args[4].value
            args[7]._obj.value = base + m if m is not None else None
            args[9]._obj.value = base + b if b is not None else None
            self.dims[args[6].ptr.value], self.dims[args[8].ptr.value] = mdims, bdims
        elif name == "cudnnGetTensorNdDescriptor":
            dims = self.dims[args[0].value]
            args[3]._obj.value = len(dims)
            for i, d in enumerate(dims):
                args[4][i] = d

    def named(self, name):
        return [a for n, a in self.calls if n == name]

    def count(self, prefix):
        return sum(1 for n, _ in self.calls if n.startswith(prefix))


def val(a):
    """The integer value of a ctypes argument (pointer, scalar, descriptor) or plain int."""
    if isinstance(a, Descriptor):
        return a.ptr.value
    return getattr(a, "value", a)


def run_forward(cfg, T=5, N=3, lengths=None, training=True, hx=True, cx=True, **kw):
    x = Dev((T, N, cfg.input_size), cfg.dtype)
    w = Dev((W_BYTES // np.dtype(cfg.dtype).itemsize,), cfg.dtype)
    st = (cfg.num_layers * cfg.directions, N, cfg.hidden_size)
    sp = st[:2] + (cfg.out_size,)
    y = Dev((T, N, cfg.directions * cfg.out_size), cfg.dtype)
    arrs = dict(x=x, w=w, y=y, hx=Dev(sp) if hx else None, cx=Dev(st) if cx else None,
                hy=Dev(sp), cy=Dev(st) if cfg.mode == "lstm" else None)
    saved = cr.forward(cfg, w, x, arrs["hx"], arrs["cx"], y, arrs["hy"], arrs["cy"], lengths,
                       training, stream=None, **kw)
    return saved, arrs


W_BYTES = 4096


@pytest.fixture
def fake(monkeypatch):
    cr.clear_plans()
    gc.collect()        # earlier tests' descriptors go before cuDNN is stubbed
    f = FakeCudnn(monkeypatch, W_BYTES)
    yield f
    cr.clear_plans()
    rnn_dropout.clear()
    gc.collect()        # and this test's while it still is


def test_descriptors_are_set_as_documented(fake):
    run_forward(LSTM, T=5, N=3, lengths=np.array([5, 2, 4], np.int32))
    (drop,) = fake.named("cudnnSetDropoutDescriptor")
    assert [val(a) for a in drop[2:]] == [0.0, None, 0, 0]      # dropout 0, no states
    (rd,) = fake.named("cudnnSetRNNDescriptor_v8")
    assert [val(a) for a in rd[1:13]] == [0, 2, 2, 1, 0, enums.DATA_FLOAT, enums.DATA_FLOAT,
                                          enums.MATH_FMA, 3, 4, 4, 2]
    assert val(rd[13]) == val(drop[0]) and val(rd[14]) == 1     # the dropout desc, padded IO
    xd, yd = fake.named("cudnnSetRNNDataDescriptor")
    for d, vec in ((xd, 3), (yd, 8)):
        assert [val(a) for a in d[1:6]] == [enums.DATA_FLOAT, 0, 5, 3, vec]
        assert list(d[6]) == [5, 2, 4]
        assert ctypes.cast(d[7], ctypes.POINTER(ctypes.c_double)).contents.value == 0.0
    assert fake.lengths == [(5, 2, 4)]      # copied to the device for devSeqLengths
    (hd,) = fake.named("cudnnSetTensorNdDescriptor")
    assert val(hd[2]) == 3 and list(hd[3]) == [4, 3, 4] and list(hd[4]) == [12, 4, 1]


def test_forward_training_arguments(fake):
    saved, a = run_forward(LSTM, lengths=None, training=True, cx=False)
    (tmp,) = fake.named("cudnnGetRNNTempSpaceSizes")
    assert val(tmp[2]) == cr.FWD_TRAINING
    (f,) = fake.named("cudnnRNNForward")
    d = saved.data
    assert val(f[0]) == 0xCAFE and val(f[1]) == val(saved.net.rnn)
    assert val(f[2]) == cr.FWD_TRAINING and val(f[3]) == saved.dev_lengths.addr
    assert [val(f[i]) for i in (4, 6, 8, 11)] == [val(d.x), val(d.y), val(d.h), val(d.h)]
    assert [val(f[i]) for i in (5, 7, 9, 10, 12, 13)] == [
        a["x"].addr, a["y"].addr, a["hx"].addr, a["hy"].addr, None, a["cy"].addr]
    assert [val(f[i]) for i in range(14, 20)] == [W_BYTES, a["w"].addr, 1000, 0xBEEF, 5000,
                                                  saved.reserve.addr]
    assert d.lengths == (5,) * 3 and not d.padded
    assert fake.scratches == [(1000, 0x5EA)]


def test_forward_inference_has_no_reserve_and_null_states(fake):
    saved, a = run_forward(GRU, training=False, hx=False, cx=False)
    assert saved is None
    (f,) = fake.named("cudnnRNNForward")
    assert val(f[2]) == cr.FWD_INFERENCE
    assert [val(f[i]) for i in (9, 12, 13)] == [None, None, None]   # hx, cx, cy
    assert [val(f[i]) for i in (18, 19)] == [0, None]
    (rd,) = fake.named("cudnnSetRNNDescriptor_v8")
    assert [val(x) for x in rd[2:6]] == [3, 2, 0, 0]   # GRU, double bias, uni, linear


def test_backward_arguments(fake):
    lengths = np.array([5, 1, 3], np.int32)
    saved, a = run_forward(LSTM, lengths=lengths)
    dy, dx, dw = Dev(a["y"].shape), Dev(a["x"].shape), Dev(a["w"].shape)
    dhy, dhx, dcx = (Dev(a["hy"].shape) for _ in range(3))
    cr.backward(LSTM, a["w"], a["x"], a["y"], dy, dhy, None, a["hx"], a["cx"], dx, dhx, dcx,
                dw, saved, stream=None)
    assert [z[0] for z in fake.zeroed] == [dw, dx]   # dw fresh; dx padding past the ends
    (bd,) = fake.named("cudnnRNNBackwardData_v8")
    (bw,) = fake.named("cudnnRNNBackwardWeights_v8")
    d = saved.data
    assert [val(v) for v in bd[:4]] == [0xCAFE, val(saved.net.rnn), saved.dev_lengths.addr,
                                        val(d.y)]
    assert [val(v) for v in bd[4:16]] == [
        a["y"].addr, dy.addr, val(d.x), dx.addr, val(d.h), a["hx"].addr, dhy.addr, dhx.addr,
        val(d.h), a["cx"].addr, None, dcx.addr]
    # both run on a copy of the reserve space (cuDNN writes into it; the state stays reusable)
    assert fake.copies == [(0xF00D, saved.reserve, 5000, 0x5EA)]
    assert fake.scratches[-2:] == [(1000, 0x5EA), (5000, 0x5EA)]
    assert [val(v) for v in bd[16:]] == [W_BYTES, a["w"].addr, 1000, 0xBEEF, 5000, 0xF00D]
    assert [val(v) for v in bw] == [
        0xCAFE, val(saved.net.rnn), cr.WGRAD_MODE_ADD, saved.dev_lengths.addr, val(d.x),
        a["x"].addr, val(d.h), a["hx"].addr, val(d.y), a["y"].addr, W_BYTES, dw.addr, 1000,
        0xBEEF, 5000, 0xF00D]
    assert fake.count("cudnnGetRNNTempSpaceSizes") == 1    # remembered by the data plan


def test_full_length_backward_zeroes_only_dw(fake):
    saved, a = run_forward(GRU, lengths=np.array([5, 5, 5], np.int32))
    dw = Dev(a["w"].shape)
    cr.backward(GRU, a["w"], a["x"], a["y"], Dev(a["y"].shape), None, None, None, None,
                Dev(a["x"].shape), Dev(a["hy"].shape), None, dw, saved, stream=None)
    assert [z[0] for z in fake.zeroed] == [dw]
    (bd,) = fake.named("cudnnRNNBackwardData_v8")
    assert [val(bd[i]) for i in (9, 10, 13, 14, 15)] == [None] * 5   # hx, dhy, cx, dcy, dcx


def test_device_lengths_are_int32_on_the_device():
    from dnnkit import arrays
    a = cr.device_lengths((3, 1, 2), arrays.as_stream(None))
    assert a.dtype == np.int32 and a.copy_to_host().tolist() == [3, 1, 2]


def test_descriptors_are_cached_per_configuration_and_batch(fake):
    run_forward(LSTM)
    run_forward(LSTM)
    assert fake.count("cudnnCreateRNNDescriptor") == 1
    assert fake.count("cudnnCreateRNNDataDescriptor") == 2
    run_forward(LSTM, lengths=np.array([5, 2, 4], np.int32))    # new lengths: new data plan
    run_forward(LSTM, N=4)
    assert fake.count("cudnnCreateRNNDescriptor") == 1
    assert fake.count("cudnnCreateRNNDataDescriptor") == 6
    run_forward(GRU)
    assert fake.count("cudnnCreateRNNDescriptor") == 2


def test_every_descriptor_is_destroyed(fake):
    saved, _ = run_forward(LSTM)
    run_forward(GRU, training=False)
    cr.clear_plans()
    created = sorted(a[0]._obj.value for n, a in fake.calls if n.startswith("cudnnCreate"))
    assert len(created) == 10       # 2 x (RNN, dropout, 2 RNN data, 1 tensor descriptor)
    del saved
    gc.collect()
    assert sorted(val(a[0]) for n, a in fake.calls if n.startswith("cudnnDestroy")) == created


def test_failed_set_destroys_the_descriptor(fake):
    fake.fail.add("cudnnSetRNNDataDescriptor")
    with pytest.raises(CudnnError, match="cudnnSetRNNDataDescriptor failed.*T 5, N 3"):
        run_forward(LSTM)
    (created,) = fake.named("cudnnCreateRNNDataDescriptor")
    destroyed = [val(a[0]) for a in fake.named("cudnnDestroyRNNDataDescriptor")]
    assert destroyed == [created[0]._obj.value]


def test_weight_space_size_mismatch_raises(fake):
    fake.weight_bytes = W_BYTES + 4
    with pytest.raises(DnnkitError, match="weight space is 4100 bytes but w has 4096"):
        run_forward(LSTM)
    assert fake.named("cudnnRNNForward") == []


def test_weight_params_offsets_and_shapes(fake):
    cfg = RNNConfig("rnn_tanh", 4, 4, 1, input_mode="skip")
    fake.params = {(0, 0): (None, (), 128, (1, 4, 1)),
                   (0, 1): (64, (1, 4, 4), 144, (1, 4, 1))}
    w = Dev((W_BYTES // 4,))
    got = rw.weight_params(cfg, w)
    assert got == [rw.WeightParam(0, 0, None, None, 32, (4,)),
                   rw.WeightParam(0, 1, 16, (4, 4), 36, (4,))]
    fake.params[(0, 1)] = (66, (1, 4, 4), 144, (1, 4, 1))
    with pytest.raises(DnnkitError, match="byte 66, not a multiple of 4"):
        rw.weight_params(cfg, w)


# --- the op-level implementation with the cuDNN layer stubbed -------------------------------

def test_forward_impl_outputs_and_state(monkeypatch):
    seen = {}

    def forward(cfg, w, x, hx, cx, y, hy, cy, lengths, training, stream, **kw):
        seen.update(cx=cx, cy=cy, training=training, **kw)
        return SAVED if training else None
    monkeypatch.setattr(cr, "forward", forward)
    x = np.zeros((5, 3, 3), np.float32)
    y, hy, cy, state = rnn_cudnn._forward_cudnn(LSTM, None, x, None, "cx", None, True, 4, 2,
                                                "standard", 0)
    assert (y.shape, hy.shape, cy.shape) == ((5, 3, 8), (4, 3, 4), (4, 3, 4))
    assert state.backend == "cudnn" and state.saved is SAVED and state.lengths is None
    assert state.x_shape == (5, 3, 3) and state.cfg == LSTM
    assert not hasattr(state, "shape")    # or the cross-check would compare it as an output
    assert seen == dict(cx="cx", cy=cy, training=True, algo="standard", seed=4, offset=2)
    x = np.zeros((5, 3, 5), np.float32)
    y, hy, cy, state = rnn_cudnn._forward_cudnn(GRU, None, x, None, "cx", [5, 1, 2], False,
                                                None, 0, "standard", 0)
    assert (y.shape, hy.shape, cy, state) == ((5, 3, 6), (1, 3, 6), None, None)
    assert seen["cx"] is None    # cx means nothing outside LSTM


def test_backward_impl_checks_the_state(monkeypatch):
    monkeypatch.setattr(cr, "backward", lambda *a: None)
    x, w = np.zeros((5, 3, 3), np.float32), np.zeros(100, np.float32)
    st = rnn_cudnn.CudnnRNNState(LSTM, (5, 3, 3), None, SAVED)
    dx, dhx, dcx, dw = rnn_cudnn._backward_cudnn(LSTM, w, x, None, None, None, None, None,
                                                 None, None, st, 0)
    assert (dx.shape, dhx.shape, dcx.shape, dw.shape) == ((5, 3, 3), (4, 3, 4), (4, 3, 4),
                                                          (100,))
    with pytest.raises(ValueError, match="lengths differ"):
        rnn_cudnn._backward_cudnn(LSTM, w, x, None, None, None, None, None, None,
                                  np.array([5, 5, 4], np.int32), st, 0)
    rnn_cudnn._backward_cudnn(LSTM, w, x, None, None, None, None, None, None,
                              np.array([5, 5, 5], np.int32), st, 0)   # the same batch
    with pytest.raises(ValueError, match=r"x of shape \(5, 3, 3\); this backward .* \(6, 3, 3\)"):
        rnn_cudnn._backward_cudnn(LSTM, w, np.zeros((6, 3, 3), np.float32), None, None, None,
                                  None, None, None, None, st, 0)
    with pytest.raises(TypeError, match="state of a cuDNN training forward"):
        rnn_cudnn._backward_cudnn(LSTM, w, x, None, None, None, None, None, None, None,
                                  None, 0)
