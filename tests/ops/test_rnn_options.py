"""RNN options: the LSTM projection (proj_size) on both backends against the float64
reference (itself against finite differences), its layout and split_params; the dropout
between layers (Numba's masks are dnnkit.dropout's, named by (seed, offset); the same seed
repeats a run exactly; the backward applies the same masks; statistics of cuDNN's masks);
the ``algo`` argument (Numba ignores it and says so in trace()); the argument checks."""

import numpy as np
import pytest

import dnnkit
from dnnkit import reference
from dnnkit.errors import CudnnUnavailableError
from dnnkit.ops import rnn as rnn_ops
from dnnkit.rnn_layout import RNNConfig, param_layout, param_size
from tests.conftest import DTYPES, backend_params

TOL = {"float16": 2e-3, "float32": 2e-6, "float64": 1e-12}


def _err(got, ref):
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    return np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30)


def _host(a):
    return None if a is None else a.copy_to_host()


def _run(rnn, w, x, hx, cx, dy, dhy, dcy, lengths, backend, **kw):
    out = rnn.forward(w, x, hx, cx, training=True, lengths=lengths, backend=backend, **kw)
    grads = rnn.backward(w, x, out.y, dy, dhy, dcy, hx, cx, state=out.state, lengths=lengths)
    return [_host(a) for a in (out.y, out.hy, out.cy, *grads)], out.state


def _problem(rng, cfg, t, n, states=True):
    d, dt = cfg.directions, cfg.dtype
    sp = (cfg.num_layers * d, n, cfg.out_size)
    sc = (cfg.num_layers * d, n, cfg.hidden_size)
    x = rng.standard_normal((t, n, cfg.input_size)).astype(dt)
    hx = rng.standard_normal(sp).astype(dt) if states else None
    cx = rng.standard_normal(sc).astype(dt) if states and cfg.mode == "lstm" else None
    dy = rng.standard_normal((t, n, d * cfg.out_size)).astype(dt)
    dhy = rng.standard_normal(sp).astype(dt)
    dcy = rng.standard_normal(sc).astype(dt) if cfg.mode == "lstm" else None
    return x, hx, cx, dy, dhy, dcy


def _f64(*a):
    return [None if v is None else np.asarray(v, np.float64) for v in a]


# ---------------------------------------------------------------- projection

PROJ_RUNS = [  # (layers, bidirectional, skip, varlen, dtype, proj)
    (1, False, False, False, "float64", 2), (2, True, False, True, "float32", 3),
    (2, False, True, True, "float16", 2), (2, True, True, False, "float64", 1)]


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("run", PROJ_RUNS, ids=lambda r: f"L{r[0]}{'bi' * r[1]}"
                         f"{'-skip' * r[2]}{'-len' * r[3]}-{r[4]}-p{r[5]}")
def test_projection_matches_float64(rng, run, backend):
    layers, bi, skip, varlen, dt, proj = run
    h = 4
    rnn = dnnkit.RNN("lstm", h if skip else 3, h, layers, bidirectional=bi,
                     input_mode="skip" if skip else "linear", dtype=dt, proj_size=proj)
    w = rnn.init_params(seed=1)
    lengths = np.array([3, 1, 2]) if varlen else None
    x, hx, cx, dy, dhy, dcy = _problem(rng, rnn.cfg, 3, 3)
    try:
        got, state = _run(rnn, w, x, hx, cx, dy, dhy, dcy, lengths, backend)
    except CudnnUnavailableError as e:
        pytest.skip(f"cuDNN cannot run this configuration: {e.reason}")
    assert state.backend == backend
    wh = w.copy_to_host().astype(np.float64)
    fx, fhx, fcx, fdy, fdhy, fdcy = _f64(x, hx, cx, dy, dhy, dcy)
    ref = list(reference.rnn_forward(rnn.cfg, wh, fx, fhx, fcx, lengths)) + \
        list(reference.rnn_backward(rnn.cfg, wh, fx, fdy, fdhy, fdcy, fhx, fcx, lengths))
    d = rnn.cfg.directions
    assert got[0].shape == (3, 3, d * proj) and got[1].shape == (layers * d, 3, proj)
    assert got[2].shape == (layers * d, 3, h) and got[4].shape == (layers * d, 3, proj)
    tol = TOL[dt] * (5 if backend == "cudnn" else 1)
    for name, g, r in zip(("y", "hy", "cy", "dx", "dhx", "dcx", "dw"), got, ref):
        assert _err(g, r) <= (tol if name in ("y", "hy", "cy") else 2 * tol), name
    if lengths is not None:
        for k, ln in enumerate(lengths):
            assert not got[0][ln:, k].any()
    inf = rnn.forward(w, x, hx, cx, lengths=lengths, backend=backend)   # one-slot path
    assert np.array_equal(inf.y.copy_to_host(), got[0])
    assert np.array_equal(inf.hy.copy_to_host(), got[1])


def test_reference_projection_gradients_are_finite_differences(rng):
    cfg = RNNConfig("lstm", 3, 4, 2, True, "linear", "float64", proj_size=2)
    lengths = np.array([3, 2])
    w = rng.uniform(-0.6, 0.6, param_size(cfg))
    x, hx, cx, gy, ghy, gcy = _problem(rng, cfg, 3, 2)

    def loss(w_, x_, hx_, cx_):
        y, hy, cy = reference.rnn_forward(cfg, w_, x_, hx_, cx_, lengths)
        return (y * gy).sum() + (hy * ghy).sum() + (cy * gcy).sum()

    dx, dhx, dcx, dw = reference.rnn_backward(cfg, w, x, gy, ghy, gcy, hx, cx, lengths)
    args, grads = [w, x, hx, cx], [dw, dx, dhx, dcx]
    for k in (1, 2, 3):
        fd = np.zeros(args[k].size)
        for j in range(args[k].size):
            plus, minus = list(args), list(args)
            plus[k], minus[k] = args[k].copy(), args[k].copy()
            plus[k].flat[j] += 1e-6
            minus[k].flat[j] -= 1e-6
            fd[j] = (loss(*plus) - loss(*minus)) / 2e-6
        assert np.allclose(grads[k].ravel(), fd, rtol=1e-6, atol=1e-7), k
    proj = [(off, shape) for l_, d, lin, kind, off, shape in param_layout(cfg) if lin == 8]
    assert len(proj) == 4
    for off, shape in proj:             # every element of every W_hr
        for j in range(off, off + shape[0] * shape[1]):
            e = np.zeros(w.size)
            e[j] = 1e-6
            fd = (loss(w + e, x, hx, cx) - loss(w - e, x, hx, cx)) / 2e-6
            assert abs(fd - dw[j]) <= 1e-6 * max(1.0, abs(fd))
    assert np.abs(dw[proj[0][0]:proj[0][0] + 8]).max() > 0


@pytest.mark.parametrize("bidir,skip", [(False, False), (True, False), (True, True)])
def test_projection_layout(bidir, skip):
    h, p, i, layers = 5, 3, 5 if skip else 4, 3
    cfg = rnn_ops.make_config("lstm", i, h, layers, bidirectional=bidir,
                              input_mode="skip" if skip else "linear", proj_size=p)
    d = cfg.directions
    # PyTorch's count: per layer and direction 4H*(I_l + P + 2) + P*H, I_l = D*P above layer 0
    want = sum(d * (4 * h * ((0 if skip and l_ == 0 else (i if l_ == 0 else d * p)) + p + 2)
                    + p * h) for l_ in range(layers))
    assert param_size(cfg) == want
    layout = param_layout(cfg)
    off = 0
    for layer, di, lin, kind, o, shape in layout:
        assert o == off
        off += int(np.prod(shape))
        if kind == "matrix":
            assert shape == ((p, h) if lin == 8 else (h, p) if lin >= 4 else
                             (h, i if layer == 0 else d * p))
    assert off == param_size(cfg)
    # within a pseudo-layer the projection follows the recurrent matrices; no bias of its own
    mats = [(e[0], e[1], e[2]) for e in layout if e[3] == "matrix"]
    k = mats.index((1, 0, 8))
    assert mats[k - 1] == (1, 0, 7)
    assert not [e for e in layout if e[3] == "bias" and e[2] == 8]


def test_split_params_with_projection():
    rnn = dnnkit.RNN("lstm", 3, 4, 2, bidirectional=True, proj_size=2)
    w = rnn.init_params(seed=2)
    host = w.copy_to_host()
    pairs = rnn.split_params(w, 1, 1)
    assert len(pairs) == 9
    assert [W.shape for W, _ in pairs] == [(4, 4)] * 4 + [(4, 2)] * 4 + [(2, 4)]
    W_hr, b = pairs[8]
    assert b is None
    (off,) = [e[4] for e in param_layout(rnn.cfg) if e[:4] == (1, 1, 8, "matrix")]
    assert np.array_equal(W_hr.copy_to_host(), host[off:off + 8].reshape(2, 4))
    W_hr.copy_to_device(np.full((2, 4), 5.0, np.float32))      # a view: writes reach w
    assert (w.copy_to_host()[off:off + 8] == 5).all()


# ---------------------------------------------------------------- dropout

def relu_probe(layers, h, p, dtype="float64"):
    """An rnn_relu network whose every layer passes its input through (W = I, R = 0, no
    biases): for x > 0 the output is x times every inter-layer dropout factor, so y / x
    shows the masks (on either backend)."""
    rnn = dnnkit.RNN("rnn_relu", h, h, layers, dtype=dtype, dropout=p)
    w = np.zeros(param_size(rnn.cfg), dtype)
    for layer, d, lin, kind, off, shape in param_layout(rnn.cfg):
        if kind == "matrix" and lin == 0:
            w[off:off + h * h] = np.eye(h).ravel()
    return rnn, w


def _drop_factor(shape, p, seed, offset):
    """dnnkit.dropout's mask * 1/(1 - p) of (seed, offset) on Numba."""
    y, _ = dnnkit.dropout(np.ones(shape), p, seed=seed, offset=offset, backend="numba")
    return y.copy_to_host()


def test_numba_masks_are_dnnkit_dropouts_named_by_seed_and_offset(rng):
    p, seed, t, n, h = 0.5, 123, 3, 2, 4
    rnn, w = relu_probe(3, h, p)
    x = rng.uniform(1, 2, (t, n, h))
    for offset in (0, 3):
        out = rnn.forward(w, x, training=True, seed=seed, offset=offset, backend="numba")
        want = x * _drop_factor(x.shape, p, seed, 2 * offset) * \
            _drop_factor(x.shape, p, seed, 2 * offset + 1)
        np.testing.assert_allclose(out.y.copy_to_host(), want, rtol=1e-15)
        dy = rng.standard_normal(x.shape)       # the backward applies the same masks
        dx = rnn.backward(w, x, out.y, dy, state=out.state)[0].copy_to_host()
        np.testing.assert_allclose(dx, dy * want / x, rtol=1e-14)
    inf = rnn.forward(w, x, backend="numba")    # not training: no dropout
    np.testing.assert_allclose(inf.y.copy_to_host(), x, rtol=1e-15)


@pytest.mark.parametrize("mode", ["gru", "lstm"])
def test_numba_dropout_matches_float64_with_the_masks(rng, mode):
    p, seed, offset = 0.3, 77, 1
    rnn = dnnkit.RNN(mode, 3, 4, 3, bidirectional=True, dtype="float64", dropout=p,
                     proj_size=3 if mode == "lstm" else 0)
    c = rnn.cfg
    w = rnn.init_params(seed=5)
    lengths = np.array([3, 1])
    x, hx, cx, dy, dhy, dcy = _problem(rng, c, 3, 2)
    got, _ = _run(rnn, w, x, hx, cx, dy, dhy, dcy, lengths, "numba", seed=seed, offset=offset)
    shape = (3, 2, c.directions * c.out_size)
    masks = [_drop_factor(shape, p, seed, offset * 2 + layer) for layer in range(2)]
    wh = w.copy_to_host()
    ref = list(reference.rnn_forward(c, wh, x, hx, cx, lengths, masks)) + \
        list(reference.rnn_backward(c, wh, x, dy, dhy, dcy, hx, cx, lengths, masks))
    for g, r in zip(got, ref):
        if r is not None:
            assert _err(g, r) <= 1e-12
    assert _err(got[0], reference.rnn_forward(c, wh, x, hx, cx, lengths)[0]) > 1e-3


@pytest.mark.parametrize("backend", backend_params())
def test_a_seed_repeats_the_run_exactly(rng, backend):
    rnn = dnnkit.RNN("lstm", 3, 4, 2, dropout=0.4, dtype="float32")
    w = rnn.init_params(seed=1)
    x, hx, cx, dy, dhy, dcy = _problem(rng, rnn.cfg, 4, 3)
    try:
        a, _ = _run(rnn, w, x, hx, cx, dy, dhy, dcy, None, backend, seed=9, offset=0)
    except CudnnUnavailableError as e:
        pytest.skip(f"cuDNN cannot run this configuration: {e.reason}")
    b, _ = _run(rnn, w, x, hx, cx, dy, dhy, dcy, None, backend, seed=9, offset=0)
    for u, v in zip(a, b):
        if u is not None:
            assert np.array_equal(u, v)
    c, _ = _run(rnn, w, x, hx, cx, dy, dhy, dcy, None, backend, seed=9, offset=1)
    d, _ = _run(rnn, w, x, hx, cx, dy, dhy, dcy, None, backend, seed=None)
    e, _ = _run(rnn, w, x, hx, cx, dy, dhy, dcy, None, backend, seed=None)
    assert not np.array_equal(a[0], c[0]) and not np.array_equal(d[0], e[0])


@pytest.mark.parametrize("backend", backend_params())
def test_keep_rate_and_scale(rng, backend):
    """Statistics that hold for both generators: each element kept with probability 1 - p,
    kept ones scaled by exactly 1/(1 - p)."""
    p, t, n, h = 0.25, 4, 8, 32
    rnn, w = relu_probe(2, h, p, "float32")
    x = rng.uniform(1, 2, (t, n, h)).astype(np.float32)
    try:
        out = rnn.forward(w, x, training=True, seed=4, backend=backend)
    except CudnnUnavailableError as e:
        pytest.skip(f"cuDNN cannot run this configuration: {e.reason}")
    ratio = out.y.copy_to_host() / x
    kept = ratio != 0
    np.testing.assert_allclose(ratio[kept], 1 / (1 - p), rtol=1e-6)
    sd = np.sqrt(p * (1 - p) / kept.size)
    assert abs(kept.mean() - (1 - p)) <= 5 * sd


@pytest.mark.cudnn
def test_cross_backend_agreement_without_dropout(rng):
    """Inference (no dropout, whatever p): both backends compute the same network."""
    rnn = dnnkit.RNN("gru", 3, 4, 2, dropout=0.5)
    w = rnn.init_params(seed=3)
    x = rng.standard_normal((3, 2, 3)).astype(np.float32)
    try:
        a = rnn.forward(w, x, backend="cudnn").y.copy_to_host()
    except CudnnUnavailableError as e:
        pytest.skip(f"cuDNN cannot run this configuration: {e.reason}")
    b = rnn.forward(w, x, backend="numba").y.copy_to_host()
    assert _err(a, b) <= 1e-5


# ---------------------------------------------------------------- algo, arguments

def test_numba_ignores_algo_and_says_so(rng):
    rnn = dnnkit.RNN("gru", 2, 3, algo="persist_static")
    w = rnn.init_params()
    x = rng.standard_normal((2, 1, 2)).astype(np.float32)
    with dnnkit.trace() as tr:
        a = rnn.forward(w, x, backend="numba")
        b = dnnkit.rnn_forward(rnn.cfg, w, x, backend="numba")
    assert "ignored" in str(tr[0].algo) and "persist_static" in str(tr[0].algo)
    assert "ignored" not in str(tr[1].algo)
    assert np.array_equal(a.y.copy_to_host(), b[0].copy_to_host())
    assert "algo='persist_static'" in repr(rnn)


def _cfg(**kw):
    return rnn_ops.make_config("lstm", 3, 4, 2, **kw)


def _fwd(cfg=None, **kw):
    cfg = cfg or _cfg()
    return lambda: dnnkit.rnn_forward(cfg, np.zeros(param_size(cfg), np.float32),
                                      np.zeros((2, 2, 3), np.float32), **kw)


@pytest.mark.parametrize("call,exc,words", [
    (lambda: dnnkit.RNN("gru", 3, 4, proj_size=2), ValueError, ["RNN", "proj_size", "'gru'"]),
    (lambda: dnnkit.RNN("lstm", 3, 4, proj_size=4), ValueError, ["proj_size", "[0, ", "4"]),
    (lambda: dnnkit.RNN("lstm", 3, 4, proj_size=-1), ValueError, ["proj_size", "-1"]),
    (lambda: dnnkit.RNN("lstm", 3, 4, proj_size=True), TypeError, ["proj_size", "True"]),
    (lambda: dnnkit.RNN("lstm", 3, 4, dropout=1.0), ValueError, ["dropout", "[0, 1)", "1.0"]),
    (lambda: dnnkit.RNN("lstm", 3, 4, dropout="0.1"), TypeError, ["dropout", "'0.1'"]),
    (lambda: dnnkit.RNN("lstm", 3, 4, algo="fast"), ValueError, ["algo", "persist_static",
                                                                 "'fast'"]),
    (_fwd(algo="persist"), ValueError, ["rnn_forward", "algo", "'persist'"]),
    (_fwd(seed=-1), ValueError, ["rnn_forward", "seed", "-1"]),
    (_fwd(seed=1.5), TypeError, ["seed", "1.5"]),
    (_fwd(offset=2), ValueError, ["rnn_forward", "offset 2", "seed"]),
    (_fwd(seed=1, offset=-1), ValueError, ["offset", "-1"]),
    (_fwd(cfg=_cfg(proj_size=2), hx=np.zeros((2, 2, 4), np.float32)), ValueError,
     ["hx", "(2, 2, 2)", "(2, 2, 4)"]),
    (_fwd(cfg=_cfg(proj_size=2), cx=np.zeros((2, 2, 2), np.float32)), ValueError,
     ["cx", "(2, 2, 4)", "(2, 2, 2)"]),
])
def test_bad_arguments_name_op_and_values(call, exc, words):
    with pytest.raises(exc) as ei:
        call()
    for w in words:
        assert w in str(ei.value), (w, str(ei.value))


def test_backward_shapes_with_projection():
    cfg = _cfg(proj_size=2)
    w = np.zeros(param_size(cfg), np.float32)
    x, y = np.zeros((2, 2, 3), np.float32), np.zeros((2, 2, 2), np.float32)

    class Foreign:
        backend = "cudnn"
    with pytest.raises(ValueError, match=r"dy must have shape \(T, N, D\*P\) = \(2, 2, 2\)"):
        dnnkit.rnn_backward(cfg, w, x, y, np.zeros((2, 2, 4), np.float32), state=Foreign())
    with pytest.raises(ValueError, match=r"dhy must have shape .* \(2, 2, 2\)"):
        dnnkit.rnn_backward(cfg, w, x, y, y, np.zeros((2, 2, 4), np.float32), state=Foreign())


@pytest.mark.parametrize("dtype", DTYPES)
def test_config_carries_the_options(dtype):
    rnn = dnnkit.RNN("lstm", 3, 4, 2, dtype=dtype, proj_size=3, dropout=0.2)
    assert (rnn.cfg.proj_size, rnn.cfg.dropout, rnn.cfg.out_size) == (3, 0.2, 3)
    assert "proj_size=3" in repr(rnn) and "dropout=0.2" in repr(rnn)
    assert rnn.cfg.lin_layers == 9 and RNNConfig("gru", 3, 4).lin_layers == 6


def test_crosscheck_leaves_training_dropout_calls_alone(rng):
    """dnn.crosscheck repeats a call on the other backend and compares; a training forward
    with dropout between layers draws that backend's own masks, so it is not compared (no
    error, and the call's result stands); without dropout the forward is still compared."""
    from dnnkit.ops.rnn_common import draws_masks
    from dnnkit.registry import OPS
    assert OPS["rnn_forward"].crosscheck_skip is draws_masks
    cfg = RNNConfig("lstm", 3, 4, 2, dropout=0.5)

    class Call:
        def __init__(self, cfg, training):
            self.cfg, self.training = cfg, training
    assert draws_masks(Call(cfg, True), {})
    assert not draws_masks(Call(cfg, False), {})
    assert not draws_masks(Call(RNNConfig("lstm", 3, 4, 2), True), {})
    assert not draws_masks(Call(RNNConfig("lstm", 3, 4, 1, dropout=0.5), True), {})
