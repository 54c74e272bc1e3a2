"""validation/instant_failures.py: a failing test's report reaches the log while the session
still runs (validation/gpu_suite.py kills a process at its deadline, before pytest's summary)."""

import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_a_failure_is_reported_before_the_session_ends(tmp_path):
    (tmp_path / "test_x.py").write_text(textwrap.dedent("""
        import os

        def test_bad():
            x = 3
            assert x == 4, "three is not four"

        def test_then_the_process_dies():
            os._exit(9)     # as the suite's deadline would: no summary after this
    """))
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    run = subprocess.run([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider",
                          "-p", "validation.instant_failures", str(tmp_path / "test_x.py")],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert run.returncode == 9, run.stdout[-2000:] + run.stderr[-2000:]
    assert "short test summary" not in run.stdout
    assert "test_x.py::test_bad failed (call)" in run.stdout
    assert "three is not four" in run.stdout
