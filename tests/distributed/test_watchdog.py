"""The watchdog without a GPU: the CUDA driver's event calls replaced by a fake whose events
finish when the test says, NCCL's asynchronous error by a settable value, and a real store
in this process (rank 1's connection closed without goodbye: it "died"). A collective that
never finishes is a fault after the timeout, one that finishes is not; an NCCL error is a
fault at once; the fault names rank 1, aborts the communicator and is raised by the next
check(); heartbeats reach the store; a main thread that never comes back makes the watchdog
end the process (os._exit, replaced here)."""

import threading
import time

import pytest

from dnnkit import device
from dnnkit.distributed import DistributedError, ProcessEnv, ProcessGroup
from dnnkit.distributed import store as store_mod, watchdog as watchdog_mod

from .procs import free_port

NOT_READY = watchdog_mod.CUDA_ERROR_NOT_READY


class FakeDriver:
    class CUevent_flags:
        CU_EVENT_DISABLE_TIMING = 2

    def __init__(self):
        self.done = set()
        self.recorded = []

    def cuCtxGetCurrent(self):
        return 0, None

    def cuCtxSetCurrent(self, ctx):
        return (0,)

    def cuEventCreate(self, flags):
        return 0, object()

    def cuEventRecord(self, ev, stream):
        self.recorded.append((ev, stream))
        return (0,)

    def cuEventQuery(self, ev):
        return (0 if ev in self.done else NOT_READY,)

    def cuEventDestroy(self, ev):
        return (0,)


class FakeNccl:
    size = 2

    def __init__(self):
        self.error = 0
        self.aborted = False
        self.lock = threading.RLock()

    def async_error(self):
        return self.error

    def error_string(self, code):
        return {6: "remote process exited or there was a network error"}[code]

    def abort(self):
        self.aborted = True

    def destroy(self):
        pass


@pytest.fixture
def job(monkeypatch):
    """(group of rank 0 with a watchdog, the fake driver, the store server); rank 1 joined
    and then died."""
    drv = FakeDriver()
    monkeypatch.setattr(device, "driver", lambda: drv)
    port = free_port()
    server = store_mod.StoreServer(port, 2)
    main = store_mod.Store("127.0.0.1", port, 0, 2, timeout=10)
    watch = store_mod.Store("127.0.0.1", port, 0, 2, timeout=10, role="watch")
    rank1 = store_mod.Store("127.0.0.1", port, 1, 2, timeout=10)
    rank1.sock.close()                       # no bye: rank 1 "exited"
    comm = FakeNccl()
    g = ProcessGroup(ProcessEnv(0, 2, 0, "127.0.0.1", port, "env"), 1.0, None, comm, main,
                     server, watch)
    g.watchdog = watchdog_mod.Watchdog(g, watch, interval=0.05)
    g.watchdog.grace = 60.0
    yield g, drv, server
    g.watchdog.stopping.set()
    g.watchdog.thread.join(5)
    for s in (watch, main):
        s.close()
    server.close()


def wait_for(cond, limit=10.0):
    deadline = time.monotonic() + limit
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_a_finished_collective_is_no_fault_and_beats_reach_the_store(job):
    g, drv, server = job
    g.watchdog.track(1, "all_reduce", 0)
    drv.done.add(drv.recorded[-1][0])
    wait_for(lambda: g.watchdog.done == 1)
    wait_for(lambda: server.beats.get(0, (0, {}))[1].get("done") == 1, 5)
    time.sleep(1.3)                             # past the timeout: still no fault
    assert g.failure is None
    g.check()


def test_a_collective_that_never_finishes_is_a_fault_naming_the_dead_rank(job):
    g, drv, _ = job
    t0 = time.monotonic()
    g.watchdog.track(1, "all_reduce", 0)
    wait_for(lambda: g.failure is not None)
    assert 1.0 <= time.monotonic() - t0 < 5.0
    assert g.comm.aborted
    with pytest.raises(DistributedError) as e:
        g.check()
    assert str(e.value).startswith("rank 0: collective #1 (all_reduce) did not finish within "
                                   "1 s; rank 1 exited (its connection to the store closed")
    assert e.value.ranks == (1,)
    assert g.watchdog.raised.is_set()


def test_an_nccl_error_is_a_fault_at_once(job):
    g, _, _ = job
    g.comm.error = 6
    wait_for(lambda: g.failure is not None, 2.0)
    assert "NCCL reported remote process exited or there was a network error (6)" in \
        str(g.failure)
    assert g.failure.ranks == (1,)
    with pytest.raises(DistributedError, match="NCCL reported"):
        g.run("all_reduce", lambda c: None, None)      # the next collective raises it


def test_a_main_thread_that_never_returns_ends_the_process(job, monkeypatch, capsys):
    g, _, _ = job
    exits = []
    monkeypatch.setattr(watchdog_mod.os, "_exit", exits.append)
    g.watchdog.grace = 0.2
    g.comm.error = 6
    wait_for(lambda: exits, 5.0)
    assert exits == [1]
    err = capsys.readouterr().err
    assert "dnnkit.distributed: rank 0: NCCL reported" in err
    assert "rank 0 exits: its main thread did not return to dnnkit within 0.2 s" in err


def test_a_call_blocked_inside_nccl_is_a_fault_naming_the_dead_rank(job):
    """The main thread inside the NCCL call of collective #1 (ProcessGroup.run's mark) past
    the timeout, with no event recorded yet: a fault, and the communicator aborted."""
    g, _, _ = job
    t0 = time.monotonic()
    g.watchdog.calling = (1, "DataParallel bucket 0 (64 bytes)", t0)
    wait_for(lambda: g.failure is not None)
    assert 1.0 <= time.monotonic() - t0 < 5.0
    assert g.comm.aborted
    assert str(g.failure).startswith("rank 0: collective #1 (DataParallel bucket 0 (64 bytes)) "
                                     "was not queued within 1 s: the call is blocked inside "
                                     "NCCL; rank 1 exited")
    assert g.failure.ranks == (1,)


def test_run_marks_the_call_for_the_watchdog_and_clears_it(job):
    g, drv, _ = job
    seen = []
    g.run("all_reduce", lambda c: seen.append(g.watchdog.calling), 0)
    assert seen[0][:2] == (1, "all_reduce") and g.watchdog.calling is None
    assert g.seq == 1 and drv.recorded[-1][1] == 0           # tracked after it
    drv.done.add(drv.recorded[-1][0])
    wait_for(lambda: g.watchdog.done == 1)
    assert g.failure is None


def test_collectives_recorded_in_a_cuda_graph_are_tracked_at_every_replay(job, monkeypatch):
    """A collective queued while a CUDA graph records is tracked at each replay instead (an
    event recorded in a capture never fires): a replay whose peer is gone is named after the
    timeout, and the next replay raises the fault."""
    from dnnkit import graphs
    g, drv, _ = job
    hooks = []
    monkeypatch.setattr(device, "is_capturing", lambda ptr: True)
    monkeypatch.setattr(graphs, "after_replay", hooks.append)
    g.run("bucket 0", lambda c: None, 0)
    assert g.seq == 1 and drv.recorded == [] and len(hooks) == 1   # recorded, not tracked
    hooks[0](0xAB)                                                 # a replay
    assert g.seq == 2 and drv.recorded[-1][1] == 0xAB
    drv.done.add(drv.recorded[-1][0])
    wait_for(lambda: g.watchdog.done == 2)
    assert g.failure is None
    drv.done.clear()                  # (the watchdog reuses the event)
    hooks[0](0xAB)                    # the next replay never finishes: rank 1 is gone
    wait_for(lambda: g.failure is not None)
    text = str(g.failure)
    assert "collective #3 (bucket 0, in a CUDA graph replay) did not finish within 1 s" in text
    assert "rank 1 exited" in text
    with pytest.raises(DistributedError, match="did not finish"):
        hooks[0](0xAB)                # a replay after the fault raises it


def test_the_fault_is_raised_while_the_abort_still_waits(job):
    """ncclCommAbort can wait for long (on 2 H100s it never returned while the main thread
    kept replaying a CUDA graph of collectives): the fault is recorded before the abort, so
    the main thread's next check raises it meanwhile instead of queueing on."""
    g, drv, _ = job
    release = threading.Event()
    g.comm.abort = lambda: release.wait(30)
    g.watchdog.track(1, "all_reduce", 0)                  # never finishes
    try:
        wait_for(lambda: g.failure is not None)
        with pytest.raises(DistributedError, match="collective #1"):
            g.check()
    finally:
        release.set()
