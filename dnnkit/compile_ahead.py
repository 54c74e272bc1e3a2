"""Compiling ahead: when a process compiles a kernel (the machine's cache is cold), the kernels
a training step usually needs besides it are compiled side by side in the background, and a
later launch of one of them waits for its cubin instead of compiling it in turn.

Numba compiles each (kernel, argument types) at its first launch, one after another: a cold
first training step on the Numba path pays the sum (ResNet-18 on an H100 host: 30 signatures,
~44 s, the tensor-core GEMM variants 3-4 s each). Its signatures are mostly predictable, since
dnnkit's kernels take flat arrays and geometry tuples whatever the shapes: per data type,
``COMMON`` (the element-wise, batch-norm, pooling, loss, optimizer and im2col kernels a
convolutional network's step launches; tests/test_compile_ahead.py checks them against the
recorded steps) with the argument types of their ``SIGNATURES``, and the GEMM variants of the
family (tensor-core tiles for float32, HMMA for float16, ...) of the first GEMM compiled.

How: the first compile of a data type (and of a GEMM family) starts a job: a compile server and
its forked workers (dnnkit/warmup_pool.py) on this process's current device compile the
signatures that have no stored cubin yet, a GEMM variant beside each cheap kernel (the order a
step needs them in, roughly), on a thread of this process that only waits for them. Each worker
stores the cubin (dnnkit/cubins.py) and then drops a mark file. ``dnnkit.launch`` asks ``wait``
before compiling a signature with no cubin: a signature of a running job waits until its cubin
or its mark appears (a mark without a cubin: the worker failed or Numba had it cached, and
Numba's own path follows), polling the files every few milliseconds, at most ``WAIT_S``.
Workers: ``_workers``. From the first job on, this process's Numba cache saves take the lock
file the workers' take (``warmup_pool.lock_saves``). ``dnn.compile_ahead = False`` turns it
off. A process that ends first leaves the server to finish (the cache is filled all the same).
"""

import atexit
import hashlib
import os
import shutil
import tempfile
import threading
import time

from . import config, cubins, warmup_pool
from .cubins import compiled_here   # (a name here: the tests stand in for it)
from .device import driver, simulator
from .log import log

config.register_flag(
    "dnn.compile_ahead", True, config.parse_bool,
    "when a process compiles a Numba kernel, compile the kernels a training step usually "
    "needs in background processes, side by side (dnnkit/compile_ahead.py)")

# Kernels (by name in dnnkit.kernels.all_kernels()) a convolutional network's training step
# launches besides its GEMMs, with the argument types their SIGNATURES declare.
# (no activation kernels: a step's ReLUs run inside batch norm's kernels, nn/norm.py's fusion)
COMMON = (
    "arith_fwd_kernel",
    "batch_norm_stats_fwd_kernel", "batch_norm_finalize_fwd_kernel",
    "batch_norm_apply_fwd_kernel", "batch_norm_reduce_bwd_kernel",
    "batch_norm_finalize_bwd_kernel", "batch_norm_apply_bwd_kernel",
    "conv_im2col_fwd_kernel", "conv_partsum_fwd_kernel", "conv_col2im_bwd_kernel",
    "conv_direct_bwd_data_kernel", "conv_bias_bwd_kernel",
    "pool_max_1x2x2_s1x2x2_fwd_kernel", "pool_max_1x2x2_s1x2x2_argmax_kernel",
    "pool_max_1x2x2_s1x2x2_bwd_kernel",
    "softmax_reg4_fwd_kernel", "nll_fwd_kernel", "loss_sum_fwd_kernel", "loss_finish_kernel",
    "nll_bwd_scaled_kernel", "sgd_fwd_kernel",
)
MAX_WORKERS = 16       # a ResNet-18 step: ~37 signatures, the GEMMs 3-7 s each
MIN_WORKERS = 4
WAIT_S = 300           # a job that long on one signature is given up (the launch compiles)
CONTEXT_BYTES = 1 << 30     # device memory set aside per worker (its context)
POLL_S = 0.005
MARKS = "DNNKIT_COMPILE_AHEAD_MARKS"     # the workers' mark folder (their environment)

_lock = threading.Lock()
_started = set()       # (data type, "common" or a GEMM family) begun in this process
_pending = {}          # (id(kernel), argtypes) -> (kernel, mark file, job)
jobs = []              # the jobs this process started (tests and validation read them)


class Job:
    """One background compile: ``done`` is set when the server has answered (``results``:
    its ``Result`` list, or None when it failed: ``error``)."""

    def __init__(self, todo, workers):
        self.done = threading.Event()
        self.results = self.error = None
        self.marks = tempfile.mkdtemp(prefix="dnnkit-compile-ahead-")
        # removed by the thread when the job ends; at exit if the process ends first
        atexit.register(shutil.rmtree, self.marks, ignore_errors=True)
        self.entries = [warmup_pool.Entry(k.py_func.__module__, name, at) for name, k, at in todo]
        self.workers = workers
        # the workers on this process's current device (and one compute capability), not on
        # whichever device comes first
        self.env = {MARKS: self.marks, "CUDA_VISIBLE_DEVICES": _device_uuid()}
        self.thread = threading.Thread(target=self._run, name="dnnkit-compile-ahead",
                                       daemon=True)

    def _run(self):
        try:
            with warmup_pool.Workers(self.workers, env=self.env) as pool:
                self.results = pool.compile(self.entries, fn=compile_marked, ordered=True)
            failed = [r for r in self.results if r.error]
            if failed:
                log.warning("compile ahead: %d of %d signatures failed in the workers (first: "
                            "%s: %s); they compile at their launch", len(failed),
                            len(self.results), failed[0].entry.name, failed[0].error)
        except Exception as e:   # noqa: BLE001 - the launches compile for themselves instead
            self.error = f"{type(e).__name__}: {e}"
            log.warning("compile ahead: %s (the kernels compile at their launch instead)",
                        self.error)
        finally:       # (a waiter that misses its mark now sees done once it is set)
            shutil.rmtree(self.marks, ignore_errors=True)
            self.done.set()


def _device_uuid():
    from numba import cuda
    return cuda.get_current_device().uuid         # "GPU-..." (CUDA_VISIBLE_DEVICES takes it)


def mark_path(folder, name, argtypes):
    key = hashlib.sha256(repr((name, tuple(str(t) for t in argtypes))).encode()).hexdigest()
    return os.path.join(folder, key[:32])


def compile_marked(entry):
    """A worker's compile (``warmup_pool.compile_entry``: Numba's cache and the cubin), then
    the entry's mark, also when it failed."""
    try:
        return warmup_pool.compile_entry(entry)
    finally:
        with open(mark_path(os.environ[MARKS], entry.name, entry.argtypes), "wb"):
            pass


def _data_type(argtypes):
    """The first floating data type among the arrays (a tuple of arrays' too: the optimizer's
    parameters come first, before float32 master weights)."""
    for t in argtypes:
        dt = getattr(t, "dtype", None)
        dt = str(getattr(dt, "dtype", dt))          # UniTuple(array(...)).dtype: the array
        if dt in ("float16", "float32", "float64"):
            return dt
    return None


def _gemm_family(kernel):
    """(family, sibling variant names) of a GEMM variant kernel, or None: the variants whose
    tile configuration has the same prefix (``tc_small`` -> ``tc``; ``small`` -> plain)."""
    from .kernels import gemm
    names = [n for n, k in gemm.VARIANTS.items() if k is kernel]
    if not names:
        return None
    family = _config_family(names[0])
    return family, [n for n in gemm.VARIANTS if _config_family(n) == family]


def _config_family(name):
    """The tile family of a GEMM variant's name; the fused relu's variants are a family of
    their own (``tc_relu``), compiled ahead only after one of them was."""
    cfg = name[len("gemm_00_"):-len("_kernel")]
    relu = cfg.endswith("_relu")
    for suffix in ("_relu", "_implicit", "_acc"):
        cfg = cfg[:-len(suffix)] if cfg.endswith(suffix) else cfg
    family, _, size = cfg.rpartition("_")
    family = family if size in ("large", "small", "tiny") else cfg      # "sim": its own
    return family + "_relu" if relu else family


def _workers(n):
    """Workers for a job of ``n`` signatures: at most MAX_WORKERS, the CPUs but one (shared
    among the host's training processes: LOCAL_WORLD_SIZE) less the running jobs' workers, one
    per CONTEXT_BYTES in a quarter of the free device memory; 0 (no job) under MIN_WORKERS,
    where waiting on queued signatures would cost more than compiling them in turn."""
    try:
        local = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        local = 1
    busy = sum(j.workers for j in jobs if not j.done.is_set())
    try:
        err, free, _ = driver().cuMemGetInfo()
        room = int(free) // 4 // CONTEXT_BYTES if int(err) == 0 else 0
    except Exception:          # noqa: BLE001 - no answer: no room assumed
        room = 0
    w = min(n, MAX_WORKERS, (warmup_pool.cpus() - 1) // local - busy, room)
    return w if w >= min(n, MIN_WORKERS) else 0


def in_process(kernel, argtypes):
    """Whether this process has ``kernel`` for ``argtypes`` already (nothing to compile)."""
    return argtypes in getattr(kernel, "overloads", {})


def after_compile(kernel, argtypes):
    """Told by dnnkit.launch after a launch of ``kernel`` for ``argtypes``: when Numba compiled
    it in this process (not loaded from its cache), start the data type's job(s) once."""
    try:
        if simulator() or not compiled_here(kernel, argtypes):
            return
        dt = _data_type(argtypes)
        if dt is None or not config.get("dnn.compile_ahead"):
            return
        fam = _gemm_family(kernel)
        keys = [(dt, "common")] + ([(dt, fam[0])] if fam else [])
        with _lock:
            keys = [k for k in keys if k not in _started]
            _started.update(keys)
        if not keys:
            return
        common = list(COMMON) if (dt, "common") in keys else []
        gemms = fam[1] if fam and (dt, fam[0]) in keys else []
        # the order a step needs them in, roughly: a GEMM variant (3-7 s) beside each cheap
        # kernel, so that the batch-norm and activation kernels right after the first
        # convolution are not queued behind all the GEMMs
        names = [n for pair in zip(gemms, common) for n in pair]
        names += gemms[len(common):] + common[len(gemms):]
        _start(dt, names, (kernel, tuple(argtypes)))
    except Exception as e:       # noqa: BLE001 - never the launch's failure (it has run)
        log.warning("compile ahead: not started (%s: %s)", type(e).__name__, e)


def _start(dt, names, compiled):
    from .kernels import all_kernels
    from .kernels.signatures import signatures
    sigs, kernels = signatures(dt), all_kernels()     # the GEMM variants among them
    todo, seen = [], {(id(compiled[0]), compiled[1])}
    for name in names:
        k, at = kernels.get(name), sigs.get(name)
        # (a GEMM's "_acc" name is the same kernel, with the same types where acc is dt)
        if k is None or at is None or (id(k), at) in seen or in_process(k, at):
            continue
        seen.add((id(k), at))
        p = cubins.path(k, at)
        if p is None or os.path.exists(p):
            continue
        todo.append((name, k, at))
    with _lock:
        workers = _workers(len(todo))
        if workers < 1:
            return
        warmup_pool.lock_saves()         # this process's saves and the workers' take turns
        job = Job(todo, workers)
        job.thread.start()              # (a thread that cannot start leaves nothing pending)
        for name, k, at in todo:
            _pending.setdefault((id(k), at), (k, mark_path(job.marks, name, at), job))
        jobs.append(job)
    log.debug("compile ahead: %d %s signatures on %d workers", len(todo), dt, workers)


def wait(kernel, argtypes):
    """``cubins.find``'s answer for a signature a running job compiles, once its worker is
    done with it (None: not one of a job's, or no cubin came of it)."""
    key = (id(kernel), tuple(argtypes))
    p = _pending.get(key)
    if p is None:
        return None
    _, mark, job = p
    give_up = time.monotonic() + WAIT_S
    while True:
        end = (job.done.is_set() or os.path.exists(mark) or not job.thread.is_alive()
               or time.monotonic() > give_up)   # read before the cubin: it is written first,
        found = cubins.find(kernel, argtypes)   # so an end finds it
        if found is not None or end:
            with _lock:
                _pending.pop(key, None)
            return found
        time.sleep(POLL_S)
