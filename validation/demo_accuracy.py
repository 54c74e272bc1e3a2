"""Held-out accuracy of the demo's models over several seeds (a GPU; each seed draws its own
split, initial weights and batch order), so the demo's accuracy claim rests on more than one
run. ``python -m validation.demo_accuracy [--seeds 5] [--backend cudnn] [--epochs N]``."""

import argparse

import os

import numpy as np

from dnnkit import demo, nn


def main():
    os.environ.setdefault("TQDM_DISABLE", "1")
    p = argparse.ArgumentParser()
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--backend", default="cudnn", choices=["auto", "cudnn", "numba"])
    p.add_argument("--epochs", type=int, default=None, help="override the CNN's epochs")
    p.add_argument("--width", type=int, default=None, help="override the CNN's width")
    p.add_argument("--lr", type=float, default=None, help="override the CNN's learning rate")
    p.add_argument("--no-lstm", action="store_true")
    a = p.parse_args()
    cfg = demo._config(False)
    for key in ("epochs", "width", "lr"):
        if getattr(a, key) is not None:
            cfg["cnn"][key] = getattr(a, key)
    rows = []
    for seed in range(a.seeds):
        rng = np.random.default_rng(seed)
        data_cnn, data_lstm, classes, _ = demo.datasets(rng, cfg, False)
        quiet = lambda *_: None                                  # noqa: E731
        _, acc_c = demo.train("cnn", {a.backend: nn.convert(
            demo.cnn(classes, cfg["cnn"]["width"], seed), a.backend)}, data_cnn, cfg["cnn"],
            rng, quiet)
        lstm = nn.convert(demo.lstm(cfg["lstm"]["hidden"], seed), a.backend)
        acc_l = {a.backend: float("nan")} if a.no_lstm else demo.train(
            "lstm", {a.backend: lstm}, data_lstm, cfg["lstm"], rng, quiet)[1]
        rows.append((seed, acc_c[a.backend], acc_l[a.backend]))
        print(f"seed {seed}: cnn held-out {rows[-1][1]:.3f}, lstm held-out {rows[-1][2]:.3f}",
              flush=True)
    c, l = np.array([r[1] for r in rows]), np.array([r[2] for r in rows])
    print(f"\n{a.backend}, cnn {cfg['cnn']}, lstm {cfg['lstm']}")
    print(f"cnn : min {c.min():.3f} mean {c.mean():.3f} max {c.max():.3f}")
    print(f"lstm: min {l.min():.3f} mean {l.mean():.3f} max {l.max():.3f}")


if __name__ == "__main__":
    main()
