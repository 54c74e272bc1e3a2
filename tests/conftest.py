"""Test set-up: the CUDA simulator when there is no GPU, markers, and clean flags per test."""

import collections
import os
import zlib
import sys

from dnnkit.backends import driver_available

HAVE_DRIVER = driver_available()
if not HAVE_DRIVER:
    # Must be set before numba.cuda is first imported.
    os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")
# The simulator runs one Python thread per CUDA thread; switch often so barriers are cheap.
sys.setswitchinterval(1e-4)

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from dnnkit import config  # noqa: E402

SIMULATOR = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"


def _serialise_simulator_static_shared():
    """Numba's simulator makes a block's static shared array (``cuda.shared.array(n, ...)``,
    n > 0) on first use by checking its dict of allocations, then creating and storing the
    array, with no lock (numba-cuda 0.30, simulator/kernelapi.py FakeCUDAShared.array). Two
    threads of a block can both miss and each get an array of its own: one thread's writes land
    in an array the others never read, and they read np.empty's garbage. Seen as an
    intermittent wrong column of the implicit-GEMM convolution (its decoded columns live in a
    static shared array), about 2 calls in 100 with the CPU busy. A real GPU has no such race;
    the lock makes the simulator's check-and-create atomic."""
    import threading
    import traceback
    from numba.core import types
    from numba.cuda.simulator import kernelapi
    from numba.np import numpy_support
    cls = kernelapi.FakeCUDAShared
    if getattr(cls.array, "_dnnkit_locked", False):
        return
    plain, lock = cls.array, threading.Lock()

    def array(self, shape, dtype, alignment=None):
        if shape == 0 or alignment is not None:     # dynamic: one buffer made with the block
            return plain(self, shape, dtype, alignment)
        if isinstance(dtype, types.Type):
            dtype = numpy_support.as_dtype(dtype)
        # the allocation's key as Numba's: the calling line (file, line number)
        caller = tuple(traceback.extract_stack(sys._getframe())[-2][0:2])
        with lock:
            res = self._allocations.get(caller)
            if res is None:
                res = self._allocations[caller] = np.empty(shape, dtype)
        return res
    array._dnnkit_locked = True
    cls.array = array


if SIMULATOR:
    _serialise_simulator_static_shared()


def cudnn_ok():
    from dnnkit.cudnn import loader
    return loader.status("").available


# Test files that take minutes on the CPU (compiling every kernel to PTX, in three processes):
# collected first, so that under pytest-xdist (README's command: ``-n auto --dist loadfile
# --no-loadscope-reorder``, which hands out files in this order instead of largest first) one
# worker starts on them while the others take the rest, instead of a serial tail.
LONG_FIRST = ("tests/kernels/test_ptx.py",)


def pytest_collection_modifyitems(config, items):  # noqa: F811 - pytest hook name
    items.sort(key=lambda item: item.nodeid.split("::")[0] not in LONG_FIRST)   # stable
    skip_gpu = pytest.mark.skip(reason="needs a real CUDA GPU (running on the simulator)")
    skip_cudnn = None
    for item in items:
        if item.get_closest_marker("gpu") and SIMULATOR:
            item.add_marker(skip_gpu)
        if item.get_closest_marker("cudnn"):
            if skip_cudnn is None:
                from dnnkit.cudnn import loader
                st = loader.status("")
                skip_cudnn = False if st.available else pytest.mark.skip(
                    reason=f"cuDNN unavailable: {st.reason}")
            if skip_cudnn:
                item.add_marker(skip_cudnn)


_FUZZ = "tests.fuzz.common"      # the fuzzer's case counter, once a fuzz test module loaded it


def pytest_sessionfinish(session):
    """In a pytest-xdist worker: hand the fuzzer's case counts to the controller, which prints
    the summary (pytest_testnodedown below)."""
    out = getattr(session.config, "workeroutput", None)
    common = sys.modules.get(_FUZZ)
    if out is not None and common is not None:
        out["fuzz_counts"] = {op: dict(c) for op, c in common.COUNTS.items()}


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """pytest-xdist's controller: add a finished worker's fuzz case counts to its own."""
    counts = getattr(node, "workeroutput", {}).get("fuzz_counts")
    if counts:
        from tests.fuzz import common
        for op, c in counts.items():
            common.COUNTS[op].update(c)


def pytest_terminal_summary(terminalreporter, config):  # noqa: F811 - pytest hook name
    """The fuzzer's case counts, when fuzz tests ran; then skips in brief: one line per reason
    with its count. (pyproject's addopts reports failures and errors in full, ``-rfE``;
    ``-ra`` would print a line per skipped test, some 800 on the simulator, burying the
    summary. ``-rs`` still lists them.)"""
    common = sys.modules.get(_FUZZ)
    if common is not None and common.COUNTS:
        head, rows = common.summary()
        for line in (head, *rows):
            terminalreporter.write_line(line)
    skipped = terminalreporter.stats.get("skipped", [])
    if not skipped or "s" in config.option.reportchars.replace("A", "s").replace("a", "s"):
        return
    reasons = collections.Counter(skip_reason(r) for r in skipped)
    terminalreporter.section(f"{len(skipped)} skipped, by reason (-rs lists them)", sep="-")
    for reason, n in reasons.most_common():
        terminalreporter.write_line(f"{n:>5}  {reason}")


def skip_reason(report):
    """A skip report's reason, without pytest's "Skipped: " prefix."""
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return text[len("Skipped: "):] if text.startswith("Skipped: ") else text


@pytest.fixture(autouse=True)
def _clean_flags(monkeypatch):
    """Every test starts from the defaults (no env, no rc file) and leaves no assignment, but
    for ``dnn.compile_ahead``, off (in DNNKIT_FLAGS, so that the processes tests start have it
    off too): a cold cache's first compile would start background compile processes, whose
    CUDA contexts and cubins other tests' measures would see (tests/test_compile_ahead.py and
    tests/gpu/test_compile_ahead.py turn it on)."""
    def clean():
        monkeypatch.setenv("DNNKIT_FLAGS", "dnn.compile_ahead=False")
        monkeypatch.setenv("DNNKIT_RC", os.devnull + ".absent")
        config.reset()
        from dnnkit import fastpath
        fastpath.invalidate()      # no memoised call outlives a test's monkeypatching
    clean()
    yield
    clean()


@pytest.fixture
def no_shared_descriptors(monkeypatch):
    """For tests that fake cuDNN's calls: the shared descriptor caches start empty, and the
    fake descriptors made during the test are dropped (their finalizers run while the fakes
    are still in place) before the test's monkeypatches are undone, so no later test is
    handed one."""
    import gc
    from dnnkit.cudnn import descriptors
    descriptors.clear_cached()
    gc.collect()
    yield
    descriptors.clear_cached()
    gc.collect()


@pytest.fixture(scope="session")
def real():
    """The real cuDNN wheel's status (found, versioned; usable only where there is a GPU)."""
    from dnnkit.cudnn import loader
    st = loader.status("")
    assert st.path, f"the cuDNN wheel must be installed for the tests: {st.reason}"
    return st


@pytest.fixture
def rng(request):
    # A fresh stream per test, seeded from its name so failures reproduce.
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


def backend_params():
    """[numba, cudnn] with cudnn skipped where it cannot run."""
    return ["numba", pytest.param("cudnn", marks=pytest.mark.cudnn)]


DTYPES = ["float16", "float32", "float64"]
# max relative error (max|y - ref| / max|ref|) accepted vs the float64 reference
REL_TOL = {"float16": 4e-3, "float32": 2e-6, "float64": 1e-13}
