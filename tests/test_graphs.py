"""CUDA-graph capture (dnnkit/graphs.py): the order of a capture's steps, the stream and pool
it makes current, what raises CaptureError, and a replay's copies and stream joins. The
simulator cannot capture: the driver calls (graphs._cuda) are a recording fake here, and the
ops inside the captured function run for real on the simulator. tests/gpu/test_graphs.py
captures and replays training steps on a GPU."""

import types

import numpy as np
import pytest

import dnnkit
from dnnkit import config, device, graphs, memory
from dnnkit.errors import CaptureError
from tests.conftest import SIMULATOR

# the simulator's streams get handles of the tests' choosing, and its arrays stand for device
# memory: on a GPU, tests/gpu/test_graphs.py runs the real thing
pytestmark = pytest.mark.skipif(not SIMULATOR, reason="fakes the simulator's streams")

HANDLE = 0xCA


class FakeCuda:
    """Records every driver call of graphs.py; ``capturing``: the stream being recorded."""

    def __init__(self):
        self.calls, self.capturing, self.end_err, self.nodes = [], None, 0, 5

    def create_stream(self):
        from numba import cuda
        s = cuda.stream()
        s.handle = HANDLE
        self.calls.append(("create",))
        return HANDLE, s

    def destroy_stream(self, ptr):
        self.calls.append(("destroy_stream", ptr))

    def synchronize(self, ptr):
        self.calls.append(("sync", ptr))

    def begin(self, ptr):
        self.capturing = ptr
        self.calls.append(("begin", ptr))

    def end(self, ptr):
        self.capturing = None
        self.calls.append(("end", ptr))
        return self.end_err, (None if self.end_err else "graph")

    def instantiate(self, graph):
        self.calls.append(("instantiate", graph))
        return "exec"

    def node_count(self, graph):
        return self.nodes

    def launch(self, exe, ptr):
        self.calls.append(("launch", exe, ptr))

    def destroy(self, graph, exe):
        self.calls.append(("destroy", graph, exe))

    def copy(self, dst, src, nbytes, ptr):
        self.calls.append(("copy", dst, "host" if isinstance(src, np.ndarray) else src, nbytes,
                           ptr))

    def names(self):
        return [c[0] for c in self.calls]


@pytest.fixture
def fake(monkeypatch):
    f = FakeCuda()
    f.waits = []
    monkeypatch.setattr(graphs, "_cuda", f)
    monkeypatch.setattr(device, "is_capturing",
                        lambda ptr: f.capturing is not None and ptr == f.capturing)
    monkeypatch.setattr(device, "stream_wait", lambda c, p: f.waits.append((c, p)))
    return f


def _x(values=(-1.0, 2.0, -3.0, 4.0)):
    return dnnkit.tensor(np.asarray(values, np.float32))


def test_capture_warms_up_then_records_one_call_on_its_own_stream_and_pool(fake):
    x, seen = _x(), []

    def step(a):
        seen.append((dnnkit.current_stream().handle, fake.capturing,
                     memory._private.__dict__.get("pool")))
        return dnnkit.relu(a)

    g = graphs.capture(step, x, warmup=2)
    assert fake.names() == ["create", "sync", "begin", "end", "instantiate"]
    assert [s[0] for s in seen] == [HANDLE] * 3              # all on the capture stream
    assert [s[1] for s in seen] == [None, None, HANDLE]      # the third call is recorded
    assert {id(s[2]) for s in seen} == {id(g._pool)}         # in the graph's pool
    assert fake.waits == [(HANDLE, 0)]                       # after the current stream's work
    assert getattr(dnnkit.current_stream(), "handle", None) != HANDLE
    assert memory._private.__dict__.get("pool") is None
    assert isinstance(g.outputs, dnnkit.Tensor) and g.inputs == (x,) and g.nodes == 5
    assert g.fn is step                # what it holds is written by every replay: kept
    np.testing.assert_array_equal(g.outputs.numpy(), [0.0, 2.0, 0.0, 4.0])


def test_replay_launches_on_the_graph_stream_joined_both_ways_and_copies_new_inputs(fake):
    x = _x()
    g = graphs.capture(lambda a: dnnkit.relu(a), x, warmup=1)
    fake.calls.clear()
    fake.waits.clear()
    g.replay()
    assert fake.calls == [("launch", "exec", HANDLE)]
    assert fake.waits == [(HANDLE, 0), (0, HANDLE)]
    new = np.ones(4, np.float32)
    g.replay(new)
    g.replay(dnnkit.tensor(new))
    g.replay(None)
    copies = [c for c in fake.calls if c[0] == "copy"]       # None kept the input
    assert len(copies) == 2 and copies[0][2] == "host" and isinstance(copies[1][2], int)
    assert all(c[1] == dnnkit.dlpack.address(x.data) and c[3] == 16 and c[4] == 0
               for c in copies)
    assert g.replays == 4
    with pytest.raises(ValueError, match="input 0 is \\(3,\\) float32, the static input"):
        g.replay(np.ones(3, np.float32))
    with pytest.raises(ValueError, match="2 inputs given, the graph has 1"):
        g.replay(new, new)


def test_after_replay_hooks_of_the_recorded_call_run_after_each_replays_launch(fake):
    calls = []
    assert graphs.after_replay(lambda s: calls.append(("outside", s))) is False

    def step(a):          # the warm-up calls register nothing: only the recording keeps one
        graphs.after_replay(lambda s: calls.append((s, fake.calls[-1][0])))
        return dnnkit.relu(a)
    g = graphs.capture(step, _x(), warmup=2)
    assert calls == []
    g.replay()
    g.replay()
    assert calls == [(HANDLE, "launch")] * 2
    assert graphs.after_replay(lambda s: None) is False


def test_replay_joins_the_current_stream(fake):
    from numba import cuda
    g = graphs.capture(lambda a: dnnkit.relu(a), _x(), warmup=0)
    s = cuda.stream()
    s.handle = 0x51
    fake.waits.clear()
    with dnnkit.stream(s):
        g.replay()
    assert fake.waits == [(HANDLE, 0x51), (0x51, HANDLE)]


def test_close_frees_the_graph_stream_and_pool_once(fake):
    g = graphs.capture(lambda a: dnnkit.relu(a), _x(), warmup=0)
    fake.calls.clear()
    g.close()
    g.close()
    assert fake.calls == [("sync", HANDLE), ("destroy", "graph", "exec"),
                          ("destroy_stream", HANDLE)]
    assert g.closed and "closed" in repr(g) and g.fn is None
    with pytest.raises(CaptureError, match="closed"):
        g.replay()


def test_item_inside_the_capture_raises_naming_it_and_ends_the_capture(fake):
    def step(a):
        y = dnnkit.relu(a)
        return y, y.sum().item()          # fine in the warm-up, not while recording

    with pytest.raises(CaptureError, match=r"Tensor.item\(\) cannot run while stream 0xca is "
                                           r"being captured") as e:
        graphs.capture(step, _x(), warmup=1)
    assert e.value.what == "Tensor.item()"
    assert fake.names()[-3:] == ["end", "destroy", "destroy_stream"]
    assert "instantiate" not in fake.names() and fake.capturing is None
    assert getattr(dnnkit.current_stream(), "handle", None) != HANDLE


def test_numpy_and_dropout_inside_the_capture_raise(fake):
    with pytest.raises(CaptureError, match=r"Tensor.numpy\(\)"):
        graphs.capture(lambda a: dnnkit.relu(a).numpy(), _x(), warmup=0)
    for seed in (None, 3):
        with pytest.raises(CaptureError, match=r"dropout cannot run.*repeat the recorded mask"):
            graphs.capture(lambda a: dnnkit.dropout(a, 0.5, seed=seed), _x(), warmup=1)
    g = graphs.capture(lambda a: dnnkit.dropout(a, 0.0), _x(), warmup=0)   # p = 0: a copy
    assert g.nodes == 5


def test_an_error_inside_the_recorded_call_becomes_a_capture_error(fake):
    calls = []

    def step(a):
        calls.append(fake.capturing)
        if fake.capturing:
            raise ValueError("bad shape")
        return dnnkit.relu(a)

    with pytest.raises(CaptureError, match="fn raised ValueError while being recorded: bad "
                                           "shape") as e:
        graphs.capture(step, _x(), warmup=1)
    assert isinstance(e.value.__cause__, ValueError)
    assert fake.names()[-3:] == ["end", "destroy", "destroy_stream"]


def test_an_invalidated_or_empty_capture_raises(fake):
    fake.end_err = graphs.CAPTURE_INVALIDATED
    with pytest.raises(CaptureError, match="invalidated"):
        graphs.capture(lambda a: dnnkit.relu(a), _x(), warmup=0)
    assert fake.names()[-1] == "destroy_stream"
    fake.end_err, fake.nodes = 0, 0
    with pytest.raises(CaptureError, match="queued no work on the capture stream"):
        graphs.capture(lambda a: dnnkit.relu(a), _x(), warmup=0)
    assert fake.names()[-2:] == ["destroy", "destroy_stream"]


def test_capture_argument_checks(fake):
    with pytest.raises(TypeError, match="fn must be callable"):
        graphs.capture(3, _x())
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="warmup must be an int >= 0"):
            graphs.capture(dnnkit.relu, _x(), warmup=bad)
    with pytest.raises(TypeError, match="static input 1 must be a device array or a Tensor"):
        graphs.capture(dnnkit.add, _x(), np.ones(4, np.float32))
    with config.change_flags(**{"dnn.allocator": "numba"}):
        with pytest.raises(CaptureError, match="dnn.allocator = caching"):
            graphs.capture(dnnkit.relu, _x())
    assert fake.calls == []


def test_the_simulator_cannot_capture():
    with pytest.raises(CaptureError, match="need a GPU"):
        graphs.capture(dnnkit.relu, _x())


def test_refuse_in_capture_asks_about_the_current_stream(monkeypatch):
    from numba import cuda
    asked = []
    monkeypatch.setattr(device, "is_capturing", lambda p: asked.append(p) or p == 0x33)
    device.refuse_in_capture("x", "y", 0x44)
    device.refuse_in_capture("x", "y")
    s = cuda.stream()
    s.handle = 0x33
    with dnnkit.stream(s):
        with pytest.raises(CaptureError, match="my read cannot run while stream 0x33 is being "
                                               "captured into a CUDA graph: it reads"):
            device.refuse_in_capture("my read", "it reads")
    assert asked == [0x44, 0, 0x33]


# ---------------------------------------------------------------- the memory hook

def test_blocks_taken_inside_a_private_pool_come_from_it_and_go_back_to_it(monkeypatch):
    """memory._new and scratch inside private_pool(), with stand-ins for Numba's classes (as
    tests/test_memory.py): the general pool is never touched; a new block is allocated the
    graph way (capture mode relaxed)."""
    import gc

    class Pointer:
        @property
        def owner(self):
            return self if self._owner is None else self._owner

    class Array:
        pass

    class Block:
        context = "ctx"

        def __init__(self, addr):
            self.device_pointer = addr
            self.device_ctypes_pointer = types.SimpleNamespace(value=addr)

    general, made = memory._Pool(), []
    monkeypatch.setattr(memory, "_pool", general)
    monkeypatch.setattr(memory, "_MemoryPointer", Pointer)
    monkeypatch.setattr(memory, "_DeviceNDArray", Array)
    monkeypatch.setattr(memory, "_Lent", None)
    monkeypatch.setattr(memory, "_context", lambda: None)
    monkeypatch.setattr(memory, "_raw_alloc", lambda ctx, size: pytest.fail("general alloc"))
    monkeypatch.setattr(memory, "_private_alloc",
                        lambda size: made.append(Block(4096 * (len(made) + 1))) or made[-1])
    monkeypatch.setattr(memory, "simulator", lambda: False)
    monkeypatch.setattr(memory, "device_id", lambda: 0)
    private = memory.new_pool()
    key = (0, HANDLE, 1024)
    with memory.private_pool(private):
        a = memory._new(key, {"shape": (256,)}, "s")
        with memory.scratch(1000, HANDLE) as p:
            assert p == 8192
        assert private.free == {key: [(8192, id(made[1]), made[1])]} and \
            private.lent == {4096: made[0]}
    assert memory._private_users == [0]
    del a
    gc.collect()
    assert private.cached_bytes == 2048 and general.cached_bytes == 0 and not general.lent
    with memory.private_pool(private):
        b = memory._new(key, {"shape": (256,)}, "s")       # reused from the graph's pool
    assert len(made) == 2 and b._dnnkit_ptr in (4096, 8192) and private.hits == 1


def test_arrays_the_pool_does_not_serve_are_kept_by_the_graph_pool():
    """0-d and empty arrays come from Numba's allocator: inside a graph pool their memory is
    kept by the pool, so that a replay never writes memory given back to the driver."""
    pool = memory.new_pool()
    with memory.private_pool(pool):
        a = memory.device_array((), np.float32, 0)
    assert len(pool.kept) == 1
    del a
    memory.device_array((), np.float32, 0)           # outside: not kept
    assert len(pool.kept) == 1
