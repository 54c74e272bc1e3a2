"""nn.BatchNorm1d/2d/3d options, as PyTorch's: ``affine=False`` (no weight and bias, nor their
state entries) and ``track_running_stats=False`` (batch statistics in eval mode too, no running
statistics), against float64 references; eval-mode gradients against central differences."""

import numpy as np
import pytest

import dnnkit
from dnnkit import nn
from tests.conftest import REL_TOL, backend_params
from tests.nn.gradcheck import directional_check, weighted_sum

EPS = 1e-5
SHAPES = {nn.BatchNorm1d: (4, 3), nn.BatchNorm2d: (3, 3, 2, 2), nn.BatchNorm3d: (2, 3, 2, 1, 2)}


def _normalized(x, mean, var, eps=EPS):
    """(x - mean) / sqrt(var + eps), the statistics per channel (dim 1)."""
    c = (None, slice(None)) + (None,) * (x.ndim - 2)
    return (x - mean[c]) / np.sqrt(var[c] + eps)


def _batch_stats(x):
    axes = (0,) + tuple(range(2, x.ndim))
    return x.mean(axis=axes), x.var(axis=axes)


def _close(got, want, dtype):
    err = np.abs(got.astype(np.float64) - want).max() / max(np.abs(want).max(), 1e-30)
    assert err <= REL_TOL[dtype], err


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("cls", list(SHAPES))
def test_affine_false_normalizes_without_parameters(rng, cls, dtype, backend):
    bn = cls(3, affine=False, dtype=dtype)
    bn.backend = backend
    assert bn.weight is None and bn.bias is None and bn.parameters() == []
    x = rng.standard_normal(SHAPES[cls]).astype(dtype)
    x64 = x.astype(np.float64)
    with dnnkit.no_grad():
        y = bn(x).numpy()
    mean, var = _batch_stats(x64)
    _close(y, _normalized(x64, mean, var), dtype)
    m = x64[:, 0].size                   # values per channel: N * spatial
    np.testing.assert_allclose(bn.running_mean.numpy(), 0.1 * mean, rtol=2e-3, atol=1e-6)
    np.testing.assert_allclose(bn.running_var.numpy(), 0.9 + 0.1 * var * m / (m - 1),
                               rtol=2e-3)
    assert bn.num_batches_tracked == 1
    bn.eval()
    with dnnkit.no_grad():
        y = bn(x).numpy()
    _close(y, _normalized(x64, bn.running_mean.numpy().astype(np.float64),
                          bn.running_var.numpy().astype(np.float64)), dtype)


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("affine", [True, False])
def test_no_running_stats_uses_the_batch_in_eval_too(rng, affine, backend):
    bn = nn.BatchNorm2d(3, affine=affine, track_running_stats=False, dtype="float64")
    bn.backend = backend
    assert bn.running_mean is None and bn.running_var is None and bn.buffers() == []
    assert bn.num_batches_tracked is None
    if affine:
        bn.weight.data.copy_to_device(rng.uniform(0.5, 2, 3))
        bn.bias.data.copy_to_device(rng.standard_normal(3))
    x = rng.standard_normal((3, 3, 2, 2))
    mean, var = _batch_stats(x)
    want = _normalized(x, mean, var)
    if affine:
        c = (None, slice(None), None, None)
        want = want * bn.weight.numpy()[c] + bn.bias.numpy()[c]
    with dnnkit.no_grad():
        train = bn(x).numpy()
        bn.eval()
        evald = bn(x).numpy()
    np.testing.assert_allclose(train, want, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(evald, train)
    assert bn.num_batches_tracked is None


@pytest.mark.parametrize("affine,track,keys", [
    (True, True, ["weight", "bias", "running_mean", "running_var", "num_batches_tracked"]),
    (False, True, ["running_mean", "running_var", "num_batches_tracked"]),
    (True, False, ["weight", "bias"]),
    (False, False, []),
])
def test_state_dict_has_pytorchs_keys(rng, affine, track, keys):
    bn = nn.BatchNorm2d(3, affine=affine, track_running_stats=track, dtype="float64")
    assert list(bn.state_dict()) == keys
    sd = {k: (np.array(5, np.int64) if k == "num_batches_tracked" else rng.uniform(0.5, 2, 3))
          for k in keys}
    other = nn.BatchNorm2d(3, affine=affine, track_running_stats=track, dtype="float64")
    back = other.load_state_dict(sd).state_dict()
    for k in keys:
        np.testing.assert_array_equal(back[k], sd[k])
    assert repr(bn) == (f"BatchNorm2d(3, eps=1e-05, momentum=0.1, affine={affine}, "
                        f"track_running_stats={track})")


def test_an_affine_state_dict_does_not_fit_affine_false():
    full = nn.BatchNorm2d(3).state_dict()
    bn = nn.BatchNorm2d(3, affine=False)
    with pytest.raises(ValueError, match="weight"):
        bn.load_state_dict(full)
    bn.load_state_dict(full, strict=False)          # the statistics, the rest ignored
    assert bn.weight is None


@pytest.mark.parametrize("kw,err,words", [
    (dict(affine="yes"), TypeError, ["BatchNorm2d", "affine", "'yes'"]),
    (dict(affine=1), TypeError, ["BatchNorm2d", "affine", "1"]),
    (dict(track_running_stats=None), TypeError, ["BatchNorm2d", "track_running_stats", "None"]),
])
def test_option_checks_name_the_layer(kw, err, words):
    with pytest.raises(err) as ei:
        nn.BatchNorm2d(3, **kw)
    for w in words:
        assert w in str(ei.value)


def _fd(rng, m, x):
    """Gradients of sum(m(x) * r) wrt x and every parameter of m, by central differences."""
    xt = dnnkit.tensor(x, requires_grad=True)
    with dnnkit.no_grad():
        y = m(xt)
    r = rng.standard_normal(y.shape)
    directional_check(lambda: weighted_sum(m(xt), r), [xt] + m.parameters(), rng)


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("cls", [nn.BatchNorm1d, nn.BatchNorm2d])
def test_eval_mode_gradients_match_finite_differences(rng, cls, affine, backend):
    """Eval mode, frozen running statistics: y is affine in x (and in weight and bias), and its
    gradients come from batch_norm_inference's rule on either backend."""
    bn = cls(3, affine=affine, dtype="float64")
    bn.backend = backend
    with dnnkit.no_grad():
        bn(rng.standard_normal(SHAPES[cls]) * 2 + 1)        # moves the running statistics
    if affine:
        bn.weight.data.copy_to_device(rng.uniform(0.5, 2, 3))
    bn.eval()
    x = rng.standard_normal(SHAPES[cls])
    xt = dnnkit.tensor(x, requires_grad=True)
    y = bn(xt)
    assert y.grad_fn is not None
    want = _normalized(x, bn.running_mean.numpy(), bn.running_var.numpy())
    if affine:
        c = (None, slice(None)) + (None,) * (x.ndim - 2)
        want = want * bn.weight.numpy()[c] + bn.bias.numpy()[c]
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-12, atol=1e-12)
    _fd(rng, bn, x)


@pytest.mark.parametrize("backend", backend_params())
def test_eval_gradient_without_running_stats_is_the_batch_statistics(rng, backend):
    """track_running_stats=False: eval differentiates through the batch statistics too."""
    bn = nn.BatchNorm2d(2, affine=False, track_running_stats=False, dtype="float64").eval()
    bn.backend = backend
    _fd(rng, bn, rng.standard_normal((3, 2, 2, 2)))
