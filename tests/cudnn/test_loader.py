"""Discovery and failure modes with the real cuDNN 9 wheel (nvidia-cudnn-cu12/cu13), no mocks."""

import os
import shutil
import subprocess
import sys

import pytest

from dnnkit.cudnn import loader
from tests.conftest import HAVE_DRIVER



def test_wheel_is_found_and_versioned(real):
    # PyTorch preloads the nvidia-* wheels' libraries when it is imported: where a test module
    # imported it first, cuda-pathfinder finds this libcudnn loaded already and says so
    allowed = {"site-packages"} | ({"was-already-loaded-from-elsewhere"} if "torch" in
                                   sys.modules else set())
    assert real.found_via in allowed, real.found_via
    assert os.path.basename(real.path) == "libcudnn.so.9"
    assert real.version >= 90000 and real.version_string.startswith("9.")


@pytest.mark.skipif(HAVE_DRIVER, reason="this machine has a CUDA driver")
def test_no_device_reason_comes_from_cudnnCreate(real):
    assert not real.available
    assert real.reason == "no CUDA device (cudnnCreate returned CUDNN_STATUS_NOT_INITIALIZED)"
    assert f"found cuDNN {real.version_string} at {real.path}" in real.describe()


def test_explicit_file_path(real):
    st = loader.status(real.path)
    assert (st.path, st.found_via, st.version) == (real.path, "dnn.library_path", real.version)
    assert st.available == real.available


def test_empty_folder(tmp_path):
    st = loader.status(str(tmp_path))
    assert not st.available and st.path is None
    assert st.reason.startswith("library not found") and "without libcudnn.so.9" in st.reason


def test_missing_path(tmp_path):
    st = loader.status(str(tmp_path / "nowhere"))
    assert not st.available and "does not exist" in st.reason


def _partial_copy(real, dest, keep):
    src = os.path.dirname(real.path)
    for name in keep:
        shutil.copy(os.path.join(src, name), dest / name)


def test_folder_with_only_the_main_library(real, tmp_path):
    _partial_copy(real, tmp_path, ["libcudnn.so.9"])
    st = loader.status(str(tmp_path))
    assert not st.available and st.version is None  # no cuDNN call was made
    assert st.reason.startswith("sub-library missing: " + ", ".join(loader.SUBLIBRARIES)
                                + " not beside")


def test_folder_missing_one_sub_library(real, tmp_path):
    src = os.path.dirname(real.path)
    _partial_copy(real, tmp_path, ["libcudnn.so.9"])  # a copy, so its real folder is tmp_path
    for name in os.listdir(src):
        if name not in ("libcudnn_adv.so.9", "libcudnn.so.9"):
            os.symlink(os.path.join(src, name), tmp_path / name)
    st = loader.status(str(tmp_path))
    assert st.reason.startswith("sub-library missing: libcudnn_adv.so.9 not beside")


def _run(code, **env):
    e = dict(os.environ, **env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e,
                          timeout=300)


_MAPS = "open('/proc/self/maps').read().count('libcudnn')"


def test_forced_with_a_broken_folder_raises_and_does_not_abort(real, tmp_path):
    _partial_copy(real, tmp_path, ["libcudnn.so.9"])
    code = ("import dnnkit, numpy as np\n"
            "try:\n    dnnkit.relu(np.ones(3, np.float32))\n"
            "except dnnkit.CudnnUnavailableError as e:\n    print('RAISED', e)\n")
    r = _run(code, DNNKIT_FLAGS=f"dnn.enabled=forced,dnn.library_path={tmp_path}")
    assert r.returncode == 0, r.stderr
    assert "RAISED activation: cuDNN is required (dnn.enabled=forced) but cannot be used: " \
           "sub-library missing: libcudnn_graph.so.9" in r.stdout


def test_disabled_never_loads_cudnn_and_auto_does():
    code = f"import dnnkit, numpy as np\ndnnkit.relu(np.ones(3, np.float32))\nprint({_MAPS})"
    r = _run(code, DNNKIT_FLAGS="dnn.enabled=disabled")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[-1] == "0"
    r = _run(code, DNNKIT_FLAGS="dnn.enabled=auto")
    assert r.returncode == 0, r.stderr
    assert int(r.stdout.split()[-1]) > 0


def test_import_does_not_load_cudnn_or_numba_cuda():
    r = _run("import sys, dnnkit\nprint('numba.cuda' in sys.modules, " + _MAPS + ")")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "0"]


_PATHFINDER_ERROR = RuntimeError(         # cuda.pathfinder's, when cuBLASLt is absent too
    'Failure finding "libcublasLt.so.13 or libcublasLt.so.12": No such file: libcublasLt.so.13 '
    'or libcublasLt.so.12, No such file: libcublasLt.so.13 or libcublasLt.so.12\n')


def test_not_found_reason_names_cudnn_when_it_is_absent(monkeypatch):
    """cuda.pathfinder loads cuDNN's dependencies first, so without the CUDA wheels its error
    names cuBLASLt; the reason names the file that is missing for dnnkit, in one line."""
    monkeypatch.setattr(loader, "main_file", lambda: None)
    reason = loader.not_found_reason(_PATHFINDER_ERROR)
    assert "\n" not in reason and "libcublasLt" not in reason
    assert reason.startswith("library not found: no cuDNN 9 in pip wheels")
    assert "libcudnn.so.9, the library of dnnkit's cuDNN backend, is missing" in reason


def test_not_found_reason_names_the_dependency_when_cudnn_is_there(monkeypatch):
    monkeypatch.setattr(loader, "main_file", lambda: "/opt/cudnn/lib/libcudnn.so.9")
    reason = loader.not_found_reason(_PATHFINDER_ERROR)
    assert "\n" not in reason
    assert reason.startswith("library not loadable: /opt/cudnn/lib/libcudnn.so.9 was found, but "
                             "libcublasLt.so.13 or libcublasLt.so.12, a library cuDNN needs, is "
                             "missing")


def test_main_file_finds_the_wheel_without_loading_it(real):
    assert os.path.realpath(loader.main_file()) == os.path.realpath(real.path)


def test_function_lookups_are_kept_per_thread_and_per_flags(monkeypatch):
    """api.function keeps the functions it looked up for the flags in force in this thread:
    a change_flags block (per thread) or a flag change looks them up again, and another
    thread never gets this thread's."""
    import threading

    from dnnkit import config
    from dnnkit.cudnn import api
    looked = []

    def lookup(name):
        looked.append((threading.get_ident(), config.get("dnn.library_path"), name))
        return (config.get("dnn.library_path"), name)
    monkeypatch.setattr(api, "_function", lookup)
    monkeypatch.setattr(api, "_fast", threading.local())
    config.get("dnn.memo")                                   # the flags merged
    first = api.function("cudnnCreate")
    assert api.function("cudnnCreate") is first and len(looked) == 1
    with config.change_flags({"dnn.library_path": "/elsewhere/libcudnn.so"}):
        assert api.function("cudnnCreate") == ("/elsewhere/libcudnn.so", "cudnnCreate")
        got = []
        t = threading.Thread(target=lambda: got.append(api.function("cudnnCreate")))
        t.start()
        t.join()
        assert got == [first]          # the other thread is outside this block
    assert api.function("cudnnCreate") == first and len(looked) == 4


def test_dropout_generators_reach_only_the_next_call_of_their_seed():
    """cuDNN's dropout states (plain and RNN) move forward one call at a time: call 0 and the
    call after the states' last one can be drawn, any other offset names where they stand."""
    import types

    from dnnkit.cudnn import dropout, rnn_dropout
    cache = {"k": types.SimpleNamespace(next=3)}
    assert dropout.standing(cache, "k", 0, 5) is None
    assert dropout.standing(cache, "k", 7, None) is None
    assert dropout.standing(cache, "k", 3, 5) is None
    assert dropout.standing(cache, "k", 4, 5) == 3
    assert dropout.standing(cache, "other", 2, 5) == 0
    for mod in (dropout, rnn_dropout):
        assert mod.reachable(0.5, 11, 0, None) is None
        why = mod.reachable(0.5, 11, 2, None)
        assert "stand at 0" in why and "seed 11" in why
