"""The pooling modules: ceil_mode on MaxPool2d/3d and AvgPool2d/3d, AvgPool3d with PyTorch's
arguments, their values against the float64 reference, gradients against central
differences, constructor errors and the repr."""

import numpy as np
import pytest

import dnnkit
from dnnkit import nn, reference
from tests.conftest import backend_params
from tests.nn.gradcheck import directional_check, weighted_sum

# (module, x shape, reference's (window, stride, padding, mode, ceil_mode))
MODULES = {
    "max2d-ceil": (lambda: nn.MaxPool2d(3, 2, ceil_mode=True), (1, 2, 6, 5),
                   (3, 2, 0, "max", True)),
    "max3d-ceil": (lambda: nn.MaxPool3d(2, padding=(1, 0, 1), ceil_mode=True), (1, 1, 3, 5, 4),
                   (2, 2, (1, 0, 1), "max", True)),
    "avg2d-ceil-exc": (lambda: nn.AvgPool2d(3, 2, 1, ceil_mode=True, count_include_pad=False),
                       (1, 2, 6, 4), (3, 2, 1, "average_exc_pad", True)),
    "avg2d-torch-order": (lambda: nn.AvgPool2d(3, 2, 1, True, True), (1, 1, 6, 5),
                          (3, 2, 1, "average_inc_pad", True)),
    "avg3d": (lambda: nn.AvgPool3d(2), (1, 2, 2, 4, 4), (2, 2, 0, "average_inc_pad", False)),
    "avg3d-ceil-inc": (lambda: nn.AvgPool3d((2, 3, 2), (2, 2, 2), (1, 1, 0), ceil_mode=True),
                       (1, 1, 4, 4, 5), ((2, 3, 2), 2, (1, 1, 0), "average_inc_pad", True)),
}


def _x(rng, name, shape):
    if name.startswith("max"):      # tie-free, away from the kinks
        return rng.permutation(np.arange(np.prod(shape), dtype=np.float64)).reshape(shape) * 0.1
    return rng.standard_normal(shape)


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("name", list(MODULES))
def test_pooling_module_matches_the_reference(rng, name, backend):
    make, shape, (k, s, p, mode, ceil) = MODULES[name]
    m = nn.convert(make(), backend)
    x = _x(rng, name, shape)
    with dnnkit.no_grad():
        y = m(x).numpy()
    np.testing.assert_allclose(y, reference.pool_forward(x, k, s, p, mode, ceil), rtol=1e-12)
    if ceil:     # ceil mode adds a window here, so the flag must have reached the op
        assert y.shape != reference.pool_forward(x, k, s, p, mode).shape


@pytest.mark.parametrize("name", list(MODULES))
def test_pooling_module_gradient_matches_finite_differences(rng, name):
    make, shape, _ = MODULES[name]
    m = make()
    xt = dnnkit.tensor(_x(rng, name, shape), requires_grad=True)
    with dnnkit.no_grad():
        r = rng.standard_normal(m(xt).shape)
    directional_check(lambda: weighted_sum(m(xt), r), [xt], rng, rtol=1e-6)


def test_avgpool3d_takes_pytorchs_arguments_in_pytorchs_order():
    m = nn.AvgPool3d(3, 2, 1, True, False)       # kernel, stride, padding, ceil, count_include_pad
    assert m.args == ((3, 3, 3), (2, 2, 2), (1, 1, 1)) and m.ceil_mode
    assert m.mode == "average_exc_pad"
    assert nn.AvgPool3d(2).mode == "average_inc_pad" and not nn.AvgPool3d(2).ceil_mode
    assert repr(m) == ("AvgPool3d(kernel_size=(3, 3, 3), stride=(2, 2, 2), padding=(1, 1, 1), "
                       "ceil_mode=True, count_include_pad=False)")
    assert repr(nn.MaxPool2d(2)) == \
        "MaxPool2d(kernel_size=(2, 2), stride=(2, 2), padding=(0, 0), ceil_mode=False)"


@pytest.mark.parametrize("make,exc,words", [
    (lambda: nn.MaxPool2d(2, ceil_mode=1), TypeError, ["MaxPool2d", "ceil_mode", "1"]),
    (lambda: nn.MaxPool3d(2, ceil_mode="yes"), TypeError, ["MaxPool3d", "ceil_mode", "'yes'"]),
    (lambda: nn.AvgPool2d(2, ceil_mode=None), TypeError, ["AvgPool2d", "ceil_mode", "None"]),
    (lambda: nn.AvgPool3d(0), ValueError, ["AvgPool3d", "kernel_size", "0"]),
    (lambda: nn.AvgPool3d((2, 2)), TypeError, ["AvgPool3d", "kernel_size", "(2, 2)"]),
    (lambda: nn.AvgPool3d(2, padding=2), ValueError, ["AvgPool3d", "padding", "kernel_size"]),
    (lambda: nn.AvgPool3d(2, count_include_pad=0), TypeError, ["AvgPool3d",
                                                               "count_include_pad", "0"]),
])
def test_pooling_constructor_errors_name_layer_and_value(make, exc, words):
    with pytest.raises(exc) as ei:
        make()
    for w in words:
        assert w in str(ei.value), (w, str(ei.value))


def test_ceil_mode_window_wider_than_the_input_is_checked_at_call_time():
    """The op's rule: ceil mode allows a window wider than the padded input by up to
    stride - 1 (PyTorch's), and refuses more, naming the op."""
    x = np.ones((1, 1, 2, 2))
    assert nn.MaxPool2d(3, 2, ceil_mode=True)(x).shape == (1, 1, 1, 1)
    with pytest.raises(ValueError, match="pool2d.*window 4.*ceil_mode"):
        nn.AvgPool2d(4, 2, ceil_mode=True)(x)
