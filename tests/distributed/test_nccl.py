"""NcclComm's use of nccl4py without a GPU: the binding replaced by a fake that records the
calls (tests/distributed/fakes.py). A blocking communicator: its set-up runs in a helper
thread and is given up after the timeout (the late communicator aborted by that thread); a
collective or a group is one call each, with no polling of ncclCommGetAsyncError; NCCL's
errors raised; a call blocked in NCCL is unblocked by an abort from another thread;
NCCL_COMM_BLOCKING=0 refused; finalize then destroy, or an abort when finalize hangs; and the
real binding's argument types checked against a null communicator (NCCL itself refuses it:
the arguments were accepted)."""

import threading
import time

import numpy as np
import pytest

import dnnkit
from dnnkit.distributed import DistributedError
from dnnkit.distributed import nccl as nccl_mod

from .fakes import FakeNcclLib


def make(monkeypatch, timeout=5.0, describe=None, lib=None):
    lib = lib or FakeNcclLib()
    monkeypatch.setattr(nccl_mod, "load", lambda: lib)
    monkeypatch.delenv("NCCL_COMM_BLOCKING", raising=False)
    return lib, nccl_mod.NcclComm(1, 2, b"\x01" * 128, timeout, describe)


def test_set_up_is_blocking_and_not_polled(monkeypatch):
    lib, comm = make(monkeypatch)
    assert lib.calls == [("init", 2, 1, 1, b"\x01" * 128, 4242)]
    assert comm.config.blocking == 1 and comm.config.comm_name == "dnnkit rank 1"
    assert comm.comm == "comm" and not comm.aborted


def test_set_up_that_never_finishes_is_given_up_and_aborted_when_it_does(monkeypatch):
    lib = FakeNcclLib()
    lib.init_gate = threading.Event()
    t0 = time.monotonic()
    with pytest.raises(DistributedError, match=r"rank 1: setting up the communicator did not "
                                               r"finish within 0.2 s: rank 0 never came"):
        make(monkeypatch, timeout=0.2, describe=lambda: "rank 0 never came", lib=lib)
    assert 0.2 <= time.monotonic() - t0 < 5
    lib.init_gate.set()                       # the peer comes after all
    deadline = time.monotonic() + 5
    while "abort" not in lib.names():
        assert time.monotonic() < deadline, lib.calls
        time.sleep(0.01)
    assert lib.calls[-1] == ("abort", "comm")  # the helper thread freed it


def test_nccl_comm_blocking_0_is_refused(monkeypatch):
    lib = FakeNcclLib()
    monkeypatch.setattr(nccl_mod, "load", lambda: lib)
    monkeypatch.setenv("NCCL_COMM_BLOCKING", "0")
    with pytest.raises(DistributedError, match="NCCL_COMM_BLOCKING=0 is set"):
        nccl_mod.NcclComm(1, 2, b"\x01" * 128, 5.0)
    assert lib.calls == []


def test_collectives_are_one_call_each_without_polling(monkeypatch):
    lib, comm = make(monkeypatch)
    x = dnnkit.tensor(np.ones((2, 3), np.float32)).data
    out = dnnkit.tensor(np.ones((4, 3), np.float32)).data
    s = dnnkit.current_stream()
    lib.calls.clear()
    comm.all_reduce(x, x, "avg", s)
    comm.broadcast(x, x, 1, s)
    comm.all_gather(x, out, s)
    comm.reduce_scatter(out, x, "max", s)
    ax, ao = dnnkit.dlpack.address(x), dnnkit.dlpack.address(out)
    sp = dnnkit.device.stream_pointer(s)
    assert lib.calls == [
        ("all_reduce", ax, ax, 6, 7, 4, "comm", sp),
        ("broadcast", ax, ax, 6, 7, 1, "comm", sp),
        ("all_gather", ax, ao, 6, 7, "comm", sp),
        ("reduce_scatter", ao, ax, 6, 7, 2, "comm", sp)]   # no ncclCommGetAsyncError
    assert comm.busy == 0


def test_errors_group_destroy_and_abort(monkeypatch):
    lib, comm = make(monkeypatch)
    x = dnnkit.tensor(np.ones(3)).data
    s = dnnkit.current_stream()

    def fail(*args):
        raise lib.NCCLError("remote process exited")
    monkeypatch.setattr(lib, "all_reduce", fail)
    with pytest.raises(DistributedError, match=r"rank 1: NCCL all_reduce failed: remote "
                                               r"process exited"):
        comm.all_reduce(x, x, "sum", s)
    lib.calls.clear()
    with comm.group():
        comm.broadcast(x, x, 0, s)
        comm.broadcast(x, x, 0, s)
    assert lib.names() == ["group_start", "broadcast", "broadcast", "group_end"]
    lib.errors = [6]
    assert comm.async_error() == 6 and comm.error_string(6) == "error 6"
    lib.calls.clear()
    comm.destroy()
    assert lib.names() == ["finalize", "destroy"]
    with pytest.raises(DistributedError, match="on an aborted NCCL communicator"):
        comm.all_reduce(x, x, "sum", s)
    comm.abort()
    assert "abort" not in lib.names()             # destroyed: nothing left to abort
    assert comm.async_error() == 0                # and not queried any more


def test_a_hanging_finalize_is_aborted_after_the_timeout(monkeypatch):
    lib, comm = make(monkeypatch, timeout=0.2)
    lib.finalize_gate = threading.Event()
    lib.calls.clear()
    comm.destroy()
    assert lib.names()[:2] == ["finalize", "abort"] and comm.aborted
    time.sleep(0.1)
    assert "destroy" not in lib.names()           # abort freed it; the helper stopped


def test_abort_from_another_thread_unblocks_a_blocked_call(monkeypatch):
    """The watchdog's abort while the main thread is blocked inside NCCL (a peer that never
    comes): abort gives the call ABORT_WAIT s, then aborts; the call returns an error; the
    asynchronous-error query does not wait for the blocked call."""
    monkeypatch.setattr(nccl_mod, "ABORT_WAIT", 0.1)
    lib, comm = make(monkeypatch)
    lib.call_gate = threading.Event()
    x = dnnkit.tensor(np.ones(3)).data
    s = dnnkit.current_stream()
    raised = []

    def main():
        try:
            comm.all_reduce(x, x, "sum", s)
        except DistributedError as e:
            raised.append(str(e))
    th = threading.Thread(target=main)
    th.start()
    while comm.busy == 0:
        time.sleep(0.005)
    t0 = time.monotonic()
    assert comm.async_error() == 0 and time.monotonic() - t0 < 0.05
    comm.abort()
    assert 0.1 <= time.monotonic() - t0 < 2
    th.join(5)
    assert not th.is_alive()
    assert raised == ["rank 1: NCCL all_reduce failed: all_reduce: aborted"]
    assert lib.names()[-1] == "abort" and comm.busy == 0


def test_the_real_binding_takes_these_arguments():
    try:
        lib = nccl_mod.load()
    except DistributedError as e:
        pytest.skip(str(e))
    null = lib.Comm(0)
    for call in (lambda: lib.all_reduce(0, 0, 4, 7, 4, null, 0),
                 lambda: lib.broadcast(0, 0, 4, 7, 0, null, 0),
                 lambda: lib.all_gather(0, 0, 4, 7, null, 0),
                 lambda: lib.reduce_scatter(0, 0, 4, 7, 0, null, 0),
                 lambda: lib.comm_get_async_error(null)):
        with pytest.raises(lib.NCCLError, match="InvalidArgument"):
            call()
    cfg = lib.Config()
    cfg.blocking = 1
    cfg.comm_name = "dnnkit rank 0"
    assert (cfg.blocking, cfg.comm_name) == (1, "dnnkit rank 0") and cfg.ptr
    assert len(nccl_mod.unique_id()) == 128       # needs no GPU
    assert (lib.get_error_string(6), nccl_mod.IN_PROGRESS) == (
        "remote process exited or there was a network error", int(lib.Result.InProgress))
