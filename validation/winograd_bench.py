"""The Numba convolution with and without Winograd F(2x2, 3x3) (dnnkit/ops/conv_winograd.py),
next to cuDNN, side by side in one run, on the ResNet-50 layers it applies to (3x3, stride 1).

    python -m validation.winograd_bench [--reps 20] [--batch 32] [--dtype float32]
                                        [--parts 1,4,16,64]

Per layer and pass (forward, data gradient, filter gradient): the max relative error of both
Numba paths against PyTorch's float64 result (against each other without PyTorch), then for
the Numba backend without Winograd (its default otherwise: implicit GEMM or im2col + GEMM),
with Winograd, and cuDNN the time per call (median of CUDA-event timed samples of 5
back-to-back calls after a warm-up, as validation/bench.py) and the GPU time with the host
out of the way (``kms``: the calls queued behind a sleeping kernel, validation/pool_bench.py);
the ratios winograd / other and cuDNN / winograd (the conv targets' ratio), by kms.
``--parts``: also the filter gradient with each number of tile slices
(``conv_tuning.settings.winograd_parts``), the rule's choice last.
"""

import argparse
import math

import numpy as np

import dnnkit
from dnnkit.ops.conv_tuning import settings as tuning
from dnnkit.timing import median_ms
from validation.conv_bench import RESNET50, _torch
from validation.implicit_bench import _reference
from validation.pool_bench import kernel_ms, reuse_outputs


def _times(fn, reps):
    """(ms per call in a stream of calls, GPU-only ms)."""
    ms = median_ms(lambda i: fn(), reps, 2, 5)
    with reuse_outputs():
        return ms, kernel_ms(lambda i: fn(), reps)


def _layer(rng, c, hw, k, batch, dtype, kw):
    from numba import cuda
    xh = rng.standard_normal((batch, c, hw, hw)).astype(dtype)
    wh = (rng.standard_normal((k, c, 3, 3)) / math.sqrt(c * 9)).astype(dtype)
    x, w = cuda.to_device(xh), cuda.to_device(wh)
    dyh = rng.standard_normal(dnnkit.conv2d(x, w, backend="numba", **kw).shape).astype(dtype)
    return xh, wh, dyh, x, w, cuda.to_device(dyh)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--parts", default="")
    args = ap.parse_args()
    torch = _torch()
    have_cudnn = dnnkit.backends.status().cudnn_available
    rng = np.random.default_rng(0)
    print(f"{'C':>4} {'K':>4} {'HW':>4} {'pass':>10} {'err other':>9} {'err wino':>9} "
          f"{'other ms':>8} {'wino ms':>8} {'cuDNN ms':>8} {'other kms':>9} {'wino kms':>8} "
          f"{'cuDNN kms':>9} {'wino/other':>10} {'cuDNN/wino':>10}")
    saved = tuning.winograd, tuning.winograd_parts
    for c, k, hw, ks, st, pad in RESNET50:
        if (ks, st) != (3, 1):
            continue
        kw = dict(stride=st, padding=pad)
        xh, wh, dyh, x, w, dy = _layer(rng, c, hw, k, args.batch, args.dtype, kw)
        refs = _reference(torch, xh, wh, dyh, kw)
        calls = {"fwd": lambda b: dnnkit.conv2d(x, w, backend=b, **kw),
                 "bwd_data": lambda b: dnnkit.conv2d_backward_data(dy, w, x.shape, backend=b,
                                                                   **kw),
                 "bwd_filter": lambda b: dnnkit.conv2d_backward_filter(x, dy, w.shape,
                                                                       backend=b, **kw)}
        try:
            for pas, call in calls.items():
                outs, times = {}, {}
                for name, on in (("other", False), ("wino", True)):
                    tuning.winograd = on
                    outs[name] = call("numba").copy_to_host()
                    times[name] = _times(lambda: call("numba"), args.reps)
                tuning.winograd = saved[0]
                times["cudnn"] = _times(lambda: call("cudnn"), args.reps) \
                    if have_cudnn else (float("nan"),) * 2
                ref = refs[pas] if refs else outs["other"].astype(np.float64)
                err = {n: float(np.abs(o - ref).max() / np.abs(ref).max())
                       for n, o in outs.items()}
                o, wi, cu = times["other"], times["wino"], times["cudnn"]
                print(f"{c:4d} {k:4d} {hw:4d} {pas:>10} {err['other']:9.2e} "
                      f"{err['wino']:9.2e} {o[0]:8.3f} {wi[0]:8.3f} {cu[0]:8.3f} {o[1]:9.3f} "
                      f"{wi[1]:8.3f} {cu[1]:9.3f} {wi[1] / o[1]:10.2f} {cu[1] / wi[1]:10.2f}",
                      flush=True)
            if args.parts:
                tuning.winograd = True
                for parts in [int(v) for v in args.parts.split(",")] + [None]:
                    tuning.winograd_parts = parts
                    got = calls["bwd_filter"]("numba").copy_to_host()
                    ref = refs["bwd_filter"] if refs else got.astype(np.float64)
                    e = float(np.abs(got - ref).max() / np.abs(ref).max())
                    ms, kms = _times(lambda: calls["bwd_filter"]("numba"), args.reps)
                    print(f"{c:4d} {k:4d} {hw:4d}  bwd_filter parts {str(parts or 'rule'):>4} "
                          f"err {e:9.2e} {ms:8.3f} ms {kms:8.3f} kms", flush=True)
        finally:
            tuning.winograd, tuning.winograd_parts = saved


if __name__ == "__main__":
    main()
