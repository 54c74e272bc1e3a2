"""The three models of dnnkit.models trained briefly on each backend, on generated data: the
held-out accuracy each reaches, the time per training step, and how closely the backends
agree on one training step (dnnkit.testing.compare_backends). Needs a GPU.

    python -m validation.models_report [--steps 150] [--out DIR]

Data (made here, so the report needs no download):
- images: 10 classes, each a fixed random smooth 3x32x32 pattern; a sample is its class's
  pattern times a random gain plus Gaussian noise of the pattern's size (chance: 10%);
- text: a Markov chain over 64 tokens in which each token has two likely successors (0.6 and
  0.3) and the rest share 0.1; next-token accuracy of the best predictor is 60%, chance 1.6%.
Each model starts from the same parameters on both backends (the same seed), trains with
SGD + momentum (CNNs) or Adam (the LM) on the same batches, and is evaluated on held-out
batches. Writes DIR/models_report.md and prints it.
"""

import argparse
import os
import sys
import time

import numpy as np

import dnnkit
from dnnkit import config, models, nn, optim

POLICY = {"cudnn": "forced", "numba": "disabled"}


def image_data(rng, n, templates):
    y = rng.integers(0, len(templates), n)
    gain = rng.uniform(0.5, 1.5, (n, 1, 1, 1))
    x = templates[y] * gain + rng.standard_normal((n,) + templates.shape[1:])
    return x.astype(np.float32), y.astype(np.int64)


def smooth_templates(rng, classes=10, shape=(3, 32, 32)):
    t = rng.standard_normal((classes,) + shape)
    for axis in (2, 3):                       # a few passes of a box blur: smooth patterns
        for _ in range(3):
            t = (t + np.roll(t, 1, axis) + np.roll(t, -1, axis)) / 3
    return t / t.std(axis=(1, 2, 3), keepdims=True)


def markov(rng, vocab=64):
    p = np.full((vocab, vocab), 0.1 / (vocab - 2))
    for i in range(vocab):
        a, b = rng.choice(vocab, 2, replace=False)
        p[i, a], p[i, b] = 0.6, 0.3
    return p / p.sum(1, keepdims=True)


def text_batch(rng, p, steps, batch):
    ids = np.empty((steps + 1, batch), np.int64)
    ids[0] = rng.integers(0, len(p), batch)
    cum = p.cumsum(1)
    for t in range(steps):
        u = rng.random(batch)
        ids[t + 1] = (u[:, None] > cum[ids[t]]).sum(1).clip(0, len(p) - 1)
    return ids[:-1], ids[1:]


def _accuracy(logits, y):
    pred = logits.numpy().reshape(-1, logits.shape[-1] if logits.ndim == 3 else
                                  logits.shape[1]).argmax(1)
    return float((pred == y.reshape(-1)).mean())


def train_cnn(make, backend, steps, seed, batch=32):
    rng = np.random.default_rng(seed)
    templates = smooth_templates(np.random.default_rng(1))
    with config.change_flags({"dnn.enabled": POLICY[backend]}):
        model = make()
        opt = optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
        loss_fn = nn.CrossEntropyLoss()
        batches = [tuple(map(dnnkit.tensor, image_data(rng, batch, templates)))
                   for _ in range(steps)]
        loss, t0 = None, time.perf_counter()
        for i, (xt, yt) in enumerate(batches):
            if i == steps // 2 and loss is not None:
                loss.item()
                t0 = time.perf_counter()    # the second half, between two synchronisations
            opt.zero_grad()
            loss = loss_fn(model(xt), yt)
            loss.backward()
            opt.step()
        last = loss.item()
        ms = (time.perf_counter() - t0) / (steps - steps // 2) * 1e3
        model.eval()
        test = np.random.default_rng(999)
        accs = []
        with dnnkit.no_grad():
            for _ in range(8):
                x, y = image_data(test, 64, templates)
                accs.append(_accuracy(model(dnnkit.tensor(x)), y))
    return float(np.mean(accs)), last, ms


def train_lm(backend, steps, seed, batch=32, bptt=35):
    rng = np.random.default_rng(seed)
    p = markov(np.random.default_rng(2))
    with config.change_flags({"dnn.enabled": POLICY[backend]}):
        model = models.LSTMLanguageModel(len(p), 64, 128, layers=2, dropout=0.0)
        opt = optim.Adam(model.parameters(), lr=3e-3)
        loss_fn = nn.CrossEntropyLoss()
        batches = []
        for _ in range(steps):
            x, y = text_batch(rng, p, bptt, batch)
            batches.append((dnnkit.tensor(x), dnnkit.tensor(y.reshape(-1))))
        loss, t0 = None, time.perf_counter()
        for i, (xt, yt) in enumerate(batches):
            if i == steps // 2 and loss is not None:
                loss.item()
                t0 = time.perf_counter()
            opt.zero_grad()
            logits, _ = model(xt)
            loss = loss_fn(logits.reshape(-1, len(p)), yt)
            loss.backward()
            opt.step()
        last = loss.item()
        ms = (time.perf_counter() - t0) / (steps - steps // 2) * 1e3
        model.eval()
        test = np.random.default_rng(999)
        accs = []
        with dnnkit.no_grad():
            for _ in range(4):
                x, y = text_batch(test, p, bptt, batch)
                logits, _ = model(dnnkit.tensor(x))
                accs.append(_accuracy(logits, y))
    return float(np.mean(accs)), last, ms


def agreement(make, inputs, loss_of):
    """compare_backends on one training step from the same parameters: the worst relative
    error over every op's output and gradient, and the op it occurs at."""
    model = make()
    loss_fn = nn.CrossEntropyLoss()

    def step(*xs):
        model.zero_grad()
        loss = loss_of(model, loss_fn, *xs)
        loss.backward()
        return loss
    try:
        rep = dnnkit.testing.compare_backends(step, *inputs, model=model)
    except dnnkit.CrosscheckError as e:
        return f"DISAGREE: {e}"
    worst = int(np.argmax(rep.errors))
    r = rep.records["cudnn"][worst]
    return f"{rep.max_error:.2e} over {len(rep.errors)} records (worst: {r.where or '-'} " \
           f"{r.op} {r.phase})"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    a = ap.parse_args(argv)
    st = dnnkit.backends.status()
    rows = []
    cnns = {"resnet18 (CIFAR form)": lambda: models.resnet18(num_classes=10),
            "VGG-style CNN": lambda: models.vgg_cnn(num_classes=10)}
    for name, make in cnns.items():
        for backend in ("cudnn", "numba"):
            t0 = time.perf_counter()
            try:
                acc, loss, ms = train_cnn(make, backend, a.steps, seed=0)
                rows.append((name, backend, f"{acc:.1%}", f"{loss:.3f}", f"{ms:.1f}",
                             f"{time.perf_counter() - t0:.0f}"))
            except Exception as e:      # a failing row is reported, the rest still runs
                rows.append((name, backend, "ERROR", f"{type(e).__name__}: {e}", "", ""))
            print(rows[-1], flush=True)
    for backend in ("cudnn", "numba"):
        t0 = time.perf_counter()
        try:
            acc, loss, ms = train_lm(backend, a.steps, seed=0)
            rows.append(("LSTM LM (2x128, vocab 64)", backend, f"{acc:.1%}", f"{loss:.3f}",
                         f"{ms:.1f}", f"{time.perf_counter() - t0:.0f}"))
        except Exception as e:
            rows.append(("LSTM LM", backend, "ERROR", f"{type(e).__name__}: {e}", "", ""))
        print(rows[-1], flush=True)
    rng = np.random.default_rng(5)
    templates = smooth_templates(np.random.default_rng(1))
    x, y = image_data(rng, 8, templates)
    img = (dnnkit.tensor(x), dnnkit.tensor(y))
    agree = []
    for name, make in cnns.items():
        try:
            agree.append((name, agreement(make, img, lambda m, f, a_, b_: f(m(a_), b_))))
        except Exception as e:
            agree.append((name, f"ERROR {type(e).__name__}: {e}"))
        print(agree[-1], flush=True)
    p = markov(np.random.default_rng(2))
    tx, ty = text_batch(rng, p, 35, 8)
    try:
        agree.append(("LSTM LM", agreement(
            lambda: models.LSTMLanguageModel(len(p), 64, 128, layers=2, dropout=0.0),
            (dnnkit.tensor(tx), dnnkit.tensor(ty.reshape(-1))),
            lambda m, f, a_, b_: f(m(a_)[0].reshape(-1, len(p)), b_))))
    except Exception as e:
        agree.append(("LSTM LM", f"ERROR {type(e).__name__}: {e}"))
    print(agree[-1], flush=True)
    md = [f"# dnnkit models report\n\n{st.numba.describe()}; cuDNN {st.cudnn_version}; "
          f"{a.steps} training steps, batch 32, generated data (validation/models_report.py)\n",
          "| model | backend | held-out accuracy | last loss | ms per step (second half) | "
          "wall s (compiling included) |", "|---|---|---|---|---|---|"]
    md += ["| " + " | ".join(r) + " |" for r in rows]
    md += ["", "Backend agreement on one training step (float32, compare_backends): every op "
           "agreed with itself on the same inputs (the per-op check raises otherwise); the "
           "figure is the end-to-end drift between a cuDNN run and a Numba run, over every op "
           "output and gradient (a ReLU gradient flips where its input crosses 0):", "",
           "| model | max rel error |",
           "|---|---|"]
    md += [f"| {n} | {v} |" for n, v in agree]
    text = "\n".join(md) + "\n"
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "models_report.md"), "w") as f:
        f.write(text)
    print(text)
    return 1 if any(r[2] == "ERROR" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
