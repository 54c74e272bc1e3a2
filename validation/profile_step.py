"""Where the host's time per training step goes (the host path).

    python -m validation.profile_step [vgg|resnet18|lm] [cudnn|numba] [batch] [--steps N]
                                      [--dtype float32|float16] [--sample | --phases]

Builds the model as validation/train_bench.py does (SGD with momentum, cross-entropy), warms up,
then runs N steps (default 20) without waiting on the GPU inside the loop, and prints:
- by default, cProfile's functions by own and cumulative time (cProfile about doubles the cost
  of small Python calls and adds nothing to C calls: read its call counts, not its shares);
- ``--sample``: a statistical profile (validation/sampler.py: the stack every 0.5 ms, a C call
  charged to its caller), inclusive and self shares of the step;
- ``--phases``: the host time of zero_grad, forward, loss, backward and the optimizer step,
  medians over the steps.
"""

import argparse
import cProfile
import pstats
import statistics
import time

import numpy as np

import dnnkit
from dnnkit import models, nn, optim

PHASES = ("zero_grad", "forward", "loss", "backward", "optimizer")

def build(name, backend, batch, rng, dtype="float32"):
    if name == "lm":
        model = models.LSTMLanguageModel(10000, 650, 650, 2, dropout=0.0, seed=0, dtype=dtype)
        x = dnnkit.tensor(rng.integers(0, 10000, (35, batch)))
        y = dnnkit.tensor(rng.integers(0, 10000, (35 * batch,)))
    else:
        model = (models.vgg_cnn(seed=0, dtype=dtype) if name == "vgg"
                 else models.resnet18(seed=0, dtype=dtype))
        x = dnnkit.tensor(rng.standard_normal((batch, 3, 32, 32)).astype(dtype))
        y = dnnkit.tensor(rng.integers(0, 10, (batch,)))
    nn.convert(model, backend)
    opt = optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.convert(nn.CrossEntropyLoss(), backend)

    def step(phases=None):
        """One step; ``phases``: a list that gets the host seconds of each of PHASES."""
        t0 = time.perf_counter()
        opt.zero_grad()
        t1 = time.perf_counter()
        out = model(x)
        if name == "lm":
            out = out.reshape((-1, out.shape[-1]))
        t2 = time.perf_counter()
        loss = loss_fn(out, y)
        t3 = time.perf_counter()
        loss.backward()
        t4 = time.perf_counter()
        opt.step()
        if phases is not None:
            phases.append((t1 - t0, t2 - t1, t3 - t2, t4 - t3, time.perf_counter() - t4))
        return loss
    return step


def time_steps(step, steps):
    """(host ms per step to queue ``steps`` steps without waiting on the GPU, ms per step until
    the GPU has run them too), the GPU idle when they start."""
    from numba import cuda
    cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    t1 = time.perf_counter()
    cuda.synchronize()
    return (t1 - t0) * 1e3 / steps, (time.perf_counter() - t0) * 1e3 / steps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", default="vgg")
    ap.add_argument("backend", nargs="?", default="cudnn")
    ap.add_argument("batch", nargs="?", type=int, default=32)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--dtype", default="float32", choices=("float32", "float16"))
    ap.add_argument("--dump", default=None, help="write the pstats file here as well")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--sample", action="store_true", help="a statistical profile instead")
    mode.add_argument("--phases", action="store_true", help="host time per phase instead")
    a = ap.parse_args()
    from numba import cuda
    step = build(a.model, a.backend, a.batch, np.random.default_rng(0), a.dtype)
    for _ in range(5):
        step()
    cuda.synchronize()
    title = f"== {a.model} {a.dtype} {a.backend} batch {a.batch}: {a.steps} steps"
    if a.phases:
        times = []
        for _ in range(a.steps):
            step(times)
        cuda.synchronize()
        print(f"{title}; host us per phase (medians)")
        print(" ".join(f"{p:>10s}" for p in PHASES + ("step",)))
        print(" ".join(f"{statistics.median(t[i] for t in times) * 1e6:10.0f}"
                       for i in range(len(PHASES))) +
              f" {statistics.median(sum(t) for t in times) * 1e6:10.0f}")
        return
    if a.sample:
        from validation.sampler import Sampler
        with Sampler() as s:
            for _ in range(a.steps):
                step()
            cuda.synchronize()
        print(title)
        s.report(60)
        return
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(a.steps):
        step()
    pr.disable()
    print(f"unprofiled: {time_steps(step, a.steps)[0]:.2f} ms of host time per step")
    if a.dump:
        pr.dump_stats(a.dump)
    st = pstats.Stats(pr)
    print(f"{title}; {st.total_tt * 1e3 / a.steps:.2f} ms of host time per step (profiled)")
    st.sort_stats("tottime").print_stats(45)
    st.sort_stats("cumulative").print_stats(60)


if __name__ == "__main__":
    main()
