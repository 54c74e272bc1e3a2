"""Pooling on a GPU: what cuDNN does at the corners, correctness, then time and bandwidth of the
Numba and cuDNN paths (PyTorch's max_pool/avg_pool where importable, as an independent oracle).

    python -m validation.pool_bench [--reps 20] [--dtypes float32,float16] [--json out.json]

1. Probe: which of tied maxima cuDNN's MAX / MAX_DETERMINISTIC backward picks, where a NaN
   window's gradient goes, whether padding ever wins a max (docs/pool.md states the answers).
2. Per case, mode and direction: max relative error of Numba, cuDNN and PyTorch against the
   float64 reference (dnnkit.reference, same inputs; tie-free inputs for the max modes, so
   that every implementation must agree whatever its tie rule).
3. Times (ms): ``call`` is the median of CUDA-event-timed public calls (dnnkit.timing.median_ms:
   Python dispatch, descriptors and the output allocation included, as a user sees it);
   ``kernel`` is the GPU time per call with outputs reused and the host out of the way: a
   sleeping kernel holds the stream while the calls are queued behind it, and the events
   bracket only the queued calls. GB/s = bytes read + written / kernel time, where the bytes
   are what the op must move: forward x + y; backward max x + y + dy + dx, average/sum dy + dx.
   %copy compares with the device's copy bandwidth measured in the same run.
"""

import argparse
import contextlib
import json
import math
import statistics
import time

import numpy as np

import dnnkit
from dnnkit import reference
from dnnkit.ops.pool import MODES, tie_free
from dnnkit.timing import median_ms

CASES = [  # (name, x shape, window, stride, padding)
    ("stem 3x3/2 p1", (64, 64, 112, 112), 3, 2, 1),
    ("2x2/2", (64, 128, 56, 56), 2, 2, 0),
    ("global 7x7", (64, 2048, 7, 7), 7, 1, 0),
    ("3-D 3x3x3/2 p1", (8, 64, 16, 56, 56), 3, 2, 1),
]
SETS = 3   # input sets rotated between calls, so that the L2 cache does not flatter small cases


# ---------------------------------------------------------------- timing

_spin = None


def _sleeper():
    global _spin
    if _spin is None:
        from numba import cuda

        @cuda.jit
        def spin(n):
            for _ in range(n):
                cuda.nanosleep(1000000)     # about 1 ms each (the hardware caps one sleep)
        _spin = spin
    return _spin


def kernel_ms(fn, reps, rounds=5):
    """Median over ``rounds`` of (GPU time of ``reps`` queued calls) / reps; see the module
    docstring. Warns when the host could not queue the calls within the sleep."""
    from numba import cuda
    fn(0)
    spin, times = _sleeper(), []
    for _ in range(rounds):
        sleep_ms = 50 + 5 * reps
        spin[1, 1](sleep_ms)
        start, stop = cuda.event(), cuda.event()
        t0 = time.perf_counter()
        start.record()
        for i in range(reps):
            fn(i)
        stop.record()
        host_ms = (time.perf_counter() - t0) * 1e3
        stop.synchronize()
        if host_ms > 0.8 * sleep_ms:
            print(f"  (warning: queuing took {host_ms:.0f} ms of a {sleep_ms} ms sleep: the "
                  "kernel time includes host gaps)")
        times.append(cuda.event_elapsed_time(start, stop) / reps)
    return statistics.median(times)


@contextlib.contextmanager
def reuse_outputs():
    """Inside the block dnnkit's ops write into one cached buffer per (shape, dtype): no
    cudaMalloc/cudaFree per call (cudaFree synchronises, which would spoil kernel_ms)."""
    from dnnkit import arrays
    orig_like, orig_empty, cache = arrays.empty_like, arrays.cuda_empty, {}

    def empty(shape, dtype, stream):
        key = (tuple(shape), np.dtype(dtype).name)
        if key not in cache:
            cache[key] = orig_empty(shape, dtype, stream)
        return cache[key]
    arrays.cuda_empty = empty
    arrays.empty_like = lambda a, stream: empty(a.shape, a.dtype, stream)
    try:
        yield
    finally:
        arrays.empty_like, arrays.cuda_empty = orig_like, orig_empty


# ---------------------------------------------------------------- PyTorch (oracle only)

def _torch():
    try:
        import torch
        return torch if torch.cuda.is_available() else None
    except ImportError:
        return None


def torch_calls(torch, nd, k, s, p, mode, tx, ty_shape):
    """(forward(i), backward(i, dy)) of PyTorch's equivalent, or None where it has none."""
    F, aten = torch.nn.functional, torch.ops.aten
    k, s, p = ([v] * nd if isinstance(v, int) else list(v) for v in (k, s, p))
    if mode.startswith("max"):
        pool = F.max_pool2d if nd == 2 else F.max_pool3d
        back = aten.max_pool2d_with_indices_backward if nd == 2 else \
            aten.max_pool3d_with_indices_backward
        idx = [pool(t, k, s, p, return_indices=True)[1] for t in tx]
        return (lambda i: pool(tx[i % SETS], k, s, p),
                lambda i, dy: back(dy, tx[i % SETS], k, s, p, [1] * nd, False, idx[i % SETS]))
    pool = F.avg_pool2d if nd == 2 else F.avg_pool3d
    back = aten.avg_pool2d_backward if nd == 2 else aten.avg_pool3d_backward
    inc, div = mode != "average_exc_pad", (1 if mode == "sum" else None)
    return (lambda i: pool(tx[i % SETS], k, s, p, False, inc, divisor_override=div),
            lambda i, dy: back(dy, tx[i % SETS], k, s, p, False, inc, div))


# ---------------------------------------------------------------- probe

def probe():
    """What cuDNN's max backward does with ties, NaN and padding (small, exact inputs)."""
    lines = []
    x = np.array([[[[0, 3], [3, 1]], [[2, 2], [2, 2]]]], np.float32)   # ties at the max
    dy = np.ones((1, 2, 1, 1), np.float32)
    for mode in ("max", "max_deterministic"):
        y = dnnkit.pool2d(x, 2, backend="cudnn", mode=mode)
        dx = dnnkit.pool2d_backward(x, y, dy, 2, mode=mode, backend="cudnn").copy_to_host()
        got = [[tuple(int(v) for v in t) for t in zip(*np.nonzero(dx[0, c]))] for c in range(2)]
        lines.append(f"cuDNN {mode}: tie [[0,3],[3,1]] -> dy at {got[0]}, all-tied 2x2 -> "
                     f"{got[1]} (first in scan order: [(0, 1)] and [(0, 0)])")
    xn = np.array([[[[1, np.nan], [np.nan, 5]]]], np.float32)
    for mode in ("max", "max_deterministic"):
        y = dnnkit.pool2d(xn, 2, mode=mode, backend="cudnn")
        dx = dnnkit.pool2d_backward(xn, y, np.ones((1, 1, 1, 1), np.float32), 2, mode=mode,
                                    backend="cudnn").copy_to_host()[0, 0]
        lines.append(f"cuDNN {mode}: y of [[1,nan],[nan,5]] = {y.copy_to_host().ravel()}, "
                     f"dx = {dx.tolist()} (Numba: dy at the first NaN, (0, 1))")
    xp = -np.ones((1, 1, 2, 2), np.float32)
    y = dnnkit.pool2d(xp, 2, 1, 1, "max", backend="cudnn").copy_to_host()
    lines.append(f"cuDNN max, all -1 input, window 2 pad 1: y = {y.ravel().tolist()} "
                 "(all -1: padding never wins)")
    return lines


# ---------------------------------------------------------------- one case

def _bytes(direction, mode, x, y):
    """Bytes the op must move: forward x + y; backward max x + y + dy + dx, else dy + dx."""
    if direction == "bwd" and mode.startswith("max"):
        return 2 * (x.nbytes + y.nbytes)
    return x.nbytes + y.nbytes


def bench_case(case, mode, dtype, reps, torch):
    from numba import cuda
    name, shape, k, s, p = case
    nd = len(shape) - 2
    fwd, bwd = (dnnkit.pool2d, dnnkit.pool2d_backward) if nd == 2 else \
        (dnnkit.pool3d, dnnkit.pool3d_backward)
    rng = np.random.default_rng(0)
    period = max(4, *np.atleast_1d(k))   # windows of distinct values: a unique arg-max
    make = (lambda r, sh, dt: tie_free(r, sh, dt, period)) if mode.startswith("max") else \
        (lambda r, sh, dt: r.standard_normal(sh).astype(dt))
    host = [make(rng, shape, dtype) for _ in range(SETS)]
    xs = [cuda.to_device(h) for h in host]
    ys = [fwd(x, k, s, p, mode, backend="numba") for x in xs]
    dy_host = rng.standard_normal(ys[0].shape).astype(dtype)
    dy = cuda.to_device(dy_host)
    x64 = host[0].astype(np.float64)
    refs = {"fwd": reference.pool_forward(x64, k, s, p, mode),
            "bwd": reference.pool_backward(x64, dy_host.astype(np.float64), k, s, p, mode)}
    calls = {b: {"fwd": lambda i, b=b: fwd(xs[i % SETS], k, s, p, mode, backend=b),
                 "bwd": lambda i, b=b: bwd(xs[i % SETS], ys[i % SETS], dy, k, s, p, mode,
                                           backend=b)}
             for b in ("numba", "cudnn")}
    if torch is not None:
        tx = [torch.as_tensor(x, device="cuda") for x in xs]
        tf, tb = torch_calls(torch, nd, k, s, p, mode, tx, ys[0].shape)
        tdy = torch.as_tensor(dy, device="cuda")
        calls["torch"] = {"fwd": tf, "bwd": lambda i: tb(i, tdy)}
    rows = []
    for direction in ("fwd", "bwd"):
        nbytes = _bytes(direction, mode, host[0], dy_host)
        for backend, fns in calls.items():
            row = dict(case=name, mode=mode, dtype=np.dtype(dtype).name, dir=direction,
                       backend=backend)
            fn = fns[direction]
            try:
                out = fn(0)
                got = out.cpu().numpy() if hasattr(out, "cpu") else out.copy_to_host()
            except Exception as e:   # cuDNN unavailable, or PyTorch has no such mode
                row["error"] = f"{type(e).__name__}: {e}"[:90]
                rows.append(row)
                continue
            row["rel_err"] = reference.rel_error(got, refs[direction])
            row["call_ms"] = median_ms(fn, reps)
            with reuse_outputs():
                row["kernel_ms"] = kernel_ms(fn, reps)
            row["gbps"] = nbytes / row["kernel_ms"] / 1e6
            rows.append(row)
    return rows


def table(rows, bw):
    head = (f"{'case':<16} {'mode':<18} {'dtype':<8} {'dir':<4} {'backend':<6} {'rel err':>8} "
            f"{'call ms':>8} {'kern ms':>8} {'GB/s':>6} {'%copy':>6} {'/cudnn':>7}")
    out = [f"copy bandwidth (read + write): {bw:.0f} GB/s", "", head]
    by = {(r["case"], r["mode"], r["dtype"], r["dir"], r["backend"]): r for r in rows}
    for r in rows:
        lead = (f"{r['case']:<16} {r['mode']:<18} {r['dtype']:<8} {r['dir']:<4} "
                f"{r['backend']:<6} ")
        if "error" in r:
            out.append(lead + "n/a: " + r["error"])
            continue
        c = by.get((r["case"], r["mode"], r["dtype"], r["dir"], "cudnn"))
        vs = f"{r['kernel_ms'] / c['kernel_ms']:7.2f}" if c and "kernel_ms" in c else f"{'-':>7}"
        out.append(lead + f"{r['rel_err']:8.1e} {r['call_ms']:8.3f} {r['kernel_ms']:8.3f} "
                   f"{r['gbps']:6.0f} {100 * r['gbps'] / bw:6.1f} {vs}")
    numba = [r for r in rows if r["backend"] == "numba" and "gbps" in r]
    if numba:
        def cudnn_ms(r):
            c = by.get((r["case"], r["mode"], r["dtype"], r["dir"], "cudnn"), {})
            return c.get("kernel_ms", 0.0)
        gmean = math.exp(statistics.mean(math.log(r["gbps"] / bw) for r in numba))
        met = sum(r["gbps"] >= 0.7 * bw or r["kernel_ms"] <= cudnn_ms(r) for r in numba)
        out.append(f"\nNumba kernels: geometric mean {100 * gmean:.0f}% of copy bandwidth; "
                   f"{met} of {len(numba)} at >= 70% of it or no slower than cuDNN")
    return "\n".join(out)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--dtypes", default="float32")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--cases", default="", help="comma-separated case indices (default: all)")
    p.add_argument("--json")
    a = p.parse_args()
    from validation.activation_softmax import copy_bandwidth
    st = dnnkit.backends.status()
    print(st, "\n", flush=True)
    if st.cudnn_available:
        print("\n".join(probe()), "\n", flush=True)
    bw = copy_bandwidth(a.reps)
    torch = _torch()
    cases = [CASES[int(i)] for i in a.cases.split(",")] if a.cases else CASES
    rows = []
    for case in cases:
        for dtype in a.dtypes.split(","):
            for mode in a.modes.split(","):
                new = bench_case(case, mode, dtype, a.reps, torch)
                rows += new
                print("\n".join(table(new, bw).splitlines()[3:]), flush=True)
    print("\n" + table(rows, bw))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(copy_gbps=bw, device=str(st), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
