"""cuDNN workspaces (dnnkit/cudnn/workspace.py): the workspace kept per (device, stream), with
a stand-in for dnnkit.memory.scratch (its logic needs no GPU; the GPU tests run it for real)."""

import threading

import pytest

from dnnkit import config, memory
from dnnkit.cudnn import workspace


class FakeScratch:
    """memory.scratch's interface: a pointer when entered, given back when left."""
    made, back = [], []

    pooled = True       # False: as under dnn.allocator = numba (an exact-size array, no key)

    def __init__(self, nbytes, stream):
        self.nbytes, self.stream = nbytes, stream
        self.key = (0, stream, memory.rounded(nbytes)) if FakeScratch.pooled else None
        self.ptr = 0x1000 * (len(FakeScratch.made) + 1)
        FakeScratch.made.append(self)

    def __enter__(self):
        return self.ptr

    def __exit__(self, *exc):
        FakeScratch.back.append(self)


@pytest.fixture
def kept(monkeypatch):
    FakeScratch.made, FakeScratch.back, FakeScratch.pooled = [], [], True
    monkeypatch.setattr(workspace.memory, "scratch", FakeScratch)
    monkeypatch.setattr(workspace, "simulator", lambda: False)
    monkeypatch.setattr(workspace, "device_id", lambda: 0)
    # the streams here are made-up handles: never handed to the driver's capture query
    monkeypatch.setattr(workspace, "refuse_foreign_capture", lambda stream: None)
    workspace._local.__dict__.clear()       # this thread's decision, made for the simulator
    workspace.release_kept()
    yield FakeScratch
    workspace.release_kept()
    workspace._local.__dict__.clear()


def _use(nbytes, stream=0):
    ws = workspace.alloc(nbytes, stream)
    with workspace.held(ws) as p:
        return p


def test_a_stream_keeps_its_largest_workspace(kept):
    p = _use(1000)
    assert _use(1000) == p and _use(10) == p          # no allocator traffic: one block
    assert len(kept.made) == 1 and kept.back == []
    assert memory.stats()["held_bytes"] == memory.rounded(1000)
    q = _use(5 << 20)                                   # larger: the kept one goes back first
    assert q != p and kept.back == [kept.made[0]] and len(kept.made) == 2
    assert _use(1000) == q                              # the larger one serves smaller asks
    assert _use(1000, stream=5) not in (p, q)           # another stream: its own
    assert workspace.alloc(0, 0) is None


def test_a_block_in_use_goes_back_when_its_call_is_done(kept):
    small = workspace.alloc(1000, 0)                    # a call holds it (not yet queued)
    with workspace.held(small) as p:
        assert _use(5 << 20) != p                       # a larger one is kept now...
        memory.empty_cache()                            # ...and retired with the cache
        assert kept.back == [kept.made[1]]              # the small one is still in use
    assert kept.back == [kept.made[1], kept.made[0]]    # given back when its call is done


def test_empty_cache_gives_the_kept_workspaces_back(kept):
    _use(1000)
    _use(1000, stream=5)
    memory.empty_cache()
    assert len(kept.back) == 2 and memory.stats()["held_bytes"] == 0
    _use(1000)                                          # taken again on the next call
    assert len(kept.made) == 3


def test_not_kept_under_the_numba_allocator(kept):
    p = _use(1000)
    with config.change_flags({"dnn.allocator": "numba"}):
        _use(1000)
        _use(1000)          # a scratch per call, given back
        assert len(kept.made) == 3 and len(kept.back) == 2
    assert _use(1000) == p  # the kept one again, not given back by the flag change


def test_threads_share_a_stream_s_workspace(kept):
    mine = _use(1000)
    theirs = []
    t = threading.Thread(target=lambda: theirs.append(_use(1000)))
    t.start()
    t.join()
    assert theirs == [mine] and len(kept.made) == 1


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


def test_a_stream_a_foreign_capture_records_is_refused(kept, monkeypatch):
    class Refused(Exception):
        pass

    def refuse(stream):
        if stream == 5:
            raise Refused(stream)
    monkeypatch.setattr(workspace, "refuse_foreign_capture", refuse)
    _use(1000, stream=7)
    with pytest.raises(Refused):
        _use(1000, stream=5)
    _use(1000, stream=0)            # the legacy default stream cannot be captured: not asked


def test_an_allocation_retries_when_only_kept_blocks_could_be_freed(monkeypatch):
    """memory's out-of-memory retry empties the cache when blocks are kept outside it, even
    with nothing cached (the kept workspace is given back and freed with it)."""
    calls, released = [], []

    class Ctx:
        def memalloc(self, size):
            calls.append(size)
            if len(calls) == 1:
                raise MemoryError("out of memory")
            return "block"
    monkeypatch.setattr(memory, "_holders", [(lambda: released.append(1), lambda: 64)])
    monkeypatch.setattr(memory._pool, "cached_bytes", 0)
    assert memory._raw_alloc(Ctx(), 512) == "block" and released == [1]
    monkeypatch.setattr(memory, "_holders", [(lambda: None, lambda: 0)])
    calls.clear()
    with pytest.raises(MemoryError):
        memory._raw_alloc(Ctx(), 512)


def test_a_block_not_from_the_pool_is_never_kept(kept):
    """A scratch that is not a pool block (the allocator flag changed between the decision and
    the allocation, in another thread) has exactly the bytes asked: keeping it under a rounded
    size would hand a later, larger request a short buffer."""
    kept.pooled = False
    _use(1000)
    assert memory.stats()["held_bytes"] == 0 and len(kept.back) == 1
    kept.pooled = True
    _use(1000)
    assert memory.stats()["held_bytes"] == memory.rounded(1000)


def test_each_threads_per_thread_default_stream_keeps_its_own_workspace(kept):
    # CU_STREAM_PER_THREAD (handle 2) is a different stream in each thread: their calls are
    # not ordered with each other, so one thread's kept workspace must not serve another's
    from dnnkit.device import PER_THREAD
    mine = _use(1000, stream=PER_THREAD)
    assert _use(1000, stream=PER_THREAD) == mine
    theirs = []
    t = threading.Thread(target=lambda: theirs.append(_use(1000, stream=PER_THREAD)))
    t.start()
    t.join()
    assert theirs[0] != mine and len(kept.made) == 2


def test_an_ended_threads_per_thread_workspace_goes_back(kept):
    from dnnkit.device import PER_THREAD
    t = threading.Thread(target=lambda: _use(1000, stream=PER_THREAD))
    t.start()
    t.join()
    assert kept.back == kept.made and len(kept.made) == 1      # retired at the thread's end
    assert memory.stats()["held_bytes"] == 0
    _use(1000)                                  # a stream's own is kept as before
    assert memory.stats()["held_bytes"] == memory.rounded(1000)
