"""dnnkit.nn: every layer's backward (input and parameter gradients) against central finite
differences of its own forward in float64 on tiny shapes (the Numba backend on the simulator;
cuDNN where present), composition, state, modes, backend pinning and the backend record."""

import numpy as np
import pytest

import dnnkit
from dnnkit import nn


def _host(a):
    return a.copy_to_host() if hasattr(a, "copy_to_host") else np.asarray(a)


def _loss(m, x, r):
    return float(np.sum(_host(m.forward(x)).astype(np.float64) * r))


def _fd_check(m, x, h=1e-6, tol=1e-6):
    """dx and every parameter's gradient of sum(y * r) against central differences."""
    rng = np.random.default_rng(7)
    y = _host(m.forward(x))
    r = rng.standard_normal(y.shape)
    m.zero_grad()
    m.forward(x)
    dx = _host(m.backward(r))
    num = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        xp, xm = x.copy(), x.copy()
        xp[i] += h
        xm[i] -= h
        num[i] = (_loss(m, xp, r) - _loss(m, xm, r)) / (2 * h)
    assert np.abs(dx - num).max() <= tol * max(1.0, np.abs(num).max()), "dx"
    for name, p in m.named_parameters():
        w = p.numpy()
        g = p.grad.copy_to_host()
        num = np.zeros_like(w)
        for i in np.ndindex(w.shape):
            for sign in (1, -1):
                wp = w.copy()
                wp[i] += sign * h
                p.data.copy_to_device(wp)
                num[i] += sign * _loss(m, x, r) / (2 * h)
        p.data.copy_to_device(w)
        assert np.abs(g - num).max() <= tol * max(1.0, np.abs(num).max()), name


LAYERS = {
    "conv2d": (lambda: nn.Conv2d(2, 3, 3, padding=1, dtype="float64", seed=0), (2, 2, 3, 3)),
    "conv3d": (lambda: nn.Conv3d(1, 2, 2, dtype="float64", seed=0), (1, 1, 2, 3, 3)),
    "linear": (lambda: nn.Linear(4, 3, dtype="float64", seed=0), (2, 4)),
    "maxpool": (lambda: nn.MaxPool2d(2), (1, 2, 4, 4)),
    "avgpool": (lambda: nn.AvgPool2d(3, 2, 1), (1, 2, 4, 4)),
    "maxpool3d": (lambda: nn.MaxPool3d(2), (1, 1, 2, 4, 4)),
    "relu": (nn.ReLU, (2, 5)),
    "tanh": (nn.Tanh, (2, 5)),
    "sigmoid": (nn.Sigmoid, (2, 5)),
    "elu": (lambda: nn.ELU(0.7), (2, 5)),
    "clipped": (lambda: nn.ClippedReLU(0.5), (2, 5)),
    "softmax": (nn.Softmax, (2, 4)),
    "logsoftmax": (lambda: nn.LogSoftmax("channel"), (2, 3, 2, 2)),
    "bn1d": (lambda: nn.BatchNorm1d(3, dtype="float64"), (4, 3)),
    "bn2d": (lambda: nn.BatchNorm2d(2, dtype="float64"), (3, 2, 2, 2)),
    "flatten": (nn.Flatten, (2, 2, 3)),
}


@pytest.mark.parametrize("name", list(LAYERS))
def test_layer_gradients_match_finite_differences(rng, name):
    make, shape = LAYERS[name]
    m = make()
    x = rng.standard_normal(shape)
    if "pool" in name and "max" in name:          # tie-free, away from kinks
        x = rng.permutation(np.arange(x.size, dtype=np.float64)).reshape(shape) * 0.1
    if name in ("relu", "clipped"):
        x = x + np.sign(x) * 0.05                  # away from the kinks at 0 (and 0.5)
        x[np.abs(x - 0.5) < 0.05] += 0.1
    _fd_check(m, x)


def test_spatial_transformer_gradients(rng):
    m = nn.SpatialTransformer()
    img = rng.standard_normal((1, 1, 3, 4))
    theta = np.array([[[0.9, 0.1, 0.05], [-0.1, 0.8, 0.02]]])
    y = _host(m.forward((img, theta)))
    r = rng.standard_normal(y.shape)
    dimg, dtheta = (_host(a) for a in m.backward(r))
    h = 1e-6
    for arr, grad, which in ((img, dimg, 0), (theta, dtheta, 1)):
        num = np.zeros_like(arr)
        for i in np.ndindex(arr.shape):
            vals = []
            for sign in (1, -1):
                a = arr.copy()
                a[i] += sign * h
                args = (a, theta) if which == 0 else (img, a)
                vals.append(float(np.sum(_host(m.forward(args)) * r)))
            num[i] = (vals[0] - vals[1]) / (2 * h)
        assert np.abs(grad - num).max() <= 1e-5 * max(1.0, np.abs(num).max())


@pytest.mark.parametrize("cls", [nn.LSTM, nn.GRU, nn.RNN])
def test_recurrent_layer_gradients(rng, cls):
    m = cls(2, 2, dtype="float64", seed=1)      # tiny: every probe is a full simulated run
    _fd_check(m, rng.standard_normal((2, 1, 2)), tol=1e-5)


def test_sequential_trains_and_state_round_trips(rng, tmp_path):
    def model():
        return nn.Sequential(nn.Conv2d(1, 2, 3, padding=1, dtype="float64", seed=3),
                             nn.BatchNorm2d(2, dtype="float64"), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Flatten(), nn.Linear(8, 3, dtype="float64", seed=4))
    m = model()
    x = rng.standard_normal((3, 1, 4, 4))
    m.forward(x)          # updates the running statistics
    m.eval()
    y = _host(m.forward(x))
    path = tmp_path / "m.npz"
    m.save(path)
    m2 = model().load(path).eval()
    np.testing.assert_array_equal(_host(m2.forward(x)), y)
    assert set(m.state_dict()) == {"0.weight", "0.bias", "1.weight", "1.bias",
                                   "1.running_mean", "1.running_var", "5.conv.weight",
                                   "5.conv.bias"}
    with pytest.raises(ValueError, match="missing"):
        m2.load_state_dict({"0.weight": m.state_dict()["0.weight"]})
    with pytest.raises(ValueError, match="shape"):
        m2.load_state_dict(dict(m.state_dict(), **{"0.bias": np.zeros(5)}))


def test_train_eval_modes(rng):
    d = nn.Dropout(0.5, seed=1)
    x = rng.standard_normal((4, 8)).astype(np.float32)
    assert np.count_nonzero(_host(d.forward(x))) < x.size
    d.eval()
    assert d.forward(x) is x and d.backward(x) is x
    bn = nn.BatchNorm1d(8).eval()
    bn.forward(x)
    with pytest.raises(ValueError, match="eval mode"):
        bn.backward(x)


def test_convert_pins_records_and_prints(rng):
    m = nn.Sequential(nn.Linear(3, 2, seed=0), nn.ReLU())
    nn.convert(m, "numba", exclude=lambda mod: isinstance(mod, nn.ReLU))
    assert [mod.backend for mod in m.modules()] == ["numba", "numba", "numba", None]
    assert "Linear(in_features=3, out_features=2, backend=numba" in repr(m)
    m.forward(rng.standard_normal((2, 3)).astype(np.float32))
    assert m[0].conv.used == {"conv2d": "numba"}
    nn.convert(m, "auto")
    assert all(mod.backend is None for mod in m.modules())
    with pytest.raises(ValueError, match="backend"):
        nn.convert(m, "cuda")


def test_backward_follows_the_forward_backend(rng, monkeypatch):
    """The gradient ops run where the forward ran, whatever the policy says by then."""
    conv = nn.Conv2d(1, 1, 2, seed=0)
    x = rng.standard_normal((1, 1, 3, 3)).astype(np.float32)
    with dnnkit.config.change_flags({"dnn.enabled": "disabled"}):
        conv.forward(x)
    assert conv.used["conv2d"] == "numba"
    with dnnkit.trace() as t:
        conv.backward(np.ones((1, 1, 2, 2), np.float32))
    assert set(t.backends()) == {"numba"}


def test_profile_counts_calls_per_op_and_backend(rng):
    x = rng.standard_normal((4, 8)).astype(np.float32)
    with dnnkit.profile() as p:
        for _ in range(3):
            dnnkit.relu(x, backend="numba")
        dnnkit.softmax(x, backend="numba")
    assert {(r.op, r.backend, r.calls) for r in p.rows.values()} == {
        ("activation", "numba", 3), ("softmax", "numba", 1)}
    assert all(r.ms >= 0 and r.first_ms >= 0 for r in p.rows.values())
    lines = str(p).splitlines()
    assert lines[0].split() == ["op", "backend", "calls", "total", "ms", "ms/call", "share",
                                "first", "ms"]
    assert len(lines) == 4 and lines[-1].startswith("(total, ms/call and share: every call after")
    with dnnkit.trace() as t:          # outside the block nothing is recorded
        dnnkit.relu(x, backend="numba")
    assert len(p.rows) == 2 and t.ops() == ["activation"]
