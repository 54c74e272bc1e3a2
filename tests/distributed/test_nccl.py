"""NcclComm's use of nccl4py without a GPU: the binding replaced by a fake that records the
calls and answers ncclCommGetAsyncError from a script (nonblocking set-up polled until done,
or given up after the timeout with the communicator aborted; NCCL's errors raised; no polling
inside a group; finalize then destroy), and the real binding's argument types checked against
a null communicator (NCCL itself refuses it: the arguments were accepted)."""

import numpy as np
import pytest

import dnnkit
from dnnkit.distributed import DistributedError
from dnnkit.distributed import nccl as nccl_mod


class FakeLib:
    class NCCLError(Exception):
        pass

    class Config:
        blocking = 1
        comm_name = ""
        ptr = 4242

    def __init__(self, answers=()):
        self.answers = list(answers)      # what comm_get_async_error returns, in turn
        self.calls = []

    def _log(self, name, *args):
        self.calls.append((name,) + args)

    def comm_init_rank_scalable(self, size, rank, n_ids, ids, cfg):
        self._log("init", size, rank, n_ids, bytes(ids), cfg)
        return "comm"

    def comm_get_async_error(self, comm):
        self._log("poll")
        return self.answers.pop(0) if self.answers else 0

    def get_error_string(self, code):
        return f"error {code}"

    def all_reduce(self, *args):
        self._log("all_reduce", *args)

    def broadcast(self, *args):
        self._log("broadcast", *args)

    def all_gather(self, *args):
        self._log("all_gather", *args)

    def reduce_scatter(self, *args):
        self._log("reduce_scatter", *args)

    def group_start(self):
        self._log("group_start")

    def group_end(self):
        self._log("group_end")

    def comm_abort(self, comm):
        self._log("abort")

    def comm_finalize(self, comm):
        self._log("finalize")

    def comm_destroy(self, comm):
        self._log("destroy")


def make(monkeypatch, answers, timeout=5.0, describe=None):
    lib = FakeLib(answers)
    monkeypatch.setattr(nccl_mod, "load", lambda: lib)
    return lib, nccl_mod.NcclComm(1, 2, b"\x01" * 128, timeout, describe)


def names(lib):
    return [c[0] for c in lib.calls]


def test_set_up_is_nonblocking_and_polled(monkeypatch):
    lib, comm = make(monkeypatch, [7, 7, 0])
    assert lib.calls[0] == ("init", 2, 1, 1, b"\x01" * 128, 4242)
    assert comm.config.blocking == 0 and comm.config.comm_name == "dnnkit rank 1"
    assert names(lib) == ["init", "poll", "poll", "poll"]


def test_set_up_that_never_finishes_is_aborted(monkeypatch):
    with pytest.raises(DistributedError, match=r"rank 1: setting up the communicator did not "
                                               r"finish within 0.2 s: rank 0 never came"):
        make(monkeypatch, [7] * 10 ** 6, timeout=0.2, describe=lambda: "rank 0 never came")


def test_collectives_pass_addresses_counts_types_and_the_stream(monkeypatch):
    lib, comm = make(monkeypatch, [])
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
    assert [c for c in lib.calls if c[0] != "poll"] == [
        ("all_reduce", ax, ax, 6, 7, 4, "comm", sp),
        ("broadcast", ax, ax, 6, 7, 1, "comm", sp),
        ("all_gather", ax, ao, 6, 7, "comm", sp),
        ("reduce_scatter", ao, ax, 6, 7, 2, "comm", sp)]
    assert names(lib).count("poll") == 4        # each settled (ncclInProgress) before return


def test_errors_group_destroy_and_abort(monkeypatch):
    lib, comm = make(monkeypatch, [])
    x = dnnkit.tensor(np.ones(3)).data
    s = dnnkit.current_stream()
    lib.answers = [6]
    with pytest.raises(DistributedError, match=r"rank 1: NCCL reported error 6 \(6\) "
                                               r"all_reduce"):
        comm.all_reduce(x, x, "sum", s)
    lib.calls.clear()
    with comm.group():
        comm.broadcast(x, x, 0, s)
        comm.broadcast(x, x, 0, s)
    assert names(lib) == ["group_start", "broadcast", "broadcast", "group_end", "poll"]
    lib.calls.clear()
    comm.destroy()
    assert names(lib) == ["finalize", "poll", "destroy"]
    with pytest.raises(DistributedError, match="on an aborted NCCL communicator"):
        comm.all_reduce(x, x, "sum", s)
    comm.abort()
    assert "abort" not in names(lib)             # destroyed: nothing left to abort


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
    cfg.blocking = 0
    cfg.comm_name = "dnnkit rank 0"
    assert (cfg.blocking, cfg.comm_name) == (0, "dnnkit rank 0") and cfg.ptr
    assert len(nccl_mod.unique_id()) == 128       # needs no GPU
    assert (lib.get_error_string(6), nccl_mod.IN_PROGRESS) == (
        "remote process exited or there was a network error", int(lib.Result.InProgress))
