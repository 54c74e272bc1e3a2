"""GPU cross-check and benchmark of the RNN family: Numba vs cuDNN vs PyTorch nn.LSTM/nn.GRU.

    python -m validation.rnn_bench [--reps 20] [--dtype float32] [--no-reference] [--json f]
    python -m validation.rnn_bench --algos [--reps 20] [--dtype float32] [--json f]

Shapes (the benchmark's; one layer, unidirectional, input size = hidden size):
LSTM H=512 N=64 T=50, GRU H=1024 N=32 T=50, LSTM H=1024 N=16 T=100.

Correctness first, on the same weights and inputs for every backend: the max relative error
(max|got - ref| / max|ref|, per output, the worst of y, hy, cy for forward and of dx, dhx,
dcx, dw for backward) against the float64 NumPy reference (dnnkit.reference.rnn_*, written
from the equations; slow: --no-reference skips it and compares with cuDNN only), and against
cuDNN. PyTorch gets the same weights through the layout mapping of docs/rnn.md (a
pseudo-layer's weight_ih, weight_hh, bias_ih, bias_hh are four contiguous blocks).

Times: dnnkit.timing.median_ms (CUDA events on the default stream, after a warm-up) of
``forward`` (inference) and ``forward+backward`` (training forward, then backward; for
PyTorch the module call and autograd.backward with the same upstream gradients, weight
gradients included). Target (docs/performance.md): Numba within 2.5x of cuDNN on forward.

``--algos``: cuDNN's RNN algorithms side by side (standard, persist_static,
persist_static_small_h, persist_dynamic, and what "auto" picks) at batch N = 1, 4 and 16 for
LSTM and GRU, H = 256, 512, 1024 (and 2048 for the upper limit), T = 50, one layer: per algorithm
the inference forward and the training forward+backward times, the worst relative difference
from "standard" (y, hy, dx, dw), or why cuDNN refused it. The last column names the fastest
forward+backward; ops/rnn_cudnn.py's AUTO_PERSIST_MAX_BATCH and AUTO_PERSIST_MAX_HIDDEN (the
"auto" rule) are read off these rows.
"""

import argparse
import json

import numpy as np

import dnnkit
from dnnkit import arrays, reference
from dnnkit.errors import CudnnError, CudnnUnavailableError
from dnnkit.timing import median_ms

SHAPES = [("lstm", 512, 64, 50), ("gru", 1024, 32, 50), ("lstm", 1024, 16, 100)]
BACKENDS = ("numba", "cudnn")


def _torch():
    try:
        import torch
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        return torch
    except ImportError:
        return None


def _err(got, ref):
    if got is None and ref is None:
        return 0.0
    g = np.asarray(got.detach().cpu().numpy() if hasattr(got, "detach") else arrays.to_host(got),
                   np.float64)
    r = np.asarray(arrays.to_host(ref), np.float64)
    return float(np.abs(g - r).max() / max(np.abs(r).max(), 1e-30))


def _worst(gots, refs):
    return max(_err(g, r) for g, r in zip(gots, refs))


def _torch_module(torch, rnn, w_host, dt):
    """nn.LSTM / nn.GRU with dnnkit's weights (docs/rnn.md: the layout mapping)."""
    c = rnn.cfg
    cls = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU}[c.mode]
    m = cls(c.input_size, c.hidden_size, c.num_layers, bidirectional=c.bidirectional)
    m = m.to(device="cuda", dtype=getattr(torch, dt))
    from dnnkit.rnn_layout import param_layout
    g = c.gates
    # A pseudo-layer's G input matrices, G recurrent matrices, G input biases and G recurrent
    # biases are each one contiguous block: weight_ih, weight_hh, bias_ih, bias_hh.
    starts = {}
    for layer, d, lin, kind, off, shape in param_layout(c):
        name = ("weight" if kind == "matrix" else "bias") + ("_ih" if lin < g else "_hh")
        starts.setdefault((layer, d, name), off)
    with torch.no_grad():
        for (layer, d, name), off in starts.items():
            p = getattr(m, f"{name}_l{layer}" + ("_reverse" if d else ""))
            p.copy_(torch.as_tensor(w_host[off:off + p.numel()].reshape(p.shape)))
    return m


def run_shape(mode, h, n, t, dt, reps, torch, with_reference):
    from numba import cuda
    rng = np.random.default_rng(0)
    rnn = dnnkit.RNN(mode, h, h, dtype=dt)
    w = rnn.init_params(seed=1)
    w_host = w.copy_to_host()
    hx_ = rng.standard_normal((t, n, h)).astype(dt)
    hdy = rng.standard_normal((t, n, h)).astype(dt)
    x, dy = cuda.to_device(hx_), cuda.to_device(hdy)
    name = f"{mode} H={h} N={n} T={t}"
    rows, outs = [], {}
    refs = None
    if with_reference:
        f64 = hx_.astype(np.float64)
        refs = (reference.rnn_forward(rnn.cfg, w_host, f64),
                reference.rnn_backward(rnn.cfg, w_host, f64, hdy.astype(np.float64)))
    for bk in BACKENDS:
        try:
            fwd = rnn.forward(w, x, backend=bk)
        except dnnkit.CudnnUnavailableError as e:
            rows.append(dict(shape=name, backend=bk, error=e.reason))
            continue
        tr = rnn.forward(w, x, training=True, backend=bk)
        bwd = rnn.backward(w, x, tr.y, dy, state=tr.state, backend=bk)
        outs[bk] = (tuple(fwd), bwd)
        rows.append(dict(
            shape=name, backend=bk, dtype=dt,
            fwd_err=_worst(fwd, refs[0]) if refs else None,
            bwd_err=_worst(bwd, refs[1]) if refs else None,
            fwd_ms=median_ms(lambda i: rnn.forward(w, x, backend=bk), reps),
            fwdbwd_ms=median_ms(lambda i: _fwd_bwd(rnn, w, x, dy, bk), reps)))
    if "numba" in outs and "cudnn" in outs:
        rows[0]["vs_cudnn_fwd_err"] = _worst(outs["numba"][0], outs["cudnn"][0])
        rows[0]["vs_cudnn_bwd_err"] = _worst(outs["numba"][1], outs["cudnn"][1])
    if torch is not None:
        rows.append(_torch_row(torch, rnn, w_host, x, dy, dt, name, refs, reps))
    return rows


def _fwd_bwd(rnn, w, x, dy, bk):
    out = rnn.forward(w, x, training=True, backend=bk)
    return rnn.backward(w, x, out.y, dy, state=out.state, backend=bk)


def _torch_row(torch, rnn, w_host, x, dy, dt, name, refs, reps):
    try:
        m = _torch_module(torch, rnn, w_host, dt)
    except Exception as e:   # a PyTorch build without this dtype on the GPU
        return dict(shape=name, backend="torch", error=f"{type(e).__name__}: {e}")
    tx = torch.as_tensor(x, device="cuda")
    tdy = torch.as_tensor(dy, device="cuda")
    lstm = rnn.cfg.mode == "lstm"

    def fwd():
        with torch.no_grad():
            return m(tx)

    def fwd_bwd():
        xg = tx.detach().requires_grad_(True)
        y, _ = m(xg)
        m.zero_grad(set_to_none=True)
        torch.autograd.backward(y, tdy)
        return xg.grad

    y, st = fwd()
    hy, cy = (st if lstm else (st, None))
    row = dict(shape=name, backend="torch", dtype=dt, fwd_err=None, bwd_err=None)
    if refs:
        row["fwd_err"] = _worst([y, hy, cy], refs[0])
        row["bwd_err"] = _err(fwd_bwd(), refs[1][0])     # dx
    row["fwd_ms"] = median_ms(lambda i: fwd(), reps)
    row["fwdbwd_ms"] = median_ms(lambda i: fwd_bwd(), reps)
    return row


def table(rows, device):
    out = [f"device: {device}", "",
           f"{'shape':<24} {'backend':<7} {'fwd err':>9} {'bwd err':>9} {'fwd ms':>8} "
           f"{'f+b ms':>8} {'fwd/cudnn':>9} {'f+b/cudnn':>9}"]
    by = {(r["shape"], r["backend"]): r for r in rows}
    for r in rows:
        if "error" in r:
            out.append(f"{r['shape']:<24} {r['backend']:<7} unavailable: {r['error'][:70]}")
            continue
        c = by.get((r["shape"], "cudnn"))
        ok = c is not None and "fwd_ms" in c

        def e(v):
            return f"{v:9.2e}" if v is not None else f"{'-':>9}"
        out.append(f"{r['shape']:<24} {r['backend']:<7} {e(r['fwd_err'])} {e(r['bwd_err'])} "
                   f"{r['fwd_ms']:8.3f} {r['fwdbwd_ms']:8.3f} "
                   f"{(r['fwd_ms'] / c['fwd_ms']) if ok else float('nan'):9.2f} "
                   f"{(r['fwdbwd_ms'] / c['fwdbwd_ms']) if ok else float('nan'):9.2f}")
        if "vs_cudnn_fwd_err" in r:
            out.append(f"{'':<24} numba vs cudnn: forward {r['vs_cudnn_fwd_err']:.2e}, "
                       f"backward {r['vs_cudnn_bwd_err']:.2e}")
    return "\n".join(out)


ALGOS = ("standard", "persist_static", "persist_static_small_h", "persist_dynamic", "auto")
ALGO_SHAPES = [(m, h, n, 50) for m in ("lstm", "gru") for h in (256, 512, 1024, 2048)
               for n in (1, 4, 16)]


def algo_rows(dt, reps):
    """One row per (shape, algorithm): times, difference from standard, or the refusal."""
    from numba import cuda
    rows = []
    for mode, h, n, t in ALGO_SHAPES:
        rng = np.random.default_rng(0)
        name = f"{mode} H={h} N={n} T={t}"
        base = None
        # one problem per shape, every algorithm on it: "vs standard" compares like with like
        x = cuda.to_device(rng.standard_normal((t, n, h)).astype(dt))
        dy = cuda.to_device(rng.standard_normal((t, n, h)).astype(dt))
        for algo in ALGOS:
            rnn = dnnkit.RNN(mode, h, h, dtype=dt, algo=algo)
            w = rnn.init_params(seed=1)
            try:
                with dnnkit.trace() as tr:
                    out = rnn.forward(w, x, training=True, backend="cudnn")
                grads = rnn.backward(w, x, out.y, dy, state=out.state, backend="cudnn")
            except (CudnnUnavailableError, CudnnError) as e:
                rows.append(dict(shape=name, algo=algo, error=str(getattr(e, "reason", e))))
                continue
            outs = (out.y, out.hy, grads[0], grads[3])
            if base is None:
                base = outs
            rows.append(dict(
                shape=name, algo=algo, ran=str(tr[0].algo), diff=_worst(outs, base),
                fwd_ms=median_ms(lambda i: rnn.forward(w, x, backend="cudnn"), reps),
                fwdbwd_ms=median_ms(lambda i: _fwd_bwd(rnn, w, x, dy, "cudnn"), reps)))
    return rows


def algo_table(rows, device):
    out = [f"device: {device}", "",
           f"{'shape':<24} {'algo':<23} {'ran':<16} {'fwd ms':>8} {'f+b ms':>8} "
           f"{'vs standard':>11}"]
    best = {}
    for r in rows:
        if "error" not in r and r["algo"] != "auto":
            b = best.get(r["shape"])
            if b is None or r["fwdbwd_ms"] < b["fwdbwd_ms"]:
                best[r["shape"]] = r
    for r in rows:
        if "error" in r:
            out.append(f"{r['shape']:<24} {r['algo']:<23} refused: {r['error'][:70]}")
            continue
        mark = "  <- fastest f+b" if best.get(r["shape"]) is r else ""
        out.append(f"{r['shape']:<24} {r['algo']:<23} {r['ran']:<16} {r['fwd_ms']:8.3f} "
                   f"{r['fwdbwd_ms']:8.3f} {r['diff']:11.2e}{mark}")
    return "\n".join(out)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--dtype", default="float32", choices=["float16", "float32", "float64"])
    p.add_argument("--no-reference", action="store_true",
                   help="skip the (slow) float64 NumPy reference")
    p.add_argument("--json")
    p.add_argument("--algos", action="store_true",
                   help="time cuDNN's RNN algorithms side by side (module docstring)")
    a = p.parse_args()
    from numba import cuda
    print(dnnkit.backends.status(), "\n")
    if a.algos:
        rows = algo_rows(a.dtype, a.reps)
        device = cuda.get_current_device().name
        device = device.decode() if isinstance(device, bytes) else device
        print(algo_table(rows, device))
        if a.json:
            with open(a.json, "w") as f:
                json.dump(dict(device=device, rows=rows), f, indent=1)
        return
    torch = _torch()
    rows = []
    for mode, h, n, t in SHAPES:
        rows += run_shape(mode, h, n, t, a.dtype, a.reps, torch, not a.no_reference)
    device = cuda.get_current_device().name
    device = device.decode() if isinstance(device, bytes) else device
    print(table(rows, device))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(device=device, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
