"""Faults: cuDNN absent, broken, foreign, too old, or found without a GPU.

For each case, with the real cuDNN wheel and real library files (copies and symlinks in a temp
folder, never mock objects):
- under auto an op runs on Numba, and the reason is logged once at INFO on the ``dnnkit``
  logger over several calls, with nothing written to stdout;
- under forced the op raises CudnnUnavailableError whose message carries the reason;
- the process never aborts. Cases whose folder holds a real but incomplete cuDNN (a call into
  it would abort the process) and the "absent" case (it needs another sys.prefix) run in a
  child process that reports back through a JSON file.
"""

import json
import logging
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import dnnkit
from dnnkit import config, policy
from dnnkit.cudnn import loader
from dnnkit.errors import CudnnUnavailableError
from tests.conftest import HAVE_DRIVER

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
X = np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)
CALLS = 3


def _conv_inputs():
    x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    w = np.ones((1, 1, 3, 3), np.float32)
    # valid 3x3 box sums of x
    want = np.array([[[[45, 54], [81, 90]]]], np.float32)
    return x, w, want


def _libc_path():
    """The C library this process runs on (a real ELF shared object that is not cuDNN)."""
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1]
            if os.path.basename(path).startswith("libc.so") or \
                    os.path.basename(path).startswith("libc-"):
                return path
    pytest.skip("no libc.so in /proc/self/maps")


def _libz_path():
    for d in ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64",
              "/lib", "/usr/lib"):
        p = os.path.join(d, "libz.so.1")
        if os.path.exists(p):
            return os.path.realpath(p)
    pytest.skip("no libz.so.1 on this machine")


def _link_cudnn_folder(real, dest, *, main=None, skip=()):
    """A folder like the wheel's: symlinks to the real sub-libraries (they are hundreds of MB)
    and, as libcudnn.so.9, a *copy* of ``main`` (default the real one), so that the folder
    that cuDNN's loader resolves is ``dest``. ``skip``: names left out."""
    src = os.path.dirname(real.path)
    for name in os.listdir(src):
        if name != loader.MAIN_NAME and name not in skip:
            os.symlink(os.path.join(src, name), dest / name)
    if loader.MAIN_NAME not in skip:
        shutil.copy(main or real.path, dest / loader.MAIN_NAME)
    return dest


# ------------------------------------------------------------- the in-process checks

def _check(library_path, expect, caplog, capfd):
    """auto: Numba, one INFO line naming ``expect``, nothing on stdout; forced: the error."""
    config.set("dnn.library_path", library_path)
    policy.announced.clear()     # "once" is per process: start this case afresh
    capfd.readouterr()
    x, w, want = _conv_inputs()
    with caplog.at_level(logging.INFO, logger="dnnkit"), dnnkit.trace() as t:
        for _ in range(CALLS):
            assert np.array_equal(dnnkit.relu(X).copy_to_host(), np.maximum(X, 0))
        assert np.allclose(dnnkit.conv2d(x, w).copy_to_host(), want)
    assert t.backends() == ["numba"] * (CALLS + 1)
    infos = [r.getMessage() for r in caplog.records
             if r.name == "dnnkit" and r.levelno >= logging.INFO]
    assert len(infos) == 1, infos
    assert infos[0].startswith("cuDNN not used (") and expect in infos[0]
    assert capfd.readouterr().out == ""

    config.set("dnn.enabled", "forced")
    for call in (lambda: dnnkit.relu(X), lambda: dnnkit.conv2d(x, w)):
        with pytest.raises(CudnnUnavailableError) as ei:
            call()
        assert "cuDNN is required (dnn.enabled=forced) but cannot be used" in str(ei.value)
        assert expect in str(ei.value) and expect in ei.value.reason
    assert capfd.readouterr().out == ""
    return loader.status(library_path)


def test_explicit_path_that_does_not_exist(tmp_path, caplog, capfd):
    st = _check(str(tmp_path / "nowhere" / "libcudnn.so.9"), "does not exist", caplog, capfd)
    assert st.path is None


def test_explicit_path_is_an_empty_folder(tmp_path, caplog, capfd):
    _check(str(tmp_path), "is a folder without libcudnn.so.9", caplog, capfd)


def test_explicit_folder_whose_libcudnn_is_a_directory(tmp_path, caplog, capfd):
    (tmp_path / "libcudnn.so.9").mkdir()
    _check(str(tmp_path), "is a folder without libcudnn.so.9", caplog, capfd)


def test_explicit_path_is_a_copy_of_libz(tmp_path, caplog, capfd):
    shutil.copy(_libz_path(), tmp_path / "libz.so.1")
    st = _check(str(tmp_path / "libz.so.1"), "not a cuDNN library", caplog, capfd)
    assert "soname libz.so.1" in st.reason and st.version is None


def test_explicit_path_is_libc(caplog, capfd):
    path = _libc_path()
    st = _check(path, f"not a cuDNN library: {path} has soname libc.so", caplog, capfd)
    assert st.version is None


def test_libz_named_libcudnn_beside_the_real_sub_libraries(real, tmp_path, caplog, capfd):
    """The folder looks complete, but its libcudnn.so.9 is libz: identified by its soname
    before it is loaded (loading it would fail later, with an AttributeError)."""
    _link_cudnn_folder(real, tmp_path, main=_libz_path())
    st = _check(str(tmp_path), "not a cuDNN library", caplog, capfd)
    assert "soname libz.so.1, expected libcudnn.so.9" in st.reason


def test_a_sub_library_named_by_path(real, caplog, capfd):
    """A real cuDNN 9 file that is not libcudnn.so.9: it answers cudnnGetVersion (through
    libcudnn_graph) but lacks most of the API; refused by its soname, never called."""
    path = os.path.join(os.path.dirname(real.path), "libcudnn_ops.so.9")
    st = _check(path, "is the sub-library libcudnn_ops.so.9", caplog, capfd)
    assert st.version is None


@pytest.mark.skipif(HAVE_DRIVER, reason="this machine has a CUDA driver")
def test_found_but_no_gpu(real, caplog, capfd):
    st = _check("", "no CUDA device (cudnnCreate returned CUDNN_STATUS_NOT_INITIALIZED)",
                caplog, capfd)
    assert st.path == real.path and st.version == real.version


# --------------------------------------------------------------------- "older than 9"
#
# No cuDNN 8 is installed here (nor can the wheel's file be made older). A cuDNN 8 library is
# refused in two places, both shown below: by its soname (libcudnn.so.8) before it is loaded
# -- cuDNN 8's sub-libraries have other names, so the sub-library check would report the wrong
# thing -- and, should a file with cuDNN 9's soname answer an older cudnnGetVersion, by the
# number (cuDNN 8 encodes 8.9.6 as 8906, cuDNN 9 encodes 9.19.0 as 91900). The file's identity
# comes from its contents, not its name: the real library copied under cuDNN 8's file name is
# still recognised as cuDNN 9.

def test_cudnn_8_soname_is_too_old():
    why = loader.identity_problem("/opt/cudnn8/libcudnn.so.8", "libcudnn.so.8")
    assert why == ("too old: /opt/cudnn8/libcudnn.so.8 is cuDNN 8 (soname libcudnn.so.8); "
                   "cuDNN >= 9 is required")
    assert loader.identity_problem("/x/libcudnn.so.9", "libcudnn.so.9") is None


@pytest.mark.parametrize("version,text", [(8906, "8.9.6"), (7605, "7.6.5"), (8000, "8.0.0")])
def test_cudnn_8_version_number_is_too_old(version, text):
    assert loader.version_string(version) == text
    assert loader.version_problem(version) == f"too old: cuDNN {text}; cuDNN >= 9 is required"


def test_version_rule_accepts_the_real_library(real):
    assert loader.version_problem(real.version) is None
    assert loader.soname(real.path) == "libcudnn.so.9"
    assert real.version_string == loader.version_string(real.version)


def test_real_library_under_cudnn_8_file_name_is_still_cudnn_9(real, tmp_path):
    _link_cudnn_folder(real, tmp_path)
    os.rename(tmp_path / "libcudnn.so.9", tmp_path / "libcudnn.so.8")
    r = _child(tmp_path, "status", library_path=str(tmp_path / "libcudnn.so.8"))
    assert r["version"] == real.version and "too old" not in r["reason"]


# ------------------------------------------------------ in a child process

CHILD = textwrap.dedent("""
    import json, logging, sys
    import numpy as np
    import dnnkit
    from dnnkit import config
    from dnnkit.cudnn import loader

    records = []
    class Keep(logging.Handler):
        def emit(self, record):
            records.append((record.levelno, record.getMessage()))
    log = logging.getLogger("dnnkit")
    log.addHandler(Keep())
    log.setLevel(logging.INFO)

    report = {}
    st = loader.status()
    report.update(version=st.version, reason=st.reason, path=st.path)
    if sys.argv[2] == "ops":
        X = np.linspace(-2, 2, 12, dtype=np.float32)
        with dnnkit.trace() as t:
            for _ in range(3):
                ok = np.array_equal(dnnkit.relu(X).copy_to_host(), np.maximum(X, 0))
                report["relu_ok"] = report.get("relu_ok", True) and ok
            x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
            y = dnnkit.conv2d(x, np.ones((1, 1, 3, 3), np.float32)).copy_to_host()
            report["conv_ok"] = bool(np.allclose(y, [[[[45, 54], [81, 90]]]]))
        report["backends"] = t.backends()
        report["info"] = [m for lvl, m in records if lvl >= logging.INFO]
        config.set("dnn.enabled", "forced")
        try:
            dnnkit.relu(X)
        except dnnkit.CudnnUnavailableError as e:
            report["forced"] = [type(e).__name__, str(e), e.reason]
    with open(sys.argv[1], "w") as f:
        json.dump(report, f)
""")


def _child(tmp_path, what, *, library_path="", env=None, python=sys.executable):
    out = tmp_path / f"report-{what}.json"
    flags = "dnn.enabled=auto" + (f",dnn.library_path={library_path}" if library_path else "")
    e = dict(os.environ if env is None else env, DNNKIT_FLAGS=flags)
    r = subprocess.run([python, "-c", CHILD, str(out), what], capture_output=True, text=True,
                       env=e, timeout=300, cwd=REPO)
    assert r.returncode == 0, f"child exited with {r.returncode} (an abort is -6):\n{r.stderr}"
    assert r.stdout == "", "nothing may be printed to stdout"
    return json.loads(out.read_text())


def _check_child(report, expect):
    assert report["relu_ok"] and report["conv_ok"]
    assert report["backends"] == ["numba"] * 4
    assert len(report["info"]) == 1, report["info"]
    assert report["info"][0].startswith("cuDNN not used (") and expect in report["info"][0]
    name, message, reason = report["forced"]
    assert name == "CudnnUnavailableError"
    assert message.startswith("activation: cuDNN is required (dnn.enabled=forced) but cannot be "
                              "used: ") and expect in message and expect in reason


def test_folder_with_only_libcudnn_so_9(real, tmp_path):
    """The real main library without its sub-libraries: any call into it would abort the
    process ("Invalid handle. Cannot load symbol cudnnGetVersion", SIGABRT), so none is made."""
    shutil.copy(real.path, tmp_path / loader.MAIN_NAME)
    report = _child(tmp_path, "ops", library_path=str(tmp_path))
    _check_child(report, "sub-library missing: libcudnn_graph.so.9, libcudnn_ops.so.9")
    assert report["version"] is None        # not even cudnnGetVersion was called


def test_folder_without_libcudnn_graph(real, tmp_path):
    """Only libcudnn_graph.so.9 missing (the one cudnnGetVersion itself needs)."""
    _link_cudnn_folder(real, tmp_path, skip=("libcudnn_graph.so.9",))
    report = _child(tmp_path, "ops", library_path=str(tmp_path))
    _check_child(report, "sub-library missing: libcudnn_graph.so.9 not beside")


def _site_without_cudnn(tmp_path):
    """A Python environment that sees every installed package except the cuDNN wheel: a venv
    (its own sys.prefix, so cuda.pathfinder searches its empty site-packages) whose .pth file
    adds, as a site folder (its .pth files run: numba-cuda installs itself through one), a
    folder of symlinks to the real site-packages' entries minus nvidia/cudnn."""
    import site
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    farm = tmp_path / "site"
    (farm / "nvidia").mkdir(parents=True)
    for sp in site.getsitepackages():   # this venv's first: its editable dnnkit finder wins
        if not os.path.isdir(sp):
            continue
        for name in os.listdir(sp):
            if name == "nvidia":
                for sub in os.listdir(os.path.join(sp, name)):
                    if sub != "cudnn" and not (farm / "nvidia" / sub).exists():
                        os.symlink(os.path.join(sp, name, sub), farm / "nvidia" / sub)
            elif not (farm / name).exists():   # the first wins, as on sys.path
                os.symlink(os.path.join(sp, name), farm / name)
    (pth,) = venv.glob("lib/python*/site-packages")
    (pth / "without_cudnn.pth").write_text(f"import site; site.addsitedir({str(farm)!r})\n")
    env = {k: v for k, v in os.environ.items()
           if k not in ("CONDA_PREFIX", "CUDA_HOME", "CUDA_PATH", "LD_LIBRARY_PATH",
                        "VIRTUAL_ENV", "PYTHONHOME")}
    env.update(PYTHONPATH=REPO, PYTHONNOUSERSITE="1")
    return str(venv / "bin" / "python"), env


def test_cudnn_absent(tmp_path):
    python, env = _site_without_cudnn(tmp_path)
    report = _child(tmp_path, "ops", env=env, python=python)
    if report["path"]:
        pytest.skip(f"another cuDNN is installed on this machine: {report['path']}")
    _check_child(report, "library not found: no cuDNN 9 in pip wheels")
