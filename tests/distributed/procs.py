"""Starting ranks as real processes for the tests, and always cleaning them up."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def free_port():
    from dnnkit.distributed.env import free_port as fp
    return fp()


def rank_env(rank, world, port, **extra):
    env = dict(os.environ)
    env.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    env.update({k: str(v) for k, v in extra.items()})
    return env


class Ranks:
    """``with Ranks(cmd, envs) as r: results = r.wait(timeout)``: one process per env, each
    in its own session; every one still running at the end is killed with its children."""

    def __init__(self, cmd, envs):
        self.procs = [subprocess.Popen(cmd, env=e, cwd=ROOT, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True,
                                       start_new_session=True) for e in envs]

    def __enter__(self):
        return self

    def wait(self, timeout):
        """[(exit status, stdout, stderr)] in start order; the processes still running at
        ``timeout`` seconds are killed (status None)."""
        deadline = time.monotonic() + timeout
        out = []
        for p in self.procs:
            try:
                so, se = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
                out.append((p.returncode, so, se))
            except subprocess.TimeoutExpired:
                self.kill(p)
                so, se = p.communicate()
                out.append((None, so, se))
        return out

    @staticmethod
    def kill(p):
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def __exit__(self, *exc):
        for p in self.procs:
            self.kill(p)
            p.wait()
        for p in self.procs:
            for s in (p.stdout, p.stderr):
                if s is not None:
                    s.close()
        return False


def last_json(stdout):
    lines = [ln for ln in stdout.strip().splitlines() if ln.startswith("{")]
    assert lines, f"no result line in {stdout!r}"
    return json.loads(lines[-1])


def python(*args):
    return [sys.executable, *map(str, args)]
