"""One rank of a GPU scenario (tests/distributed/test_gpu.py): ``gpu_worker.py SCENARIO
[BACKEND]``, started by the launcher (or, for the faults, directly) with RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR, MASTER_PORT set. Checks its results itself (an AssertionError exits
non-zero) and prints one JSON line {"rank": r, ...}. Needs 2 GPUs, nccl4py and libnccl."""

import json
import os
import signal
import sys
import time

import dnnkit.distributed as dist     # first: registers dnn.distributed.timeout (DNNKIT_FLAGS)
import numpy as np

import dnnkit
from dnnkit import config, models, nn, optim


def data(rank, shape, dtype):
    return ((np.arange(int(np.prod(shape))).reshape(shape) % 7) * (rank + 1) - 3).astype(dtype)


def collectives(g):
    w, r = g.world_size, g.rank
    for dtype in (np.float16, np.float32, np.float64, np.int32, np.int64):
        ops = ("sum", "max", "min") + (("avg",) if np.dtype(dtype).kind == "f" else ())
        for op in ops:
            x = dnnkit.tensor(data(r, (5, 3), dtype))
            dist.all_reduce(x, op)
            parts = np.stack([data(k, (5, 3), dtype) for k in range(w)]).astype(np.float64)
            want = {"sum": parts.sum(0), "avg": parts.mean(0), "max": parts.max(0),
                    "min": parts.min(0)}[op].astype(dtype)
            np.testing.assert_allclose(x.numpy().astype(np.float64), want.astype(np.float64),
                                       rtol=1e-3 if dtype == np.float16 else 1e-6,
                                       err_msg=f"all_reduce {op} {np.dtype(dtype).name}")
        b = dnnkit.tensor(data(r, (4,), dtype)).data
        dist.broadcast(b, src=w - 1)
        np.testing.assert_array_equal(b.copy_to_host(), data(w - 1, (4,), dtype))
        gathered = dist.all_gather(dnnkit.tensor(data(r, (2, 3), dtype)))
        np.testing.assert_array_equal(gathered.numpy(), np.concatenate(
            [data(k, (2, 3), dtype) for k in range(w)]))
        scattered = dist.reduce_scatter(dnnkit.tensor(data(r, (2 * w, 3), dtype)), "sum")
        total = sum(data(k, (2 * w, 3), dtype).astype(np.float64) for k in range(w))
        np.testing.assert_allclose(scattered.numpy().astype(np.float64),
                                   total[2 * r:2 * r + 2], rtol=1e-3)
    # on a stream of the caller's: the collective is queued there, after the fill
    s = dnnkit.device.numba_cuda().stream()
    with dnnkit.stream(s):
        x = dnnkit.tensor(np.full(1 << 16, r + 1.0, np.float32))
        dist.all_reduce(x)
        got = x.data.copy_to_host(stream=s)
        s.synchronize()
    assert (got == w * (w + 1) / 2).all()
    # a blocking communicator: a collective's call returns once queued, and the communicator
    # is never left ncclInProgress (7) for the caller to poll
    x = dnnkit.tensor(np.ones(1 << 20, np.float32))
    dist.all_reduce(x)
    assert g.comm.config.blocking == 1 and g.comm.async_error() == 0
    dnnkit.device.numba_cuda().synchronize()
    dist.barrier()
    return {"collectives": g.seq}


def small_cnn(seed, dtype):
    rng = np.random.default_rng(seed)
    m = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1, dtype=dtype), nn.ReLU(),
                      nn.MaxPool2d(2), nn.Flatten(), nn.Linear(4 * 4 * 4, 5, dtype=dtype))
    m.load_state_dict({k: (rng.standard_normal(v.shape) * 0.3).astype(v.dtype)
                       for k, v in m.state_dict().items()})
    return m


def trainer(model, lr=0.05, momentum=0.9, backend=None):
    """step(x, y): one SGD step of ``model`` on a batch (Tensors), returning the loss."""
    opt = optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    loss_fn = nn.CrossEntropyLoss()
    if backend is not None:
        nn.convert(loss_fn, backend)

    def step(x, y):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss
    return step


def train(model, xs, ys, steps, lr=0.05):
    step = trainer(model, lr)
    return [step(dnnkit.tensor(xs), dnnkit.tensor(ys)).item() for _ in range(steps)]


def compare(model, ref, rtol, atol):
    """Every parameter and buffer of ``model`` against ``ref``'s; the largest difference."""
    worst = 0.0
    for (k, v), want in zip(model.state_dict().items(), ref.state_dict().values()):
        np.testing.assert_allclose(v, want, rtol=rtol, atol=atol, err_msg=k)
        if v.dtype.kind == "f":
            worst = max(worst, float(np.abs(v - want).max()))
    return worst


def batch(g, seed, shape, classes, dtype):
    """The global batch, and this rank's equal share of it (rows)."""
    rng = np.random.default_rng(seed)
    n = shape[0] * g.world_size
    xs = rng.standard_normal((n,) + shape[1:]).astype(dtype)
    ys = rng.integers(0, classes, n).astype(np.int64)
    return xs, ys, slice(g.rank * shape[0], (g.rank + 1) * shape[0])


def data_parallel(g, backend):
    """A float64 CNN under DataParallel, each rank seeded differently (rank 0's weights are
    broadcast), 3 SGD steps on its share: the same parameters as one model trained on the
    whole batch on this GPU."""
    xs, ys, part = batch(g, 42, (4, 3, 8, 8), 5, np.float64)
    dp = dist.DataParallel(nn.convert(small_cnn(g.rank, "float64"), backend), bucket_mb=1e-3)
    assert len(dp.buckets) > 1
    train(dp, xs[part], ys[part], 3)
    ref = nn.convert(small_cnn(0, "float64"), backend)
    train(ref, xs, ys, 3)
    return {"worst": compare(dp.module, ref, 1e-10, 1e-12), "buckets": len(dp.buckets)}


def resnet(g, backend):
    """ResNet-18 (CIFAR form, width 16, float32) with SyncBatchNorm under DataParallel, 2
    steps, against the same model with BatchNorm on the whole batch on one GPU."""
    with config.change_flags({"dnn.deterministic": True}):
        xs, ys, part = batch(g, 7, (8, 3, 32, 32), 10, np.float32)
        model = dist.SyncBatchNorm.convert(models.resnet18(width=16, seed=g.rank))
        dp = dist.DataParallel(nn.convert(model, backend))
        train(dp, xs[part], ys[part], 2, lr=0.02)
        ref = nn.convert(models.resnet18(width=16, seed=0), backend)
        train(ref, xs, ys, 2, lr=0.02)
        return {"worst": compare(dp.module, ref, 2e-3, 2e-4)}


def sync_bn(g, backend):
    w, r = g.world_size, g.rank
    out = {}
    for dtype, tol in (("float64", 1e-10), ("float32", 2e-4)):
        rng = np.random.default_rng(3)
        x = (rng.standard_normal((4 * w, 6, 5, 5)) * 2 + 1).astype(dtype)
        gy = rng.standard_normal(x.shape).astype(dtype)
        part = slice(4 * r, 4 * r + 4)
        sbn = nn.convert(dist.SyncBatchNorm(6, dtype=dtype), backend)
        bn = nn.convert(nn.BatchNorm2d(6, dtype=dtype), backend)
        xt, xr = dnnkit.tensor(x[part], requires_grad=True), dnnkit.tensor(x, requires_grad=True)
        y, yr = sbn(xt), bn(xr)
        (y * dnnkit.tensor(gy[part])).sum().backward()
        (yr * dnnkit.tensor(gy)).sum().backward()
        np.testing.assert_allclose(y.numpy(), yr.numpy()[part], rtol=tol, atol=tol)
        np.testing.assert_allclose(xt.grad.numpy(), xr.grad.numpy()[part], rtol=tol, atol=tol)
        dgamma = dnnkit.tensor(sbn.weight.grad.numpy().copy())
        dist.all_reduce(dgamma)           # the ranks' shares add up to the whole batch's
        np.testing.assert_allclose(dgamma.numpy(), bn.weight.grad.numpy(), rtol=tol, atol=tol)
        np.testing.assert_allclose(sbn.running_var.numpy(), bn.running_var.numpy(), rtol=tol)
        out[dtype] = True
    return out


def fault(g, how):
    """Train; after 3 steps rank 1 dies (SIGKILL) or hangs (sleeps). Rank 0 must fail with
    a DistributedError naming rank 1 (caught here only to report it) within the timeout.
    ``hang-graph``: the step is captured into a CUDA graph and replayed (the watchdog tracks
    each replay's collectives), and rank 1 hangs."""
    from dnnkit import graphs
    model = dist.DataParallel(small_cnn(g.rank, "float32"), bucket_mb=1e-3)
    rng = np.random.default_rng(g.rank)
    xs = dnnkit.tensor(rng.standard_normal((4, 3, 8, 8)).astype(np.float32))
    ys = dnnkit.tensor(rng.integers(0, 5, 4).astype(np.int64))
    step = trainer(model, lr=0.01, momentum=0.0)
    captured = graphs.capture(step, xs, ys, warmup=2) if how == "hang-graph" else None
    run = captured.replay if captured is not None else lambda: step(xs, ys)
    if captured is not None and os.environ.get("DNNKIT_FAULT_DEBUG"):
        print(f"rank {g.rank}: graph of {captured.nodes} nodes, "
              f"{len(captured._hooks)} replay hooks", file=sys.stderr, flush=True)
    t_fault, said = None, 0.0
    for k in range(10 ** 6):
        if g.rank == 1 and k == 3:
            if how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(3600)
        if k == 3:
            t_fault = time.monotonic()
        run()
        model.module[0].weight.numpy()          # waits for the GPU: hangs until the abort
        if os.environ.get("DNNKIT_FAULT_DEBUG") and time.monotonic() - said > 5:
            said, wd = time.monotonic(), g.watchdog
            pend = list(wd.pending) if wd is not None else []
            print(f"rank {g.rank} step {k}: seq {g.seq}, pending {len(pend)}, oldest "
                  f"{time.monotonic() - pend[0][3] if pend else 0:.1f} s, failure "
                  f"{g.failure!r}", file=sys.stderr, flush=True)
        if t_fault is not None and time.monotonic() - t_fault > 10 * g.timeout:
            raise AssertionError("no fault detected")


def graph(g, backend):
    """A DataParallel training step captured into a CUDA graph (dnnkit.graphs.capture: the
    buffer broadcast, the bucket copies and all-reduces on the reducer's stream) and replayed
    on four new batches: the losses and parameters of the same eager DataParallel steps."""
    from dnnkit import graphs
    shards = []
    for k in range(5):
        xs, ys, part = batch(g, 100 + k, (4, 3, 8, 8), 5, np.float32)
        shards.append((xs[part], ys[part]))

    def make():
        rng = np.random.default_rng(g.rank)
        m = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                          nn.MaxPool2d(2), nn.Flatten(), nn.Linear(4 * 4 * 4, 5))
        m.load_state_dict({k: (rng.standard_normal(v.shape) * 0.3 + (k.endswith("var")))
                           .astype(v.dtype) if v.dtype.kind == "f" else v
                           for k, v in m.state_dict().items()})
        return dist.DataParallel(nn.convert(m, backend), bucket_mb=1e-3)

    with config.change_flags({"dnn.deterministic": True}):
        eager = make()
        step = trainer(eager, backend=backend)
        x0, y0 = dnnkit.tensor(shards[0][0]), dnnkit.tensor(shards[0][1])
        for _ in range(3):              # the capture's three warm-up steps
            step(x0, y0)
        want = [step(dnnkit.tensor(x), dnnkit.tensor(y)).item() for x, y in shards[1:]]
        model = make()
        captured = graphs.capture(trainer(model, backend=backend), dnnkit.tensor(shards[0][0]),
                                  dnnkit.tensor(shards[0][1]), warmup=3)
        got = []
        for x, y in shards[1:]:
            captured.replay(x, y)
            got.append(captured.outputs.item())
    np.testing.assert_allclose(got, want, rtol=1e-5)
    worst = 0.0
    se, sg = eager.module.state_dict(), model.module.state_dict()
    for k, v in sg.items():
        if k.endswith("num_batches_tracked"):     # a host count: replays do not advance it
            continue
        np.testing.assert_allclose(v, se[k], rtol=1e-5, atol=1e-6, err_msg=k)
        worst = max(worst, float(np.abs(v - se[k]).max()))
    result = {"replays": captured.replays, "nodes": captured.nodes, "worst": worst,
              "buckets": len(model.buckets)}
    captured.close()
    return result


SCENARIOS = {"collectives": collectives, "data_parallel": data_parallel, "resnet": resnet,
             "sync_bn": sync_bn, "fault": fault, "graph": graph}

if __name__ == "__main__":
    g = dist.init()
    t0 = time.monotonic()
    result = SCENARIOS[sys.argv[1]](g, *sys.argv[2:])
    print(json.dumps({"rank": g.rank, "result": result, "elapsed": time.monotonic() - t0}),
          flush=True)
    dist.destroy()
