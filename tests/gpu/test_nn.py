"""dnnkit.nn on a real GPU: one training step of the demo's CNN and LSTM gives the same loss
and the same parameter gradients on the cuDNN and the Numba backends."""

import numpy as np
import pytest

import dnnkit
from dnnkit import demo, nn, trace
from dnnkit.registry import OPS

pytestmark = [pytest.mark.gpu, pytest.mark.cudnn]


def _step(model, x, y, backend):
    loss_fn = nn.convert(nn.CrossEntropyLoss(), backend)
    model.train()
    loss = loss_fn(model(dnnkit.tensor(x)), dnnkit.tensor(y))
    model.zero_grad()
    loss.backward()
    return loss.item(), {n: p.grad.numpy().astype(np.float64)
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
        with trace() as t:
            results[backend] = _step(m, x, y, backend)
        # every op of the step, gradients and the bias reduction included, ran on the pin
        # (but those cuDNN has no call for: views, the loss reductions, and float32 products,
        # which cuDNN's matmul computes in TF32: they run on Numba, the trace says why)
        # A backward runs where its forward ran: the linear layer's float32 product ran on
        # Numba (no call), so its rule's products and bias reduction are pinned there too.
        numba_linear = any(e.op == "linear" and "has no call" in e.reason for e in t)
        ran = [(e.op, e.backend) for e in t
               if not OPS[e.op].numba_only and "has no call" not in e.reason
               and not (numba_linear and e.op in ("matmul", "conv_backward_bias")
                        and e.reason == "backend='numba'")]
        assert {b for _, b in ran} == {backend}, ran
    (lc, gc), (ln, gn) = results["cudnn"], results["numba"]
    assert abs(lc - ln) <= 1e-5 * max(1.0, abs(ln))
    # A conv bias followed by batch norm has a gradient of exactly 0 in exact arithmetic (the
    # normalisation removes any per-channel shift): both backends return float32 rounding
    # noise there (sums of 4096 terms: ~1e-7 against 4e-4 for the largest gradient, measured
    # on an H100), so each difference is measured against the larger of the parameter's own
    # gradient and 1% of the largest gradient in the model.
    model_scale = max(np.abs(g).max() for g in gn.values())
    for name in gn:
        scale = max(np.abs(gn[name]).max(), 1e-2 * model_scale)
        assert np.abs(gc[name] - gn[name]).max() / scale <= 1e-4, name
