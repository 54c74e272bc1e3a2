"""The Numba convolution (forward, data and filter gradients) with and without the implicit
GEMM, side by side in one run (the data gradient is implicit at stride 1 only).

    python -m validation.implicit_bench [--reps 20] [--batch 32] [--split 1,2,3,4,6]

For each ResNet-50 layer of validation/conv_bench.py (float32) and each of the three passes: the
max relative error of both Numba paths against PyTorch's float64 result (against each other
without PyTorch), then the time per call (median of CUDA-event timed samples after a warm-up)
of the im2col + GEMM path, the implicit GEMM path (kernels/gemm.py ``implicit``: no column
buffer) and cuDNN, and the ratios implicit / im2col and cuDNN / implicit (the targets:
Numba >= 0.5 of cuDNN's throughput forward, >= 0.4 for the gradients).

``--split``: instead, the column-buffer forward with its k split into each given number of
parts (``conv_tuning.settings.split_k``; the largest divisor of the rows up to it), then the
filter gradient in each given number of image slices (``conv_tuning.settings.filter_parts``),
each with the default rule's choice last, per layer: error (against the first count) and ms.
"""

import argparse
import math

import numpy as np

import dnnkit
from dnnkit.ops.conv_tuning import settings as tuning
from dnnkit.timing import median_ms
from validation.conv_bench import RESNET50, _torch


def _reference(torch, xh, wh, dyh, kw):
    if torch is None:
        return None
    t = [torch.as_tensor(a, dtype=torch.float64) for a in (xh, wh, dyh)]
    return {"fwd": torch.nn.functional.conv2d(t[0], t[1], **kw).numpy(),
            "bwd_data": torch.nn.grad.conv2d_input(t[0].shape, t[1], t[2], **kw).numpy(),
            "bwd_filter": torch.nn.grad.conv2d_weight(t[0], t[1].shape, t[2], **kw).numpy()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--split", default="",
                    help="comma-separated part counts (forward k split, filter-gradient slices)")
    args = ap.parse_args()
    if args.split:
        return split_sweep(args, [int(v) for v in args.split.split(",")])
    from numba import cuda
    torch = _torch()
    have_cudnn = dnnkit.backends.status().cudnn_available
    rng = np.random.default_rng(0)
    print(f"{'C':>4} {'K':>4} {'HW':>4} {'k':>2} {'s':>2} {'pass':>10} {'err im2col':>10} "
          f"{'err impl':>9} {'im2col ms':>9} {'impl ms':>8} {'cuDNN ms':>8} "
          f"{'impl/im2col':>11} {'cuDNN/impl':>10}")
    default = tuning.implicit
    for c, k, hw, ks, st, pad in RESNET50:
        kw = dict(stride=st, padding=pad)
        xh = rng.standard_normal((args.batch, c, hw, hw)).astype(np.float32)
        wh = (rng.standard_normal((k, c, ks, ks)) / math.sqrt(c * ks * ks)).astype(np.float32)
        x, w = cuda.to_device(xh), cuda.to_device(wh)
        yshape = dnnkit.conv2d(x, w, backend="numba", **kw).shape
        dyh = rng.standard_normal(yshape).astype(np.float32)
        dy = cuda.to_device(dyh)
        refs = _reference(torch, xh, wh, dyh, kw)
        calls = {"fwd": lambda b: dnnkit.conv2d(x, w, backend=b, **kw),
                 "bwd_data": lambda b: dnnkit.conv2d_backward_data(dy, w, x.shape, backend=b,
                                                                   **kw),
                 "bwd_filter": lambda b: dnnkit.conv2d_backward_filter(x, dy, w.shape,
                                                                       backend=b, **kw)}
        for pas, call in calls.items():
            outs, times = {}, {}
            for name, implicit in (("im2col", False), ("impl", True)):
                tuning.implicit = implicit
                outs[name] = call("numba").copy_to_host()
                times[name] = median_ms(lambda i: call("numba"), args.reps)
            tuning.implicit = default
            times["cudnn"] = median_ms(lambda i: call("cudnn"), args.reps) if have_cudnn \
                else float("nan")
            ref = refs[pas] if refs else outs["im2col"]
            err = {n: float(np.abs(o - ref).max() / np.abs(ref).max()) for n, o in outs.items()}
            print(f"{c:4d} {k:4d} {hw:4d} {ks:2d} {st:2d} {pas:>10} {err['im2col']:10.2e} "
                  f"{err['impl']:9.2e} {times['im2col']:9.3f} {times['impl']:8.3f} "
                  f"{times['cudnn']:8.3f} {times['impl'] / times['im2col']:11.2f} "
                  f"{times['cudnn'] / times['impl']:10.2f}", flush=True)


def split_sweep(args, counts):
    """The forward (im2col + GEMM) per layer with split_k = each count, then the filter
    gradient with filter_parts = each count; the rule's choice last."""
    from numba import cuda
    rng = np.random.default_rng(0)
    print(f"{'C':>4} {'K':>4} {'HW':>4} {'k':>2} {'s':>2} {'pass':>10} {'parts':>6} {'err':>9} "
          f"{'ms':>8}")
    for c, k, hw, ks, st, pad in RESNET50:
        kw = dict(stride=st, padding=pad)
        xh = rng.standard_normal((args.batch, c, hw, hw)).astype(np.float32)
        wh = (rng.standard_normal((k, c, ks, ks)) / math.sqrt(c * ks * ks)).astype(np.float32)
        bh = rng.standard_normal(k).astype(np.float32)
        x, w, b = cuda.to_device(xh), cuda.to_device(wh), cuda.to_device(bh)
        dy = cuda.to_device(rng.standard_normal(
            dnnkit.conv2d(x, w, backend="numba", **kw).shape).astype(np.float32))
        calls = {"fwd": ("split_k", lambda: dnnkit.conv2d(x, w, b, backend="numba", **kw)),
                 "bwd_filter": ("filter_parts", lambda: dnnkit.conv2d_backward_filter(
                     x, dy, w.shape, backend="numba", **kw))}
        saved = tuning.implicit, tuning.split_k, tuning.filter_parts
        tuning.implicit = False
        try:
            for pas, (switch, call) in calls.items():
                ref = None
                for parts in counts + [None]:
                    setattr(tuning, switch, parts)
                    y = call().copy_to_host()
                    ref = y.astype(np.float64) if ref is None else ref
                    err = float(np.abs(y - ref).max() / np.abs(ref).max())
                    ms = median_ms(lambda i: call(), args.reps)
                    print(f"{c:4d} {k:4d} {hw:4d} {ks:2d} {st:2d} {pas:>10} "
                          f"{str(parts or 'rule'):>6} {err:9.2e} {ms:8.3f}", flush=True)
                setattr(tuning, switch, None)
        finally:
            tuning.implicit, tuning.split_k, tuning.filter_parts = saved

if __name__ == "__main__":
    main()
