"""nn.LocalResponseNorm: the op with the layer's arguments on both backends, its gradient
against central differences (float64), in a model, constructor and input errors naming the
layer, no parameters or state, and its repr."""

import numpy as np
import pytest

import dnnkit
from dnnkit import nn, reference
from tests.conftest import backend_params
from tests.nn.gradcheck import directional_check, weighted_sum


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("shape", [(2, 6, 3), (1, 5, 2, 3), (1, 4, 2, 2, 1)])
def test_forward_is_the_op(rng, shape, backend):
    m = nn.convert(nn.LocalResponseNorm(3, alpha=2.0, beta=0.5, k=1.5), backend)
    x = rng.standard_normal(shape).astype(np.float32)
    with dnnkit.trace() as t:
        y = m(x)
    assert t.ops() == ["lrn"] and t.backends() == [backend]
    assert isinstance(y, dnnkit.Tensor) and y.shape == shape
    np.testing.assert_allclose(y.numpy(), reference.lrn(x, 3, 2.0, 0.5, 1.5), rtol=2e-6)
    m.eval()
    np.testing.assert_array_equal(m(x).numpy(), y.numpy())      # no mode of its own


@pytest.mark.parametrize("size", [2, 5])
def test_gradient_matches_finite_differences(rng, size):
    m = nn.LocalResponseNorm(size, alpha=3.0, beta=0.75, k=1.0)
    x = dnnkit.tensor(rng.standard_normal((2, 6, 2, 2)), requires_grad=True)
    r = rng.standard_normal((2, 6, 2, 2))
    directional_check(lambda: weighted_sum(m(x), r), [x], rng, directions=3)


def test_in_a_model_between_a_convolution_and_a_pooling(rng):
    """AlexNet's order: conv, ReLU, LRN, max pooling; every parameter gets its gradient."""
    model = nn.Sequential(nn.Conv2d(2, 6, 3, padding=1, dtype="float64", seed=0), nn.ReLU(),
                          nn.LocalResponseNorm(5, alpha=1.0, k=2.0), nn.MaxPool2d(2))
    x = dnnkit.tensor(rng.permutation(np.arange(2 * 2 * 4 * 4, dtype=np.float64))
                      .reshape(2, 2, 4, 4) * 0.05, requires_grad=True)
    r = rng.standard_normal((2, 6, 2, 2))
    directional_check(lambda: weighted_sum(model(x), r), [x] + model.parameters(), rng)


def test_defaults_no_parameters_and_repr():
    m = nn.LocalResponseNorm(5)
    assert (m.size, m.alpha, m.beta, m.k) == (5, 1e-4, 0.75, 1.0)     # PyTorch's defaults
    assert m.parameters() == [] and m.state_dict() == {}
    assert repr(m) == "LocalResponseNorm(5, alpha=0.0001, beta=0.75, k=1.0)"
    assert repr(nn.LocalResponseNorm(np.int64(2), 1, 2, 3)) == \
        "LocalResponseNorm(2, alpha=1.0, beta=2.0, k=3.0)"


@pytest.mark.parametrize("args,exc,words", [
    ((0,), ValueError, ["size", "0"]),
    ((2.0,), TypeError, ["size", "2.0"]),
    ((True,), TypeError, ["size", "True"]),
    ((5, "a"), TypeError, ["alpha", "'a'"]),
    ((5, 1e-4, float("nan")), ValueError, ["beta", "nan"]),
    ((5, 1e-4, 0.75, float("-inf")), ValueError, ["k", "-inf"]),
])
def test_bad_constructor_arguments_name_the_layer(args, exc, words):
    with pytest.raises(exc) as ei:
        nn.LocalResponseNorm(*args)
    for w in ["LocalResponseNorm"] + words:
        assert w in str(ei.value), (w, str(ei.value))


def test_input_of_the_wrong_rank_is_refused():
    with pytest.raises(ValueError, match=r"LocalResponseNorm: input must be 3-D to 5-D .*\(2, 3\)"):
        nn.LocalResponseNorm(3)(np.ones((2, 3), np.float32))
