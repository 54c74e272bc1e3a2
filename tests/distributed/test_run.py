"""The launcher, ``python -m dnnkit.distributed.run``, with a CPU-only script
(tests/distributed/dummy_rank.py): the variables each rank gets, a failing rank's status and
name with the others killed, a rank killed by a signal, forwarded signals, -m, --isolate,
several hosts' ranks, and argument errors."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from .procs import HERE, ROOT, free_port

DUMMY = HERE / "dummy_rank.py"
LAUNCH = [sys.executable, "-m", "dnnkit.distributed.run"]


def ranks_written(outdir, n):
    return [json.loads((outdir / f"rank{r}.json").read_text()) for r in range(n)]


def gone(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


class Launcher:
    """The launcher in a session of its own; at exit, it and every rank that wrote its pid
    are killed if still running."""

    def __init__(self, args, outdir, env=None):
        self.outdir = outdir
        self.p = subprocess.Popen(LAUNCH + [str(a) for a in args], cwd=ROOT, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  start_new_session=True, env=env)

    def __enter__(self):
        return self

    def wait(self, timeout=120):
        out, err = self.p.communicate(timeout=timeout)
        return self.p.returncode, out, err

    def __exit__(self, *exc):
        for f in self.outdir.glob("rank*.json"):
            pid = json.loads(f.read_text())["pid"]
            if not gone(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        if self.p.poll() is None:
            os.killpg(self.p.pid, signal.SIGKILL)
            self.p.wait()
        return False


def test_each_rank_gets_its_variables(tmp_path):
    port = free_port()
    with Launcher(["--gpus", 3, "--master-port", port, DUMMY, "env", tmp_path, "--lr", "0.1"],
                  tmp_path) as run:
        code, _, err = run.wait()
    assert code == 0, err
    for r, got in enumerate(ranks_written(tmp_path, 3)):
        assert got["env"] == {"RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": "3",
                              "LOCAL_WORLD_SIZE": "3", "MASTER_ADDR": "127.0.0.1",
                              "MASTER_PORT": str(port),
                              "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES")}
        assert got["argv"] == ["--lr", "0.1"]


def test_a_failing_rank_is_named_and_the_others_are_killed(tmp_path):
    t0 = time.monotonic()
    with Launcher(["--gpus", 3, "--grace", 1, DUMMY, "fail", tmp_path], tmp_path) as run:
        code, _, err = run.wait()
    assert time.monotonic() - t0 < 45           # the others sleep 60 s: they were stopped
    assert code == 3
    assert "rank 1 (local rank 1, pid" in err and "exited with status 3" in err
    assert "stopping ranks 0, 2" in err
    for got in ranks_written(tmp_path, 3):
        assert gone(got["pid"])
    assert not list(tmp_path.glob("survived*"))


def test_a_rank_killed_by_a_signal(tmp_path):
    with Launcher(["--gpus", 2, "--grace", 1, DUMMY, "killed", tmp_path], tmp_path) as run:
        code, _, err = run.wait()
    assert code == 128 + signal.SIGKILL
    assert "rank 1" in err and "was killed by SIGKILL" in err


def test_signals_are_forwarded_to_every_rank(tmp_path):
    with Launcher(["--gpus", 2, DUMMY, "signal", tmp_path], tmp_path) as run:
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("ready*.json"))) < 2:
            assert time.monotonic() < deadline, "the ranks did not start"
            assert run.p.poll() is None, run.p.communicate()
            time.sleep(0.1)
        run.p.send_signal(signal.SIGTERM)
        code, _, err = run.wait()
    assert code == 128 + signal.SIGTERM
    assert "got SIGTERM: forwarded to every rank" in err
    for r in range(2):
        assert json.loads((tmp_path / f"term{r}.json").read_text()) == {"signal": 15}


def test_module_isolate_and_several_hosts(tmp_path):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="3,5")
    with Launcher(["--gpus", 2, "--nnodes", 2, "--node-rank", 1, "--master-addr",
                   "127.0.0.1", "--master-port", 29999, "--isolate", "-m",
                   "tests.distributed.dummy_rank", "env", tmp_path], tmp_path, env) as run:
        code, _, err = run.wait()
    assert code == 0, err
    got = [json.loads((tmp_path / f"rank{r}.json").read_text())["env"] for r in (2, 3)]
    assert [(g["RANK"], g["LOCAL_RANK"], g["WORLD_SIZE"], g["CUDA_VISIBLE_DEVICES"])
            for g in got] == [("2", "0", "4", "3"), ("3", "1", "4", "5")]


@pytest.mark.parametrize("args,message", [
    (["--gpus", 0, "x.py"], "--gpus must be >= 1"),
    (["--gpus", 2], "give the script to run"),
    (["--gpus", 2, "--nnodes", 2, "x.py"], "--nnodes > 1 needs --master-addr and --master-port"),
    (["--gpus", 2, "--nnodes", 2, "--node-rank", 2, "x.py"], "--node-rank must be in [0, "),
    (["--gpus", 2, "--master-port", 70000, "x.py"], "--master-port must be a TCP port"),
])
def test_argument_errors(tmp_path, args, message):
    with Launcher(args, tmp_path) as run:
        code, _, err = run.wait()
    assert code == 2 and message in err


@pytest.mark.parametrize("argv,head,rest", [
    (["--gpus", "2", "-m", "pkg.mod", "--gpus", "7", "-x"],
     ["--gpus", "2", "-m", "pkg.mod"], ["--gpus", "7", "-x"]),
    (["--gpus=2", "--isolate", "-m", "pkg.mod"], ["--gpus=2", "--isolate", "-m", "pkg.mod"], []),
    (["--gpus", "2", "train.py", "-m", "x"], ["--gpus", "2", "train.py", "-m", "x"], []),
])
def test_a_modules_options_are_its_own(argv, head, rest):
    from dnnkit.distributed import run
    assert run._split_module(argv) == (head, rest)
