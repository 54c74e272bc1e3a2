"""A PyTorch model converted to dnnkit (dnnkit.torch.convert) against the same model
unconverted: the time of one training step.

    python -m validation.torch_bench [--quick] [--batch 32,128] [--out DIR]
    python -m validation.torch_bench --profile dnnkit-cudnn [--batch 32]

The model: ResNet-18 in its CIFAR form written in PyTorch (tests/torch/models.py), 3x32x32
images, float32, TF32 off and cuDNN's heuristic algorithm choice on both sides (PyTorch's
cudnn.benchmark off, as dnnkit's dnn.benchmark by default: the same kernels); a step is
forward, cross-entropy, backward and SGD with momentum 0.9 (PyTorch's optimizer in every
variant: only the layers differ). Variants:
``torch`` (unconverted, PyTorch's cuDNN), ``dnnkit-cudnn`` and ``dnnkit-numba`` (deep copies
converted to that backend), ``dnnkit-cudnn-fused`` and ``dnnkit-numba-fused`` (converted, then
``dnnkit.torch.fuse``: each batch norm with its relu and residual add in one call), and for
reference the step captured as a CUDA graph and replayed,
``torch+graph`` (``torch.cuda.graph``) and ``dnnkit-cudnn+graph`` (``dnnkit.torch.graph``).
First a check: the loss of the first step of each converted copy against PyTorch's, and of
each graph's first replay against PyTorch's eager step at that point (1e-3 relative). Then
interleaved rounds: each variant in turn runs K steps between two CUDA events on PyTorch's
current stream, no host wait inside; the median of the rounds' ms per step, and the host's
median wall time to queue a step (where it is near the GPU figure, the host bounds the step).
Prints a table with the ratios to ``torch`` (the issue's targets: cudnn <= 1.1x; numba within
the Numba path's targets of the training-speed issue, <= 1.5x PyTorch eager) and writes
DIR/torch_bench.json and torch_bench.md.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
import traceback

VARIANTS = ("torch", "dnnkit-cudnn", "dnnkit-numba", "dnnkit-cudnn-fused", "dnnkit-numba-fused")
TARGETS = {"dnnkit-cudnn": 1.1, "dnnkit-numba": 1.5, "dnnkit-cudnn-fused": 1.1,
           "dnnkit-numba-fused": 1.5}
# whole steps captured with torch.cuda.graph (dnnkit.torch.graph for the converted model) after
# WARM_STEPS eager steps on a side stream, replayed: PyTorch's own and the cuDNN-converted one
GRAPHED = ("torch+graph", "dnnkit-cudnn+graph")
WARM_STEPS = 3


def build(torch, batch):
    from tests.torch.models import ResNet18
    torch.manual_seed(0)
    model = ResNet18().cuda().train()
    x = torch.randn(batch, 3, 32, 32, device="cuda")
    y = torch.randint(0, 10, (batch,), device="cuda")
    return model, x, y


def trainer(torch, model):
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss
    return step


def variants(torch, batch):
    import dnnkit.torch as dt
    model, x, y = build(torch, batch)
    out = {}
    for name in VARIANTS:
        m = copy.deepcopy(model)
        if name != "torch":
            report = dt.convert(m, name.split("-")[1])
            if report.skipped:
                raise RuntimeError(f"{name}: layers left to PyTorch:\n{report}")
            if name.endswith("-fused"):
                m = dt.fuse(m)        # (a GraphModule of the same modules and Parameters)
        out[name] = trainer(torch, m)
    return out, x, y


def graphed(torch, batch):
    """({name: step} of the GRAPHED variants, x, y): each a deep copy of the model (converted
    for dnnkit-cudnn+graph) warmed up WARM_STEPS steps, its next step captured on x and y (the
    build's: equal to the timed ones, which a replay does not read) and replayed once. Checked:
    that replay's loss against an unconverted eager copy's loss after as many steps (1e-3
    relative)."""
    import dnnkit.torch as dt
    model, x, y = build(torch, batch)
    ref = trainer(torch, copy.deepcopy(model))
    for _ in range(WARM_STEPS + 1):
        want = float(ref(x, y))
    out = {}
    for name in GRAPHED:
        m = copy.deepcopy(model)
        if name.startswith("dnnkit"):
            dt.convert(m, "cudnn")
        step = trainer(torch, m)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(WARM_STEPS):
                step(x, y)
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with (dt.graph(g) if name.startswith("dnnkit") else torch.cuda.graph(g)):
            loss = step(x, y)
        g.replay()
        got = float(loss)
        if not abs(got - want) <= 1e-3 * abs(want):
            raise AssertionError(f"{name}: the first replay's loss {got} differs from the eager "
                                 f"step's {want}")
        out[name] = _replay(g, loss, step, x, y)
    return out, x, y


def _replay(g, loss, step, x, y):
    """A replay step of graph ``g``. It holds what the graph reads and writes at the addresses
    it captured: ``step`` (whose closure holds the model and the optimizer: parameters,
    gradients, momentum buffers) and the static inputs ``x`` and ``y``. PyTorch hands the
    memory of a tensor that died to the next one: compute-sanitizer caught the momentum update
    reading freed memory, and nll_loss's bounds assert caught targets overwritten, when they
    were not held."""
    def replay(*_):
        g.replay()
        return loss
    replay.keep = (step, x, y)
    return replay


def check(torch, steps, x, y):
    """The first step's loss of every variant against PyTorch's (they start equal)."""
    losses = {n: float(s(x, y)) for n, s in steps.items()}
    ref = losses["torch"]
    for n, v in losses.items():
        if abs(v - ref) > 1e-3 * abs(ref):
            raise AssertionError(f"{n}: first loss {v} differs from PyTorch's {ref}")
    return losses


def time_steps(torch, steps, x, y, warm, rounds, per_round):
    """{variant: (median GPU ms per step, median host ms to queue a step)}."""
    for s in steps.values():
        for _ in range(warm):
            s(x, y)
    torch.cuda.synchronize()
    ev = {n: [] for n in steps}
    host = {n: [] for n in steps}
    for _ in range(rounds):
        for n, s in steps.items():
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            torch.cuda.synchronize()    # each round on an idle GPU (train_bench's reason)
            t0 = time.perf_counter()
            start.record()
            for _ in range(per_round):
                s(x, y)
            end.record()
            host[n].append((time.perf_counter() - t0) * 1e3 / per_round)
            ev[n].append((start, end))
        torch.cuda.synchronize()
    return {n: (statistics.median(a.elapsed_time(b) / per_round for a, b in ev[n]),
                statistics.median(host[n])) for n in steps}


def table(gpu, rows):
    lines = [f"# dnnkit.torch: converted ResNet-18 (CIFAR) training step, {gpu}", "",
             "| batch | variant | GPU ms/step | host ms/step | x torch | target |",
             "|---:|---|---:|---:|---:|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['batch']} | {r.get('variant', '-')} | error: {r['error']} "
                         f"| | | |")
            continue
        base = r["times"]["torch"][0]
        for n, (ms, hms) in r["times"].items():
            ratio = ms / base
            target = TARGETS.get(n)
            verdict = "" if target is None else \
                f"<= {target}x: {'met' if ratio <= target else 'MISSED'}"
            lines.append(f"| {r['batch']} | {n} | {ms:.3f} | {hms:.3f} | {ratio:.2f} | "
                         f"{verdict} |")
    return "\n".join(lines)


def profile(torch, name, batch, steps=20):
    """cProfile of ``steps`` training steps of variant ``name`` after 5 warm-up steps; prints
    the functions by own and by cumulative time."""
    import cProfile
    import pstats
    step = variants(torch, batch)[0][name]
    _, x, y = build(torch, batch)
    for _ in range(5):
        step(x, y)
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        step(x, y)
    prof.disable()
    torch.cuda.synchronize()
    dump = os.environ.get("DNNKIT_PROFILE_DUMP")
    if dump:
        prof.dump_stats(dump)
    st = pstats.Stats(prof)
    print(f"== {name} batch {batch}: {st.total_tt * 1e3 / steps:.2f} ms of host time per step "
          f"(profiled)")
    st.sort_stats("tottime").print_stats(40)
    st.sort_stats("cumulative").print_stats(50)
    return 0


def cuda_torch(tool):
    """PyTorch set up as the benches compare (TF32 off; cuDNN's heuristics choose the
    algorithms on both sides, as dnnkit's dnn.benchmark is off by default: the same kernels,
    as train_bench compares), or None (said on stderr) without a CUDA GPU."""
    import torch
    if not torch.cuda.is_available():
        print(f"{tool}: needs PyTorch with a CUDA GPU", file=sys.stderr)
        return None
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.benchmark = False
    return torch


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="few rounds (a smoke run)")
    ap.add_argument("--batch", default="32,128", help="batch sizes, comma-separated")
    ap.add_argument("--out", default="validation/results", help="folder for the reports")
    ap.add_argument("--profile", choices=VARIANTS[1:], default=None,
                    help="instead of timing: cProfile 20 steps of this variant at the first "
                    "batch size (the host path; read its shares, not its milliseconds)")
    args = ap.parse_args(argv)
    torch = cuda_torch("torch_bench")
    if torch is None:
        return 2
    warm, rounds, per_round = (3, 3, 5) if args.quick else (10, 15, 20)
    gpu = torch.cuda.get_device_name()
    if args.profile:
        return profile(torch, args.profile, int(args.batch.split(",")[0]))
    rows = []
    for batch in (int(b) for b in args.batch.split(",")):
        try:
            steps, x, y = variants(torch, batch)
            losses = check(torch, steps, x, y)
            steps.update(graphed(torch, batch)[0])
            times = time_steps(torch, steps, x, y, warm, rounds, per_round)
            rows.append({"batch": batch, "first_loss": losses, "times": times})
        except Exception as e:      # noqa: BLE001 - a failing row is reported, the rest run
            traceback.print_exc()
            rows.append({"batch": batch, "error": f"{type(e).__name__}: {e}"})
    text = table(gpu, rows)
    print(text)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "torch_bench.json"), "w") as f:
        json.dump({"gpu": gpu, "rows": rows}, f, indent=1)
    with open(os.path.join(args.out, "torch_bench.md"), "w") as f:
        f.write(text + "\n")
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
