"""dnnkit.warmup: recording a training step's kernel signatures, manifests, the parallel compile
driver (workers forked from a compile server), a worker compiling recorded signatures with the
real Numba compiler (PTX, no GPU), and the ``warmup`` command's argument errors. What only a
GPU shows (the disk cache filled by the workers and found by a fresh process's first step) is
the ``gpu`` test at the end and validation/cold_start.py."""

import json
import os
import pickle
import subprocess
import sys
import time

import numpy as np
import pytest

from dnnkit import launch, warmup, warmup_pool
from dnnkit.errors import DnnkitError

# Not imported from tests.conftest: spawned workers import this module (for the stand-in
# compile functions below), and conftest would switch the simulator back on in them.
SIMULATOR = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"

TINY = dict(batch=2, width=2, image_size=8)
NOT_SIM = {"NUMBA_ENABLE_CUDASIM": None}


def _record(model, dtype="float32"):
    return warmup.record_step(model, dtype, TINY["batch"], "numba", launch=False,
                              width=TINY["width"], image_size=TINY["image_size"])


# ---------------------------------------------------------------- recording

@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_record_only_names_every_kernel_of_a_vgg_step_and_runs_none(dtype):
    parts = warmup.setup("vgg", dtype, TINY["batch"], "numba", width=2, image_size=8)
    w0 = parts[0].parameters()[0].numpy().copy()
    with warmup.recording(launch=False) as seen:
        warmup.step(*parts)
    # nothing ran: the optimizer's kernel never updated the weights
    np.testing.assert_array_equal(parts[0].parameters()[0].numpy(), w0)
    rec = warmup.entries_of(seen)
    assert rec.unnamed == []
    names = [e.name for e in rec.entries]
    assert len(set(rec.entries)) == len(rec.entries) < len(seen)    # repeats dropped
    assert any(n.startswith("gemm_") for n in names)
    assert "sgd_fwd_kernel" in names and "batch_norm_apply_bwd_kernel" in names
    for e in rec.entries:
        k = warmup.resolve(e)
        assert any(k is kern for kern, types in seen if types == e.argtypes), e.name
        assert all(str(t).startswith(("array(", "UniTuple(", "int", "float", "uint"))
                   for t in e.argtypes), e
        arrays = [t for t in e.argtypes if str(t).startswith("array(")]
        assert arrays and all(t.layout == "C" for t in arrays), e
    data = [t for e in rec.entries if e.name.startswith("batch_norm_apply_fwd")
            for t in e.argtypes if str(t).startswith("array(")]
    assert str(data[0].dtype) == dtype


def test_record_only_names_factory_built_kernels_by_their_call():
    rec = _record("resnet18")
    assert rec.unnamed == []
    made = [e for e in rec.entries if e.make is not None]
    # the global average pool's window is the last stage's spatial size: built on demand
    assert made and all(e.name.startswith("pool_kernels(") for e in made)
    for e in made:
        k = warmup.resolve(e)
        factory, args, kwargs, index = e.make
        from dnnkit.kernels import pool
        assert k is pool.pool_kernels(*args, **dict(kwargs))[index]
    from dnnkit.kernels import pool
    assert hasattr(pool.pool_kernels, "cache_info")      # the lru_cache itself again


def test_recording_launch_true_collects_first_launches_and_restores():
    assert launch.first_launches is None
    with warmup.recording(launch=True) as seen:
        assert launch.first_launches is seen
        with pytest.raises(RuntimeError, match="already recording"):
            with warmup.recording(launch=True):
                pass
    assert launch.first_launches is None


class _StubKernel:
    """What dnnkit.launch._learn reads of a Numba dispatcher after a GPU launch."""
    overloads = {}

    @staticmethod
    def typeof_pyval(v):
        from numba import typeof
        return typeof(v)


def test_learn_records_the_launch_types_while_recording():
    # the GPU path's hook (the simulator launches without typing); with a stub dispatcher
    args = (np.zeros(3, np.float32), 5, (1, 2))
    with warmup.recording(launch=True) as seen:
        launch._learn(_StubKernel, args)
    assert len(seen) == 1 and seen[0][0] is _StubKernel
    assert [str(t) for t in seen[0][1]] == ["array(float32, 1d, C)", "int64",
                                            "UniTuple(int64 x 2)"]
    launch._learn(_StubKernel, args)              # not recording: nothing kept anywhere
    assert launch.first_launches is None and launch.through_numba is False


def test_a_signature_launched_before_recording_is_recorded_again(monkeypatch):
    # a process that trained before records its step: the launch it learned is seen anyway
    args = (np.zeros(3, np.float32), 5)
    monkeypatch.setattr(launch, "_fast", {(id(_StubKernel), launch._types(args)): "learned"})
    with warmup.recording(launch=True) as seen:
        assert launch.through_numba is True
        launch._learn(_StubKernel, args)
    assert len(seen) == 1 and launch._fast[(id(_StubKernel), launch._types(args))] == "learned"


@pytest.mark.skipif(not SIMULATOR, reason="the simulator's launch path")
def test_recording_launch_true_runs_the_kernels_on_the_simulator():
    parts = warmup.setup("vgg", "float32", 2, "numba", width=2, image_size=8)
    w0 = parts[0].parameters()[0].numpy().copy()
    with warmup.recording(launch=True) as seen:
        warmup.step(*parts).item()
    assert not np.array_equal(parts[0].parameters()[0].numpy(), w0)
    assert seen == []          # the simulator's launches are not typed (no fast path)


@pytest.mark.skipif(not SIMULATOR, reason="the simulator's answer (no compile counts)")
def test_fresh_first_step_times_a_new_process(tmp_path):
    m = tmp_path / "m.pkl"
    r = warmup.fresh_first_step("vgg", "float32", 2, "numba", width=2, image_size=8,
                                manifest=str(m))
    assert r["compiled"] is None and r["loaded"] is None
    assert 0 < r["setup_s"] < r["to_step_s"] and 0 < r["step_s"] < r["to_step_s"]
    assert warmup.load(m) == []          # the simulator's launches are not typed
    with pytest.raises(warmup.DnnkitError, match="(?s)the fresh process failed: .*'alexnet'"):
        warmup.fresh_first_step("alexnet", "float32", 2, "numba")


@pytest.mark.parametrize("kw, bad", [({"model": "alexnet"}, "'alexnet'"),
                                     ({"dtype": "int8"}, "'int8'"),
                                     ({"backend": "cpu"}, "'cpu'"),
                                     ({"batch": 0}, "got 0")])
def test_setup_names_bad_arguments(kw, bad):
    with pytest.raises(ValueError, match=f"warmup: .*{bad}"):
        warmup.setup(**kw)


# ---------------------------------------------------------------- manifests

def test_manifest_round_trip(tmp_path):
    entries = _record("resnet18").entries
    path = tmp_path / "m.pkl"
    warmup.save(path, entries, {"model": "resnet18"})
    back = warmup.load(path)
    assert back == entries and all(isinstance(e, warmup.Entry) for e in back)
    assert [hash(e) for e in back] == [hash(e) for e in entries]
    data = pickle.loads(path.read_bytes())
    assert data["info"] == {"model": "resnet18"} and data["format"] == warmup.FORMAT


def test_load_refuses_what_is_not_a_manifest(tmp_path):
    junk, other = tmp_path / "junk.bin", tmp_path / "other.pkl"
    junk.write_bytes(b"\x00not a pickle")
    other.write_bytes(pickle.dumps({"format": "something else"}))
    for p in (junk, other):
        with pytest.raises(ValueError, match=f"{p.name} is not a warm-up manifest"):
            warmup.load(p)


# ---------------------------------------------------------------- the parallel driver

def _stub_sleep(entry):
    """A compile stand-in: sleeps; 'cached' when the name says so; fails on request."""
    if entry.name == "boom":
        raise RuntimeError(f"cannot compile {entry.name}")
    time.sleep(2.5)
    return entry.name.endswith("cached")


def _stub_env(entry):
    """Reports the worker's set-up: the save lock and the environment (through its error)."""
    raise RuntimeError(f"lock={warmup_pool._saves_locked} "
                       f"sim={os.environ.get('NUMBA_ENABLE_CUDASIM')} "
                       f"x={os.environ.get('WARMUP_TEST_X')}")


def _e(name):
    return warmup.Entry("m", name, ())


def _stub_started(entry):
    """Reports when the entry started (through its error), after a short sleep."""
    t = time.time()
    time.sleep(0.3)
    raise RuntimeError(repr(t))


def test_compile_hands_the_gemm_variants_out_first_and_returns_in_order():
    names = ["act", "gemm_00_x", "pool", "gemm_01_y", "loss"]
    results = warmup.compile([_e(n) for n in names], workers=1, fn=_stub_started)
    assert [r.entry.name for r in results] == names
    started = {r.entry.name: float(r.error.split(": ", 1)[1]) for r in results}
    order = sorted(started, key=started.get)
    assert order == ["gemm_00_x", "gemm_01_y", "act", "pool", "loss"], order


def test_compile_runs_entries_side_by_side_and_collects_results():
    entries = [_e("a"), _e("b_cached"), _e("c"), _e("d"), _e("a"), _e("boom")]
    t0 = time.perf_counter()
    results = warmup.compile(entries, workers=4, fn=_stub_sleep)
    wall = time.perf_counter() - t0
    assert [r.entry.name for r in results] == ["a", "b_cached", "c", "d", "boom"]
    assert [r.cached for r in results] == [False, True, False, False, False]
    assert [r.error for r in results[:4]] == [None] * 4
    assert results[4].error == "RuntimeError: cannot compile boom"
    assert all(r.seconds >= 2.4 for r in results[:4])
    assert wall < 9.5, wall            # four 2.5 s entries one after another: 10 s
    lines = warmup.report(results, wall, 4)
    assert lines[0].startswith("5 kernel signatures in") and "3 compiled, 1 already cached, " \
        "1 failed" in lines[0]
    assert any("FAILED boom(): RuntimeError: cannot compile boom" in ln for ln in lines)


def test_compile_workers_get_the_lock_and_the_environment():
    env = {"WARMUP_TEST_X": "42", "NUMBA_ENABLE_CUDASIM": None}
    (r,) = warmup.compile([_e("x")], workers=2, fn=_stub_env, env=env)
    assert r.error == "RuntimeError: lock=True sim=None x=42"


def _stub_inherited(entry):
    """Reports what the worker had before its first entry (through its error)."""
    f16 = sys.modules.get("numba.core.types")
    refreshed = f16 is not None and getattr(f16.float16, "alignof_", None) is not None
    raise RuntimeError(f"numba={'numba.cuda' in sys.modules} "
                       f"kernels={'dnnkit.kernels' in sys.modules} refreshed={refreshed} "
                       f"ppid={os.getppid()}")


def test_compile_workers_are_forked_from_a_prewarmed_server():
    # the workers' start is the warm-up's critical path: they inherit Numba, the kernels and
    # a refreshed target (float16's alignment is set by the refresh) from one server process
    # instead of importing them each
    with warmup_pool.Workers(2, env=NOT_SIM) as w:
        res = w.compile([_e("a"), _e("b"), _e("c")], fn=_stub_inherited)
        seconds, error = w.prewarmed()
    assert error is None and seconds > 0
    assert {r.error.rsplit(" ", 1)[0] for r in res} == {
        "RuntimeError: numba=True kernels=True refreshed=True"}
    ppids = {r.error.rsplit("=", 1)[1] for r in res}
    assert len(ppids) == 1 and ppids != {str(os.getpid())}
    with warmup_pool.Workers(1, env=NOT_SIM) as w:
        server = w.compile([_e("p")], fn=_stub_parent)[0].error
    assert server.endswith(f"parent of the workers' parent: {os.getpid()}")
    with pytest.raises(DnnkitError, match="has served its one request"):
        w.compile([_e("q")], fn=_stub_parent)


def _stub_parent(entry):
    with open(f"/proc/{os.getppid()}/stat") as f:      # Linux: field 4 is the parent's pid
        grandparent = f.read().rsplit(")", 1)[1].split()[1]
    raise RuntimeError(f"parent of the workers' parent: {grandparent}")


@pytest.mark.parametrize("workers", [0, -1, 1.5, True])
def test_compile_names_a_bad_worker_count(workers):
    with pytest.raises(ValueError, match=f"workers must be an integer >= 1; got {workers!r}"):
        warmup.compile([_e("a")], workers=workers, fn=_stub_sleep)


def test_compile_of_nothing_starts_nothing():
    assert warmup.compile([], workers=3, fn=_stub_env) == []


def _key_of(entry):
    """The closure and bytecode hashes of Numba's cache key for the entry's kernel, as the
    worker computes them, written where WARMUP_TEST_OUT says."""
    import hashlib
    from numba.core.serialize import dumps
    f = warmup.resolve(entry).py_func
    cells = () if f.__closure__ is None else tuple(c.cell_contents for c in f.__closure__)
    out = os.path.join(os.environ["WARMUP_TEST_OUT"], f"{abs(hash(entry.name))}.json")
    with open(out, "w") as fh:
        json.dump([entry.name, hashlib.sha256(f.__code__.co_code + dumps(cells)).hexdigest()],
                  fh)
    return False


_PLAIN_KEYS = r"""
import hashlib, json, pickle, sys
from numba.core.serialize import dumps
from dnnkit import warmup
out = {}
for e in pickle.loads(bytes.fromhex(sys.argv[1])):
    f = warmup.resolve(e).py_func
    cells = () if f.__closure__ is None else tuple(c.cell_contents for c in f.__closure__)
    out[e.name] = hashlib.sha256(f.__code__.co_code + dumps(cells)).hexdigest()
print(json.dumps(out))
"""


def _some_entries():
    rec = _record("resnet18")
    pick = [e for e in rec.entries if e.make is not None][:1]
    pick += [e for e in rec.entries if e.name.startswith("gemm_00")][:1]
    pick += [e for e in rec.entries if e.name == "sgd_fwd_kernel"]
    assert len(pick) == 3
    return pick


def test_a_forked_worker_keys_kernels_as_a_plain_process(tmp_path):
    # Numba keys a cached kernel by its pickled closure, and notes that pickling can differ
    # with how a process was started: a worker's cache entries must be the ones a training
    # process (a plain `python`) looks up. (What a process did before moves some keys: a
    # target refresh changes how float16 pickles, a compile how the tensor-core GEMMs' mma
    # intrinsics do; on a GPU the worker's prewarm matched a plain process, a refreshed one
    # did not. dnnkit's stored cubins, keyed by cubins.fingerprint, are what a fresh process
    # launches, without Numba's index.)
    entries = _some_entries()
    res = warmup.compile(entries, workers=2, fn=_key_of,
                         env=dict(NOT_SIM, WARMUP_TEST_OUT=str(tmp_path)))
    assert [r.error for r in res] == [None] * 3
    spawned = dict(json.loads(p.read_text()) for p in tmp_path.glob("*.json"))
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    r = subprocess.run([sys.executable, "-c", _PLAIN_KEYS, pickle.dumps(entries).hex()],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert spawned == json.loads(r.stdout.strip().splitlines()[-1])


def test_a_worker_compiles_recorded_signatures_with_the_real_compiler():
    # the simulator's recorded types, compiled to PTX for sm_90 by spawned workers without the
    # simulator: the factory-built pool kernel, a GEMM and the optimizer's tuple arguments
    res = warmup.compile(_some_entries(), workers=2, fn=warmup.ptx_entry, env=NOT_SIM)
    assert [r.error for r in res] == [None] * 3, res
    assert all(r.seconds > 0 and not r.cached for r in res)


def test_a_worker_reports_a_signature_the_kernel_does_not_accept():
    (e,) = [e for e in _some_entries() if e.name == "sgd_fwd_kernel"]
    bad = e._replace(argtypes=e.argtypes[:2])
    (r,) = warmup.compile([bad], workers=1, fn=warmup.ptx_entry, env=NOT_SIM)
    assert r.error == "TypeError: Signature mismatch: 2 argument types given, but function " \
        "takes 12 arguments"


# ---------------------------------------------------------------- the command

def _cli(*args):
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    return subprocess.run([sys.executable, "-m", "dnnkit", "warmup", *args],
                          capture_output=True, text=True, env=env, timeout=600)


@pytest.mark.parametrize("args, says", [
    (["--model", "alexnet"], "argument --model: invalid choice: 'alexnet'"),
    (["--dtype", "int8"], "argument --dtype: invalid choice: 'int8'"),
    (["--workers", "0"], "argument --workers: must be >= 1; got 0"),
    (["--batch", "x"], "argument --batch: not an integer: 'x'"),
    (["--manifest", "a.pkl", "--record-manifest", "b.pkl"],
     "--manifest a.pkl gives the signatures; --record-manifest b.pkl records"),
])
def test_command_names_bad_arguments(args, says):
    r = _cli(*args)
    assert r.returncode == 2 and says in r.stderr, r.stderr


@pytest.mark.skipif(not SIMULATOR, reason="the simulator's answer")
def test_command_says_it_needs_a_gpu_on_the_simulator():
    r = _cli("--model", "vgg")
    assert r.returncode == 1
    assert "dnnkit: error: warmup compiles kernels for a GPU, and there is none here" in r.stderr


# ---------------------------------------------------------------- GPU

@pytest.mark.gpu
def test_workers_fill_the_cache_a_fresh_process_finds(tmp_path):
    # ResNet-18 at width 8 (its kernels, compiled in seconds) in a fresh cache folder: a
    # record-only pass in a fresh process, the workers, then a fresh process's real first step
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    m = tmp_path / "m.pkl"
    code = ("import json, sys; from dnnkit import warmup; r = warmup.record_step('resnet18', "
            "'float32', 4, 'numba', width=8); warmup.save(sys.argv[1], r.entries); "
            "print(json.dumps(r.unnamed))")
    r = subprocess.run([sys.executable, "-c", code, str(m)], capture_output=True, text=True,
                       env=env, timeout=600)
    assert r.returncode == 0 and json.loads(r.stdout.splitlines()[-1]) == [], r.stderr
    entries = warmup.load(m)
    res = warmup.compile(entries, workers=4, env={"NUMBA_CACHE_DIR": env["NUMBA_CACHE_DIR"]})
    assert [x.error for x in res] == [None] * len(entries)
    assert not any(x.cached for x in res)
    first = warmup.fresh_first_step("resnet18", "float32", 4, "numba", env=env, width=8,
                                    manifest=str(tmp_path / "real.pkl"))
    # every signature of the real step was in the cache, and the record-only pass saw them all
    assert first["compiled"] == 0 and first["loaded"] == len(entries), first
    assert set(warmup.load(tmp_path / "real.pkl")) == set(entries)
