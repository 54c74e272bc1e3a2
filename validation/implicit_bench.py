"""The Numba convolution forward with and without the implicit GEMM, side by side in one run.

    python -m validation.implicit_bench [--reps 20] [--batch 32]

For each ResNet-50 layer of validation/conv_bench.py (float32): the max relative error of
both Numba paths against PyTorch's float64 convolution (against each other without PyTorch),
then the time per call (median of CUDA-event timed samples after a warm-up) of the im2col +
GEMM path, the implicit GEMM path (kernels/gemm.py, ``implicit``: no column buffer) and
cuDNN, and the ratios implicit / im2col and cuDNN / implicit (issue 8's target: Numba >= 0.5
of cuDNN's throughput, i.e. cuDNN / Numba time >= 0.5).
"""

import argparse
import math

import numpy as np

import dnnkit
from dnnkit.ops import conv_numba
from dnnkit.timing import median_ms
from validation.conv_bench import RESNET50, _torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=32)
    args = ap.parse_args()
    from numba import cuda
    torch = _torch()
    rng = np.random.default_rng(0)
    print(f"{'C':>4} {'K':>4} {'HW':>4} {'k':>2} {'s':>2} {'err im2col':>10} {'err impl':>9} "
          f"{'im2col ms':>9} {'impl ms':>8} {'cuDNN ms':>8} {'impl/im2col':>11} "
          f"{'cuDNN/impl':>10}")
    for c, k, hw, ks, st, pad in RESNET50:
        xh = rng.standard_normal((args.batch, c, hw, hw)).astype(np.float32)
        wh = (rng.standard_normal((k, c, ks, ks)) / math.sqrt(c * ks * ks)).astype(np.float32)
        x, w = cuda.to_device(xh), cuda.to_device(wh)
        kw = dict(stride=st, padding=pad)
        if torch is not None:
            ref = torch.nn.functional.conv2d(torch.as_tensor(xh, dtype=torch.float64),
                                             torch.as_tensor(wh, dtype=torch.float64),
                                             **kw).numpy()
        outs, times, default = {}, {}, conv_numba.IMPLICIT
        for name, implicit in (("im2col", False), ("impl", True)):
            conv_numba.IMPLICIT = implicit
            outs[name] = dnnkit.conv2d(x, w, backend="numba", **kw).copy_to_host()
            times[name] = median_ms(lambda i: dnnkit.conv2d(x, w, backend="numba", **kw),
                                    args.reps)
        conv_numba.IMPLICIT = default
        times["cudnn"] = median_ms(lambda i: dnnkit.conv2d(x, w, backend="cudnn", **kw),
                                   args.reps) if dnnkit.backends.status().cudnn_available else float("nan")
        if torch is None:
            ref = outs["im2col"]
        err = {n: float(np.abs(o - ref).max() / np.abs(ref).max()) for n, o in outs.items()}
        print(f"{c:4d} {k:4d} {hw:4d} {ks:2d} {st:2d} {err['im2col']:10.2e} "
              f"{err['impl']:9.2e} {times['im2col']:9.3f} {times['impl']:8.3f} "
              f"{times['cudnn']:8.3f} {times['impl'] / times['im2col']:11.2f} "
              f"{times['cudnn'] / times['impl']:10.2f}", flush=True)


if __name__ == "__main__":
    main()
