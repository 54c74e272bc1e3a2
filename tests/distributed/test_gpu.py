"""dnnkit.distributed on NCCL and 2 GPUs (skipped unless there are 2 GPUs, nccl4py and
libnccl): each test starts the ranks of tests/distributed/gpu_worker.py, which check their own
results:

- the collectives' values against NumPy (all_reduce sum/avg/max/min, broadcast, all_gather,
  reduce_scatter; float16/32/64 and integer dtypes; on a stream of the caller's); the
  communicator blocking, never left ncclInProgress after a call;
- DataParallel on 2 GPUs equal to one GPU's steps on the whole batch (float64 CNN, tight),
  on both backends; ResNet-18 with SyncBatchNorm against BatchNorm on one GPU (float32);
- SyncBatchNorm against BatchNorm on the whole batch, both backends, float32 and float64;
- a DataParallel step captured into a CUDA graph and replayed: the eager steps' losses and
  parameters, both backends;
- a rank killed mid-step, and a rank that hangs (eager steps, or steps replayed from a CUDA
  graph): the other exits non-zero within the timeout with a DistributedError naming rank 1.

Run on a machine with 2+ GPUs: ``python -m pytest -m gpu tests/distributed/test_gpu.py``."""

import json
import os
import sys
import time

import pytest

from tests.conftest import SIMULATOR, backend_params

from .procs import HERE, ROOT, Ranks, free_port, rank_env

WORKER = HERE / "gpu_worker.py"
FAULT_TIMEOUT = 15.0          # dnn.distributed.timeout of the fault tests (seconds)


def _why_not():
    if SIMULATOR:
        return "needs 2 GPUs (running on the simulator)"
    from numba import cuda
    if len(cuda.gpus) < 2:
        return f"needs 2 GPUs; this machine has {len(cuda.gpus)}"
    from dnnkit.distributed import DistributedError, nccl
    try:
        nccl.load()
    except DistributedError as e:
        return str(e)
    return None


WHY_NOT = _why_not()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(WHY_NOT is not None, reason=WHY_NOT or "")]


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env.update(extra)
    return env


def launch(*args, timeout=600):
    """Both ranks through the launcher; {rank: result}."""
    import subprocess
    r = subprocess.run([sys.executable, "-m", "dnnkit.distributed.run", "--gpus", "2",
                        str(WORKER), *args], cwd=ROOT, capture_output=True, text=True,
                       timeout=timeout, env=_env())
    assert r.returncode == 0, f"stdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    out = {}
    # the ranks share the launcher's stdout: one rank's line may land in the middle of the
    # other's, so every JSON object is read wherever it starts
    dec, text, i = json.JSONDecoder(), r.stdout, r.stdout.find('{"rank"')
    while i >= 0:
        d, end = dec.raw_decode(text, i)
        out[d["rank"]] = d["result"]
        i = text.find('{"rank"', end)
    assert sorted(out) == [0, 1], r.stdout
    return out


def test_collectives_against_numpy():
    res = launch("collectives")
    # NCCL calls queued per rank: all_reduce 3 ops x 2 integer dtypes + 4 ops x 3 float
    # dtypes, broadcast, all_gather and reduce_scatter x 5 dtypes, one on the caller's stream,
    # one checking that the communicator is not left in progress
    assert res[0]["collectives"] == res[1]["collectives"] == 2 * 3 + 3 * 4 + 3 * 5 + 2


@pytest.mark.parametrize("backend", backend_params())
def test_data_parallel_matches_one_gpu_on_the_whole_batch(backend):
    res = launch("data_parallel", backend)
    assert res[0]["buckets"] > 1


@pytest.mark.parametrize("backend", backend_params())
def test_resnet18_with_sync_batch_norm_matches_one_gpu(backend):
    launch("resnet", backend)


@pytest.mark.parametrize("backend", backend_params())
def test_sync_batch_norm_matches_batch_norm_on_the_whole_batch(backend):
    res = launch("sync_bn", backend)
    assert res[0] == {"float64": True, "float32": True}


@pytest.mark.parametrize("backend", backend_params())
def test_a_captured_data_parallel_step_replays_to_the_eager_steps(backend):
    res = launch("graph", backend)
    assert res[0]["replays"] == res[1]["replays"] == 4
    assert res[0]["nodes"] > 10 and res[0]["buckets"] > 1


@pytest.mark.parametrize("how,named", [
    ("kill", "rank 1 exited"),
    ("hang", "rank 1 has queued"),
    ("hang-graph", "rank 1 has queued"),      # the steps replayed from a CUDA graph
])
def test_a_failed_rank_is_named_within_the_timeout(how, named):
    port = free_port()
    flags = f"dnn.distributed.timeout={FAULT_TIMEOUT}"
    envs = [_env(**{k: v for k, v in rank_env(r, 2, port, DNNKIT_FLAGS=flags).items()
                    if k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
                             "DNNKIT_FLAGS")}) for r in range(2)]
    t0 = time.monotonic()
    with Ranks([sys.executable, str(WORKER), "fault", how], envs) as procs:
        rank0 = procs.procs[0]
        _, err0 = rank0.communicate(timeout=FAULT_TIMEOUT * 6 + 120)
        code0 = rank0.returncode
        elapsed = time.monotonic() - t0
    # (rank 1, hung or dead, is killed on leaving the block)
    assert code0 not in (0, None), err0
    assert "DistributedError" in err0 or "dnnkit.distributed: rank 0" in err0, err0
    assert named in err0, err0
    assert elapsed < FAULT_TIMEOUT * 4 + 90, elapsed     # start-up, the timeout, the abort


def test_demo_on_two_gpus():
    """``python -m dnnkit demo --gpus 2``: the launcher's two ranks train every model with
    DataParallel; rank 0 alone reports."""
    import subprocess
    r = subprocess.run([sys.executable, "-m", "dnnkit", "demo", "--gpus", "2", "--backend",
                        "cudnn"], cwd=ROOT, capture_output=True, text=True, timeout=600,
                       env=_env())
    assert r.returncode == 0, f"stdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    for name in ("cnn", "resnet", "lstm"):
        assert r.stdout.count(f"{name}: DataParallel over 2 GPU(s)") == 1, r.stdout
        assert r.stdout.count(f"{name} [cudnn] held-out accuracy") == 1, r.stdout
