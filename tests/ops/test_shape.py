"""reshape, concatenate, split, take_batch, take_batch_backward: exact copies on both backends,
views, gradients through autograd (lists of Tensors, pieces no gradient reached), bad input."""

import numpy as np
import pytest

import dnnkit
from dnnkit.registry import OPS, PREPARE, REGISTRY
from tests.conftest import DTYPES, backend_params
from tests.ops.test_arith import autograd_gradients


def _x(rng, shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def test_reshape_is_a_view():
    from numba import cuda
    d = cuda.to_device(np.arange(12, dtype=np.float32))
    v = dnnkit.reshape(d, (3, -1))
    assert v.shape == (3, 4)
    v[1:2].copy_to_device(np.full((1, 4), 7.0, np.float32))      # writes through to d
    assert np.array_equal(d.copy_to_host()[4:8], np.full(4, 7.0))
    assert dnnkit.reshape(d, 12).shape == (12,)
    assert dnnkit.reshape(np.ones((2, 0)), (0, 5)).shape == (0, 5)


@pytest.mark.parametrize("op", ["reshape", "take_batch"])
def test_views_compute_nothing_on_either_backend(op):
    assert "view" in OPS[op].numba_only
    with dnnkit.trace() as t:
        if op == "reshape":
            dnnkit.reshape(np.ones((2, 3), np.float32), (6,), backend="cudnn")
        else:
            dnnkit.take_batch(np.ones((2, 3), np.float32), 0, backend="cudnn")
    assert t.backends() == ["numba"] and "view" in t[0].reason


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", backend_params())
def test_concatenate_and_split_are_exact(rng, backend, dtype, axis):
    parts = [_x(rng, (2, 3, 4), dtype), _x(rng, (2, 3, 4), dtype)]
    sizes = [1, 3, 2]
    shapes = [list((2, 3, 4)) for _ in sizes]
    for s, n in zip(shapes, sizes):
        s[axis] = n
    parts = [_x(rng, tuple(s), dtype) for s in shapes]
    with dnnkit.trace() as t:
        y = dnnkit.concatenate(parts, axis, backend=backend)
    assert t.backends() == [backend]
    ref = np.concatenate(parts, axis)
    assert np.array_equal(y.copy_to_host(), ref)
    back = dnnkit.split(y, sizes, axis, backend=backend)
    assert isinstance(back, tuple) and len(back) == 3
    for got, want in zip(back, parts):
        assert np.array_equal(got.copy_to_host(), want)
    halves = dnnkit.split(ref, 2, axis, backend=backend)
    for got, want in zip(halves, np.split(ref, 2, axis)):
        assert np.array_equal(got.copy_to_host(), want)


@pytest.mark.parametrize("backend", backend_params())
def test_empty_pieces(rng, backend):
    a, b = _x(rng, (2, 0, 3)), _x(rng, (2, 4, 3))
    y = dnnkit.concatenate((a, b), 1, backend=backend)
    assert np.array_equal(y.copy_to_host(), b)
    p, q = dnnkit.split(b, [0, 4], 1, backend=backend)
    assert p.shape == (2, 0, 3) and np.array_equal(q.copy_to_host(), b)


@pytest.mark.parametrize("index", [0, -1, 2, slice(1, 3), slice(None, 2), slice(2, None),
                                   slice(3, 1)], ids=str)
def test_take_batch_is_a_view(rng, index):
    x = _x(rng, (4, 3))
    from numba import cuda
    d = cuda.to_device(x)
    v = dnnkit.take_batch(d, index)
    assert np.array_equal(v.copy_to_host(), x[index])


@pytest.mark.parametrize("index", [1, -4, slice(1, 3), slice(0, 4), slice(3, 1)], ids=str)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", backend_params())
def test_take_batch_backward(rng, backend, dtype, index):
    x_shape = (4, 2, 3)
    dy = _x(rng, np.zeros(x_shape)[index].shape, dtype)
    with dnnkit.trace() as t:
        dx = dnnkit.take_batch_backward(dy, x_shape, index, backend=backend)
    assert t.backends() == [backend]
    ref = np.zeros(x_shape, dtype)
    ref[index] = dy
    assert np.array_equal(dx.copy_to_host(), ref)


def _reason(op, *args):
    return REGISTRY[op]["cudnn"].supports(*PREPARE[op](*args))


def test_cudnn_supports_usual_sizes():
    x = np.ones((2, 3, 4), np.float32)
    assert _reason("concatenate", [x, x], 1) is None
    assert _reason("split", x, 3, 1) is None
    assert _reason("take_batch_backward", x[:1], (2, 3, 4), slice(0, 1)) is None


# ---------------------------------------------------------------- gradients

@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("backend", backend_params())
def test_concatenate_gradient_goes_to_each_tensor_in_the_list(rng, backend, axis):
    a, b = rng.standard_normal((2, 3, 2)), rng.standard_normal((2, 3, 2))
    dy = rng.standard_normal(np.concatenate([a, b], axis).shape)
    got = autograd_gradients(lambda u, v: dnnkit.concatenate([u, v], axis, backend=backend),
                             [a, b], dy)
    want = np.split(dy, 2, axis)
    assert all(np.array_equal(g, w) for g, w in zip(got, want))


def test_concatenate_of_a_tensor_and_a_constant(rng):
    a = dnnkit.tensor(rng.standard_normal((2, 3)), requires_grad=True)
    c = rng.standard_normal((1, 3))                       # a NumPy constant in the list
    y = dnnkit.concatenate((c, a))
    assert isinstance(y, dnnkit.Tensor) and y.grad_fn is not None
    y.sum().backward()
    assert np.array_equal(a.grad.numpy(), np.ones((2, 3)))
    with dnnkit.no_grad():
        assert dnnkit.concatenate([a, a]).grad_fn is None


@pytest.mark.parametrize("backend", backend_params())
def test_split_gradient_fills_unused_pieces_with_zeros(rng, backend):
    x = dnnkit.tensor(rng.standard_normal((2, 5)), requires_grad=True)
    p, q, r = dnnkit.split(x, [1, 2, 2], 1, backend=backend)
    (q * 3.0).sum().backward()                   # p and r reach nothing
    want = np.zeros((2, 5))
    want[:, 1:3] = 3.0
    assert np.array_equal(x.grad.numpy(), want)


def test_reshape_and_indexing_gradients(rng):
    x = rng.standard_normal((4, 3))
    dy = rng.standard_normal((2, 3))
    got, = autograd_gradients(lambda t: t.reshape(2, 6)[1].reshape(2, 3), [x], dy)
    want = np.zeros((4, 3))
    want[2:4] = dy
    assert np.array_equal(got, want)
    got, = autograd_gradients(lambda t: dnnkit.take_batch(t, slice(1, 3)), [x], dy)
    want = np.zeros((4, 3))
    want[1:3] = dy
    assert np.array_equal(got, want)


@pytest.mark.parametrize("call,exc,words", [
    (lambda x: dnnkit.reshape(x, (5, -1)), ValueError, ["reshape", "(3, 4)", "(5, -1)"]),
    (lambda x: dnnkit.reshape(x, (2, 7)), ValueError, ["reshape", "(2, 7)"]),
    (lambda x: dnnkit.reshape(x, (-1, -1)), ValueError, ["reshape", "-1"]),
    (lambda x: dnnkit.reshape(x, "ab"), TypeError, ["reshape", "shape"]),
    (lambda x: dnnkit.concatenate([x, x.astype(np.float64)]), TypeError,
     ["concatenate", "arrays[1]", "float64", "float32"]),
    (lambda x: dnnkit.concatenate([x, x[:, :2]], 0), ValueError,
     ["concatenate", "arrays[1]", "(3, 2)", "axis 0"]),
    (lambda x: dnnkit.concatenate([x], 2), ValueError, ["concatenate", "axis 2"]),
    (lambda x: dnnkit.concatenate([]), ValueError, ["concatenate", "at least one"]),
    (lambda x: dnnkit.concatenate(x), TypeError, ["concatenate", "list"]),
    (lambda x: dnnkit.split(x, 3, 1), ValueError, ["split", "3 sections", "4"]),
    (lambda x: dnnkit.split(x, [1, 1], 0), ValueError, ["split", "(1, 1)", "3"]),
    (lambda x: dnnkit.split(x, [1.5, 1.5], 0), TypeError, ["split", "sizes"]),
    (lambda x: dnnkit.split(x, 1, -3), ValueError, ["split", "axis -3"]),
    (lambda x: dnnkit.take_batch(x, 3), ValueError, ["take_batch", "index 3", "3"]),
    (lambda x: dnnkit.take_batch(x, slice(0, 3, 2)), ValueError, ["take_batch", "step 1"]),
    (lambda x: dnnkit.take_batch(x, 1.0), TypeError, ["take_batch", "index"]),
    (lambda x: dnnkit.take_batch_backward(x, (5, 4), slice(0, 2)), ValueError,
     ["take_batch_backward", "(3, 4)", "(2, 4)"]),
])
def test_bad_arguments_name_op_and_values(call, exc, words):
    x = np.ones((3, 4), np.float32)
    with pytest.raises(exc) as ei:
        call(x)
    for w in words:
        assert w in str(ei.value)


def test_split_is_the_op_and_the_module_keeps_its_name():
    """dnnkit.split is the op; dnnkit.ops.split stays the cuDNN-splitting module."""
    import dnnkit.ops
    assert dnnkit.split.op_name == "split"
    assert hasattr(dnnkit.ops.split, "last_pieces")


# ---------------------------------------------------------------- the cuDNN path, faked

@pytest.mark.parametrize("axis", [0, 1, -1])
def test_cudnn_path_on_fakes(monkeypatch, rng, axis):
    """The slice descriptors (dims, strides, offsets) of cudnnTransformTensor against cuDNN's
    documented semantics (tests/ops/optensor_fakes.py)."""
    from tests.ops.optensor_fakes import fake_optensor
    calls = fake_optensor(monkeypatch)
    sizes = [1, 3, 2]
    shapes = [list((2, 3, 4)) for _ in sizes]
    for s, n in zip(shapes, sizes):
        s[axis] = n
    parts = [_x(rng, tuple(s)) for s in shapes]
    y = dnnkit.concatenate(parts, axis, backend="cudnn")
    assert [c[0] for c in calls] == ["transform"] * 3
    assert np.array_equal(y.copy_to_host(), np.concatenate(parts, axis))
    for got, want in zip(dnnkit.split(y, sizes, axis, backend="cudnn"), parts):
        assert np.array_equal(got.copy_to_host(), want)
    dy = _x(rng, (2, 4))
    dx = dnnkit.take_batch_backward(dy, (5, 4), slice(2, 4), backend="cudnn").copy_to_host()
    ref = np.zeros((5, 4), np.float32)
    ref[2:4] = dy
    assert np.array_equal(dx, ref)
