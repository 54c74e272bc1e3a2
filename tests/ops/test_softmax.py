import numpy as np
import pytest

import dnnkit
from dnnkit import reference
from tests.conftest import DTYPES, REL_TOL, backend_params

SHAPES = [(3, 7), (2, 3, 4, 5), (1, 6, 1, 1), (2, 1, 3, 3)]
ALGOS = ["accurate", "fast", "log"]
MODES = ["channel", "instance"]


def _softmax_tol(dtype, algo):
    # log-softmax values near 0 make max|ref| small, so relative error is a little larger.
    return REL_TOL[dtype] * (4 if algo == "log" else 1) * (2 if dtype == "float32" else 1)


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("algo", ALGOS)
def test_forward_and_backward_match_float64(rng, algo, mode, shape, dtype, backend):
    x = (rng.standard_normal(shape) * 2).astype(dtype)
    with dnnkit.trace() as t:
        y = dnnkit.softmax(x, algo, mode, backend=backend)
    assert [(e.op, e.backend, e.algo, e.shapes, e.dtype) for e in t] == \
        [("softmax", backend, algo, (shape,), dtype)]
    got = y.copy_to_host()
    ref = reference.softmax(x.astype(np.float64), algo, mode)
    assert reference.rel_error(got, ref) <= _softmax_tol(dtype, algo)

    dy = rng.standard_normal(shape).astype(dtype)
    dx = dnnkit.softmax_backward(got, dy, algo, mode, backend=backend).copy_to_host()
    ref_dx = reference.softmax_backward(got.astype(np.float64), dy.astype(np.float64), algo, mode)
    # With C == 1 the exact gradient is 0 and only rounding is left, so measure the error
    # against the gradient's natural scale, max|dy|, when max|ref| is smaller.
    assert not np.isnan(dx).any()
    err = np.abs(dx - ref_dx).max() / max(np.abs(ref_dx).max(), np.abs(dy).max())
    assert err <= 4 * _softmax_tol(dtype, algo)


@pytest.mark.parametrize("algo", ["accurate", "log"])
@pytest.mark.parametrize("mode", MODES)
def test_reference_gradient_is_the_jacobian(rng, algo, mode):
    """softmax_backward's float64 reference equals J^T dy from finite differences."""
    x = rng.standard_normal((2, 3, 2, 2))
    dy = rng.standard_normal(x.shape)
    y = reference.softmax(x, algo, mode)
    analytic = reference.softmax_backward(y, dy, algo, mode)
    h, fd = 1e-6, np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        e = np.zeros_like(x)
        e[idx] = h
        fd[idx] = ((reference.softmax(x + e, algo, mode) - reference.softmax(x - e, algo, mode))
                   * dy).sum() / (2 * h)
    assert np.allclose(analytic, fd, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("c", [1, 1025])
def test_row_lengths(rng, c, backend):
    x = rng.standard_normal((2, c)).astype(np.float32)
    y = dnnkit.softmax(x, backend=backend).copy_to_host()
    assert reference.rel_error(y, reference.softmax(x.astype(np.float64))) <= 4e-6
    assert np.allclose(y.sum(axis=1), 1.0, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("algo", ["accurate", "log"])
def test_row_of_66000(rng, algo, backend):
    x = rng.standard_normal((1, 66000)).astype(np.float32) * 4
    y = dnnkit.softmax(x, algo, backend=backend).copy_to_host()
    ref = reference.softmax(x.astype(np.float64), algo)
    assert reference.rel_error(y, ref) <= 1e-5


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("algo", ["accurate", "log"])
@pytest.mark.parametrize("mode", MODES)
def test_huge_logits_do_not_overflow(rng, algo, mode, backend):
    x = (rng.standard_normal((2, 4, 2, 3)) * 1e4).astype(np.float32)
    x[0, 0, 0, 0] = 3e38
    y = dnnkit.softmax(x, algo, mode, backend=backend).copy_to_host()
    assert np.isfinite(y).all()
    ref = reference.softmax(x.astype(np.float64), algo, mode)
    assert reference.rel_error(y, ref) <= 1e-6


@pytest.mark.parametrize("backend", backend_params())
def test_nan_in_a_row_poisons_only_that_row(backend):
    x = np.arange(12, dtype=np.float32).reshape(3, 4) / 7
    x[1, 2] = np.nan
    y = dnnkit.softmax(x, backend=backend).copy_to_host()
    assert np.isnan(y[1]).all() and np.isfinite(y[[0, 2]]).all()


def test_log_softmax_is_softmax_log(rng):
    x = rng.standard_normal((2, 3, 2, 2)).astype(np.float32)
    a = dnnkit.log_softmax(x, "instance").copy_to_host()
    b = dnnkit.softmax(x, "log", "instance").copy_to_host()
    assert np.array_equal(a, b)


@pytest.mark.parametrize("call,exc,words", [
    (lambda x: dnnkit.softmax(x, "exact"), ValueError, ["softmax", "algo", "exact", "accurate"]),
    (lambda x: dnnkit.softmax(x, mode="spatial"), ValueError, ["mode", "spatial", "channel"]),
    (lambda x: dnnkit.softmax(x[0]), ValueError, ["softmax", "2-D or 4-D", "(3, 4, 5)"]),
    (lambda x: dnnkit.softmax(x[None]), ValueError, ["(1, 2, 3, 4, 5)"]),
    (lambda x: dnnkit.softmax_backward(x, x[:1]), ValueError, ["dy", "(1, 3, 4, 5)"]),
    (lambda x: dnnkit.softmax(x.astype(np.int64)), TypeError, ["softmax", "int64"]),
])
def test_bad_arguments_name_op_and_values(call, exc, words):
    x = np.ones((2, 3, 4, 5), np.float32)
    with pytest.raises(exc) as ei:
        call(x)
    for w in words:
        assert w in str(ei.value)


def test_empty_batch():
    y = dnnkit.softmax(np.zeros((0, 5), np.float32))
    assert y.shape == (0, 5)


def test_cudnn_view_uses_instance_mode_when_spatial_size_is_one():
    """(N, C) and (N, C, 1, 1) go to cuDNN in instance mode (the same function; cuDNN's
    channel-mode backward is 250x slower there); real spatial maps keep the mode asked for."""
    from dnnkit.ops.softmax import _dims4
    assert _dims4((8, 4), "channel") == ((8, 4, 1, 1), "instance")
    assert _dims4((8, 4, 1, 1), "channel") == ((8, 4, 1, 1), "instance")
    assert _dims4((8, 4, 3, 1), "channel") == ((8, 4, 3, 1), "channel")
    assert _dims4((8, 4, 2, 2), "instance") == ((8, 4, 2, 2), "instance")
