"""``out=`` on the elementwise ops (activation, activation_backward, dropout,
batch_norm_inference): values against float64, the result written into out (a fresh array or
an input: in place) on both backends, the argument errors, and autograd through in-place calls
(the rule for which backward can still run, and the detection of a saved value changed in
place)."""

import numpy as np
import pytest

import dnnkit
from dnnkit import reference
from dnnkit.device import numba_cuda
from tests.conftest import DTYPES, REL_TOL, backend_params

COEF = {"clipped_relu": 1.5, "elu": 0.7, "swish": 1.3}
SHAPE = (2, 3, 4, 5)


def _dev(a):
    return numba_cuda().to_device(np.ascontiguousarray(a))


def _x(rng, shape=SHAPE, dtype="float32"):
    return (rng.standard_normal(shape) * 3).astype(dtype)


def _mode_backend(modes):
    out = []
    for m in modes:
        out.append(pytest.param(m, "numba", id=f"{m}-numba"))
        if m != "identity":
            out.append(pytest.param(m, "cudnn", id=f"{m}-cudnn", marks=pytest.mark.cudnn))
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("where", ["fresh", "x"])
@pytest.mark.parametrize("mode,backend", _mode_backend(["relu", "clipped_relu", "tanh",
                                                        "sigmoid", "elu", "swish", "identity"]))
def test_activation_out_values_and_aliasing(rng, mode, backend, where, dtype):
    coef = COEF.get(mode, 0.0)
    h = _x(rng, dtype=dtype)
    x = _dev(h)
    out = x if where == "x" else _dev(np.zeros(SHAPE, dtype))
    with dnnkit.trace() as t:
        y = dnnkit.activation(x, mode, coef, out=out, backend=backend)
    assert t.backends() == [backend]
    assert y is out
    ref = reference.activation(h.astype(np.float64), mode, coef)
    assert reference.rel_error(out.copy_to_host(), ref) <= REL_TOL[dtype]
    if where == "fresh":
        np.testing.assert_array_equal(x.copy_to_host(), h)     # the input is untouched


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("where", ["fresh", "dy", "x", "y"])
@pytest.mark.parametrize("mode,backend", _mode_backend(["relu", "tanh", "elu", "swish"]))
def test_activation_backward_out_values_and_aliasing(rng, mode, backend, where, dtype):
    coef = COEF.get(mode, 0.0)
    hx, hdy = _x(rng, dtype=dtype), _x(rng, dtype=dtype)
    hy = dnnkit.activation(hx, mode, coef, backend="numba").copy_to_host()
    x, y, dy = _dev(hx), _dev(hy), _dev(hdy)
    out = {"fresh": None, "dy": dy, "x": x, "y": y}[where]
    out = _dev(np.zeros(SHAPE, dtype)) if out is None else out
    dx = dnnkit.activation_backward(x, y, dy, mode, coef, out=out, backend=backend)
    assert dx is out
    ref = reference.activation_backward(hx.astype(np.float64), hdy.astype(np.float64), mode,
                                        coef)
    assert reference.rel_error(out.copy_to_host(), ref) <= 4 * REL_TOL[dtype]


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("mode", ["relu", "tanh", "sigmoid", "elu"])
def test_backward_from_y_alone_is_the_gradient(rng, mode, backend):
    """The rule of an in-place forward: y passed for x gives the exact gradient of the modes of
    from_output (elu with alpha > 0)."""
    coef = COEF.get(mode, 0.0)
    hx, hdy = _x(rng, dtype="float64"), _x(rng, dtype="float64")
    hy = reference.activation(hx, mode, coef)
    dx = dnnkit.activation_backward(hy, hy, hdy, mode, coef, backend=backend).copy_to_host()
    ref = reference.activation_backward(hx, hdy, mode, coef)
    assert reference.rel_error(dx, ref) <= 1e-12


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("where", ["fresh", "x"])
def test_dropout_out(rng, backend, where):
    h = _x(rng)
    x = _dev(h)
    out = x if where == "x" else _dev(np.zeros(SHAPE, np.float32))
    y, state = dnnkit.dropout(x, 0.4, seed=7, out=out, backend=backend)
    assert y is out
    ref, ref_state = dnnkit.dropout(h, 0.4, seed=7, backend=backend)
    np.testing.assert_array_equal(out.copy_to_host(), ref.copy_to_host())
    # the backward needs the mask only: the same with the input overwritten
    dy = _x(rng)
    np.testing.assert_array_equal(dnnkit.dropout_backward(dy, state).copy_to_host(),
                                  dnnkit.dropout_backward(dy, ref_state).copy_to_host())


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("where", ["fresh", "x"])
@pytest.mark.parametrize("mode", ["spatial", "per-activation"])
def test_batch_norm_inference_out(rng, backend, where, mode):
    h = _x(rng, (3, 4, 2, 5), "float64")
    pshape = (1, 4, 1, 1) if mode == "spatial" else (1, 4, 2, 5)
    gamma, beta, mean = (rng.standard_normal(pshape) for _ in range(3))
    var = 0.5 + rng.random(pshape)
    x = _dev(h)
    out = x if where == "x" else _dev(np.zeros(h.shape))
    y = dnnkit.batch_norm_inference(x, gamma, beta, mean, var, mode=mode, out=out,
                                    backend=backend)
    assert y is out
    ref = reference.batch_norm_inference(h, gamma, beta, mean, var, mode=mode)
    assert reference.rel_error(out.copy_to_host(), ref) <= 1e-12


def test_out_argument_errors(rng):
    x = _dev(_x(rng))
    with pytest.raises(ValueError, match=r"activation: out has shape \(3,\), the result "
                                         r"\(2, 3, 4, 5\)"):
        dnnkit.activation(x, "relu", out=_dev(np.zeros(3, np.float32)))
    with pytest.raises(TypeError, match="activation: out has dtype float64, the result float32"):
        dnnkit.activation(x, "relu", out=_dev(np.zeros(SHAPE)))
    with pytest.raises(TypeError, match="activation: out must be a device array"):
        dnnkit.activation(x, "relu", out=np.zeros(SHAPE, np.float32))
    with pytest.raises(TypeError, match="dropout: out has dtype float16"):
        dnnkit.dropout(x, 0.5, out=_dev(np.zeros(SHAPE, np.float16)))
    with pytest.raises(ValueError, match="activation_backward: out has shape"):
        dnnkit.activation_backward(x, x, x, out=_dev(np.zeros((2, 3), np.float32)))
    with pytest.raises(ValueError, match="batch_norm_inference: out has shape"):
        p = np.ones((1, 3, 1, 1), np.float32)
        dnnkit.batch_norm_inference(x, p, p, p, p, out=_dev(np.zeros(3, np.float32)))
    flat = _dev(np.zeros(2 * 120, np.float32))
    a, b = flat[:120].reshape(SHAPE), flat[60:180].reshape(SHAPE)
    with pytest.raises(ValueError, match="activation: out overlaps x in part"):
        dnnkit.activation(a, "relu", out=b)


# ---------------------------------------------------------------- autograd


def _t(rng, shape=(2, 3, 4), requires_grad=True):
    return dnnkit.tensor(rng.standard_normal(shape) * 3, requires_grad=requires_grad)


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("mode", ["relu", "tanh", "sigmoid", "elu", "identity"])
def test_in_place_activation_gradient_equals_out_of_place(rng, mode, backend):
    if mode == "identity" and backend == "cudnn":
        pytest.skip("cuDNN has no stand-alone identity")
    coef = COEF.get(mode, 0.0)
    w = _t(rng)
    grads, values = [], []
    for inplace in (False, True):
        w.grad = None
        a = w * 2.0                      # a non-leaf: in place is allowed
        y = dnnkit.activation(a, mode, coef, out=a if inplace else None, backend=backend)
        if inplace:
            assert y is a and a.version == 1 and a.grad_fn.op == "activation"
        (y * y).sum().backward()
        grads.append(w.grad.numpy())
        values.append(y.numpy())
    np.testing.assert_array_equal(values[0], values[1])
    np.testing.assert_allclose(grads[1], grads[0], rtol=1e-12, atol=0)


@pytest.mark.parametrize("mode", ["clipped_relu", "swish"])
def test_in_place_activation_whose_gradient_needs_x_raises(rng, mode):
    a = _t(rng) * 1.0
    y = dnnkit.activation(a, mode, COEF[mode], out=a)
    with pytest.raises(RuntimeError, match=f"activation: the gradient of {mode} needs its "
                                           f"input x, which the in-place call"):
        y.sum().backward()
    a = _t(rng) * 1.0
    y = dnnkit.activation(a, "elu", 0.0, out=a)
    with pytest.raises(RuntimeError, match="gradient of elu with coef 0.0 needs its input"):
        y.sum().backward()


def test_change_of_a_saved_output_is_detected(rng):
    """sigmoid's backward needs its output; an in-place relu over it must stop backward with
    an error naming the op and the output, not a wrong gradient."""
    s = dnnkit.sigmoid(_t(rng))
    dnnkit.relu(s, out=s)
    with pytest.raises(RuntimeError, match=r"activation: its output 0 \(shape \(2, 3, 4\)\) "
                                           r"was changed in place .* in-place operation"):
        s.sum().backward()


def test_change_of_a_saved_input_is_detected_and_unneeded_ones_are_not(rng):
    x, w = _t(rng), _t(rng, (4, 5))
    h = x * 1.0
    y = dnnkit.matmul(h, w)              # needs h to differentiate w
    dnnkit.relu(h, out=h)
    with pytest.raises(RuntimeError, match="matmul: its input 'a' .* changed in place"):
        y.sum().backward()
    # dropout's gradient needs only its mask, not x: a change in place after it is harmless
    h = x * 1.0
    z, _ = dnnkit.dropout(h, 0.5, seed=5)
    dnnkit.tanh(h, out=h)
    x.grad = None
    (z.sum() + h.sum()).backward()
    mask = dnnkit.dropout(np.ones((2, 3, 4)), 0.5, seed=5)[0].copy_to_host()
    th = np.tanh(x.numpy())
    np.testing.assert_allclose(x.grad.numpy(), mask + (1 - th * th), rtol=1e-12)


def test_earlier_consumers_keep_the_history_they_saw(rng):
    """A node recorded before an in-place op routes its gradient to the input's old history
    (a = 3x feeds a dropout, then relu runs in place over a): the dropout's gradient must not
    pass through the relu's mask."""
    x = _t(rng, (2, 3))
    a = x * 3.0
    b, _ = dnnkit.dropout(a, 0.5, seed=9)      # consumes a before the in-place relu
    dnnkit.relu(a, out=a)
    (b.sum() + a.sum()).backward()
    mask = dnnkit.dropout(np.ones((2, 3)), 0.5, seed=9)[0].copy_to_host()
    expected = 3.0 * mask + 3.0 * (x.numpy() * 3.0 > 0)
    np.testing.assert_allclose(x.grad.numpy(), expected, rtol=1e-12)


def test_in_place_on_a_leaf_that_requires_grad_is_refused(rng):
    w = _t(rng)
    with pytest.raises(RuntimeError, match=r"activation\(out=...\): out is a leaf Tensor "
                                           r"that requires grad"):
        dnnkit.relu(w, out=w)
    with dnnkit.no_grad():               # an update, as an optimizer's: allowed
        dnnkit.relu(w, out=w)
    assert w.version == 1 and w.is_leaf and w.requires_grad


def test_out_tensor_other_than_the_input_shares_storage_and_is_bumped(rng):
    x = _t(rng)
    buf = dnnkit.tensor(np.zeros((2, 3, 4)))
    y = dnnkit.tanh(x, out=buf)
    assert y is buf and buf.version == 1
    assert buf.grad_fn.op == "activation" and buf.requires_grad
    y.sum().backward()
    th = np.tanh(x.numpy())
    np.testing.assert_allclose(x.grad.numpy(), 1 - th * th, rtol=1e-12)
    np.testing.assert_allclose(buf.numpy(), th, rtol=1e-12)
    other = dnnkit.tensor(np.zeros((2, 3, 4)))
    d = other.detach()                   # shares other's version counter
    with dnnkit.no_grad():
        dnnkit.tanh(x, out=other)
    assert d.version == 1 and other.version == 1


def test_in_place_dropout_gradient(rng):
    x = _t(rng)
    a = x * 1.0
    y, _ = dnnkit.dropout(a, 0.5, seed=3, out=a)
    assert y is a
    y.sum().backward()
    mask = dnnkit.dropout(np.ones((2, 3, 4)), 0.5, seed=3)[0].copy_to_host()
    np.testing.assert_allclose(x.grad.numpy(), mask, rtol=1e-12)


def test_in_place_through_a_view_is_refused_when_gradients_flow(rng):
    """A reshape shares its input's array and version counter: a saved value changed through
    the view is detected, and an in-place write into either, whose history change the other
    could not follow, is refused."""
    x = _t(rng)
    a = x * 1.0
    v = a.reshape((6, 4))
    assert v.counter is a.counter
    with pytest.raises(RuntimeError, match=r"activation\(out=...\): out shares its array "
                                           r"with another Tensor"):
        dnnkit.relu(v, out=v)
    s = dnnkit.sigmoid(x)
    with dnnkit.no_grad():
        dnnkit.relu(s.reshape((6, 4)), out=s.reshape((6, 4)))   # allowed: records nothing
    with pytest.raises(RuntimeError, match="activation: its output 0 .* changed in place"):
        s.sum().backward()
