"""dnnkit.cudnn.is_available() and version(), PyTorch's names, on the real cuDNN wheel: the
library loads and answers cudnnGetVersion on any machine, and runs only where there is a GPU."""

import os
import subprocess
import sys

import pytest

import dnnkit
from dnnkit import config
from dnnkit.cudnn import loader
from tests.conftest import HAVE_DRIVER


def test_they_report_the_status(real):
    assert dnnkit.cudnn.is_available() is real.available
    assert dnnkit.cudnn.version() == real.version


@pytest.mark.skipif(HAVE_DRIVER, reason="this machine has a CUDA driver")
def test_without_a_device_the_library_is_loaded_versioned_and_unavailable(real):
    assert dnnkit.cudnn.is_available() is False
    # the reason lives in status(), as for every other cause
    assert dnnkit.cudnn.status().reason == ("no CUDA device (cudnnCreate returned "
                                            "CUDNN_STATUS_NOT_INITIALIZED)")
    v = dnnkit.cudnn.version()
    assert isinstance(v, int) and v >= 90000
    assert loader.version_string(v) == real.version_string


@pytest.mark.cudnn
def test_with_a_device_it_is_available(real):
    assert dnnkit.cudnn.is_available() is True and dnnkit.cudnn.status().reason == ""
    assert dnnkit.cudnn.version() == real.version


def test_they_follow_the_library_path_flag(real, tmp_path):
    with config.change_flags({"dnn.library_path": str(tmp_path)}):     # no library there
        assert dnnkit.cudnn.is_available() is False
        assert dnnkit.cudnn.version() is None
        assert "without libcudnn.so.9" in dnnkit.cudnn.status().reason
    with config.change_flags({"dnn.library_path": real.path}):         # the file itself
        assert dnnkit.cudnn.version() == real.version
        assert dnnkit.cudnn.is_available() is real.available


def test_a_refused_file_has_no_version(real, tmp_path):
    """A folder without its sub-libraries is refused before loading: nothing was asked."""
    import shutil
    shutil.copy(real.path, tmp_path / "libcudnn.so.9")
    with config.change_flags({"dnn.library_path": str(tmp_path)}):
        assert dnnkit.cudnn.is_available() is False
        assert dnnkit.cudnn.version() is None
        assert dnnkit.cudnn.status().reason.startswith("sub-library missing")


def test_naming_them_does_not_load_numba_or_cudnn():
    """``import dnnkit`` stays light: the functions exist without Numba or cuDNN loaded (the
    first call probes)."""
    code = ("import sys, dnnkit\n"
            "f, g = dnnkit.cudnn.is_available, dnnkit.cudnn.version\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'numba'),"
            " open('/proc/self/maps').read().count('libcudnn'))\n")
    env = {k: v for k, v in os.environ.items() if k != "DNNKIT_FLAGS"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["[]", "0"], r.stdout
