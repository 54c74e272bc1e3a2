"""nn.ConvTranspose2d / nn.ConvTranspose3d: gradients of input and parameters by finite
differences in float64, PyTorch's weight layout, initialisation and state-dict names (a dict
written by hand in PyTorch's layout gives the definition's output), ``output_size``, backend
pinning, the repr and constructor errors."""

import math

import numpy as np
import pytest

import dnnkit
from dnnkit import nn
from tests.nn.gradcheck import directional_check, weighted_sum
from tests.ops.test_conv_transpose import ref_transpose

LAYERS = {
    "2d": (lambda: nn.ConvTranspose2d(2, 3, 3, stride=2, padding=1, output_padding=1,
                                      dtype="float64", seed=0), (2, 2, 2, 3)),
    "2d_groups_dilation": (lambda: nn.ConvTranspose2d(4, 2, (2, 1), stride=(1, 2), groups=2,
                                                      dilation=(2, 1), dtype="float64",
                                                      seed=1), (1, 4, 2, 2)),
    "2d_no_bias": (lambda: nn.ConvTranspose2d(2, 2, 2, bias=False, dtype="float64", seed=2),
                   (1, 2, 2, 2)),
    "3d": (lambda: nn.ConvTranspose3d(1, 2, 2, stride=(1, 2, 1), dtype="float64", seed=3),
           (1, 1, 2, 1, 2)),
}


@pytest.mark.parametrize("name", list(LAYERS))
def test_layer_gradients_match_finite_differences(rng, name):
    make, shape = LAYERS[name]
    m = make()
    xt = dnnkit.tensor(rng.standard_normal(shape), requires_grad=True)
    with dnnkit.no_grad():
        y = m(xt)
    r = rng.standard_normal(y.shape)
    directional_check(lambda: weighted_sum(m(xt), r), [xt] + m.parameters(), rng)


def test_weight_layout_and_init_are_pytorchs():
    """weight (in, out/groups, *kernel) and bias (out,), both U(+-1/sqrt(fan_in)) with
    fan_in = out/groups * prod(kernel) (PyTorch reads it from the weight's dim 1), drawn from
    the seeded generator weight first."""
    m = nn.ConvTranspose2d(6, 4, (3, 2), groups=2, seed=5)
    assert m.weight.shape == (6, 2, 3, 2) and m.bias.shape == (4,)
    assert m.weight.dtype == np.float32
    bound = 1 / math.sqrt(2 * 3 * 2)
    rng = np.random.default_rng(5)
    np.testing.assert_array_equal(m.weight.numpy(),
                                  rng.uniform(-bound, bound, (6, 2, 3, 2)).astype(np.float32))
    np.testing.assert_array_equal(m.bias.numpy(), rng.uniform(-bound, bound, 4)
                                  .astype(np.float32))
    m3 = nn.ConvTranspose3d(2, 3, 2, bias=False, dtype="float64", seed=0)
    assert m3.weight.shape == (2, 3, 2, 2, 2) and m3.bias is None
    assert np.abs(m3.weight.numpy()).max() <= 1 / math.sqrt(3 * 8)


def test_state_dict_is_pytorchs(rng):
    """A dict in PyTorch's names and layout loads, gives the definition's output (the scatter
    reference of tests/ops/test_conv_transpose.py) and comes back unchanged."""
    sd = {"0.weight": rng.standard_normal((4, 1, 3, 3)), "0.bias": rng.standard_normal(2),
          "2.weight": rng.standard_normal((2, 3, 2, 1, 2))}
    m = nn.Sequential(nn.ConvTranspose2d(4, 2, 3, stride=2, padding=1, output_padding=(1, 0),
                                         groups=2, dtype="float64", seed=0),
                      nn.Identity(),
                      nn.ConvTranspose3d(2, 3, (2, 1, 2), bias=False, dtype="float64", seed=1))
    assert list(m.state_dict()) == list(sd)
    m.load_state_dict(sd)
    x = rng.standard_normal((1, 4, 2, 3))
    with dnnkit.no_grad():
        y2 = m[0](x)
        y3 = m[2](dnnkit.reshape(y2, (1, 2, 1) + y2.shape[2:]))
    want2 = ref_transpose(x, sd["0.weight"], sd["0.bias"], 2, 1, (1, 0), 1, 2)
    np.testing.assert_allclose(y2.numpy(), want2, rtol=1e-12)
    want3 = ref_transpose(want2.reshape((1, 2, 1) + want2.shape[2:]), sd["2.weight"])
    np.testing.assert_allclose(y3.numpy(), want3, rtol=1e-12)
    back = m.state_dict()
    for k in sd:
        np.testing.assert_array_equal(back[k], sd[k])


def test_a_conv2d_layout_weight_is_refused():
    """(out, in, kh, kw), Conv2d's layout, is not ConvTranspose2d's (in, out, kh, kw)."""
    m = nn.ConvTranspose2d(2, 3, 2)
    with pytest.raises(ValueError, match=r"weight has shape \(3, 2, 2, 2\)"):
        m.load_state_dict({"weight": np.ones((3, 2, 2, 2), np.float32),
                           "bias": np.ones(3, np.float32)})


def test_output_size_picks_the_output_padding(rng):
    m = nn.ConvTranspose2d(1, 1, 3, stride=2, padding=1, dtype="float64", seed=0)
    x = rng.standard_normal((1, 1, 3, 4))
    assert m(x).shape == (1, 1, 5, 7)
    y = m(x, output_size=(6, 7))
    assert y.shape == (1, 1, 6, 7)
    with dnnkit.no_grad():
        want = dnnkit.conv_transpose2d(x, m.weight, m.bias, stride=2, padding=1,
                                       output_padding=(1, 0))
    np.testing.assert_array_equal(y.numpy(), want.numpy())
    assert m(x, output_size=[1, 1, 6, 8]).shape == (1, 1, 6, 8)       # the whole shape
    with pytest.raises(ValueError, match=r"output_size \(7, 7\).*\(5, 7\) and \(6, 8\)"):
        m(x, output_size=(7, 7))
    with pytest.raises(ValueError, match="output_size must give the 2 spatial sizes"):
        m(x, output_size=(1, 6, 7))


def test_backend_pinning_reaches_the_ops(rng):
    m = nn.ConvTranspose2d(2, 2, 2, seed=0)
    nn.convert(m, "numba")
    with dnnkit.trace() as t:
        m(rng.standard_normal((1, 2, 2, 2)).astype(np.float32))
    assert t.ops() == ["conv2d_backward_data", "reshape", "add"]
    assert set(t.backends()) == {"numba"}


def test_repr():
    assert repr(nn.ConvTranspose2d(4, 2, 3, stride=2, output_padding=1, groups=2,
                                   bias=False)) == (
        "ConvTranspose2d(4, 2, kernel_size=(3, 3), stride=(2, 2), padding=(0, 0), "
        "output_padding=(1, 1), groups=2, bias=False)")
    assert repr(nn.ConvTranspose3d(1, 1, 1)) == (
        "ConvTranspose3d(1, 1, kernel_size=(1, 1, 1), stride=(1, 1, 1), padding=(0, 0, 0))")


@pytest.mark.parametrize("args,kw,exc,words", [
    ((4, 3, 3), dict(groups=2), ValueError, ["groups=2", "out_channels=3"]),
    ((2, 2, 3), dict(stride=2, output_padding=2), ValueError,
     ["ConvTranspose2d", "output_padding=(2, 2)", "stride=(2, 2)", "dilation=(1, 1)"]),
    ((2, 2, 3), dict(padding="same"), TypeError, ["padding", "'same'"]),
    ((2, 2, 0), {}, ValueError, ["kernel_size", "0"]),
    ((0, 2, 3), {}, ValueError, ["in_channels", "0"]),
    ((2, 2, 3), dict(bias=1), TypeError, ["bias", "1"]),
    ((2, 2, 3), dict(dtype="int32"), TypeError, ["dtype", "int32"]),
])
def test_constructor_errors_name_the_values(args, kw, exc, words):
    with pytest.raises(exc) as e:
        nn.ConvTranspose2d(*args, **kw)
    for word in words:
        assert word in str(e.value), (word, str(e.value))


def test_3d_constructor_checks_name_its_class():
    with pytest.raises(ValueError, match=r"ConvTranspose3d: output_padding.*\(0, 0, 1\)"):
        nn.ConvTranspose3d(1, 1, 2, output_padding=(0, 0, 1))
