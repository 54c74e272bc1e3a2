"""The Numba GEMM kernel (kernels/gemm.py) alone: correctness against float64, then TFLOP/s
of each tile configuration next to PyTorch's matmul (TF32 off) on the same inputs.

    python -m validation.gemm_bench [--reps 30] [--configs "4,8,16,16,2;8,8,32,8,1"]
                                    [--shapes "64,100352,576;512,1568,4608"] [--layouts nn,nt]

A config is (wm, wn, tx, ty, min_blocks[, bk[, tc]]): a ty*wm x tx*wn tile of C per block of
tx*ty threads, slabs bk deep (default 8), on tensor cores (3xTF32) where tc is 1
(kernels/gemm.py); by default the ones below.

Shapes are the GEMMs of the ResNet-50 convolutions of the convolution benchmark at batch 32
(forward: m = K, n = N*OH*OW, k = C*R*S) and a square one. Layouts: nn (forward), tn (data
gradient, A transposed), nt (filter gradient, B transposed).
"""

import argparse

import numpy as np

from dnnkit.timing import median_ms

SHAPES = [(64, 100352, 576), (128, 25088, 1152), (256, 6272, 2304), (512, 1568, 4608),
          (4096, 4096, 4096)]
CONFIGS = [(8, 8, 16, 16, 2), (4, 8, 16, 16, 2), (8, 8, 16, 16, 1, 16, 1), (4, 8, 16, 16, 2, 16, 1)]
PLAIN = (1 << 62, 0)


def run_gemm(kern, cfg, a, b, c, m, n, k, ta, tb):
    from numba import cuda

    from dnnkit.kernels.gemm import CG_LEN, shared_bytes
    wm, wn, tx, ty = cfg[:4]
    bk, tc = _extra(cfg)
    bm, bn = ty * wm, tx * wn
    grid = (-(-n // bn), min(-(-m // bm), 65535), 1)
    acc, table = _dummies()
    lda = m if ta else k
    ldb = k if tb else n
    kern[grid, (tx, ty), 0, shared_bytes(wm, wn, tx, ty, 4, bk, tc)](
        a, b, c, c, (m, n, k), (lda, ldb, n), PLAIN * 3, (1, 1, 0, 0, 0, 0, 0, 0),
        np.float32(0), 0, acc, table, (0,) * CG_LEN)


def _extra(cfg):
    """(slab depth, tensor cores) of a config tuple."""
    return (cfg[5] if len(cfg) > 5 else 8), bool(cfg[6] if len(cfg) > 6 else 0)


_DUMMIES = []


def _dummies():
    """The accumulation-type marker and the unused tap table, made once: a copy to the device
    per call would sit inside the timed region."""
    from numba import cuda
    if not _DUMMIES:
        _DUMMIES.extend([cuda.to_device(np.zeros(1, np.float32)),
                         cuda.to_device(np.zeros(4, np.int32))])
    return _DUMMIES


def _tuples(text):
    return [tuple(int(v) for v in part.split(",")) for part in text.split(";") if part]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--configs", default=None, help="';'-separated wm,wn,tx,ty,min_blocks")
    ap.add_argument("--shapes", default=None, help="';'-separated m,n,k")
    ap.add_argument("--layouts", default="nn,tn,nt")
    args = ap.parse_args()
    configs = _tuples(args.configs) if args.configs else CONFIGS
    shapes = _tuples(args.shapes) if args.shapes else SHAPES
    from numba import cuda
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    from dnnkit.kernels.gemm import gemm_kernel
    rng = np.random.default_rng(0)
    print(f"{'m':>5} {'n':>7} {'k':>5} {'lay':>3} {'config':>18} {'rel.err':>9} {'ms':>8} "
          f"{'TFLOP/s':>8} {'torch ms':>9} {'ratio':>6}")
    for m, n, k in shapes:
        for ta, tb, lay in ((0, 0, "nn"), (1, 0, "tn"), (0, 1, "nt")):
            if lay not in args.layouts.split(",") or (
                    lay != "nn" and not args.shapes and m in (4096, 128, 256)):
                continue
            ah = rng.standard_normal((k, m) if ta else (m, k)).astype(np.float32)
            bh = rng.standard_normal((n, k) if tb else (k, n)).astype(np.float32)
            ref = (ah.T if ta else ah).astype(np.float64) @ (bh.T if tb else bh).astype(np.float64)
            a, b = cuda.to_device(ah.ravel()), cuda.to_device(bh.ravel())
            c = cuda.device_array(m * n, np.float32)
            ta_, tb_ = torch.as_tensor(a, device="cuda"), torch.as_tensor(b, device="cuda")
            ta_, tb_ = ta_.view(ah.shape), tb_.view(bh.shape)
            tc = torch.empty((m, n), device="cuda")
            opa = ta_.t() if ta else ta_
            opb = tb_.t() if tb else tb_
            t_torch = median_ms(lambda i: torch.matmul(opa, opb, out=tc), args.reps)
            flop = 2.0 * m * n * k
            for cfg in configs:
                bk, tc = _extra(cfg)
                kern = gemm_kernel(ta, tb, *cfg[:5], bk=bk, tc=tc)
                run_gemm(kern, cfg, a, b, c, m, n, k, ta, tb)
                got = c.copy_to_host().reshape(m, n)
                err = np.abs(got - ref).max() / np.abs(ref).max()
                ms = median_ms(lambda i: run_gemm(kern, cfg, a, b, c, m, n, k, ta, tb),
                               args.reps)
                print(f"{m:5d} {n:7d} {k:5d} {lay:>3} {str(cfg):>18} {err:9.2e} {ms:8.3f} "
                      f"{flop / ms / 1e9:8.2f} {t_torch:9.3f} {t_torch / ms:6.2f}", flush=True)


if __name__ == "__main__":
    main()
