"""The warm-up's compile workers: kernel signatures compiled side by side into Numba's disk
cache (and dnnkit's stored cubins), by processes that start in a fraction of a second.

A spawned worker pays its own start before its first signature: importing Numba and the
kernels, Numba's target refresh (its lowering modules, SciPy), loading NVVM and libdevice,
then the CUDA context: about 4 s on a lent H100 host, while a tensor-core GEMM variant takes
3-5 s to compile (validation/notes/cold-start.md). With one worker per CPU all starting at
once, the warm-up's critical path was a worker's start plus a GEMM.

So the workers are forked, once, from a *compile server*: a new interpreter (``python -m
dnnkit.warmup_pool``; never a process that made a CUDA context: a forked copy of a context is
unusable; and not multiprocessing's spawn, which imports the caller's ``__main__`` again) that
imports Numba and ``dnnkit.kernels`` and compiles a trivial kernel to PTX, which runs the
target refresh and loads NVVM, without touching the CUDA driver. Each forked
worker inherits all of it and only makes its own context (~0.3 s) before compiling. The
server is started ahead of its work (``Workers``), so that its start overlaps the caller's
own (the command's record-only step). numba is imported inside functions.
"""

import collections
import concurrent.futures
import fcntl
import importlib
import multiprocessing
import os
import pickle
import subprocess
import sys
import tempfile
import time
import warnings

from . import cubins
from .errors import DnnkitError

Entry = collections.namedtuple("Entry", "module name argtypes make", defaults=(None,))
Entry.__doc__ = """One kernel signature: the kernel's module, its name (in
``dnnkit.kernels.all_kernels()``, else its factory call), the tuple of Numba argument types of
its launch, and ``make``: None, or (factory, args, kwargs items, index or None) of a kernel
built on demand."""
Result = collections.namedtuple("Result", "entry seconds cached error")
Result.__doc__ = """One entry's compile: seconds in its worker, whether Numba found it in the
disk cache already, and the error (``"Type: message"``) or None."""

LOCK_FILE = ".dnnkit-save.lock"
_saves_locked = False       # lock_saves ran in this process


def cpus():
    """The CPUs this process may use: its affinity, within a cgroup v2 CPU quota (a container
    on a large host sees the host's count in ``os.cpu_count()``)."""
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        os.cpu_count() or 1
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()[:2]
        if quota != "max":
            n = min(n, max(1, int(quota) // int(period)))
    except (OSError, ValueError):
        pass
    return n


def positive(what, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"warmup: {what} must be an integer >= 1; got {value!r}")


# ---------------------------------------------------------------- one entry, in a worker

def resolve(entry):
    """The kernel object an entry names."""
    m = importlib.import_module(entry.module)
    if entry.make is not None:
        factory, args, kwargs, index = entry.make
        k = getattr(m, factory)(*args, **dict(kwargs))
        k = k if index is None else k[index]
    else:
        k = getattr(m, entry.name, None) or getattr(m, "VARIANTS", {}).get(entry.name)
    if k is None or not hasattr(k, "py_func"):
        raise LookupError(f"warmup: no kernel {entry.name} in {entry.module}")
    return k


def compile_entry(entry):
    """Compile one entry into Numba's disk cache (or find it there); True when it was there.
    Needs a GPU: Numba compiles for the current device and loads the result (``bind``)."""
    kernel = resolve(entry)
    cache = getattr(kernel, "_cache", None)        # numba-cuda 0.30: CUDACache or NullCache
    if cache is None or type(cache).__name__ != "CUDACache":
        raise RuntimeError(f"{entry.name} has no disk cache ({type(cache).__name__}): "
                           "not declared cache=True, or not a CUDA dispatcher")
    lock_saves()
    cubins.store(kernel, entry.argtypes, kernel.compile(entry.argtypes))
    return kernel.stats.cache_hits[entry.argtypes] > 0


def ptx_entry(entry, cc=(9, 0)):
    """Compile one entry to PTX for ``cc`` (no GPU, no cache written): a manifest's signatures
    checked ahead of time. Returns False (never cached)."""
    from .kernels.signatures import ptx as compile_ptx
    ptx, _ = compile_ptx(resolve(entry), entry.argtypes, cc=cc)
    if f".target sm_{cc[0]}{cc[1]}" not in ptx:
        raise RuntimeError(f"{entry.name}: the PTX is not for sm_{cc[0]}{cc[1]}")
    return False


def _run(fn, entry):
    t0 = time.perf_counter()
    try:
        cached, error = bool(fn(entry)), None
    except Exception as e:           # one entry's failure is reported; the others go on
        cached, error = False, f"{type(e).__name__}: {e}"
    return Result(entry, time.perf_counter() - t0, cached, error)


def _heavy(entry):
    return entry.name.startswith("gemm_")


# ---------------------------------------------------------------- the server and its workers

def _trivial(a):
    a[0] = 1.0


def prewarm():
    """In the server, before it forks: what every worker's first compile would pay. Imports
    Numba and the kernels and compiles a trivial kernel to PTX for sm_90 (the target refresh,
    NVVM, libdevice), which needs no driver. Returns (seconds, error or None): a failure here
    is left for the workers' own compiles to report."""
    t0 = time.perf_counter()
    try:
        from numba import config, cuda
        from . import kernels
        kernels.all_kernels()
        if not config.ENABLE_CUDASIM:
            cuda.compile_ptx(_trivial, "void(float32[::1])", cc=(9, 0))
        error = None
    except Exception as e:          # noqa: BLE001 - reported by the workers' compiles
        error = f"{type(e).__name__}: {e}"
    return time.perf_counter() - t0, error


def lock_saves():
    """Numba's cache saves in this process take an exclusive lock (``fcntl``) on a file of
    their cache folder. Numba's save reads a kernel's index, picks the next data file number
    and writes both without a lock: two writers of one index (compile workers; a process
    compiling while its compile-ahead workers do; two processes) could give two entries one
    data file, and the index would then map a signature to another's code. Every writer dnnkit
    starts takes it (the workers, a process that starts a compile ahead). Idempotent; nothing
    on the simulator."""
    global _saves_locked
    if _saves_locked:
        return
    try:
        from numba.cuda.dispatcher import CUDACache
    except ImportError:             # the simulator: no disk cache
        return
    plain = CUDACache.save_overload

    def save_overload(self, sig, data):
        folder = self.cache_path
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, LOCK_FILE), "ab") as f:
            fcntl.flock(f, fcntl.LOCK_EX)       # released when the file closes
            plain(self, sig, data)
    CUDACache.save_overload = save_overload
    _saves_locked = True


def _driver_started():
    """Whether anything initialised the CUDA driver in this process (nothing in ``prewarm``
    does; a module that read the device at import would): its forked children could not use
    CUDA, so the workers are spawned instead (each pays its own start). cuDeviceGetCount
    answers NOT_INITIALIZED until someone called cuInit, and initialises nothing itself."""
    try:
        from cuda.bindings import driver
        err, _ = driver.cuDeviceGetCount()
    except Exception:               # noqa: BLE001 - no bindings or no libcuda: nothing started
        return False
    return err != driver.CUresult.CUDA_ERROR_NOT_INITIALIZED


def serve(entries, workers, fn, ordered=False):
    """In the server: ``fn`` over ``entries`` in ``workers`` forked processes (their cache
    saves locked: ``lock_saves``), the GEMM variants handed out first (each takes 3-5 s on an
    H100 host, the other kernels under 1 s: one queued behind small kernels on a busy worker
    would end the warm-up seconds later), or in the entries' order when ``ordered``; a
    ``Result`` per entry, in order."""
    ctx = multiprocessing.get_context("fork" if not _driver_started() else "spawn")
    with warnings.catch_warnings():
        # Python 3.12 warns at each fork of a process with threads: here OpenBLAS's idle
        # pool (numpy's), which its own fork handlers make safe in the children
        warnings.filterwarnings("ignore", message=r".*use of fork\(\) may lead to deadlocks",
                                category=DeprecationWarning)
        with concurrent.futures.ProcessPoolExecutor(
                max_workers=min(workers, len(entries)), mp_context=ctx,
                initializer=lock_saves) as pool:
            order = range(len(entries)) if ordered else \
                sorted(range(len(entries)), key=lambda i: not _heavy(entries[i]))
            futures = {i: pool.submit(_run, fn, entries[i]) for i in order}
            return [futures[i].result() for i in range(len(entries))]


class Workers:
    """Compile workers, started ahead of their work: the server process (``python -m
    dnnkit.warmup_pool``, a plain new interpreter: nothing of the caller's ``__main__`` is
    imported, as multiprocessing's spawn would) starts and runs ``prewarm`` at construction;
    ``compile`` hands it the entries, and it forks the workers. One ``compile`` per server. A
    context manager; ``env``: environment changes for the server and so for its workers."""

    def __init__(self, workers=None, env=None):
        workers = cpus() if workers is None else workers
        positive("workers", workers)
        self.workers = workers
        self._prewarm = None
        full = dict(os.environ)
        for k, v in (env or {}).items():
            if v is None:
                full.pop(k, None)
            else:
                full[k] = v
        # the server's warnings (Numba's among them) go to a file, shown only when it fails
        self._log = tempfile.TemporaryFile()
        self._server = subprocess.Popen(
            [sys.executable, "-m", __name__], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self._log, env=full)

    def prewarmed(self):
        """(seconds, error or None) of the server's ``prewarm``, once ``compile`` returned."""
        return self._prewarm

    def compile(self, entries, fn=compile_entry, ordered=False):
        """``fn(entry)`` (``compile_entry``: into Numba's disk cache) for every entry (repeats
        dropped), a ``Result`` per entry, in order. ``fn`` must be importable by name.
        ``ordered``: handed out in the entries' order (else the GEMM variants first)."""
        entries = list(dict.fromkeys(Entry(*e) for e in entries))
        if self._server.stdin.closed:
            raise DnnkitError("warmup: this compile server has served its one request")
        try:
            # the caller's import path first: ``fn`` may live in the caller's modules
            out, _ = self._server.communicate(pickle.dumps(list(sys.path)) + pickle.dumps(
                (entries, self.workers, fn, ordered)))
            answer = pickle.loads(out)
        except (OSError, EOFError, pickle.UnpicklingError, ValueError):
            answer = None
        if not isinstance(answer, tuple) or len(answer) != 2:
            self._log.seek(0)
            tail = self._log.read()[-2000:].decode("utf-8", "replace").strip()
            raise DnnkitError(f"warmup: the compile server ended with code "
                              f"{self._server.returncode}: {tail or 'no message'}")
        self._prewarm, results = answer
        if isinstance(results, BaseException):
            raise DnnkitError(f"warmup: a compile worker died ({results}); rerun with fewer "
                              "--workers or look for an out-of-memory kill")
        return results

    def close(self):
        """End the server (it has ended if ``compile`` returned) and its log file."""
        if self._server.poll() is None:      # not asked, or interrupted: its workers then
            self._server.kill()               # end after their current entry
            self._server.wait()
        self._log.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def main():
    """The server (``python -m dnnkit.warmup_pool``): ``prewarm``, then one request from
    stdin (the caller's ``sys.path``, then (entries, workers, fn)), served by forked workers;
    writes ((prewarm seconds, error), results or the exception that broke the pool)."""
    start = prewarm()
    sys.path[:0] = [p for p in pickle.load(sys.stdin.buffer) if p not in sys.path]
    entries, workers, fn, ordered = pickle.load(sys.stdin.buffer)
    try:
        results = serve(entries, workers, fn, ordered) if entries else []
    except concurrent.futures.process.BrokenProcessPool as e:
        results = e
    try:
        sys.stdout.buffer.write(pickle.dumps((start, results)))
        sys.stdout.buffer.flush()
    except OSError:          # the caller is gone (a compile ahead outliving its process)
        pass


def compile(entries, workers=None, fn=compile_entry, env=None):
    """``Workers(workers, env).compile(entries, fn)``, the server closed after. Default: one
    worker per usable CPU (``cpus``), at most one per entry; nothing is started for no
    entries."""
    positive("workers", cpus() if workers is None else workers)
    entries = list(entries)
    if not entries:
        return []
    with Workers(workers, env) as w:
        return w.compile(entries, fn)


if __name__ == "__main__":
    # run as a module: import it under its name, so that what the workers and the answer
    # pickle (Result, the functions) refers to dnnkit.warmup_pool, not __main__
    importlib.import_module("dnnkit.warmup_pool").main()
