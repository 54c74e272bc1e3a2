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
device arrays). Every call of the binding releases the GIL (``with nogil``), so a thread
blocked in NCCL does not stop the watchdog's thread. What is used of it:

- ``get_unique_id``; ``comm_init_rank_scalable`` with a ``Config`` whose ``blocking`` is 1;
- ``all_reduce``, ``broadcast``, ``all_gather``, ``reduce_scatter``, ``group_start``/
  ``group_end``; the binding raises ``NCCLError`` for every status but ncclSuccess and
  ncclInProgress;
- ``comm_get_async_error`` (ncclCommGetAsyncError: an error code once NCCL's proxy or network
  layer failed), ``comm_abort`` (ncclCommAbort: NCCL kernels still running exit, a stream
  waiting on them moves on, a host thread blocked in an NCCL call of the communicator
  returns), ``comm_finalize`` and ``comm_destroy``; also ``comm_revoke`` and ``comm_shrink``
  (NCCL 2.27+ fault recovery: a job continuing without a dead rank), which dnnkit does not use.

Why a blocking communicator. A nonblocking one (``config.blocking = 0``) hands every
ncclGroupEnd -- so every collective, each an implicit group -- to a new host thread
(NCCL src/group.cc, ncclGroupEndInternal: ``STDTHREADCREATE(... ncclAsyncJobMain ...)``, then
``ret = ncclInProgress``), and the caller "must query the communicator state until it becomes
ncclSuccess before calling another NCCL function" and must not "issue CUDA kernels on streams
used by NCCL" before then (nccl4py, ``Communicator.get_async_error``). Every collective thus
costs a thread start and join plus a host wait for that thread, on every rank at once:
milliseconds per training step with several buckets and ranks. A blocking communicator queues
the collective on the calling thread and returns (ncclGroupEndInternal's "blocking group"
branch): one C call, no polling. What the nonblocking kind was for -- giving up on a peer
that never comes -- is kept without it:

- set-up: the blocking ncclCommInitRankScalable runs in a helper thread that the caller waits
  for at most ``timeout`` s (every rank has passed the store's barrier before, so only a rank
  that dies or hangs within the set-up itself gets there); a set-up that finishes after the
  caller gave up aborts its communicator itself;
- collectives: NCCL has no timeout for a collective whose peer is gone (nor does nccl4py).
  The watchdog (watchdog.py) finds it -- a CUDA event after the collective unfinished after
  the timeout, or the main thread still inside an NCCL call after the timeout (NCCL connects
  peers at their first collective) -- and calls ncclCommAbort from its thread, which sets the
  communicator's abort flag that NCCL's kernels and its host-side waits poll: the call returns
  with an error, the kernels exit (PyTorch's NCCL watchdog aborts blocking communicators from
  its thread the same way);
- finalize at exit: in a helper thread too, aborted after the timeout.

``NCCL_COMM_BLOCKING`` in the environment overrides the configuration (NCCL src/init.cc);
``0`` would bring back the nonblocking calls above, so it is refused.

Every method takes Numba device arrays and Numba stream objects; the NCCL call is queued on
the stream (the host does not wait). Collectives of one communicator are serialised by its
``lock``; ``state`` (never held across an NCCL call) guards ``aborted`` and the count of calls
in flight, so that the watchdog can query or abort the communicator while a call is blocked.
"""

import contextlib
import os
import threading

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

# Seconds abort() waits for a call in flight to return before it aborts anyway: a call that
# is queueing returns in microseconds; one still inside NCCL after that is blocked (a peer
# that never comes), and the abort is what makes it return.
ABORT_WAIT = 1.0

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


def _context():
    """The calling thread's current CUDA context (None on the simulator): a helper thread
    makes it current before NCCL's runtime calls, which take the thread's device."""
    if device.simulator():
        return None
    err, ctx = device.driver().cuCtxGetCurrent()
    return None if int(err) else ctx


def _in_thread(fn, ctx, timeout, name):
    """Run ``fn()`` in a daemon thread with CUDA context ``ctx`` current; wait for it at most
    ``timeout`` s. Returns (finished, its exception or None); ``fn`` left running goes on."""
    box = {}

    def body():
        try:
            if ctx is not None:
                device.driver().cuCtxSetCurrent(ctx)
            fn()
        except BaseException as e:  # noqa: BLE001 - handed to the waiting thread
            box["error"] = e

    th = threading.Thread(target=body, name=name, daemon=True)
    th.start()
    th.join(timeout)
    return not th.is_alive(), box.get("error")


class NcclComm:
    """One rank's blocking NCCL communicator on the current device (module docstring).
    Raises DistributedError when NCCL fails or the set-up does not finish within ``timeout``
    s (``describe_timeout()``: the text naming who is missing, from the store)."""

    def __init__(self, rank, size, uid, timeout, describe_timeout=None):
        lib = self.lib = load()
        env = os.environ.get("NCCL_COMM_BLOCKING")
        if env is not None and env.strip() != "1":
            raise DistributedError(
                f"rank {rank}: NCCL_COMM_BLOCKING={env} is set: it would make NCCL's calls "
                f"return before they are queued (a nonblocking communicator); dnnkit's "
                f"communicator is a blocking one, aborted by its watchdog on a fault. Unset it")
        self.rank, self.size, self.timeout = rank, size, timeout
        self.lock = threading.RLock()
        self.state = threading.Condition(threading.Lock())
        self.aborted = False
        self.busy = 0                    # NCCL calls in flight
        self.caller = None               # the thread making them
        self.grouped = 0                 # depth of group() blocks
        self.comm = None
        cfg = lib.Config()
        cfg.blocking = 1
        cfg.comm_name = f"dnnkit rank {rank}"
        self.config = cfg                # alive while NCCL may read it
        abandoned = []

        def set_up():
            comm = lib.comm_init_rank_scalable(size, rank, 1, bytearray(uid), cfg.ptr)
            with self.state:
                if not abandoned:
                    self.comm = comm
                    return
            try:                         # the caller gave up: nothing else will free it
                lib.comm_abort(comm)
            except lib.NCCLError:
                pass

        done, error = _in_thread(set_up, _context(), timeout, f"dnnkit-nccl-init-{rank}")
        with self.state:
            late = not done and self.comm is None     # (else it finished just after the wait)
            if late:
                abandoned.append(True)
            if self.comm is None:
                self.aborted = True                   # nothing to call, abort or destroy
        if late:
            extra = describe_timeout() if describe_timeout is not None else ""
            raise DistributedError(f"rank {rank}: setting up the communicator did not finish "
                                   f"within {timeout:g} s{': ' + extra if extra else ''}")
        if self.comm is None:
            if isinstance(error, lib.NCCLError):
                raise DistributedError(f"rank {rank}: NCCL could not set up its communicator: "
                                       f"{error}") from None
            raise error if error is not None else DistributedError(
                f"rank {rank}: NCCL's set-up returned no communicator")

    def async_error(self):
        """ncclCommGetAsyncError: 0 or an NCCL error code (7, in progress, for work NCCL
        still does in the background); 0 once aborted. Safe while another thread is blocked
        in a call."""
        with self.state:
            if self.aborted:
                return SUCCESS
            return int(self.lib.comm_get_async_error(self.comm))

    def error_string(self, code):
        return self.lib.get_error_string(int(code))

    def _enter(self, what):
        with self.state:
            if self.aborted:
                raise DistributedError(f"rank {self.rank}: {what} on an aborted NCCL "
                                       f"communicator (an earlier fault)")
            self.busy += 1
            self.caller = threading.get_ident()

    def _leave(self):
        with self.state:
            self.busy -= 1
            if not self.busy:
                self.state.notify_all()

    def _call(self, what, fn, stream, *args):
        """``fn(*args, comm, stream)``: one NCCL call queued on Numba stream ``stream``; it
        returns once queued (a blocking communicator: nothing to poll)."""
        with self.lock:
            self._enter(what)
            try:
                fn(*args, self.comm, device.stream_pointer(stream))
            except self.lib.NCCLError as e:
                raise DistributedError(f"rank {self.rank}: NCCL {what} failed: {e}") from None
            finally:
                self._leave()

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
            self._enter("a group of collectives")
            try:
                self.lib.group_start()
                self.grouped += 1
                try:
                    yield self
                finally:
                    self.grouped -= 1
                    try:
                        self.lib.group_end()
                    except self.lib.NCCLError as e:
                        raise DistributedError(f"rank {self.rank}: NCCL group failed: "
                                               f"{e}") from None
            finally:
                self._leave()

    def abort(self):
        """ncclCommAbort: in-flight NCCL kernels exit, a call blocked in NCCL returns; the
        communicator is unusable after. From any thread: no new call starts once it is
        called; a call in flight on another thread gets ABORT_WAIT s to return first."""
        with self.state:
            if self.aborted:
                return
            self.aborted = True
            if self.busy and self.caller != threading.get_ident():
                self.state.wait_for(lambda: not self.busy, ABORT_WAIT)
        try:
            self.lib.comm_abort(self.comm)
        except self.lib.NCCLError:
            pass

    def destroy(self):
        """Finalize (flush queued work, at most ``timeout`` s, in a helper thread) and free;
        abort if that fails or times out."""
        with self.state:
            if self.aborted:
                return
        lib = self.lib

        def finish():
            lib.comm_finalize(self.comm)
            with self.state:
                if self.aborted:         # timed out meanwhile: abort() has freed it
                    return
                self.aborted = True
            lib.comm_destroy(self.comm)

        done, error = _in_thread(finish, _context(), self.timeout,
                                 f"dnnkit-nccl-finalize-{self.rank}")
        if not done or error is not None:
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
