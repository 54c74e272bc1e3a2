"""Softmax and log-softmax of 3-D and 5-D inputs (cudnn.torch's VolumetricSoftMax is the channel
mode of 5-D): forward and backward of both modes on both backends against a float64 NumPy
computation written here along the axes (independent of reference/'s (N, C, S) view), the
gradient rule, and cuDNN's folded 4-D view."""

import numpy as np
import pytest

import dnnkit
from dnnkit.ops.softmax import dims4
from tests.conftest import DTYPES, REL_TOL, backend_params

SHAPES = [(2, 3, 2, 3, 4), (1, 5, 1, 1, 7), (2, 4, 6)]


def _axes(x, mode):
    return (1,) if mode == "channel" else tuple(range(1, x.ndim))


def _softmax64(x, algo, mode):
    x = x.astype(np.float64)
    ax = _axes(x, mode)
    z = x - x.max(axis=ax, keepdims=True)
    lse = np.log(np.exp(z).sum(axis=ax, keepdims=True))
    return z - lse if algo == "log" else np.exp(z - lse)


def _backward64(y, dy, algo, mode):
    y, dy = y.astype(np.float64), dy.astype(np.float64)
    ax = _axes(y, mode)
    if algo == "log":
        return dy - np.exp(y) * dy.sum(axis=ax, keepdims=True)
    return y * (dy - (dy * y).sum(axis=ax, keepdims=True))


def _rel(got, ref):
    return np.abs(got.astype(np.float64) - ref).max() / max(np.abs(ref).max(), 1e-30)


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("algo", ["accurate", "log"])
@pytest.mark.parametrize("mode", ["channel", "instance"])
@pytest.mark.parametrize("shape", SHAPES)
def test_forward_and_backward_match_float64(rng, shape, mode, algo, dtype, backend):
    x = (rng.standard_normal(shape) * 2).astype(dtype)
    with dnnkit.trace() as t:
        y = dnnkit.softmax(x, algo, mode, backend=backend).copy_to_host()
    assert t.backends() == [backend]
    assert y.shape == shape and y.dtype == np.dtype(dtype)
    assert _rel(y, _softmax64(x, algo, mode)) <= 2 * REL_TOL[dtype]
    dy = rng.standard_normal(shape).astype(dtype)
    dx = dnnkit.softmax_backward(y, dy, algo, mode, backend=backend).copy_to_host()
    assert _rel(dx, _backward64(y, dy, algo, mode)) <= 4 * REL_TOL[dtype]


def test_fast_algo_of_5d(rng):
    x = rng.standard_normal((2, 3, 2, 2, 2)).astype(np.float32)
    y = dnnkit.softmax(x, "fast", "channel", backend="numba").copy_to_host()
    assert _rel(y, _softmax64(x, "accurate", "channel")) <= 2 * REL_TOL["float32"]


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("mode", ["channel", "instance"])
def test_gradient_rule_of_5d_log_softmax(rng, mode, backend):
    """d/dx of sum(w * log_softmax(x)) through autograd equals the float64 formula."""
    shape = (2, 3, 2, 2, 3)
    x = dnnkit.tensor(rng.standard_normal(shape), requires_grad=True)
    w = rng.standard_normal(shape)
    y = dnnkit.log_softmax(x, mode, backend=backend)
    (y * dnnkit.tensor(w)).sum().backward()
    ref = _backward64(_softmax64(x.numpy(), "log", mode), w, "log", mode)
    np.testing.assert_allclose(x.grad.numpy(), ref, rtol=1e-10, atol=1e-12)


def test_cudnn_view_folds_depth_into_height():
    """cuDNN takes 4-D descriptors: a 5-D (N, C, D, H, W) is described as (N, C, D*H, W) and
    3-D as (N, C, L, 1); channel mode stays channel mode unless one position is left."""
    assert dims4((2, 3, 4, 5, 6), "channel") == ((2, 3, 20, 6), "channel")
    assert dims4((2, 3, 7), "channel") == ((2, 3, 7, 1), "channel")
    assert dims4((2, 3, 1, 1, 1), "channel") == ((2, 3, 1, 1), "instance")
    assert dims4((2, 3, 4, 5), "instance") == ((2, 3, 4, 5), "instance")


def test_nn_softmax_accepts_5d(rng):
    x = rng.standard_normal((2, 3, 2, 2, 2)).astype(np.float32)
    y = dnnkit.nn.Softmax()(x).numpy()
    assert _rel(y, _softmax64(x, "accurate", "channel")) <= 2 * REL_TOL["float32"]
    y = dnnkit.nn.LogSoftmax(mode="instance")(x).numpy()
    assert _rel(y, _softmax64(x, "log", "instance")) <= 2 * REL_TOL["float32"]


def test_1d_and_6d_are_refused():
    with pytest.raises(ValueError, match=r"softmax: x must be 2-D or 3-D or 4-D or 5-D; got "
                                         r"shape \(1, 1, 1, 1, 1, 2\)"):
        dnnkit.softmax(np.ones((1, 1, 1, 1, 1, 2), np.float32))
