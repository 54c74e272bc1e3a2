import os
import subprocess
import sys

from tests.conftest import HAVE_DRIVER, cudnn_ok


def _run(*args, env=None):
    e = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "dnnkit", *args], capture_output=True,
                          text=True, env=e, timeout=600)


def test_info_prints_both_backends_and_flags():
    r = _run("info", env={"DNNKIT_FLAGS": "dnn.verbose=True"})
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "cuDNN       : " in out and "version   : 9." in out and "found via : " in out
    assert "Numba       : " in out
    assert "dnn.verbose          = True         (env)" in out
    if not HAVE_DRIVER:
        assert "running on Numba's CUDA simulator" in out
        assert "reason    : no CUDA device (cudnnCreate returned CUDNN_STATUS_NOT_INITIALIZED)" in out


def test_check_prints_a_passing_table():
    r = _run("check", "--ops", "softmax,activation_backward", "--dtypes", "float32")
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    rows = [ln for ln in lines if ln.startswith(("softmax ", "activation_backward "))]
    assert len(rows) == 2 * (6 + 7)  # (6 softmax variants + 7 modes) x 2 backends
    ok = [ln for ln in rows if ln.rstrip().endswith("  ok")]
    skipped = [ln for ln in rows if "  skipped: " in ln]
    assert len(ok) + len(skipped) == len(rows)
    # Numba always runs; cuDNN rows run wherever cuDNN works (never identity).
    assert len(ok) == (26 - 1 if cudnn_ok() else 13), r.stdout
    assert any("identity" in ln and "no stand-alone identity" in ln for ln in skipped)
    assert "0 failed" in lines[-1]


def test_no_command_shows_help():
    r = _run()
    assert r.returncode == 2 and "info" in r.stdout and "check" in r.stdout


def test_demo_command_trains_and_reports(tmp_path):
    """The README's main job, as a user runs it: without a GPU it says so and trains tiny
    models on the simulator; the accuracy lines and the profile table are printed and nothing
    raised (a traceback anywhere fails the test)."""
    png = tmp_path / "loss.png"
    r = _run("demo", "--plot", str(png))
    out = r.stdout + r.stderr
    assert r.returncode == 0 and "Traceback" not in out, out
    for name in ("cnn", "lstm"):
        assert f"{name} [auto] held-out accuracy: " in r.stdout, r.stdout
        assert f"{name} [auto] epoch 1: loss " in r.stdout
    assert "per-op time (dnnkit.profile)" in r.stdout and "conv2d" in r.stdout
    if not HAVE_DRIVER:
        assert "No GPU: running on Numba's CUDA simulator" in r.stdout
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "--plot needs matplotlib" in r.stdout
    else:
        assert png.stat().st_size > 1000 and f"loss curves written to {png}" in r.stdout
