"""The RNN family (rnn_relu, rnn_tanh, lstm, gru): both backends against a float64 NumPy
reference written from the equations (dnnkit.reference.rnn_*), the reference's gradients
against finite differences, the parameter layout, and the argument checks.

The simulator runs a Python thread per CUDA thread and the GEMM launches dominate (~0.1 s
each there), so the configuration space (mode x layers x bidirectional x input_mode x
batch_first x lengths x dtype) is covered by an orthogonal array instead of the full product:
every mode meets both values of every binary factor and every dtype (test_runs_cover_...).
"""

import numpy as np
import pytest

import dnnkit
from dnnkit import reference
from dnnkit.errors import CudnnUnavailableError
from dnnkit.ops import rnn as rnn_ops
from dnnkit.ops import rnn_numba
from dnnkit.rnn_layout import GATES, MODES, RNNConfig, param_layout, param_size
from tests.conftest import DTYPES, backend_params

# L8 orthogonal array, 5 two-level columns: layers-1, bidirectional, skip, batch_first, lengths
_L8 = ["00000", "00011", "01100", "01111", "10101", "10110", "11001", "11010"]
RUNS = []
for _r in range(24):
    _bits = [int(c) for c in _L8[_r % 8]]
    RUNS.append(dict(mode=MODES[_r // 6], dtype=DTYPES[(_r // 2) % 3], layers=1 + _bits[0],
                     bidirectional=bool(_bits[1]), skip=bool(_bits[2]),
                     batch_first=bool(_bits[3]), varlen=bool(_bits[4]),
                     states=_r % 2 == 0, grads=_r % 3 != 0, inference=_r % 2 == 1))
# max|got - ref| / max|ref| per output, vs float64
TOL = {"float16": 2e-3, "float32": 2e-6, "float64": 1e-12}


def _id(run):
    return (f"{run['mode']}-{run['dtype']}-L{run['layers']}{'-bi' if run['bidirectional'] else ''}"
            f"{'-skip' if run['skip'] else ''}{'-bf' if run['batch_first'] else ''}"
            f"{'-len' if run['varlen'] else ''}")


def test_runs_cover_every_factor_for_every_mode():
    for mode in MODES:
        mine = [r for r in RUNS if r["mode"] == mode]
        for key in ("layers", "bidirectional", "skip", "batch_first", "varlen", "dtype"):
            want = 3 if key == "dtype" else 2
            assert len({r[key] for r in mine}) == want, (mode, key)


def _err(got, ref):
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    return np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30)


def _host(a):
    return None if a is None else a.copy_to_host()


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("run", RUNS, ids=_id)
def test_forward_backward_match_float64(rng, run, backend):
    mode, dt = run["mode"], run["dtype"]
    # cuDNN may keep gates in the data type and sum in another order: 5x the Numba bound
    tol = TOL[dt] * (5 if backend == "cudnn" else 1)
    h, t, n = 3, 3, 3
    i = h if run["skip"] else 4
    d = 2 if run["bidirectional"] else 1
    rnn = dnnkit.RNN(mode, i, h, run["layers"], bidirectional=run["bidirectional"],
                     input_mode="skip" if run["skip"] else "linear",
                     batch_first=run["batch_first"], dtype=dt)
    w = rnn.init_params(seed=3)
    lengths = np.array([2, 3, 1]) if run["varlen"] else None
    lstm = mode == "lstm"
    sshape = (run["layers"] * d, n, h)
    x = rng.standard_normal((t, n, i)).astype(dt)
    hx = rng.standard_normal(sshape).astype(dt) if run["states"] else None
    cx = rng.standard_normal(sshape).astype(dt) if run["states"] and lstm else None
    dy = rng.standard_normal((t, n, d * h)).astype(dt)
    dhy = rng.standard_normal(sshape).astype(dt) if run["grads"] else None
    dcy = rng.standard_normal(sshape).astype(dt) if run["grads"] and lstm else None
    bf = (lambda a: np.ascontiguousarray(a.swapaxes(0, 1))) if run["batch_first"] else \
        (lambda a: a)
    try:
        dnnkit.select_backend("rnn_forward", rnn.cfg, w, x, hx, cx, lengths=lengths,
                              backend=backend)
    except CudnnUnavailableError as e:
        pytest.skip(f"cuDNN cannot run this configuration: {e.reason}")
    with dnnkit.trace() as tr:
        out = rnn.forward(w, bf(x), hx, cx, training=True, lengths=lengths, backend=backend)
    assert tr.backends("rnn_forward") == [backend]
    assert out.state is not None and out.state.backend == backend
    wh = w.copy_to_host().astype(np.float64)
    f64 = [None if a is None else a.astype(np.float64) for a in (x, hx, cx, dy, dhy, dcy)]
    ry, rhy, rcy = reference.rnn_forward(rnn.cfg, wh, f64[0], f64[1], f64[2], lengths)
    y = out.y.copy_to_host()
    assert y.shape == bf(ry).shape and y.dtype == np.dtype(dt)
    assert _err(y, bf(ry)) <= tol
    assert _err(out.hy.copy_to_host(), rhy) <= tol
    assert (out.cy is None) == (not lstm)
    if lstm:
        assert _err(out.cy.copy_to_host(), rcy) <= tol
    if lengths is not None:   # past each sequence's end y is exactly zero
        for k, ln in enumerate(lengths):
            assert not bf(y)[ln:, k].any()
    if run["inference"]:      # the inference path (state updated in place) gives the same
        inf = rnn.forward(w, bf(x), hx, cx, lengths=lengths, backend=backend)
        assert inf.state is None
        assert np.array_equal(inf.y.copy_to_host(), y)
        assert np.array_equal(inf.hy.copy_to_host(), out.hy.copy_to_host())

    dx, dhx, dcx, dw = rnn.backward(w, bf(x), out.y, bf(dy), dhy, dcy, hx, cx, state=out.state,
                                    lengths=lengths)
    rdx, rdhx, rdcx, rdw = reference.rnn_backward(rnn.cfg, wh, *f64[:1], f64[3], f64[4], f64[5],
                                                  f64[1], f64[2], lengths)
    assert dw.shape == (rnn.param_size,) and dw.dtype == np.dtype(dt)
    assert _err(dx.copy_to_host(), bf(rdx)) <= 2 * tol
    assert _err(dhx.copy_to_host(), rdhx) <= 2 * tol
    assert _err(dw.copy_to_host(), rdw) <= 2 * tol
    assert (dcx is None) == (not lstm)
    if lstm:
        assert _err(dcx.copy_to_host(), rdcx) <= 2 * tol


@pytest.mark.parametrize("mode", MODES)
def test_split_k_per_step_gemms(rng, monkeypatch, mode):
    """The per-step GEMMs cut their depth into P partial sums on the GPU (rnn_numba.split_k;
    P = 1 on the simulator): force P = 2 and check against the reference."""
    monkeypatch.setattr(rnn_numba, "SPLIT_K", 2)
    assert rnn_numba.split_k(3, 16, 4, 2) == 2
    rnn = dnnkit.RNN(mode, 2, 4, bidirectional=True, dtype="float64")
    w = rnn.init_params(seed=2)
    lengths = [1, 3]
    x, dy = rng.standard_normal((3, 2, 2)), rng.standard_normal((3, 2, 8))
    hx, dhy = rng.standard_normal((2, 2, 4)), rng.standard_normal((2, 2, 4))
    out = rnn.forward(w, x, hx, training=True, lengths=lengths, backend="numba")
    wh = w.copy_to_host()
    ry, rhy, _ = reference.rnn_forward(rnn.cfg, wh, x, hx, None, lengths)
    assert _err(out.y.copy_to_host(), ry) <= 1e-12
    assert _err(out.hy.copy_to_host(), rhy) <= 1e-12
    dx, dhx, _, dw = rnn.backward(w, x, out.y, dy, dhy, None, hx, state=out.state,
                                  lengths=lengths)
    rdx, rdhx, _, rdw = reference.rnn_backward(rnn.cfg, wh, x, dy, dhy, None, hx, None, lengths)
    for got, ref in ((dx, rdx), (dhx, rdhx), (dw, rdw)):
        assert _err(got.copy_to_host(), ref) <= 1e-12


# ---------------------------------------------------------------- the reference's gradients

@pytest.mark.parametrize("varlen", [False, True])
@pytest.mark.parametrize("mode", MODES)
def test_reference_gradients_are_finite_differences(rng, mode, varlen):
    """T=3, N=2, I=3, H=4, 2 layers, bidirectional; L = sum(y*gy) + sum(hy*ghy) (+ cy)."""
    cfg = RNNConfig(mode, 3, 4, 2, True, "linear", "float64")
    t, n = 3, 2
    lengths = np.array([2, 3]) if varlen else None
    w = rng.uniform(-0.6, 0.6, param_size(cfg))
    x = rng.standard_normal((t, n, 3))
    sshape = (4, n, 4)
    hx, ghy = rng.standard_normal(sshape), rng.standard_normal(sshape)
    cx, gcy = (rng.standard_normal(sshape), rng.standard_normal(sshape)) if mode == "lstm" \
        else (None, None)
    gy = rng.standard_normal((t, n, 8))

    def loss(w_, x_, hx_, cx_):
        y, hy, cy = reference.rnn_forward(cfg, w_, x_, hx_, cx_, lengths)
        return (y * gy).sum() + (hy * ghy).sum() + (0.0 if cy is None else (cy * gcy).sum())

    dx, dhx, dcx, dw = reference.rnn_backward(cfg, w, x, gy, ghy, gcy, hx, cx, lengths)
    args = [w, x, hx, cx]
    grads = [dw, dx, dhx, dcx]
    # every element of x, hx, cx; w (hundreds of elements) along random directions
    for k in (1, 2, 3):
        if args[k] is None:
            continue
        fd = np.zeros(args[k].size)
        for j in range(args[k].size):
            plus, minus = list(args), list(args)
            plus[k], minus[k] = args[k].copy(), args[k].copy()
            plus[k].flat[j] += 1e-6
            minus[k].flat[j] -= 1e-6
            fd[j] = (loss(*plus) - loss(*minus)) / 2e-6
        assert np.allclose(grads[k].ravel(), fd, rtol=1e-6, atol=1e-7), k
    for _ in range(12):
        v = rng.standard_normal(w.size)
        fd = (loss(w + 1e-6 * v, x, hx, cx) - loss(w - 1e-6 * v, x, hx, cx)) / 2e-6
        assert abs(fd - dw @ v) <= 1e-7 * np.abs(dw).sum() * np.abs(v).max() + 1e-8
    if mode == "rnn_relu":      # relu's kink: keep the check meaningful (some units active)
        assert np.abs(dw).max() > 0


# ---------------------------------------------------------------- layout

def _closed_form(mode, i, h, layers, bidir, skip):
    g, d = GATES[mode], 2 if bidir else 1
    total = 0
    for layer in range(layers):
        i_l = i if layer == 0 else h * d
        w_in = 0 if (skip and layer == 0) else g * h * i_l
        total += d * (w_in + g * h * h + 2 * g * h)
    return total


@pytest.mark.parametrize("skip", [False, True])
@pytest.mark.parametrize("bidir", [False, True])
@pytest.mark.parametrize("mode", MODES)
def test_param_size_and_layout_closed_form(mode, bidir, skip):
    h = 5
    i = h if skip else 3
    cfg = rnn_ops.make_config(mode, i, h, 3, bidirectional=bidir,
                              input_mode="skip" if skip else "linear")
    g, d = GATES[mode], 2 if bidir else 1
    assert param_size(cfg) == _closed_form(mode, i, h, 3, bidir, skip)
    if not skip:   # PyTorch's nn.LSTM/nn.GRU/nn.RNN count: G*H*(I_l + H + 2) per layer-dir
        assert param_size(cfg) == sum(d * g * h * ((i if l_ == 0 else h * d) + h + 2)
                                      for l_ in range(3))
    layout = param_layout(cfg)
    off = 0
    # cuDNN's weight space (GPU-proven): every matrix (layer, direction, lin), then every bias
    expect_order = []
    for layer in range(3):
        for di in range(d):
            mats = [q for q in range(2 * g) if not (skip and layer == 0 and q < g)]
            expect_order += [(layer, di, q, "matrix") for q in mats]
    for layer in range(3):
        for di in range(d):
            expect_order += [(layer, di, q, "bias") for q in range(2 * g)]
    assert [e[:4] for e in layout] == expect_order
    for layer, di, lin, kind, o, shape in layout:   # contiguous, in order, no gaps
        assert o == off
        i_l = i if layer == 0 else h * d
        want = (h,) if kind == "bias" else (h, i_l if lin < g else h)
        assert shape == want
        off += int(np.prod(shape))
    assert off == param_size(cfg)


def test_layout_literal():
    cfg = RNNConfig("rnn_tanh", 2, 3)
    assert param_layout(cfg) == [(0, 0, 0, "matrix", 0, (3, 2)), (0, 0, 1, "matrix", 6, (3, 3)),
                                 (0, 0, 0, "bias", 15, (3,)), (0, 0, 1, "bias", 18, (3,))]
    assert param_size(cfg) == 21
    skip = RNNConfig("gru", 2, 2, input_mode="skip")
    assert [e[2:4] for e in param_layout(skip)][:4] == [(3, "matrix"), (4, "matrix"),
                                                        (5, "matrix"), (0, "bias")]


@pytest.mark.parametrize("mode,skip", [("lstm", False), ("gru", True)])
def test_split_params_are_views_into_w(mode, skip):
    rnn = dnnkit.RNN(mode, 3, 3, 2, bidirectional=True, input_mode="skip" if skip else "linear")
    w = rnn.init_params(seed=5)
    host = w.copy_to_host()
    at = {(e[0], e[1], e[2], e[3]): (e[4], e[5]) for e in param_layout(rnn.cfg)}
    g = GATES[mode]
    for layer in range(2):
        for d in range(2):
            pairs = rnn.split_params(w, layer, d)
            assert len(pairs) == 2 * g
            for lin, (W, b) in enumerate(pairs):
                if skip and layer == 0 and lin < g:
                    assert W is None
                else:
                    off, shape = at[(layer, d, lin, "matrix")]
                    assert W.shape == shape
                    assert np.array_equal(W.copy_to_host(), host[off:off + W.size].reshape(shape))
                off, _ = at[(layer, d, lin, "bias")]
                assert np.array_equal(b.copy_to_host(), host[off:off + 3])
    # writing through a view changes w
    W, b = rnn.split_params(w, 1, 1)[g + 1]
    W.copy_to_device(np.full(W.shape, 7.0, np.float32))
    b.copy_to_device(np.full(b.shape, -2.0, np.float32))
    new = w.copy_to_host()
    off, _ = at[(1, 1, g + 1, "matrix")]
    assert (new[off:off + W.size] == 7).all()
    off, _ = at[(1, 1, g + 1, "bias")]
    assert (new[off:off + 3] == -2).all()
    assert (new != host).sum() == W.size + 3


def test_init_params_range_and_seed():
    rnn = dnnkit.RNN("gru", 4, 16, dtype="float64")
    a, b = rnn.init_params(seed=1).copy_to_host(), rnn.init_params(seed=1).copy_to_host()
    c = rnn.init_params(seed=2).copy_to_host()
    assert a.shape == (rnn.param_size,) and a.dtype == np.float64
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    assert np.abs(a).max() <= 0.25 and np.abs(a).max() > 0.2


# ---------------------------------------------------------------- errors

def _cfg(mode="lstm", **kw):
    return rnn_ops.make_config(mode, 3, 4, **kw)


def _fwd(**over):
    cfg = over.pop("cfg", _cfg())
    args = dict(w=np.zeros(param_size(cfg), np.float32), x=np.zeros((2, 2, 3), np.float32),
                hx=None, cx=None)
    args.update(over)
    return lambda: dnnkit.rnn_forward(cfg, args.pop("w"), args.pop("x"), **args)


@pytest.mark.parametrize("call,exc,words", [
    (lambda: dnnkit.RNN("lstn", 3, 4), ValueError, ["RNN", "mode", "lstn", "gru"]),
    (lambda: dnnkit.RNN("gru", 3, 4, input_mode="skipped"), ValueError, ["input_mode", "skipped"]),
    (lambda: dnnkit.RNN("gru", 3, 4, input_mode="skip"), ValueError, ["skip", "3", "4"]),
    (lambda: dnnkit.RNN("gru", 0, 4), ValueError, ["input_size", "0"]),
    (lambda: dnnkit.RNN("gru", 3, 2.5), TypeError, ["hidden_size", "2.5"]),
    (lambda: dnnkit.RNN("gru", 3, 4, 0), ValueError, ["num_layers", "0"]),
    (lambda: dnnkit.RNN("gru", 3, 4, bidirectional="yes"), TypeError, ["bidirectional"]),
    (lambda: dnnkit.RNN("gru", 3, 4, dtype="int32"), TypeError, ["dtype", "int32"]),
    (lambda: dnnkit.RNN("gru", 3, 4, batch_first=1), TypeError, ["batch_first"]),
    (lambda: dnnkit.rnn_forward("lstm", np.zeros(3), np.zeros((1, 1, 3))), TypeError,
     ["rnn_forward", "RNNConfig", "str"]),
    (_fwd(x=np.zeros((2, 2, 5), np.float32)), ValueError, ["rnn_forward", "x", "(2, 2, 5)"]),
    (_fwd(x=np.zeros((2, 3), np.float32)), ValueError, ["x", "3-D", "(2, 3)"]),
    (_fwd(x=np.zeros((0, 2, 3), np.float32)), ValueError, ["x", "(0, 2, 3)"]),
    (_fwd(x=np.zeros((2, 2, 3), np.float64)), TypeError, ["x", "float64", "float32"]),
    (_fwd(x=np.zeros((2, 2, 3), np.int32)), TypeError, ["x", "int32"]),
    (_fwd(w=np.zeros(7, np.float32)), ValueError, ["w", "param_size", "(7,)"]),
    (_fwd(w=np.zeros(param_size(_cfg()), np.float64)), TypeError, ["w", "float64"]),
    (_fwd(hx=np.zeros((2, 2, 4), np.float32)), ValueError, ["hx", "(1, 2, 4)", "(2, 2, 4)"]),
    (_fwd(cx=np.zeros((1, 2, 4), np.float16)), TypeError, ["cx", "float16"]),
    (_fwd(cfg=_cfg("gru"), cx=np.zeros((1, 2, 4), np.float32)), ValueError, ["cx", "gru"]),
    (_fwd(lengths=[1, 3]), ValueError, ["lengths", "T=2", "3"]),
    (_fwd(lengths=[0, 2]), ValueError, ["lengths", "0"]),
    (_fwd(lengths=[1, 2, 2]), ValueError, ["lengths", "(2,)", "(3,)"]),
    (_fwd(lengths=[1.0, 2.0]), TypeError, ["lengths", "float"]),
    (_fwd(training="yes"), TypeError, ["training", "yes"]),
    (_fwd(backend="tpu"), ValueError, ["backend", "tpu"]),
])
def test_bad_arguments_name_op_and_values(call, exc, words):
    with pytest.raises(exc) as ei:
        call()
    for w in words:
        assert w in str(ei.value), (w, str(ei.value))


class _ForeignState:
    backend = "cudnn"


def _bwd_args(cfg):
    w = np.zeros(param_size(cfg), np.float32)
    x, y = np.zeros((2, 2, 3), np.float32), np.zeros((2, 2, 4), np.float32)
    return w, x, y


def test_backward_argument_errors():
    cfg = _cfg()
    w, x, y = _bwd_args(cfg)
    with pytest.raises(TypeError, match="rnn_backward: state must be"):
        dnnkit.rnn_backward(cfg, w, x, y, y, state=None)
    with pytest.raises(ValueError, match=r"rnn_backward: dy must have shape .*\(2, 2, 4\).*"
                                         r"\(2, 2, 5\)"):
        dnnkit.rnn_backward(cfg, w, x, y, np.zeros((2, 2, 5), np.float32),
                            state=_ForeignState())
    with pytest.raises(ValueError, match="dcy .*'gru'"):
        c = _cfg("gru")
        dnnkit.rnn_backward(c, np.zeros(param_size(c), np.float32), x, y, y,
                            dcy=np.zeros((1, 2, 4), np.float32), state=_ForeignState())


@pytest.mark.parametrize("batch_first", [False, True])
def test_non_contiguous_device_x_is_refused_naming_the_op(batch_first):
    """With batch_first, RNN took a device array for a host one on the simulator (its arrays
    have no __cuda_array_interface__) and copied a non-contiguous view through the host
    instead of refusing it as every other op does (found by tests/fuzz/test_fuzz.py)."""
    from numba import cuda
    rnn = dnnkit.RNN("gru", 2, 2, batch_first=batch_first)
    w = rnn.init_params()
    x = cuda.to_device(np.ones((2, 3, 4), np.float32))[:, :, ::2]
    with pytest.raises(ValueError, match=r"(RNN|rnn_forward): x must be C-contiguous"):
        rnn.forward(w, x)


def test_backward_with_a_state_from_another_backend_raises():
    cfg = rnn_ops.make_config("gru", 2, 2)
    w, x = np.zeros(param_size(cfg), np.float32), np.zeros((1, 1, 2), np.float32)
    with pytest.raises(ValueError) as ei:
        dnnkit.rnn_backward(cfg, w, x, np.zeros((1, 1, 2), np.float32),
                            np.zeros((1, 1, 2), np.float32), state=_ForeignState(),
                            backend="numba")
    assert "'cudnn'" in str(ei.value) and "backend that ran forward" in str(ei.value)


def test_backward_state_must_match_the_call():
    rnn = dnnkit.RNN("rnn_tanh", 2, 2, dtype="float64")
    w = rnn.init_params()
    x = np.ones((2, 2, 2))
    out = rnn.forward(w, x, training=True, lengths=[2, 1], backend="numba")
    with pytest.raises(ValueError, match=r"lengths \[2, 2\] differ from the forward's \[2, 1\]"):
        rnn.backward(w, x, out.y, out.y, state=out.state, lengths=[2, 2])
    with pytest.raises(ValueError, match="state was made for"):
        rnn.backward(w, x[:1], out.y[:1], out.y[:1], state=out.state, lengths=[1, 1])
    with pytest.raises(ValueError, match="split_params: layer must be in"):
        rnn.split_params(w, 1)
    with pytest.raises(ValueError, match="split_params: w must be"):
        rnn.split_params(w[:3], 0)


def test_selfcheck_case_runs():
    from dnnkit.selfcheck import Case, THRESHOLD
    cases = rnn_ops.selfcheck_cases(Case)
    assert {c.op for c in cases} == {"rnn_forward", "rnn_backward"}
    assert len(cases) == 2 * len(MODES)
    case = next(c for c in cases if c.op == "rnn_backward" and c.variant.startswith("gru"))
    host = case.make(np.random.default_rng(0), np.dtype("float32"), False)
    got = case.run("numba", None, list(host)).copy_to_host()
    ref = case.ref([h.astype(np.float64) for h in host])
    assert reference.rel_error(got, ref) <= THRESHOLD["float32"]


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_gpu_realistic_shape_with_split_k(rng, mode):
    """On a GPU: the large-tile GEMM configurations and the automatic split-k of the per-step
    GEMMs (P > 1 here), 2 layers, bidirectional, variable lengths, float32 vs float64."""
    h, n, t = 256, 8, 6
    rnn = dnnkit.RNN(mode, 128, h, 2, bidirectional=True)
    g = GATES[mode]
    assert rnn_numba.split_k(n, g * h, h, 2) > 1 and rnn_numba.split_k(n, h, g * h, 2) > 1
    w = rnn.init_params(seed=4)
    lengths = [6, 2, 5, 1, 6, 3, 4, 6]
    x, dy = rng.standard_normal((t, n, 128), np.float32), rng.standard_normal((t, n, 2 * h),
                                                                               np.float32)
    out = rnn.forward(w, x, training=True, lengths=lengths, backend="numba")
    wh = w.copy_to_host().astype(np.float64)
    ry, rhy, rcy = reference.rnn_forward(rnn.cfg, wh, x.astype(np.float64), lengths=lengths)
    assert _err(out.y.copy_to_host(), ry) <= 1e-5
    assert _err(out.hy.copy_to_host(), rhy) <= 1e-5
    dx, dhx, dcx, dw = rnn.backward(w, x, out.y, dy, state=out.state, lengths=lengths)
    rdx, rdhx, rdcx, rdw = reference.rnn_backward(rnn.cfg, wh, x.astype(np.float64),
                                                  dy.astype(np.float64), lengths=lengths)
    for got, ref in ((dx, rdx), (dhx, rdhx), (dw, rdw)):
        assert _err(got.copy_to_host(), ref) <= 2e-5


def test_selfcheck_cases_each_run_their_own_mode():
    """Every RNN selfcheck case runs its own configuration (a late-bound closure once gave
    every case the last mode's, and the other modes failed with a parameter-size error)."""
    import numpy as np
    from dnnkit import selfcheck
    cases = [c for c in selfcheck.cases() if c.op == "rnn_forward"]
    assert len(cases) >= 3
    from numba import cuda
    for c in cases:
        inputs = c.make(np.random.default_rng(0), np.dtype(np.float64), False)
        got = c.run("numba", None, [cuda.to_device(a) for a in inputs]).copy_to_host()
        ref = c.ref(inputs)
        assert got.shape == ref.shape and np.abs(got - ref).max() <= 1e-10 * np.abs(ref).max(), \
            c.variant
