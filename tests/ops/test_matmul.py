"""matmul and linear: forward against float64 NumPy on both backends, the gradient rules
against the float64 formulas and finite differences (through dnnkit.Tensor), bad input."""

import numpy as np
import pytest

import dnnkit
from dnnkit import reference
from dnnkit.registry import PREPARE, REGISTRY
from tests.conftest import DTYPES, REL_TOL, backend_params

# (a shape, b shape) as op(a) @ op(b) sees them (before any transpose)
PAIRS = [((5, 7), (7, 6)), ((3, 4, 5), (3, 5, 2)), ((3, 4, 5), (5, 2)), ((4, 5), (3, 5, 2)),
         ((1, 4, 5), (3, 5, 2))]
TRANSPOSES = [(False, False), (True, False), (False, True), (True, True)]
# GEMM sums of k products: float32 rounding grows with k (k <= 7 here)
TOL = {"float16": 4e-3, "float32": 4e-6, "float64": 1e-13}


def _stored(m, t):
    """The array to pass for op(.) = m: m itself, or its transpose (last two axes) stored."""
    return np.ascontiguousarray(np.swapaxes(m, -1, -2)) if t else m


def _data(rng, shape, dtype):
    return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(dtype)


def _skip_where_cudnn_does_not_run(backend, op, *args):
    """cuDNN's matmul takes float16, and float32 with dnn.matmul.allow_tf32, on the shapes its
    heuristics have an engine for; elsewhere it has no call, and the op runs on Numba under
    every policy (test_float32_and_float64_run_on_numba_with_the_reason): skip the cuDNN row."""
    if backend == "cudnn":
        chosen, why = dnnkit.select_backend(op, *args, backend="cudnn", explain=True)
        if chosen != "cudnn":
            pytest.skip(f"cuDNN does not run it: {why}")


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ta,tb", TRANSPOSES)
@pytest.mark.parametrize("sa,sb", PAIRS)
def test_matmul_matches_float64(rng, sa, sb, ta, tb, dtype, backend):
    a, b = _data(rng, sa, dtype), _data(rng, sb, dtype)
    _skip_where_cudnn_does_not_run(backend, "matmul", _stored(a, ta), _stored(b, tb), ta, tb)
    with dnnkit.trace() as t:
        y = dnnkit.matmul(_stored(a, ta), _stored(b, tb), ta, tb, backend=backend)
    assert t.backends() == [backend]
    got = y.copy_to_host()
    ref = np.matmul(a.astype(np.float64), b.astype(np.float64))
    assert got.shape == ref.shape and got.dtype == np.dtype(dtype)
    assert reference.rel_error(got, ref) <= TOL[dtype]


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("x_shape", [(4, 7), (2, 3, 7), (7,)])
@pytest.mark.parametrize("with_bias", [True, False])
def test_linear_matches_float64(rng, x_shape, with_bias, dtype, backend):
    x, w = _data(rng, x_shape, dtype), _data(rng, (5, 7), dtype)
    bias = rng.standard_normal(5).astype(dtype) if with_bias else None
    _skip_where_cudnn_does_not_run(backend, "linear", x, w, bias)
    y = dnnkit.linear(x, w, bias, backend=backend).copy_to_host()
    ref = x.astype(np.float64) @ w.astype(np.float64).T
    if with_bias:
        ref = ref + bias.astype(np.float64)
    assert y.shape == x_shape[:-1] + (5,) and y.dtype == np.dtype(dtype)
    assert reference.rel_error(y, ref) <= TOL[dtype]


@pytest.mark.parametrize("backend", backend_params())
def test_empty_products(backend):
    """k = 0 is a sum over nothing: zeros, plus the bias; an empty batch gives an empty y."""
    bias = np.array([1.0, -2.0, 3.0], np.float32)
    _skip_where_cudnn_does_not_run(backend, "linear", np.zeros((4, 0), np.float32),
                                   np.zeros((3, 0), np.float32), bias)
    y = dnnkit.linear(np.zeros((4, 0), np.float32), np.zeros((3, 0), np.float32), bias,
                      backend=backend).copy_to_host()
    assert np.array_equal(y, np.broadcast_to(bias, (4, 3)))
    y = dnnkit.matmul(np.zeros((2, 0), np.float32), np.zeros((0, 3), np.float32),
                      backend=backend).copy_to_host()
    assert np.array_equal(y, np.zeros((2, 3)))
    assert dnnkit.matmul(np.zeros((0, 4, 2)), np.zeros((0, 2, 3)),
                         backend=backend).shape == (0, 4, 3)


# ---------------------------------------------------------------- gradients

def _fd_check(f, inputs, dy, h=1e-6):
    """Central differences of sum(dy * f(inputs)) wrt every element of every input, f the
    float64 NumPy function the op computes (checked against the op above): the gradients
    autograd must give."""
    out = []
    for k, v in enumerate(inputs):
        g = np.zeros_like(v)
        for i in np.ndindex(v.shape):
            plus = [u.copy() for u in inputs]
            minus = [u.copy() for u in inputs]
            plus[k][i] += h
            minus[k][i] -= h
            g[i] = (np.sum(dy * f(*plus)) - np.sum(dy * f(*minus))) / (2 * h)
        out.append(g)
    return out


def _autograd(fn, inputs, dy):
    """Gradients of sum(dy * fn(*tensors)) by dnnkit's autograd."""
    ts = [dnnkit.tensor(v, requires_grad=True) for v in inputs]
    y = fn(*ts)
    y.backward(dnnkit.tensor(dy))
    return [t.grad.numpy() for t in ts]


@pytest.mark.parametrize("ta,tb", TRANSPOSES)
@pytest.mark.parametrize("sa,sb", PAIRS)
def test_matmul_gradient_is_the_finite_difference(rng, sa, sb, ta, tb):
    a, b = _stored(rng.standard_normal(sa), ta), _stored(rng.standard_normal(sb), tb)
    y_shape = np.matmul(np.zeros(sa), np.zeros(sb)).shape
    dy = rng.standard_normal(y_shape)

    def f(a_, b_):
        return np.matmul(np.swapaxes(a_, -1, -2) if ta else a_,
                         np.swapaxes(b_, -1, -2) if tb else b_)
    got = _autograd(lambda u, v: dnnkit.matmul(u, v, ta, tb, backend="numba"), [a, b], dy)
    for g, fd in zip(got, _fd_check(f, [a, b], dy)):
        assert g.shape == fd.shape
        assert np.allclose(g, fd, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("x_shape", [(3, 4), (2, 2, 4)])
def test_linear_gradient_is_the_finite_difference(rng, x_shape):
    x, w, bias = rng.standard_normal(x_shape), rng.standard_normal((3, 4)), \
        rng.standard_normal(3)
    dy = rng.standard_normal(x_shape[:-1] + (3,))

    def f(x_, w_, b_):
        return x_ @ w_.T + b_
    got = _autograd(lambda u, v, c: dnnkit.linear(u, v, c, backend="numba"), [x, w, bias], dy)
    for g, fd in zip(got, _fd_check(f, [x, w, bias], dy)):
        assert np.allclose(g, fd, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_gradients_match_float64(rng, dtype, backend):
    """dx = dy W, dW = dy^T x, db = sum of dy over the rows, on each backend and dtype."""
    x, w, bias = _data(rng, (2, 3, 6), dtype), _data(rng, (4, 6), dtype), \
        rng.standard_normal(4).astype(dtype)
    dy = _data(rng, (2, 3, 4), dtype)
    _skip_where_cudnn_does_not_run(backend, "linear", x, w, bias)
    tx, tw, tb = (dnnkit.tensor(v, requires_grad=True) for v in (x, w, bias))
    with dnnkit.trace() as t:
        y = dnnkit.linear(tx, tw, tb, backend=backend)
        y.backward(dnnkit.tensor(dy))
    assert set(t.backends()) == {backend}
    x64, w64, dy64 = (v.astype(np.float64) for v in (x, w, dy))
    assert reference.rel_error(tx.grad.numpy(), dy64 @ w64) <= TOL[dtype]
    assert reference.rel_error(tw.grad.numpy(), dy64.reshape(6, 4).T @ x64.reshape(6, 6)) \
        <= TOL[dtype]
    assert reference.rel_error(tb.grad.numpy(), dy64.sum(axis=(0, 1))) <= TOL[dtype]


@pytest.mark.parametrize("backend", backend_params())
def test_broadcast_gradient_is_summed_over_the_batch(rng, backend):
    a, b = rng.standard_normal((4, 5)).astype(np.float32), \
        rng.standard_normal((3, 5, 2)).astype(np.float32)
    dy = rng.standard_normal((3, 4, 2)).astype(np.float32)
    _skip_where_cudnn_does_not_run(backend, "matmul", a, b)
    ta, tb = dnnkit.tensor(a, requires_grad=True), dnnkit.tensor(b, requires_grad=True)
    dnnkit.matmul(ta, tb, backend=backend).backward(dnnkit.tensor(dy))
    da = np.einsum("bmn,bkn->mk", dy.astype(np.float64), b.astype(np.float64))
    assert ta.grad.shape == (4, 5)
    assert reference.rel_error(ta.grad.numpy(), da) <= 1e-5


# ---------------------------------------------------------------- backends and bad input

def test_float32_and_float64_run_on_numba_with_the_reason():
    """cuDNN has no float64 matmul and computes float32 in TF32: those run on the Numba GEMM
    under every policy, forced included, and say why."""
    a32 = np.ones((4, 4), np.float32)
    chosen, why = dnnkit.select_backend("matmul", a32, a32, backend="cudnn", explain=True)
    assert chosen == "numba" and "dnn.matmul.allow_tf32" in why
    chosen, why = dnnkit.select_backend("linear", np.ones((2, 4)), np.ones((3, 4)),
                                        backend="cudnn", explain=True)
    assert chosen == "numba" and "take no float64" in why


def test_a_shape_without_cudnn_engine_is_named_by_supports(monkeypatch):
    """A shape cuDNN's heuristics give no engine for is declined by supports() with the reason
    (so auto goes straight to Numba and forced raises before any call)."""
    import importlib
    import types

    from dnnkit.cudnn import matmul as cm
    ops_matmul = importlib.import_module("dnnkit.ops.matmul")   # (dnnkit.ops.matmul: the op)
    asked = []
    monkeypatch.setattr(ops_matmul.loader, "status", lambda: types.SimpleNamespace(available=True))
    monkeypatch.setattr(cm, "unsupported", lambda *a: asked.append(a) or
                        "cuDNN's heuristics give no engine for this matmul")
    a = np.ones((2, 3), np.float16)
    args = PREPARE["matmul"](a, a.T.copy())
    assert "no engine" in REGISTRY["matmul"]["cudnn"].supports(*args)
    assert asked and asked[0][2] == "float16" and asked[0][3] is True    # tensor cores allowed
    assert dnnkit.select_backend("matmul", a, a.T.copy(), backend="auto") == "numba"


def _mm(*a, **k):
    return lambda: dnnkit.matmul(*a, **k)


def _lin(*a, **k):
    return lambda: dnnkit.linear(*a, **k)


@pytest.mark.parametrize("op,call,exc,words", [
    ("matmul", _mm(np.ones((2, 3)), np.ones((4, 2))), ValueError, "inner dimensions"),
    ("matmul", _mm(np.ones((2, 2, 3)), np.ones((3, 3, 2))), ValueError, "batches"),
    ("matmul", _mm(np.ones((2, 3)), np.ones((3, 2), np.float32)), TypeError, "dtype"),
    ("matmul", _mm(np.ones(3), np.ones((3, 2))), ValueError, "2-D or 3-D"),
    ("matmul", _mm(np.ones((2, 3)), np.ones((3, 2)), transpose_a=1), TypeError, "transpose_a"),
    ("matmul", _mm(np.ones((2, 3), np.int64), np.ones((3, 2))), TypeError, "floating-point"),
    ("linear", _lin(np.ones((2, 3)), np.ones((4, 5))), ValueError, "features"),
    ("linear", _lin(np.ones((2, 3)), np.ones((4, 3)), np.ones(5)), ValueError, "bias"),
    ("linear", _lin(np.ones((2, 3)), np.ones(3)), ValueError, "weight"),
    ("linear", _lin(np.ones((2, 3)), np.ones((4, 3), np.float32)), TypeError, "dtype"),
])
def test_bad_input_names_the_op(op, call, exc, words):
    with pytest.raises(exc) as e:
        call()
    assert str(e.value).startswith(op + ":") and words in str(e.value)
