"""Data-parallel scaling on the GPUs of one host: ``dnnkit.distributed.DataParallel`` on 2 (and
4) GPUs against one GPU, with a fixed batch per GPU (weak scaling, as DDP is measured).

    python -m validation.dist_bench [--gpus 1,2] [--models resnet18,vgg] [--batch 128]
                                    [--steps 10] [--rounds 5] [--socket] [--out DIR]

Rows: ResNet-18 (CIFAR form) and the VGG-style CNN on 3x32x32 images, float32, the cuDNN path,
SGD with momentum. Every GPU count runs in its own launch (``python -m dnnkit.distributed.run
--gpus N -m validation.dist_bench``); each rank times its steps and rank 0 writes the figures.
Variants on more than one GPU:

- ``overlap``: DataParallel with 25 MiB buckets (the first 1 MiB), each all-reduced on the
  communication stream as soon as its gradients are ready, while backward goes on (what users
  run);
- ``one bucket``: a single bucket (first bucket as large), so the all-reduce starts after the
  whole backward (no overlap);
- ``no comm``: the same step under ``no_sync()`` (no all-reduce): the compute alone;
- ``overlap, graphed``: the ``overlap`` step captured into a CUDA graph
  (``dnnkit.graphs.capture``: the bucket copies and NCCL all-reduces are recorded with the
  rest) and replayed, against one GPU's graphed step (``local, graphed``): the scaling with
  the host's time per step out of the way.

``host ms`` is the host's time to queue a step (when the GPU's launch queue fills, the host
waits for room, so near ms/step it says little about which side bounds the step);
``host fwd/bwd/opt`` splits it into the forward with the loss (DataParallel's buffer
broadcast included), the backward (the bucket launches included) and the optimizer step.
A host time of DataParallel's well above ``no comm``'s, growing with the GPU count, is host
work per collective; ms/step equal to host ms means the step is host-bound.
The all-reduce's share of a step is (variant - no comm) / variant. Scaling is the N-GPU
throughput (images per second over all ranks) over the one-GPU throughput of a plain model.
``--socket`` repeats the multi-GPU launches with ``NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1``:
NCCL's socket transport between the processes, standing for two hosts. ``--env K=V[,K=V]``
repeats them with those variables set (``NCCL_MAX_CTAS=8``: fewer of NCCL's blocks on the SMs
beside backward), named in the ``transport`` column.
``DNNKIT_DIST_PROFILE=PATH`` writes a cProfile of rank 0's ``overlap`` steps to PATH.<model>.

Timing: K steps between two ``cuda.synchronize()`` calls (no host wait inside them), the
median of the rounds, after warm-up steps; the ranks start each round together (a barrier),
and the variants take turns round by round.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

MODELS = ("resnet18", "vgg")


def _args(argv=None):
    p = argparse.ArgumentParser(prog="python -m validation.dist_bench")
    p.add_argument("--gpus", default=None, help="GPU counts, e.g. 1,2 (default: 1, 2, and 4 "
                                                "when the host has 4)")
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--batch", type=int, default=128, help="images per GPU per step")
    p.add_argument("--steps", type=int, default=10, help="steps per timed round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--warm", type=int, default=5)
    p.add_argument("--socket", action="store_true",
                   help="also run the multi-GPU launches on NCCL's socket transport")
    p.add_argument("--env", action="append", default=[],
                   help="also run the multi-GPU launches with these variables (K=V[,K=V])")
    p.add_argument("--out", default=None, help="folder for dist_bench.json and .md")
    p.add_argument("--result", default=None, help=argparse.SUPPRESS)   # a rank's output file
    return p.parse_args(argv)


# ---------------------------------------------------------------- one rank

def _model(name, dtype="float32"):
    from dnnkit import models, nn
    m = models.resnet18(dtype=dtype) if name == "resnet18" else models.vgg_cnn(dtype=dtype)
    return nn.convert(m, "cudnn")


def _sync(dist):
    from numba import cuda
    cuda.synchronize()
    if dist.get_world_size() > 1:
        dist.barrier()
        cuda.synchronize()


def _profiler(rank, variant):
    """With DNNKIT_DIST_PROFILE=PATH: a running cProfile of rank 0's rounds of the
    ``overlap`` variant (dumped to PATH.<model>), to see where a host-bound step's time goes."""
    if rank != 0 or variant != "overlap" or "DNNKIT_DIST_PROFILE" not in os.environ:
        return None
    import cProfile
    p = cProfile.Profile()
    p.enable()
    return p


def rank_main(opts):
    import numpy as np

    import dnnkit
    import dnnkit.distributed as dist
    from dnnkit import graphs, nn, optim
    from numba import cuda

    dist.init()
    try:
        world, rank = dist.get_world_size(), dist.get_rank()
        rng = np.random.default_rng(rank)
        x = dnnkit.tensor(rng.standard_normal((opts.batch, 3, 32, 32)).astype(np.float32))
        y = dnnkit.tensor(rng.integers(0, 10, opts.batch).astype(np.int64))
        loss_fn = nn.convert(nn.CrossEntropyLoss(), "cudnn")
        rows = []
        for name in opts.models.split(","):
            model = _model(name)
            variants = {"local": dict(dp=False), "local, graphed": dict(dp=False, graph=True)
                        } if world == 1 else {
                "no comm": dict(dp=True, bucket_mb=25, first_mb=1, no_sync=True),
                "overlap": dict(dp=True, bucket_mb=25, first_mb=1),
                "one bucket": dict(dp=True, bucket_mb=100000, first_mb=100000),
                "overlap, graphed": dict(dp=True, bucket_mb=25, first_mb=1, graph=True)}
            times = {v: [] for v in variants}
            host = {v: [] for v in variants}
            phases = {v: [] for v in variants}     # per round: [fwd, bwd, opt] host ms
            buckets = {}
            # Interleaved rounds: each variant in turn wraps the model afresh, warms up and
            # runs K steps, so that a drift of the clocks or of the other rank's pace over the
            # run falls on every variant alike.
            for r in range(opts.rounds):
                for variant, how in variants.items():
                    net = (dist.DataParallel(model, bucket_mb=how["bucket_mb"],
                                             first_bucket_mb=how["first_mb"])
                           if how["dp"] else model)
                    opt = optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
                    split = [0.0, 0.0, 0.0]

                    def step():
                        t0 = time.perf_counter()
                        opt.zero_grad()
                        loss = loss_fn(net(x), y)
                        t1 = time.perf_counter()
                        if how.get("no_sync"):
                            with net.no_sync():
                                loss.backward()
                        else:
                            loss.backward()
                        t2 = time.perf_counter()
                        opt.step()
                        t3 = time.perf_counter()
                        split[0] += t1 - t0
                        split[1] += t2 - t1
                        split[2] += t3 - t2

                    warm, graph, run = opts.warm if r == 0 else 2, None, step
                    if how.get("graph"):
                        # the step reads x and y, the static inputs; the warm-up steps run
                        # inside capture(), then one step is recorded
                        graph = graphs.capture(lambda xs, ys: step(), x, y, warmup=warm)
                        run = graph.replay
                    else:
                        for _ in range(warm):
                            step()
                    _sync(dist)
                    split[:] = [0.0, 0.0, 0.0]
                    prof = _profiler(rank, variant)
                    t0 = time.perf_counter()
                    for _ in range(opts.steps):
                        run()
                    queued = time.perf_counter()
                    if prof is not None:
                        prof.disable()
                        prof.dump_stats(os.environ["DNNKIT_DIST_PROFILE"] + f".{name}")
                    cuda.synchronize()
                    times[variant].append((time.perf_counter() - t0) * 1e3 / opts.steps)
                    host[variant].append((queued - t0) * 1e3 / opts.steps)
                    phases[variant].append([v * 1e3 / opts.steps for v in split])
                    buckets[variant] = len(net.buckets) if how["dp"] else 0
                    if graph is not None:
                        graph.close()
                    if how["dp"]:
                        net.close()
            for variant, ts in times.items():
                ms = statistics.median(ts)
                rows.append(dict(model=name, gpus=world, variant=variant, ms=ms,
                                 host_ms=statistics.median(host[variant]),
                                 host_split=[statistics.median(p[k] for p in phases[variant])
                                             for k in range(3)],
                                 images_s=world * opts.batch / ms * 1e3,
                                 buckets=buckets[variant], rounds=ts))
        if rank == 0 and opts.result:
            with open(opts.result, "w") as f:
                json.dump(rows, f)
    finally:
        dist.destroy()


# ---------------------------------------------------------------- the launches

def _launch(n, opts, socket=False, extra=None):
    fd, result = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    env = dict(os.environ)
    if socket:
        env.update(NCCL_P2P_DISABLE="1", NCCL_SHM_DISABLE="1")
    if extra:
        env.update(kv.split("=", 1) for kv in extra.split(","))
    cmd = [sys.executable, "-m", "dnnkit.distributed.run", "--gpus", str(n), "-m",
           "validation.dist_bench", "--models", opts.models, "--batch", str(opts.batch),
           "--steps", str(opts.steps), "--rounds", str(opts.rounds), "--warm", str(opts.warm),
           "--result", result]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    try:
        if r.returncode != 0:
            raise RuntimeError(f"{n} GPUs{' (socket)' if socket else ''} {extra or ''}: exit "
                               f"{r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
        with open(result) as f:
            rows = json.load(f)
    finally:
        os.unlink(result)
    for row in rows:
        row["transport"] = ("socket" if socket else "default") + (f" {extra}" if extra else "")
    return rows


def _graphed(variant):
    return variant.endswith("graphed")


def table(rows):
    """Scaling: a graphed variant against one GPU's graphed step, the others against one
    GPU's plain step."""
    base = {(r["model"], _graphed(r["variant"])): r["images_s"] for r in rows
            if r["gpus"] == 1}
    comp = {(r["model"], r["gpus"], r["transport"]): r["ms"] for r in rows
            if r["variant"] == "no comm"}
    lines = ["| model | GPUs | transport | variant | ms/step | host ms | host fwd/bwd/opt | "
             "images/s | scaling | all-reduce share |", "|---" * 10 + "|"]
    for r in rows:
        b = base.get((r["model"], _graphed(r["variant"])))
        scale = r["images_s"] / b if b else float("nan")
        c = comp.get((r["model"], r["gpus"], r["transport"]))
        share = (f"{(r['ms'] - c) / r['ms']:.0%}" if c is not None and r["variant"] != "no comm"
                 and not _graphed(r["variant"]) else "")
        split = "/".join(f"{v:.2f}" for v in r.get("host_split") or ())
        lines.append(f"| {r['model']} | {r['gpus']} | {r['transport']} | {r['variant']} | "
                     f"{r['ms']:.2f} | {r['host_ms']:.2f} | {split} | {r['images_s']:.0f} | "
                     f"{scale:.2f}x | {share} |")
    return "\n".join(lines)


def main(argv=None):
    opts = _args(argv)
    if "RANK" in os.environ:
        return rank_main(opts)
    from numba import cuda
    have = len(cuda.gpus)
    counts = ([int(c) for c in opts.gpus.split(",")] if opts.gpus
              else [n for n in (1, 2, 4) if n <= have])
    name = cuda.get_current_device().name
    name = name.decode() if isinstance(name, bytes) else name
    rows, errors = [], []
    for n in counts:
        runs = [(False, None)]
        if n > 1:
            runs += [(True, None)] * opts.socket + [(False, e) for e in opts.env]
        for socket, extra in runs:
            try:
                rows += _launch(n, opts, socket, extra)
            except Exception as e:   # one failed launch must not hide the others' figures
                errors.append(str(e))
                print(e, file=sys.stderr)
    text = (f"# Data-parallel scaling, {name} x{have}, batch {opts.batch} per GPU, float32, "
            f"cuDNN path\n\n{table(rows)}\n")
    print(text)
    if opts.out:
        os.makedirs(opts.out, exist_ok=True)
        with open(os.path.join(opts.out, "dist_bench.json"), "w") as f:
            json.dump(dict(gpu=name, rows=rows, errors=errors), f, indent=1)
        with open(os.path.join(opts.out, "dist_bench.md"), "w") as f:
            f.write(text)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
