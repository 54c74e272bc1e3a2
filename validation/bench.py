"""The benchmark report: every op, forward and backward, on each backend and PyTorch, correctness
first, then time; the device's two ceilings; the targets (docs/performance.md). Needs a GPU.

    python -m validation.bench [--reps 20] [--only conv,pool,...] [--out DIR]
    python -m validation.bench --set deepbench [--reps 10]     # the second convolution set

``--set resnet50`` (the default) runs the op families of validation/bench_cases.py (the
convolutions on ResNet-50's layers; ``mixed``: float16 and TF32); ``--set deepbench`` runs the
DeepBench-style convolutions of validation/deepbench_cases.py instead, float32 and float16,
and reports their geometric means and worst rows.

Per case (validation/bench_cases.py): each backend's outputs against a float64 reference
(PyTorch in float64 on the same inputs: max|got - ref| / max|ref|, the worst output; a NaN
fails), then the time per call: the median over ``reps`` samples of INNER back-to-back calls
between CUDA events on the default stream, after a warm-up, the inputs rotated among SETS
fresh random sets (so the L2 cache does not flatter small ops), the backends' and PyTorch's
samples interleaved round by round (drift over the run falls on all alike) — an op's cost in
a stream of ops, as a training loop sees it, host overhead included where the host is the
bottleneck. PyTorch runs with TF32 off (except the rows marked tf32). Throughput is TFLOP/s
for convolution and RNN, GB/s (bytes read + written once) for the memory-bound ops. For
those, ``kernel ms`` is also measured with the host out of the way (the calls queued behind a
sleeping kernel, outputs reused): the bandwidth targets are judged on it, since a call's time
on small ops is host time.

Writes DIR/bench.json, DIR/bench.md (the table) and DIR/bench.png (ratios to cuDNN and to
PyTorch), and prints the table and the targets.
"""

import argparse
import json
import math
import os
import subprocess
import sys
import time

import numpy as np

import dnnkit
from dnnkit.timing import median_ms, median_ms_each
from validation import bench_cases as bc
from validation import deepbench_cases

INNER = 5
BACKENDS = ("numba", "cudnn", "torch")


def _torch():
    try:
        import torch
    except ImportError:
        return None
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    return torch


def _host(a):
    a = a.detach().cpu().numpy() if hasattr(a, "detach") else dnnkit.arrays.to_host(a)
    return np.asarray(a, np.float64)


def rel_error(got, ref):
    worst = 0.0
    for g, r in zip(got, ref):
        g, r = _host(g), _host(r)
        e = float(np.abs(g - r).max() / max(np.abs(r).max(), 1e-30))
        worst = max(worst, e if math.isfinite(e) else math.inf)
    return worst


def _self_mask_ref(case, inp, outs):
    """Dropout: y (or dx) must be x (or dy) * kept / (1 - p), kept read off the output."""
    src = _host(inp["x"] if "fwd" in case.op else inp["dy"])
    y = _host(outs[0])
    kept = y != 0
    keep = kept.mean()
    if abs(keep - 0.5) > 0.01:
        return math.inf
    return float(np.abs(y - src * kept * 2.0).max() / np.abs(2 * src).max())


def run_case(case, reps, T, rng):
    """Correctness of each backend first; then every backend's and PyTorch's time per call,
    their samples interleaved (timing.median_ms_each: drift over the run falls on all alike)."""
    sets = [case.make(rng) for _ in range(bc.SETS)]
    row = dict(op=case.op, shape=case.shape, dtype=case.dtype, work=case.work[0])
    timed = {}
    with dnnkit.config.change_flags(case.flags):
        ref = None
        if case.ref != "self-mask":
            ref = case.ref(T, sets[0]) if T is not None and case.ref else None
        for b, fn in case.impl.items():
            try:
                outs = fn(sets[0])
            except dnnkit.CudnnUnavailableError as e:
                row[b + "_skip"] = e.reason
                continue
            if case.ref == "self-mask":
                err = _self_mask_ref(case, sets[0], outs)
            else:
                err = rel_error(outs, ref if ref is not None else case.impl["cudnn"](sets[0]))
            row[b + "_err"] = err
            row[b + "_ok"] = err <= case.tol
            timed[b] = lambda i, fn=fn: fn(sets[i % len(sets)])
            if case.work[0] == "byte":
                row[b + "_kms"] = _kernel_ms(fn, sets, reps)
        # the same settings as dnnkit's row: TF32 on for the rows marked tf32 (PyTorch's flag
        # does not reach dnnkit's calls)
        with_torch = T is not None and case.torch is not None
        if with_torch:
            T.backends.cudnn.allow_tf32 = "tf32" in case.op
            thunks = [case.torch(T, s) for s in sets]
            timed["torch"] = lambda i: thunks[i % len(thunks)]()
        try:
            for b, ms in median_ms_each(timed, reps, 2, INNER).items():
                row[b + "_ms"] = ms
        finally:
            if with_torch:
                T.backends.cudnn.allow_tf32 = False
    kind, amount = case.work
    row["numba_kbytes"] = amount if kind == "byte" else None
    for b in BACKENDS:
        if b + "_ms" in row:
            row[b + "_rate"] = amount / row[b + "_ms"] / (1e9 if kind == "flop" else 1e6)
    for b in ("numba", "torch"):
        if b + "_ms" in row and "cudnn_ms" in row:
            row[b + "_vs_cudnn"] = row["cudnn_ms"] / row[b + "_ms"]   # throughput ratio
    if "cudnn_ms" in row and "torch_ms" in row:
        row["cudnn_vs_torch"] = row["cudnn_ms"] / row["torch_ms"]     # time ratio
    return row


def _kernel_ms(fn, sets, reps):
    """GPU time per call with the host out of the way (validation/pool_bench.kernel_ms: the
    calls queue behind a sleeping kernel; outputs reused, so no allocation between them):
    what the kernels themselves achieve, for the bandwidth targets."""
    from validation.pool_bench import kernel_ms, reuse_outputs
    with reuse_outputs():
        return kernel_ms(lambda i: fn(sets[i % len(sets)]), reps)


# ---------------------------------------------------------------- ceilings, overhead, cold start

def ceilings(T, reps):
    from validation.activation_softmax import copy_bandwidth
    out = dict(copy_gbps=copy_bandwidth(reps))
    if T is not None:
        a, b = (T.randn(8192, 8192, device="cuda") for _ in range(2))
        out["sgemm_tflops"] = 2 * 8192**3 / median_ms(lambda i: a @ b, reps) / 1e9
    return out


def overhead(T):
    """Host µs per call of tiny ops (validation/overhead.host_us_each: rounds of 200
    back-to-back calls and one sync, every backend and PyTorch in turn; the median round)."""
    from validation.overhead import host_us_each
    from numba import cuda
    rng = np.random.default_rng(3)
    x = cuda.to_device(rng.standard_normal(1024).astype(np.float32))
    xc = cuda.to_device(rng.standard_normal((1, 8, 8, 8)).astype(np.float32))
    wc = cuda.to_device(rng.standard_normal((8, 8, 3, 3)).astype(np.float32))
    fns = {}
    for b in ("numba", "cudnn"):
        fns[("relu 1024", b)] = lambda b=b: dnnkit.relu(x, backend=b)
        fns[("conv 1x8x8x8 3x3", b)] = lambda b=b: dnnkit.conv2d(xc, wc, padding=1, backend=b)
    if T is not None:
        tx, txc, twc = (T.as_tensor(a, device="cuda") for a in (x, xc, wc))
        fns[("relu 1024", "torch")] = lambda: T.relu(tx)
        fns[("conv 1x8x8x8 3x3", "torch")] = lambda: T.nn.functional.conv2d(txc, twc,
                                                                            padding=1)
    return [(name, b, us) for (name, b), us in host_us_each(fns).items()]


_COLD = """
import time
t0 = time.perf_counter()
import dnnkit
t1 = time.perf_counter()
import numpy as np
from numba import cuda
x = cuda.to_device(np.ones((1, 8, 8, 8), np.float32))
w = cuda.to_device(np.ones((8, 8, 3, 3), np.float32))
cuda.synchronize()
t2 = time.perf_counter()
dnnkit.conv2d(x, w, padding=1, backend="numba").copy_to_host()
t3 = time.perf_counter()
print(t1 - t0, t3 - t2)
"""


def cold_start():
    """``import dnnkit`` time (it imports numba.cuda lazily, on the first op) and the first
    Numba conv of a fresh process (CUDA context, numba.cuda import and the kernels), twice with
    one fresh on-disk kernel cache: the first process compiles, the second loads."""
    import tempfile
    out = []
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, NUMBA_CACHE_DIR=d)
        for _ in range(2):
            r = subprocess.run([sys.executable, "-c", _COLD], env=env, capture_output=True,
                               text=True, timeout=600)
            out.append([float(v) for v in r.stdout.split()] if r.returncode == 0 else
                       r.stderr[-400:])
    return out


# ---------------------------------------------------------------- report

def _fmt(v, spec):
    return format(v, spec) if isinstance(v, (int, float)) else "-"


def table(rows):
    head = ("| op | shape | dtype | numba err | cudnn err | numba ms | cudnn ms | torch ms | "
            "numba rate | cudnn rate | torch rate | numba/cuDNN | cuDNN/torch | numba kernel ms | "
            "cudnn kernel ms |")
    lines = [head, "|" + "---|" * 15]
    for r in rows:
        unit = "TF/s" if r["work"] == "flop" else "GB/s"
        lines.append("| " + " | ".join([
            r["op"], r["shape"], r["dtype"],
            _fmt(r.get("numba_err"), ".1e") + ("" if r.get("numba_ok", True) else " FAIL"),
            _fmt(r.get("cudnn_err"), ".1e") + ("" if r.get("cudnn_ok", True) else " FAIL"),
            _fmt(r.get("numba_ms"), ".3f"), _fmt(r.get("cudnn_ms"), ".3f"),
            _fmt(r.get("torch_ms"), ".3f"),
            _fmt(r.get("numba_rate"), ".0f" if unit == "GB/s" else ".2f"),
            _fmt(r.get("cudnn_rate"), ".0f" if unit == "GB/s" else ".2f"),
            _fmt(r.get("torch_rate"), ".0f" if unit == "GB/s" else ".2f"),
            _fmt(r.get("numba_vs_cudnn"), ".2f"), _fmt(r.get("cudnn_vs_torch"), ".2f"),
            _fmt(r.get("numba_kms"), ".3f"), _fmt(r.get("cudnn_kms"), ".3f")]) + " |")
    return "\n".join(lines)


def _gmean(v):
    v = [x for x in v if x]
    return math.exp(sum(map(math.log, v)) / len(v)) if v else float("nan")


def targets(rows, ceil, over, cold):
    """The performance targets (docs/performance.md), each with the figure reached."""
    t = []

    def rows_of(prefix, dtype="float32"):
        return [r for r in rows if r["op"].startswith(prefix) and r["dtype"] == dtype]
    for d, goal in (("fwd", 0.5), ("bwd_data", 0.4), ("bwd_filter", 0.4)):
        picked = [r.get("numba_vs_cudnn") for r in rows_of(f"conv2d {d}")
                  if "tf32" not in r["op"]]
        if not picked:        # the conv family did not run (--only, --set deepbench)
            continue
        g = _gmean(picked)
        t.append((f"conv Numba/cuDNN throughput, {d} (geomean)", f">= {goal}", g, g >= goal))
    bw = ceil["copy_gbps"]
    for r in rows:
        if r["work"] == "byte" and r.get("numba_kms") and r.get("cudnn_kms"):
            # kernel times (host out of the way): the bandwidth the kernels achieve
            frac = r["numba_kbytes"] / r["numba_kms"] / 1e6 / bw
            vs = r["cudnn_kms"] / r["numba_kms"]
            t.append((f"{r['op']} Numba kernels: share of copy bandwidth / speed vs cuDNN's",
                      ">= 0.70 or >= 1.0", f"{frac:.2f} / {vs:.2f}", frac >= 0.7 or vs >= 1.0))
    for r in rows_of("rnn"):
        if "numba_ms" in r and "cudnn_ms" in r:
            x = r["numba_ms"] / r["cudnn_ms"]
            goal = 2.5 if r["op"] == "rnn fwd" else 3.0
            t.append((f"{r['op']} {r['shape']}: Numba time / cuDNN", f"<= {goal}", x,
                      x <= goal))
    for r in rows:
        if "cudnn_vs_torch" in r and "mixed" not in r["op"] and r["dtype"] == "float32" \
                and "tf32" not in r["op"]:
            t.append((f"{r['op']} {r['shape']}: cuDNN path time / PyTorch", "<= 1.10",
                      r["cudnn_vs_torch"], r["cudnn_vs_torch"] <= 1.10))
    by = {(n, b): us for n, b, us in over}
    for n in ("relu 1024", "conv 1x8x8x8 3x3"):
        if (n, "torch") in by:
            x = by[(n, "cudnn")] / by[(n, "torch")]
            t.append((f"host overhead {n}: cuDNN path / PyTorch", "<= 1.5", x, x <= 1.5))
    if len(cold) >= 2 and all(isinstance(c, list) for c in cold):
        t.append(("import dnnkit (s)", "< 1", cold[1][0], cold[1][0] < 1.0))
        t.append(("first Numba conv, fresh process: compiling / from the disk cache (s)",
                  "cached", f"{cold[0][1]:.2f} / {cold[1][1]:.2f}", cold[1][1] < cold[0][1] / 3))
    for r in rows:       # float16 on HMMA, TF32: every ResNet-50 row within 0.8 of cuDNN's
        if (r["dtype"] == "float16" or "tf32" in r["op"]) and r["op"].startswith("conv2d") \
                and r.get("numba_vs_cudnn"):
            x = r["numba_vs_cudnn"]
            t.append((f"{r['op']} {r['dtype']} {r['shape']}: Numba/cuDNN throughput",
                      ">= 0.80", x, x >= 0.8))
    t += deepbench_cases.summary(rows)
    for r in rows:
        if r["dtype"] == "float16" or "tf32" in r["op"]:
            if "torch_rate" in r and "cudnn_rate" in r:
                x = r["cudnn_rate"] / r["torch_rate"]
                t.append((f"{r['op']} {r['dtype']} {r['shape']}: cuDNN / PyTorch rate",
                          ">= 0.90", x, x >= 0.9))
    return t


def plot(rows, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    labels = [f"{r['op']} {r['shape']} {r['dtype'][-2:]}" for r in rows]
    y = np.arange(len(rows))
    fig, ax = plt.subplots(figsize=(10, 0.28 * len(rows) + 1.5))
    for k, (key, name) in enumerate((("numba_vs_cudnn", "Numba throughput / cuDNN"),
                                     ("torch_vs_cudnn", "PyTorch throughput / cuDNN"))):
        ax.barh(y + 0.4 * k, [r.get(key, 0) for r in rows], 0.4, label=name)
    ax.axvline(1.0, color="k", lw=0.8)
    ax.set_yticks(y + 0.2, labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("throughput relative to cuDNN (1 = as fast)")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--only", default="", help="families: conv,pool,bn,relu,softmax,dropout,"
                                              "rnn,spatial,mixed")
    p.add_argument("--set", default="resnet50", choices=("resnet50", "deepbench"),
                   help="resnet50: the op families (--only picks); deepbench: the second "
                        "convolution set (validation/deepbench_cases.py)")
    p.add_argument("--out", default=".")
    p.add_argument("--no-cold", action="store_true", help="skip the cold-start processes")
    p.add_argument("--no-overhead", action="store_true", help="skip the host time per call")
    a = p.parse_args()
    st = dnnkit.backends.status()
    print(st, flush=True)
    T = _torch()
    ceil = ceilings(T, a.reps)
    print(f"ceilings: copy {ceil['copy_gbps']:.0f} GB/s, SGEMM "
          f"{ceil.get('sgemm_tflops', float('nan')):.1f} TFLOP/s\n", flush=True)
    rng = np.random.default_rng(int(time.time()))   # fresh inputs every run
    rows = []
    cases = (deepbench_cases.deepbench_cases() if a.set == "deepbench" else
             bc.all_cases(a.only.split(",") if a.only else None))
    for case in cases:
        t0 = time.perf_counter()
        try:
            rows.append(run_case(case, a.reps, T, rng))
        except Exception as e:    # a broken case is reported, the rest still runs
            import traceback
            traceback.print_exc()
            rows.append(dict(op=case.op, shape=case.shape, dtype=case.dtype, work=case.work[0],
                             error=f"{type(e).__name__}: {e}", numba_ok=False))
        print(table(rows[-1:]).splitlines()[-1], f"({time.perf_counter() - t0:.0f} s)",
              flush=True)
        dnnkit.memory.empty_cache()
    over = [] if a.no_overhead else overhead(T)
    cold = [] if a.no_cold else cold_start()
    tg = targets(rows, ceil, over, cold)
    os.makedirs(a.out, exist_ok=True)
    md = table(rows)
    md += "\n\nhost µs per call: " + ", ".join(f"{n} {b} {us:.1f}" for n, b, us in over)
    md += "\n\n| target | goal | reached | met |\n|---|---|---|---|\n" + "\n".join(
        f"| {n} | {g} | {_fmt(v, '.2f') if not isinstance(v, str) else v} | "
        f"{'yes' if ok else 'NO'} |" for n, g, v, ok in tg)
    device = st.numba.describe()
    with open(os.path.join(a.out, "bench.md"), "w") as f:
        f.write(f"# dnnkit benchmark report\n\n{device}; cuDNN {st.cudnn_version}; "
                f"copy {ceil['copy_gbps']:.0f} GB/s; SGEMM "
                f"{ceil.get('sgemm_tflops', float('nan')):.1f} TFLOP/s\n\n{md}\n")
    for r in rows:
        if "torch_ms" in r and "cudnn_ms" in r:
            r["torch_vs_cudnn"] = r["cudnn_ms"] / r["torch_ms"]
    with open(os.path.join(a.out, "bench.json"), "w") as f:
        json.dump(dict(device=device, ceilings=ceil, rows=rows, overhead=over, cold=cold,
                       targets=[list(map(str, t)) for t in tg]), f, indent=1)
    plot(rows, os.path.join(a.out, "bench.png"))
    print("\n" + md)
    failed = [r for r in rows if any(r.get(b + "_ok") is False for b in BACKENDS)]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
