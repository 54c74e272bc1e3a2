"""Several GPUs (needs a machine with two): arrays on device 1 are processed on
device 1 — with device 1's cuDNN handle, plans and kernels — whichever device is current,
and an op given arrays of two devices raises a ValueError naming both.

Run on a machine with 2 GPUs: python -m pytest -q tests/gpu/test_multi.py
"""

import numpy as np
import pytest

import dnnkit
from dnnkit import reference

pytestmark = pytest.mark.gpu
BACKENDS = ["numba", pytest.param("cudnn", marks=pytest.mark.cudnn)]


@pytest.fixture
def cuda2():
    from numba import cuda
    if len(cuda.gpus) < 2:
        pytest.skip(f"needs 2 GPUs; this machine has {len(cuda.gpus)}")
    return cuda


def _on(cuda, dev, a):
    with cuda.gpus[dev]:
        return cuda.to_device(a)


@pytest.mark.parametrize("backend", BACKENDS)
def test_arrays_on_device_1_run_on_device_1(cuda2, backend, rng):
    from dnnkit.device import device_of
    from dnnkit.cudnn import handle
    x = rng.standard_normal((4, 8, 12, 12)).astype(np.float32)
    w = rng.standard_normal((8, 8, 3, 3)).astype(np.float32)
    xd, wd = _on(cuda2, 1, x), _on(cuda2, 1, w)
    with cuda2.gpus[0]:                     # device 0 current: the call moves to device 1
        y = dnnkit.conv2d(xd, wd, padding=1, backend=backend)
        s = dnnkit.softmax(y, backend=backend)
        r = dnnkit.relu(s, backend=backend)
    assert device_of(y) == device_of(s) == device_of(r) == 1
    with cuda2.gpus[1]:
        got = r.copy_to_host()
        if backend == "cudnn":           # device 1 got a handle of its own
            assert handle.get(0).value is not None
    ref = reference.activation(reference.softmax(reference.conv_forward(
        x.astype(np.float64), w.astype(np.float64), None, (1, 1), (1, 1), (1, 1)),
        "accurate", "channel"), "relu", 0.0)
    assert reference.rel_error(got, ref) <= 1e-5


def test_mixing_devices_in_one_call_is_a_clear_error(cuda2, rng):
    x = rng.standard_normal((2, 4, 6, 6)).astype(np.float32)
    w = rng.standard_normal((4, 4, 3, 3)).astype(np.float32)
    with pytest.raises(ValueError, match=r"conv2d: its arrays are on different devices "
                                         r"\(argument 0 on device 0, argument 1 on device 1\)"):
        dnnkit.conv2d(_on(cuda2, 0, x), _on(cuda2, 1, w))


def test_torch_tensors_on_device_1(cuda2):
    torch = pytest.importorskip("torch")
    t = torch.randn(64, 100, device="cuda:1")
    y = dnnkit.softmax(t)
    from dnnkit.device import device_of
    assert device_of(y) == 1
    with cuda2.gpus[1]:
        got = y.copy_to_host()
    want = torch.softmax(t.double(), 1).cpu().numpy()      # (N, C): channel = instance
    assert np.abs(got - want).max() <= 1e-6


def test_torch_tensor_mixed_with_another_device_is_a_clear_error(cuda2, rng):
    torch = pytest.importorskip("torch")
    w = rng.standard_normal((4, 4, 3, 3)).astype(np.float32)
    t = torch.randn(2, 4, 6, 6, device="cuda:1")
    with pytest.raises(ValueError, match=r"argument 0 on device 1, argument 1 on device 0"):
        dnnkit.conv2d(t, _on(cuda2, 0, w))
