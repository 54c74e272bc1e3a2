"""Who a process is (dnnkit/distributed/env.py): the launcher's variables, MPI's and Slurm's,
a single process, their errors; the dnn.distributed.timeout flag; init() of one process on
the simulator; and the imports: ``import dnnkit`` does not import dnnkit.distributed, which
imports without nccl4py and says what to install at the first collective that needs it."""

import subprocess
import sys

import numpy as np
import pytest

import dnnkit
from dnnkit import config
from dnnkit.distributed import env
from dnnkit.distributed.env import ProcessEnv, from_environ

from .procs import ROOT

BASE = {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_ADDR": "node0",
        "MASTER_PORT": "29500"}


@pytest.mark.parametrize("environ,want", [
    ({}, ProcessEnv(0, 1, 0, None, None, "single")),
    ({"PATH": "/bin", "SLURM_PROCID": "0", "SLURM_NTASKS": "8"},     # a batch script itself
     ProcessEnv(0, 1, 0, None, None, "single")),
    (BASE, ProcessEnv(1, 4, 1, "node0", 29500, "env")),
    (dict(BASE, LOCAL_RANK=""), ProcessEnv(1, 4, 1, "node0", 29500, "env")),
    ({"RANK": "0", "WORLD_SIZE": "1"}, ProcessEnv(0, 1, 0, None, None, "env")),
    ({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "8",
      "OMPI_COMM_WORLD_LOCAL_RANK": "1"}, ProcessEnv(3, 8, 1, None, None, "openmpi")),
    ({"PMI_RANK": "2", "PMI_SIZE": "4", "MPI_LOCALRANKID": "0", "MASTER_ADDR": "h",
      "MASTER_PORT": "1234"}, ProcessEnv(2, 4, 0, "h", 1234, "mpich")),
    ({"SLURM_PROCID": "5", "SLURM_STEP_NUM_TASKS": "6", "SLURM_LOCALID": "1"},
     ProcessEnv(5, 6, 1, None, None, "slurm")),
    (dict(BASE, OMPI_COMM_WORLD_RANK="0", OMPI_COMM_WORLD_SIZE="2"),      # RANK wins
     ProcessEnv(1, 4, 1, "node0", 29500, "env")),
])
def test_from_environ(environ, want):
    assert from_environ(environ) == want


@pytest.mark.parametrize("environ,message", [
    ({"RANK": "0"}, "RANK is set but WORLD_SIZE is not"),
    ({"WORLD_SIZE": "2"}, "WORLD_SIZE is set but RANK is not"),
    (dict(BASE, RANK="x"), "RANK='x' is not an integer"),
    (dict(BASE, RANK="-1"), "RANK=-1 must be >= 0"),
    (dict(BASE, WORLD_SIZE="0"), "WORLD_SIZE=0 must be >= 1"),
    (dict(BASE, RANK="4"), "RANK=4 is not below WORLD_SIZE=4"),
    (dict(BASE, LOCAL_RANK="-2"), "LOCAL_RANK=-2 must be >= 0"),
    (dict(BASE, MASTER_PORT="70000"), "MASTER_PORT=70000 is not a TCP port"),
    (dict(BASE, MASTER_PORT="http"), "MASTER_PORT='http' is not an integer"),
    ({k: v for k, v in BASE.items() if k != "MASTER_ADDR"}, "MASTER_ADDR is not set"),
    ({"RANK": "0", "WORLD_SIZE": "2"}, "MASTER_ADDR and MASTER_PORT is not set"),
    ({"PMI_RANK": "0", "PMI_SIZE": "2", "MASTER_PORT": "5"},
     "MASTER_PORT is set but MASTER_ADDR is not"),
])
def test_from_environ_errors(environ, message):
    with pytest.raises(ValueError, match="dnnkit.distributed: ") as e:
        from_environ(environ)
    assert message in str(e.value)


def test_mpi_master_without_mpi4py_says_what_to_do(monkeypatch):
    penv = from_environ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"})
    monkeypatch.setitem(sys.modules, "mpi4py", None)       # import mpi4py fails, as uninstalled
    with pytest.raises(ValueError, match="set both .* or install mpi4py"):
        env.mpi_master(penv)
    single = from_environ({})
    assert env.mpi_master(single) is single


def test_the_timeout_flag():
    assert config.get("dnn.distributed.timeout") == 300.0 == env.timeout()
    with config.change_flags({"dnn.distributed.timeout": "2.5"}):
        assert env.timeout() == 2.5
    for bad in ("0", "-1", "inf", "nan", "soon", True):
        with pytest.raises(ValueError, match="flag dnn.distributed.timeout: bad value"):
            config.set("dnn.distributed.timeout", bad)
    assert "dnn.distributed.timeout" in [row[0] for row in config.describe()]
    assert env.check_timeout("barrier", 3) == 3.0
    with pytest.raises(ValueError, match="dnnkit.distributed.barrier: bad value 0"):
        env.check_timeout("barrier", 0)


def test_init_of_one_process_and_its_collectives(monkeypatch):
    """No variables: rank 0 of 1, no store, no NCCL; the collectives are copies, on the
    simulator too."""
    import dnnkit.distributed as dist
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK",
              "SLURM_PROCID"):
        monkeypatch.delenv(k, raising=False)
    g = dist.init()
    try:
        assert (dist.get_rank(), dist.get_world_size(), dist.is_initialized()) == (0, 1, True)
        assert g.store is None and g.comm.size == 1
        with pytest.raises(RuntimeError, match="already joined"):
            dist.init()
        x = dnnkit.tensor(np.arange(6.0).reshape(3, 2))
        v = x.version
        assert dist.all_reduce(x, "avg") is x and x.version == v + 1
        assert dist.broadcast(x, 0) is x
        gathered = dist.all_gather(x)
        assert isinstance(gathered, dnnkit.Tensor)
        np.testing.assert_array_equal(gathered.numpy(), np.arange(6.0).reshape(3, 2))
        np.testing.assert_array_equal(dist.reduce_scatter(x.data).copy_to_host(),
                                      np.arange(6.0).reshape(3, 2))
        dist.barrier()
        assert g.seq == 4                  # every collective counted (none for a barrier)
        with pytest.raises(ValueError, match="op must be one of sum, avg"):
            dist.all_reduce(x, "mean")
        with pytest.raises(TypeError, match="op='avg' needs a floating-point array"):
            dist.all_reduce(dnnkit.tensor(np.arange(3)), "avg")
        with pytest.raises(TypeError, match="must be a device array or a Tensor"):
            dist.all_reduce(np.ones(3))
        with pytest.raises(ValueError, match=r"src must be a rank in \[0, 1\)"):
            dist.broadcast(x, 1)
        with pytest.raises(ValueError, match="barrier: bad value -1"):
            dist.barrier(timeout=-1)
    finally:
        dist.destroy()
    assert not dist.is_initialized() and dist.get_world_size() == 1
    with pytest.raises(RuntimeError, match="call dnnkit.distributed.init"):
        dist.all_reduce(x)


_IMPORTS = """
import sys
import dnnkit
assert "dnnkit.distributed" not in sys.modules, "import dnnkit imported dnnkit.distributed"
sys.modules["nccl"] = None                 # as if nccl4py were not installed
import dnnkit.distributed as dist
from dnnkit.distributed import nccl
assert "nccl.bindings" not in sys.modules
try:
    nccl.load()
except dist.DistributedError as e:
    print("ERROR", e)
"""


def test_imports_without_nccl4py():
    r = subprocess.run([sys.executable, "-c", _IMPORTS], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "ERROR collectives across processes need NCCL's Python binding nccl4py, which " \
           "is not installed" in r.stdout
    assert "pip install \"dnnkit[dist-cu12]\"" in r.stdout
