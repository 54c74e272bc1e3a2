"""Training speed against PyTorch eager, in one process on one GPU.

    python -m validation.train_bench [--quick] [--out DIR] [--only vgg,resnet18,lm|host]
                                     [--numba-graphs] [--benchmark]

Rows: the VGG-style CNN (dnnkit.models.vgg_cnn) and ResNet-18 in its CIFAR form
(dnnkit.models.resnet18) at batch 32 and 128 on 3x32x32 images, float32 (TF32 off on both
sides) and float16 (the whole model in half precision on both sides); the LSTM language model
(dnnkit.models.LSTMLanguageModel: vocabulary 10000, embedding and hidden 650, 2 layers, 35
steps, batch 32, float32, dropout 0 so that every variant, graphs included, runs the same
step). A training step is forward, cross-entropy loss, backward and SGD with momentum 0.9.

Each row:
1. PyTorch's model is built in this script with the dnnkit model's shapes and names (walking
   the dnnkit module tree), and its initial state is loaded into every dnnkit model.
2. Correctness first: the losses of the first two steps (before and after one update), dnnkit
   on cuDNN vs PyTorch, must agree within 1e-3 (float32) / 3e-2 (float16) relative.
3. Graphs vs eager on the same backend: three warm-up steps and two more, eager and replayed
   from the same state; the largest parameter difference (0 = identical).
4. Timing: PyTorch eager, dnnkit on cuDNN (``nn.convert(model, "cudnn")``; "auto" when a layer
   has no cuDNN path), on Numba, and replaying a CUDA graph of the cuDNN step (and of the Numba
   step with --numba-graphs). Interleaved rounds (each variant in turn runs K steps between two
   CUDA events on the default stream; no host wait inside the loop; the GPU idle when a round
   starts, so a step's time is the larger of its host and GPU times), the median of the rounds'
   ms per step. ``host ms`` is the host's wall time to queue a step: where it is near the GPU
   figure, the host bounds the step. ``ops`` is dnnkit's op calls per step.

``--benchmark`` times the convolution algorithms on both sides (``torch.backends.cudnn.benchmark``
and ``dnn.benchmark``; a graph is captured after warm-up steps, so its choices are the timed
ones); without it both sides take cuDNN's heuristic choice.

Then the host cost of one op call (relu of 1024 elements, a 1x8x8x8 convolution with an 8x8x3x3
filter) with Numba, PyTorch and CuPy inputs on both backends against PyTorch's own
(validation/overhead.py's method), and an optimizer step over the VGG model's parameters
against PyTorch's fused SGD and Adam. A failing row prints its error and the rest go on.
Writes DIR/train_bench.json and train_bench.md (and train_bench.png with matplotlib).
"""

import argparse
import collections
import json
import os
import statistics
import sys
import time
import traceback

import numpy as np

import dnnkit
from dnnkit import fastpath, graphs, models, nn, optim

TOL = {"float32": 1e-3, "float16": 3e-2}
LM = dict(vocab=10000, embed=650, hidden=650, layers=2, steps=35)


# ---------------------------------------------------------------- PyTorch mirrors

def mirror(torch, m):
    """The PyTorch module with dnnkit module ``m``'s structure, options and names."""
    tnn, kind = torch.nn, type(m).__name__
    kids = collections.OrderedDict((n, mirror(torch, c)) for n, c in m.named_children())
    if kind == "Conv2d":
        c = m.conv
        return tnn.Conv2d(m.in_channels, m.out_channels, m.kernel_size, c["stride"],
                          c["padding"], c["dilation"], c["groups"], bias=m.bias is not None)
    if kind == "BatchNorm2d":
        return tnn.BatchNorm2d(m.num_features, eps=m.eps, momentum=m.momentum)
    if kind == "Linear":
        return tnn.Linear(m.in_features, m.out_features, bias=m.bias is not None)
    if kind == "MaxPool2d":
        return tnn.MaxPool2d(*m.args)
    if kind in ("ReLU", "Flatten"):
        return getattr(tnn, kind)()
    if kind == "Embedding":
        return tnn.Embedding(m.num_embeddings, m.embedding_dim)
    if kind == "LSTM":
        c = m.rnn.cfg
        return tnn.LSTM(c.input_size, c.hidden_size, c.num_layers)
    if kind == "Sequential":
        return tnn.Sequential(kids)
    forward = {"GlobalAvgPool2d": lambda self, x: x.mean((2, 3)),
               "BasicBlock": _block_forward, "ResNet": _resnet_forward,
               "LSTMLanguageModel": _lm_forward, "Dropout": lambda self, x: x}.get(kind)
    if forward is None:
        raise TypeError(f"no PyTorch mirror for dnnkit module {kind}")
    cls = type(f"Torch{kind}", (tnn.Module,), {"forward": forward})
    t = cls()
    for n, c in kids.items():
        setattr(t, n, c)
    if kind == "ResNet":
        t.stages = m.stages
    if kind == "BasicBlock" and "downsample" not in kids:
        t.downsample = None
    return t


def _block_forward(self, x):
    out = self.relu(self.bn1(self.conv1(x)))
    out = self.bn2(self.conv2(out))
    return self.relu(out + (x if self.downsample is None else self.downsample(x)))


def _resnet_forward(self, x):
    x = self.relu(self.bn1(self.conv1(x)))
    for i in range(self.stages):
        x = getattr(self, f"layer{i + 1}")(x)
    return self.fc(self.avgpool(x))


def _lm_forward(self, ids):
    y, _ = self.rnn(self.encoder(ids))
    return self.decoder(y)


# ---------------------------------------------------------------- one row

class Row:
    def __init__(self, model, batch, dtype):
        self.model, self.batch, self.dtype = model, batch, dtype
        self.name = f"{'lstm-lm' if model == 'lm' else model} b{batch} f{dtype[-2:]}"

    def build(self):
        """A fresh dnnkit model (the same initial weights whenever it is loaded with the
        row's state)."""
        if self.model == "vgg":
            return models.vgg_cnn(dtype=self.dtype)
        if self.model == "resnet18":
            return models.resnet18(dtype=self.dtype)
        return models.LSTMLanguageModel(LM["vocab"], LM["embed"], LM["hidden"], LM["layers"],
                                        dropout=0.0, dtype=self.dtype)

    def data(self, rng):
        if self.model == "lm":
            ids = rng.integers(0, LM["vocab"], (LM["steps"], self.batch)).astype(np.int64)
            return ids, rng.integers(0, LM["vocab"], LM["steps"] * self.batch).astype(np.int64)
        x = rng.standard_normal((self.batch, 3, 32, 32)).astype(self.dtype)
        return x, rng.integers(0, 10, self.batch).astype(np.int64)


def dk_trainer(row, model, backend):
    nn.convert(model, backend)
    opt = optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.convert(nn.CrossEntropyLoss(), backend)

    def step(x, y):
        opt.zero_grad()
        out = model(x)
        if row.model == "lm":
            out = out[0].reshape(-1, LM["vocab"])
        loss = loss_fn(out, y)
        loss.backward()
        opt.step()
        return loss
    return step


def torch_trainer(torch, row, model):
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step(x, y):
        opt.zero_grad(set_to_none=True)
        out = model(x)
        if row.model == "lm":
            out = out.reshape(-1, LM["vocab"])
        loss = loss_fn(out, y)
        loss.backward()
        opt.step()
        return loss
    return step


def row_setup(torch, row):
    """(PyTorch's model on the GPU, the initial state every dnnkit model loads, the row's
    data as PyTorch tensors (tx, ty), and as dnnkit's (dx, dy))."""
    from numba import cuda
    xh, yh = row.data(np.random.default_rng(0))
    ref = row.build()
    tm = mirror(torch, ref).cuda()
    if row.dtype == "float16":
        tm = tm.half()
    kinds = {k: np.asarray(v).dtype for k, v in ref.state_dict().items()}
    # PyTorch's half model has float16 BatchNorm parameters; dnnkit keeps its own dtypes
    init = {k: v.detach().cpu().numpy().astype(kinds.get(k, v.detach().cpu().numpy().dtype))
            for k, v in tm.state_dict().items()}
    return (tm, init, (torch.from_numpy(xh).cuda(), torch.from_numpy(yh).cuda()),
            (dnnkit.tensor(xh), cuda.to_device(yh)))


def run_row(torch, row, q):
    tm, init, (tx, ty), (dx, dy) = row_setup(torch, row)
    out = {"row": row.name, "model": row.model, "batch": row.batch, "dtype": row.dtype}

    def loaded():
        m = row.build()
        m.load_state_dict(init)
        return m

    # the cuDNN pin, or "auto" where a layer has no cuDNN path (a probe step says which)
    cudnn_pin = "cudnn"
    try:
        dk_trainer(row, loaded(), "cudnn")(dx, dy).item()
    except (dnnkit.CudnnUnavailableError, dnnkit.CudnnError) as e:
        print(f"  {row.name}: the cudnn pin fails ({e}); using auto")
        cudnn_pin = "auto"
    pins = {"cudnn": cudnn_pin, "numba": "numba"}

    def fresh(backend):
        m = loaded()
        return m, dk_trainer(row, m, pins[backend]), pins[backend]

    # 2. correctness: two steps from the same state
    tstep = torch_trainer(torch, row, tm)
    dm, dstep, cudnn_pin = fresh("cudnn")
    want = [float(tstep(tx, ty).item()) for _ in range(2)]
    got = [float(dstep(dx, dy).item()) for _ in range(2)]
    rel = max(abs(a - b) / max(abs(b), 1e-6) for a, b in zip(got, want))
    out.update(loss_torch=want, loss_dnnkit=got, loss_rel=rel, loss_ok=rel <= TOL[row.dtype],
               cudnn_pin=cudnn_pin)
    print(f"  {row.name}: losses torch {want} dnnkit {got} (rel {rel:.2e})")

    # 3. graph replays vs eager steps on the same backend, from the same state
    variants = {"torch": lambda: tstep(tx, ty), "cudnn": lambda: dstep(dx, dy)}
    nm, nstep, _ = fresh("numba")
    variants["numba"] = lambda: nstep(dx, dy)
    for backend in ["cudnn"] + (["numba"] if q.numba_graphs else []):
        try:
            # bitwise comparison under deterministic algorithms (cuDNN's atomics-based
            # gradients differ run to run, eager against eager too)
            with dnnkit.config.change_flags({"dnn.deterministic": True}):
                em, estep, _ = fresh(backend)
                gm, gstep, _ = fresh(backend)
                for _ in range(5):
                    le = estep(dx, dy)
                g = graphs.capture(gstep, dx, dy, warmup=3)
                for _ in range(2):
                    g.replay()
                se, sg = em.state_dict(), gm.state_dict()
                diff = max(float(np.max(np.abs(np.asarray(se[k], np.float64) -
                                               np.asarray(sg[k], np.float64))))
                           for k in se if not k.endswith("num_batches_tracked"))  # host counts
                out[f"graph_{backend}_loss"] = [float(le.item()), float(g.outputs.item())]
                del g
            out[f"graph_{backend}_diff"] = diff
            _, tstep_g, _ = fresh(backend)           # the timed graph: the default flags
            g = graphs.capture(tstep_g, dx, dy, warmup=3)
            out[f"graph_{backend}_nodes"] = g.nodes
            variants[f"{backend}+graphs"] = g.replay
            print(f"  {row.name}: {backend} graph of {g.nodes} nodes; largest parameter "
                  f"difference to eager (deterministic) {diff:.3g}")
        except Exception as e:  # noqa: BLE001 - the row goes on without this variant
            out[f"graph_{backend}_error"] = f"{type(e).__name__}: {e}"
            print(f"  {row.name}: {backend} graph failed: {e}")

    # 4. timing
    before = fastpath.stats["hits"] + fastpath.stats["stores"]
    dstep(dx, dy)
    out["ops_per_step"] = fastpath.stats["hits"] + fastpath.stats["stores"] - before
    out["times"] = time_variants(torch, variants, q.warm, q.rounds, q.per_round)
    for k, (gpu, host) in out["times"].items():
        print(f"  {row.name}: {k:14s} {gpu:8.3f} ms/step (host {host:.3f})")
    return out


def time_variants(torch, variants, warm, rounds, per_round):
    """{variant: (median GPU ms per step, median host ms to queue a step)}."""
    for fn in variants.values():
        for _ in range(warm):
            fn()
    torch.cuda.synchronize()
    ev = {n: [] for n in variants}
    host = {n: [] for n in variants}
    for _ in range(rounds):
        for n, fn in variants.items():
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            # each variant's round starts on an idle GPU: a backlog left by the previous
            # variant (a replayed graph queues in microseconds) would let a host-bound variant
            # queue ahead while it drains, and its events would show only its GPU time
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            s.record()
            for _ in range(per_round):
                fn()
            e.record()
            host[n].append((time.perf_counter() - t0) * 1e3 / per_round)
            ev[n].append((s, e))
    torch.cuda.synchronize()
    return {n: (statistics.median(s.elapsed_time(e) / per_round for s, e in ev[n]),
                statistics.median(host[n])) for n in variants}


# ---------------------------------------------------------------- host cost, optimizer

def host_costs(torch, q):
    """{(op, input kind, backend): host us per call} and PyTorch's own."""
    from numba import cuda
    from validation.overhead import host_us_each
    rng = np.random.default_rng(3)
    xr = rng.standard_normal(1024).astype(np.float32)
    xc = rng.standard_normal((1, 8, 8, 8)).astype(np.float32)
    wc = rng.standard_normal((8, 8, 3, 3)).astype(np.float32)
    inputs = {"numba": cuda.to_device, "torch": lambda h: torch.from_numpy(h).cuda()}
    try:
        import cupy
        inputs["cupy"] = cupy.asarray
    except ImportError:
        pass
    fns = {}
    for kind, make in inputs.items():
        r, c, w = make(xr), make(xc), make(wc)
        for b in ("cudnn", "numba"):
            fns[("relu", kind, b)] = (lambda r=r, b=b: dnnkit.relu(r, backend=b))
            fns[("conv", kind, b)] = (lambda c=c, w=w, b=b: dnnkit.conv2d(c, w, padding=1,
                                                                          backend=b))
    tr, tc, tw = (torch.from_numpy(a).cuda() for a in (xr, xc, wc))
    fns[("relu", "torch", "pytorch")] = lambda: torch.relu(tr)
    fns[("conv", "torch", "pytorch")] = lambda: torch.nn.functional.conv2d(tc, tw, padding=1)
    us = host_us_each(fns, n=q.host_n, rounds=q.host_rounds)
    return [{"op": op, "input": kind, "backend": b, "host_us": v,
             "ratio": v / us[(op, "torch", "pytorch")]} for (op, kind, b), v in us.items()]


def optimizer_step(torch, q):
    """dnnkit's SGD/Adam step over the VGG model's parameters vs PyTorch's fused ones:
    GPU ms per step and dnnkit's kernel launches per step."""
    from dnnkit import optim as dk_optim
    rows = []
    dm = models.vgg_cnn()
    tm = mirror(torch, dm).cuda()
    for p in dm.parameters():
        p.grad = dnnkit.tensor(np.ones(p.shape, np.float32))
    for p in tm.parameters():
        p.grad = torch.ones_like(p)
    for name, dk, tk in (("SGD", lambda ps: dk_optim.SGD(ps, lr=0.01, momentum=0.9),
                          lambda ps, **f: torch.optim.SGD(ps, lr=0.01, momentum=0.9, **f)),
                         ("Adam", lambda ps: dk_optim.Adam(ps, lr=1e-3),
                          lambda ps, **f: torch.optim.Adam(ps, lr=1e-3, **f))):
        dopt = dk(list(dm.parameters()))
        try:
            topt, how = tk(list(tm.parameters()), fused=True), "fused"
            topt.step()
        except (TypeError, RuntimeError, ValueError):
            topt, how = tk(list(tm.parameters()), foreach=True), "foreach"
        dopt.step()
        t = time_variants(torch, {"dnnkit": dopt.step, "torch": topt.step}, q.warm,
                          q.rounds, q.per_round)
        rows.append({"optimizer": name, "params": len(list(dm.parameters())),
                     "dnnkit_ms": t["dnnkit"][0], "torch_ms": t["torch"][0], "torch_kind": how,
                     "dnnkit_host_ms": t["dnnkit"][1], "torch_host_ms": t["torch"][1],
                     "dnnkit_launches": dopt.launches_per_step})
    return rows


# ---------------------------------------------------------------- report

def targets(rows, hosts, opts):
    """[(target, figure, met: True/False/None)]."""
    out = []

    def ratios(variant, pick=lambda r: True):
        vals = []
        for r in rows:
            t = r.get("times", {})
            if variant in t and "torch" in t and pick(r):
                vals.append((r["row"], t[variant][0] / t["torch"][0]))
        return vals

    def line(name, vals, limit):
        if not vals:
            return out.append((name, "not measured", None))
        worst = max(vals, key=lambda v: v[1])
        out.append((name, f"worst {worst[1]:.2f}x ({worst[0]}); " +
                    ", ".join(f"{n} {v:.2f}" for n, v in vals), worst[1] <= limit))
    line("cuDNN path <= 1.0x PyTorch eager, every row", ratios("cudnn"), 1.0)
    line("CUDA graphs <= 0.7x PyTorch eager at batch 32",
         ratios("cudnn+graphs", lambda r: r["batch"] == 32), 0.7)
    line("CUDA graphs <= 1.0x PyTorch eager at batch 128",
         ratios("cudnn+graphs", lambda r: r["batch"] == 128), 1.0)
    diffs = [(r["row"], r["graph_cudnn_diff"]) for r in rows if "graph_cudnn_diff" in r]
    out.append(("graph replays identical to the eager steps (largest parameter difference)",
                ", ".join(f"{n} {d:.3g}" for n, d in diffs) or "not measured",
                (all(d == 0 for _, d in diffs) if diffs else None)))
    line("Numba path <= 1.5x PyTorch eager, every row", ratios("numba"), 1.5)
    for b, limit in (("cudnn", 1.2), ("numba", 1.5)):
        vals = [(f"{h['op']} {h['input']}", h["ratio"]) for h in hosts if h["backend"] == b]
        line(f"host cost per call, {b} path <= {limit}x PyTorch's ({_devices()} GPU(s))",
             vals, limit)
    for o in opts:
        out.append((f"optimizer step ({o['optimizer']}) vs PyTorch {o['torch_kind']}",
                    f"{o['dnnkit_ms']:.3f} ms vs {o['torch_ms']:.3f} ms (host "
                    f"{o.get('dnnkit_host_ms', float('nan')):.3f} vs "
                    f"{o.get('torch_host_ms', float('nan')):.3f}); {o['dnnkit_launches']} "
                    f"launches for {o['params']} parameters", o["dnnkit_ms"] <= o["torch_ms"]))
    return out


def _devices():
    from numba import cuda
    return len(cuda.gpus)


def write(out_dir, gpu, rows, hosts, opts, errors):
    os.makedirs(out_dir, exist_ok=True)
    tg = targets(rows, hosts, opts)
    with open(os.path.join(out_dir, "train_bench.json"), "w") as f:
        json.dump({"gpu": gpu, "rows": rows, "host": hosts, "optimizer": opts,
                   "errors": errors, "targets": tg}, f, indent=1, default=str)
    mark = {True: "met", False: "**missed**", None: "—"}
    md = [f"# Training speed vs PyTorch eager ({gpu})", "",
          "## Targets (issue 26)", "", "| target | figure | |", "|---|---|---|"]
    md += [f"| {n} | {fig} | {mark[m]} |" for n, fig, m in tg]
    md += ["", "## Time per training step (ms, median; host: ms to queue a step)", "",
           "| row | loss check | ops/step | variant | GPU ms | host ms | bound | x PyTorch |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        t = r.get("times", {})
        base = t.get("torch", (None,))[0]
        check = f"rel {r['loss_rel']:.1e} {'ok' if r['loss_ok'] else 'FAIL'}"
        for v, (g, h) in t.items():
            bound = "host" if h >= 0.9 * g else "GPU"
            md.append(f"| {r['row']} | {check} | {r.get('ops_per_step', '')} | {v} | {g:.3f} | "
                      f"{h:.3f} | {bound} | {g / base:.2f} |")
            check = ""
        for k in [k for k in r if k.startswith("graph_") and k.endswith("_error")]:
            md.append(f"| {r['row']} | | | {k[6:-6]}+graphs | failed: {r[k]} | | | |")
    md += ["", "## Host cost per op call (us)", "", "| op | input | backend | us | x PyTorch |",
           "|---|---|---|---|---|"]
    md += [f"| {h['op']} | {h['input']} | {h['backend']} | {h['host_us']:.1f} | "
           f"{h['ratio']:.2f} |" for h in hosts]
    if errors:
        md += ["", "## Failed rows", ""] + [f"- {n}: {e}" for n, e in errors.items()]
    with open(os.path.join(out_dir, "train_bench.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    chart(out_dir, rows)


def chart(out_dir, rows):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    names = [r["row"] for r in rows if "times" in r]
    variants = sorted({v for r in rows for v in r.get("times", {}) if v != "torch"})
    if not names or not variants:
        return
    fig, ax = plt.subplots(figsize=(10, 0.5 * len(names) * len(variants) / 2 + 2))
    y, h = np.arange(len(names)), 0.8 / len(variants)
    for i, v in enumerate(variants):
        vals = [r["times"][v][0] / r["times"]["torch"][0] if v in r["times"] else 0
                for r in rows if "times" in r]
        ax.barh(y + i * h, vals, h, label=v)
    ax.axvline(1.0, color="k", lw=0.8)
    ax.set_yticks(y + 0.4 - h / 2, names)
    ax.set_xlabel("time per training step / PyTorch eager")
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "train_bench.png"), dpi=120)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="a few steps of the smallest rows")
    p.add_argument("--out", default=".")
    p.add_argument("--only", default="", help="models: vgg,resnet18,lm ('host': none, only "
                   "the host-cost and optimizer tables)")
    p.add_argument("--numba-graphs", action="store_true", help="also graph the Numba step")
    p.add_argument("--benchmark", action="store_true",
                   help="time the convolution algorithms on both sides (cudnn.benchmark)")
    q = p.parse_args(argv)
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = q.benchmark
    dnnkit.config.dnn.benchmark = q.benchmark
    q.warm, q.rounds, q.per_round, q.host_n, q.host_rounds = \
        (2, 2, 2, 20, 3) if q.quick else (5, 7, 10, 200, 9)
    grid = [("vgg", 32, "float32"), ("lm", 32, "float32")] if q.quick else \
        [(m, b, d) for m in ("vgg", "resnet18") for d in ("float32", "float16")
         for b in (32, 128)] + [("lm", 32, "float32")]
    only = {s.strip() for s in q.only.split(",") if s.strip()}
    gpu = torch.cuda.get_device_name()
    gpu += "; algorithms timed on both sides (--benchmark)" if q.benchmark else ""
    print(f"{gpu}; dnnkit {dnnkit.__version__}; PyTorch {torch.__version__}")
    rows, errors, hosts, opts = [], {}, [], []
    for spec in grid:
        row = Row(*spec)
        if only and row.model not in only:
            continue
        print(row.name)
        try:
            rows.append(run_row(torch, row, q))
        except Exception as e:  # noqa: BLE001 - report the row and go on
            errors[row.name] = f"{type(e).__name__}: {e}"
            traceback.print_exc()
        finally:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            dnnkit.memory.empty_cache()
    for what, fn, dest in (("host cost", host_costs, hosts), ("optimizer", optimizer_step, opts)):
        try:
            dest.extend(fn(torch, q))
        except Exception as e:  # noqa: BLE001
            errors[what] = f"{type(e).__name__}: {e}"
            traceback.print_exc()
    write(q.out, gpu, rows, hosts, opts, errors)
    print(f"wrote {os.path.join(q.out, 'train_bench.md')}")
    for n, fig, m in targets(rows, hosts, opts):
        print(f"  [{ {True: 'met', False: 'MISSED', None: '-'}[m] }] {n}: {fig}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
