"""The current stream (dnnkit.stream, dnnkit.current_stream) and foreign arrays as op inputs
(dnnkit/foreign.py): which stream an op runs on, the memo keyed by it, the interop stream rule
(an event wait, never a host wait) and the per-buffer templates. PyTorch is faked: a module
named ``torch`` in sys.modules whose tensors wrap NumPy buffers, viewed as the simulator's
arrays (tests/gpu/test_interop.py runs the real libraries)."""

import sys
import threading
import types

import numpy as np
import pytest

import dnnkit
from dnnkit import arrays, device, dispatch, fastpath, foreign, registry
from tests.conftest import SIMULATOR

# the simulator's streams get handles of the tests' choosing, and its arrays stand for device
# memory: on a GPU, tests/gpu/test_interop.py runs the real thing
pytestmark = pytest.mark.skipif(not SIMULATOR, reason="fakes the simulator's streams")


@pytest.fixture
def sim_stream():
    """Simulator streams with a handle of our choosing (the simulator's have none)."""
    from numba import cuda

    def make(handle):
        s = cuda.stream()
        s.handle = handle
        return s
    return make


@pytest.fixture
def seen(monkeypatch):
    """A public op 'st_fake'(x) -> x + 1 whose runner records the stream it was handed."""
    got = []

    @dispatch.public_op("st_fake")
    def st_fake(x, *, stream=None):
        s = arrays.as_stream(stream)
        return arrays.device_input("st_fake", "x", x, s), s

    def impl(x, stream):
        got.append(stream)
        from numba import cuda
        return cuda.to_device(x.copy_to_host() + 1)
    registry.register("st_fake", "numba", numba_only="a test op")(impl)
    yield st_fake, got
    for table in (registry.REGISTRY, registry.OPS, registry.PREPARE):
        table.pop("st_fake", None)


def _dev(values):
    from numba import cuda
    return cuda.to_device(np.asarray(values, np.float32))


# ---------------------------------------------------------------- the current stream

def test_stream_makes_a_stream_current_for_the_block_and_restores_the_outer_one(sim_stream):
    default = dnnkit.current_stream()
    assert arrays.as_stream(None) is default and arrays.as_stream(0) is default
    s1, s2 = sim_stream(11), sim_stream(22)
    with dnnkit.stream(s1) as got:
        assert got is s1 and dnnkit.current_stream() is s1
        assert device.stream_state.key == 11
        with dnnkit.stream(s2):
            assert dnnkit.current_stream() is s2 and device.stream_state.key == 22
            assert arrays.as_stream(0) is default          # 0: the legacy stream, explicitly
        assert dnnkit.current_stream() is s1
        with dnnkit.stream(None):                           # as PyTorch's: changes nothing
            assert dnnkit.current_stream() is s1
    assert dnnkit.current_stream() is default and device.stream_state.key is None
    with pytest.raises(RuntimeError, match="boom"):
        with dnnkit.stream(s1):
            raise RuntimeError("boom")
    assert dnnkit.current_stream() is default


def test_the_current_stream_is_per_thread(sim_stream):
    s, other = sim_stream(5), []
    with dnnkit.stream(s):
        t = threading.Thread(target=lambda: other.append(dnnkit.current_stream()))
        t.start()
        t.join()
        assert dnnkit.current_stream() is s
    assert other[0] is not s


def test_stream_rejects_what_is_not_a_stream():
    with pytest.raises(TypeError, match="stream must be None, a Numba stream"):
        with dnnkit.stream("fast"):
            pass


def test_ops_run_on_the_current_stream_and_the_memo_is_keyed_by_it(seen, sim_stream):
    op, got = seen
    x, s = _dev([1.0, 2.0]), sim_stream(33)
    default = dnnkit.current_stream()
    op(x)
    stores, hits = fastpath.stats["stores"], fastpath.stats["hits"]
    with dnnkit.stream(s):
        np.testing.assert_array_equal(op(x).copy_to_host(), [2.0, 3.0])
        assert fastpath.stats["stores"] == stores + 1      # a new signature: its own runner
        op(x)
        assert fastpath.stats["hits"] == hits + 1
    op(x)
    assert fastpath.stats["hits"] == hits + 2
    assert got == [default, s, s, default]
    assert op(x, stream=s) is not None and got[-1] is s    # explicit stream= wins


def test_stream_objects_passed_as_stream_are_memoised_by_their_handle(seen, sim_stream):
    op, got = seen
    x = _dev([1.0])
    a, b = sim_stream(41), sim_stream(41)
    op(x, stream=a)
    hits = fastpath.stats["hits"]
    op(x, stream=b)              # another object for the same stream: the same signature
    assert fastpath.stats["hits"] == hits + 1
    op(x, stream=sim_stream(42))
    assert fastpath.stats["hits"] == hits + 1
    assert [s.handle for s in got] == [41, 41, 42]


def test_external_streams_are_made_once_per_handle(monkeypatch):
    made = []
    fake = types.SimpleNamespace(external_stream=lambda p: made.append(p) or ("ext", p))
    monkeypatch.setattr(arrays, "numba_cuda", lambda: fake)
    monkeypatch.setattr(arrays, "_external", {})
    assert arrays.external(0x10) == ("ext", 0x10) and arrays.external(0x10) == ("ext", 0x10)
    assert made == [0x10]
    assert arrays.as_stream(types.SimpleNamespace(cuda_stream=0x10)) == ("ext", 0x10)
    assert arrays.as_stream(types.SimpleNamespace(cuda_stream=0x20, ptr=None)) == ("ext", 0x20)
    assert made == [0x10, 0x20]


# ---------------------------------------------------------------- foreign arrays (faked)

class FakeDtype:
    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"torch.{self.name}"


class FakeTensor:
    """Stands for a torch.Tensor: the attributes foreign.py reads, over a NumPy buffer."""

    def __init__(self, host, device=0, requires_grad=False):
        self.host, self.device, self.requires_grad = host, device, requires_grad
        self.dtype = FAKE_TORCH.dtypes[host.dtype.name]

    def get_device(self):
        return self.device

    def data_ptr(self):
        return self.host.ctypes.data

    @property
    def shape(self):
        return self.host.shape

    def stride(self):
        return tuple(s // self.host.itemsize for s in self.host.strides)

    def __array__(self, dtype=None, copy=None):
        return self.host if dtype is None else self.host.astype(dtype)

    @property
    def __cuda_array_interface__(self):
        if self.requires_grad:
            raise RuntimeError("Can't get __cuda_array_interface__ on Variable that requires "
                               "grad. If gradients aren't required, use var.detach()")
        return {"shape": self.host.shape, "typestr": self.host.dtype.str, "strides": None,
                "data": (self.data_ptr(), False), "version": 2}


FAKE_TORCH = types.ModuleType("torch")
FAKE_TORCH.Tensor = FakeTensor
FAKE_TORCH.dtypes = {n: FakeDtype(n) for n in ("float16", "float32", "float64", "int8",
                                               "int16", "int32", "int64", "uint8", "bool")}
for _n, _d in FAKE_TORCH.dtypes.items():
    setattr(FAKE_TORCH, _n, _d)


class FakeCAI:
    """A CAI v3 array (as CuPy's) over a NumPy buffer, with the producer's stream."""

    def __init__(self, host, stream=None, version=3):
        self.host, self.stream, self.version = host, stream, version

    @property
    def __cuda_array_interface__(self):
        d = {"shape": self.host.shape, "typestr": self.host.dtype.str, "strides": None,
             "data": (self.host.ctypes.data, False), "version": self.version}
        if self.version >= 3:
            d["stream"] = self.stream
        return d


class FakeDLPack:
    """An array with only the DLPack protocol (as a JAX array), over a NumPy buffer."""

    def __init__(self, host):
        self.host = host

    def __dlpack__(self, **kw):
        return self.host.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self.host.__dlpack_device__()


@pytest.fixture
def interop(monkeypatch, sim_stream):
    """The fake PyTorch installed, PyTorch's current stream per device settable, foreign views
    built as simulator arrays over the NumPy buffers (registered by address), stream waits
    and external streams recorded."""
    from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray
    buffers, made, waits, current = {}, [], [], {0: 0}
    FAKE_TORCH._C = types.SimpleNamespace(_cuda_getCurrentRawStream=lambda dev: current[dev])
    monkeypatch.setitem(sys.modules, "torch", FAKE_TORCH)
    monkeypatch.setattr(foreign, "_adapters", {})
    monkeypatch.setattr(foreign, "_torch_dtypes", {})
    monkeypatch.setattr(foreign, "_templates", {})

    def template(key, ptr, shape, strides, dtype, dev):
        made.append(key)
        t = foreign._templates[key] = (ptr, shape, strides, np.dtype(dtype))
        return t

    def view(t, owner):
        ptr, shape, strides, dtype = t
        base = buffers[ptr]
        return FakeCUDAArray(np.ndarray(shape, dtype, buffer=base, strides=strides))

    monkeypatch.setattr(foreign, "_template", template)
    monkeypatch.setattr(foreign, "_view", view)
    monkeypatch.setattr(device, "stream_wait", lambda c, p: waits.append((c, p)))
    streams = {}
    monkeypatch.setattr(arrays, "external",
                        lambda p: streams.setdefault(p, sim_stream(p)) if p else
                        arrays.as_stream(0))

    def register(host):
        buffers[host.ctypes.data] = host
        return host
    return types.SimpleNamespace(register=register, made=made, waits=waits, current=current)


def _host(values, dtype=np.float32):
    return np.ascontiguousarray(np.asarray(values, dtype))


def test_a_pytorch_tensor_is_viewed_without_a_copy_and_its_calls_take_the_memo(interop):
    h = interop.register(_host([-1.0, 2.0, -3.0]))
    t = FakeTensor(h)
    np.testing.assert_array_equal(dnnkit.relu(t).copy_to_host(), [0.0, 2.0, 0.0])
    hits, stores = fastpath.stats["hits"], fastpath.stats["stores"]
    for _ in range(3):
        dnnkit.relu(t)
    assert fastpath.stats["hits"] == hits + 3 and fastpath.stats["stores"] == stores
    assert len(interop.made) == 1                 # one template for the buffer
    h[:] = [5.0, -6.0, 7.0]                         # the view reads the buffer in place
    np.testing.assert_array_equal(dnnkit.relu(t).copy_to_host(), [5.0, 0.0, 7.0])
    assert interop.waits == []                     # producer and op on the default stream


def test_the_op_runs_on_pytorchs_current_stream_when_no_stream_is_given(interop, seen):
    op, got = seen
    t = FakeTensor(interop.register(_host([1.0, 2.0])))
    interop.current[0] = 0x77
    np.testing.assert_array_equal(op(t).copy_to_host(), [2.0, 3.0])
    assert got[-1].handle == 0x77 and interop.waits == []
    assert device.stream_state.__dict__.get("key") is None     # restored after the call
    op(t)
    assert got[-1].handle == 0x77
    # an explicit stream wins, and waits for PyTorch's stream (the producer)
    s = dnnkit.current_stream()
    op(t, stream=0)
    assert got[-1] is s and interop.waits == [(0, 0x77)]
    # so does dnnkit's current stream
    from numba import cuda
    mine = cuda.stream()
    mine.handle = 0x99
    with dnnkit.stream(mine):
        op(t)
    assert got[-1] is mine and interop.waits[-1] == (0x99, 0x77)


def test_cai_v3_streams_are_waited_for_by_an_event_not_the_host(interop, seen):
    op, got = seen
    h = interop.register(_host([1.0]))
    op(FakeCAI(h, stream=0x55))
    assert interop.waits == [(0, 0x55)]
    op(FakeCAI(h, stream=1))             # 1: the legacy default stream, the op's own
    op(FakeCAI(h, stream=None))          # no ordering asked
    op(FakeCAI(h, version=2))            # no stream field
    assert interop.waits == [(0, 0x55)]
    op(FakeCAI(h, stream=2))             # 2: the per-thread default stream's handle
    assert interop.waits[-1] == (0, device.PER_THREAD)
    h2 = interop.register(_host([3.0]))
    dnnkit.add(FakeCAI(h, stream=0x55), FakeCAI(h2, stream=0x55))
    assert interop.waits[-1] == (0, 0x55) and len(interop.waits) == 3   # one wait per stream


def test_foreign_arrays_inside_lists_keyword_arguments_and_tensors(interop):
    a = interop.register(_host([1.0, 2.0]))
    b = interop.register(_host([3.0]))
    out = dnnkit.concatenate([FakeTensor(a), FakeTensor(b)])
    np.testing.assert_array_equal(out.copy_to_host(), [1.0, 2.0, 3.0])
    t = dnnkit.tensor(FakeTensor(a))                     # a Tensor over the same buffer
    a[0] = 9.0
    np.testing.assert_array_equal(t.numpy(), [9.0, 2.0])
    y = dnnkit.activation(x=FakeTensor(a), mode="relu")
    np.testing.assert_array_equal(y.copy_to_host(), [9.0, 2.0])


def test_a_cpu_tensor_is_a_host_input_and_requires_grad_gets_pytorchs_error(interop):
    t = FakeTensor(_host([-2.0, 4.0]), device=-1)
    np.testing.assert_array_equal(dnnkit.relu(t).copy_to_host(), [0.0, 4.0])
    g = FakeTensor(interop.register(_host([1.0])), requires_grad=True)
    with pytest.raises(RuntimeError, match="requires grad"):
        dnnkit.relu(g)


def test_a_dlpack_only_array_is_an_input_without_a_copy(interop):
    h = _host([-1.0, 3.0])
    np.testing.assert_array_equal(dnnkit.relu(FakeDLPack(h)).copy_to_host(), [0.0, 3.0])
    x = FakeDLPack(h)
    t = dnnkit.tensor(x)
    h[1] = 8.0                       # the simulator's view is NumPy's memory itself
    np.testing.assert_array_equal(t.numpy(), [-1.0, 8.0])


def test_one_template_per_buffer_and_the_simulator_refuses_device_memory(interop):
    bufs = [interop.register(_host([float(i)])) for i in range(3)]
    for b in bufs + bufs:
        dnnkit.relu(FakeTensor(b))
    assert len(interop.made) == 3              # a second view of a buffer reuses its template
    assert {k[1] for k in interop.made} == {b.ctypes.data for b in bufs}


def test_the_simulator_cannot_view_foreign_device_memory():
    with pytest.raises(TypeError, match="cannot be read by the CUDA simulator"):
        dnnkit.relu(FakeCAI(_host([1.0]), stream=None))


def test_signature_kinds():
    from numba import cuda
    assert fastpath._kind(FakeCAI) is fastpath.FOREIGN
    assert fastpath._kind(FakeDLPack) is fastpath.FOREIGN
    assert fastpath._kind(np.ndarray) is None
    assert fastpath._kind(type(cuda.stream())) == fastpath._STREAM
    assert fastpath._kind(dnnkit.Tensor) is None
    assert fastpath.signature("relu", (FakeCAI(_host([1.0])),), None, {}) is fastpath.FOREIGN


def test_real_pytorch_cpu_tensors_are_host_inputs():
    torch = pytest.importorskip("torch")
    foreign._adapters.clear()
    np.testing.assert_array_equal(dnnkit.relu(torch.tensor([-1.0, 2.0])).copy_to_host(),
                                  [0.0, 2.0])
