"""``with dnnkit.profile() as p: ...``: per-op call counts and GPU time per op and backend
(Theano's ``profile=True``). The dispatcher brackets every implementation call made on this
thread inside the block with two CUDA events on the call's stream; the times are read when
the block ends (one synchronisation), so profiling does not serialise the calls it measures.
``print(p)`` gives the table, sorted by total time.

What an event pair measures is the GPU's timeline between the call's start and its end: the
kernels, plus any time the GPU waited for the host inside the call. The first call of an op on
a backend is where Numba compiles its kernels and cuDNN builds its plan (seconds, not
microseconds), so it is kept apart: ``first ms`` is that call alone, and ``total ms`` and
``ms/call`` cover the calls after it (the steady state)."""

import contextlib
import dataclasses
import threading

from .device import numba_cuda

profile_state = threading.local()    # per thread: .stack (the open profiles, innermost last)


@dataclasses.dataclass
class Row:
    op: str
    backend: str
    calls: int = 0
    ms: float = 0.0          # every call after the first
    first_ms: float = 0.0    # the first call (compilation, plan building)


class Profile:
    def __init__(self):
        self._pending = []     # (op, backend, start event, end event)
        self.rows = {}         # (op, backend) -> Row

    def begin(self, args):
        stream = next((a for a in reversed(args) if hasattr(a, "auto_synchronize")), 0)
        start = numba_cuda().event()
        start.record(stream)
        return start, stream

    def end(self, token, op, backend):
        start, stream = token
        stop = numba_cuda().event()
        stop.record(stream)
        self._pending.append((op, backend, start, stop))

    def collect(self):
        """Read the times of the calls recorded so far (waits for their end events)."""
        for op, backend, start, stop in self._pending:
            stop.synchronize()
            row = self.rows.setdefault((op, backend), Row(op, backend))
            ms = max(0.0, start.elapsed_time(stop))   # the simulator answers -1
            if row.calls == 0:
                row.first_ms = ms
            else:
                row.ms += ms
            row.calls += 1
        self._pending.clear()

    def table(self):
        rows = sorted(self.rows.values(), key=lambda r: -r.ms)
        total = sum(r.ms for r in rows) or 1.0
        lines = [f"{'op':<28} {'backend':<8} {'calls':>7} {'total ms':>10} {'ms/call':>9} "
                 f"{'share':>6} {'first ms':>9}"]
        for r in rows:
            lines.append(f"{r.op:<28} {r.backend:<8} {r.calls:>7} {r.ms:>10.3f} "
                         f"{r.ms / max(1, r.calls - 1):>9.4f} {100 * r.ms / total:>5.1f}% "
                         f"{r.first_ms:>9.1f}")
        lines.append("(total, ms/call and share: every call after an op's first; first ms: the "
                     "first call, with kernel compilation and plan building)")
        return "\n".join(lines)

    def __str__(self):
        return self.table()


def active():
    """The innermost profile of this thread, or None."""
    stack = profile_state.__dict__.get("stack")     # not getattr: a missing attribute is slow
    return stack[-1] if stack else None


def open_profiles():
    """This thread's open profiles, outermost first (for :func:`joined` on another thread)."""
    return tuple(profile_state.__dict__.get("stack") or ())


@contextlib.contextmanager
def joined(profiles):
    """Inside the block, this thread's op calls are timed into ``profiles`` (the innermost
    one, as on their own thread): the open profiles of a thread this one works for (PyTorch's
    autograd thread; dnnkit/torch/bridge.py)."""
    if not profiles:
        yield
        return
    stack = profile_state.__dict__.setdefault("stack", [])
    stack.extend(profiles)
    try:
        yield
    finally:
        for p in profiles:
            for i in range(len(stack) - 1, -1, -1):
                if stack[i] is p:
                    del stack[i]
                    break


@contextlib.contextmanager
def profile():
    p = Profile()
    stack = profile_state.__dict__.setdefault("stack", [])
    stack.append(p)
    try:
        yield p
    finally:
        stack.remove(p)
        p.collect()
