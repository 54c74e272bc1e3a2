"""Packaging and first contact: the metadata (licence, version, console script, typed marker,
every subpackage shipped, dependency bounds), the subpackages as attributes of a plain
``import dnnkit`` and its cost, the type hints under ``mypy --strict``, and numba-cuda's
kernel argument layout that dnnkit/launch.py packs by hand."""

import importlib.metadata
import importlib.util
import inspect
import json
import math
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import dnnkit

ROOT = Path(__file__).resolve().parents[1]
OWN_BUDGET_S = 0.15         # CPU time of `import dnnkit` beyond `import numpy`'s, bytecode cached


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
    """dnnkit's own share of ``import dnnkit`` under OWN_BUDGET_S of CPU time: in each fresh
    process (bytecode cached in tmp_path: the tree is not written to) NumPy is imported first
    and timed, then dnnkit, so the share excludes NumPy and both are measured on the same
    moment of a busy machine; the best of five processes. CPU time, not wall time: a busy
    machine slows the wall clock, not the work. (NumPy alone takes 0.17-0.23 s of CPU on the
    2-core CI machine, 0.1 on a quiet one; its time is printed, not judged.)"""
    env = _child_env(PYTHONPYCACHEPREFIX=str(tmp_path))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    code = "import time; t0 = time.process_time(); import numpy; t1 = time.process_time(); " \
           "import dnnkit; print(t1 - t0, time.process_time() - t1)"
    runs = []
    for _ in range(6):                  # the first run compiles and caches the bytecode
        r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                           text=True, timeout=300, env=env)
        assert r.returncode == 0, r.stderr
        runs.append(tuple(map(float, r.stdout.strip().splitlines()[-1].split())))
    own_s = min(own for _, own in runs[1:])
    assert own_s < OWN_BUDGET_S, (f"import dnnkit took {own_s:.3f} s of CPU beyond NumPy's "
                                  f"(budget {OWN_BUDGET_S}); (NumPy, dnnkit) per run: {runs[1:]}")


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

_CNN = '''
"""A user's small CNN: layers, a training loop, a functional call, no_grad, a checkpoint."""
from pathlib import Path

import numpy as np
import numpy.typing as npt

import dnnkit
from dnnkit import nn, optim

Batch = tuple[dnnkit.Tensor, npt.NDArray[np.int64]]


class Net(nn.Module):
    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 4, 3, padding=1, seed=0), nn.BatchNorm2d(4), nn.ReLU(),
            nn.MaxPool2d(2), nn.Flatten())
        self.classifier = nn.Linear(4 * 2 * 2, classes, seed=1)

    def forward(self, x: dnnkit.Tensor) -> dnnkit.Tensor:
        features: dnnkit.Tensor = self.features(x)
        return self.classifier(features)


def batches(n: int, rng: np.random.Generator) -> list[Batch]:
    out = []
    for _ in range(n):
        x = rng.standard_normal((2, 3, 4, 4)).astype(np.float32)
        out.append((dnnkit.tensor(x), rng.integers(0, 10, 2)))
    return out


def train(model: Net, steps: int, path: Path) -> float:
    criterion = nn.CrossEntropyLoss()
    opt = optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model.train()
    total = 0.0
    for x, labels in batches(steps, np.random.default_rng(0)):
        opt.zero_grad()
        loss = criterion(model(x), labels)
        loss.backward()
        opt.step()
        total += loss.item()
    model.eval()
    with dnnkit.no_grad():
        logits = model(dnnkit.tensor(np.zeros((1, 3, 4, 4), np.float32)))
        assert logits.shape == (1, 10) and not logits.requires_grad
    saved: str = model.save(path)
    state: dict[str, npt.NDArray[np.generic]] = model.state_dict()
    twin = Net().load_state_dict(state).load(saved).eval()
    assert twin.classifier.out_features == 10
    return total / steps


def functional() -> tuple[int, ...]:
    x = np.ones((1, 3, 4, 4), np.float32)
    w = np.ones((2, 3, 3, 3), np.float32)
    y = dnnkit.conv2d(x, w, stride=1, padding="half", backend="numba")
    host: npt.NDArray[np.float32] = y.copy_to_host()
    return host.shape
'''

_MISTAKES = '''
import numpy as np
import dnnkit

x = np.ones((2, 3), np.float32)
dnnkit.softmax(x, backend="cuda")
dnnkit.conv2dd(x, x)
t: dnnkit.Tensor = dnnkit.tensor(x)
t.backward(retain_graph="yes")
dnnkit.conv2d(x, x, stride=1.5)
layer = dnnkit.nn.Linear(3, 2)
layer("x")
dnnkit.nn.Conv2d(3, 8, kernel_size="3")
dnnkit.optim.SGD(layer.parameters(), lr="0.1")
'''


def test_mypy_strict_on_a_user_script(tmp_path):
    """The shipped hints (py.typed) type-check user scripts under ``mypy --strict`` -- a
    functional training step (user.py) and a small CNN with dnnkit.nn, SGD, no_grad and a
    checkpoint (cnn.py) -- and catch their mistakes: a backend that does not exist, a misspelt
    op, a wrong argument type to an op, a layer's forward, a layer's constructor or an
    optimizer. dnnkit is read from this checkout (MYPYPATH) with its own modules' findings
    silenced (--follow-imports=silent), as mypy treats an installed package."""
    pytest.importorskip("mypy", reason="mypy is not installed (pip install -e '.[test]')")
    (tmp_path / "user.py").write_text(textwrap.dedent(_USER))
    (tmp_path / "cnn.py").write_text(_CNN)
    (tmp_path / "mistakes.py").write_text(textwrap.dedent(_MISTAKES))
    r = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent",
                        "--no-incremental", "--cache-dir", str(tmp_path / "cache"),
                        "user.py", "cnn.py", "mistakes.py"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=600, env=_child_env(MYPYPATH=str(ROOT)))
    errors = [ln for ln in r.stdout.splitlines() if ": error: " in ln]
    assert not [e for e in errors if e.startswith(("user.py", "cnn.py"))], r.stdout
    found = {int(e.split(":")[1]) for e in errors if e.startswith("mistakes.py")}
    assert found == {6, 7, 9, 10, 12, 13, 14}, r.stdout + r.stderr
    assert 'incompatible type "Literal[\'cuda\']"' in r.stdout
    assert 'Module has no attribute "conv2dd"' in r.stdout
    assert 'Argument 1 to "forward" of "Linear" has incompatible type "str"' in r.stdout


def test_the_typed_cnn_script_runs(tmp_path):
    """The script mypy checks above is a working program: one training step, an eval under
    no_grad, a checkpoint saved and loaded into a second model, a functional convolution."""
    (tmp_path / "cnn.py").write_text(_CNN)
    spec = importlib.util.spec_from_file_location("typed_cnn", tmp_path / "cnn.py")
    cnn = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cnn)
    loss = cnn.train(cnn.Net(), 1, tmp_path / "net.npz")
    assert math.isfinite(loss) and loss > 0
    assert (tmp_path / "net.npz").is_file()
    assert cnn.functional() == (1, 2, 4, 4)


def test_every_public_op_takes_backend_in_its_typed_signature():
    """A type checker reads a public op's parameters from its checking body (dnnkit/hints.py
    PublicOp: a ParamSpec cannot add a keyword), so the body itself declares ``backend``: one
    that does not makes ``op(..., backend="numba")`` a type error in user code."""
    names = set(dnnkit.ops.__all__) | {"split"}
    missing = sorted(n for n in names if inspect.isfunction(getattr(dnnkit, n)) and "backend"
                     not in inspect.signature(inspect.unwrap(getattr(dnnkit, n))).parameters)
    assert not missing, f"checking bodies without backend: {missing}"


def test_the_nn_names_are_exported():
    """``from dnnkit.nn import X`` under --strict needs X in dnnkit.nn.__all__: every public
    name of the package is listed."""
    import types
    from dnnkit import nn
    public = {n for n in dir(nn) if not n.startswith("_")
              and not isinstance(getattr(nn, n), types.ModuleType)}
    assert set(nn.__all__) == public, (set(nn.__all__) ^ public)


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


packer = launch._Launcher("kern", argtypes, lambda: 0)
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
