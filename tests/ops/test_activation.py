import numpy as np
import pytest

import dnnkit
from dnnkit import reference
from tests.conftest import DTYPES, REL_TOL, backend_params

MODES = ["relu", "clipped_relu", "tanh", "sigmoid", "elu", "swish", "identity"]
COEF = {"clipped_relu": 1.5, "elu": 0.7, "swish": 1.3}
SHAPES = [(37,), (3, 5, 7), (2, 3, 4, 5)]


def _mode_backend():
    out = []
    for m in MODES:
        out.append(pytest.param(m, "numba", id=f"{m}-numba"))
        if m != "identity":  # cuDNN has no stand-alone identity
            out.append(pytest.param(m, "cudnn", id=f"{m}-cudnn", marks=pytest.mark.cudnn))
    return out


def _input(rng, shape, dtype):
    return (rng.standard_normal(shape) * 3).astype(dtype)


def _rel(got, ref):
    return reference.rel_error(got, ref)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode,backend", _mode_backend())
def test_forward_and_backward_match_float64(rng, mode, backend, dtype, shape):
    coef = COEF.get(mode, 0.0)
    x = _input(rng, shape, dtype)
    with dnnkit.trace() as t:
        y = dnnkit.activation(x, mode, coef, backend=backend)
    assert t.backends() == [backend]
    got = y.copy_to_host()
    assert got.dtype == np.dtype(dtype) and got.shape == shape
    ref = reference.activation(x.astype(np.float64), mode, coef)
    assert _rel(got, ref) <= REL_TOL[dtype]

    dy = _input(rng, shape, dtype)
    dx = dnnkit.activation_backward(x, got, dy, mode, coef, backend=backend).copy_to_host()
    ref_dx = reference.activation_backward(x.astype(np.float64), dy.astype(np.float64), mode, coef)
    # y enters the slope in y's precision, so allow that rounding on top of the op's own.
    assert _rel(dx, ref_dx) <= 4 * REL_TOL[dtype]


@pytest.mark.parametrize("mode", MODES)
def test_reference_gradient_is_the_derivative(rng, mode):
    """The float64 backward reference against central finite differences of the forward."""
    coef = COEF.get(mode, 0.0)
    x = rng.standard_normal(200) * 3
    x = x[(np.abs(x) > 1e-3) & (np.abs(x - coef) > 1e-3)]  # stay off the kinks
    h = 1e-6
    fd = (reference.activation(x + h, mode, coef) - reference.activation(x - h, mode, coef)) / (2 * h)
    assert np.allclose(reference.activation_backward(x, np.ones_like(x), mode, coef), fd,
                       rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("mode", ["relu", "clipped_relu", "tanh", "sigmoid", "elu", "swish"])
def test_nan_propagates(mode, backend):
    x = np.array([np.nan, -1.0, 0.5, np.nan, 2.0], dtype=np.float32)
    y = dnnkit.activation(x, mode, COEF.get(mode, 0.0), backend=backend).copy_to_host()
    assert np.isnan(y[[0, 3]]).all() and not np.isnan(y[[1, 2, 4]]).any()


@pytest.mark.parametrize("backend", backend_params())
def test_extreme_inputs_do_not_overflow(backend):
    x = np.array([-1e4, -100.0, 100.0, 1e4], dtype=np.float32)
    y = dnnkit.sigmoid(x, backend=backend).copy_to_host()
    assert np.array_equal(y, [0.0, 0.0, 1.0, 1.0]) or np.allclose(y, [0, 0, 1, 1], atol=1e-30)
    y = dnnkit.activation(x, "swish", 1.0, backend=backend).copy_to_host()
    assert np.isfinite(y).all()


def test_shortcuts_and_empty_input():
    x = np.array([-2.0, 0.25, 3.0])
    assert np.allclose(dnnkit.relu(x).copy_to_host(), [0, 0.25, 3])
    assert np.allclose(dnnkit.tanh(x).copy_to_host(), np.tanh(x))
    assert np.allclose(dnnkit.sigmoid(x).copy_to_host(), 1 / (1 + np.exp(-x)))
    empty = dnnkit.activation(np.zeros((0, 3), np.float32), "tanh")
    assert empty.shape == (0, 3)


@pytest.mark.parametrize("call,exc,words", [
    (lambda x: dnnkit.activation(x, "gelu"), ValueError, ["activation", "gelu", "relu"]),
    (lambda x: dnnkit.activation(x, "clipped_relu", 0.0), ValueError, ["clipped_relu", "0.0"]),
    (lambda x: dnnkit.activation(x, "elu", "big"), TypeError, ["coef", "big"]),
    (lambda x: dnnkit.activation(x, "elu", float("nan")), ValueError, ["coef", "nan"]),
    (lambda x: dnnkit.activation(x.astype(np.int32)), TypeError, ["activation", "int32"]),
    (lambda x: dnnkit.activation(x.astype(np.complex64)), TypeError, ["complex64"]),
    (lambda x: dnnkit.activation_backward(x, x, x[:2]), ValueError, ["dy", "(2, 4)", "(3, 4)"]),
    (lambda x: dnnkit.activation_backward(x, x.astype(np.float64), x), TypeError,
     ["y", "float64", "float32"]),
    (lambda x: dnnkit.activation(x, backend="cudann"), ValueError, ["backend", "cudann"]),
    (lambda x: dnnkit.activation("abc"), TypeError, ["activation", "x"]),
])
def test_bad_arguments_name_op_and_values(call, exc, words):
    x = np.ones((3, 4), np.float32)
    with pytest.raises(exc) as ei:
        call(x)
    for w in words:
        assert w in str(ei.value)


def test_non_contiguous_device_input_is_rejected():
    from numba import cuda
    d = cuda.to_device(np.ones((4, 6), np.float32))[:, ::2]
    with pytest.raises(ValueError, match=r"activation: x must be C-contiguous"):
        dnnkit.activation(d)


@pytest.mark.parametrize("backend", backend_params())
def test_zero_dim_host_input_keeps_its_shape(backend):
    """A 0-d host array came back 1-d: np.ascontiguousarray lifts 0-d arrays to (1,) (found
    by the fuzzer, tests/fuzz/test_fuzz.py)."""
    y = dnnkit.activation(np.float32(-2.0), "relu", backend=backend)
    assert y.shape == () and y.copy_to_host() == 0
    x = np.array(0.5, np.float64)
    assert dnnkit.activation(x, "tanh", backend=backend).shape == ()
    dx = dnnkit.activation_backward(x, np.tanh(x), np.array(2.0), "tanh", backend=backend)
    assert dx.shape == () and np.isclose(dx.copy_to_host(), 2 * (1 - np.tanh(0.5) ** 2))


def test_device_input_is_used_without_copy_and_output_is_device():
    from numba import cuda
    from dnnkit import arrays
    d = cuda.to_device(np.ones((2, 3), np.float32))
    assert arrays.device_input("activation", "x", d, cuda.default_stream()) is d
    y = dnnkit.relu(d)
    assert arrays.is_device_array(y)


@pytest.mark.parametrize("backend", backend_params())
def test_slopes_at_kinks_and_nan_follow_cudnn(backend):
    """Probed with the real cuDNN 9.19 on an H200 and an H100 (validation/cudnn_conventions.py).
    The last four: a NaN/Inf dy where the slope is 0; relu and clipped_relu select (0, as
    PyTorch), elu multiplies."""
    x = np.array([-1.0, 0.0, 0.5, 2.0, 3.0, np.nan, 1.0, -1.0, 3.0, np.nan, 0.0], np.float32)
    dy = np.ones_like(x)
    dy[6:] = [np.nan, np.inf, np.nan, np.inf, np.inf]
    expected = {
        "relu": [0, 0, 1, 1, 1, 0, np.nan, 0, np.nan, 0, 0],
        "clipped_relu": [0, 0, 1, 1, 0, 0, np.nan, 0, 0, 0, 0],
        "elu": [2 * np.exp(-1.0), 1, 1, 1, 1, np.nan, np.nan, np.inf, np.nan, np.nan, np.inf],
    }
    for mode, want in expected.items():
        y = dnnkit.activation(x, mode, 2.0, backend=backend).copy_to_host()
        dx = dnnkit.activation_backward(x, y, dy, mode, 2.0, backend=backend).copy_to_host()
        np.testing.assert_allclose(dx, np.array(want, np.float32), rtol=1e-6, err_msg=mode)
        ref = reference.activation_backward(x.astype(np.float64), dy.astype(np.float64), mode, 2.0)
        np.testing.assert_allclose(ref, want, rtol=1e-6, err_msg=mode)


# which inputs each mode's slope reads (kernels/activation.py, _reads): the others are not
# loaded, so NaN there must not reach dx
READS = {"relu": "x", "clipped_relu": "x", "tanh": "y", "sigmoid": "y", "elu": "xy",
         "swish": "xy", "identity": ""}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("n", [4 * 64 + 37, 3 * 64 - 5])
def test_kernels_cover_every_element_with_a_small_grid(rng, n, mode):
    """The unrolled grid-stride loops (four elements a grid apart per trip, then a tail) write
    every element exactly right when the grid is much smaller than the array (the ops size
    their grids to the array, so the other tests never take the unrolled path). The backward
    loads only what the mode needs: the inputs it does not read are NaN here."""
    from numba import cuda
    from dnnkit.kernels import activation_bwd_kernel, activation_fwd_kernel
    from dnnkit.ops.activation import _MODE_ID
    coef = np.float32(COEF.get(mode, 0.0))
    x = rng.standard_normal(n).astype(np.float32) * 3
    dy = rng.standard_normal(n).astype(np.float32)
    acc = cuda.to_device(np.zeros(1, np.float32))
    y, dx = cuda.to_device(np.full(n, np.nan, np.float32)), cuda.to_device(
        np.full(n, np.nan, np.float32))
    dev_x, dev_dy = cuda.to_device(x), cuda.to_device(dy)
    activation_fwd_kernel[2, 32](dev_x, y, _MODE_ID[mode], coef, acc)
    ref_y = reference.activation(x.astype(np.float64), mode, float(coef))
    np.testing.assert_allclose(y.copy_to_host(), ref_y, rtol=1e-6, atol=1e-6)
    poison = cuda.to_device(np.full(n, np.nan, np.float32))
    bx = dev_x if "x" in READS[mode] else poison
    by = y if "y" in READS[mode] else poison
    activation_bwd_kernel[2, 32](bx, by, dev_dy, dx, _MODE_ID[mode], coef, acc)
    ref_dx = reference.activation_backward(x.astype(np.float64), dy.astype(np.float64), mode,
                                           float(coef))
    np.testing.assert_allclose(dx.copy_to_host(), ref_dx, rtol=1e-5, atol=1e-5)


def test_host_views_reach_the_device_with_canonical_strides():
    """A reversed 1-element view (stride -4) counts as C-contiguous in NumPy and passed
    through unchanged; Numba's copy to the device rejected it on an H100 (found by the
    fuzzer). host_contiguous gives canonical strides, keeps 0-d shapes, copies only then."""
    from dnnkit import arrays
    view = np.ones(1, np.float32)[::-1]
    assert view.strides == (-4,) and view.flags.c_contiguous
    h = arrays.host_contiguous(view)
    assert h.shape == (1,) and h.strides == (4,)
    odd = np.ones((3, 4), np.float32)[::-3, :]           # shape (1, 4), strides (-48, 4)
    assert arrays.host_contiguous(odd).strides == (16, 4)
    assert arrays.host_contiguous(np.float32(3.0).reshape(())).shape == ()
    plain = np.ones((2, 3), np.float32)
    assert arrays.host_contiguous(plain) is plain
    np.testing.assert_array_equal(dnnkit.relu(view).copy_to_host(), [1.0])


def test_elu_backward_with_alpha_0_does_not_use_cudnn():
    """cuDNN's ELU backward reads the slope from y: with alpha = 0, y = 0 for every x <= 0 and
    cuDNN gave slope 1 there (H100, cuDNN 9.19). Numba runs it under auto; forced says why."""
    x = np.array([-1.0, 0.0, 2.0], np.float32)
    chosen, why = dnnkit.select_backend("activation_backward", x, x, x, "elu", 0.0,
                                        explain=True)
    assert chosen == "numba" and "alpha = 0" in why, why
    with pytest.raises(dnnkit.CudnnUnavailableError, match="activation_backward: .*alpha = 0"):
        dnnkit.activation_backward(x, x, x, "elu", 0.0, backend="cudnn")
    dx = dnnkit.activation_backward(x, np.maximum(x, 0), np.ones(3, np.float32), "elu", 0.0)
    np.testing.assert_array_equal(dx.copy_to_host(), [0.0, 1.0, 1.0])
    assert "alpha" not in dnnkit.select_backend("activation_backward", x, x, x, "elu", 0.5,
                                                explain=True)[1]
