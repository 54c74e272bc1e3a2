"""Autograd on a GPU: a training step makes no host synchronisation (it is queued behind a
long-running kernel and returns before that kernel ends), memory stays flat over 100 steps,
and the two backends agree on a whole residual CNN's training step (compare_backends).

Run on a GPU: python -m pytest -q tests/gpu/test_autograd.py
"""

import time

import numpy as np
import pytest

import dnnkit
from dnnkit import memory

pytestmark = pytest.mark.gpu


def _spin_kernel():
    """A one-thread kernel that sleeps ``n`` times about a millisecond (cuda.nanosleep's
    longest wait): a long-running kernel to queue a training step behind."""
    from numba import cuda

    @cuda.jit
    def spin(n, out):
        for _ in range(n[0]):
            cuda.nanosleep(1000000)
        out[0] = 1
    return spin


def _small_cnn(rng, backend):
    from dnnkit import nn
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                          nn.MaxPool2d(2), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(),
                          nn.Flatten(), nn.Linear(8 * 8 * 8, 10))
    if backend is not None:
        nn.convert(model, backend)
    return model


def _step(model, opt, loss_fn, x, y):
    opt.zero_grad()
    loss = loss_fn(model(x), y)
    loss.backward()
    opt.step()
    return loss


@pytest.mark.parametrize("backend", ["numba", pytest.param("cudnn", marks=pytest.mark.cudnn)])
def test_training_step_makes_no_host_synchronisation(rng, backend):
    from numba import cuda

    from dnnkit import nn, optim
    model = _small_cnn(rng, backend)
    opt = optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    x = dnnkit.tensor(rng.standard_normal((4, 3, 16, 16)).astype(np.float32))
    y = dnnkit.tensor(rng.integers(0, 10, 4).astype(np.int64))
    for _ in range(3):                     # warm up: compile, plans, pool blocks
        _step(model, opt, loss_fn, x, y)
    cuda.synchronize()
    spin, flag = _spin_kernel(), cuda.to_device(np.zeros(1, np.int32))
    cycles = cuda.to_device(np.array([1], np.int64))
    spin[1, 1, cuda.default_stream()](cycles, flag)          # warm (compile) the spinner
    cuda.synchronize()
    cycles = cuda.to_device(np.array([500], np.int64))      # ~0.5 s of sleeping
    done = cuda.event()
    t0 = time.perf_counter()
    spin[1, 1, cuda.default_stream()](cycles, flag)
    loss = _step(model, opt, loss_fn, x, y)
    done.record(cuda.default_stream())
    host = time.perf_counter() - t0
    busy = not done.query()                 # the GPU has not reached the step's end yet
    value = loss.item()                     # the one synchronisation
    assert busy and host < 0.3, f"the step waited for the GPU: {host:.3f} s on the host"
    assert np.isfinite(value)


def test_memory_is_flat_over_100_steps(rng):
    """After a few warm-up steps every array of a step comes from the caching allocator's
    free blocks (no new device allocation), and the device's free memory does not fall."""
    from numba import cuda

    from dnnkit import nn, optim
    model = _small_cnn(rng, None)
    opt = optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    x = dnnkit.tensor(rng.standard_normal((8, 3, 16, 16)).astype(np.float32))
    y = dnnkit.tensor(rng.integers(0, 10, 8).astype(np.int64))
    for _ in range(20):         # warm up: every size the step asks for is in the pool (the
        # loss kept as below: the previous step's lives while the next one makes its own)
        loss = _step(model, opt, loss_fn, x, y)
    cuda.synchronize()
    before, free = memory.stats(), cuda.current_context().get_memory_info()[0]
    for _ in range(100):
        loss = _step(model, opt, loss_fn, x, y)
    assert np.isfinite(loss.item())
    after, free_after = memory.stats(), cuda.current_context().get_memory_info()[0]
    assert after["misses"] == before["misses"], (before, after)
    assert free_after >= free - (4 << 20), (free, free_after)


@pytest.mark.cudnn
def test_backends_agree_on_a_residual_cnn_training_step(rng):
    from dnnkit import models, nn
    model = models.resnet18(num_classes=10)
    loss_fn = nn.CrossEntropyLoss()
    x = dnnkit.tensor(rng.standard_normal((4, 3, 32, 32)).astype(np.float32))
    y = dnnkit.tensor(rng.integers(0, 10, 4).astype(np.int64))

    def step(x, y):
        model.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        return loss
    # every op agrees with itself on the same inputs (raises otherwise); the end-to-end drift
    # is finite (a ReLU's gradient may flip where its input crosses 0)
    rep = dnnkit.testing.compare_backends(step, x, y, model=model)
    print(f"\nresnet18 training step, cuDNN vs Numba: {len(rep.errors)} records, end-to-end "
          f"max rel error {rep.max_error:.3g}")
    assert np.isfinite(rep.max_error) and len(rep.errors) > 100
