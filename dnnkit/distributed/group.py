"""The process group: :func:`init` joins this process to the job, :func:`destroy` leaves it.

``init()`` reads who this process is (env.py), makes its GPU current (``LOCAL_RANK``; device
0 where ``CUDA_VISIBLE_DEVICES`` shows it a single GPU), and, for a world of several ranks:

1. rank 0 starts the rendezvous store (store.py) on ``MASTER_PORT``; every rank connects to
   ``MASTER_ADDR:MASTER_PORT`` and waits at a barrier for all the others (a rank that never
   comes is named after ``dnn.distributed.timeout`` seconds);
2. rank 0 makes the NCCL unique id and sets it in the store; the others get it;
3. every rank sets up its NCCL communicator (nccl.py: a blocking one, set up within the
   timeout) and starts its watchdog (watchdog.py) with a second store connection for
   heartbeats.

A world of one rank needs neither store nor NCCL: its collectives are copies (LocalComm), so a
script written for several GPUs runs unchanged on one, and on Numba's simulator.

Every collective goes through :meth:`ProcessGroup.run`: it raises a fault the watchdog found
(a dead or hung rank, an NCCL error), numbers the collective and has the watchdog track it.
"""

import atexit
import functools
import os
import threading
import time

from .. import device, graphs
from . import env, nccl, store as store_mod, watchdog as watchdog_mod
from .env import DistributedError

_current = None
_lock = threading.Lock()


class ProcessGroup:
    """One process's membership of the job: ``rank``, ``world_size``, ``local_rank``,
    ``device`` (the CUDA ordinal used; None on the simulator), ``timeout``, ``store`` (None
    for one rank), ``comm`` (NcclComm or LocalComm), ``seq`` (collectives queued so far)."""

    def __init__(self, penv, timeout, dev, comm, store=None, server=None, watch_store=None):
        self.rank, self.world_size, self.local_rank = penv.rank, penv.world_size, penv.local_rank
        self.env, self.timeout, self.device = penv, timeout, dev
        self.comm, self.store, self.server, self.watch_store = comm, store, server, watch_store
        self.seq = 0
        self.failure = None
        self.fault_lock = threading.Lock()
        self.watchdog = None
        self.tags = {}                 # name -> uses so far (store keys made unique per use)

    def __repr__(self):
        return (f"<ProcessGroup rank {self.rank} of {self.world_size}, local rank "
                f"{self.local_rank}, device {self.device}>")

    def tag(self, name):
        """A store key prefix unique to this use of ``name`` (every rank makes the same calls in
        the same order, so every rank gets the same tag)."""
        k = self.tags[name] = self.tags.get(name, 0) + 1
        return f"{name}/{k}"

    def check(self):
        """Raise the fault the watchdog found, if any."""
        if self.failure is not None:
            if self.watchdog is not None:
                self.watchdog.raised.set()
            raise self.failure

    def run(self, what, queue, stream):
        """``queue(comm)`` queues one collective (or an NCCL group of them) on Numba stream
        ``stream``; the watchdog then tracks it. While ``queue`` runs, the watchdog knows
        which collective the main thread is in (``Watchdog.calling``): a call blocked inside
        NCCL past the timeout is a fault too."""
        self.check()
        wd = self.watchdog
        if wd is not None:
            wd.calling = (self.seq + 1, what, time.monotonic())
        try:
            queue(self.comm)
        except DistributedError as e:
            if self.world_size == 1:
                raise
            raise self.fault(str(e), self.seq + 1, self.store) from None
        finally:
            if wd is not None:
                wd.calling = None
        self.seq += 1
        if wd is not None:
            ptr = device.stream_pointer(stream)
            if not device.is_capturing(ptr):
                wd.track(self.seq, what, ptr)
            else:
                # recorded into a CUDA graph: an event recorded in the capture never fires on
                # its own, so each replay is tracked instead (one number per recorded
                # collective, as every rank's replays queue the same ones)
                graphs.after_replay(functools.partial(self._replayed, what))

    def _replayed(self, what, stream_ptr):
        """After a replay of a graph that recorded collective ``what``: raise a fault found
        meanwhile, number the collective and have the watchdog track the replay."""
        self.check()
        self.seq += 1
        if self.watchdog is not None:
            self.watchdog.track(self.seq, f"{what}, in a CUDA graph replay", stream_ptr)

    def fault(self, reason, waiting, store=None):
        """Record the first fault: name the culprits from the store, abort the communicator;
        returns the DistributedError (the same one for every later caller)."""
        with self.fault_lock:
            if self.failure is not None:
                return self.failure
            status = None
            if store is not None:
                try:
                    status = store.status()
                except DistributedError:
                    pass
            text, ranks = watchdog_mod.name_culprits(
                status, self.rank, self.world_size, waiting,
                watchdog_mod.beat_limit(self.timeout))
            # the failure first: the main thread's next check raises it even while the abort
            # below waits (ncclCommAbort waited for ever on 2 H100s while the main thread kept
            # replaying a CUDA graph of collectives: its replays check, but saw no failure)
            self.failure = DistributedError(f"rank {self.rank}: {reason}; {text}", ranks=ranks)
        self.comm.abort()
        return self.failure

    def close(self):
        """Leave: stop the watchdog, finalize NCCL, say bye to the store; rank 0 keeps the
        store up until the others have left (at most the timeout)."""
        if self.watchdog is not None:
            self.watchdog.stop()
        if self.failure is None:
            self.comm.destroy()
        else:
            self.comm.abort()
        for s in (self.watch_store, self.store):
            if s is not None:
                s.close()
        if self.server is not None:
            self.server.wait_for_clients(self.timeout if self.failure is None else 0)
            self.server.close()


def current(required=True):
    """The process group of :func:`init`; None (``required=False``) or a RuntimeError when
    there is none."""
    if _current is None and required:
        raise RuntimeError("dnnkit.distributed: no process group: call "
                           "dnnkit.distributed.init() first")
    return _current


def is_initialized():
    return _current is not None


def get_rank():
    """This process's rank (0 before :func:`init`: a single process)."""
    return _current.rank if _current is not None else 0


def get_world_size():
    """The number of ranks (1 before :func:`init`)."""
    return _current.world_size if _current is not None else 1


def _select_device(penv):
    """Make this rank's GPU current; its ordinal (None on the simulator)."""
    if device.simulator():
        return None
    cuda = device.numba_cuda()
    n = device.device_count()
    if penv.local_rank < n:
        dev = penv.local_rank
    elif n == 1:
        dev = 0             # CUDA_VISIBLE_DEVICES shows this process its one GPU
    else:
        raise ValueError(f"dnnkit.distributed: LOCAL_RANK={penv.local_rank} but this process "
                         f"sees {n} GPU(s); start at most {n} ranks per host, or set "
                         f"CUDA_VISIBLE_DEVICES per rank")
    cuda.select_device(dev)
    return dev


def init(*, rank=None, world_size=None, local_rank=None, master_addr=None, master_port=None,
         timeout=None):
    """Join the job (module docstring); returns the :class:`ProcessGroup`. The keyword
    arguments override the environment's values (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
    ``MASTER_ADDR``, ``MASTER_PORT``); ``timeout`` overrides ``dnn.distributed.timeout`` for
    this group. Raises ValueError for bad or inconsistent values, RuntimeError when a group
    exists already, DistributedError naming the rank that did not come or failed."""
    global _current
    with _lock:
        if _current is not None:
            raise RuntimeError(f"dnnkit.distributed.init: this process already joined "
                               f"({_current!r}); call destroy() first")
        penv = env.from_environ(_overrides(rank, world_size, local_rank, master_addr,
                                           master_port))
        t = env.timeout() if timeout is None else env.check_timeout("init", timeout)
        if penv.world_size > 1:
            penv = env.mpi_master(penv)
        dev = _select_device(penv)
        if penv.world_size == 1:
            _current = ProcessGroup(penv, t, dev, nccl.LocalComm())
        else:
            _current = _join(penv, t, dev)
        return _current


def _overrides(rank, world_size, local_rank, master_addr, master_port):
    environ = dict(os.environ)
    for name, v in (("RANK", rank), ("WORLD_SIZE", world_size), ("LOCAL_RANK", local_rank),
                    ("MASTER_ADDR", master_addr), ("MASTER_PORT", master_port)):
        if v is not None:
            environ[name] = str(v)
    return environ


def _join(penv, t, dev):
    server = client = watch = comm = None
    try:
        if penv.rank == 0:
            server = store_mod.StoreServer(penv.master_port, penv.world_size)
        client = store_mod.Store(penv.master_addr, penv.master_port, penv.rank,
                                 penv.world_size, timeout=t)
        client.barrier("dnnkit/init", timeout=t)
        if penv.rank == 0:
            client.set("dnnkit/nccl-id", nccl.unique_id())
        uid = client.get("dnnkit/nccl-id", timeout=t, from_rank=0)

        def who():
            text, _ = watchdog_mod.name_culprits(client.status(), penv.rank, penv.world_size,
                                                 None, watchdog_mod.beat_limit(t))
            return text
        comm = nccl.NcclComm(penv.rank, penv.world_size, uid, t, who)
        watch = store_mod.Store(penv.master_addr, penv.master_port, penv.rank,
                                penv.world_size, timeout=t, role="watch")
        group = ProcessGroup(penv, t, dev, comm, client, server, watch)
        group.watchdog = watchdog_mod.Watchdog(group, watch)
        atexit.register(_destroy_at_exit, group)
        return group
    except BaseException:
        if comm is not None:
            comm.abort()
        for s in (watch, client):
            if s is not None:
                s.close()
        if server is not None:
            server.close()
        raise


def _destroy_at_exit(group):
    """A script that ends without destroy() still leaves cleanly (rank 0 waits for the
    others before its store goes)."""
    if _current is group:
        destroy()


def destroy():
    """Leave the job: stop the watchdog, finalize the NCCL communicator, close the store (rank
    0 waits for the others to leave first, at most the timeout). Nothing to do without a
    group."""
    global _current
    with _lock:
        group, _current = _current, None
    if group is not None:
        group.close()


init_process_group = init
destroy_process_group = destroy
