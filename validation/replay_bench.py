"""Host time of a Numba training step with and without the replays of dnnkit/replay.py, in one
process, interleaved (the lent machines' host speed moves between processes and leases):

    python -m validation.replay_bench [vgg|resnet18|lm ...] [--batch 32] [--dtype float32]
                                      [--rounds 6] [--steps 10]

Variants: ``off`` (no replay: each repeated Numba call without a runner of its own runs its
implementation), ``on`` (the default), ``only`` (replays, and the hand-written Numba runners of
the activations, batch normalization and the implicit-GEMM convolution switched off too).
Each round runs every variant, in an order rotated from round to round: 3 warm-up steps after
the memo is cleared, then ``steps`` steps timed without waiting on the GPU inside them (host
ms: the time to queue them) and with a synchronisation after the last (GPU ms: when the GPU
is the slower, host time cannot show a gain). Prints the medians per step and the median of
the per-round ratios of host ms to ``off``. Needs a GPU."""

import argparse
import statistics

import numpy as np


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="*", default=["vgg", "resnet18"])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--dtype", default="float32", choices=("float32", "float16"))
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=10)
    a = ap.parse_args(argv)
    from dnnkit import device, fastpath, registry, replay
    from validation.profile_step import build, time_steps
    real = replay.bind
    own = {op: impls["numba"].bind for op, impls in registry.REGISTRY.items()
           if "numba" in impls and impls["numba"].bind is not None}

    def variant(v):
        replay.bind = real if v != "off" else (lambda fn, args: None)
        for op, bind in own.items():
            registry.REGISTRY[op]["numba"].bind = None if v == "only" else bind
        fastpath.invalidate()

    print(f"{device.properties().name}; batch {a.batch}, {a.dtype}, Numba path; ms per step, "
          f"host (GPU)")
    print("| model | off | on | only | on/off (host) | only/off (host) |")
    print("|---|---|---|---|---|---|")
    try:
        for model in a.models:
            step = build(model, "numba", a.batch, np.random.default_rng(0), a.dtype)
            names = ["off", "on", "only"]
            got, gpu = {v: [] for v in names}, {v: [] for v in names}
            for r in range(a.rounds):
                for v in names[r % 3:] + names[:r % 3]:
                    variant(v)
                    for _ in range(3):
                        step()
                    host, done = time_steps(step, a.steps)
                    got[v].append(host)
                    gpu[v].append(done)
            med = {v: f"{statistics.median(got[v]):.2f} ({statistics.median(gpu[v]):.2f})"
                   for v in names}
            ratio = {v: statistics.median(x / y for x, y in zip(got[v], got["off"]))
                     for v in ("on", "only")}
            print(f"| {model} | {med['off']} | {med['on']} | {med['only']} | "
                  f"{ratio['on']:.2f} | {ratio['only']:.2f} |")
    finally:
        variant("on")


if __name__ == "__main__":
    main()
