"""The watchdog: a rank that dies or hangs becomes an error naming it on every other rank.

NCCL has no timeout: a collective whose peer is gone spins on the GPU for ever, and the host
only notices when it next waits for that stream. So each rank runs a daemon thread that,
every ``interval`` seconds,

1. asks NCCL for an asynchronous error (ncclCommGetAsyncError: a network or proxy failure,
   a peer's closed socket);
2. queries the CUDA event recorded after each collective (cuEventQuery, no waiting); a
   collective still unfinished ``dnn.distributed.timeout`` seconds after it was queued is a
   hang, and so is a main thread still inside the NCCL call of a collective that long (NCCL
   connects the peers of an algorithm at its first collective, a host wait on them);
3. sends a heartbeat to the store (its count of collectives queued and finished), from which
   the others can tell a rank that stopped or fell behind.

On a fault it asks the store who is to blame (:func:`name_culprits`: a rank whose connection
closed, one whose heartbeats stopped, one that has not queued the collective this rank waits
in), aborts the NCCL communicator (ncclCommAbort, from this thread: the spinning kernels exit,
so a host wait on the stream returns, and a call blocked in NCCL returns) and keeps the error:
the next dnnkit.distributed call of the main thread
(a collective, a DataParallel step) raises it. A main thread that does not come back to
dnnkit within ``min(timeout, 30)`` seconds -- blocked elsewhere, or computing on without
collectives -- would run on with wrong data: the watchdog then prints the error and ends the
process with exit status 1 (PyTorch's NCCL watchdog does the same).
"""

import collections
import os
import sys
import threading
import time

from .. import device
from .env import DistributedError

CUDA_SUCCESS, CUDA_ERROR_NOT_READY = 0, 600
BEAT_INTERVAL = 1.0              # seconds between heartbeats


def beat_limit(timeout):
    """Seconds without a heartbeat after which a rank counts as stopped."""
    return max(3 * BEAT_INTERVAL, min(timeout / 2, 30.0))


def name_culprits(status, rank, world_size, waiting, limit):
    """``(text, ranks)``: who the store says is to blame, for rank ``rank`` stuck in its
    collective number ``waiting`` (None: not in a collective). ``status``: the store's
    :meth:`StoreServer.status`, or None when the store cannot be reached (rank 0 is then the
    one named: the store lives in its process)."""
    if status is None:
        return ("the rendezvous store on rank 0 cannot be reached: rank 0 exited or hangs",
                (0,))
    dead = {int(r): age for r, age in status.get("dead", {}).items()}
    left = set(status.get("left", ()))
    beats = {int(r): v for r, v in status.get("beats", {}).items()}
    joined = set(status.get("joined", ()))
    parts, ranks = [], []
    for r in range(world_size):
        if r == rank:
            continue
        why = None
        if r in dead:
            why = f"rank {r} exited (its connection to the store closed {dead[r]:.1f} s ago)"
        elif r in left:
            why = f"rank {r} left the job (it called destroy())"
        elif r not in joined:
            why = f"rank {r} never connected to the store"
        elif r in beats:
            age, progress = beats[r]
            issued = int((progress or {}).get("issued", 0))
            if age > limit:
                why = f"rank {r} stopped responding (no heartbeat for {age:.1f} s: hung, " \
                      f"stopped or overloaded)"
            elif waiting is not None and issued < waiting:
                why = f"rank {r} has queued {issued} collectives and not yet this rank's " \
                      f"collective #{waiting} (it is behind or stuck outside dnnkit)"
        if why:
            parts.append(why)
            ranks.append(r)
    if not parts:
        return ("no other rank is known to have failed; the ranks may have called their "
                "collectives in different orders or with different sizes", ())
    return "; ".join(parts), tuple(ranks)


class Watchdog:
    """The thread watching one process group (``group``: its rank, world_size, comm, timeout
    and ``fault(reason, waiting, store)``). ``store``: a store client of its own ("watch"
    role), so that a main thread blocked in a store call does not block it."""

    def __init__(self, group, store, interval=None):
        self.group, self.store = group, store
        t = group.timeout
        self.interval = interval if interval is not None else min(0.5, t / 10)
        self.grace = min(t, 30.0)
        self.pending = collections.deque()     # (collective number, what, CUevent, queued at)
        # (collective number, what, since) while the main thread is in the NCCL call of a
        # collective (ProcessGroup.run sets it; one assignment, no lock), else None
        self.calling = None
        self.free = []                         # CUevents done with, for reuse
        self.issued = self.done = 0
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.raised = threading.Event()        # the main thread raised the failure
        self.store_lost = False
        drv = device.driver()
        err, self.ctx = drv.cuCtxGetCurrent()
        self.thread = threading.Thread(target=self._run, name="dnnkit-watchdog", daemon=True)
        self.thread.start()

    # ------------------------------------------------------------ main thread

    def track(self, seq, what, stream_ptr):
        """Collective number ``seq`` (``what``) was queued on raw stream ``stream_ptr``:
        record an event after it (~2 us of host time)."""
        drv = device.driver()
        with self.lock:
            ev = self.free.pop() if self.free else None
        if ev is None:
            err, ev = drv.cuEventCreate(int(drv.CUevent_flags.CU_EVENT_DISABLE_TIMING))
            if int(err):
                raise DistributedError(f"cuEventCreate failed with {err}")
        (err,) = drv.cuEventRecord(ev, stream_ptr)
        if int(err):
            raise DistributedError(f"cuEventRecord after {what} failed with {err}")
        with self.lock:
            self.pending.append((seq, what, ev, time.monotonic()))
            self.issued = seq

    def stop(self):
        self.stopping.set()
        if self.thread is not threading.current_thread():
            self.thread.join(timeout=5 * self.interval + 1)
        drv = device.driver()
        with self.lock:
            events = [p[2] for p in self.pending] + self.free
            self.pending.clear()
            self.free = []
        for ev in events:
            drv.cuEventDestroy(ev)

    # ------------------------------------------------------------ the thread

    def _run(self):
        drv = device.driver()
        if self.ctx is not None:
            drv.cuCtxSetCurrent(self.ctx)
        next_beat = 0.0
        while not self.stopping.wait(self.interval):
            try:
                fault = self._check(drv)
            except Exception as e:  # noqa: BLE001 - any driver or NCCL failure is a fault
                fault = (f"the watchdog failed: {type(e).__name__}: {e}", None)
            if fault is not None:
                self._fail(*fault)
                return
            now = time.monotonic()
            if now >= next_beat:
                next_beat = now + BEAT_INTERVAL
                try:
                    self.store.beat({"issued": self.issued, "done": self.done})
                    self.store_lost = False
                except DistributedError:
                    self.store_lost = True     # named if a collective then hangs

    def _check(self, drv):
        """(reason, collective number waited in) of a fault, or None."""
        comm = self.group.comm
        err = comm.async_error()
        waiting = self.pending[0][0] if self.pending else None
        if err not in (0, 7):
            return f"NCCL reported {comm.error_string(err)} ({err})", waiting
        calling = self.calling
        if calling is not None and time.monotonic() - calling[2] > self.group.timeout:
            return (f"collective #{calling[0]} ({calling[1]}) was not queued within "
                    f"{self.group.timeout:g} s: the call is blocked inside NCCL", calling[0])
        with self.lock:
            while self.pending:
                seq, what, ev, t0 = self.pending[0]
                (r,) = drv.cuEventQuery(ev)
                if int(r) == CUDA_ERROR_NOT_READY:
                    if time.monotonic() - t0 > self.group.timeout:
                        return (f"collective #{seq} ({what}) did not finish within "
                                f"{self.group.timeout:g} s", seq)
                    break
                self.pending.popleft()
                self.free.append(ev)
                if int(r) != CUDA_SUCCESS:
                    return f"the GPU failed while running collective #{seq} ({what}): {r}", seq
                self.done = seq
        return None

    def _fail(self, reason, waiting):
        err = self.group.fault(reason, waiting, self.store)
        if self.raised.wait(self.grace) or self.stopping.is_set():
            return
        print(f"dnnkit.distributed: {err}\ndnnkit.distributed: rank {self.group.rank} exits: "
              f"its main thread did not return to dnnkit within {self.grace:g} s of the fault",
              file=sys.stderr, flush=True)
        os._exit(1)
