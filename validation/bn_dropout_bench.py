"""GPU cross-check and benchmark of batch normalization and dropout: Numba vs cuDNN vs PyTorch.

    python -m validation.bn_dropout_bench [--reps 50] [--dtype float32] [--json out.json]

Shape 64x256x56x56 (BN spatial and per-activation, dropout p = 0.5). Correctness first: the
max relative error (max|got - ref| / max|ref|, all outputs of an op concatenated) of every
backend against a float64 reference on the same inputs (NumPy; for dropout, against
x*mask/(1-p) with the mask each backend reports, plus its keep rate). PyTorch (its own native
kernels: torch.native_batch_norm, native_batch_norm_backward, native_dropout) is only an
independent oracle and a time to compare with.

Time, two ways: ``call ms`` = dnnkit.timing.median_ms of 10 back-to-back calls between CUDA
events (after a warm-up; inputs rotated among SETS sets so the L2 cache does not flatter): what
a user sees, host overhead and per-call allocations included (a small call's time is host
time: validation/notes/host-overhead.md); ``kernel ms`` = the sum of the GPU kernels'
durations per call from the PyTorch profiler (CUPTI sees Numba's and cuDNN's kernels too;
validation.overhead.gpu_us), when PyTorch is installed. Bandwidth = bytes read + written /
kernel ms (call ms without PyTorch), with two byte counts per op, the same for every backend:
``alg`` = the Numba algorithm's traffic (BN training 3 passes over the tensor: x, x, y;
inference 2; backward 5: x, dy, x, dy, dx; dropout 2) and ``min`` = what any implementation
must move (training 2, inference 2, backward 3, dropout 2), each as a fraction of the device's
copy bandwidth measured in the same run (validation.activation_softmax.copy_bandwidth).
Target (docs/performance.md): every Numba kernel >= 70% of copy bandwidth or no slower than
cuDNN.
"""

import argparse
import json

import numpy as np

import dnnkit
from dnnkit import arrays, reference
from dnnkit.timing import median_ms
from validation.activation_softmax import _torch, copy_bandwidth
from validation.overhead import gpu_us

INNER = 10   # back-to-back calls per timed sample

SETS = 3
SHAPE = (64, 256, 56, 56)
P = 0.5
BACKENDS = ("numba", "cudnn")


def _host(a):
    return a.cpu().numpy() if hasattr(a, "cpu") else arrays.to_host(a)


def _flat(outs):
    return np.concatenate([np.asarray(_host(o), np.float64).ravel() for o in outs])


def _bn_case(mode, dt, torch, rng):
    from numba import cuda
    from dnnkit.ops.batchnorm import param_shapes
    ps = param_shapes(SHAPE, mode)[0]
    pdt = arrays.acc_dtype(dt)
    hx = [(rng.standard_normal(SHAPE, np.float32) * 2 + 0.5).astype(dt) for _ in range(SETS)]
    hdy = (rng.standard_normal(SHAPE, np.float32)).astype(dt)
    hg, hb = (1 + 0.3 * rng.standard_normal(ps)).astype(pdt), rng.standard_normal(ps).astype(pdt)
    hm, hv = rng.standard_normal(ps).astype(pdt), (0.5 + rng.random(ps)).astype(pdt)
    x = [cuda.to_device(h) for h in hx]
    dy, g, b, m, v = (cuda.to_device(h) for h in (hdy, hg, hb, hm, hv))
    _, sm, si = dnnkit.batch_norm_train(x[0], g, b, mode=mode, backend="numba")
    ry, rmean, rinv, _, _ = reference.batch_norm_train(hx[0], hg, hb, mode)
    refs = {"train": _flat([ry, rmean, rinv]),
            "inference": reference.batch_norm_inference(hx[0], hg, hb, hm, hv, mode).ravel(),
            "backward": _flat(reference.batch_norm_backward(hx[0], hdy, hg, arrays.to_host(sm),
                                                            arrays.to_host(si), mode))}
    del ry
    ops = {
        "train": lambda bk, i: dnnkit.batch_norm_train(x[i % SETS], g, b, mode=mode, backend=bk),
        "inference": lambda bk, i: dnnkit.batch_norm_inference(x[i % SETS], g, b, m, v,
                                                               mode=mode, backend=bk),
        "backward": lambda bk, i: dnnkit.batch_norm_backward(x[0], dy, g, sm, si, mode=mode,
                                                             backend=bk),
    }
    torch_ops = {}
    if torch is not None and mode == "spatial":
        tx = [torch.as_tensor(a, device="cuda") for a in x]
        tdy, tg, tb, tm, tv = (torch.as_tensor(a, device="cuda") for a in (dy, g, b, m, v))
        tsm, tsi = torch.as_tensor(sm, device="cuda"), torch.as_tensor(si, device="cuda")
        torch_ops = {
            "train": lambda i: torch.native_batch_norm(tx[i % SETS], tg, tb, None, None, True,
                                                       0.1, 1e-5),
            "inference": lambda i: torch.native_batch_norm(tx[i % SETS], tg, tb, tm, tv, False,
                                                           0.1, 1e-5)[0],
            "backward": lambda i: torch.ops.aten.native_batch_norm_backward(
                tdy, tx[0], tg, None, None, tsm, tsi, True, 1e-5, [True, True, True]),
        }
    passes = {"train": (3, 2), "inference": (2, 2), "backward": (5, 3)}
    nbytes = hx[0].nbytes
    for op in ("train", "inference", "backward"):
        yield (f"bn {mode} {op}", nbytes * passes[op][0], nbytes * passes[op][1],
               lambda bk, i, op=op: ops[op](bk, i), torch_ops.get(op),
               lambda out, op=op: reference.rel_error(_flat(out if isinstance(out, (tuple, list))
                                                            else [out]), refs[op]))


def _dropout_case(dt, torch, rng):
    from numba import cuda
    hx = [(rng.standard_normal(SHAPE, np.float32) + 4).astype(dt) for _ in range(SETS)]
    x = [cuda.to_device(h) for h in hx]
    states = {}
    for bk in BACKENDS:
        try:
            states[bk] = dnnkit.dropout(x[0], P, seed=5, backend=bk)[1]
        except dnnkit.CudnnUnavailableError:
            pass

    def check(out, a):
        """Error vs a*mask/(1-p) with the mask the output shows; inf if the keep rate is
        more than 6 binomial standard deviations from 1 - p."""
        y = _host(out[0] if isinstance(out, tuple) else out)
        kept = y != 0
        rate = abs(kept.mean() - (1 - P)) / np.sqrt(P * (1 - P) / kept.size)
        err = reference.rel_error(y, reference.dropout(a, kept, P))
        return err if rate <= 6 else float("inf")

    torch_fwd = torch_bwd = None
    if torch is not None:
        tx = [torch.as_tensor(a, device="cuda") for a in x]
        tmask = torch.native_dropout(tx[0], P, True)[1]
        torch_fwd = lambda i: torch.native_dropout(tx[i % SETS], P, True)  # noqa: E731
        torch_bwd = lambda i: torch.ops.aten.native_dropout_backward(  # noqa: E731
            tx[0], tmask, 1 / (1 - P))
    nbytes = hx[0].nbytes
    yield ("dropout fwd", 2 * nbytes, 2 * nbytes,
           lambda bk, i: dnnkit.dropout(x[i % SETS], P, seed=5, backend=bk), torch_fwd,
           lambda out: check(out, hx[0]))
    yield ("dropout bwd", 2 * nbytes, 2 * nbytes,
           lambda bk, i: dnnkit.dropout_backward(x[0], states[bk], backend=bk), torch_bwd,
           lambda out: check(out, hx[0]))


def run(reps, dtype):
    torch = _torch()
    rng = np.random.default_rng(0)
    dt = np.dtype(dtype)
    rows = []
    cases = [*_bn_case("spatial", dt, torch, rng), *_bn_case("per-activation", dt, torch, rng),
             *_dropout_case(dt, torch, rng)]
    for name, alg, least, fn, tfn, check in cases:
        impls = {bk: (lambda i, bk=bk: fn(bk, i)) for bk in BACKENDS}
        if tfn is not None:
            impls["torch"] = tfn
        for backend, f in impls.items():
            try:
                out = f(0)
            except (dnnkit.CudnnUnavailableError, KeyError) as e:   # KeyError: no cuDNN state
                rows.append(dict(op=name, backend=backend, error=str(e)))
                continue
            except Exception as e:   # a PyTorch build without this op or dtype
                if backend != "torch":
                    raise
                rows.append(dict(op=name, backend=backend, error=f"{type(e).__name__}: {e}"))
                continue
            err = check(out)          # correctness first
            call = median_ms(f, reps, inner=INNER)
            kern, names = gpu_us(torch, lambda: f(0)) if torch is not None else (None, [])
            ms = kern / 1e3 if kern else call
            rows.append(dict(op=name, backend=backend, dtype=dt.name, rel_err=err,
                             call_ms=call, kernel_ms=kern / 1e3 if kern else None,
                             kernels=names, gbps_alg=alg / ms / 1e6, gbps_min=least / ms / 1e6))
    return rows


def table(rows, bw, device):
    out = [f"device: {device}", f"copy bandwidth (read+write): {bw:.0f} GB/s",
           "GB/s and ratios from kernel ms (call ms where PyTorch is absent)", "",
           f"{'op':<28} {'backend':<7} {'rel err':>9} {'call ms':>8} {'kern ms':>8} "
           f"{'GB/s alg':>9} {'%copy':>6} {'GB/s min':>9} {'%copy':>6} {'vs cudnn':>8} "
           f"{'vs torch':>8}"]
    by = {(r["op"], r["backend"]): r for r in rows}

    def t(r):
        return r["kernel_ms"] or r["call_ms"]
    for r in rows:
        if "error" in r:
            out.append(f"{r['op']:<28} {r['backend']:<7} unavailable: {r['error'][:70]}")
            continue
        c, tr = by.get((r["op"], "cudnn")), by.get((r["op"], "torch"))
        vc = f"{t(r) / t(c):8.2f}" if c and "call_ms" in c else f"{'-':>8}"
        vt = f"{t(r) / t(tr):8.2f}" if tr and "call_ms" in tr else f"{'-':>8}"
        km = f"{r['kernel_ms']:8.3f}" if r["kernel_ms"] else f"{'-':>8}"
        out.append(f"{r['op']:<28} {r['backend']:<7} {r['rel_err']:9.2e} {r['call_ms']:8.3f} "
                   f"{km} {r['gbps_alg']:9.0f} {100 * r['gbps_alg'] / bw:6.1f} "
                   f"{r['gbps_min']:9.0f} {100 * r['gbps_min'] / bw:6.1f} {vc} {vt}")
    return "\n".join(out)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--dtype", default="float32", choices=["float16", "float32", "float64"])
    p.add_argument("--json")
    a = p.parse_args()
    st = dnnkit.backends.status()
    print(st, "\n")
    bw = copy_bandwidth(a.reps)
    rows = run(a.reps, a.dtype)
    print(table(rows, bw, st.numba.device))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(device=st.numba.device, copy_gbps=bw, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
