"""dnnkit.replay: a repeated Numba call of one signature replays the first call's launches on
its own arrays. Each op family's repeated calls, with new values every call, give what the full
path gives (the memo off); calls that cannot be replayed fall back to the implementation; a
replay keeps none of its calls' arrays; nested and per-call-object calls are not recorded."""

import gc
import weakref

import numpy as np
import pytest

import dnnkit
from dnnkit import config, launch, memory, replay
from tests.conftest import SIMULATOR


@pytest.fixture
def replays(monkeypatch):
    """{'made': Replay runners built, 'ran': their replays (first calls not counted)}."""
    n = {"made": 0, "ran": 0}
    init, call = replay.Replay.__init__, replay.Replay.__call__

    def counted_init(self, *a):
        init(self, *a)
        n["made"] += 1

    def counted_call(self, *a):
        if self.first is None:
            n["ran"] += 1
        return call(self, *a)
    monkeypatch.setattr(replay.Replay, "__init__", counted_init)
    monkeypatch.setattr(replay.Replay, "__call__", counted_call)
    return n


def _dev(a):
    from numba import cuda
    return cuda.to_device(np.ascontiguousarray(a))


def _host(out):
    if isinstance(out, tuple):
        return tuple(_host(o) for o in out)
    return out.copy_to_host() if hasattr(out, "copy_to_host") else out


CASES = {
    # name: (function of device arrays, shapes of its random inputs)
    "conv2d stride 2, bias": (lambda x, w, b: dnnkit.conv2d(x, w, b, stride=2, padding=1,
                                                            backend="numba"),
                              [(2, 3, 7, 7), (4, 3, 3, 3), (4,)]),
    "conv2d 1x1": (lambda x, w: dnnkit.conv2d(x, w, backend="numba"), [(2, 3, 5, 5), (4, 3, 1, 1)]),
    "conv2d_backward_data stride 2": (
        lambda dy, w: dnnkit.conv2d_backward_data(dy, w, (2, 3, 7, 7), stride=2, padding=1,
                                                  backend="numba"),
        [(2, 4, 4, 4), (4, 3, 3, 3)]),
    "conv2d_backward_filter": (
        lambda x, dy: dnnkit.conv2d_backward_filter(x, dy, (4, 3, 3, 3), padding=1,
                                                    backend="numba"),
        [(2, 3, 5, 5), (2, 4, 5, 5)]),
    "conv_backward_bias": (lambda dy: dnnkit.conv_backward_bias(dy, backend="numba"),
                           [(2, 4, 3, 3)]),
    "pool2d max": (lambda x: dnnkit.pool2d(x, 2, backend="numba"), [(2, 3, 6, 6)]),
    "pool2d_backward avg": (
        lambda x, dy: dnnkit.pool2d_backward(x, dnnkit.pool2d(x, 3, 2, 1, "average",
                                                              backend="numba"),
                                             dy, 3, 2, 1, "average", backend="numba"),
        [(2, 3, 6, 6), (2, 3, 3, 3)]),
    "softmax_backward": (lambda y, dy: dnnkit.softmax_backward(y, dy, backend="numba"),
                         [(4, 5), (4, 5)]),
    "log_softmax": (lambda x: dnnkit.log_softmax(x, backend="numba"), [(4, 5)]),
    "global_avg_pool": (lambda x: dnnkit.global_avg_pool(x, backend="numba"), [(2, 3, 4, 4)]),
    "linear": (lambda x, w, b: dnnkit.linear(x, w, b, backend="numba"),
               [(3, 5), (4, 5), (4,)]),
    "add, broadcast": (lambda a, b: dnnkit.add(a, b, backend="numba"), [(3, 4, 5), (4, 1)]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_repeated_calls_replay_and_match_the_full_path(name, rng, replays):
    fn, shapes = CASES[name]
    inputs = [[rng.standard_normal(s).astype(np.float32) for s in shapes] for _ in range(3)]
    got = [_host(fn(*[_dev(h) for h in host])) for host in inputs]
    assert replays["made"] >= 1 and replays["ran"] >= 2, replays
    with config.change_flags({"dnn.memo": False}):        # the full path, every call
        want = [_host(fn(*[_dev(h) for h in host])) for host in inputs]
    for k, (g, w) in enumerate(zip(got, want)):
        for a, b in zip(g if isinstance(g, tuple) else (g,), w if isinstance(w, tuple) else (w,)):
            if isinstance(b, np.ndarray):
                assert a.shape == b.shape and np.array_equal(a, b), (name, k)
            else:
                assert a == b


def test_cross_entropy_replays_its_loss_and_nested_softmax(rng, replays):
    for _ in range(3):
        x = rng.standard_normal((4, 5)).astype(np.float32)
        t = rng.integers(0, 5, 4)
        got = dnnkit.cross_entropy(_dev(x), _dev(t), backend="numba").copy_to_host()
        z = x - x.max(1, keepdims=True)
        want = -(z - np.log(np.exp(z).sum(1, keepdims=True)))[np.arange(4), t].mean()
        assert abs(float(got) - want) <= 1e-5 * max(1.0, abs(want))
    assert replays["ran"] >= 2


def test_a_replay_keeps_none_of_its_calls_arrays(rng):
    x, w = _dev(rng.standard_normal((2, 3, 7, 7)).astype(np.float32)), \
        _dev(rng.standard_normal((4, 3, 3, 3)).astype(np.float32))
    dnnkit.conv2d(x, w, stride=2, backend="numba")
    y = dnnkit.conv2d(x, w, stride=2, backend="numba")       # replayed
    x2 = _dev(rng.standard_normal((2, 3, 7, 7)).astype(np.float32))
    y2 = dnnkit.conv2d(x2, w, stride=2, backend="numba")
    refs = [weakref.ref(a) for a in (x2, y2, y)]
    del x2, y2, y
    gc.collect()
    assert [r() for r in refs] == [None, None, None]


class _Dev:
    """A stand-in device array for the resolver (address, size, dtype, shape)."""

    def __init__(self, ptr, shape, dtype="float32"):
        self._dnnkit_ptr, self.shape = ptr, tuple(shape)
        self.dtype, self.ndim = np.dtype(dtype), len(shape)
        self.size = int(np.prod(shape))

    def is_c_contiguous(self):
        return True


def test_the_resolver_maps_arguments_to_sources_by_address(monkeypatch):
    monkeypatch.setattr(replay, "_is_array", lambda a: isinstance(a, _Dev))
    x, y = _Dev(0x1000, (2, 8)), _Dev(0x9000, (16,))
    r = replay._Resolver([(0x1000, 0x1000 + 64, x), (0x9000, 0x9000 + 64, y)])
    assert r.arg(x) == (0, 0, None) and r.arg(7) is None
    assert r.arg(launch.At(x, 4)) == (0, 4, replay._FLAT)
    assert r.arg(_Dev(0x1000, (4, 4))) == (0, 0, (4, 4))          # a whole view
    assert r.arg(_Dev(0x9000 + 32, (8,))) == (1, 8, replay._FLAT)  # the rest of y
    assert r.arg(_Dev(0x5000, (3,))) is None                      # made before: kept
    with pytest.raises(replay.Unreplayable):
        r.arg(_Dev(0x9000, (8,)))              # a part of y: At would read past it
    with pytest.raises(replay.Unreplayable):
        r.arg(launch.At(_Dev(0x1000 + 8, (2, 2), "float64"), 0))   # another dtype
    both = replay._Resolver([(0x1000, 0x1040, x), (0x1000, 0x1040, _Dev(0x1000, (16,)))])
    with pytest.raises(replay.Unreplayable):
        both.arg(_Dev(0x1000, (4, 4)))          # held by two sources
    assert r.output((x, "algo", None)) == ("seq", tuple, (("source", 0), ("value", "algo"),
                                                          ("value", None)))
    assert r.output(_Dev(0x9000, (4, 4))) == ("view", 1, (4, 4))
    with pytest.raises(replay.Unreplayable):
        r.output(object())


def test_calls_that_cannot_be_replayed_run_the_implementation(monkeypatch):
    calls = []

    def fn(a):
        calls.append(a)
        return object()                  # not an array nor a plain value
    run = replay.bind(fn, (1,))
    assert isinstance(run, replay._Plain) and calls == [1]
    assert run(1) is not None and calls == [1]          # the recorded call's own result
    run(2)
    assert calls == [1, 2]
    # a per-call object (a dropout state): never recorded
    state = dnnkit.DropoutState("numba", 0.5, 1, (2,), np.float32, None)
    assert replay.bind(fn, (state,)) is None and calls == [1, 2]
    # a call made while another is recorded runs as it is, and records on a later call made
    # outside any recording
    later = replay.bind(fn, (3,))
    assert isinstance(later, replay._Plain) and calls == [1, 2, 3]
    with monkeypatch.context() as m:
        m.setattr(memory, "watch", object())
        later = replay.bind(fn, (4,))
        assert isinstance(later, replay._Later) and calls == [1, 2, 3]
        later(4)
        assert later.run is None and calls == [1, 2, 3, 4]
    later(5)
    assert isinstance(later.run, replay._Plain) and calls == [1, 2, 3, 4, 5]
    assert replay.refused["an output of type object"] >= 2


def test_no_replay_is_recorded_for_a_runner_the_memo_does_not_keep(rng, replays):
    x = _dev(rng.standard_normal((4, 5)).astype(np.float32))
    with config.change_flags({"dnn.memo": False}):
        for _ in range(3):
            dnnkit.log_softmax(x, backend="numba")
    with config.change_flags({"dnn.crosscheck": True}):
        for _ in range(2):
            dnnkit.softmax(x, backend="numba")
    assert replays["made"] == 0
    for _ in range(3):
        dnnkit.log_softmax(x, backend="numba")
    assert replays["made"] == 1 and replays["ran"] == 2


def test_an_op_replayed_inside_another_ops_recording_is_recorded_into_it(rng, replays):
    """log_softmax memoised (a replay), then cross-entropy, whose implementation calls it:
    the nested replay's launches are recorded into cross-entropy's (on a GPU its packed
    launches go through launch() with their arrays while this thread records)."""
    x, t = rng.standard_normal((4, 5)).astype(np.float32), rng.integers(0, 5, 4)
    for _ in range(2):
        dnnkit.softmax(_dev(x), "log", "channel", backend="numba")
    for k in range(3):
        x = rng.standard_normal((4, 5)).astype(np.float32)
        got = float(dnnkit.cross_entropy(_dev(x), _dev(t), backend="numba").copy_to_host())
        z = x - x.max(1, keepdims=True)
        want = -(z - np.log(np.exp(z).sum(1, keepdims=True)))[np.arange(4), t].mean()
        assert abs(got - want) <= 1e-5 * max(1.0, abs(want)), k
    assert replays["made"] == 2 and replays["ran"] >= 1 + 2


@pytest.mark.skipif(SIMULATOR, reason="needs a real CUDA GPU (running on the simulator)")
def test_a_replay_writes_addresses_into_packed_launches_on_a_gpu(rng, replays):
    x = rng.standard_normal((8, 16, 9, 9)).astype(np.float32)
    w = rng.standard_normal((32, 16, 3, 3)).astype(np.float32)
    for _ in range(3):
        dx, dw = _dev(x), _dev(w)
        got = dnnkit.conv2d_backward_filter(dx, dnnkit.conv2d(dx, dw, stride=2,
                                                              backend="numba"),
                                            w.shape, stride=2, backend="numba")
    assert replays["ran"] >= 4
    with config.change_flags({"dnn.memo": False}):
        want = dnnkit.conv2d_backward_filter(dx, dnnkit.conv2d(dx, dw, stride=2,
                                                               backend="numba"),
                                             w.shape, stride=2, backend="numba")
    assert np.array_equal(got.copy_to_host(), want.copy_to_host())


def test_cuDNN_work_or_an_in_place_write_is_never_replayed(monkeypatch):
    """A nested op that ran on cuDNN while a call was recorded (the handle reports it: a
    replay would leave the cuDNN call out), and a call writing into a caller's array (``out``:
    whether it overlaps an input decides the implementation's way, and is not in the
    signature), run their implementation on every call."""
    import collections
    from dnnkit.cudnn import api, handle
    calls = []

    def nested(a, *rest):
        calls.append(a)
        handle.get(0)                  # what every cuDNN call does first
        return 5
    import threading
    # no cuDNN call (the CI machine has no GPU); the handle made meanwhile is a stand-in, kept
    # in a thread-local of this test's own: no later call may find it
    monkeypatch.setattr(api, "call", lambda *a, **k: None)
    monkeypatch.setattr(handle, "_local", threading.local())
    run = replay.bind(nested, (1,))
    assert isinstance(run, replay._Plain) and run(1) == 5 and calls == [1]
    run(1)
    assert calls == [1, 1]
    Args = collections.namedtuple("Args", "x out stream")
    assert replay.bind(nested, Args(1, np.zeros(2), 0)) is None and calls == [1, 1]
    assert isinstance(replay.bind(nested, Args(1, None, 0)), replay._Plain)
