"""Convolution + bias + relu in one call (``activation="relu"``): every Numba forward algorithm
(implicit GEMM, column buffer, split k, direct, Winograd, depthwise, the empty sum) and cuDNN
against the float64 reference, the memo's runners, the gradient rule against the unfused
graph, argument errors, and the kernels' epilogue bits."""

import numpy as np
import pytest

import dnnkit
from dnnkit import fastpath, reference
from dnnkit.ops import conv_args
from dnnkit.ops.conv_tuning import settings
from tests.conftest import REL_TOL, backend_params

# algorithm -> (settings to set, x shape, w shape, keywords)
ALGOS = {
    "implicit": (dict(implicit=True, direct=False, winograd=False), (2, 3, 5, 6), (4, 3, 3, 3),
                 dict(padding=1)),
    "column": (dict(implicit=False, direct=False, winograd=False), (2, 3, 5, 6), (4, 3, 3, 2),
               dict(stride=2, padding=1)),
    "pointwise": (dict(implicit=False, direct=False, winograd=False), (2, 3, 4, 5),
                  (4, 3, 1, 1), dict()),
    "split_k": (dict(implicit=False, direct=False, winograd=False, split_k=3), (2, 6, 4, 5),
                (4, 3, 3, 3), dict(padding=1, groups=2)),
    "direct": (dict(direct=True, winograd=False), (2, 4, 5, 5), (6, 2, 3, 3),
               dict(padding=1, groups=2)),
    "winograd": (dict(winograd=True, direct=False), (2, 3, 6, 5), (4, 3, 3, 3),
                 dict(padding=1)),
    "depthwise": (dict(), (2, 4, 5, 5), (8, 1, 3, 3), dict(padding=1, groups=4)),
    "3d": (dict(implicit=True, direct=False, winograd=False), (2, 2, 3, 4, 4), (3, 2, 2, 3, 3),
           dict(padding=1)),
}


@pytest.fixture
def algo_settings(monkeypatch):
    def use(values):
        for k, v in values.items():
            monkeypatch.setattr(settings, k, v)
    return use


def _err(got, ref):
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    return np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30)


def _case(rng, xs, ws, dtype):
    x = rng.standard_normal(xs).astype(dtype)
    w = (rng.standard_normal(ws) / np.sqrt(np.prod(ws[1:]))).astype(dtype)
    b = (0.3 * rng.standard_normal(ws[0])).astype(dtype)
    return x, w, b


def _ref(x, w, b, **kw):
    """relu(conv(x, w) + b) in float64 (dnnkit.reference takes one value per spatial dim)."""
    nd = x.ndim - 2
    kw = {k: (v,) * nd if k != "groups" and isinstance(v, int) else v for k, v in kw.items()}
    for k in ("stride", "padding", "dilation"):
        kw.setdefault(k, (1 if k != "padding" else 0,) * nd)
    f64 = [None if a is None else np.asarray(a, np.float64) for a in (x, w, b)]
    return np.maximum(reference.conv_forward(*f64, **kw), 0)


def _conv(x, w, b=None, **kw):
    return (dnnkit.conv3d if x.ndim == 5 else dnnkit.conv2d)(x, w, b, **kw)


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("algo", list(ALGOS))
@pytest.mark.parametrize("with_bias", [True, False])
def test_fused_relu_matches_float64(rng, algo_settings, algo, dtype, backend, with_bias):
    values, xs, ws, kw = ALGOS[algo]
    algo_settings(values)
    x, w, b = _case(rng, xs, ws, dtype)
    b = b if with_bias else None
    with dnnkit.trace() as t:
        y = _conv(x, w, b, backend=backend, activation="relu", **kw)
    assert t.ops() == [("conv3d" if x.ndim == 5 else "conv2d")] and t.backends() == [backend]
    ref = _ref(x, w, b, **kw)
    yh = y.copy_to_host()
    assert yh.dtype == x.dtype and yh.shape == ref.shape
    assert yh.min() == 0 and 0.1 < (yh == 0).mean() < 0.9      # the relu ran, not all clipped
    assert _err(yh, ref) <= 4 * REL_TOL[dtype]


@pytest.mark.parametrize("backend", backend_params())
def test_empty_sum_is_relu_of_the_bias(backend):
    """No input channels: y = relu(bias) everywhere (the empty-sum path)."""
    x = np.zeros((2, 0, 4, 4), np.float32)
    w = np.zeros((3, 0, 3, 3), np.float32)
    b = np.array([-1.0, 0.5, 2.0], np.float32)
    y = dnnkit.conv2d(x, w, b, padding=1, backend=backend, activation="relu").copy_to_host()
    np.testing.assert_array_equal(y, np.broadcast_to(np.array([0, 0.5, 2], np.float32)
                                                     .reshape(1, 3, 1, 1), y.shape))


@pytest.mark.parametrize("backend", backend_params())
def test_nan_stays_nan(backend):
    x = np.ones((1, 1, 3, 3), np.float32)
    x[0, 0, 1, 1] = np.nan
    w = np.ones((2, 1, 1, 1), np.float32)
    y = dnnkit.conv2d(x, w, backend=backend, activation="relu").copy_to_host()
    assert np.isnan(y[0, :, 1, 1]).all() and (y[0, :, 0, 0] == 1).all()


@pytest.mark.parametrize("backend", backend_params())
def test_runners_of_repeated_calls(rng, backend):
    """The second and third calls of a signature are memo hits and still match; an unfused
    call of the same shapes is another signature (no relu)."""
    from numba import cuda
    hits = fastpath.stats["hits"]
    for _ in range(3):
        x, w, b = _case(rng, (2, 3, 5, 5), (4, 3, 3, 3), "float32")
        y = dnnkit.conv2d(*(cuda.to_device(a) for a in (x, w, b)), padding=1, backend=backend,
                          activation="relu")
        ref = _ref(x, w, b, padding=1)
        assert _err(y.copy_to_host(), ref) <= 4 * REL_TOL["float32"]
    assert fastpath.stats["hits"] - hits == 2
    y2 = dnnkit.conv2d(*(cuda.to_device(a) for a in (x, w, b)), padding=1, backend=backend)
    assert y2.copy_to_host().min() < 0


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("nd", [2, 3])
def test_gradients_are_those_of_the_unfused_graph(rng, backend, nd):
    """x's, w's and the bias's gradients through conv(activation="relu") equal those through
    conv then relu (the same kernels for the convolution, relu's slope from y)."""
    xs, ws = ((2, 3, 5, 5), (4, 3, 3, 3)) if nd == 2 else ((2, 2, 3, 4, 4), (3, 2, 2, 3, 3))
    x, w, b = _case(rng, xs, ws, "float64")
    dy = rng.standard_normal(_conv(x, w, b, padding=1, backend=backend).shape)
    grads = []
    for fused in (True, False):
        ts = [dnnkit.tensor(a, requires_grad=True) for a in (x, w, b)]
        if fused:
            y = _conv(*ts, padding=1, backend=backend, activation="relu")
        else:
            y = dnnkit.relu(_conv(*ts, padding=1, backend=backend), backend=backend)
        (y * dnnkit.tensor(dy)).sum().backward()
        grads.append([t.grad.numpy() for t in ts])
    for got, want in zip(*grads):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    assert np.abs(grads[0][0]).max() > 0


def test_the_rule_keeps_y_only_when_a_relu_was_fused():
    from dnnkit.autograd import GRADIENTS
    reads = GRADIENTS["conv2d"].reads_out
    assert reads({"activation": "relu"}) == (0,) and reads({"activation": None}) == ()


@pytest.mark.parametrize("call,exc,words", [
    (lambda x, w: dnnkit.conv2d(x, w, activation="tanh"), ValueError,
     ["conv2d", "activation", "relu", "tanh"]),
    (lambda x, w: dnnkit.conv3d(x[..., None], w[..., None], activation=1), ValueError,
     ["conv3d", "activation", "1"]),
])
def test_bad_activation_names_op_and_value(call, exc, words):
    x, w = np.ones((1, 2, 3, 3), np.float32), np.ones((2, 2, 1, 1), np.float32)
    with pytest.raises(exc) as ei:
        call(x, w)
    for word in words:
        assert word in str(ei.value)


@pytest.mark.parametrize("op", ["conv2d", "conv3d"])
def test_every_implementation_takes_every_checked_argument(op):
    """The dispatcher calls each backend's function, ``supports`` and ``bind`` with the checked
    arguments' fields in order (the cuDNN ones run only on a GPU: this checks them anywhere)."""
    import inspect
    from dnnkit.registry import REGISTRY
    fields = conv_args.ConvForwardArgs._fields
    assert fields[-1] == "activation"
    for impl in REGISTRY[op].values():
        for what in ("fn", "supports", "bind"):
            f = getattr(impl, what)
            if f is not None:
                inspect.signature(f).bind(*fields)


def test_epilogue_bits_agree_with_the_kernels():
    from dnnkit.kernels import common
    from dnnkit.ops import gemm
    assert (gemm.EPI_BIAS, gemm.EPI_RELU) == (common.EPI_BIAS, common.EPI_RELU)
    assert gemm.epilogue(True, True) == 3 and gemm.epilogue(False, False) == 0
