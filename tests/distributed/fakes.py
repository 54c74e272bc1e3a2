"""Communicators for the simulator: two ranks in one process, without NCCL.

:func:`run_pair` runs ``fn(rank, group)`` for ranks 0 and 1 in two threads that take turns:
each holds one lock while it runs and lets go only while it waits in a collective for the
other, so dnnkit never runs on both at once, and the collectives exchange real values (host
copies) with the semantics NCCL has. :class:`PhantomComm` is one rank whose partner always
holds ``factor`` times its values, and records every call."""

import contextlib
import threading

import numpy as np

from dnnkit.distributed import ProcessGroup
from dnnkit.distributed.env import DistributedError, ProcessEnv

WAIT = 120.0          # seconds a rank waits for the other before the test fails


def _reduce(values, op):
    stack = np.stack(values)
    return {"sum": stack.sum(0), "avg": stack.mean(0), "max": stack.max(0),
            "min": stack.min(0), "prod": stack.prod(0)}[op].astype(values[0].dtype)


def _get(x, stream):
    """x's values on the host, read in order on the collective's stream. The reducer's stream
    is non-blocking: a copy on the legacy default stream would not wait for the gradients
    queued there (on a GPU it read them half-written)."""
    if stream is None:
        return x.copy_to_host()
    h = x.copy_to_host(stream=stream)
    stream.synchronize()
    return h


def _put(out, value, stream):
    """value into ``out`` on the collective's stream, done before returning (as a finished
    NCCL call would be, for the work queued after it on that stream)."""
    if stream is None:
        out.copy_to_device(value)
        return
    out.copy_to_device(value, stream=stream)
    stream.synchronize()


def group_of(comm, rank=0, world=2):
    return ProcessGroup(ProcessEnv(rank, world, rank, None, None, "env"), 30.0, None, comm)


class _Turns:
    """The state two PairComms share: the run lock (a Condition) and the slots of the
    exchange in progress."""

    def __init__(self):
        self.cond = threading.Condition()
        self.slots = {}
        self.generation = 0
        self.taken = 0
        self.failed = None
        self.finished = set()


class PairComm:
    size = 2
    aborted = False

    def __init__(self, turns, rank):
        self.turns, self.rank = turns, rank
        self.lock = threading.RLock()
        self.calls = []

    def _exchange(self, value):
        """Both ranks' host arrays, [rank 0's, rank 1's] (the caller holds the run lock)."""
        t = self.turns
        gen = t.generation
        t.slots[self.rank] = value
        t.cond.notify_all()
        while len(t.slots) < 2 and t.generation == gen:
            if 1 - self.rank in t.finished:
                t.failed = f"rank {1 - self.rank} finished without this collective"
            if t.failed or not t.cond.wait(WAIT):
                raise DistributedError(f"fake rank {self.rank}: the other rank never came "
                                       f"({t.failed})")
        both = [t.slots[0], t.slots[1]]
        t.taken += 1
        if t.taken == 2:            # both have read: the next exchange may start
            t.slots, t.taken = {}, 0
            t.generation += 1
            t.cond.notify_all()
        else:
            while t.generation == gen:
                if t.failed or not t.cond.wait(WAIT):
                    raise DistributedError(f"fake rank {self.rank}: stuck ({t.failed})")
        return both

    def all_reduce(self, x, out, op, stream):
        self.calls.append(("all_reduce", x.size, op))
        _put(out, _reduce(self._exchange(_get(x, stream)), op), stream)

    def broadcast(self, x, out, root, stream):
        self.calls.append(("broadcast", x.size, root))
        _put(out, self._exchange(_get(x, stream))[root], stream)

    def all_gather(self, x, out, stream):
        self.calls.append(("all_gather", x.size))
        both = self._exchange(_get(x, stream))
        _put(out, np.concatenate([b.reshape(-1) for b in both]).reshape(out.shape), stream)

    def reduce_scatter(self, x, out, op, stream):
        self.calls.append(("reduce_scatter", x.size, op))
        total = _reduce(self._exchange(_get(x, stream)), op).reshape(-1)
        n = out.size
        _put(out, total[self.rank * n:(self.rank + 1) * n].reshape(out.shape), stream)

    @contextlib.contextmanager
    def group(self):
        yield self

    def async_error(self):
        return 0

    def abort(self):
        pass

    def destroy(self):
        pass


def run_pair(fn):
    """[fn(0, group0), fn(1, group1)], the two run in turns (module docstring)."""
    turns = _Turns()
    results, errors = [None, None], [None, None]

    def body(rank):
        g = group_of(PairComm(turns, rank), rank)
        with turns.cond:
            try:
                results[rank] = fn(rank, g)
            except BaseException as e:  # noqa: BLE001 - re-raised in the test's thread
                errors[rank] = e
                turns.failed = f"rank {rank} raised {type(e).__name__}: {e}"
            turns.finished.add(rank)
            turns.cond.notify_all()

    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in (0, 1)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=900)
        assert not th.is_alive(), "a fake rank did not finish"
    for e in errors:
        if e is not None:
            raise e
    return results


class PhantomComm:
    """Rank 0 of 2 whose partner holds ``factor`` times its values: all_reduce avg gives
    (1 + factor) / 2 times the input. Records ("all_reduce", size, op, what the test's
    ``probe()`` returns at that moment) for each call."""

    rank, size, aborted = 0, 2, False

    def __init__(self, factor=3.0, probe=None):
        self.factor, self.probe = factor, probe
        self.lock = threading.RLock()
        self.calls = []

    def all_reduce(self, x, out, op, stream):
        self.calls.append(("all_reduce", x.size, op, self.probe() if self.probe else None))
        v = _get(x, stream)
        _put(out, _reduce([v, (v * self.factor).astype(v.dtype)], op), stream)

    def broadcast(self, x, out, root, stream):
        self.calls.append(("broadcast", x.size, root, None))

    @contextlib.contextmanager
    def group(self):
        yield self

    def async_error(self):
        return 0

    def abort(self):
        pass

    def destroy(self):
        pass


class FakeNcclLib:
    """nccl4py's ``nccl.bindings.nccl`` without NCCL: records every call as (name, *args).
    ``init_gate``/``call_gate``/``finalize_gate`` (threading.Event or None): the set-up, each
    collective, the finalize wait until the event is set or the communicator is aborted (a
    blocking call whose peer never comes; an aborted call raises NCCLError, as NCCL's call
    returns an error once its abort flag is set)."""

    class NCCLError(Exception):
        pass

    class Config:
        blocking = 1
        comm_name = ""
        ptr = 4242

    def __init__(self):
        self.calls = []
        self.errors = []              # comm_get_async_error's answers, in turn (then 0)
        self.init_gate = self.call_gate = self.finalize_gate = None
        self.aborted = threading.Event()
        self.lock = threading.Lock()

    def _log(self, name, *args):
        with self.lock:
            self.calls.append((name,) + args)

    def names(self):
        with self.lock:
            return [c[0] for c in self.calls]

    def _wait(self, gate, what):
        if gate is None:
            return
        while not gate.wait(0.01):
            if self.aborted.is_set():
                raise self.NCCLError(f"{what}: aborted")

    def comm_init_rank_scalable(self, size, rank, n_ids, ids, cfg):
        self._log("init", size, rank, n_ids, bytes(ids), cfg)
        self._wait(self.init_gate, "init")
        return "comm"

    def comm_get_async_error(self, comm):
        self._log("poll")
        return self.errors.pop(0) if self.errors else 0

    def get_error_string(self, code):
        return f"error {code}"

    def _collective(self, name, *args):
        self._log(name, *args)
        self._wait(self.call_gate, name)

    def all_reduce(self, *args):
        self._collective("all_reduce", *args)

    def broadcast(self, *args):
        self._collective("broadcast", *args)

    def all_gather(self, *args):
        self._collective("all_gather", *args)

    def reduce_scatter(self, *args):
        self._collective("reduce_scatter", *args)

    def group_start(self):
        self._log("group_start")

    def group_end(self):
        self._log("group_end")

    def comm_abort(self, comm):
        self._log("abort", comm)
        self.aborted.set()

    def comm_finalize(self, comm):
        self._log("finalize")
        self._wait(self.finalize_gate, "finalize")

    def comm_destroy(self, comm):
        self._log("destroy")
