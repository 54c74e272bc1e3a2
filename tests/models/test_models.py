"""dnnkit.models at tiny sizes on the simulator (cuDNN too where present): a training step of
each model gives finite, non-zero gradients for every parameter and lowers the loss on its
batch; gradient checks against central differences in float64 for a residual block and the
LSTM language model; the names line up with torchvision's and PyTorch's; a training step
reads nothing back from the device."""

import numpy as np
import pytest
from numba import cuda

import dnnkit
from dnnkit import models, nn
from dnnkit.optim import SGD, Adam
from tests.conftest import backend_params
from tests.nn.gradcheck import directional_check, weighted_sum


def _train_two_steps(model, x, y, opt, loss_fn=None):
    """Loss before and after one step on one batch; every parameter's gradient checked."""
    loss_fn = loss_fn or nn.CrossEntropyLoss()
    model.train()
    loss = loss_fn(model(x), y)
    opt.zero_grad()
    loss.backward()
    for name, p in model.named_parameters():
        g = p.grad.numpy()
        assert np.isfinite(g).all() and np.abs(g).max() > 0, name
    opt.step()
    with dnnkit.no_grad():
        after = loss_fn(model(x), y).item()
    return loss.item(), after


@pytest.mark.parametrize("backend", backend_params())
def test_resnet18_trains(rng, backend):
    model = nn.convert(models.resnet18(num_classes=3, width=1, in_channels=1, seed=0), backend)
    assert len(model.parameters()) == 62
    x = dnnkit.tensor(rng.standard_normal((2, 1, 8, 8)).astype(np.float32))
    y = dnnkit.tensor(np.array([0, 2]))
    # a small plain step along the gradient: the loss of the same batch must fall. (Batch
    # statistics of 2 values -- the last stage is 1x1 -- make the loss very curved: a step of
    # 5e-3 overshot on an H100's cuDNN path; the first-order decrease rules at 1e-4.)
    before, after = _train_two_steps(model, x, y, SGD(model.parameters(), lr=1e-4))
    assert after < before
    assert model(x).shape == (2, 3)


def test_resnet18_names_are_torchvisions():
    names = list(models.resnet18(width=1).state_dict())
    for k in ("conv1.weight", "bn1.running_var", "layer1.0.conv1.weight", "layer1.1.bn2.bias",
              "layer2.0.downsample.0.weight", "layer2.0.downsample.1.num_batches_tracked",
              "layer4.1.conv2.weight", "fc.weight", "fc.bias"):
        assert k in names, k
    assert "layer1.0.downsample.0.weight" not in names        # same width, stride 1
    sd = models.resnet18(num_classes=10).state_dict()
    assert sd["conv1.weight"].shape == (64, 3, 3, 3) and sd["fc.weight"].shape == (10, 512)
    assert sum(v.size for k, v in sd.items() if "running" not in k and "tracked" not in k) \
        == 11173962                                     # ResNet-18 on CIFAR-10: 11.17 M


@pytest.mark.parametrize("backend", backend_params())
def test_vgg_cnn_trains(rng, backend):
    model = nn.convert(models.vgg_cnn(num_classes=3, width=1, image_size=8, seed=0), backend)
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    pools = [m for m in model.modules() if isinstance(m, nn.MaxPool2d)]
    assert len(convs) == 7 and len(pools) == 3
    x = dnnkit.tensor(rng.standard_normal((2, 3, 8, 8)).astype(np.float32))
    y = dnnkit.tensor(np.array([1, 0]))
    before, after = _train_two_steps(model, x, y, SGD(model.parameters(), lr=1e-3))
    assert after < before
    with pytest.raises(ValueError, match="vgg_cnn: image_size must be divisible by 8"):
        models.vgg_cnn(image_size=12)


@pytest.mark.parametrize("backend", backend_params())
def test_lstm_language_model_trains(rng, backend):
    model = nn.convert(models.LSTMLanguageModel(7, 3, 4, layers=2, dropout=0.2, seed=0),
                       backend)
    assert [n for n, _ in model.named_children()] == ["encoder", "drop", "rnn", "drop_out",
                                                      "decoder"]
    ids = rng.integers(0, 7, (5, 2))
    inputs, targets = dnnkit.tensor(ids[:-1]), dnnkit.tensor(ids[1:].reshape(-1))
    loss_fn = nn.CrossEntropyLoss()
    opt = Adam(model.parameters(), lr=0.05)
    model.train()
    logits, (h, c) = model(inputs)
    assert logits.shape == (4, 2, 7) and h.shape == c.shape == (2, 2, 4)
    losses = []
    for _ in range(3):            # the same batch three times, hidden state carried, detached
        logits, (h, c) = model(inputs, (h.detach(), c.detach()))
        loss = loss_fn(logits.reshape(-1, 7), targets)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert np.isfinite(losses).all() and losses[-1] < losses[0]
    sd = model.state_dict()
    assert sd["rnn.weight_ih_l1"].shape == (16, 4) and sd["encoder.weight"].shape == (7, 3)


@pytest.mark.parametrize("downsample", [False, True])
def test_residual_block_gradients(rng, downsample):
    """The skip connection makes x feed two branches (fan-out) that meet in an add: every
    gradient against central differences in float64."""
    cin, cout = (2, 3) if downsample else (2, 2)
    blk = models.BasicBlock(cin, cout, stride=2 if downsample else 1, dtype="float64", seed=1)
    assert (blk.downsample is not None) == downsample
    x = dnnkit.tensor(rng.standard_normal((2, cin, 4, 4)), requires_grad=True)
    with dnnkit.no_grad():
        shape = blk(x).shape
    r = rng.standard_normal(shape)
    leaves = [x] + blk.parameters()
    if downsample:       # fewer probes on the simulator: the input, a conv, the shortcut
        leaves = [x, blk.conv1.weight, blk.downsample[0].weight, blk.downsample[1].bias]
    directional_check(lambda: weighted_sum(blk(x), r), leaves, rng, rtol=1e-6)


def test_lstm_language_model_gradients(rng):
    model = models.LSTMLanguageModel(5, 2, 2, layers=2, dropout=0.0, dtype="float64", seed=3)
    ids = rng.integers(0, 5, (4, 2))
    inputs, targets = ids[:-1], ids[1:].reshape(-1)
    h0 = dnnkit.tensor(rng.standard_normal((2, 2, 2)), requires_grad=True)
    loss_fn = nn.CrossEntropyLoss()

    def loss():
        logits, _ = model(inputs, (h0, None))
        return loss_fn(logits.reshape(-1, 5), targets)
    directional_check(loss, model.parameters() + [h0], rng, rtol=1e-6)


def test_training_step_reads_nothing_back(rng, monkeypatch):
    """Forward, backward and the optimizer step queue work and return: once warmed up (the
    first step makes the optimizer's buffers and the cached constants), no copy to the host
    and no synchronisation happen until the loss is read."""
    model = nn.Sequential(nn.Conv2d(1, 2, 3, padding=1, seed=0), nn.BatchNorm2d(2), nn.ReLU(),
                          nn.MaxPool2d(2), nn.Flatten(), nn.Dropout(0.2, seed=0),
                          nn.Linear(8, 3, seed=1))
    opt = Adam(model.parameters(), lr=0.01)
    loss_fn = nn.CrossEntropyLoss()
    x = dnnkit.tensor(rng.standard_normal((2, 1, 4, 4)).astype(np.float32))
    y = dnnkit.tensor(np.array([0, 2]))

    def train_step():
        loss = loss_fn(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss
    train_step()

    def refuse(*a, **k):
        raise AssertionError("a training step read from the device")
    monkeypatch.setattr(type(x.data), "copy_to_host", refuse)
    monkeypatch.setattr(cuda, "synchronize", refuse)
    loss = train_step()
    with pytest.raises(AssertionError, match="read from the device"):
        loss.item()                             # the probe sees a read
    monkeypatch.undo()
    assert np.isfinite(loss.item())
