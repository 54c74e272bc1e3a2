"""add, subtract, multiply, divide: forward against float64 NumPy with broadcasting, scalar
operands, both backends; the cuDNN path's reasons; bad input; the kernels' constants."""

import numpy as np
import pytest

import dnnkit
from dnnkit import reference
from dnnkit.ops import arith
from dnnkit.registry import OPS, PREPARE, REGISTRY
from tests.conftest import DTYPES, REL_TOL, backend_params

NUMPY = {"add": np.add, "subtract": np.subtract, "multiply": np.multiply,
         "divide": np.divide}
# (a shape, b shape): same shape, per-channel, a scalar array, leading dims, both broadcast,
# a broadcast a (cuDNN swaps the operands), 0-d with 0-d
SHAPES = [((2, 3, 4), (2, 3, 4)), ((2, 3, 2, 2), (1, 3, 1, 1)), ((2, 3), ()),
          ((4,), (2, 3, 4)), ((3, 1), (1, 4)), ((1, 3, 1, 1), (2, 3, 2, 2)), ((), ())]


def _op_backend():
    out = []
    for op in arith.OPS:
        out.append(pytest.param(op, "numba", id=f"{op}-numba"))
        out.append(pytest.param(op, "cudnn", id=f"{op}-cudnn", marks=pytest.mark.cudnn))
    return out


def _operand(rng, shape, dtype, divisor=False):
    v = rng.standard_normal(shape)
    if divisor:    # away from 0: the quotient's error stays relative
        v = np.sign(v) * (0.5 + np.abs(v))
    return np.asarray(v, dtype=dtype)


def _expected_backend(op, backend, a_shape, b_shape):
    if backend == "numba" or op == "divide":
        return "numba"          # divide has no cuDNN call: Numba under every policy
    return "cudnn"


@pytest.mark.parametrize("shapes", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op,backend", _op_backend())
def test_forward_matches_float64(rng, op, backend, dtype, shapes):
    a_shape, b_shape = shapes
    a = _operand(rng, a_shape, dtype)
    b = _operand(rng, b_shape, dtype, divisor=op == "divide")
    fn = getattr(dnnkit, op)
    if backend == "cudnn" and op == "multiply" and a_shape != b_shape and \
            np.broadcast_shapes(a_shape, b_shape) not in (a_shape, b_shape):
        with pytest.raises(dnnkit.CudnnUnavailableError, match="broadcasts both"):
            fn(a, b, backend=backend)
        return
    with dnnkit.trace() as t:
        y = fn(a, b, backend=backend)
    assert t.backends() == [_expected_backend(op, backend, a_shape, b_shape)]
    got = y.copy_to_host()
    ref = NUMPY[op](a.astype(np.float64), b.astype(np.float64))
    assert got.dtype == np.dtype(dtype) and got.shape == ref.shape
    assert reference.rel_error(got, ref) <= REL_TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op,backend", _op_backend())
def test_scalar_operands(rng, op, backend, dtype):
    x = _operand(rng, (3, 5), dtype, divisor=True)
    fn = getattr(dnnkit, op)
    for a, b in ((x, 2.5), (-1.25, x), (x, 3), (x, np.float64(0.5))):
        got = fn(a, b, backend=backend).copy_to_host()
        ref = NUMPY[op](np.asarray(a, np.float64), np.asarray(b, np.float64))
        assert got.dtype == np.dtype(dtype) and got.shape == (3, 5)
        # the scalar is used in the accumulation type (cuDNN's fill: in the data type)
        assert reference.rel_error(got, ref) <= 2 * REL_TOL[dtype], (a, b)


@pytest.mark.parametrize("backend", backend_params())
def test_device_inputs_and_large_leading_broadcast(rng, backend):
    """Device arrays in, a (1, C) row added to every row of a 3-D array: the merged walk has
    two dims."""
    from numba import cuda
    a = cuda.to_device(rng.standard_normal((3, 4, 6)).astype(np.float32))
    b = cuda.to_device(rng.standard_normal((1, 6)).astype(np.float32))
    y = dnnkit.add(a, b, backend=backend)
    assert np.allclose(y.copy_to_host(), a.copy_to_host() + b.copy_to_host(), atol=1e-6)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")    # the simulator's NumPy scalars warn
def test_division_follows_ieee():
    a = np.array([1.0, -1.0, 0.0, 2.0], np.float32)
    b = np.array([0.0, 0.0, 0.0, np.inf], np.float32)
    got = dnnkit.divide(a, b).copy_to_host()
    assert got[0] == np.inf and got[1] == -np.inf and np.isnan(got[2]) and got[3] == 0


def test_divide_is_numba_only_with_its_reason():
    assert "no division" in OPS["divide"].numba_only
    assert "cudnn" not in REGISTRY["divide"]
    x = np.ones((2, 2), np.float32)
    with dnnkit.trace() as t:
        dnnkit.divide(x, x, backend="cudnn")      # forced: still Numba, with the reason
    assert t.backends() == ["numba"] and "no division" in t[0].reason


def _reason(op, a, b):
    return REGISTRY[op]["cudnn"].supports(*PREPARE[op](a, b))


def test_cudnn_reasons():
    x = np.ones((2, 3), np.float32)
    assert _reason("add", x, np.ones((1, 3), np.float32)) is None
    assert _reason("subtract", np.ones((3,), np.float32), x) is None      # swapped
    assert _reason("add", np.ones((3, 1), np.float32), np.ones((1, 4), np.float32)) is None
    both = _reason("multiply", np.ones((3, 1), np.float32), np.ones((1, 4), np.float32))
    assert "broadcasts both" in both
    # six dims that cannot merge (alternating broadcast dims): over cudnnOpTensor's 5
    a = np.ones((2, 1, 2, 1, 2, 1), np.float32)
    b = np.ones((1, 2, 1, 2, 1, 2), np.float32)
    assert "at most 5" in _reason("add", a, b)
    # dims that broadcast alike merge: (2, 3, 4, 5, 6, 7) + (7,) is 2-D for cuDNN
    assert _reason("add", np.ones((2, 3, 4, 5, 6, 7), np.float32),
                   np.ones((7,), np.float32)) is None


@pytest.mark.parametrize("backend", backend_params())
def test_many_dims_merge_and_beyond_eight_refused(rng, backend):
    a = rng.standard_normal((2, 1, 2, 1, 2, 1)).astype(np.float32)
    b = rng.standard_normal((1, 2, 1, 2, 1, 2)).astype(np.float32)
    if backend == "cudnn":
        with pytest.raises(dnnkit.CudnnUnavailableError, match="at most 5"):
            dnnkit.add(a, b, backend=backend)
    else:
        assert np.allclose(dnnkit.add(a, b, backend=backend).copy_to_host(), a + b)
    c = np.ones((2, 1) * 5, np.float32)          # 10 dims alternating with d's: 10 walks
    d = np.ones((1, 2) * 5, np.float32)
    with pytest.raises(ValueError, match=r"add: .*at most 8"):
        dnnkit.add(c, d)


def test_empty_output():
    y = dnnkit.add(np.ones((0, 3), np.float32), np.ones((3,), np.float32))
    assert y.shape == (0, 3)


@pytest.mark.parametrize("call,exc,words", [
    (lambda x: dnnkit.add(x, x.astype(np.float64)), TypeError,
     ["add", "float32", "float64"]),
    (lambda x: dnnkit.multiply(x, np.ones((4, 3), np.float32)), ValueError,
     ["multiply", "(3, 4)", "(4, 3)", "broadcast"]),
    (lambda x: dnnkit.subtract(1.0, 2.0), TypeError, ["subtract", "scalars"]),
    (lambda x: dnnkit.divide(x, "two"), TypeError, ["divide", "b"]),
    (lambda x: dnnkit.add(x.astype(np.int32), x), TypeError, ["add", "int32"]),
    (lambda x: dnnkit.add(x, True), TypeError, ["add", "b"]),
])
def test_bad_arguments_name_op_and_values(call, exc, words):
    x = np.ones((3, 4), np.float32)
    with pytest.raises(exc) as ei:
        call(x)
    for w in words:
        assert w in str(ei.value)


def test_kernel_constants_match():
    """kernels/arith.py's op numbers and geo layout are the ops' (they cannot share them:
    kernels import nothing of dnnkit's host modules)."""
    from dnnkit.kernels import arith as k
    from dnnkit.ops import broadcasting as reduce
    assert arith.OP_ID == {"add": k.ADD, "subtract": k.SUBTRACT, "multiply": k.MULTIPLY,
                           "divide": k.DIVIDE}
    assert (reduce.COPY, reduce.MULTIPLY, reduce.MAXDIM) == (k.COPY, k.MULTIPLY, k.MAXDIM)
    geo = reduce.elementwise_geo("add", (2, 3), (3, 1), (0, 1))
    assert len(geo) == k.GEO_LEN and geo[k.SHAPE:k.SHAPE + 2] == (2, 3)
    assert geo[k.A_STRIDES:k.A_STRIDES + 2] == (3, 1)
    assert geo[k.B_STRIDES:k.B_STRIDES + 2] == (0, 1)


# ---------------------------------------------------------------- gradients (autograd)

def fd_gradients(f, inputs, dy, h=1e-6):
    """Central differences of sum(dy * f(*inputs)) wrt every element of every input
    (float64 NumPy): the gradients autograd must give."""
    out = []
    for k, v in enumerate(inputs):
        g = np.zeros_like(v)
        for i in np.ndindex(v.shape):
            plus, minus = [u.copy() for u in inputs], [u.copy() for u in inputs]
            plus[k][i] += h
            minus[k][i] -= h
            g[i] = (np.sum(dy * f(*plus)) - np.sum(dy * f(*minus))) / (2 * h)
        out.append(g)
    return out


def autograd_gradients(fn, inputs, dy):
    """Gradients of sum(dy * fn(*tensors)) by dnnkit's autograd (float64 tensors)."""
    ts = [dnnkit.tensor(v, requires_grad=True) for v in inputs]
    y = fn(*ts)
    y.backward(dnnkit.tensor(dy))
    return [t.grad.numpy() for t in ts]


GRAD_SHAPES = [((2, 3), (2, 3)), ((2, 3, 2), (1, 3, 1)), ((3,), (2, 3)), ((3, 1), (1, 2)),
               ((2, 2), ())]


@pytest.mark.parametrize("shapes", GRAD_SHAPES, ids=str)
@pytest.mark.parametrize("op,backend", _op_backend())
def test_gradient_is_the_finite_difference(rng, op, backend, shapes):
    a = _operand(rng, shapes[0], np.float64)
    b = _operand(rng, shapes[1], np.float64, divisor=True)
    if backend == "cudnn" and op == "multiply" and shapes == ((3, 1), (1, 2)):
        return            # both broadcast: forced cuDNN refuses (test_forward_matches_float64)
    dy = rng.standard_normal(np.broadcast_shapes(a.shape, b.shape))
    fn = getattr(dnnkit, op)
    got = autograd_gradients(lambda u, v: fn(u, v, backend=backend), [a, b], dy)
    for g, fd, v in zip(got, fd_gradients(NUMPY[op], [a, b], dy), (a, b)):
        assert g.shape == v.shape
        assert np.allclose(g, fd, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("backend", backend_params())
def test_operators_and_scalar_operands_record_gradients(rng, backend):
    """Tensor operators with a Python scalar on either side; the scalar gets no gradient."""
    from dnnkit import config
    x = rng.standard_normal((2, 3))
    dy = rng.standard_normal((2, 3))
    with config.change_flags({"dnn.enabled": "forced" if backend == "cudnn" else "disabled"}):
        got, = autograd_gradients(lambda t: (2.0 - t) * 3.0 + t / 4.0 - 1.0 / t, [x], dy)
    expect = dy * (-3.0 + 0.25 + 1.0 / x ** 2)
    assert np.allclose(got, expect, rtol=1e-10)


def test_gradient_flows_only_to_inputs_that_require_it(rng):
    a = dnnkit.tensor(rng.standard_normal((2, 3)), requires_grad=True)
    b = dnnkit.tensor(rng.standard_normal((3,)))               # a constant
    (a * b).sum().backward()
    assert b.grad is None
    assert np.allclose(a.grad.numpy(), np.broadcast_to(b.numpy(), (2, 3)))


# ---------------------------------------------------------------- the cuDNN path, faked

@pytest.mark.parametrize("shapes", SHAPES, ids=str)
@pytest.mark.parametrize("op", ["add", "subtract", "multiply"])
def test_cudnn_path_on_fakes(monkeypatch, rng, op, shapes):
    """The ops' side of the cuDNN path (operand swap, alphas, merged dims, two AddTensor
    calls when both broadcast) against cuDNN's documented semantics (tests/ops/
    optensor_fakes.py)."""
    from tests.ops.optensor_fakes import fake_optensor
    calls = fake_optensor(monkeypatch)
    a = _operand(rng, shapes[0], np.float64)
    b = _operand(rng, shapes[1], np.float64)
    fn = getattr(dnnkit, op)
    out = np.broadcast_shapes(*shapes)
    if op == "multiply" and out not in shapes:
        with pytest.raises(dnnkit.CudnnUnavailableError, match="broadcasts both"):
            fn(a, b, backend="cudnn")
        return
    with dnnkit.trace() as t:
        got = fn(a, b, backend="cudnn").copy_to_host()
    assert t.backends() == ["cudnn"] and calls
    assert np.allclose(got, NUMPY[op](a, b), rtol=1e-14, atol=0)
    for scalar_first in (False, True):
        calls.clear()
        args = (2.5, a) if scalar_first else (a, 2.5)
        got = fn(*args, backend="cudnn").copy_to_host()
        assert np.allclose(got, NUMPY[op](*args), rtol=1e-14, atol=0), args
        # multiply: one cudnnAddTensor (alpha = the scalar); add/subtract: one cudnnOpTensor
        # against a one-element B holding the scalar
        assert [c[0] for c in calls] == (["add_tensor"] if op == "multiply" else
                                         ["op_tensor"])
