"""Packaging and first contact: the metadata (licence, version, console script, typed marker,
every subpackage shipped, dependency bounds), the subpackages as attributes of a plain
``import dnnkit`` and its cost, the type hints under ``mypy --strict``, and numba-cuda's
kernel argument layout that dnnkit/launch.py packs by hand."""

import importlib.metadata
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import dnnkit

ROOT = Path(__file__).resolve().parents[1]
IMPORT_BUDGET_S = 0.3       # CPU time of `import dnnkit` (NumPy included), bytecode cached


def _pyproject():
    try:
        import tomllib
    except ImportError:                      # Python 3.10
        tomllib = pytest.importorskip("tomli", reason="reading pyproject.toml needs tomllib "
                                      "(Python >= 3.11) or tomli")
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _bounds(requirement):
    """(lower, upper) version tuples of a ``name>=a,<b`` requirement."""
    lo = re.search(r">=\s*([\d.]+)", requirement)
    hi = re.search(r"<\s*([\d.]+)", requirement)
    as_tuple = lambda m: tuple(int(v) for v in m.group(1).split("."))  # noqa: E731
    return as_tuple(lo), as_tuple(hi)


def _child_env(**extra):
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env.update(extra)
    return env


# ---------------------------------------------------------------- metadata

def test_license_file_matches_the_metadata():
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("BSD 3-Clause License") and "dnnkit authors" in text
    assert "Neither the name of the copyright holder" in text       # clause 3
    assert _pyproject()["project"]["license"] == {"text": "BSD-3-Clause"}


def test_version_is_one_number():
    assert _pyproject()["project"]["version"] == dnnkit.__version__


def test_console_script_and_typed_marker():
    meta = _pyproject()
    assert meta["project"]["scripts"] == {"dnnkit": "dnnkit.__main__:cli"}
    module, _, attr = meta["project"]["scripts"]["dnnkit"].partition(":")
    assert callable(getattr(importlib.import_module(module), attr))
    assert "py.typed" in meta["tool"]["setuptools"]["package-data"]["dnnkit"]
    assert (ROOT / "dnnkit" / "py.typed").is_file()


def test_every_subpackage_is_shipped():
    """A package folder missing from [tool.setuptools] packages would be absent from a wheel
    (only an editable install would find it)."""
    found = {"dnnkit." + ".".join(p.parent.relative_to(ROOT / "dnnkit").parts)
             for p in (ROOT / "dnnkit").rglob("__init__.py")
             if "__pycache__" not in p.parts and p.parent != ROOT / "dnnkit"}
    found |= {"dnnkit", "dnnkit.kernels"}
    declared = set(_pyproject()["tool"]["setuptools"]["packages"])
    assert declared == found, f"missing {found - declared}, stale {declared - found}"
    assert _pyproject()["tool"]["setuptools"]["package-dir"] == {"dnnkit.kernels": "kernels"}


def test_dependencies_declare_llvmlite_and_bound_numba_cuda():
    meta = _pyproject()["project"]
    deps = meta["dependencies"]
    assert "llvmlite" in [re.split(r"[<>=\[ ]", d)[0] for d in deps]   # kernels/tensorcore.py
    (numba_cuda,) = [d for d in deps if d.startswith("numba-cuda")]
    lo, hi = _bounds(numba_cuda)
    for extra in ("cu12", "cu13"):
        (req,) = [d for d in meta["optional-dependencies"][extra] if d.startswith("numba-cuda")]
        assert _bounds(req) == (lo, hi), f"[{extra}] bounds numba-cuda differently: {req}"
    installed = tuple(int(v) for v in
                      importlib.metadata.version("numba-cuda").split(".")[:len(lo)])
    assert lo <= installed < hi, f"numba-cuda {installed} is outside {numba_cuda}"
    assert "mypy" in " ".join(meta["optional-dependencies"]["test"])


# ---------------------------------------------------------------- import dnnkit

_ATTRS = """
import json, sys
import dnnkit
lazy = [m for m in sys.modules if m.split(".")[0] == "numba"
        or m in ("dnnkit.nn", "dnnkit.optim", "dnnkit.models", "dnnkit.testing")]
listed = [n for n in dnnkit._SUBMODULES if n in dir(dnnkit)] == list(dnnkit._SUBMODULES)
imported = all(getattr(dnnkit, n).__name__ == f"dnnkit.{n}" for n in dnnkit._SUBMODULES)
conv, sgd = dnnkit.nn.Conv2d, dnnkit.optim.SGD
same = dnnkit.nn is sys.modules["dnnkit.nn"] and dnnkit.testing is sys.modules["dnnkit.testing"]
try:
    dnnkit.no_such_name
    missing = None
except AttributeError as e:
    missing = str(e)
print(json.dumps(dict(lazy=lazy, listed=listed and imported, conv=conv.__name__,
                      sgd=sgd.__name__,
                      same=same, models=hasattr(dnnkit, "models"), missing=missing)))
"""


def test_subpackages_are_attributes_loaded_on_first_use():
    """``import dnnkit; dnnkit.nn.Conv2d`` (docs/migration.md writes it so) works without
    importing nn, optim, models, testing or Numba at ``import dnnkit``."""
    r = subprocess.run([sys.executable, "-c", _ATTRS], cwd=ROOT, capture_output=True,
                       text=True, timeout=300, env=_child_env())
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["lazy"] == [], f"import dnnkit loaded {got['lazy']}"
    assert got["listed"], "dir(dnnkit) lacks a subpackage, or one does not import"
    assert (got["conv"], got["sgd"]) == ("Conv2d", "SGD") and got["same"] and got["models"]
    assert got["missing"] == "module 'dnnkit' has no attribute 'no_such_name'"


def test_import_dnnkit_is_fast(tmp_path):
    """``import dnnkit`` (NumPy included) under IMPORT_BUDGET_S of CPU time, the best of three
    fresh processes with bytecode cached (in tmp_path: the tree is not written to). CPU time,
    not wall time: a busy machine slows the wall clock, not the work."""
    env = _child_env(PYTHONPYCACHEPREFIX=str(tmp_path))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    code = "import time; t = time.process_time(); import dnnkit; print(time.process_time() - t)"
    times = []
    for _ in range(4):                   # the first run compiles and caches the bytecode
        r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                           text=True, timeout=300, env=env)
        assert r.returncode == 0, r.stderr
        times.append(float(r.stdout.strip().splitlines()[-1]))
    assert min(times[1:]) < IMPORT_BUDGET_S, f"import dnnkit took {times[1:]} s of CPU"


# ---------------------------------------------------------------- type hints

_USER = '''
"""A user's training step."""
import numpy as np
import numpy.typing as npt

import dnnkit


def forward(x: npt.NDArray[np.float32], w: npt.NDArray[np.float32]) -> dnnkit.Tensor:
    t = dnnkit.tensor(x, requires_grad=True)
    y = dnnkit.conv2d(t, w, padding="half", backend="numba")
    y = dnnkit.pool2d(dnnkit.activation(y, "relu", backend="auto"), 2, mode="max")
    loss: dnnkit.Tensor = dnnkit.mean(y * 2.0 - 1.0, backend=None)
    return loss


def train(x: npt.NDArray[np.float32], w: npt.NDArray[np.float32]) -> float:
    loss = forward(x, w)
    loss.backward()
    with dnnkit.no_grad():
        probe = dnnkit.softmax(dnnkit.tensor(x).reshape(x.shape[0], -1), backend="cudnn")
    shape: tuple[int, ...] = probe.shape
    print(shape, dnnkit.select_backend("softmax", x.reshape(2, -1), explain=True))
    try:
        dnnkit.dropout(x, 0.5, seed=1)
    except dnnkit.CudnnUnavailableError as e:
        print(e.reason)
    print(dnnkit.nn, dnnkit.__version__)
    return float(loss.item())
'''

_MISTAKES = '''
import numpy as np
import dnnkit

x = np.ones((2, 3), np.float32)
dnnkit.softmax(x, backend="cuda")
dnnkit.conv2dd(x, x)
t: dnnkit.Tensor = dnnkit.tensor(x)
t.backward(retain_graph="yes")
'''


def test_mypy_strict_on_a_user_script(tmp_path):
    """The shipped hints (py.typed) type-check a user script under ``mypy --strict``, and catch
    its mistakes: a backend that does not exist, a misspelt op, a wrong argument type. dnnkit
    is read from this checkout (MYPYPATH) with its own modules' findings silenced
    (--follow-imports=silent), as mypy treats an installed package."""
    pytest.importorskip("mypy", reason="mypy is not installed (pip install -e '.[test]')")
    (tmp_path / "user.py").write_text(textwrap.dedent(_USER))
    (tmp_path / "mistakes.py").write_text(textwrap.dedent(_MISTAKES))
    r = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent",
                        "--no-incremental", "--cache-dir", str(tmp_path / "cache"),
                        "user.py", "mistakes.py"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=600, env=_child_env(MYPYPATH=str(ROOT)))
    errors = [ln for ln in r.stdout.splitlines() if ": error: " in ln]
    assert not [e for e in errors if e.startswith("user.py")], r.stdout
    found = {int(e.split(":")[1]) for e in errors if e.startswith("mistakes.py")}
    assert found == {6, 7, 9}, r.stdout + r.stderr
    assert 'incompatible type "Literal[\'cuda\']"' in r.stdout
    assert 'Module has no attribute "conv2dd"' in r.stdout


# ---------------------------------------------------------------- numba-cuda's argument layout

_LAYOUT = r"""
import ctypes, json, re, struct
import numpy as np
from numba import cuda
from numba.cuda import args as nargs, types
from numba.cuda.cudadrv.devicearray import DeviceNDArray
from numba.cuda.descriptor import cuda_target
from numba.cuda.dispatcher import _Kernel
from dnnkit import launch

out = {}
models = cuda_target.target_context.data_model_manager
out["members"] = [list(models[types.Array(types.float32, nd, "C")]._fields) for nd in (1, 2, 3)]

argtypes = (types.float32[::1], types.float64[:, ::1], types.UniTuple(types.int64, 3),
            types.Tuple((types.int32, types.float32, types.uint64)), types.int32,
            types.float32, types.float64, types.int64, types.float16[:, :, ::1])


def kern(a, b, t, u, i, f, d, q, h):
    pass


# the kernel's C parameters as compiled (no GPU needed): their widths in bytes. Compiling needs
# NVVM and NVRTC (the CUDA wheels of the cu12/cu13 extra): where a trivial kernel cannot be
# compiled, that is the install, not the layout
try:
    cuda.compile_ptx(lambda a: None, (types.float32[::1],), cc=(9, 0))
except Exception as e:
    why = " ".join(str(e).split())[:200]
    print(json.dumps({"skip": f"no CUDA compiler here ({type(e).__name__}: {why})"}))
    raise SystemExit(0)
ptx, _ = cuda.compile_ptx(kern, argtypes, cc=(9, 0))
entry = ptx[ptx.index(".entry"):]
entry = entry[:entry.index(")")]
out["ptx"] = [int(m.group(1)) // 8 for m in re.finditer(r"\.param\s+\.[a-z](\d+)\s", entry)]
plan = "".join(launch._plan(t, "v")[0] for t in argtypes)
out["plan"] = [struct.calcsize(c) for c in plan]


class Memory:          # device memory at a made-up address: nothing reads it
    def __init__(self, ptr):
        self.device_ctypes_pointer = ctypes.c_void_p(ptr)


def device(shape, dtype, ptr):
    dtype = np.dtype(dtype)
    return DeviceNDArray(shape, np.empty(shape, dtype).strides, dtype, gpu_data=Memory(ptr))


values = (device((10,), "float32", 0x1000), device((3, 4), "float64", 0x2000), (5, 6, 7),
          (-3, 1.5, 2**40), 9, 2.5, -1.25, 2**35, device((2, 3, 4), "float16", 0x3000))


class Kernel:          # numba-cuda's own marshalling of a launch's arguments
    extensions = []
    _prepare_args = _Kernel._prepare_args


numba_args = []
for t, v in zip(argtypes, values):
    hint = nargs.Out(v) if isinstance(t, types.Array) else v
    Kernel()._prepare_args(t, hint, 0, [], numba_args)
out["numba"] = [getattr(a, "value", a) for a in numba_args]


class Overload:
    entry_name = "kern"


packer = launch._Launcher(Overload, argtypes)
buf = packer._buffer()[0]
packer.pack(values)
out["dnnkit"] = list(struct.unpack_from(packer.format, buf))
print(json.dumps(out))
"""


def test_launch_packs_kernel_arguments_as_numba_cuda_does():
    """dnnkit/launch.py's fast path packs a kernel's parameters itself (an array as meminfo,
    parent, nitems, itemsize, data, shape..., strides...; tuples flattened; scalars by type)
    and calls cuLaunchKernel. Checked against the installed numba-cuda without a GPU: its data
    model of an array, the parameter widths of a compiled kernel's PTX, and the values its own
    launch marshals for the same arguments. A failure here means numba-cuda changed the
    layout: fix launch._plan/_arr before raising the numba-cuda bound in pyproject.toml."""
    r = subprocess.run([sys.executable, "-c", _LAYOUT], cwd=ROOT, capture_output=True,
                       text=True, timeout=600, env=_child_env())
    assert r.returncode == 0, ("numba-cuda's internals that dnnkit/launch.py mirrors moved: "
                               + r.stderr[-3000:])
    got = json.loads(r.stdout.strip().splitlines()[-1])
    if "skip" in got:
        pytest.skip(f"{got['skip']}: install the cu12 or cu13 extra to check the layout")
    fields = ["meminfo", "parent", "nitems", "itemsize", "data", "shape", "strides"]
    assert got["members"] == [fields] * 3
    assert got["ptx"] == got["plan"], "parameter widths: PTX vs launch._plan"
    assert got["numba"] == got["dnnkit"], "parameter values: numba-cuda vs launch._Launcher"
    # arrays of 1, 2 and 3 dims: 5 + 2 * ndim each; two 3-tuples; four scalars
    assert len(got["dnnkit"]) == 7 + 9 + 11 + 3 + 3 + 4


# ---------------------------------------------------------------- the test suite's summary

_SKIPPING = '''
import pytest

@pytest.mark.parametrize("i", range(3))
def test_a(i):
    pytest.skip("reason A")

def test_b():
    pytest.skip("reason B")

def test_c():
    pass
'''


def test_skips_are_summarised_one_line_per_reason(tmp_path):
    """pyproject's addopts (-rfE) and tests/conftest.py's summary: one line per skip reason
    with its count instead of a line per skipped test."""
    (tmp_path / "test_skipping.py").write_text(_SKIPPING)
    r = subprocess.run([sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"),
                        "--rootdir", str(ROOT), "-p", "tests.conftest", "-p",
                        "no:cacheprovider", "-q", str(tmp_path / "test_skipping.py")],
                       cwd=ROOT, capture_output=True, text=True, timeout=300, env=_child_env())
    assert r.returncode == 0, r.stdout + r.stderr
    assert "4 skipped, by reason (-rs lists them)" in r.stdout
    assert re.search(r"^\s+3  reason A$", r.stdout, re.M) and \
        re.search(r"^\s+1  reason B$", r.stdout, re.M), r.stdout
    assert "SKIPPED [" not in r.stdout and "1 passed, 4 skipped" in r.stdout
