"""Kernel warm-up: compile the Numba kernels of a training step in parallel, into Numba's
on-disk cache, so that a process's first step loads them instead of compiling them one by one
(Numba compiles each new (kernel, argument types) at its first launch, serially, under its
compiler lock: only other processes bound the wait by the slowest kernel instead of the sum).
docs/performance.md (cold start) gives the design and what numba-cuda's cache requires.

1. Record a step's signatures, (kernel, Numba argument types) as the launch types them
   (``typeof_pyval``: dtype, ndim, layout, readonly and aligned flags). ``recording(launch=
   False)`` replaces Numba's launch by a recorder: nothing compiles or runs, the host code
   (allocations, launch shapes, kernel choice) runs as usual; exact because no forward,
   backward or optimizer step reads device data on the host. ``recording(launch=True)``: a
   real step; dnnkit.launch lists each launch (``first_launches``). Either way every launch
   goes through Numba's while it lasts (``launch.through_numba``): a signature the process
   launched before is recorded too.
2. A manifest: ``Entry(module, name, argtypes, make)``: the kernel by its name in
   ``dnnkit.kernels.all_kernels()``, or by the memoised factory call that built it on demand
   (``make``; e.g. ResNet's global pooling window), which the recording notes by wrapping the
   kernel modules' factories while it lasts (the ops look them up at each call). Pickled
   (Numba types pickle, as in Numba's own cache index): load only your own manifests.
3. ``compile(entries, workers)`` (dnnkit/warmup_pool.py): worker processes, forked from one
   compile server (a new interpreter) that imported Numba and the kernels first, call
   ``kernel.compile(argtypes)``,
   which loads from or writes to the disk cache under the key a later launch looks up (the
   same argument tuple). Numba rewrites a function's index file without a lock and
   factory-built variants share one index, so every save takes a lock file (``lock_saves``).

A fresh process with an empty cache still compiles serially: the warm-up runs once per
machine or install (``python -m dnnkit warmup``), or ``compile(load(manifest))`` at a
program's start. numba is imported inside functions (``import dnnkit`` does not load it).
"""

import collections
import contextlib
import json
import os
import pickle
import subprocess
import sys
import time

import numpy as np

from . import launch as launch_mod
from . import cubins, files, models, nn, optim
from .demo import step      # one training step (returns the loss, not synchronised)
from .device import simulator
from .errors import DnnkitError
from .tensors import tensor
from .warmup_pool import (Entry, Result, Workers, compile, compile_entry,  # noqa: F401
                          cpus, positive, ptx_entry, resolve)

MODELS = ("vgg", "resnet18")
DTYPES = ("float16", "float32", "float64")
BACKENDS = ("auto", "cudnn", "numba")
FORMAT = "dnnkit.warmup/1"

Recorded = collections.namedtuple("Recorded", "entries unnamed")
Recorded.__doc__ = """The entries of a recording, and the launched kernels that have no name in
``dnnkit.kernels.all_kernels()`` (which a worker could not import; their repr)."""


# ---------------------------------------------------------------- recording

_made = {}       # id(kernel) -> (module, name, make) of kernels the factories built while recorded


def _kernel_names():
    """{id(kernel): (module, name, make)}; a kernel under several names (aliases among the GEMM
    variants) keeps the first in sorted order; factory-built ones seen by ``_factories``."""
    from . import kernels
    out = dict(_made)
    for name, k in sorted(kernels.all_kernels().items(), reverse=True):
        out[id(k)] = (k.py_func.__module__, name, None)
    return out


def _named_factory(module, attr, factory):
    def make(*args, **kwargs):
        out = factory(*args, **kwargs)
        items = out if isinstance(out, tuple) else (out,)
        for i, k in enumerate(items):
            if hasattr(k, "py_func") and id(k) not in _made:
                index = i if isinstance(out, tuple) else None
                call = ", ".join([repr(a) for a in args] +
                                 [f"{n}={v!r}" for n, v in sorted(kwargs.items())])
                _made[id(k)] = (module, f"{attr}({call})" + ("" if index is None else
                                                            f"[{index}]"),
                                (attr, args, tuple(sorted(kwargs.items())), index))
        return out
    make.__wrapped__ = factory
    return make


@contextlib.contextmanager
def _factories():
    """While it lasts, the kernel modules' memoised kernel factories (``functools.lru_cache``)
    note the call that built each kernel they return (``_made``)."""
    from . import kernels
    patched = []
    for m in kernels.FAMILY_MODULES:
        for attr, f in list(vars(m).items()):
            if hasattr(f, "cache_info") and getattr(f, "__module__", None) == m.__name__:
                setattr(m, attr, _named_factory(m.__name__, attr, f))
                patched.append((m, attr, f))
    try:
        yield
    finally:
        for m, attr, f in patched:
            setattr(m, attr, f)


def entries_of(launches):
    """``Recorded`` of (kernel, argtypes) pairs: named, without repeats, in first-launch order."""
    names = _kernel_names()
    entries, unnamed = {}, {}
    for kernel, argtypes in launches:
        where = names.get(id(kernel))
        if where is None:
            unnamed[repr(kernel)] = None
        else:
            entries[Entry(where[0], where[1], tuple(argtypes), where[2])] = None
    return Recorded(list(entries), list(unnamed))


@contextlib.contextmanager
def recording(launch=True, through_numba=True):
    """Collect (kernel, Numba argument types) of the launches inside the block into the list it
    yields. ``launch=True``: the kernels run; each launch is recorded by dnnkit.launch (on a GPU;
    the simulator launches without typing); ``through_numba=False`` there: only the signatures the
    process had not launched before, each as it launches outside the recording (a stored cubin,
    dnnkit.cubins, or Numba's dispatcher), as a timed first step needs. ``launch=False``: Numba's
    launch is replaced by a recorder (GPU and simulator): no kernel is compiled or run, outputs keep
    whatever the allocator gave them. Every launch goes through Numba's own while it lasts (no fast
    or packed launch of dnnkit.launch is taken), so launches of signatures the process made before
    are seen as well."""
    seen = []
    if launch:
        if launch_mod.first_launches is not None:
            raise RuntimeError("warmup.recording: already recording")
        launch_mod.first_launches = seen
        launch_mod.through_numba = through_numba
        try:
            with _factories():
                yield seen
        finally:
            launch_mod.first_launches = None
            launch_mod.through_numba = False
        return
    from numba.core.typing.typeof import Purpose, typeof
    if simulator():
        from numba.cuda.simulator.kernel import FakeCUDAKernel as cls
        name = "__call__"

        def stand_in(self, *args):           # the simulator's configured kernel is the kernel
            seen.append((self, tuple(typeof(a, Purpose.argument) for a in args)))
    else:
        from numba.cuda.dispatcher import CUDADispatcher as cls
        name = "call"

        def stand_in(self, args, launch_config):   # _LaunchConfiguration.__call__ calls this
            seen.append((self, tuple(self.typeof_pyval(a) for a in args)))
    original = cls.__dict__.get(name)
    if original is None:
        raise RuntimeError(f"warmup.recording: {cls.__name__}.{name} not found; this numba-cuda "
                           "launches differently (written for 0.30)")
    setattr(cls, name, stand_in)
    before, launch_mod.through_numba = launch_mod.through_numba, True
    try:
        with _factories():
            yield seen
    finally:
        setattr(cls, name, original)
        launch_mod.through_numba = before


def _check(what, value, allowed):
    if value not in allowed:
        raise ValueError(f"warmup: {what} must be one of {', '.join(allowed)}; got {value!r}")


def setup(model="vgg", dtype="float32", batch=32, backend="numba", *, width=64,
          image_size=32, seed=0):
    """(model, loss, optimizer, x, y) of one training step: dnnkit.models' ``vgg_cnn`` or
    ``resnet18`` (10 classes) pinned to ``backend``, SGD with momentum, random data of
    (batch, 3, image_size, image_size) on the device."""
    _check("model", model, MODELS)
    _check("dtype", dtype, DTYPES)
    _check("backend", backend, BACKENDS)
    positive("batch", batch)
    if model == "vgg":
        net = models.vgg_cnn(10, width=width, image_size=image_size, dtype=dtype, seed=seed)
    else:
        net = models.resnet18(10, width=width, dtype=dtype, seed=seed)
    loss_fn = nn.CrossEntropyLoss()
    nn.convert(net, backend)
    nn.convert(loss_fn, backend)
    opt = optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    rng = np.random.default_rng(seed)
    x = tensor(rng.standard_normal((batch, 3, image_size, image_size)).astype(dtype))
    y = tensor(rng.integers(0, 10, batch).astype(np.int64))
    return net, loss_fn, opt, x, y


def record_step(model="vgg", dtype="float32", batch=32, backend="numba", *, launch=False,
                width=64, image_size=32):
    """``Recorded`` of one training step (``setup``; ``recording(launch)``), in this process."""
    parts = setup(model, dtype, batch, backend, width=width, image_size=image_size)
    with recording(launch=launch) as seen:
        loss = step(*parts)
        if launch:
            loss.item()
    return entries_of(seen)


# ---------------------------------------------------------------- manifests

def save(path, entries, info=None):
    """Write a manifest (atomically): the entries and ``info`` (a dict, e.g. the model)."""
    import numba_cuda
    data = {"format": FORMAT, "numba_cuda": numba_cuda.__version__, "info": dict(info or {}),
            "entries": [tuple(Entry(*e)) for e in entries]}
    files.write_bytes(os.fspath(path), pickle.dumps(data, protocol=4))


def load(path):
    """The entries of a manifest written by ``save``; ValueError naming the file otherwise."""
    with open(path, "rb") as f:
        try:
            data = pickle.load(f)
        except Exception as e:
            raise ValueError(f"warmup: {path} is not a warm-up manifest ({type(e).__name__}: "
                             f"{e})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"warmup: {path} is not a warm-up manifest of format {FORMAT}")
    return [Entry(m, n, tuple(a), mk) for m, n, a, mk in data["entries"]]


def describe(entry, width=100):
    """``name(type, type, ...)``, shortened to ``width`` characters."""
    text = f"{entry.name}({', '.join(map(str, entry.argtypes))})"
    return text if len(text) <= width else text[:width - 3] + "..."


# ---------------------------------------------------------------- a fresh process's first step

_FIRST_STEP = """
import json, sys, time
t0 = time.time()
from dnnkit import warmup
print(json.dumps(warmup.first_step(**json.loads(sys.argv[1]), t0=t0)))
"""


def first_step(model, dtype, batch, backend, *, manifest=None, width=64, image_size=32,
               t0=None):
    """In a fresh process: set up and run one training step (launches recorded), synchronised.
    Returns {setup_s, step_s, end (time.time()), compiled, loaded, cubins}: the step's kernel
    signatures Numba compiled, took from its disk cache, and launched from stored cubins
    (dnnkit.cubins; None on the simulator). ``manifest``: a path to save the step's launches
    to; every launch then goes through Numba's dispatcher (``recording``), none from a cubin."""
    t0 = time.time() if t0 is None else t0
    parts = setup(model, dtype, batch, backend, width=width, image_size=image_size)
    t1, stored = time.time(), cubins.loaded
    with recording(launch=True, through_numba=bool(manifest)) as seen:
        step(*parts).item()
    t2 = time.time()
    if manifest:
        save(manifest, entries_of(seen).entries, {"model": model, "dtype": dtype,
                                                  "batch": batch, "backend": backend})
    stats = [k.stats for k in {id(k): k for k, _ in seen}.values() if hasattr(k, "stats")]
    return {"setup_s": t1 - t0, "step_s": t2 - t1, "end": t2,
            "compiled": sum(sum(s.cache_misses.values()) for s in stats) if stats else None,
            "loaded": sum(sum(s.cache_hits.values()) for s in stats) if stats else None,
            "cubins": None if simulator() else cubins.loaded - stored}


def fresh_first_step(model, dtype, batch, backend, *, env=None, timeout=600, **kw):
    """``first_step`` (``kw``: its keywords) in a new Python process (``env``: its environment);
    adds ``to_step_s``, from starting the process to the end of its synchronised first step."""
    start = time.time()
    r = subprocess.run([sys.executable, "-c", _FIRST_STEP,
                        json.dumps(dict(kw, model=model, dtype=dtype, batch=batch,
                                        backend=backend))],
                       capture_output=True, text=True, env=env, timeout=timeout)
    if r.returncode != 0:
        raise DnnkitError(f"warmup: the fresh process failed: {r.stderr.strip()[-2000:]}")
    out = json.loads(r.stdout.strip().splitlines()[-1])
    out["to_step_s"] = out["end"] - start
    return out


# ---------------------------------------------------------------- the command

def report(results, wall, workers, top=10):
    """The lines the command prints for ``compile``'s results."""
    done = [r for r in results if r.error is None]
    lines = [f"{len(results)} kernel signatures in {wall:.1f} s with {workers} workers: "
             f"{sum(not r.cached for r in done)} compiled, {sum(r.cached for r in done)} "
             f"already cached, {len(results) - len(done)} failed; the sum of per-signature "
             f"times {sum(r.seconds for r in results):.1f} s",
             f"slowest {min(top, len(results))}:"]
    for r in sorted(results, key=lambda r: -r.seconds)[:top]:
        lines.append(f"  {r.seconds:7.2f} s  {describe(r.entry)}")
    for r in results:
        if r.error is not None:
            lines.append(f"  FAILED {describe(r.entry)}: {r.error}")
    return lines


def _command_entries(args, info, t0):
    """The command's entries: from ``--manifest``, or recorded from one step (and saved to
    ``--record-manifest``)."""
    if args.manifest:
        try:
            entries = load(args.manifest)
        except (OSError, ValueError) as e:
            raise DnnkitError(f"warmup: --manifest {args.manifest}: {e}") from None
        print(f"{len(entries)} kernel signatures from {args.manifest}", flush=True)
    else:
        rec = record_step(args.model, args.dtype, args.batch, args.backend, launch=False)
        entries = rec.entries
        print(f"recorded {len(entries)} kernel signatures of one {args.model} {args.dtype} "
              f"training step (batch {args.batch}, backend {args.backend}) in "
              f"{time.perf_counter() - t0:.1f} s", flush=True)
        for u in rec.unnamed:
            print(f"  not in dnnkit.kernels, left to compile at its launch: {u}")
    if args.record_manifest:
        save(args.record_manifest, entries, info)
        print(f"manifest written to {args.record_manifest}")
    return entries


def command(args):
    """``python -m dnnkit warmup`` (dnnkit/__main__.py parses ``args``)."""
    if simulator():
        raise DnnkitError("warmup compiles kernels for a GPU, and there is none here (Numba's "
                          "simulator runs kernels as Python: nothing to compile)")
    info = {"model": args.model, "dtype": args.dtype, "batch": args.batch,
            "backend": args.backend}
    t0 = time.perf_counter()
    workers = args.workers or cpus()
    with Workers(workers) as pool:      # the compile server starts while the step is recorded
        entries = _command_entries(args, info, t0)
        t1 = time.perf_counter()
        results = pool.compile(entries)
        wall = time.perf_counter() - t1
        start, error = pool.prewarmed()
    print("\n".join(report(results, wall, min(workers, len(entries)))))
    print(f"the compile server's prewarm: {start:.1f} s" +
          (f" (its trial compile failed: {error})" if error else ""))
    print(f"warm-up total {time.perf_counter() - t0:.1f} s", flush=True)
    if args.check:
        r = fresh_first_step(args.model, args.dtype, args.batch, args.backend)
        print(f"a fresh process's first training step: {r['to_step_s']:.2f} s from its start "
              f"(step {r['step_s']:.2f} s; signatures: {r['compiled']} compiled, {r['loaded']} "
              f"loaded from Numba's cache, {r['cubins']} from stored cubins)")
    return 1 if any(r.error for r in results) else 0
