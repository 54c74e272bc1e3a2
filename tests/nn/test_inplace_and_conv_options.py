"""``inplace=True`` on the activation and dropout layers (a small model trains to the same
gradients as its out-of-place twin; a graph that needs an overwritten value refuses), and the
convolution layers' ``mode`` / ``algo`` / ``precision`` options (passed to the op, in repr, not
in the state dict; mode="conv" flips the filter)."""

import numpy as np
import pytest

import dnnkit
from dnnkit import nn
from tests.conftest import backend_params
from tests.nn.gradcheck import directional_check, weighted_sum


def _model(inplace, backend):
    m = nn.Sequential(
        nn.Conv2d(2, 3, 3, padding=1, dtype="float64", seed=1),
        nn.BatchNorm2d(3, dtype="float64"),
        nn.ReLU(inplace=inplace),
        nn.Conv2d(3, 2, 3, dtype="float64", seed=2),
        nn.ELU(0.8, inplace=inplace),
        nn.Flatten(),
        nn.Linear(2 * 2 * 2, 3, dtype="float64", seed=3),
        # its gradient needs only the mask; p = 0.5: cuDNN's float32 p gives 1/(1 - p)
        # exactly, as float64 data requires of it
        nn.Dropout(0.5, inplace, seed=4),
        nn.Tanh(inplace=inplace))
    return nn.convert(m, backend)


@pytest.mark.parametrize("backend", backend_params())
def test_in_place_model_equals_out_of_place(rng, backend):
    x = rng.standard_normal((2, 2, 4, 4))
    outs, grads = [], []
    for inplace in (False, True):
        m = _model(inplace, backend)
        xt = dnnkit.tensor(x, requires_grad=True)
        y = m(xt)
        (y * y).sum().backward()
        outs.append(y.numpy())
        grads.append([xt.grad.numpy()] + [p.grad.numpy() for p in m.parameters()])
    np.testing.assert_allclose(outs[1], outs[0], rtol=1e-12)
    for a, b in zip(grads[1], grads[0]):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-13)


def test_in_place_relu_after_sigmoid_is_refused_at_backward(rng):
    m = nn.Sequential(nn.Linear(3, 4, dtype="float64", seed=0), nn.Sigmoid(),
                      nn.ReLU(inplace=True))
    y = m(rng.standard_normal((2, 3)))
    with pytest.raises(RuntimeError, match=r"activation: its output 0 .* changed in place"):
        y.sum().backward()


def test_in_place_clipped_relu_is_inference_only(rng):
    m = nn.Sequential(nn.Linear(3, 4, dtype="float64", seed=0), nn.ClippedReLU(0.5, True))
    with dnnkit.no_grad():
        y = m(rng.standard_normal((2, 3)))
    assert y.numpy().max() <= 0.5
    y = m(rng.standard_normal((2, 3)))
    with pytest.raises(RuntimeError, match="gradient of clipped_relu needs its input x"):
        y.sum().backward()


def test_in_place_layer_returns_its_input_changed():
    x = dnnkit.tensor(np.array([[-1.0, 2.0]]))
    y = nn.ReLU(inplace=True)(x)
    assert y is x and x.version == 1
    np.testing.assert_array_equal(x.numpy(), [[0.0, 2.0]])
    with pytest.raises(TypeError, match="ReLU: inplace must be a bool"):
        nn.ReLU(inplace="yes")


# ---------------------------------------------------------------- convolution options


def _flip(w, nd):
    return np.ascontiguousarray(w[(Ellipsis,) + (slice(None, None, -1),) * nd])


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("nd", [2, 3])
def test_conv_mode_conv_flips_the_filter(rng, nd, backend):
    cls = nn.Conv2d if nd == 2 else nn.Conv3d
    conv = nn.convert(cls(2, 3, 2, padding=1, dtype="float64", seed=5, mode="conv"), backend)
    cross = nn.convert(cls(2, 3, 2, padding=1, dtype="float64", seed=5), backend)
    cross.load_state_dict({"weight": _flip(conv.weight.numpy(), nd),
                           "bias": conv.bias.numpy()})
    x = rng.standard_normal((1, 2) + (3,) * nd)
    np.testing.assert_allclose(conv(x).numpy(), cross(x).numpy(), rtol=1e-12)


def test_conv_mode_conv_gradients_match_finite_differences(rng):
    m = nn.Conv2d(2, 2, (2, 3), dtype="float64", seed=0, mode="conv")
    xt = dnnkit.tensor(rng.standard_normal((1, 2, 3, 4)), requires_grad=True)
    r = rng.standard_normal((1, 2, 2, 2))
    directional_check(lambda: weighted_sum(m(xt), r), [xt] + m.parameters(), rng, rtol=1e-6)


@pytest.mark.parametrize("cls,direction,algo", [
    (nn.Conv2d, "fwd", "direct"), (nn.Conv3d, "fwd", "fft_tiling"),
    (nn.ConvTranspose2d, "bwd_data", "deterministic"),
    (nn.ConvTranspose3d, "bwd_data", "winograd_non_fused")])
def test_options_reach_the_op_and_stay_out_of_the_state(rng, cls, direction, algo):
    plain = cls(2, 2, 2, dtype="float64", seed=0)
    m = cls(2, 2, 2, dtype="float64", seed=0, mode="conv", algo=algo, precision="float64")
    assert "mode='conv'" in repr(m) and f"algo='{algo}'" in repr(m) and \
        "precision='float64'" in repr(m)
    assert "mode" not in repr(plain) and "algo" not in repr(plain)
    assert list(m.state_dict()) == list(plain.state_dict())
    plain.load_state_dict(m.state_dict())           # interchangeable
    seen = {}
    op = m._op

    def spy(*args, **kw):
        seen.update(kw)
        return op(*args, **kw)
    m._op = spy
    nd = 2 if "2d" in cls.__name__ else 3
    m(rng.standard_normal((1, 2) + (3,) * nd))
    assert (seen["mode"], seen["algo"], seen["precision"]) == ("conv", algo, "float64")


@pytest.mark.parametrize("kw,words", [
    ({"mode": "convolution"}, ["Conv2d: mode must be one of cross, conv", "'convolution'"]),
    ({"algo": "deterministic"}, ["Conv2d: algo must be one of", "'deterministic'"]),
    ({"precision": "half"}, ["Conv2d: precision must be one of", "'half'"]),
])
def test_bad_conv_options_name_the_layer(kw, words):
    with pytest.raises(ValueError) as e:
        nn.Conv2d(1, 1, 1, **kw)
    for w in words:
        assert w in str(e.value)
    with pytest.raises(ValueError, match="ConvTranspose2d: algo must be one of"):
        nn.ConvTranspose2d(1, 1, 1, algo="direct")      # a forward algorithm


@pytest.mark.parametrize("backend", backend_params())
def test_conv_transpose_mode_conv_flips_the_filter(rng, backend):
    conv = nn.convert(nn.ConvTranspose2d(2, 3, 3, stride=2, dtype="float64", seed=7,
                                         mode="conv"), backend)
    cross = nn.convert(nn.ConvTranspose2d(2, 3, 3, stride=2, dtype="float64", seed=7),
                       backend)
    cross.load_state_dict({"weight": _flip(conv.weight.numpy(), 2), "bias": conv.bias.numpy()})
    x = rng.standard_normal((1, 2, 3, 3))
    np.testing.assert_allclose(conv(x).numpy(), cross(x).numpy(), rtol=1e-12)
