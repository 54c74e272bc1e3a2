"""Convolution cross-check and benchmark on ResNet-50 layer shapes (batch 32, float32, TF32 off).

    python -m validation.conv_bench [--reps 20] [--batch 32] [--algo guess_once] [--json F]

Per shape and direction (forward, data gradient, filter gradient): max relative error of the
Numba and cuDNN paths against PyTorch's float64 result on the same inputs (or each other where
PyTorch is absent), then the time per call — the median over samples of 10 back-to-back calls
between CUDA events, after a warm-up: a host-bound path shows its host cost — TFLOP/s, and the
ratios Numba/cuDNN and cuDNN/PyTorch.
"""

import argparse
import json
import math

import numpy as np

import dnnkit
from dnnkit import reference
from dnnkit.timing import median_ms

INNER = 10   # back-to-back calls per timed sample: an op's cost in a stream of ops

# (C, K, H=W, kernel, stride, padding)
RESNET50 = [(3, 64, 224, 7, 2, 3), (64, 64, 56, 3, 1, 1), (256, 64, 56, 1, 1, 0),
            (128, 128, 28, 3, 1, 1), (256, 256, 14, 3, 1, 1), (512, 512, 7, 3, 1, 1)]


def _torch():
    try:
        import torch
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
        return torch
    except ImportError:
        return None


def bench_shape(shape, batch, reps, torch):
    from numba import cuda
    c, k, hw, ks, st, pad = shape
    rng = np.random.default_rng(0)
    x = cuda.to_device(rng.standard_normal((batch, c, hw, hw)).astype(np.float32))
    w = cuda.to_device((rng.standard_normal((k, c, ks, ks)) / math.sqrt(c * ks * ks))
                       .astype(np.float32))
    kw = dict(stride=st, padding=pad)
    y0 = dnnkit.conv2d(x, w, backend="numba", **kw)
    dy = cuda.to_device(rng.standard_normal(y0.shape).astype(np.float32))
    flops = 2.0 * batch * k * y0.shape[2] * y0.shape[3] * c * ks * ks
    calls = {
        "fwd": lambda b: dnnkit.conv2d(x, w, backend=b, **kw),
        "bwd_data": lambda b: dnnkit.conv2d_backward_data(dy, w, x.shape, backend=b, **kw),
        "bwd_filter": lambda b: dnnkit.conv2d_backward_filter(x, dy, w.shape, backend=b, **kw),
    }
    refs = {}
    if torch is not None:
        tx, tw, tdy = (torch.as_tensor(a, device="cuda") for a in (x, w, dy))
        F = torch.nn.functional
        tcalls = {"fwd": lambda: F.conv2d(tx, tw, stride=st, padding=pad),
                  "bwd_data": lambda: torch.nn.grad.conv2d_input(tx.shape, tw, tdy, st, pad),
                  "bwd_filter": lambda: torch.nn.grad.conv2d_weight(tx, tw.shape, tdy, st, pad)}
        x64, w64, dy64 = tx.double(), tw.double(), tdy.double()
        refs = {"fwd": F.conv2d(x64, w64, stride=st, padding=pad),
                "bwd_data": torch.nn.grad.conv2d_input(tx.shape, w64, dy64, st, pad),
                "bwd_filter": torch.nn.grad.conv2d_weight(x64, tw.shape, dy64, st, pad)}
        refs = {d: r.cpu().numpy() for d, r in refs.items()}
    rows = []
    for d, fn in calls.items():
        row = dict(shape=f"{c}->{k} {hw}^2 {ks}x{ks}/{st}", direction=d)
        outs = {}
        for b in ("numba", "cudnn"):
            outs[b] = fn(b).copy_to_host()
            row[b + "_ms"] = median_ms(lambda i: fn(b), reps, warmup=2, inner=INNER)
        ref = refs.get(d, outs["cudnn"])
        for b in ("numba", "cudnn"):
            row[b + "_err"] = reference.rel_error(outs[b], ref)
            row[b + "_tflops"] = flops / row[b + "_ms"] / 1e9
        if torch is not None:
            row["torch_ms"] = median_ms(lambda i: tcalls[d](), reps, warmup=2, inner=INNER)
        rows.append(row)
    return rows


def kernel_breakdown(shape, batch, torch):
    """GPU time per kernel (CUPTI, through PyTorch's profiler) of one Numba forward and one
    cuDNN forward: what the Numba path's time is made of (im2col vs GEMM), without host time."""
    from numba import cuda
    from torch.profiler import ProfilerActivity, profile
    c, k, hw, ks, st, pad = shape
    rng = np.random.default_rng(1)
    x = cuda.to_device(rng.standard_normal((batch, c, hw, hw)).astype(np.float32))
    w = cuda.to_device(rng.standard_normal((k, c, ks, ks)).astype(np.float32))
    out = []
    for b in ("numba", "cudnn"):
        dnnkit.conv2d(x, w, stride=st, padding=pad, backend=b)
        cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                dnnkit.conv2d(x, w, stride=st, padding=pad, backend=b)
            cuda.synchronize()
        for e in prof.key_averages():
            if e.device_time_total > 0:
                out.append((b, e.key[:60], e.device_time_total / 5 / 1e3))
    return out


def table(rows):
    head = (f"{'shape':<22} {'dir':<10} {'numba err':>9} {'cudnn err':>9} {'numba ms':>9} "
            f"{'cudnn ms':>9} {'torch ms':>9} {'numba TF':>8} {'cudnn TF':>8} {'nb/cd':>6} "
            f"{'cd/torch':>8}")
    out = [head]
    for r in rows:
        t = r.get("torch_ms")
        out.append(f"{r['shape']:<22} {r['direction']:<10} {r['numba_err']:9.1e} "
                   f"{r['cudnn_err']:9.1e} {r['numba_ms']:9.3f} {r['cudnn_ms']:9.3f} "
                   f"{t if t else float('nan'):9.3f} {r['numba_tflops']:8.2f} "
                   f"{r['cudnn_tflops']:8.2f} {r['numba_tflops'] / r['cudnn_tflops']:6.2f} "
                   f"{(r['cudnn_ms'] / t) if t else float('nan'):8.2f}")
    for d in ("fwd", "bwd_data", "bwd_filter"):
        ratios = [r["numba_tflops"] / r["cudnn_tflops"] for r in rows if r["direction"] == d]
        if ratios:
            gm = math.exp(sum(map(math.log, ratios)) / len(ratios))
            out.append(f"geometric mean Numba/cuDNN throughput, {d}: {gm:.2f}")
    return "\n".join(out)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--json")
    p.add_argument("--algo", default="guess_once",
                   help="cuDNN algorithm choice for all three directions (guess_once: cuDNN's "
                        "heuristics, as PyTorch with cudnn.benchmark off; 'defaults': the flags' "
                        "defaults)")
    p.add_argument("--kernels", action="store_true",
                   help="also print the GPU time of each kernel of the forward passes")
    a = p.parse_args()
    if a.algo != "defaults":
        dnnkit.config.set("dnn.conv.algo_fwd", a.algo)
        dnnkit.config.set("dnn.conv.algo_bwd_data", a.algo)
        dnnkit.config.set("dnn.conv.algo_bwd_filter", a.algo)
    print(f"cuDNN algorithms: {a.algo}")
    print(dnnkit.backends.status(), "\n", flush=True)
    torch = _torch()
    rows = []
    for shape in RESNET50:
        new = bench_shape(shape, a.batch, a.reps, torch)
        rows += new
        print("\n".join(table(new).splitlines()[1:4]), flush=True)
    print("\n" + table(rows))
    if a.kernels and torch is not None:
        print("\nGPU time per kernel, forward (ms per call):")
        for shape in RESNET50:
            for b, name, ms in kernel_breakdown(shape, a.batch, torch):
                print(f"  {str(shape):<28} {b:<6} {ms:8.3f}  {name}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
