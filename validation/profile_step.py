"""cProfile of whole training steps (host path): where the host's time per step goes.

    python -m validation.profile_step [vgg|resnet18|lm] [cudnn|numba] [batch] [--steps N]
                                      [--dtype float32|float16]

Builds the model as validation/train_bench.py does (SGD with momentum, cross-entropy), warms up,
then profiles N steps (default 20) without waiting on the GPU inside the loop. Prints the
functions by own time and by cumulative time, and the calls per step of the busiest ones."""

import argparse
import cProfile
import pstats
import time

import numpy as np

import dnnkit
from dnnkit import models, nn, optim


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

    def step():
        opt.zero_grad()
        out = model(x)
        if name == "lm":
            out = out.reshape((-1, out.shape[-1]))
        loss = loss_fn(out, y)
        loss.backward()
        opt.step()
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
    a = ap.parse_args()
    from numba import cuda
    step = build(a.model, a.backend, a.batch, np.random.default_rng(0), a.dtype)
    for _ in range(5):
        step()
    cuda.synchronize()
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(a.steps):
        step()
    pr.disable()
    print(f"unprofiled: {time_steps(step, a.steps)[0]:.2f} ms of host time per step")
    if a.dump:
        pr.dump_stats(a.dump)
    st = pstats.Stats(pr)
    print(f"== {a.model} {a.dtype} {a.backend} batch {a.batch}: {a.steps} steps; "
          f"{st.total_tt * 1e3 / a.steps:.2f} ms of host time per step (profiled)")
    st.sort_stats("tottime").print_stats(45)
    st.sort_stats("cumulative").print_stats(60)


if __name__ == "__main__":
    main()
