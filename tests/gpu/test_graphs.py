"""CUDA graphs on a real GPU (dnnkit/graphs.py): a captured training step (dnnkit.nn model,
optim.SGD with momentum) replays to the parameters and losses of the same steps run eagerly,
on both backends; what cannot be captured raises CaptureError naming it and leaves the device
usable."""

import numpy as np
import pytest

import dnnkit
from dnnkit import config, graphs, nn, optim
from dnnkit.errors import CaptureError
from tests.conftest import backend_params

pytestmark = pytest.mark.gpu


def _model(backend):
    m = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, seed=1), nn.BatchNorm2d(8), nn.ReLU(),
                      nn.MaxPool2d(2), nn.Flatten(), nn.Linear(8 * 4 * 4, 10, seed=2))
    return nn.convert(m, backend)


def _trainer(model, backend):
    opt = optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.convert(nn.CrossEntropyLoss(), backend)

    def step(x, y):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss
    return step


@pytest.mark.parametrize("backend", backend_params())
def test_a_captured_training_step_replays_to_the_eager_steps_results(backend):
    from numba import cuda
    rng = np.random.default_rng(0)
    batches = [(rng.standard_normal((4, 3, 8, 8)).astype(np.float32),
                rng.integers(0, 10, 4).astype(np.int64)) for _ in range(6)]
    # eager: the capture's three warm-up steps on batch 0, then one step per later batch
    eager = _model(backend)
    step = _trainer(eager, backend)
    x0, y0 = dnnkit.tensor(batches[0][0]), cuda.to_device(batches[0][1])
    for _ in range(3):
        step(x0, y0)
    want = [step(dnnkit.tensor(x), cuda.to_device(y)).item() for x, y in batches[1:]]

    model = _model(backend)
    xs, ys = dnnkit.tensor(batches[0][0]), cuda.to_device(batches[0][1])
    g = graphs.capture(_trainer(model, backend), xs, ys, warmup=3)
    got = []
    for x, y in batches[1:]:
        g.replay(x, y)
        got.append(g.outputs.item())
    np.testing.assert_allclose(got, want, rtol=1e-5)
    se, sg = eager.state_dict(), model.state_dict()
    assert se.keys() == sg.keys()
    for k in se:
        if k.endswith("num_batches_tracked"):   # a host count: replays do not advance it
            continue
        np.testing.assert_allclose(sg[k], se[k], rtol=1e-5, atol=1e-6, err_msg=k)
    assert g.replays == len(batches) - 1 and g.nodes > 10
    g.close()


def test_item_inside_a_capture_raises_and_leaves_the_device_usable():
    x = dnnkit.tensor(np.ones(8, np.float32))
    with pytest.raises(CaptureError, match=r"Tensor.item\(\) cannot run while stream"):
        graphs.capture(lambda a: dnnkit.relu(a).sum().item(), x, warmup=1)
    assert dnnkit.relu(x).sum().item() == 8.0


@pytest.mark.cudnn
def test_an_algorithm_timing_inside_a_capture_raises_naming_it():
    rng = np.random.default_rng(1)
    w = dnnkit.tensor(rng.standard_normal((4, 3, 3, 3)).astype(np.float32))
    shapes = iter([(2, 3, 8, 8), (2, 3, 12, 12)])     # the recorded call: a shape not timed
    xs = {s: dnnkit.tensor(rng.standard_normal(s).astype(np.float32))
          for s in [(2, 3, 8, 8), (2, 3, 12, 12)]}
    x0 = xs[(2, 3, 8, 8)]
    with config.change_flags(**{"dnn.conv.algo_fwd": "time_once"}):
        with pytest.raises(CaptureError, match="cuDNN (algorithm|graph engine) timing"):
            graphs.capture(lambda a: dnnkit.conv2d(xs[next(shapes)], w, backend="cudnn"), x0,
                           warmup=1)
        y = dnnkit.conv2d(x0, w, backend="cudnn")          # still usable
    assert y.shape == (2, 4, 6, 6)


def test_dropout_cannot_be_captured():
    x = dnnkit.tensor(np.ones(64, np.float32))
    for seed in (None, 7):
        with pytest.raises(CaptureError, match="repeat the recorded mask"):
            graphs.capture(lambda a: dnnkit.dropout(a, 0.5, seed=seed), x, warmup=1)
