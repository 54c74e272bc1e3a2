"""cuDNN workspaces (dnnkit/cudnn/workspace.py): the per-thread, per-stream kept workspace, with
a stand-in for dnnkit.memory.scratch (its logic needs no GPU; the GPU tests run it for real)."""

import threading

import pytest

from dnnkit import config, memory
from dnnkit.cudnn import workspace


class FakeScratch:
    """memory.scratch's interface: a pointer when entered, given back when left."""
    made, back = [], []

    def __init__(self, nbytes, stream):
        self.nbytes, self.stream = nbytes, stream
        self.ptr = 0x1000 * (len(FakeScratch.made) + 1)
        FakeScratch.made.append(self)

    def __enter__(self):
        return self.ptr

    def __exit__(self, *exc):
        FakeScratch.back.append(self)


@pytest.fixture
def kept(monkeypatch):
    FakeScratch.made, FakeScratch.back = [], []
    monkeypatch.setattr(workspace.memory, "scratch", FakeScratch)
    monkeypatch.setattr(workspace, "simulator", lambda: False)
    monkeypatch.setattr(workspace, "device_id", lambda: 0)
    workspace.release_kept()
    yield FakeScratch
    workspace.release_kept()


def _use(nbytes, stream=0):
    ws = workspace.alloc(nbytes, stream)
    with workspace.held(ws) as p:
        return p


def test_a_stream_keeps_its_largest_workspace(kept):
    p = _use(1000)
    assert _use(1000) == p and _use(10) == p          # no allocator traffic: one block
    assert len(kept.made) == 1 and kept.back == []
    q = _use(5 << 20)                                   # larger: the kept one goes back first
    assert q != p and kept.back == [kept.made[0]] and len(kept.made) == 2
    assert _use(1000) == q                              # the larger one serves smaller asks
    assert _use(1000, stream=5) not in (p, q)           # another stream: its own
    assert workspace.alloc(0, 0) is None


def test_empty_cache_gives_the_kept_workspaces_back(kept):
    _use(1000)
    _use(1000, stream=5)
    memory.empty_cache()
    assert len(kept.back) == 2
    _use(1000)                                          # taken again on the next call
    assert len(kept.made) == 3


def test_a_flag_change_gives_them_back(kept):
    _use(1000)
    with config.change_flags({"dnn.allocator": "numba"}):
        _use(1000)          # not kept under the numba allocator: a scratch per call
        assert len(kept.back) == 2
    _use(1000)
    assert len(kept.made) == 3


def test_other_threads_keep_their_own(kept):
    mine = _use(1000)
    theirs = []
    t = threading.Thread(target=lambda: theirs.append(_use(1000)))
    t.start()
    t.join()
    assert theirs[0] != mine and len(kept.made) == 2


def test_not_kept_inside_a_graph_pool(kept):
    with memory.private_pool(memory.new_pool()):
        _use(1000)
        _use(1000)
    assert len(kept.made) == 2 and len(kept.back) == 2  # a scratch per call, given back


def test_out_of_memory_is_an_answer(kept, monkeypatch):
    def oom(nbytes, stream):
        raise MemoryError("out of memory")
    monkeypatch.setattr(workspace.memory, "scratch", oom)
    assert workspace.alloc(1000, 0) is None
