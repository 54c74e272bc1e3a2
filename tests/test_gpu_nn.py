"""dnnkit.nn on a real GPU: one training step of the demo's CNN and LSTM gives the same loss
and the same parameter gradients on the cuDNN and the Numba backends."""

import numpy as np
import pytest

from dnnkit import demo, nn

pytestmark = [pytest.mark.gpu, pytest.mark.cudnn]


def _step(model, x, y):
    loss_fn = nn.CrossEntropyLoss()
    model.train()
    loss = loss_fn.forward(model.forward(x), y)
    model.zero_grad()
    model.backward(loss_fn.backward())
    return loss, {n: p.grad.copy_to_host().astype(np.float64)
                  for n, p in model.named_parameters()}


@pytest.mark.parametrize("which", ["cnn", "lstm"])
def test_training_step_agrees_across_backends(rng, which):
    if which == "cnn":
        x, y = demo.shapes(rng, 64)
        make = lambda: demo.cnn(4, 8, seed=3)          # noqa: E731
    else:
        x, y = demo.majority(rng, 64, 15)
        make = lambda: demo.lstm(32, seed=3)           # noqa: E731
    results = {}
    for backend in ("cudnn", "numba"):
        m = nn.convert(make(), backend)
        results[backend] = _step(m, x, y)
        assert all(b == backend for mod in m.modules() for b in mod.used.values())
    (lc, gc), (ln, gn) = results["cudnn"], results["numba"]
    assert abs(lc - ln) <= 1e-5 * max(1.0, abs(ln))
    for name in gn:
        scale = max(1e-12, np.abs(gn[name]).max())
        assert np.abs(gc[name] - gn[name]).max() / scale <= 1e-4, name
