"""linear + bias + relu in one call (``activation="relu"``): the GEMM's epilogue (with and
without the bias, and the k-split path whose sum pass applies it), cuDNN, the gradient rule
against the unfused graph, nn.Linear and nn.Sequential's fusion, and argument errors."""

import numpy as np
import pytest

import dnnkit
from dnnkit import nn
from dnnkit.ops import gemm_split
from dnnkit.ops.matmul import LinearArgs
from tests.conftest import REL_TOL, backend_params


def _ref(x, w, b):
    y = np.asarray(x, np.float64) @ np.asarray(w, np.float64).T
    return np.maximum(y if b is None else y + b, 0)


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("split", [False, True])
def test_fused_relu_matches_float64(rng, monkeypatch, backend, dtype, with_bias, split):
    if split:          # the k-split path: its sum pass adds the bias and applies the relu
        monkeypatch.setattr(gemm_split, "parts", lambda *args: 2)
    x = rng.standard_normal((2, 3, 8)).astype(dtype)
    w = (rng.standard_normal((5, 8)) / np.sqrt(8)).astype(dtype)
    b = (0.3 * rng.standard_normal(5)).astype(dtype) if with_bias else None
    if backend == "cudnn":    # cuDNN's matmul takes float16 (float32 only with TF32 allowed)
        chosen, why = dnnkit.select_backend("linear", x, w, b, backend="cudnn",
                                            activation="relu", explain=True)
        if chosen != "cudnn":
            pytest.skip(f"cuDNN does not run it: {why}")
    with dnnkit.trace() as t:
        y = dnnkit.linear(x, w, b, backend=backend, activation="relu")
    assert t.ops() == ["linear"] and t.backends() == [backend]
    yh, ref = y.copy_to_host(), _ref(x, w, b)
    assert yh.shape == (2, 3, 5) and yh.min() == 0 and 0.1 < (yh == 0).mean() < 0.9
    assert np.abs(yh - ref).max() / np.abs(ref).max() <= 4 * REL_TOL[dtype]


@pytest.mark.parametrize("backend", backend_params())
def test_gradients_are_those_of_the_unfused_graph(rng, backend):
    x, w, b = rng.standard_normal((4, 6)), rng.standard_normal((3, 6)), rng.standard_normal(3)
    dy = rng.standard_normal((4, 3))
    grads = []
    for fused in (True, False):
        ts = [dnnkit.tensor(a, requires_grad=True) for a in (x, w, b)]
        y = dnnkit.linear(*ts, backend=backend, activation="relu") if fused else \
            dnnkit.relu(dnnkit.linear(*ts, backend=backend), backend=backend)
        (y * dnnkit.tensor(dy)).sum().backward()
        grads.append([t.grad.numpy() for t in ts])
    for got, want in zip(*grads):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("backend", backend_params())
def test_sequential_fuses_linear_relu(rng, backend):
    def build():
        return nn.Sequential(nn.Linear(6, 5, seed=1), nn.ReLU(), nn.Linear(5, 2, seed=2))
    fused, plain = build(), build()
    for m in (fused, plain):
        nn.convert(m, backend)
    x = rng.standard_normal((4, 6)).astype(np.float32)
    outs = []
    for m, apart in ((fused, False), (plain, True)):
        xt = dnnkit.tensor(x, requires_grad=True)
        with dnnkit.trace() as t:
            y = xt
            for mod in (m if apart else [m]):
                y = mod(y)
        y.sum().backward()
        outs.append((y.numpy(), xt.grad.numpy(), t.ops()))
    assert outs[0][2] == ["linear", "linear"]
    assert outs[1][2] == ["linear", "activation", "linear"]
    np.testing.assert_allclose(outs[0][0], outs[1][0], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(outs[0][1], outs[1][1], rtol=1e-6, atol=1e-6)


def test_bad_activation_names_op_and_value():
    x, w = np.ones((2, 3), np.float32), np.ones((4, 3), np.float32)
    with pytest.raises(ValueError) as ei:
        dnnkit.linear(x, w, activation="sigmoid")
    for word in ("linear", "activation", "relu", "sigmoid"):
        assert word in str(ei.value)


def test_every_implementation_takes_every_checked_argument():
    import inspect
    from dnnkit.registry import REGISTRY
    fields = LinearArgs._fields
    assert fields[-1] == "activation"
    for impl in REGISTRY["linear"].values():
        for what in ("fn", "supports", "bind"):
            f = getattr(impl, what)
            if f is not None:
                inspect.signature(f).bind(*fields)
