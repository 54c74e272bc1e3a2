"""``python -m dnnkit demo``: train three small real models end to end with dnnkit.nn on
Tensors (``loss.backward()``, an optimizer step; the host reads the loss only every few steps).

1. A LeNet-style CNN (conv-BN-ReLU-pool x 2, linear) on handwritten digits: scikit-learn's
   bundled 8x8 digits (the optional ``demo`` extra), or, without scikit-learn, a generated set
   of 8x8 shapes (bars, diagonals, boxes, crosses with noise).
2. A residual CNN (dnnkit.models.resnet18, CIFAR form, narrowed) on the same digits.
3. An LSTM on a sequence task generated on the fly: is the majority of a bit sequence ones?

It prints the backend report, a progress bar per epoch (on stderr), the mean loss per epoch,
the held-out accuracy, and the per-op backend/time table (dnnkit.profile; on the simulator,
which measures no GPU time, the ops and their backends only). ``--backend`` pins the models
(dnnkit.nn.convert); ``--crosscheck`` trains a cuDNN copy and a Numba copy of each model side
by side on the same batches and reports how far their losses drift apart; ``--plot`` writes
the loss curves (matplotlib, without touching the backend the user chose). Without a GPU it
runs on Numba's CUDA simulator with tiny models and a few steps.
"""

import math
import sys
import time

import numpy as np

from . import backends, nn
from .autograd import no_grad
from .device import numba_cuda, simulator
from .errors import DnnkitError
from .models import ResNet
from .nn.loss import CrossEntropyLoss
from .optim import Adam
from .profile import profile
from .tensors import tensor


# ---------------------------------------------------------------- data

def digits(rng):
    """(x (N, 1, 8, 8) float32 in [0, 1], labels, name)."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        return shapes(rng, 1800) + ("generated 8x8 shapes (scikit-learn not installed)",)
    d = load_digits()
    return (d.images[:, None].astype(np.float32) / 16.0, d.target.astype(np.int64),
            "scikit-learn 8x8 digits")


def shapes(rng, n):
    """n noisy 8x8 images of 4 classes: horizontal bar, vertical bar, diagonal, box."""
    x = rng.uniform(0, 0.3, (n, 1, 8, 8)).astype(np.float32)
    y = rng.integers(0, 4, n)
    for i, c in enumerate(y):
        a, b = rng.integers(1, 6, 2)
        img = x[i, 0]
        if c == 0:
            img[a, 1:7] = 1
        elif c == 1:
            img[1:7, b] = 1
        elif c == 2:
            idx = np.arange(6)
            img[idx + 1, idx + 1] = 1
        else:
            img[a:a + 3, b] = img[a:a + 3, b + 2] = img[a, b:b + 3] = img[a + 2, b:b + 3] = 1
    return x, y.astype(np.int64)


def majority(rng, n, t):
    """Bit sequences (T, n, 1) and whether more than half of each is ones (t odd: no ties)."""
    bits = rng.integers(0, 2, (t, n, 1))
    return bits.astype(np.float32), (bits.sum(axis=0)[:, 0] > t // 2).astype(np.int64)


# ---------------------------------------------------------------- models

class LastStep(nn.Module):
    """(T, N, H) -> (N, H): the last time step (a view; its gradient puts dy at the last step
    of a zero (T, N, H) gradient)."""

    def forward(self, y):
        return y[y.shape[0] - 1]


def cnn(classes, width, seed):
    c1, c2 = width, 2 * width
    return nn.Sequential(
        nn.Conv2d(1, c1, 3, padding=1, seed=seed), nn.BatchNorm2d(c1), nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(c1, c2, 3, padding=1, seed=seed + 1), nn.BatchNorm2d(c2), nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(c2 * 4, classes, seed=seed + 2))


def resnet(classes, width, seed, blocks=(2, 2, 2, 2)):
    """ResNet-18's CIFAR form on one-channel 8x8 images (8 -> 4 -> 2 -> 1 over the stages);
    ``blocks`` fewer for the simulator."""
    return ResNet(blocks, classes, width=width, in_channels=1, seed=seed)


def lstm(hidden, seed):
    return nn.Sequential(nn.LSTM(1, hidden, seed=seed), LastStep(), nn.Linear(hidden, 2,
                                                                          seed=seed + 1))


# ---------------------------------------------------------------- training

def _bar(it, total, desc):
    try:
        from tqdm import tqdm
        return tqdm(it, total=total, desc=desc, leave=False, file=sys.stderr)
    except ImportError:
        return it


def _batches(n, batch, rng, steps):
    order = rng.permutation(n)
    count = n // batch if steps is None else min(steps, n // batch)
    return [order[i * batch:(i + 1) * batch] for i in range(count)]


def step(model, loss_fn, opt, xb, yb):
    """One training step on device Tensors; returns the loss, a 0-d Tensor not yet read (the
    host queues the step and goes on)."""
    model.train()
    loss = loss_fn(model(xb), yb)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss.detach()


def accuracy(model, x, y, batch, axis=0):
    model.eval()
    right = 0
    with no_grad():
        for i in range(0, len(y), batch):
            xb = x[i:i + batch] if axis == 0 else x[:, i:i + batch]
            logits = model(tensor(np.ascontiguousarray(xb)))
            right += int((logits.numpy().argmax(axis=1) == y[i:i + batch]).sum())
    return right / max(1, len(y))


def shard(idx, rank, world):
    """This rank's share of a batch's indices: ``world`` nearly equal consecutive parts."""
    return np.array_split(idx, world)[rank] if world > 1 else idx


def train(name, models, data, cfg, rng, log, read_every=10, rank=0, world=1):
    """Train each of ``models`` ({label: model}) on the same batches (rank ``rank`` of
    ``world`` data-parallel processes takes its share of each). The losses are summed on
    the device and read (``item()``, which waits for the GPU) every ``read_every`` steps and
    at the end of an epoch. Returns the loss curves ({label: [per-epoch mean loss of this
    rank's shares]}) and the held-out accuracies."""
    (xtr, ytr), (xte, yte), axis = data
    opts = {k: Adam(m.parameters(), lr=cfg["lr"]) for k, m in models.items()}
    loss_fn = {k: nn.convert(CrossEntropyLoss(), k) for k in models}
    curves = {k: [] for k in models}
    for epoch in range(cfg["epochs"]):
        batches = _batches(len(ytr), cfg["batch"], rng, cfg["steps"])
        sums = {k: [None, 0.0] for k in models}      # device sum since the last read, host
        t0 = time.perf_counter()
        # the epoch's batches go to the device before its first step (a copy from pageable
        # host memory waits for the GPU: inside the loop it would stall every step)
        parts = [shard(idx, rank, world) for idx in batches]
        dev = [(tensor(np.ascontiguousarray(xtr[idx] if axis == 0 else xtr[:, idx])),
                tensor(ytr[idx])) for idx in parts]
        bar = _bar(dev, len(dev), f"{name} epoch {epoch + 1}") if rank == 0 else dev
        for i, (xb, yb) in enumerate(bar):
            for k, m in models.items():
                loss = step(m, loss_fn[k], opts[k], xb, yb)
                s = sums[k]
                with no_grad():
                    s[0] = loss if s[0] is None else s[0] + loss
                if (i + 1) % read_every == 0 or i + 1 == len(batches):
                    s[1] += s[0].item()
                    s[0] = None
                    if hasattr(bar, "set_postfix") and k == next(iter(models)):
                        bar.set_postfix(loss=f"{s[1] / (i + 1):.4f}")
        for k, (_, total) in sums.items():
            curves[k].append(total / max(1, len(batches)))
            log(f"{name} [{k}] epoch {epoch + 1}: loss {curves[k][-1]:.4f} "
                f"({time.perf_counter() - t0:.1f} s)")
    accs = {k: accuracy(m, xte, yte, cfg["batch"], axis) for k, m in models.items()}
    for k, a in accs.items():
        log(f"{name} [{k}] held-out accuracy: {a:.3f}")
    return curves, accs


def _config(tiny):
    if tiny:   # the CUDA simulator: one Python thread per CUDA thread
        return dict(cnn=dict(epochs=2, batch=2, steps=1, lr=0.01, width=2),
                    resnet=dict(epochs=2, batch=2, steps=1, lr=0.01, width=2, blocks=(1,)),
                    lstm=dict(epochs=2, batch=4, steps=2, lr=0.02, hidden=2, t=3),
                    test=4)
    # width 16: held-out 0.983-0.997 over six seeds on an H100 (width 8: 0.953-0.989;
    # shifting the training images by a pixel made it worse); validation/demo_accuracy.py
    return dict(cnn=dict(epochs=8, batch=64, steps=None, lr=0.01, width=16),
                resnet=dict(epochs=8, batch=64, steps=None, lr=0.01, width=16,
                            blocks=(2, 2, 2, 2)),
                lstm=dict(epochs=10, batch=64, steps=None, lr=0.01, hidden=32, t=15),
                test=None)


def datasets(rng, cfg, tiny):
    """(cnn data, lstm data, number of digit classes, a one-line summary); each data is
    ((x train, y train), (x test, y test), batch axis)."""
    x, y, source = digits(rng)
    order = rng.permutation(len(y))        # the digits come grouped by writer: shuffle first
    x, y = x[order], y[order]
    split = int(0.8 * len(y))
    n_test = cfg["test"] or len(y) - split
    data_cnn = ((x[:split], y[:split]), (x[split:split + n_test], y[split:split + n_test]), 0)
    t = cfg["lstm"]["t"]
    xs, ys = majority(rng, 2000 if not tiny else 64, t)
    data_lstm = ((xs[:, :-n_test], ys[:-n_test]), (xs[:, -n_test:], ys[-n_test:]), 1)
    summary = (f"data: {source}, {split} train / {n_test} test images; majority of {t} bits, "
               f"{len(ys) - n_test} train / {n_test} test sequences")
    return data_cnn, data_lstm, len(np.unique(y)), summary


def run(backend="auto", crosscheck=False, plot=None, seed=0, log=print, data_parallel=False):
    """The demo; returns {model name: held-out accuracy per trained copy}. With
    ``data_parallel`` this process is one rank of a ``dnnkit.distributed`` job (the launcher's
    environment; alone, rank 0 of 1): each model is wrapped in ``DataParallel``, each batch is
    split between the ranks, and only rank 0 reports."""
    if not data_parallel:
        return _run(backend, crosscheck, plot, seed, log)
    if crosscheck:
        raise ValueError("demo: crosscheck trains two copies on one GPU; it does not combine "
                         "with data-parallel training")
    import dnnkit.distributed as dist     # deferred: the optional NCCL binding
    dist.init()
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        return _run(backend, False, plot if rank == 0 else None, seed,
                    log if rank == 0 else (lambda *_: None),
                    parallel=(rank, world, dist.DataParallel))
    finally:
        dist.destroy()


def launch(gpus, argv):
    """``demo --gpus N`` outside a job: start N ranks of ``python -m dnnkit`` with ``argv``
    through dnnkit.distributed's launcher; their exit status."""
    import subprocess
    have = 0 if simulator() else len(numba_cuda().gpus)
    if have < gpus:
        raise DnnkitError(f"demo: --gpus {gpus} needs {gpus} GPUs; this machine has {have}"
                         f"{' (Numba CUDA simulator)' if simulator() else ''}")
    return subprocess.call([sys.executable, "-m", "dnnkit.distributed.run", "--gpus",
                            str(gpus), "-m", "dnnkit", *argv])


def _run(backend, crosscheck, plot, seed, log, parallel=None):
    rank, world, wrap = parallel or (0, 1, None)
    st = backends.status()
    log(str(st) + "\n")
    tiny = simulator()
    if tiny:
        log("No GPU: running on Numba's CUDA simulator with tiny models and a few steps; "
            "accuracies are not meaningful there.\n")
    labels = [backend]
    if crosscheck:
        if not st.cudnn_available:
            log(f"--crosscheck needs cuDNN ({st.cudnn_reason}); training on {backend} only")
        else:
            labels = ["cudnn", "numba"]
    cfg = _config(tiny)
    rng = np.random.default_rng(seed)
    data_cnn, data_lstm, classes, summary = datasets(rng, cfg, tiny)
    log(summary + "\n")
    results, curves = {}, {}
    rc = cfg["resnet"]
    with profile() as prof:
        for name, make, data, c in (
                ("cnn", lambda: cnn(classes, cfg["cnn"]["width"], seed), data_cnn,
                 cfg["cnn"]),
                ("resnet", lambda: resnet(classes, rc["width"], seed, rc["blocks"]), data_cnn,
                 rc),
                ("lstm", lambda: lstm(cfg["lstm"]["hidden"], seed), data_lstm, cfg["lstm"])):
            models = {k: nn.convert(make(), k) for k in labels}
            log(f"{name}: {models[labels[0]]}")
            if wrap is not None:
                models = {k: wrap(m) for k, m in models.items()}
                log(f"{name}: DataParallel over {world} GPU(s), "
                    f"{len(models[labels[0]].buckets)} gradient bucket(s)")
            curves[name], results[name] = train(name, models, data, c, rng, log,
                                                rank=rank, world=world)
            if len(labels) == 2:
                a, b = (np.array(curves[name][k]) for k in labels)
                gap = np.abs(a - b).max()
                log(f"{name} crosscheck: max |loss(cudnn) - loss(numba)| over epochs {gap:.2e} "
                    f"(relative {gap / max(1e-12, np.abs(b).max()):.2e})")
    if tiny:
        rows = sorted(prof.rows.values(), key=lambda r: (r.op, r.backend))
        log("\nper-op backends (dnnkit.profile; the simulator measures no GPU time, so no "
            "times are shown):\n" + "\n".join(f"{r.op:<28} {r.backend:<8} {r.calls:>7} calls"
                                              for r in rows))
    else:
        log("\nper-op time (dnnkit.profile):\n" + prof.table())
    if plot:
        _plot(curves, plot, log)
    return results


def _plot(curves, path, log):
    """The loss curves as an image file. A bare ``Figure`` draws and saves without pyplot, so
    the matplotlib backend (the user's choice, or matplotlib's) is neither set nor started."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        log("--plot needs matplotlib (pip install dnnkit[demo]); no plot written")
        return
    fig = Figure(figsize=(5 * len(curves), 3.5))
    axes = fig.subplots(1, len(curves))
    for ax, (name, per) in zip(np.atleast_1d(axes), curves.items()):
        for label, c in per.items():
            ax.plot(range(1, len(c) + 1), c, marker="o", label=label)
        ax.set(title=name, xlabel="epoch", ylabel="training loss")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    log(f"loss curves written to {path}")


def finite(results):
    return all(math.isfinite(a) for r in results.values() for a in r.values())
