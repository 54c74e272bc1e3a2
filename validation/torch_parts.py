"""Where a converted model's training step spends the host's time, part by part.

    python -m validation.torch_parts [--backend cudnn|numba] [--batch 32] [--steps 40] [--fuse]

torch_bench's ResNet-18 (CIFAR, PyTorch's loss and SGD), converted to dnnkit, is run for a few
warm-up steps and then ``--steps`` steps without a host wait, with perf_counter stamps summed
around the parts of dnnkit.torch:
- the step's phases: zero_grad, forward, loss, backward, optimizer;
- ``apply``: ``bridge.function``, the forward's whole autograd.Function call;
- each Function's forward and backward body (PyTorch calls the backward on its autograd
  thread: the stamps see it, where cProfile of the main thread and validation/sampler.py do not);
- inside the bodies: each public op of dnnkit, the views of tensors (``view``: parameters'
  kept views included; ``held``: batch-norm statistics), the output tensors (``tensor``,
  ``maybe``), ``keep`` / ``kept`` and ``stream_of``.
Derived rows: PyTorch's machinery around the forward bodies (apply less the bodies) and
around the backward bodies (the backward phase less the bodies: the autograd engine, its
thread, AccumulateGrad and PyTorch's own backward ops: the loss's, the residual adds').

The stamps cost ~0.1 us each (a few hundred a step: a few % of it); the step time with and
without them is printed. cProfile doubles the cost of small Python calls and adds nothing to C
calls, so its shares mislead here (validation/sampler.py's docstring); these are wall times.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import statistics
import sys
import time

PHASES = ("zero_grad", "forward", "loss", "backward", "optimizer")
HELPERS = ("view", "held", "tensor", "maybe", "keep", "kept", "stream_of")


class Parts:
    """Summed seconds and calls per part name."""

    def __init__(self):
        self.seconds = collections.Counter()
        self.calls = collections.Counter()

    def timed(self, name, fn):
        seconds, calls, clock = self.seconds, self.calls, time.perf_counter

        @functools.wraps(fn)
        def wrapper(*args, **kw):
            t = clock()
            try:
                return fn(*args, **kw)
            finally:
                seconds[name] += clock() - t
                calls[name] += 1
        return wrapper

    def clear(self):
        self.seconds.clear()
        self.calls.clear()


def _function_classes(torch, modules):
    for mod in modules:
        for value in vars(mod).values():
            if isinstance(value, type) and issubclass(value, torch.autograd.Function) and \
                    value.__module__ == mod.__name__:
                yield value


@contextlib.contextmanager
def instrumented(parts):
    """Inside the block, dnnkit.torch's parts are timed into ``parts``; everything patched is
    put back at the end."""
    import torch

    from dnnkit import ops
    from dnnkit.torch import bridge, functions, functions_norm, functions_rnn
    modules = (functions, functions_norm, functions_rnn)
    undo = []

    def patch(obj, name, value):
        undo.append((obj, name, obj.__dict__[name] if isinstance(obj, type) else
                     getattr(obj, name)))
        setattr(obj, name, value)

    try:
        for cls in _function_classes(torch, modules):
            for kind in ("forward", "backward"):
                fn = cls.__dict__[kind].__func__
                patch(cls, kind, staticmethod(parts.timed(f"{cls.__name__}.{kind}", fn)))
        for mod in modules:
            for name in HELPERS:
                if name in vars(mod):
                    patch(mod, name, parts.timed(name, getattr(mod, name)))
        for name, fn in list(vars(ops).items()):
            if callable(fn) and getattr(fn, "op_name", None):
                patch(ops, name, parts.timed(f"op {name}", fn))
        # functions.py's tables hold the op functions themselves
        for table in ("_CONV", "_TRANSPOSE", "_POOL"):
            old = getattr(functions, table)
            patch(functions, table, {k: (tuple(getattr(ops, f.__name__) for f in v)
                                         if isinstance(v, tuple) else getattr(ops, v.__name__))
                                     for k, v in old.items()})
        patch(bridge, "function", parts.timed("apply", bridge.function))
        yield parts
    finally:
        for obj, name, value in reversed(undo):
            setattr(obj, name, value)


def phased_step(torch, model, loss_fn, opt, parts):
    """A training step (torch_bench's) whose phases are timed into ``parts``."""
    clock = time.perf_counter
    seconds = parts.seconds

    def step(x, y):
        t0 = clock()
        opt.zero_grad(set_to_none=True)
        t1 = clock()
        out = model(x)
        t2 = clock()
        loss = loss_fn(out, y)
        t3 = clock()
        loss.backward()
        t4 = clock()
        opt.step()
        t5 = clock()
        for name, dt in zip(PHASES, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4)):
            seconds["step " + name] += dt
        seconds["step"] += t5 - t0
        parts.calls["step"] += 1
        return loss
    return step


def rows(parts):
    """[(part, ms a step, calls a step, us a call)], the measured parts by time, then the
    derived ones."""
    n = parts.calls["step"]
    if not n:
        raise ValueError("torch_parts: no step was timed")
    s, c = parts.seconds, parts.calls
    out = [(k, s[k] / n * 1e3, c[k] / n, s[k] / c[k] * 1e6 if c[k] else None)
           for k in sorted(s, key=lambda k: -s[k])]
    fwd = sum(v for k, v in s.items() if k.endswith(".forward"))
    bwd = sum(v for k, v in s.items() if k.endswith(".backward"))
    ops_ = sum(v for k, v in s.items() if k.startswith("op "))
    out += [("(derived) forward bodies", fwd / n * 1e3, None, None),
            ("(derived) backward bodies", bwd / n * 1e3, None, None),
            ("(derived) dnnkit op calls", ops_ / n * 1e3, None, None),
            ("(derived) PyTorch around the forward bodies (apply - bodies)",
             (s["apply"] - fwd) / n * 1e3, None, None),
            ("(derived) PyTorch around the backward bodies (backward phase - bodies)",
             (s["step backward"] - bwd) / n * 1e3, None, None)]
    return out


def table(title, parts):
    lines = [f"# {title}", "", "| part | ms/step | calls/step | us/call |", "|---|---:|---:|---:|"]
    for name, ms, calls, us in rows(parts):
        lines.append(f"| {name} | {ms:.3f} | {'' if calls is None else f'{calls:g}'} | "
                     f"{'' if us is None else f'{us:.2f}'} |")
    return "\n".join(lines)


def measure(torch, model, loss_fn, opt, x, y, steps, warm=5, sync=None):
    """(Parts of ``steps`` instrumented steps, median host ms a step without the stamps, with
    them): ``model`` converted already; ``sync`` waits for the device (None: nothing)."""
    parts = Parts()
    step = phased_step(torch, model, loss_fn, opt, parts)
    sync = sync or (lambda: None)

    def timed_run():
        for _ in range(warm):
            step(x, y)
        sync()
        parts.clear()
        t = time.perf_counter()
        for _ in range(steps):
            step(x, y)
        per = (time.perf_counter() - t) / steps * 1e3
        sync()
        return per
    plain = statistics.median(timed_run() for _ in range(3))
    with instrumented(parts):
        stamped = timed_run()
    return parts, plain, stamped


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="cudnn", choices=("auto", "cudnn", "numba"))
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--fuse", action="store_true",
                    help="the converted model through dnnkit.torch.fuse")
    args = ap.parse_args(argv)
    from validation.torch_bench import build, cuda_torch
    torch = cuda_torch("torch_parts")
    if torch is None:
        return 2
    import dnnkit.torch as dt
    model, x, y = build(torch, args.batch)
    dt.convert(model, args.backend)
    if args.fuse:
        model = dt.fuse(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    parts, plain, stamped = measure(torch, model, torch.nn.CrossEntropyLoss(), opt, x, y,
                                    args.steps, sync=torch.cuda.synchronize)
    gpu = torch.cuda.get_device_name()
    print(table(f"dnnkit.torch ResNet-18 b{args.batch} {args.backend}"
                f"{' fused' if args.fuse else ''}, {gpu}: host time by part", parts))
    print(f"\nhost ms a step: {plain:.3f} without the stamps, {stamped:.3f} with them")
    return 0


if __name__ == "__main__":
    sys.exit(main())
