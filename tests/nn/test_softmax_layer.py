"""nn.Softmax / nn.LogSoftmax constructor options: ``algo`` ("fast", "accurate", "log": what
dnnkit.softmax offers) and PyTorch's ``dim``, against float64 references, with their checks."""

import numpy as np
import pytest

import dnnkit
from dnnkit import nn
from tests.conftest import REL_TOL, backend_params
from tests.nn.gradcheck import directional_check, weighted_sum


def _reference(x, algo, mode):
    x = x.astype(np.float64)
    axes = (1,) if mode == "channel" else tuple(range(1, x.ndim))
    z = x - x.max(axis=axes, keepdims=True)
    lse = np.log(np.exp(z).sum(axis=axes, keepdims=True))
    return z - lse if algo == "log" else np.exp(z - lse)


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("shape,mode", [((2, 5), "channel"), ((2, 3, 2, 2), "channel"),
                                        ((2, 3, 2, 2), "instance")])
@pytest.mark.parametrize("algo", ["fast", "accurate", "log"])
def test_algo_reaches_the_op(rng, algo, shape, mode, dtype, backend):
    m = nn.Softmax(mode, algo=algo)
    m.backend = backend
    x = rng.standard_normal(shape).astype(dtype)
    with dnnkit.no_grad(), dnnkit.trace() as t:
        y = m(x).numpy()
    want = _reference(x, algo, mode)
    err = np.abs(y.astype(np.float64) - want).max() / np.abs(want).max()
    assert err <= REL_TOL[dtype], err
    assert t[0].algo == algo


@pytest.mark.filterwarnings("ignore::RuntimeWarning")   # the simulator's overflow, on purpose
def test_fast_does_not_subtract_the_maximum(rng):
    """The option is really the op's: "fast" overflows where "accurate" does not (float32
    exp overflows above ~88)."""
    x = np.array([[100.0, 99.0, 0.0]], np.float32)
    with dnnkit.no_grad():
        fast = nn.Softmax(algo="fast")(x).numpy()
        accurate = nn.Softmax(algo="accurate")(x).numpy()
        default = nn.Softmax()(x).numpy()
    assert not np.isfinite(fast).all()
    np.testing.assert_allclose(accurate, _reference(x, "accurate", "channel"), rtol=1e-6,
                               atol=1e-30)             # exp(-100): a float32 subnormal
    np.testing.assert_array_equal(default, accurate)


@pytest.mark.parametrize("algo", ["fast", "accurate", "log"])
def test_gradients_match_finite_differences(rng, algo):
    m = nn.Softmax("channel", algo=algo)
    x = dnnkit.tensor(rng.standard_normal((2, 3, 1, 2)), requires_grad=True)
    r = rng.standard_normal((2, 3, 1, 2))
    directional_check(lambda: weighted_sum(m(x), r), [x], rng)


def test_log_softmax_is_softmax_with_algo_log(rng):
    x = rng.standard_normal((2, 4))
    with dnnkit.no_grad():
        np.testing.assert_array_equal(nn.LogSoftmax()(x).numpy(),
                                      nn.Softmax(algo="log")(x).numpy())
    assert nn.LogSoftmax().algo == "log"
    assert repr(nn.Softmax(algo="fast")) == "Softmax(mode='channel', algo='fast')"
    assert repr(nn.LogSoftmax(dim=1)) == "LogSoftmax(mode='channel', algo='log', dim=1)"


@pytest.mark.parametrize("dim,shape", [(1, (2, 5)), (-1, (2, 5)), (1, (2, 3, 2, 2)),
                                       (-3, (2, 3, 2, 2))])
def test_dim_is_the_channel_mode(rng, dim, shape):
    x = rng.standard_normal(shape)
    with dnnkit.no_grad():
        got = nn.Softmax(dim=dim)(x).numpy()
        got_log = nn.LogSoftmax(dim=dim)(x).numpy()
    np.testing.assert_allclose(got, _reference(x, "accurate", "channel"), rtol=1e-12)
    np.testing.assert_allclose(got_log, _reference(x, "log", "channel"), rtol=1e-12)


@pytest.mark.parametrize("make,err,words", [
    (lambda: nn.Softmax(algo="fastest"), ValueError,
     ["Softmax", "algo", "'fast' or 'accurate' or 'log'", "'fastest'"]),
    (lambda: nn.Softmax(algo=["fast"]), ValueError, ["Softmax", "algo", "['fast']"]),
    (lambda: nn.LogSoftmax(algo="accurate"), ValueError, ["LogSoftmax", "algo", "'log'",
                                                          "'accurate'"]),
    (lambda: nn.Softmax(dim=0), ValueError, ["Softmax", "dim=0", "dim 1"]),
    (lambda: nn.Softmax(dim=2), ValueError, ["Softmax", "dim=2"]),
    (lambda: nn.Softmax("instance", dim=1), ValueError, ["Softmax", "dim=1", "'instance'"]),
    (lambda: nn.Softmax(dim=1.0), TypeError, ["Softmax", "dim", "1.0"]),
    (lambda: nn.Softmax(dim=True), TypeError, ["Softmax", "dim", "True"]),
    (lambda: nn.Softmax("fast"), ValueError, ["Softmax", "mode", "'fast'"]),
])
def test_bad_options_name_the_layer_and_value(make, err, words):
    with pytest.raises(err) as ei:
        make()
    for w in words:
        assert w in str(ei.value), str(ei.value)


@pytest.mark.parametrize("dim,shape,which", [(-1, (2, 3, 2, 2), "dimension 3"),
                                             (-5, (2, 3, 2, 2), "out of range"),
                                             (-2, (2, 5), "dimension 0")])
def test_a_negative_dim_is_checked_against_the_input(dim, shape, which):
    with pytest.raises(ValueError, match=rf"Softmax: dim={dim} of a {len(shape)}-D input is "
                                         rf"{which}"):
        nn.Softmax(dim=dim)(np.zeros(shape, np.float32))
