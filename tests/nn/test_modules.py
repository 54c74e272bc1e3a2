"""dnnkit.nn on Tensors: every layer's gradients (input and parameters, through
``loss.backward()``) against central differences of its own forward in float64 on tiny shapes
(the Numba backend on the simulator; cuDNN where present), containers, structure
(named_modules, apply, requires_grad_, hooks), modes, backend pinning, and the repr."""

import numpy as np
import pytest

import dnnkit
from dnnkit import nn
from tests.conftest import backend_params
from tests.nn.gradcheck import directional_check, weighted_sum


def _fd(rng, m, x, *, rtol=1e-6):
    """Gradients of sum(m(x) * r) wrt x and every parameter of m."""
    xt = dnnkit.tensor(x, requires_grad=True)
    with dnnkit.no_grad():
        y = m(xt)
    r = rng.standard_normal(y.shape)
    directional_check(lambda: weighted_sum(m(xt), r), [xt] + m.parameters(), rng, rtol=rtol)


LAYERS = {
    "conv2d": (lambda: nn.Conv2d(2, 3, 3, padding=1, dtype="float64", seed=0), (2, 2, 3, 3)),
    "conv2d_groups": (lambda: nn.Conv2d(2, 4, (1, 2), stride=(1, 2), groups=2, dtype="float64",
                                        seed=0), (1, 2, 2, 4)),
    "conv3d": (lambda: nn.Conv3d(1, 2, 2, dtype="float64", seed=0), (1, 1, 2, 3, 3)),
    "linear": (lambda: nn.Linear(4, 3, dtype="float64", seed=0), (2, 4)),
    "linear_3d": (lambda: nn.Linear(3, 2, bias=False, dtype="float64", seed=1), (2, 2, 3)),
    "maxpool": (lambda: nn.MaxPool2d(2), (1, 2, 4, 4)),
    "avgpool": (lambda: nn.AvgPool2d(3, 2, 1), (1, 2, 4, 4)),
    "maxpool3d": (lambda: nn.MaxPool3d(2), (1, 1, 2, 4, 4)),
    "gap": (nn.GlobalAvgPool2d, (2, 3, 2, 3)),
    "adaptive": (nn.AdaptiveAvgPool2d, (2, 3, 2, 2)),
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
    _fd(rng, m, x)


def test_eval_batchnorm_is_differentiable(rng):
    """Eval mode with a gradient recorded (frozen statistics): the affine map of the running
    statistics, differentiated wrt the input, gamma and beta; its value is
    batch_norm_inference's."""
    bn = nn.BatchNorm2d(2, dtype="float64")
    bn(rng.standard_normal((4, 2, 2, 2)))            # moves the running statistics
    bn.eval()
    x = rng.standard_normal((2, 2, 2, 2))
    with dnnkit.no_grad():
        plain = bn(x).numpy()
    xt = dnnkit.tensor(x, requires_grad=True)
    np.testing.assert_allclose(bn(xt).numpy(), plain, rtol=1e-12, atol=1e-12)
    _fd(rng, bn, x)


def test_dropout_gradient_uses_its_mask(rng):
    d = nn.Dropout(0.4, seed=3)
    x = dnnkit.tensor(rng.standard_normal((3, 5)), requires_grad=True)
    y = d(x)
    y.sum().backward()
    yh, gh = y.numpy(), x.grad.numpy()
    kept = yh != 0
    np.testing.assert_allclose(gh[kept], 1 / 0.6)
    assert not gh[~kept].any() and 0 < kept.sum() < kept.size
    d.eval()
    assert d(x) is x


def test_embedding_gradient_sums_repeated_ids(rng):
    emb = nn.Embedding(5, 3, padding_idx=4, dtype="float64", seed=0)
    assert not emb.weight.numpy()[4].any()
    ids = np.array([[0, 2], [2, 4]])
    r = rng.standard_normal((2, 2, 3))
    weighted_sum(emb(ids), r).backward()
    want = np.zeros((5, 3))
    for (i, j), v in np.ndenumerate(ids):
        if v != 4:
            want[v] += r[i, j]
    np.testing.assert_allclose(emb.weight.grad.numpy(), want, rtol=1e-13)


def test_spatial_transformer_gradients(rng):
    m = nn.SpatialTransformer()
    img = dnnkit.tensor(rng.standard_normal((1, 1, 3, 4)), requires_grad=True)
    theta = dnnkit.tensor(np.array([[[0.9, 0.1, 0.05], [-0.1, 0.8, 0.02]]]), requires_grad=True)
    r = rng.standard_normal((1, 1, 3, 4))
    directional_check(lambda: weighted_sum(m(img, theta), r), [img, theta], rng, rtol=1e-5)
    assert m((img, theta)).shape == (1, 1, 3, 4)           # the pair as one argument too
    with pytest.raises(TypeError, match=r"SpatialTransformer.*\(img, theta\).*one"):
        m(img)


@pytest.mark.parametrize("cls", [nn.LSTM, nn.GRU, nn.RNN])
def test_recurrent_layer_gradients(rng, cls):
    m = cls(2, 2, dtype="float64", seed=1)      # tiny: every probe is a full simulated run
    x = dnnkit.tensor(rng.standard_normal((2, 1, 2)), requires_grad=True)
    hx = dnnkit.tensor(rng.standard_normal((1, 1, 2)), requires_grad=True)
    r, rh = rng.standard_normal((2, 1, 2)), rng.standard_normal((1, 1, 2))

    def loss():          # the output and the final state both reach the loss
        y = m(x, hx)
        return weighted_sum(y, r) + weighted_sum(m.hy, rh)
    directional_check(loss, [x, hx, m.weight], rng, rtol=1e-5)


def test_recurrent_batch_first_is_differentiated(rng):
    m = nn.GRU(2, 3, batch_first=True, dtype="float64", seed=2)
    x = dnnkit.tensor(rng.standard_normal((2, 3, 2)), requires_grad=True)   # (N, T, I)
    y = m(x)
    assert y.shape == (2, 3, 3)
    tm = nn.GRU(2, 3, dtype="float64", seed=2)                               # time-major twin
    with dnnkit.no_grad():
        np.testing.assert_allclose(y.numpy(), tm(np.ascontiguousarray(
            x.numpy().swapaxes(0, 1))).numpy().swapaxes(0, 1), rtol=1e-13)
    r = rng.standard_normal((2, 3, 3))
    directional_check(lambda: weighted_sum(m(x), r), [x, m.weight], rng, rtol=1e-5)


def test_sequential_modulelist_and_structure(rng):
    inner = nn.Sequential(nn.Linear(3, 3, seed=0), nn.ReLU())
    shared = nn.Linear(3, 3, seed=1)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList([inner, nn.Identity()])
            self.a = shared
            self.b = shared                    # the same module twice: counted once

        def forward(self, x):
            for blk in self.blocks:
                x = blk(x)
            return self.b(self.a(x))

    net = Net()
    assert [n for n, _ in net.named_modules()] == ["", "blocks", "blocks.0", "blocks.0.0",
                                                   "blocks.0.1", "blocks.1", "a"]
    assert [n for n, _ in net.named_parameters()] == ["blocks.0.0.weight", "blocks.0.0.bias",
                                                      "a.weight", "a.bias"]
    assert [type(m).__name__ for m in net.children()] == ["ModuleList", "Linear", "Linear"]
    assert dict(net.named_children())["a"] is shared and len(net.blocks) == 2
    seen = []
    assert net.apply(lambda m: seen.append(type(m).__name__)) is net
    assert seen[-1] == "Net" and seen.count("Linear") == 3      # children first, then self
    out = net(rng.standard_normal((2, 3)).astype(np.float32))
    assert isinstance(out, dnnkit.Tensor) and out.requires_grad
    out.sum().backward()
    assert all(p.grad is not None for p in net.parameters())
    net.zero_grad()
    assert all(p.grad is None for p in net.parameters())
    net.requires_grad_(False)
    assert not net(np.ones((1, 3), np.float32)).requires_grad
    with pytest.raises(TypeError, match="Sequential: item 1 is a int"):
        nn.Sequential(nn.ReLU(), 3)
    with pytest.raises(TypeError, match="ModuleList is not callable"):
        net.blocks(out)
    assert isinstance(nn.Sequential(nn.ReLU(), nn.Tanh())[1:], nn.Sequential)


def test_forward_hooks_and_module_scope(rng):
    lin = nn.Linear(2, 2, seed=0)
    model = nn.Sequential(lin, nn.ReLU())
    calls = []
    h = lin.register_forward_hook(lambda m, inp, out: calls.append((m, out.shape)))
    y = model(np.ones((3, 2), np.float32))
    assert calls == [(lin, (3, 2))]
    assert y.grad_fn.module is model[1]                  # nodes know the module that ran them
    h.remove()
    model(np.ones((3, 2), np.float32))
    assert len(calls) == 1
    doubled = lin.register_forward_hook(lambda m, inp, out: out * 2.0)
    np.testing.assert_allclose(lin(np.ones((1, 2), np.float32)).numpy(),
                               2 * (np.ones((1, 2)) @ lin.weight.numpy().T + lin.bias.numpy()),
                               rtol=1e-6)
    doubled.remove()


def test_inputs_accepted_like_the_ops(rng):
    """Lists, NumPy arrays, device arrays and Tensors all go in; a Tensor comes out."""
    lin = nn.Linear(3, 2, seed=0)
    rows = [[1.0, 2.0, 3.0]]
    want = np.array(rows) @ lin.weight.numpy().T + lin.bias.numpy()
    for x in (rows, np.array(rows, np.float32), dnnkit.tensor(np.array(rows, np.float32)),
              dnnkit.tensor(np.array(rows, np.float32)).data):
        y = lin(x)
        assert isinstance(y, dnnkit.Tensor)
        np.testing.assert_allclose(y.numpy(), want, rtol=1e-6)
    bn = nn.BatchNorm1d(2)
    assert bn([[1.0, 2.0], [3.0, 5.0]]).shape == (2, 2)
    assert isinstance(nn.ReLU()(np.ones(3, np.float32)), dnnkit.Tensor)
    with pytest.raises(TypeError, match="Linear: the input must be a numeric array"):
        lin([["a", "b", "c"]])
    with pytest.raises(ValueError, match=r"BatchNorm1d: input has 3 channels"):
        bn(np.ones((2, 3), np.float32))


def test_train_eval_modes(rng):
    d = nn.Dropout(0.5, seed=1)
    x = rng.standard_normal((4, 8)).astype(np.float32)
    assert np.count_nonzero(d(x).numpy()) < x.size
    model = nn.Sequential(nn.BatchNorm1d(8), d)
    model.eval()
    assert not d.training and not model[0].training
    with dnnkit.no_grad():
        y = model(x)
    np.testing.assert_allclose(y.numpy(), x / np.sqrt(1 + 1e-5), rtol=1e-6)
    assert model.train() is model and d.training


def test_convert_pins_backends_and_prints(rng):
    m = nn.Sequential(nn.Linear(3, 2, seed=0), nn.ReLU())
    assert nn.convert(m, "numba", exclude=lambda mod: isinstance(mod, nn.ReLU)) is m
    assert [mod.backend for mod in m.modules()] == ["numba", "numba", None]
    assert repr(m) == ("Sequential(\n  backend=numba\n"
                       "  (0): Linear(in_features=3, out_features=2, bias=True, backend=numba)\n"
                       "  (1): ReLU()\n)")
    with dnnkit.trace() as t:
        m(rng.standard_normal((2, 3)).astype(np.float32))
    assert t[0].op == "linear" and t[0].backend == "numba"
    nn.convert(m, "auto")
    assert all(mod.backend is None for mod in m.modules())
    with pytest.raises(ValueError, match="backend"):
        nn.convert(m, "cuda")
    with pytest.raises(ValueError, match="backend"):
        nn.convert(m, ["numba"])


def test_linear_repr_and_layout():
    lin = nn.Linear(16, 10, seed=0)
    assert repr(lin) == "Linear(in_features=16, out_features=10, bias=True)"
    assert lin.weight.shape == (10, 16) and lin.bias.shape == (10,)
    assert repr(nn.Conv2d(2, 4, 3, groups=2, bias=False)) == (
        "Conv2d(2, 4, kernel_size=(3, 3), stride=(1, 1), padding=(0, 0), groups=2, bias=False)")


@pytest.mark.parametrize("backend", backend_params())
def test_gradient_runs_where_the_forward_ran(rng, backend):
    """A module pinned to a backend runs its forward there; the gradient ops follow the
    forward's backend whatever the policy says when backward runs."""
    conv = nn.convert(nn.Conv2d(1, 1, 2, seed=0), backend)
    x = dnnkit.tensor(rng.standard_normal((1, 1, 3, 3)).astype(np.float32), requires_grad=True)
    y = conv(x)
    assert y.grad_fn.backend == backend
    loss = y.sum()
    other = {"numba": "forced", "cudnn": "disabled"}[backend]
    with dnnkit.config.change_flags({"dnn.enabled": other}), dnnkit.trace() as t:
        loss.backward()
    conv_ops = [r for r in t if r.op.startswith("conv")]
    assert conv_ops and {r.backend for r in conv_ops} == {backend}


def test_rnn_class_on_tensors_matches_its_explicit_backward(rng):
    """dnnkit.RNN called with Tensors records rnn_forward; backward() gives the gradients the
    explicit rnn.backward (the same rnn_backward op) gives on arrays."""
    rnn = dnnkit.RNN("lstm", 2, 3, dtype="float64")
    w0 = rnn.init_params(seed=4)
    x = rng.standard_normal((3, 2, 2))
    dy = rng.standard_normal((3, 2, 3))
    out = rnn.forward(w0, x, training=True)
    dx, _, _, dw = rnn.backward(w0, x, out.y, dy, state=out.state)
    w = dnnkit.tensor(w0, requires_grad=True)
    xt = dnnkit.tensor(x, requires_grad=True)
    y, hy, cy = rnn.forward(w, xt, training=True)
    assert all(isinstance(t, dnnkit.Tensor) for t in (y, hy, cy))
    np.testing.assert_array_equal(y.numpy(), out.y.copy_to_host())
    y.backward(dy)
    np.testing.assert_allclose(w.grad.numpy(), dw.copy_to_host(), rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(xt.grad.numpy(), dx.copy_to_host(), rtol=1e-13, atol=1e-15)
