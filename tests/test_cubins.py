"""dnnkit.cubins: the keys of stored cubins, their files, and dnnkit.launch's use of them.

The loading itself (cuModuleLoadData, a launch from a fresh process without Numba's
dispatcher) needs a GPU: tests/gpu/test_cubins.py. Here: fake kernels and overloads of the
shape Numba's have, and the real numba.cuda (not the simulator) for the keys of dnnkit's own
kernels in two fresh processes."""

import collections
import json
import logging
import os
import subprocess
import sys
import types as pytypes

import numpy as np
import pytest

from dnnkit import cubins, launch, warmup


class _Compiled(dict):
    """Numba's ``stats.cache_misses`` of a kernel compiled here for every signature."""

    def get(self, key, default=None):
        return 1


def _fake_kernel(folder, scale=2.0, options=None, compiled=True):
    """``compiled``: True (every signature compiled in this process), False (none), or a
    Counter keyed as Numba keys it: the tuple of argument types."""
    def make(s):
        def kernel(x):
            return x * s
        return kernel
    return pytypes.SimpleNamespace(
        py_func=make(scale), _cache=pytypes.SimpleNamespace(cache_path=str(folder)),
        targetoptions=options or {"fastmath": False, "launch_bounds": None},
        stats=pytypes.SimpleNamespace(cache_misses=_Compiled() if compiled is True
                                      else compiled or collections.Counter()))


class _Lib:
    def __init__(self, **kw):
        self.__dict__.update(kw)

    def get_cubin(self, cc=None):
        # Numba's own target when not told one (sm_90a on an H100): store() must not ask
        assert cc is None, "a cubin for another target than Numba compiled for"
        return b"\x7fELF cubin"


def _overload(**kw):
    return pytypes.SimpleNamespace(entry_name="_Z6kernel", _codelibrary=_Lib(**kw))


@pytest.fixture
def cc(monkeypatch):
    monkeypatch.setattr(cubins, "_cc", lambda: (9, 0))


def test_the_key_changes_with_everything_the_machine_code_depends_on(tmp_path, cc,
                                                                    monkeypatch):
    k = _fake_kernel(tmp_path)
    args = ("float32", "int64")
    p = cubins.path(k, args)
    assert p.startswith(os.path.join(str(tmp_path), cubins.FOLDER)) and p.endswith(".cubin")
    assert cubins.path(k, args) == p                                  # stable
    assert cubins.path(k, ("float32", "int32")) != p                  # argument types
    assert cubins.path(k, args, (8, 0)) != p                          # compute capability
    assert cubins.path(_fake_kernel(tmp_path, 3.0), args) != p        # closure (a variant)
    assert cubins.path(_fake_kernel(tmp_path, options={"fastmath": True}), args) != p
    monkeypatch.setattr(cubins, "_stamp", b"another kernels package")  # the sources
    assert cubins.path(k, args) != p


def test_a_fingerprint_is_the_values_not_where_they_lie_in_memory():
    def f(x):
        return x
    d1 = pytypes.SimpleNamespace(py_func=f, targetoptions={"link": (), "opt": True})
    d2 = pytypes.SimpleNamespace(py_func=f, targetoptions={"link": (), "opt": False})
    one = cubins.fingerprint(d1)
    assert "opt':True" in one and cubins.fingerprint(d2) != one
    # a value met twice is written out twice (a temporary's id may be another's later)
    assert cubins.fingerprint((d1, d2, d1)) == \
        f"tuple({one},{cubins.fingerprint(d2)},{one})"
    a = np.zeros(2, [("a", "f4"), ("b", "i4")])
    b = np.zeros(2, [("a", "i4"), ("b", "f4")])
    assert cubins.fingerprint(a) != cubins.fingerprint(b)      # same bytes, other fields

    def g(x, *, y=1):
        return x + y
    h = g
    one_g = cubins.fingerprint(g)

    def g(x, *, y=2):
        return x + y
    assert cubins.fingerprint(g) != one_g and cubins.fingerprint(h) == one_g
    loop = []
    loop.append(loop)
    assert cubins.fingerprint(loop) == "list(<cycle>)"
    assert cubins.fingerprint(np.arange(3)) != cubins.fingerprint(np.arange(1, 4))


def test_no_folder_no_cubin(tmp_path, cc):
    k = _fake_kernel(tmp_path)
    k._cache = pytypes.SimpleNamespace(cache_path=None)            # Numba's NullCache
    assert cubins.path(k, ()) is None and cubins.store(k, (), _overload()) is False
    assert cubins.find(k, ()) is None


def test_an_overload_numba_loaded_from_its_cache_is_not_stored(tmp_path, cc):
    # Numba's index is stamped with the kernel's own file: its entry may be older than the
    # sources the cubin's key is made of
    from numba import typeof
    here = (typeof(np.float32(1)),)
    k = _fake_kernel(tmp_path, compiled=collections.Counter({here: 1}))
    assert cubins.store(k, (typeof(1),), _overload()) is False      # loaded, not compiled
    assert not os.path.exists(cubins.path(k, (typeof(1),)))
    assert cubins.store(k, list(here), _overload()) is True         # compiled in this process


def test_the_sources_stamp_skips_editor_files_and_gives_up_on_unreadable_ones(tmp_path,
                                                                             monkeypatch):
    from dnnkit import kernels
    (tmp_path / "conv.py").write_text("x = 1\n")
    os.symlink(tmp_path / "gone", tmp_path / ".#conv.py")       # an editor's lock link
    monkeypatch.setattr(kernels, "__file__", str(tmp_path / "__init__.py"))
    monkeypatch.setattr(cubins, "_stamp", None)
    stamp = cubins._sources_stamp()
    assert stamp
    (tmp_path / "conv.py").write_text("x = 2\n")
    monkeypatch.setattr(cubins, "_stamp", None)
    assert cubins._sources_stamp() not in (b"", stamp)           # the contents count
    os.symlink(tmp_path / "gone", tmp_path / "pool.py")          # unreadable: cubins off
    monkeypatch.setattr(cubins, "_stamp", None)
    assert cubins._sources_stamp() == b""


def test_an_unreadable_kernel_source_turns_cubins_off(tmp_path, cc, monkeypatch):
    monkeypatch.setattr(cubins, "_stamp", b"")
    k = _fake_kernel(tmp_path)
    assert cubins.path(k, ()) is None and cubins.store(k, (), _overload()) is False


def test_store_then_find(tmp_path, cc, monkeypatch):
    k = _fake_kernel(tmp_path)
    assert cubins.store(k, ("float32",), _overload()) is True
    assert cubins.store(k, ("float32",), _overload()) is False     # there already
    assert cubins.read(cubins.path(k, ("float32",))) == ("_Z6kernel",
                                                          b"\x7fELF cubin")
    loads = []
    monkeypatch.setattr(cubins, "load_function",
                        lambda cubin, entry: loads.append((cubin, entry)) or 0xF00)
    before = cubins.loaded
    entry, loader = cubins.find(k, ("float32",))
    assert entry == "_Z6kernel" and cubins.loaded == before
    assert loader() == 0xF00 and cubins.loaded == before + 1
    assert loads == [(b"\x7fELF cubin", "_Z6kernel")]
    assert cubins.find(k, ("float64",)) is None


def test_numbas_object_code_is_stored_as_its_bytes(tmp_path, cc):
    k = _fake_kernel(tmp_path)

    def ov(code, code_type):
        o = _overload()
        o._codelibrary.get_cubin = lambda cc=None: pytypes.SimpleNamespace(code=code,
                                                                           code_type=code_type)
        return o
    assert cubins.store(k, ("a",), ov(b"\x7fELF object code", "cubin")) is True
    assert cubins.read(cubins.path(k, ("a",)))[1] == b"\x7fELF object code"
    assert cubins.store(k, ("b",), ov(b"\x7fELF", "ptx")) is False        # not machine code
    assert cubins.store(k, ("c",), ov("/a/file.cubin", "cubin")) is False  # a file's name
    assert cubins.store(k, ("d",), ov(b".version 8.0", "cubin")) is False  # not ELF
    assert not os.path.exists(cubins.path(k, ("b",)))


@pytest.mark.parametrize("flag", [dict(_setup_functions=[print]),
                                  dict(referenced_objects={1: object()}),
                                  dict(use_cooperative=True), dict(needs_cudadevrt=True),
                                  "debug", "carveout"])
def test_what_is_not_machine_code_alone_is_not_stored(tmp_path, cc, flag):
    k = _fake_kernel(tmp_path)
    ov = _overload(**(flag if isinstance(flag, dict) else {}))
    if flag == "debug":
        ov.debug = True                   # Numba's launch checks its exception flag
    elif flag == "carveout":
        ov.shared_memory_carveout = 50    # set by Numba at bind
    assert cubins.store(k, (), ov) is False
    assert not os.path.exists(os.path.join(str(tmp_path), cubins.FOLDER))


def test_files_that_are_not_cubins_are_passed_over(tmp_path, cc):
    k = _fake_kernel(tmp_path)
    p = cubins.path(k, ())
    os.makedirs(os.path.dirname(p))
    for data in (b"", b"garbage", cubins.MAGIC, cubins.MAGIC + b"name\n", cubins.MAGIC + b"x"):
        with open(p, "wb") as f:
            f.write(data)
        assert cubins.find(k, ()) is None, data


def test_an_unwritable_folder_is_not_an_error(tmp_path, cc):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the folder would be")
    assert cubins.store(_fake_kernel(blocker), (), _overload()) is False


def test_a_cubin_the_driver_refuses_is_replaced_by_numbas_overload(tmp_path, cc,
                                                                  monkeypatch):
    k = _fake_kernel(tmp_path)
    cubins.store(k, (), _overload())
    p = cubins.path(k, ())
    numba_fn = pytypes.SimpleNamespace(handle=0xABC)
    k.compile = lambda argtypes: _overload(get_cufunc=lambda: numba_fn)
    k.stats.cache_misses = collections.Counter()        # Numba loads it from its cache
    monkeypatch.setattr(cubins, "load_function", lambda cubin, entry: None)
    _, loader = cubins.find(k, ())
    assert loader() == 0xABC and not os.path.exists(p)    # removed, not written again

    k.stats.cache_misses = collections.Counter({(): 1})    # Numba compiled it here
    cubins.store(k, (), _overload())
    _, loader = cubins.find(k, ())
    assert loader() == 0xABC and os.path.exists(p)         # written from the compile


def test_another_devices_architecture_takes_numbas_overload(tmp_path, monkeypatch):
    k = _fake_kernel(tmp_path)
    monkeypatch.setattr(cubins, "_cc", lambda: (9, 0))
    cubins.store(k, (), _overload())
    _, loader = cubins.find(k, ())
    monkeypatch.setattr(cubins, "_cc", lambda: (8, 0))          # the launch's device
    monkeypatch.setattr(cubins, "load_function", lambda *a: pytest.fail("an sm_90 cubin"))
    k.compile = lambda argtypes: _overload(get_cufunc=lambda: pytypes.SimpleNamespace(
        handle=0x80))
    assert loader() == 0x80


def test_launch_keeps_a_found_cubins_launcher_and_records_it(monkeypatch):
    from numba import typeof
    calls = []
    from cuda.bindings import driver
    monkeypatch.setattr(driver, "cuLaunchKernel", lambda *c: (calls.append(c), (0,))[1],
                        raising=False)
    monkeypatch.setattr(launch, "_fast", {})
    kernel = pytypes.SimpleNamespace(typeof_pyval=typeof)
    monkeypatch.setattr(cubins, "find", lambda k, argtypes: ("_Z1k", lambda: 0xF00)
                        if k is kernel and [str(t) for t in argtypes] == ["int64"] else None)
    monkeypatch.setattr(launch, "device_id", lambda: 0)
    with warmup.recording(launch=True, through_numba=False) as seen:
        assert launch.through_numba is False
        fast = launch._from_disk(kernel, (5,), (id(kernel), launch._types((5,))))
    assert [str(t) for t in seen[0][1]] == ["int64"] and seen[0][0] is kernel
    fast(1, 32, 0x5EA, (5,), 0)
    assert calls[0][0] == 0xF00 and calls[0][8] == 0x5EA
    assert launch._fast[(id(kernel), launch._types((5,)))] is fast
    other = (np.float32(1),)
    assert launch._from_disk(kernel, other, (id(kernel), launch._types(other))) is None


def test_an_unexpected_failure_of_the_cubin_path_is_logged(monkeypatch, caplog):
    from numba import typeof

    def broken(k, argtypes):
        raise RuntimeError("a defect")
    monkeypatch.setattr(cubins, "find", broken)
    kernel = pytypes.SimpleNamespace(typeof_pyval=typeof, __name__="k")
    with caplog.at_level(logging.WARNING, logger="dnnkit"):
        key = (id(kernel), launch._types((5,)))
        assert launch._from_disk(kernel, (5,), key) is None     # Numba's launch then runs
    assert [r.getMessage() for r in caplog.records] == [
        "launch: the stored cubin of k was not used (RuntimeError: a defect)"]


def test_launch_looks_for_a_signatures_cubin_once(monkeypatch):
    # a signature that is never learned (Numba launches it each time) costs no lookup after
    # its first: no hashing, no file system call per launch
    looked, ran = [], []
    monkeypatch.setattr(launch, "simulator", lambda: False)
    monkeypatch.setattr(launch, "stream_pointer", lambda s: 0)
    for name, value in (("_no_disk", set()), ("_fast", {}), ("_cache", {})):
        monkeypatch.setattr(launch, name, value)
    monkeypatch.setattr(launch, "_from_disk", lambda k, a, key: looked.append(a) or None)
    monkeypatch.setattr(launch, "_learn", lambda k, a: None)
    monkeypatch.setattr(launch, "_configure", lambda *c: lambda *args: ran.append(args))
    kernel = object()
    for _ in range(3):
        launch.launch(kernel, 1, 32, None, (np.float32(1), 2))
    launch.launch(kernel, 1, 32, None, (np.float64(1), 2))      # another signature
    assert len(ran) == 4 and len(looked) == 2


def test_learn_stores_the_overload_numba_launched(monkeypatch):
    from numba import typeof
    ov = _overload()
    kernel = pytypes.SimpleNamespace(typeof_pyval=typeof, overloads={})
    kernel.overloads[(typeof(5),)] = ov
    stored = []
    monkeypatch.setattr(launch, "_fast", {})
    monkeypatch.setattr(cubins, "store", lambda *a: stored.append(a))
    launch._learn(kernel, (5,))
    assert stored == [(kernel, (typeof(5),), ov)]


_KEYS = r"""
import json
from numba.cuda import types
import dnnkit.kernels
from dnnkit import cubins
keys = {n: [cubins.path(k, (types.float32,), (9, 0)), id(k)]
        for n, k in sorted(dnnkit.kernels.all_kernels().items())}
# what a process's first compile or cache load does first: it sets attributes on Numba's
# float16 type, which Numba's pickle of a closure includes
from numba.cuda.descriptor import cuda_target
cuda_target.typing_context.refresh()
cuda_target.target_context.refresh()
cubins._kernel_parts.clear()
later = {n: cubins.path(k, (types.float32,), (9, 0))
         for n, k in sorted(dnnkit.kernels.all_kernels().items())}
print(json.dumps([keys, later]))
"""


def _keys():
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    r = subprocess.run([sys.executable, "-c", _KEYS], capture_output=True, text=True, env=env,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_every_kernels_cubin_key_is_the_same_in_every_process_and_after_numbas_refresh():
    (first, refreshed), (second, _) = _keys(), _keys()
    moved = sorted(n for n in first if first[n][0] != refreshed[n])
    assert not moved, f"cubin keys change with Numba's target refresh: {moved}"
    assert len(first) > 40 and first.keys() == second.keys()
    changed = sorted(n for n in first if first[n][0] != second[n][0])
    assert not changed, f"cubin keys differ between processes (never found again): {changed}"
    assert all(p for p, _ in first.values()), [n for n, (p, _) in first.items() if not p]
    # one file per kernel object (some kernels are listed under two names)
    assert len({p for p, _ in first.values()}) == len({i for _, i in first.values()})
