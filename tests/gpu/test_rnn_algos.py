"""cuDNN's RNN options on a real GPU: every algorithm (standard, persist_static,
persist_static_small_h, persist_dynamic) against the float64 reference or refused with a
reason; what "auto" runs; the dynamic plan rebuilt between batch sizes; the dropout masks of a
cuDNN training forward applied by its backward."""

import numpy as np
import pytest

import dnnkit
from dnnkit import reference
from dnnkit.errors import CudnnUnavailableError
from dnnkit.ops import rnn_cudnn
from dnnkit.rnn_layout import RNNConfig
from tests.ops.test_rnn_options import relu_probe

pytestmark = [pytest.mark.gpu, pytest.mark.cudnn]

PERSIST = ("persist_static", "persist_static_small_h", "persist_dynamic")
TOL = (2e-5, 1e-4)         # float32 forward, gradients (max|got - ref| / max|ref|)


def _err(got, ref):
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    return float(np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30))


def _problem(rng, cfg, T, N):
    k = 1 / np.sqrt(cfg.hidden_size)
    rnn = dnnkit.RNN(cfg.mode, cfg.input_size, cfg.hidden_size, cfg.num_layers)
    w = rng.uniform(-k, k, rnn.param_size).astype(np.float32)
    x = rng.standard_normal((T, N, cfg.input_size)).astype(np.float32)
    dy = rng.standard_normal((T, N, cfg.hidden_size * cfg.directions)).astype(np.float32)
    return w, x, dy


def _check(cfg, algo, w, x, dy):
    y, hy, cy, st = dnnkit.rnn_forward(cfg, w, x, training=True, algo=algo, backend="cudnn")
    assert st.algo == algo
    dx, dhx, dcx, dw = dnnkit.rnn_backward(cfg, w, x, y, dy, state=st, backend="cudnn")
    w64, x64 = w.astype(np.float64), x.astype(np.float64)
    ry, rhy, _ = reference.rnn_forward(cfg, w64, x64)
    rdx, _, _, rdw = reference.rnn_backward(cfg, w64, x64, dy.astype(np.float64))
    assert _err(y.copy_to_host(), ry) <= TOL[0] and _err(hy.copy_to_host(), rhy) <= TOL[0]
    assert _err(dx.copy_to_host(), rdx) <= TOL[1] and _err(dw.copy_to_host(), rdw) <= TOL[1]


@pytest.mark.parametrize("n", [1, 4, 16])
@pytest.mark.parametrize("mode", ["lstm", "gru"])
@pytest.mark.parametrize("algo", ("standard",) + PERSIST)
def test_each_algorithm_matches_float64_or_says_why_not(rng, algo, mode, n):
    cfg = RNNConfig(mode, 32, 64)
    w, x, dy = _problem(rng, cfg, 8, n)
    try:
        _check(cfg, algo, w, x, dy)
    except CudnnUnavailableError as e:
        assert algo != "standard", e.reason
        assert algo in e.reason, e.reason          # the supports() reason names the algo
        pytest.skip(f"cuDNN refuses {algo} here: {e.reason}")


def test_auto_runs_persist_static_for_small_batches_where_cudnn_takes_it(rng):
    cfg = RNNConfig("lstm", 32, 64)
    w, x, _ = _problem(rng, cfg, 8, 4)
    refused = rnn_cudnn.algo_reason(cfg, "persist_static", x, None, False, None)
    with dnnkit.trace() as tr:
        dnnkit.rnn_forward(cfg, w, x, backend="cudnn")
    assert tr[0].algo == ("standard" if refused else "persist_static")
    big = rnn_cudnn.AUTO_PERSIST_MAX_BATCH + 1
    w, x, _ = _problem(rng, cfg, 8, big)
    with dnnkit.trace() as tr:
        dnnkit.rnn_forward(cfg, w, x, backend="cudnn")
    assert tr[0].algo == "standard"


def test_projection_with_a_persistent_algorithm_is_refused(rng):
    cfg = RNNConfig("lstm", 8, 16, proj_size=8)
    rnn = dnnkit.RNN("lstm", 8, 16, proj_size=8)
    x = rng.standard_normal((4, 2, 8)).astype(np.float32)
    with pytest.raises(CudnnUnavailableError, match="projection"):
        dnnkit.rnn_forward(cfg, rnn.init_params(), x, algo="persist_static", backend="cudnn")
    with dnnkit.trace() as tr:                    # auto: standard
        dnnkit.rnn_forward(cfg, rnn.init_params(), x, backend="cudnn")
    assert tr[0].algo == "standard"


def test_dynamic_plan_follows_the_batch_size(rng):
    cfg = RNNConfig("gru", 32, 64)
    if rnn_cudnn.algo_reason(cfg, "persist_dynamic", np.zeros((8, 4, 32), np.float32), None,
                             True, None):
        pytest.skip("cuDNN refuses persist_dynamic here")
    w, x4, dy4 = _problem(rng, cfg, 8, 4)
    _, x2, _ = _problem(rng, cfg, 8, 2)
    y, _, _, st = dnnkit.rnn_forward(cfg, w, x4, training=True, algo="persist_dynamic",
                                     backend="cudnn")
    dnnkit.rnn_forward(cfg, w, x2, algo="persist_dynamic", backend="cudnn")   # rebuilds for 2
    dx, _, _, dw = dnnkit.rnn_backward(cfg, w, x4, y, dy4, state=st, backend="cudnn")
    w64, x64 = w.astype(np.float64), x4.astype(np.float64)
    rdx, _, _, rdw = reference.rnn_backward(cfg, w64, x64, dy4.astype(np.float64))
    assert _err(dx.copy_to_host(), rdx) <= TOL[1] and _err(dw.copy_to_host(), rdw) <= TOL[1]


def test_cudnn_dropout_backward_applies_the_forward_masks(rng):
    rnn, w = relu_probe(2, 32, 0.5, "float32")
    x = rng.uniform(1, 2, (6, 8, 32)).astype(np.float32)
    out = rnn.forward(w, x, training=True, seed=3, backend="cudnn")
    factor = out.y.copy_to_host() / x
    assert 0.3 < (factor != 0).mean() < 0.7
    dy = rng.standard_normal(x.shape).astype(np.float32)
    dx = rnn.backward(w, x, out.y, dy, state=out.state)[0].copy_to_host()
    np.testing.assert_allclose(dx, dy * factor, rtol=1e-6, atol=1e-7)
    again = rnn.forward(w, x, training=True, seed=3, offset=0, backend="cudnn")
    np.testing.assert_array_equal(again.y.copy_to_host(), out.y.copy_to_host())
