"""dnnkit.compile_ahead on the CPU: the signatures it compiles ahead are the ones a recorded
training step launches, a GEMM variant's family, the job's bookkeeping (a launch waits for a
signature's cubin or its mark, not for the whole job), the marks written whatever happens, and
the flag. What only a GPU shows (a cold first step taking cubins compiled ahead, bitwise equal
to one that compiled everything itself) is tests/gpu/test_compile_ahead.py."""

import os
import threading
import time

import pytest

from dnnkit import compile_ahead, config, warmup, warmup_pool
from dnnkit.kernels import gemm
from dnnkit.kernels.signatures import signatures

SIMULATOR = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
TINY = dict(batch=2, width=8, image_size=8)    # wide enough for col2im


def _recorded(model, dtype):
    rec = warmup.record_step(model, dtype, TINY["batch"], "numba", launch=False,
                             width=TINY["width"], image_size=TINY["image_size"])
    return [e for e in rec.entries if e.make is None and not e.name.startswith("gemm_")]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_common_is_what_recorded_steps_launch_with_their_signatures(dtype):
    sigs = signatures(dtype)
    seen = {}
    for model in ("resnet18", "vgg"):
        for e in _recorded(model, dtype):
            seen.setdefault(e.name, set()).add(e.argtypes)
    if SIMULATOR:
        assert set(compile_ahead.COMMON) == set(seen)
    else:       # a GPU's sizes choose among the convolution's kernels: most are the same
        assert len(set(compile_ahead.COMMON) & set(seen)) >= 0.8 * len(seen), sorted(seen)
    # the argument types compiled ahead are the launches' (float16's optimizer also updates
    # float32 master weights: that signature compiles at its launch)
    for name in set(compile_ahead.COMMON) & set(seen):
        assert sigs[name] in seen[name], name


def test_a_gemm_variant_names_its_family():
    fam, names = compile_ahead._gemm_family(gemm.VARIANTS["gemm_01_tc_small_kernel"])
    assert fam == "tc"
    assert set(names) == {n for n in gemm.VARIANTS if "_tc_" in n and "_relu" not in n}
    assert "gemm_00_tc_large_implicit_kernel" in names and len(names) == 15
    # the fused relu's variants: a family of their own (a model without them compiles none)
    fam, names = compile_ahead._gemm_family(gemm.VARIANTS["gemm_00_tc_small_implicit_relu_kernel"])
    assert fam == "tc_relu" and len(names) == 9
    assert set(names) == {n for n in gemm.VARIANTS if "_tc_" in n and n.endswith("_relu_kernel")}
    fam, names = compile_ahead._gemm_family(gemm.VARIANTS["gemm_10_large_kernel"])
    assert fam == "" and "gemm_00_tiny_implicit_kernel" in names
    assert not any("_tc_" in n or "_sim_" in n or "hmma" in n for n in names)
    fam, names = compile_ahead._gemm_family(gemm.VARIANTS["gemm_00_hmma_tiny_kernel"])
    assert fam == "hmma" and "gemm_00_hmma_small_acc_kernel" in names
    assert compile_ahead._gemm_family(object()) is None


def test_a_worker_marks_an_entry_done_even_when_it_fails(tmp_path, monkeypatch):
    monkeypatch.setenv(compile_ahead.MARKS, str(tmp_path))
    entry = warmup_pool.Entry("dnnkit.kernels.gemm", "no_such_kernel", ())
    with pytest.raises(LookupError):
        compile_ahead.compile_marked(entry)
    assert os.path.exists(compile_ahead.mark_path(str(tmp_path), "no_such_kernel", ()))


class _FakeWorkers:
    """warmup_pool.Workers' stand-in: each entry "compiles" after a delay (its cubin file, then
    its mark); an entry named in ``fail`` gets only its mark."""
    delay, fail, seen = 0.05, (), []

    def __init__(self, workers, env):
        self.marks = env[compile_ahead.MARKS]

    def compile(self, entries, fn, ordered=False):
        assert fn is compile_ahead.compile_marked and ordered
        for e in entries:
            time.sleep(self.delay)
            type(self).seen.append((e.name, time.monotonic()))
            if e.name not in self.fail:
                open(_cubin(e.name), "wb").close()
            open(compile_ahead.mark_path(self.marks, e.name, e.argtypes), "wb").close()
        return []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


_folder = None


def _cubin(name):
    return os.path.join(_folder, name)


@pytest.fixture
def fake_gpu(tmp_path, monkeypatch):
    """compile_ahead with no GPU: stand-ins for the device checks, the workers and the cubin
    files (one per kernel name under tmp_path); fresh bookkeeping."""
    global _folder
    _folder = str(tmp_path)
    names = {id(k): n for n, k in _kernels().items()}
    config.set("dnn.compile_ahead", True)       # (tests/conftest.py turns it off)
    monkeypatch.setattr(compile_ahead, "simulator", lambda: False)
    monkeypatch.setattr(compile_ahead, "_workers", lambda n: min(n, 3))
    monkeypatch.setattr(compile_ahead, "_device_uuid", lambda: "GPU-test")
    monkeypatch.setattr(compile_ahead.warmup_pool, "lock_saves", lambda: None)
    monkeypatch.setattr(compile_ahead.warmup_pool, "Workers", _FakeWorkers)
    monkeypatch.setattr(compile_ahead.cubins, "path",
                        lambda k, at: _cubin(names[id(k)] + ".pending"))
    monkeypatch.setattr(compile_ahead.cubins, "find",
                        lambda k, at: ("entry", names[id(k)])
                        if os.path.exists(_cubin(names[id(k)])) else None)
    monkeypatch.setattr(compile_ahead, "_started", set())
    monkeypatch.setattr(compile_ahead, "_pending", {})
    monkeypatch.setattr(compile_ahead, "jobs", [])
    _FakeWorkers.seen, _FakeWorkers.fail = [], ()
    yield


def _kernels():
    from dnnkit.kernels import all_kernels
    return all_kernels()                      # the GEMM variants among them


def _compiled(monkeypatch, name):
    """The kernel ``name`` and its float32 signature, as if Numba had just compiled it (and
    nothing else in this process: on a GPU, earlier tests may have)."""
    kernel, at = _kernels()[name], signatures("float32")[name]
    monkeypatch.setattr(compile_ahead, "compiled_here", lambda k, t: (k, t) == (kernel, at))
    monkeypatch.setattr(compile_ahead, "in_process", lambda k, t: False)
    return kernel, at


def test_a_first_compile_starts_the_data_types_kernels_and_a_launch_waits_for_its_own(
        fake_gpu, monkeypatch):
    kernel, at = _compiled(monkeypatch, "gemm_00_tc_small_kernel")
    compile_ahead.after_compile(kernel, at)
    assert len(compile_ahead.jobs) == 1
    job = compile_ahead.jobs[0]
    names = [e.name for e in job.entries]
    assert "gemm_00_tc_small_kernel" not in names          # compiled already
    assert set(compile_ahead.COMMON) < set(names)
    # in the order a step needs them: a GEMM variant beside each cheap kernel; each kernel
    # and signature once; the workers on this process's device
    assert names[0].startswith("gemm_") and names[1] == compile_ahead.COMMON[0]
    assert len({(id(_kernels()[e.name]), e.argtypes) for e in job.entries}) == len(names)
    assert job.env["CUDA_VISIBLE_DEVICES"] == "GPU-test"
    tc = {n for n in gemm.VARIANTS if "_tc_" in n and "_relu" not in n}
    assert tc - {"gemm_00_tc_small_kernel"} < set(names)
    assert not any("_relu" in n for n in names)
    # a launch waits for its own entry, not for the whole job
    early, last = names[2], names[-1]
    assert compile_ahead.wait(_kernels()[early], signatures("float32")[early]) == \
        ("entry", early)
    assert not job.done.is_set()
    t0 = time.monotonic()
    assert compile_ahead.wait(_kernels()[last], signatures("float32")[last]) == ("entry", last)
    assert time.monotonic() - t0 > 0.5
    job.done.wait(30)
    assert job.error is None and not os.path.exists(job.marks)
    # not a second time in this process, for this data type and family
    compile_ahead.after_compile(kernel, at)
    assert len(compile_ahead.jobs) == 1


def test_a_failed_entry_lets_its_launch_go_on_and_others_are_not_waited_for(fake_gpu,
                                                                              monkeypatch):
    _FakeWorkers.fail = ("activation_fwd_kernel",)
    kernel, at = _compiled(monkeypatch, "sgd_fwd_kernel")
    compile_ahead.after_compile(kernel, at)
    (job,) = compile_ahead.jobs
    act = _kernels()["activation_fwd_kernel"]
    # the mark without a cubin: None (Numba's own path follows), before the job ends
    assert compile_ahead.wait(act, signatures("float32")["activation_fwd_kernel"]) is None
    assert not job.done.is_set()
    # a signature no job compiles: None at once
    assert compile_ahead.wait(act, signatures("float64")["activation_fwd_kernel"]) is None
    job.done.wait(30)


def test_nothing_starts_when_the_flag_is_off_or_numba_loaded_the_kernel(fake_gpu,
                                                                        monkeypatch):
    kernel, at = _compiled(monkeypatch, "sgd_fwd_kernel")
    with config.change_flags({"dnn.compile_ahead": False}):
        compile_ahead.after_compile(kernel, at)
    assert compile_ahead.jobs == [] and not compile_ahead._started   # a later compile may
    monkeypatch.setattr(compile_ahead, "compiled_here", lambda k, t: False)   # a cache load
    compile_ahead.after_compile(kernel, at)
    assert compile_ahead.jobs == [] and not compile_ahead._started


def test_the_job_thread_is_a_daemon_that_never_raises(fake_gpu, monkeypatch):
    class Broken(_FakeWorkers):
        def compile(self, entries, fn, ordered=False):
            raise RuntimeError("the server died")
    monkeypatch.setattr(compile_ahead.warmup_pool, "Workers", Broken)
    kernel, at = _compiled(monkeypatch, "sgd_fwd_kernel")
    compile_ahead.after_compile(kernel, at)
    (job,) = compile_ahead.jobs
    assert job.thread.daemon and isinstance(job.thread, threading.Thread)
    job.done.wait(30)
    assert job.error == "RuntimeError: the server died"
    act = _kernels()["activation_fwd_kernel"]
    assert compile_ahead.wait(act, signatures("float32")["activation_fwd_kernel"]) is None


def test_the_data_type_is_the_first_float_array_in_a_tuple_too():
    sgd16 = signatures("float16")["sgd_fwd_kernel"]        # float16 parameters come first
    assert compile_ahead._data_type(sgd16) == "float16"
    assert compile_ahead._data_type(signatures("float64")["activation_fwd_kernel"]) == "float64"
    assert compile_ahead._data_type(()) is None


def test_workers_leave_a_cpu_share_memory_and_need_enough_of_them(monkeypatch):
    monkeypatch.setattr(compile_ahead, "jobs", [])
    monkeypatch.setattr(compile_ahead.warmup_pool, "cpus", lambda: 17)
    free = [80 << 30]
    monkeypatch.setattr(compile_ahead, "driver", lambda: type("D", (), {
        "cuMemGetInfo": staticmethod(lambda: (0, free[0], 80 << 30))}))
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert compile_ahead._workers(37) == 16 and compile_ahead._workers(5) == 5
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")              # four ranks share the CPUs
    assert compile_ahead._workers(37) == 4
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")              # two each: not worth a job
    assert compile_ahead._workers(37) == 0
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    free[0] = 20 << 30                                       # a quarter: 5 contexts
    assert compile_ahead._workers(37) == 5
    free[0] = 8 << 30
    assert compile_ahead._workers(37) == 0 and compile_ahead._workers(2) == 2


def test_a_launch_does_not_wait_on_a_job_whose_thread_is_gone(fake_gpu, monkeypatch):
    kernel, at = _compiled(monkeypatch, "sgd_fwd_kernel")
    job = compile_ahead.Job([("sgd_fwd_kernel", kernel, at)], 1)     # never started
    compile_ahead._pending[(id(kernel), at)] = (kernel, "/nonexistent/mark", job)
    t0 = time.monotonic()
    assert compile_ahead.wait(kernel, at) is None
    assert time.monotonic() - t0 < 1 and (id(kernel), at) not in compile_ahead._pending


_LOCKED = r"""
import fcntl, os, sys
from numba.cuda.dispatcher import CUDACache
from dnnkit import warmup_pool
held = []
def probe(self, sig, data):            # Numba's save, while the wrapper holds the lock
    with open(os.path.join(self.cache_path, warmup_pool.LOCK_FILE), "ab") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            held.append(False)
        except BlockingIOError:
            held.append(True)
CUDACache.save_overload = probe
warmup_pool.lock_saves()
warmup_pool.lock_saves()                # idempotent: wrapped once
cache = type("C", (), {"cache_path": sys.argv[1]})()
CUDACache.save_overload(cache, None, None)
print(held)
"""


def test_numba_cache_saves_hold_a_lock_file_of_their_folder(tmp_path):
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    r = subprocess.run([sys.executable, "-c", _LOCKED, str(tmp_path / "cache")],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == "[True]"
