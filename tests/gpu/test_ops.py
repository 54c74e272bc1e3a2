"""Tests that need a real GPU: cuDNN vs Numba agreement at realistic sizes, streams, foreign
arrays through __cuda_array_interface__, handles per thread."""

import threading

import numpy as np
import pytest

import dnnkit
from dnnkit import arrays, device, reference
from dnnkit.testing import assert_backends_agree

pytestmark = pytest.mark.gpu

ACT = [("relu", 0.0), ("clipped_relu", 6.0), ("tanh", 0.0), ("sigmoid", 0.0), ("elu", 1.0),
       ("swish", 1.0)]


def test_numba_status_names_the_gpu():
    st = dnnkit.backends.numba_status()
    assert st.available and not st.simulator and st.compute_capability >= (7, 0)
    assert "H100" in st.device or "H200" in st.device or st.device


@pytest.mark.cudnn
def test_cudnn_is_available_and_version_9():
    st = dnnkit.backends.status()
    assert st.cudnn_available and st.cudnn_version.startswith("9.")


@pytest.mark.cudnn
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("mode,coef", ACT)
def test_activation_backends_agree(rng, mode, coef, dtype):
    x = (rng.standard_normal((8, 64, 33, 17)) * 3).astype(dtype)
    y = assert_backends_agree(dnnkit.activation, x, mode, coef)
    dy = rng.standard_normal(x.shape).astype(dtype)
    assert_backends_agree(dnnkit.activation_backward, x, y, dy, mode, coef)


@pytest.mark.cudnn
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("shape", [(64, 1000), (32, 21, 17, 19), (2, 66000), (8, 3, 64, 64)])
@pytest.mark.parametrize("mode", ["channel", "instance"])
@pytest.mark.parametrize("algo", ["accurate", "fast", "log"])
def test_softmax_backends_agree(rng, algo, mode, shape, dtype):
    x = (rng.standard_normal(shape) * 2).astype(dtype)
    y = assert_backends_agree(dnnkit.softmax, x, algo, mode)
    dy = rng.standard_normal(shape).astype(dtype)
    assert_backends_agree(dnnkit.softmax_backward, y, dy, algo, mode)
    ref = reference.softmax(x.astype(np.float64), algo, mode)
    tol = {"float16": 5e-3, "float32": 1e-5, "float64": 1e-12}[dtype]
    assert reference.rel_error(y.copy_to_host(), ref) <= tol


@pytest.mark.cudnn
def test_crosscheck_flag_runs_both_on_the_gpu(rng):
    x = rng.standard_normal((16, 100)).astype(np.float32)
    with dnnkit.config.change_flags({"dnn.crosscheck": True}):
        dnnkit.softmax(x)
        dnnkit.activation(x, "elu", 1.0)


@pytest.mark.cudnn
@pytest.mark.parametrize("backend", ["numba", "cudnn"])
def test_crosscheck_of_batch_norm_updates_the_running_statistics_once(rng, backend):
    """batch_norm_train updates the running statistics in place; dnn.crosscheck runs the other
    backend on copies taken before the call, so the caller's statistics move once."""
    from numba import cuda
    x = rng.standard_normal((8, 4, 5, 5)).astype(np.float32)
    g, b = np.ones(4, np.float32), np.zeros(4, np.float32)
    rm0, rv0 = rng.standard_normal(4).astype(np.float32), (1 + rng.random(4)).astype(np.float32)
    rm, rv = cuda.to_device(rm0), cuda.to_device(rv0)
    with dnnkit.config.change_flags({"dnn.crosscheck": True}):
        dnnkit.batch_norm_train(x, g, b, running_mean=rm, running_var=rv, backend=backend)
    _, _, _, erm, erv = reference.batch_norm_train(x, g, b, "spatial", 1e-5, 0.1, rm0, rv0)
    assert reference.rel_error(rm.copy_to_host(), erm) < 1e-5
    assert reference.rel_error(rv.copy_to_host(), erv) < 1e-5


@pytest.mark.parametrize("backend", ["numba", pytest.param("cudnn", marks=pytest.mark.cudnn)])
def test_ops_on_a_non_default_stream(rng, backend):
    from numba import cuda
    s = cuda.stream()
    x = rng.standard_normal((64, 4096)).astype(np.float32)
    d = cuda.to_device(x, stream=s)
    y = dnnkit.softmax(d, backend=backend, stream=s)
    z = dnnkit.activation(y, "sigmoid", backend=backend, stream=s)
    s.synchronize()
    ref = reference.activation(reference.softmax(x), "sigmoid")
    assert reference.rel_error(z.copy_to_host(), ref) < 1e-5


def test_stream_pointer_of_numba_streams():
    from numba import cuda
    assert device.stream_pointer(cuda.default_stream()) == 0
    s = cuda.stream()
    assert device.stream_pointer(s) != 0
    assert device.stream_pointer(arrays.as_stream(device.stream_pointer(s))) == \
        device.stream_pointer(s)


@pytest.mark.parametrize("backend", ["numba", pytest.param("cudnn", marks=pytest.mark.cudnn)])
def test_torch_tensors_in_without_copy(backend):
    torch = pytest.importorskip("torch")
    t = torch.randn(32, 50, device="cuda", dtype=torch.float32)
    d = arrays.device_input("softmax", "x", t, arrays.as_stream(None))
    assert d.__cuda_array_interface__["data"][0] == t.data_ptr()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        y = dnnkit.softmax(t, backend=backend, stream=s)
    s.synchronize()
    ref = torch.softmax(t.double(), dim=1).cpu().numpy()
    assert reference.rel_error(y.copy_to_host(), ref) < 1e-5
    with pytest.raises(ValueError, match="C-contiguous"):
        dnnkit.softmax(t.t(), backend=backend)


def test_cupy_arrays_in():
    cp = pytest.importorskip("cupy")
    a = cp.random.standard_normal((4, 6, 5, 5), dtype=cp.float32)
    y = dnnkit.log_softmax(a, "instance", stream=cp.cuda.get_current_stream())
    ref = reference.softmax(cp.asnumpy(a).astype(np.float64), "log", "instance")
    assert reference.rel_error(y.copy_to_host(), ref) < 1e-5


@pytest.mark.cudnn
def test_threads_get_their_own_handles_and_serial_results():
    from dnnkit.cudnn import handle
    rng = np.random.default_rng(7)
    xs = [rng.standard_normal((128, 1000)).astype(np.float32) for _ in range(8)]
    serial = [dnnkit.softmax(x, backend="cudnn").copy_to_host() for x in xs]
    results, handles, errors = [None] * 8, [None] * 8, []
    # every thread holds its handle until all have one: a thread's handle is destroyed when
    # the thread ends, and cuDNN may hand its address to a handle created after that
    alive = threading.Barrier(8, timeout=60)

    def work(i):
        try:
            from numba import cuda
            s = cuda.stream()
            for _ in range(5):
                y = dnnkit.softmax(xs[i], backend="cudnn", stream=s)
            s.synchronize()
            results[i] = y.copy_to_host()
            handles[i] = handle.get(device.stream_pointer(s)).value
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)
        alive.wait()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(set(handles)) == 8
    for a, b in zip(results, serial):
        assert np.array_equal(a, b)
