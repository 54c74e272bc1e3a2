"""A statistical profiler of the main thread's Python stack, for host-time questions that
cProfile answers wrongly.

cProfile adds a fixed cost to every Python call and none to C calls, so in a training step
(~30% of the host time inside cuDNN's ctypes calls, the rest in many small Python frames) its
shares are off by a factor of two either way. Here SIGALRM fires every ``interval`` seconds of
wall time; Python runs the handler in the main thread between two bytecodes, and the handler
records the interrupted stack. A C call is charged to the Python frame that made it (the
handler runs when it returns). A sampling *thread* would not do: it gets the GIL only when the
main thread releases it, i.e. inside the ctypes calls, and would see little else.

    with Sampler() as s:
        for _ in range(100):
            step()
    s.report(top=40, within=("train_bench.py", "step"))

Main thread only, Unix only (SIGALRM); the handler costs a few microseconds a sample.
"""

import collections
import os
import signal
import sys


class Sampler:
    def __init__(self, interval=5e-4):
        self.interval = interval
        self.stacks = collections.Counter()      # stack (innermost first) -> samples

    def _handler(self, sig, frame):
        stack = []
        while frame is not None:
            code = frame.f_code
            stack.append(f"{os.path.basename(code.co_filename)}:{code.co_firstlineno}:"
                         f"{code.co_name}")
            frame = frame.f_back
        self.stacks[tuple(stack)] += 1

    def __enter__(self):
        self._old = signal.signal(signal.SIGALRM, self._handler)
        signal.setitimer(signal.ITIMER_REAL, self.interval, self.interval)
        return self

    def __exit__(self, *exc):
        signal.setitimer(signal.ITIMER_REAL, 0, 0)
        signal.signal(signal.SIGALRM, self._old)
        return False

    def shares(self, within=None):
        """(samples, {function: inclusive share}, {function: self share}); ``within``: (file
        name, function name), only the samples taken inside that function."""
        incl, own, n = collections.Counter(), collections.Counter(), 0
        for stack, c in self.stacks.items():
            if within is not None and not any(
                    f.startswith(within[0] + ":") and f.endswith(":" + within[1])
                    for f in stack):
                continue
            n += c
            own[stack[0]] += c
            for f in set(stack):
                incl[f] += c
        return n, {f: c / n for f, c in incl.items()}, {f: c / n for f, c in own.items()}

    def report(self, top=40, within=None, out=sys.stdout):
        n, incl, own = self.shares(within)
        print(f"{n} samples every {self.interval * 1e3:g} ms", file=out)
        for title, table in (("inclusive", incl), ("self", own)):
            print(f"-- {title} %", file=out)
            for f, share in sorted(table.items(), key=lambda kv: -kv[1])[:top]:
                print(f"{100 * share:6.1f}  {f}", file=out)
