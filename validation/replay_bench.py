"""Host time of a Numba training step with and without the replays of dnnkit/replay.py, in one
process, interleaved (the lent machines' host speed moves between processes and leases):

    python -m validation.replay_bench [vgg|resnet18|lm ...] [--batch 32] [--dtype float32]
                                      [--rounds 6] [--steps 10]

Variants: ``off`` (no replay: each repeated Numba call without a runner of its own runs its
implementation), ``on`` (the default), ``only`` (replays, and the hand-written Numba runners of
the activations, batch normalization and the implicit-GEMM convolution switched off too).
Each round runs every variant: 3 warm-up steps after the memo is cleared, then ``steps`` steps
timed without waiting on the GPU inside them. Prints the median ms per step and the median of
the per-round ratios to ``off``. Needs a GPU."""

import argparse
import statistics
import time

import numpy as np


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="*", default=["vgg", "resnet18"])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--dtype", default="float32", choices=("float32", "float16"))
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=10)
    a = ap.parse_args(argv)
    from numba import cuda

    from dnnkit import device, fastpath, registry, replay
    from validation.profile_step import build
    real = replay.bind
    own = {op: impls["numba"].bind for op, impls in registry.REGISTRY.items()
           if "numba" in impls and impls["numba"].bind is not None}

    def variant(v):
        replay.bind = real if v != "off" else (lambda fn, args: None)
        for op, bind in own.items():
            registry.REGISTRY[op]["numba"].bind = None if v == "only" else bind
        fastpath.invalidate()

    print(f"{device.properties().name}; batch {a.batch}, {a.dtype}, Numba path; host ms per step")
    print("| model | off | on | only | on/off | only/off |")
    print("|---|---|---|---|---|---|")
    try:
        for model in a.models:
            step = build(model, "numba", a.batch, np.random.default_rng(0), a.dtype)
            got = {v: [] for v in ("off", "on", "only")}
            for _ in range(a.rounds):
                for v in got:
                    variant(v)
                    for _ in range(3):
                        step()
                    cuda.synchronize()
                    t0 = time.perf_counter()
                    for _ in range(a.steps):
                        step()
                    got[v].append((time.perf_counter() - t0) / a.steps * 1e3)
                    cuda.synchronize()
            med = {v: statistics.median(t) for v, t in got.items()}
            ratio = {v: statistics.median(x / y for x, y in zip(got[v], got["off"]))
                     for v in ("on", "only")}
            print(f"| {model} | {med['off']:.2f} | {med['on']:.2f} | {med['only']:.2f} | "
                  f"{ratio['on']:.2f} | {ratio['only']:.2f} |")
    finally:
        variant("on")


if __name__ == "__main__":
    main()
