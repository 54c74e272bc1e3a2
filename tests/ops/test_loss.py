"""cross_entropy, nll_loss and mse_loss: forward and backward against float64 NumPy (every
reduction, dtype and backend), 0-d device results with no read back to the host, ignored and
invalid targets, gradients through dnnkit.Tensor against finite differences, bad input."""

import numpy as np
import pytest

import dnnkit
from dnnkit import arrays, reference
from dnnkit.device import numba_cuda
from tests.conftest import DTYPES, REL_TOL, backend_params

SHAPES = [(4, 5), (2, 3, 2, 2), (2, 3, 4)]     # (N, C) and spatial forms
REDUCTIONS = ["mean", "sum", "none"]
IGNORE = -100


def _log_softmax(x):
    m = x.max(axis=1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=1, keepdims=True))


def _targets(rng, shape, ignore_first=True):
    t = rng.integers(0, shape[1], (shape[0],) + shape[2:])
    if ignore_first:
        t.flat[0] = IGNORE
    return t


def _ref_nll(lp, t, reduction):
    """(loss, gradient wrt lp of sum(dy * loss) for dy = 1) in float64."""
    keep = t != IGNORE
    tt = np.where(keep, t, 0)
    per = -np.take_along_axis(lp, tt[:, None], 1)[:, 0] * keep
    onehot = np.zeros_like(lp)
    np.put_along_axis(onehot, tt[:, None], 1.0, 1)
    onehot *= keep[:, None]
    if reduction == "none":
        return per, onehot
    if reduction == "sum":
        return per.sum(), onehot
    return per.sum() / keep.sum(), onehot / keep.sum()


def _dy(rng, reduction, t_shape, dtype):
    return (np.asarray(rng.standard_normal()) if reduction != "none"
            else rng.standard_normal(t_shape)).astype(dtype)


def _scale(dy, reduction):
    """dy broadcast against the per-class gradient (N, C, ...)."""
    return dy.astype(np.float64) if reduction != "none" else dy.astype(np.float64)[:, None]


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("shape", SHAPES)
def test_cross_entropy_matches_float64(rng, shape, reduction, dtype, backend):
    x = (rng.standard_normal(shape) * 2).astype(dtype)
    t = _targets(rng, shape)
    with dnnkit.trace() as tr:
        y = dnnkit.cross_entropy(x, t, reduction, backend=backend)
    assert tr[-1].op == "cross_entropy" and tr[-1].backend == backend
    assert arrays.is_device_array(y) and y.dtype == np.dtype(dtype)
    lp = _log_softmax(x.astype(np.float64))
    ref, onehot = _ref_nll(lp, t, reduction)
    assert y.shape == np.shape(ref)
    assert reference.rel_error(y.copy_to_host(), ref) <= 2 * REL_TOL[dtype]

    dy = _dy(rng, reduction, t.shape, dtype)
    dx = dnnkit.cross_entropy_backward(x, t, dy, reduction, backend=backend).copy_to_host()
    keep = (t != IGNORE)[:, None]
    softmax = np.exp(lp) * keep
    if reduction == "mean":
        softmax /= keep.sum()
    ref_dx = _scale(dy, reduction) * (softmax - onehot)
    assert dx.shape == shape and dx.dtype == np.dtype(dtype)
    assert reference.rel_error(dx, ref_dx) <= 2 * REL_TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("shape", SHAPES)
def test_nll_loss_matches_float64(rng, shape, reduction, dtype):
    lp = _log_softmax(rng.standard_normal(shape)).astype(dtype)
    t = _targets(rng, shape)
    y = dnnkit.nll_loss(lp, t, reduction)
    ref, onehot = _ref_nll(lp.astype(np.float64), t, reduction)
    assert y.shape == np.shape(ref)
    assert reference.rel_error(y.copy_to_host(), ref) <= REL_TOL[dtype]
    dy = _dy(rng, reduction, t.shape, dtype)
    dlp = dnnkit.nll_loss_backward(lp, t, dy, reduction).copy_to_host()
    assert reference.rel_error(dlp, -_scale(dy, reduction) * onehot) <= REL_TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("shape", [(7,), (3, 4, 5)])
def test_mse_loss_matches_float64(rng, shape, reduction, dtype):
    x, t = (rng.standard_normal(shape).astype(dtype) for _ in range(2))
    y = dnnkit.mse_loss(x, t, reduction)
    d = x.astype(np.float64) - t.astype(np.float64)
    ref = {"mean": (d * d).mean(), "sum": (d * d).sum(), "none": d * d}[reduction]
    assert y.shape == np.shape(ref) and y.dtype == np.dtype(dtype)
    assert reference.rel_error(y.copy_to_host(), ref) <= REL_TOL[dtype]
    dy = (np.asarray(rng.standard_normal()) if reduction != "none"
          else rng.standard_normal(shape)).astype(dtype)
    g = dy.astype(np.float64) * (2.0 / x.size if reduction == "mean" else 2.0)
    dx = dnnkit.mse_loss_backward(x, t, dy, reduction).copy_to_host()
    assert reference.rel_error(dx, g * d) <= REL_TOL[dtype]


@pytest.mark.parametrize("backend", backend_params())
def test_losses_never_read_back_to_the_host(rng, backend, monkeypatch):
    """Forward and backward queue their work and return device arrays: a copy to the host or
    a synchronisation inside them fails the test."""
    cuda = numba_cuda()
    x = cuda.to_device(rng.standard_normal((4, 5)).astype(np.float32))
    t = cuda.to_device(rng.integers(0, 5, 4))
    dy = cuda.to_device(np.ones((), np.float32))
    xm = cuda.to_device(rng.standard_normal((4, 5)).astype(np.float32))

    def forbidden(*a, **k):
        raise AssertionError("the loss read a device value back to the host")
    monkeypatch.setattr(type(x), "copy_to_host", forbidden)
    monkeypatch.setattr(cuda, "synchronize", forbidden)
    outs = [dnnkit.cross_entropy(x, t, backend=backend),
            dnnkit.cross_entropy_backward(x, t, dy, backend=backend),
            dnnkit.nll_loss(x, t), dnnkit.nll_loss_backward(x, t, dy),
            dnnkit.mse_loss(x, xm), dnnkit.mse_loss_backward(x, xm, dy)]
    monkeypatch.undo()
    assert outs[0].shape == () and outs[4].shape == ()
    assert all(np.isfinite(o.copy_to_host()).all() for o in outs)


def test_every_position_ignored_gives_nan_mean_and_zero_gradient():
    x = np.ones((3, 4), np.float32)
    t = np.full(3, IGNORE)
    assert np.isnan(dnnkit.cross_entropy(x, t).copy_to_host())
    assert dnnkit.cross_entropy(x, t, "sum").copy_to_host() == 0
    dx = dnnkit.cross_entropy_backward(x, t, np.ones((), np.float32)).copy_to_host()
    assert np.array_equal(dx, np.zeros((3, 4)))


def test_custom_ignore_index(rng):
    x = rng.standard_normal((4, 3))
    t = np.array([0, 2, 1, 2])
    y = dnnkit.cross_entropy(x, t, "none", ignore_index=2).copy_to_host()
    assert y[1] == 0 and y[3] == 0 and y[0] > 0 and y[2] > 0


@pytest.mark.parametrize("backend", backend_params())
def test_invalid_device_target_gives_nan_not_an_error(backend):
    """A device target cannot be checked without a read back: the bad position's loss and
    gradient row are NaN, the others are untouched."""
    cuda = numba_cuda()
    x = np.zeros((3, 4), np.float32)
    t = cuda.to_device(np.array([1, 7, -3]))
    assert np.isnan(dnnkit.cross_entropy(x, t, backend=backend).copy_to_host())
    per = dnnkit.cross_entropy(x, t, "none", backend=backend).copy_to_host()
    assert np.isclose(per[0], np.log(4)) and np.isnan(per[1:]).all()
    dx = dnnkit.cross_entropy_backward(x, t, np.ones((), np.float32),
                                       backend=backend).copy_to_host()
    assert np.isfinite(dx[0]).all() and np.isnan(dx[1:]).all()


def test_int32_device_targets(rng):
    cuda = numba_cuda()
    x = rng.standard_normal((5, 3))
    t = rng.integers(0, 3, 5)
    a = dnnkit.cross_entropy(x, cuda.to_device(t.astype(np.int32))).copy_to_host()
    b = dnnkit.cross_entropy(x, t).copy_to_host()
    assert a == b


def test_reductions_have_no_cudnn_but_cross_entropy_does():
    x, t = np.zeros((2, 3), np.float32), np.array([0, 1])
    assert dnnkit.select_backend("nll_loss", x, t, backend="cudnn") == "numba"
    assert dnnkit.select_backend("mse_loss", x, x, backend="cudnn") == "numba"
    assert dnnkit.select_backend("cross_entropy", x, t, backend="numba") == "numba"


# ---------------------------------------------------------------- gradients (autograd)

def _fd(f, v, h=1e-6):
    """Central differences of the float64 NumPy loss f (checked against the ops above)."""
    g = np.zeros_like(v)
    for i in np.ndindex(v.shape):
        p, m = v.copy(), v.copy()
        p[i] += h
        m[i] -= h
        g[i] = (f(p) - f(m)) / (2 * h)
    return g


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("shape", [(3, 4), (2, 3, 2)])
def test_cross_entropy_gradient_is_the_finite_difference(rng, shape, reduction):
    x = rng.standard_normal(shape)
    t = _targets(rng, shape)
    logits = dnnkit.tensor(x, requires_grad=True)
    loss = dnnkit.cross_entropy(logits, t, reduction, backend="numba")
    assert loss.shape == ()
    loss.backward()

    def f(v):
        return _ref_nll(_log_softmax(v), t, reduction)[0]
    assert np.allclose(logits.grad.numpy(), _fd(f, x), rtol=1e-6, atol=1e-8)


def test_nll_and_mse_gradients_are_the_finite_differences(rng):
    lp, t = _log_softmax(rng.standard_normal((3, 4))), _targets(rng, (3, 4))
    tlp = dnnkit.tensor(lp, requires_grad=True)
    dnnkit.nll_loss(tlp, t).backward()
    assert np.allclose(tlp.grad.numpy(),
                       _fd(lambda v: _ref_nll(v, t, "mean")[0], lp),
                       rtol=1e-6, atol=1e-8)
    x, y = rng.standard_normal((2, 3)), rng.standard_normal((2, 3))
    tx, ty = dnnkit.tensor(x, requires_grad=True), dnnkit.tensor(y, requires_grad=True)
    dnnkit.mse_loss(tx, ty).backward()
    assert np.allclose(tx.grad.numpy(),
                       _fd(lambda v: np.mean((v - y) ** 2), x), rtol=1e-6)
    assert np.allclose(ty.grad.numpy(), -tx.grad.numpy())


# ---------------------------------------------------------------- bad input

@pytest.mark.parametrize("op,call,exc,words", [
    ("cross_entropy", lambda: dnnkit.cross_entropy(np.ones((2, 3)), [0, 1], "avg"),
     ValueError, "reduction"),
    ("cross_entropy", lambda: dnnkit.cross_entropy(np.ones((2, 3)), [0, 3]), ValueError,
     "got 3 at (1,)"),
    ("cross_entropy", lambda: dnnkit.cross_entropy(np.ones((2, 3)), [0, 1, 2]), ValueError,
     "target shape"),
    ("cross_entropy", lambda: dnnkit.cross_entropy(np.ones((2, 3)), [0.0, 1.0]), TypeError,
     "integer"),
    ("cross_entropy", lambda: dnnkit.cross_entropy(np.ones(3), [0]), ValueError, "(N, C)"),
    ("cross_entropy", lambda: dnnkit.cross_entropy(np.ones((2, 3)), [0, 1], ignore_index=1.5),
     TypeError, "ignore_index"),
    ("cross_entropy_backward", lambda: dnnkit.cross_entropy_backward(
        np.ones((2, 3)), [0, 1], np.ones(2)), ValueError, "one element"),
    ("cross_entropy_backward", lambda: dnnkit.cross_entropy_backward(
        np.ones((2, 3)), [0, 1], np.ones(3), "none"), ValueError, "reduction='none'"),
    ("nll_loss_backward", lambda: dnnkit.nll_loss_backward(
        np.ones((2, 3)), [0, 1], np.ones((), np.float32)), TypeError, "dtype"),
    ("mse_loss", lambda: dnnkit.mse_loss(np.ones(3), np.ones(4)), ValueError, "target shape"),
    ("mse_loss", lambda: dnnkit.mse_loss(np.ones(3), numba_cuda().to_device(
        np.ones(3, np.float32))), TypeError, "dtype"),
])
def test_bad_input_names_the_op(op, call, exc, words):
    with pytest.raises(exc) as e:
        call()
    assert str(e.value).startswith(op + ":") and words in str(e.value)
