"""The communicators: NCCL through NVIDIA's binding nccl4py, and the one-process stand-in.

nccl4py (``pip install "dnnkit[dist-cu12]"`` or ``[dist-cu13]``: nccl4py and the
``nvidia-nccl-cu12``/``-cu13`` wheel holding libnccl; ``[dist]``: the binding alone) is
imported on first use, not by ``import dnnkit.distributed``: without it, everything but a
collective across processes works, and a collective raises :class:`DistributedError` saying
what to install.

Only its low-level module ``nccl.bindings.nccl`` is used: one C call per collective on raw
device addresses and a raw ``cudaStream_t`` (its ``nccl.core`` layer resolves every buffer
through cuda.core's StridedMemoryView and checks its device per call, host time a training
step's bucketed all-reduces do not need: dnnkit's arrays are already checked C-contiguous
device arrays). What it provides and what is used of it:

- ``get_unique_id``; ``comm_init_rank_scalable`` with a ``Config`` whose ``blocking`` is 0 (a
  nonblocking communicator: its set-up and its calls return ``ncclInProgress`` instead of
  blocking, so that a rank whose peer never comes can give up after the timeout);
- ``all_reduce``, ``broadcast``, ``all_gather``, ``reduce_scatter``, ``group_start``/
  ``group_end``; the binding raises ``NCCLError`` for every status but ncclSuccess and
  ncclInProgress;
- ``comm_get_async_error`` (ncclCommGetAsyncError: ncclInProgress until a nonblocking call has
  been queued, an error code once NCCL's proxy or network layer failed), ``comm_abort``
  (ncclCommAbort: NCCL kernels still running exit, a stream waiting on them moves on),
  ``comm_finalize`` and ``comm_destroy``; also ``comm_revoke`` and ``comm_shrink`` (NCCL 2.27+
  fault recovery: a job continuing without a dead rank), which dnnkit does not use.

What nccl4py cannot do here: nothing the collectives need is missing. It has no timeout of
its own for a collective whose peer is gone (NCCL has none either): dnnkit's watchdog
(watchdog.py) provides it with CUDA events and ncclCommAbort.

Every method takes Numba device arrays and Numba stream objects; the NCCL call is queued on
the stream (the host does not wait). Collectives of one communicator are serialised by its
lock, which the watchdog takes too before it queries or aborts the communicator.
"""

import contextlib
import threading
import time

import numpy as np

from .. import arrays, device, dlpack
from .env import DistributedError

SUCCESS, IN_PROGRESS = 0, 7
OPS = {"sum": 0, "prod": 1, "max": 2, "min": 3, "avg": 4}
DTYPES = {np.dtype(np.int8): 0, np.dtype(np.uint8): 1, np.dtype(np.int32): 2,
          np.dtype(np.uint32): 3, np.dtype(np.int64): 4, np.dtype(np.uint64): 5,
          np.dtype(np.float16): 6, np.dtype(np.float32): 7, np.dtype(np.float64): 8}

INSTALL = ('pip install "dnnkit[dist-cu12]" (CUDA 12) or "dnnkit[dist-cu13]" (CUDA 13): '
           'nccl4py and the NCCL library')

_lib = None


def load():
    """``nccl.bindings.nccl``, with libnccl found; DistributedError saying what to install
    otherwise."""
    global _lib
    if _lib is not None:
        return _lib
    try:
        from nccl.bindings import nccl as lib
    except ImportError as e:
        raise DistributedError(f"collectives across processes need NCCL's Python binding "
                               f"nccl4py, which is not installed ({e}): {INSTALL}") from None
    try:
        lib.get_version()
    except Exception as e:  # noqa: BLE001 - cuda-pathfinder's DynamicLibNotFoundError and kin
        raise DistributedError(f"nccl4py is installed but libnccl cannot be loaded ({e}): "
                               f"{INSTALL}") from None
    _lib = lib
    return lib


def unique_id():
    """A new NCCL unique id (rank 0 makes it; the store carries it to the others), as bytes."""
    return bytes(load().get_unique_id())


def nccl_dtype(dtype):
    return DTYPES[np.dtype(dtype)]


class NcclComm:
    """One rank's nonblocking NCCL communicator on the current device. Raises
    DistributedError when NCCL fails or the set-up does not finish within ``timeout`` s
    (``describe_timeout()``: the text naming who is missing, from the store)."""

    def __init__(self, rank, size, uid, timeout, describe_timeout=None):
        lib = self.lib = load()
        self.rank, self.size, self.timeout = rank, size, timeout
        self.lock = threading.RLock()
        self.aborted = False
        self.grouped = 0                 # depth of group() blocks
        cfg = lib.Config()
        cfg.blocking = 0
        cfg.comm_name = f"dnnkit rank {rank}"
        self.config = cfg                # alive while NCCL may read it
        try:
            self.comm = lib.comm_init_rank_scalable(size, rank, 1, bytearray(uid), cfg.ptr)
        except lib.NCCLError as e:
            raise DistributedError(f"rank {rank}: NCCL could not set up its communicator: "
                                   f"{e}") from None
        try:
            self.settle("setting up the communicator", describe_timeout)
        except BaseException:
            self.abort()
            raise

    def settle(self, what, describe_timeout=None):
        """Wait until the communicator is no longer ncclInProgress (a nonblocking call was
        queued): a host wait of microseconds after a collective, seconds at set-up; raise
        DistributedError for an error, or when it lasts ``timeout`` s."""
        lib = self.lib
        r = lib.comm_get_async_error(self.comm)
        if r == IN_PROGRESS:
            deadline, pause = time.monotonic() + self.timeout, 0.0
            while r == IN_PROGRESS:
                if time.monotonic() > deadline:
                    extra = describe_timeout() if describe_timeout is not None else ""
                    raise DistributedError(
                        f"rank {self.rank}: {what} did not finish within {self.timeout:g} s"
                        f"{': ' + extra if extra else ''}")
                time.sleep(pause)
                pause = min(pause * 2 or 1e-5, 0.01)
                r = lib.comm_get_async_error(self.comm)
        if r != SUCCESS:
            raise DistributedError(f"rank {self.rank}: NCCL reported "
                                   f"{lib.get_error_string(int(r))} ({int(r)}) {what}")

    def async_error(self):
        """ncclCommGetAsyncError: 0, 7 (in progress) or an NCCL error code; 0 once aborted."""
        with self.lock:
            return SUCCESS if self.aborted else int(self.lib.comm_get_async_error(self.comm))

    def error_string(self, code):
        return self.lib.get_error_string(int(code))

    def _call(self, what, fn, stream, *args):
        """``fn(*args, comm, stream)``: one NCCL call queued on Numba stream ``stream``."""
        with self.lock:
            if self.aborted:
                raise DistributedError(f"rank {self.rank}: {what} on an aborted NCCL "
                                       f"communicator (an earlier fault)")
            try:
                fn(*args, self.comm, device.stream_pointer(stream))
            except self.lib.NCCLError as e:
                raise DistributedError(f"rank {self.rank}: NCCL {what} failed: {e}") from None
            if not self.grouped:            # a group's calls are queued by group_end
                self.settle(what)

    def all_reduce(self, x, out, op, stream):
        self._call("all_reduce", self.lib.all_reduce, stream, dlpack.address(x),
                   dlpack.address(out), int(x.size), nccl_dtype(x.dtype), OPS[op])

    def broadcast(self, x, out, root, stream):
        self._call("broadcast", self.lib.broadcast, stream, dlpack.address(x),
                   dlpack.address(out), int(out.size), nccl_dtype(out.dtype), int(root))

    def all_gather(self, x, out, stream):
        self._call("all_gather", self.lib.all_gather, stream, dlpack.address(x),
                   dlpack.address(out), int(x.size), nccl_dtype(x.dtype))

    def reduce_scatter(self, x, out, op, stream):
        self._call("reduce_scatter", self.lib.reduce_scatter, stream, dlpack.address(x),
                   dlpack.address(out), int(out.size), nccl_dtype(x.dtype), OPS[op])

    @contextlib.contextmanager
    def group(self):
        """NCCL calls inside are queued as one launch (ncclGroupStart/End): broadcasting a
        model's parameters, for one."""
        with self.lock:
            self.lib.group_start()
            self.grouped += 1
            try:
                yield self
            finally:
                self.grouped -= 1
                try:
                    self.lib.group_end()
                except self.lib.NCCLError as e:
                    raise DistributedError(f"rank {self.rank}: NCCL group failed: {e}") from None
            if not self.grouped:
                self.settle("a group of collectives")

    def abort(self):
        """ncclCommAbort: in-flight NCCL kernels exit; the communicator is unusable after."""
        with self.lock:
            if self.aborted:
                return
            self.aborted = True
            try:
                self.lib.comm_abort(self.comm)
            except self.lib.NCCLError:
                pass

    def destroy(self):
        """Finalize (flush queued work, at most ``timeout`` s) and free; abort if that fails."""
        with self.lock:
            if self.aborted:
                return
            try:
                self.lib.comm_finalize(self.comm)
                self.settle("finalizing the communicator")
                self.lib.comm_destroy(self.comm)
                self.aborted = True
            except (DistributedError, self.lib.NCCLError):
                self.abort()


class LocalComm:
    """The communicator of a single process (world size 1, on a GPU or the simulator): every
    collective over one rank is a copy at most. Same methods as NcclComm."""

    rank, size, aborted = 0, 1, False

    def __init__(self):
        self.lock = threading.RLock()

    @staticmethod
    def _copy(x, out, stream):
        if out is not x:
            arrays.copy_into(out, x, stream)

    def all_reduce(self, x, out, op, stream):
        self._copy(x, out, stream)

    def broadcast(self, x, out, root, stream):
        self._copy(x, out, stream)

    def all_gather(self, x, out, stream):
        self._copy(x, out, stream)

    def reduce_scatter(self, x, out, op, stream):
        self._copy(x, out, stream)

    @contextlib.contextmanager
    def group(self):
        yield self

    def async_error(self):
        return SUCCESS

    def abort(self):
        pass

    def destroy(self):
        pass
