"""``with dnnkit.trace() as t:``: the op calls made inside the block on this thread, each with
its backend, the algorithm the implementation chose (``note_algo``), shapes, dtype and the
reason for the backend."""

import contextlib
import dataclasses
import threading

import numpy as np

# per thread: .traces (the open traces, innermost last), .algo (the current call's algorithm)
trace_state = threading.local()


@dataclasses.dataclass(frozen=True)
class TraceEntry:
    op: str
    backend: str
    algo: object
    shapes: tuple
    dtype: str
    reason: str = ""


class Trace(list):
    """The op calls made inside ``with dnnkit.trace() as t:`` (on this thread)."""

    def backends(self, op=None):
        return [e.backend for e in self if op is None or e.op == op]

    def ops(self):
        return [e.op for e in self]


@contextlib.contextmanager
def trace():
    t = Trace()
    stack = trace_state.__dict__.setdefault("traces", [])
    stack.append(t)
    try:
        yield t
    finally:
        _remove_identical(stack, t)


def open_traces():
    """This thread's open traces, outermost first (for :func:`joined` on another thread)."""
    return tuple(trace_state.__dict__.get("traces") or ())


@contextlib.contextmanager
def joined(traces):
    """Inside the block, this thread's op calls are recorded into ``traces`` as well: the open
    traces of a thread that this one works for (PyTorch's autograd thread running a backward
    for the thread that called ``loss.backward()``; dnnkit/torch/bridge.py)."""
    if not traces:
        yield
        return
    stack = trace_state.__dict__.setdefault("traces", [])
    stack.extend(traces)
    try:
        yield
    finally:
        for t in traces:
            _remove_identical(stack, t)


def _remove_identical(stack, item):
    """Remove ``item`` itself (not an equal one: two traces can hold the same entries)."""
    for i in range(len(stack) - 1, -1, -1):
        if stack[i] is item:
            del stack[i]
            return


def note_algo(algo):
    """Called by an implementation to record the algorithm it chose for the current call."""
    trace_state.algo = algo


def _describe_args(args):
    arrays = [a for a in args if hasattr(a, "shape") and hasattr(a, "dtype")]
    shapes = tuple(tuple(a.shape) for a in arrays)
    dtype = str(np.dtype(arrays[0].dtype)) if arrays else ""
    return shapes, dtype


def record(op, backend, algo, args, reason):
    """Add the call to every open trace of this thread."""
    stack = getattr(trace_state, "traces", None)
    if stack:
        shapes, dtype = _describe_args(args)
        entry = TraceEntry(op, backend, algo, shapes, dtype, reason)
        for t in stack:
            t.append(entry)
