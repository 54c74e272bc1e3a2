"""sum, mean, sum_to, broadcast_to, mean_backward: forward against float64 NumPy on both
backends, the two-pass sum, determinism, gradients against finite differences, bad input."""

import numpy as np
import pytest

import dnnkit
from dnnkit import reference
from dnnkit.ops import reduce
from dnnkit.registry import PREPARE, REGISTRY
from tests.conftest import DTYPES, REL_TOL, backend_params
from tests.ops.test_arith import autograd_gradients, fd_gradients

AXES = [None, 0, -1, (0, 2), (1, 3), (0, 2, 3), ()]


def _input(rng, shape, dtype):
    # mean 1: sums far from 0, so that the relative error means something
    return (rng.standard_normal(shape) + 1.0).astype(dtype)


@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("axis", AXES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", backend_params())
def test_sum_and_mean_match_float64(rng, backend, dtype, axis, keepdims):
    x = _input(rng, (2, 3, 4, 5), dtype)
    ref64 = x.astype(np.float64)
    for op, fn in (("sum", np.sum), ("mean", np.mean)):
        with dnnkit.trace() as t:
            y = getattr(dnnkit, op)(x, axis, keepdims, backend=backend)
        assert t.backends() == [backend]
        got, ref = y.copy_to_host(), fn(ref64, axis=axis, keepdims=keepdims)
        assert got.dtype == np.dtype(dtype) and got.shape == np.shape(ref), op
        assert reference.rel_error(got, ref) <= REL_TOL[dtype], op


@pytest.mark.parametrize("backend", backend_params())
def test_sum_of_one_dimensional_and_zero_dimensional(rng, backend):
    v = _input(rng, (7,), np.float32)
    assert np.isclose(dnnkit.sum(v, backend=backend).copy_to_host(), v.sum(dtype=np.float64))
    s = np.array(2.5, np.float32)
    y = dnnkit.mean(s, backend=backend)
    assert y.shape == () and y.copy_to_host() == 2.5


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_two_pass_sum(rng, monkeypatch, dtype):
    """Few outputs over many elements: partial sums in the accumulation type, then their sums
    (the simulator has one SM, so 4 parts fill it)."""
    monkeypatch.setattr(reduce, "PART_MIN", 4)
    x = _input(rng, (3, 40), dtype)
    assert reduce._parts(3, 40) > 1 and reduce._parts(1, 120) > 1
    for axis in (1, None):
        for op, fn in (("sum", np.sum), ("mean", np.mean)):
            got = getattr(dnnkit, op)(x, axis, backend="numba").copy_to_host()
            ref = fn(x.astype(np.float64), axis=axis)
            assert reference.rel_error(got, ref) <= REL_TOL[dtype], (op, axis)


def test_sum_is_deterministic(rng):
    x = rng.standard_normal((4, 33)).astype(np.float32)
    first = dnnkit.sum(x, 1, backend="numba").copy_to_host()
    for _ in range(2):
        assert np.array_equal(dnnkit.sum(x, 1, backend="numba").copy_to_host(), first)


@pytest.mark.parametrize("backend", backend_params())
def test_empty_reductions(backend):
    x = np.ones((0, 3), np.float32)
    assert np.array_equal(dnnkit.sum(x, 0, backend=backend).copy_to_host(), np.zeros(3))
    assert np.isnan(dnnkit.mean(x, 0, backend=backend).copy_to_host()).all()
    assert dnnkit.sum(x, 1, backend=backend).shape == (0,)


@pytest.mark.parametrize("target", [(3, 1), (1, 4), (4,), (1, 1), (), (2, 3, 4)], ids=str)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", backend_params())
def test_sum_to(rng, backend, dtype, target):
    x = _input(rng, (2, 3, 4), dtype)
    y = dnnkit.sum_to(x, target, backend=backend)
    lead = x.ndim - len(target)
    axes = tuple(range(lead)) + tuple(lead + k for k, n in enumerate(target)
                                      if n == 1 and x.shape[lead + k] != 1)
    ref = x.astype(np.float64).sum(axis=axes, keepdims=True).reshape(target)
    assert y.shape == target
    assert reference.rel_error(y.copy_to_host(), ref) <= REL_TOL[dtype]


def test_sum_to_own_shape_is_the_array_itself():
    from numba import cuda
    d = cuda.to_device(np.ones((2, 3), np.float32))
    assert dnnkit.sum_to(d, (2, 3)) is d


@pytest.mark.parametrize("x_shape,target", [((3, 1), (2, 3, 4)), ((4,), (2, 3, 4)),
                                             ((), (2, 3)), ((2, 3), (2, 3)),
                                             ((1, 3, 1, 1), (2, 3, 2, 2))], ids=str)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", backend_params())
def test_broadcast_to_is_exact(rng, backend, dtype, x_shape, target):
    x = rng.standard_normal(x_shape).astype(dtype)
    with dnnkit.trace() as t:
        y = dnnkit.broadcast_to(x, target, backend=backend)
    assert t.backends() == [backend]
    assert np.array_equal(y.copy_to_host(), np.broadcast_to(x, target))


@pytest.mark.parametrize("axis,keepdims", [((0, 2), False), ((0, 2), True), (None, False),
                                           (-1, True)], ids=str)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", backend_params())
def test_mean_backward(rng, backend, dtype, axis, keepdims):
    x_shape = (2, 3, 4)
    y_shape = np.mean(np.zeros(x_shape), axis=axis, keepdims=keepdims).shape
    dy = rng.standard_normal(y_shape).astype(dtype)
    dx = dnnkit.mean_backward(dy, x_shape, axis, keepdims, backend=backend).copy_to_host()
    ax = tuple(range(3)) if axis is None else (axis if isinstance(axis, tuple) else (axis,))
    kept = tuple(1 if k in ax or k - 3 in ax else n for k, n in enumerate(x_shape))
    count = np.prod(x_shape) // np.prod(kept)
    ref = np.broadcast_to(dy.astype(np.float64).reshape(kept) / count, x_shape)
    assert reference.rel_error(dx, ref) <= REL_TOL[dtype]


def _reason(op, *args):
    return REGISTRY[op]["cudnn"].supports(*PREPARE[op](*args))


def test_cudnn_reasons():
    x = np.ones((2, 3, 4), np.float32)
    assert _reason("sum", x, (0, 2)) is None
    assert _reason("broadcast_to", np.ones((3, 1), np.float32), (2, 3, 4)) is None
    alternating = np.ones((1, 2) * 3, np.float32)       # 6 dims that cannot merge
    assert "at most 5" in _reason("broadcast_to", alternating, (2, 2) * 3)
    many = np.ones((2, 2) * 5, np.float32)              # 10 alternating reduced/kept dims
    assert "at most 8" in _reason("sum", many, (0, 2, 4, 6, 8))


# ---------------------------------------------------------------- gradients

@pytest.mark.parametrize("axis,keepdims", [(None, False), ((0, 2), False), (1, True),
                                           ((), False)], ids=str)
@pytest.mark.parametrize("backend", backend_params())
def test_sum_and_mean_gradients_are_finite_differences(rng, backend, axis, keepdims):
    x = rng.standard_normal((2, 3, 2))
    for op, fn in (("sum", np.sum), ("mean", np.mean)):
        dy = np.asarray(rng.standard_normal(np.shape(fn(x, axis=axis, keepdims=keepdims))))
        got, = autograd_gradients(
            lambda t, o=op: getattr(dnnkit, o)(t, axis, keepdims, backend=backend), [x], dy)
        fd, = fd_gradients(lambda v, f=fn: f(v, axis=axis, keepdims=keepdims), [x], dy)
        assert np.allclose(got, fd, rtol=1e-6, atol=1e-7), op


@pytest.mark.parametrize("backend", backend_params())
def test_sum_to_and_broadcast_to_gradients(rng, backend):
    x = rng.standard_normal((2, 3, 2))
    dy = rng.standard_normal((3, 1))
    got, = autograd_gradients(lambda t: dnnkit.sum_to(t, (3, 1), backend=backend), [x], dy)
    assert np.allclose(got, np.broadcast_to(dy, x.shape))
    v = rng.standard_normal((3, 1))
    dy = rng.standard_normal((2, 3, 4))
    got, = autograd_gradients(lambda t: dnnkit.broadcast_to(t, (2, 3, 4), backend=backend),
                              [v], dy)
    assert np.allclose(got, dy.sum(axis=(0, 2))[:, None])


def test_tensor_methods():
    x = dnnkit.tensor(np.arange(6.0).reshape(2, 3), requires_grad=True)
    y = x.mean(axis=1) * x.sum(axis=0, keepdims=True).reshape(3)[:2]
    y.sum().backward()
    assert x.grad.shape == (2, 3)


@pytest.mark.parametrize("call,exc,words", [
    (lambda x: dnnkit.sum(x, 3), ValueError, ["sum", "axis 3", "2 dimension"]),
    (lambda x: dnnkit.mean(x, (0, -2)), ValueError, ["mean", "repeats"]),
    (lambda x: dnnkit.sum(x, 1.5), TypeError, ["sum", "axis", "1.5"]),
    (lambda x: dnnkit.sum_to(x, (2, 3)), ValueError, ["sum_to", "(2, 3)", "(3, 4)"]),
    (lambda x: dnnkit.sum_to(x, (5, 3, 4)), ValueError, ["sum_to", "(5, 3, 4)"]),
    (lambda x: dnnkit.broadcast_to(x, (2, 4)), ValueError, ["broadcast_to", "(3, 4)", "(2, 4)"]),
    (lambda x: dnnkit.broadcast_to(x, (4,)), ValueError, ["broadcast_to", "(4,)"]),
    (lambda x: dnnkit.broadcast_to(x, "big"), TypeError, ["broadcast_to", "shape"]),
    (lambda x: dnnkit.mean_backward(x, (3, 5), 1), ValueError, ["mean_backward", "(3, 4)"]),
    (lambda x: dnnkit.sum(x.astype(np.int64)), TypeError, ["sum", "int64"]),
])
def test_bad_arguments_name_op_and_values(call, exc, words):
    x = np.ones((3, 4), np.float32)
    with pytest.raises(exc) as ei:
        call(x)
    for w in words:
        assert w in str(ei.value)


def test_kernel_constants_match():
    from dnnkit.kernels import reduce as k
    from dnnkit.ops import broadcasting
    assert k.MAXDIM == broadcasting.MAXDIM
    args = PREPARE["sum"](np.ones((2, 3, 4), np.float32), (0, 2))
    assert len(args.geo) == k.GEO_LEN
    assert args.geo[:2] == (1, 2) and args.geo[k.K_SHAPE] == 3 and args.geo[k.K_STRIDES] == 4
    assert args.geo[k.R_SHAPE:k.R_SHAPE + 2] == (2, 4)
    assert args.geo[k.R_STRIDES:k.R_STRIDES + 2] == (12, 1)


# ---------------------------------------------------------------- the cuDNN path, faked

def test_cudnn_path_on_fakes(monkeypatch, rng):
    """The ops' side of cudnnReduceTensor and cudnnAddTensor (merged dims, alpha = 1/count)
    against cuDNN's documented semantics (tests/ops/optensor_fakes.py)."""
    from tests.ops.optensor_fakes import fake_optensor
    calls = fake_optensor(monkeypatch)
    x = rng.standard_normal((2, 3, 4, 5))
    for axis in AXES:
        for keepdims in (False, True):
            for op, fn in (("sum", np.sum), ("mean", np.mean)):
                got = getattr(dnnkit, op)(x, axis, keepdims, backend="cudnn").copy_to_host()
                assert np.allclose(got, fn(x, axis=axis, keepdims=keepdims), rtol=1e-13), \
                    (op, axis, keepdims)
    # merged dims: axes (0, 2, 3) of (2, 3, 4, 5) reduce (2, 3, 20); a full sum is flat
    assert ("reduce", "add", (2, 3, 20)) in calls and ("reduce", "avg", (120,)) in calls
    got = dnnkit.sum_to(x, (3, 1, 1), backend="cudnn").copy_to_host()
    assert np.allclose(got, x.sum(axis=(0, 2, 3)).reshape(3, 1, 1))
    got = dnnkit.broadcast_to(x[0, :, :1, :1], (2, 3, 4, 5), backend="cudnn").copy_to_host()
    assert np.array_equal(got, np.broadcast_to(x[0, :, :1, :1], (2, 3, 4, 5)))
    dy = rng.standard_normal(3)
    got = dnnkit.mean_backward(dy, (2, 3, 4), (0, 2), backend="cudnn").copy_to_host()
    assert np.allclose(got, np.broadcast_to(dy.reshape(1, 3, 1) / 8, (2, 3, 4)))
    empty = dnnkit.mean(np.ones((0, 3)), 0, backend="cudnn").copy_to_host()
    assert np.isnan(empty).all()
