"""validation/cold_start.py's fresh processes read bytecode as an installed package does: the
scenario environment drops PYTHONDONTWRITEBYTECODE and names the run's bytecode folder, and
``compile_bytecode`` fills that folder (checked on dnnkit alone: the CPU, no GPU)."""

import os
import subprocess
import sys

from validation import cold_start


def test_scenario_env_reads_the_runs_bytecode(monkeypatch, tmp_path):
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.setattr(cold_start, "PACKAGES", ("dnnkit",))
    cold_start.compile_bytecode(str(tmp_path), 1)
    env = cold_start._env(str(tmp_path / "numba"))
    assert "PYTHONDONTWRITEBYTECODE" not in env
    assert env["PYTHONPYCACHEPREFIX"] == str(tmp_path)
    assert env["NUMBA_CACHE_DIR"] == str(tmp_path / "numba")
    pycs = [f for _, _, files in os.walk(tmp_path) for f in files if f.endswith(".pyc")]
    assert any(f.startswith("dispatch.") for f in pycs), pycs[:5]
    # a process in that environment finds dnnkit's bytecode there instead of compiling it
    code = ("import importlib.util, sys, dnnkit.dispatch as m; "
            "print(importlib.util.cache_from_source(m.__file__))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, check=True).stdout.strip()
    assert out.startswith(str(tmp_path)) and os.path.exists(out), out
