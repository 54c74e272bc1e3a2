"""The cuDNN RNN on a real GPU: the flat parameter layout proven against
cudnnGetRNNWeightParams; cuDNN vs Numba vs the float64 reference at realistic sizes, forward
and backward, with unsorted variable lengths; the training state's reserve space reused by
the backward."""

import dataclasses

import numpy as np
import pytest

from dnnkit import reference, trace
from dnnkit.cudnn import api
from dnnkit.cudnn import rnn as cr, rnn_weights as rw
from dnnkit.errors import CudnnUnavailableError
from dnnkit.ops.rnn import rnn_backward, rnn_forward
from dnnkit.rnn_layout import MODES, RNNConfig, param_layout, param_size

pytestmark = [pytest.mark.gpu, pytest.mark.cudnn]


def _device_zeros(n, dtype):
    from numba import cuda
    return cuda.to_device(np.zeros(n, dtype))


# --- (1) the layout -----------------------------------------------------------------------

LAYOUTS = ([RNNConfig(m, 5, 6, 2, bidirectional=True) for m in MODES]
           + [RNNConfig(m, 6, 6, 2, bidirectional=True, input_mode="skip") for m in MODES]
           + [RNNConfig(m, 7, 3, 3, dtype="float64") for m in MODES]
           + [RNNConfig("lstm", 16, 8, 2, bidirectional=True, input_mode="skip",
                        dtype="float64"),
              RNNConfig("gru", 24, 16, 2, dtype="float16"),
              RNNConfig("lstm", 5, 6, 2, bidirectional=True, proj_size=3),
              RNNConfig("lstm", 6, 6, 2, input_mode="skip", proj_size=4, dtype="float64")])


def _by_cudnn(cfg):
    """{(layer, direction, lin_id, kind): (offset, shape)} from cudnnGetRNNWeightParams."""
    w = _device_zeros(param_size(cfg), cfg.dtype)
    out = {}
    for p in rw.weight_params(cfg, w):
        layer, d = divmod(p.pseudo_layer, cfg.directions)
        if p.matrix_offset is not None:
            out[(layer, d, p.lin_id, "matrix")] = (p.matrix_offset, tuple(p.matrix_shape))
        if p.bias_offset is not None:
            out[(layer, d, p.lin_id, "bias")] = (p.bias_offset, tuple(p.bias_shape))
    return out


@pytest.mark.parametrize("cfg", LAYOUTS, ids=lambda c: f"{c.mode}-{c.input_mode}-{c.dtype}-"
                         f"L{c.num_layers}{'bi' if c.bidirectional else ''}")
def test_param_layout_is_cudnns_weight_space(cfg):
    item = np.dtype(cfg.dtype).itemsize
    assert rw.weight_space_bytes(cfg) == param_size(cfg) * item
    ours = {(ly, d, lin, kind): (off, tuple(shape))
            for ly, d, lin, kind, off, shape in param_layout(cfg)}
    assert _by_cudnn(cfg) == ours


# --- (2) cuDNN vs Numba vs float64 --------------------------------------------------------

def _err(got, ref, floor=0.0):
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    return float(np.abs(got - ref).max() / max(np.abs(ref).max(), floor, 1e-300))


def _problem(rng, cfg, T, N, varlen):
    H, dt = cfg.hidden_size, cfg.dtype
    k = 1 / np.sqrt(H)
    w = rng.uniform(-k, k, param_size(cfg)).astype(dt)
    x = rng.standard_normal((T, N, cfg.input_size)).astype(dt)
    st = (cfg.num_layers * cfg.directions, N, H)
    sp = st[:2] + (cfg.out_size,)
    hx = (0.5 * rng.standard_normal(sp)).astype(dt)
    cx = (0.5 * rng.standard_normal(st)).astype(dt) if cfg.mode == "lstm" else None
    lengths = None
    if varlen:   # unsorted, with a full-length and a length-1 sequence
        lengths = rng.integers(1, T + 1, N).astype(np.int32)
        lengths[rng.permutation(N)[:2]] = (T, 1)
    dy = rng.standard_normal((T, N, cfg.directions * cfg.out_size)).astype(dt)
    dhy = rng.standard_normal(sp).astype(dt)
    dcy = rng.standard_normal(st).astype(dt) if cfg.mode == "lstm" else None
    return w, x, hx, cx, lengths, dy, dhy, dcy


def _run(backend, cfg, w, x, hx, cx, lengths, dy, dhy, dcy):
    y, hy, cy, st = rnn_forward(cfg, w, x, hx, cx, lengths=lengths, training=True,
                                backend=backend)
    assert st.backend == backend
    grads = rnn_backward(cfg, w, x, y, dy, dhy, dcy, hx, cx, state=st, lengths=lengths,
                         backend=backend)
    host = [None if a is None else a.copy_to_host() for a in (y, hy, cy, *grads)]
    return host


# norm-wise error bounds vs float64 (max|got - ref| / max|ref|): forward, gradients
TOL = {"float16": (1e-2, 3e-2), "float32": (2e-5, 1e-4), "float64": (1e-11, 1e-10)}

REALISTIC = [(RNNConfig("lstm", 256, 512), 50, 64), (RNNConfig("gru", 512, 1024), 20, 32),
             (RNNConfig("lstm", 256, 512, proj_size=128), 50, 64)]
SMALL = [(RNNConfig(m, 24, 32, 2, bidirectional=True, input_mode=im), 12, 16)
         for m in MODES for im in ("linear",)] + \
        [(RNNConfig(m, 32, 32, 2, bidirectional=True, input_mode="skip"), 9, 8) for m in MODES] + \
        [(RNNConfig("lstm", 24, 32, 2, bidirectional=True, proj_size=16), 12, 16)]


def _check(rng, cfg, T, N, varlen):
    w, x, hx, cx, lengths, dy, dhy, dcy = _problem(rng, cfg, T, N, varlen)
    f64 = [None if a is None else a.astype(np.float64) for a in (w, x, hx, cx, dy, dhy, dcy)]
    ry, rhy, rcy = reference.rnn_forward(cfg, f64[0], f64[1], f64[2], f64[3], lengths)
    rdx, rdhx, rdcx, rdw = reference.rnn_backward(cfg, f64[0], f64[1], f64[4], f64[5], f64[6],
                                                  f64[2], f64[3], lengths)
    refs = [ry, rhy, rcy, rdx, rdhx, rdcx, rdw]
    names = ["y", "hy", "cy", "dx", "dhx", "dcx", "dw"]
    tf, tb = TOL[cfg.dtype]
    results = {b: _run(b, cfg, w, x, hx, cx, lengths, dy, dhy, dcy) for b in ("cudnn", "numba")}
    for b, outs in results.items():
        for i, (name, got, ref) in enumerate(zip(names, outs, refs)):
            if ref is None:
                assert got is None, (b, name)
                continue
            tol = tf if i < 3 else tb
            assert _err(got, ref) <= tol, f"{b} {name}: {_err(got, ref):.3g} > {tol}"
    for name, a, b in zip(names, results["cudnn"], results["numba"]):
        if a is not None:
            tol = 2 * (TOL[cfg.dtype][0] if name in ("y", "hy", "cy") else TOL[cfg.dtype][1])
            assert _err(a, b) <= tol, f"cudnn vs numba {name}: {_err(a, b):.3g}"
    if lengths is not None:   # outputs past each sequence's end are exactly zero
        y = results["cudnn"][0]
        for n, ln in enumerate(lengths):
            assert not y[ln:, n].any()


@pytest.mark.parametrize("varlen", [False, True], ids=["full", "varlen"])
@pytest.mark.parametrize("case", REALISTIC, ids=["lstm512", "gru1024", "lstm512-proj128"])
def test_realistic_shapes_float32(rng, case, varlen):
    cfg, T, N = case
    _check(rng, cfg, T, N, varlen)


@pytest.mark.parametrize("case", SMALL, ids=[f"{c.mode}-{c.input_mode}-p{c.proj_size}"
                                              for c, _, _ in SMALL])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_two_layers_bidirectional_varlen(rng, case, dtype):
    cfg, T, N = case
    cfg = dataclasses.replace(cfg, dtype=dtype)
    _check(rng, cfg, T, N, varlen=True)


def test_float16_lstm(rng):
    _check(rng, RNNConfig("lstm", 64, 128, 2, dtype="float16"), 20, 32, varlen=True)


# --- (3) the reserve space ----------------------------------------------------------------

def _spy(monkeypatch):
    calls = []
    real = api.call

    def call(name, *args, context=""):
        calls.append((name, args))
        return real(name, *args, context=context)
    monkeypatch.setattr(api, "call", call)
    return calls


def _value(arg):
    """A ctypes argument's value: device pointers are passed as plain ints (api.ptr),
    sizes as c_size_t."""
    return arg if isinstance(arg, int) or arg is None else arg.value


def test_backward_reuses_the_forward_reserve_space(rng, monkeypatch):
    cfg = RNNConfig("lstm", 32, 64, 2, bidirectional=True)
    w, x, hx, cx, lengths, dy, dhy, dcy = _problem(rng, cfg, 10, 8, varlen=True)
    calls = _spy(monkeypatch)
    y, hy, cy, st = rnn_forward(cfg, w, x, hx, cx, lengths=lengths, training=True,
                                backend="cudnn")
    reserve = st.saved.reserve.device_ctypes_pointer.value
    (fwd,) = [a for n, a in calls if n == "cudnnRNNForward"]
    assert fwd[2] == cr.FWD_TRAINING and _value(fwd[19]) == reserve
    assert _value(fwd[18]) == st.saved.reserve_bytes > 0
    with trace() as t:
        g1 = rnn_backward(cfg, w, x, y, dy, dhy, dcy, hx, cx, state=st, lengths=lengths)
    assert t.backends("rnn_backward") == ["cudnn"]     # auto follows the state's backend
    bwd = [a for n, a in calls if n in ("cudnnRNNBackwardData_v8",
                                        "cudnnRNNBackwardWeights_v8")]
    # both calls read one copy of the reserve (cuDNN writes into it), of the reserve's size
    assert _value(bwd[0][-1]) == _value(bwd[1][-1]) not in (None, reserve)
    assert [_value(a[-2]) for a in bwd] == [st.saved.reserve_bytes] * 2
    # a second backward from the same state gives the same gradients, dw not accumulated
    g2 = rnn_backward(cfg, w, x, y, dy, dhy, dcy, hx, cx, state=st, lengths=lengths,
                      backend="cudnn")
    for a, b in zip(g1, g2):
        np.testing.assert_array_equal(a.copy_to_host(), b.copy_to_host())


def test_a_numba_state_runs_the_numba_backward(rng):
    cfg = RNNConfig("gru", 16, 32)
    w, x, hx, cx, lengths, dy, dhy, dcy = _problem(rng, cfg, 6, 4, varlen=False)
    y, hy, cy, st = rnn_forward(cfg, w, x, hx, training=True, backend="numba")
    with trace() as t:
        rnn_backward(cfg, w, x, y, dy, dhy, None, hx, state=st)
    assert t.backends("rnn_backward") == ["numba"]
    with pytest.raises(CudnnUnavailableError, match="made by the numba backend"):
        rnn_backward(cfg, w, x, y, dy, dhy, None, hx, state=st, backend="cudnn")
