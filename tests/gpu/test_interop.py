"""PyTorch and CuPy arrays on a real GPU (dnnkit/foreign.py, dnnkit/dlpack.py): no copy in
either direction, the memo taken by calls with foreign inputs (counted, not timed), and the
stream rule -- the op on PyTorch's current stream, a producer's other stream waited for by an
event -- checked with a producer kept busy, so that an op that did not wait would read the
old values."""

import numpy as np
import pytest

import dnnkit
from dnnkit import device, fastpath, foreign

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("PyTorch without CUDA", allow_module_level=True)

SLEEP = 50_000_000          # cycles of torch.cuda._sleep: tens of ms on any current GPU


def _ptr(a):
    return a.device_ctypes_pointer.value


def test_pytorch_tensors_in_without_a_copy_and_the_memo_taken():
    x = torch.randn(4, 256, device="cuda")
    v = dnnkit.reshape(x, (1024,))             # a view: the op's output is x's memory
    assert _ptr(v) == x.data_ptr()
    np.testing.assert_allclose(dnnkit.relu(x).copy_to_host(), torch.relu(x).cpu().numpy())
    hits, stores = fastpath.stats["hits"], fastpath.stats["stores"]
    templates = len(foreign._templates)
    for _ in range(50):
        dnnkit.relu(x)
    assert fastpath.stats["hits"] == hits + 50 and fastpath.stats["stores"] == stores
    assert len(foreign._templates) == templates          # the buffer's template reused
    w = torch.randn(8, 8, 3, 3, device="cuda")
    xc = torch.randn(1, 8, 8, 8, device="cuda")
    dnnkit.conv2d(xc, w, padding=1)
    hits = fastpath.stats["hits"]
    for _ in range(20):
        dnnkit.conv2d(xc, w, padding=1)
    assert fastpath.stats["hits"] == hits + 20


def test_outputs_out_through_dlpack_without_a_copy():
    t = dnnkit.tensor(np.arange(12, dtype=np.float32).reshape(3, 4))
    tt = torch.from_dlpack(t)
    assert tt.data_ptr() == _ptr(t.data) and tt.shape == (3, 4)
    tt.mul_(2)                                   # PyTorch writes dnnkit's memory
    torch.cuda.synchronize()
    np.testing.assert_array_equal(t.numpy(), np.arange(12).reshape(3, 4) * 2)
    y = dnnkit.relu(np.array([-1.0, 3.0], np.float32))   # a plain output array
    ty = torch.from_dlpack(dnnkit.to_dlpack(y))
    assert ty.data_ptr() == _ptr(y) and ty.tolist() == [0.0, 3.0]
    del tt, ty
    torch.cuda.synchronize()
    import gc
    gc.collect()
    assert dnnkit.dlpack.pending() == 0


def test_dlpack_inputs_from_pytorch():
    class OnlyDLPack:
        def __init__(self, t):
            self.t = t

        def __dlpack__(self, **kw):
            return self.t.__dlpack__(**kw)

        def __dlpack_device__(self):
            return self.t.__dlpack_device__()

    x = torch.randn(1000, device="cuda")
    y = dnnkit.relu(OnlyDLPack(x))
    np.testing.assert_allclose(y.copy_to_host(), torch.relu(x).cpu().numpy())
    assert _ptr(dnnkit.reshape(OnlyDLPack(x), (10, 100))) == x.data_ptr()


def test_the_op_runs_on_pytorchs_current_stream():
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(SLEEP)                 # keep the side stream busy ...
        x = torch.full((1 << 16,), -1.0, device="cuda")
        x.fill_(2.0)                             # ... then write x on it
        y = dnnkit.relu(x)                       # no stream: PyTorch's (side), after the fill
        assert device.stream_pointer(y.stream) == side.cuda_stream
    side.synchronize()
    assert float(y.copy_to_host().min()) == 2.0


def test_an_explicit_stream_waits_for_pytorchs_stream_by_an_event(monkeypatch):
    waits = []
    real = device.stream_wait
    monkeypatch.setattr(device, "stream_wait", lambda c, p: waits.append((c, p)) or real(c, p))
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        x = torch.full((1 << 16,), -1.0, device="cuda")
        torch.cuda.synchronize()
        torch.cuda._sleep(SLEEP)
        x.fill_(3.0)                             # on side, late
        y = dnnkit.relu(x, stream=0)             # the legacy stream: waits for side
    assert waits == [(0, side.cuda_stream)]
    assert float(y.copy_to_host().min()) == 3.0  # copy_to_host: after the op on stream 0


def test_tensor_requiring_grad_gets_pytorchs_error():
    x = torch.randn(4, device="cuda", requires_grad=True)
    with pytest.raises(RuntimeError, match="requires grad"):
        dnnkit.relu(x)
    dnnkit.relu(x.detach())


def test_cupy_arrays_and_their_cai_stream():
    cupy = pytest.importorskip("cupy")
    x = cupy.arange(-4, 4, dtype=cupy.float32)
    np.testing.assert_array_equal(dnnkit.relu(x).copy_to_host(), [0, 0, 0, 0, 0, 1, 2, 3])
    hits = fastpath.stats["hits"]
    for _ in range(10):
        dnnkit.relu(x)
    assert fastpath.stats["hits"] == hits + 10
    c = cupy.from_dlpack(dnnkit.tensor(np.ones(5, np.float32)))
    assert float(c.sum()) == 5.0
    with cupy.cuda.Stream(non_blocking=True) as s:
        big = cupy.full((1 << 22,), -1.0, dtype=cupy.float32)
        for _ in range(20):
            big = big + 0.25                     # queued work on s; the CAI says s
        y = dnnkit.relu(big)                     # the legacy stream, after an event on s
    assert float(y.copy_to_host().min()) == 4.0
    s.synchronize()


@pytest.mark.parametrize("backend", ["cudnn", "numba"])
def test_an_op_inside_a_capture_dnnkit_does_not_know_of_is_refused(backend):
    """dnnkit's ops inside torch.cuda.graph (not dnnkit.torch.graph / dnnkit.graphs.capture)
    would take blocks of the shared pool, which go back to eager calls while every replay
    writes them: the allocation raises CaptureError; after the capture the same call runs."""
    from dnnkit.errors import CaptureError
    if backend == "cudnn" and not dnnkit.cudnn.is_available():
        pytest.skip("no cuDNN")
    x = torch.randn(4, 256, device="cuda")
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        dnnkit.relu(x, backend=backend)              # warm: the memo entry and a pool block
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with pytest.raises(CaptureError, match="does not know of"):
        with torch.cuda.graph(g):
            dnnkit.relu(x, backend=backend)
    y = dnnkit.relu(x, backend=backend)
    np.testing.assert_allclose(y.copy_to_host(), torch.relu(x).cpu().numpy())
