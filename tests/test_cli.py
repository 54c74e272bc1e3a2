"""The command line, run as a user runs it: ``python -m dnnkit`` in a fresh process."""

import argparse
import os
import subprocess
import sys

import pytest

import dnnkit
from dnnkit import __main__ as cli
from tests.conftest import HAVE_DRIVER, SIMULATOR, cudnn_ok


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
    assert "conv2d" in r.stdout
    if not HAVE_DRIVER:
        assert "No GPU: running on Numba's CUDA simulator" in r.stdout
        # no GPU time to show on the simulator: the table lists backends and calls
        assert "per-op backends (dnnkit.profile; the simulator measures no GPU time" in r.stdout
        assert "per-op time (dnnkit.profile)" not in r.stdout
    else:
        assert "per-op time (dnnkit.profile)" in r.stdout
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "--plot needs matplotlib" in r.stdout
    else:
        assert png.stat().st_size > 1000 and f"loss curves written to {png}" in r.stdout


def test_version():
    r = _run("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"dnnkit {dnnkit.__version__}", r


def test_console_script_entry_point(monkeypatch, capsys):
    """pyproject's ``dnnkit = "dnnkit.__main__:cli"``: the same parser under the name dnnkit."""
    monkeypatch.setattr(sys, "argv", ["dnnkit", "--version"])
    with pytest.raises(SystemExit) as e:
        cli.cli()
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"dnnkit {dnnkit.__version__}"
    monkeypatch.setattr(sys, "argv", ["dnnkit"])
    assert cli.cli() == 2                           # no command: the help, status 2
    assert capsys.readouterr().out.startswith("usage: dnnkit ")


def _one_line_error(r):
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stdout + r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dnnkit: error: "), r.stderr
    return lines[0]


def test_demo_cudnn_without_cudnn_is_one_line():
    """``demo --backend cudnn`` where cuDNN cannot run: the reason in one line on stderr, exit 1,
    and nothing else (no simulator notice, no traceback)."""
    if cudnn_ok():
        pytest.skip("cuDNN works here: the demo would run")
    r = _run("demo", "--backend", "cudnn")
    line = _one_line_error(r)
    assert "--backend cudnn needs cuDNN, which cannot run here: " in line
    assert r.stdout == ""


def test_bad_flag_is_one_line_listing_each_alias_once():
    r = _run("info", env={"DNNKIT_FLAGS": "dnn.enabled=maybe"})
    line = _one_line_error(r)
    assert line.endswith("flag dnn.enabled: bad value 'maybe'; allowed: auto, forced, disabled "
                         "(also True, False, true, false)"), line
    assert r.stdout == ""


def test_dnnkit_errors_end_the_command_with_one_line(monkeypatch, capsys):
    """Any DnnkitError a command raises (here a fake one) is the one-line reason, status 1."""
    def broken(_args):
        raise dnnkit.CudnnUnavailableError("cuDNN is required\nbut missing:  libcudnn.so.9")
    monkeypatch.setitem(cli.COMMANDS, "info", broken)
    monkeypatch.setenv("NUMBA_ENABLE_CUDASIM", "1")        # no re-run on the simulator
    assert cli.main(["info"]) == 1
    err = capsys.readouterr().err
    assert err == "dnnkit: error: cuDNN is required but missing: libcudnn.so.9\n"


def test_every_option_has_help():
    parser = cli.build_parser()
    subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert len(subparsers) == 1
    commands = subparsers[0].choices
    assert set(commands) == {"info", "check", "demo", "warmup"}
    assert all(a.help for a in subparsers[0]._choices_actions)      # each command's line
    for p in [parser, *commands.values()]:
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                continue
            assert a.help and a.help != argparse.SUPPRESS, (p.prog, a.option_strings)


def test_check_ops_lists_the_valid_names():
    r = _run("check", "--ops", "softmax,no_such_op")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "unknown op 'no_such_op'; valid: " in r.stderr
    valid = r.stderr.split("valid: ", 1)[1].strip().split(", ")
    assert {"activation", "softmax", "conv2d", "pool2d"} <= set(valid), valid
    assert valid == sorted(valid) and "no_such_op" not in valid


@pytest.mark.parametrize("args, message", [
    (("check", "--dtypes", "float8"), "unknown dtype 'float8'; valid: float16, float32, float64"),
    (("check", "--reps", "0"), "must be >= 1; got 0"),
    (("demo", "--backend", "cuda"), "invalid choice: 'cuda'"),
    (("demo", "--gpus", "0"), "must be >= 1; got 0"),
    (("demo", "--gpus", "2", "--crosscheck"), "--crosscheck trains two copies on one GPU"),
])
def test_bad_arguments_are_usage_errors(args, message):
    r = _run(*args)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_demo_on_more_gpus_than_the_machine_has_is_one_line():
    from numba import cuda
    have = 0 if SIMULATOR else len(cuda.gpus)
    n = max(2, have + 1)
    r = _run("demo", "--gpus", str(n))
    line = _one_line_error(r)
    assert f"demo: --gpus {n} needs {n} GPUs; this machine has {have}" in line
