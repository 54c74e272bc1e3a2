"""Spatial transformer on a GPU: correctness first, then times of the Numba and cuDNN paths and
of PyTorch's affine_grid + grid_sample (align_corners=True) where torch is importable.

    python -m validation.spatial_bench [--shape 64,3,224,224] [--reps 20] [--dtypes float32]

1. Correctness: max relative error of each backend (and PyTorch) against the float64 reference
   on the first 4 images (host time), for grid, sample, dimg, dgrid, dtheta; the run stops
   before timing when any exceeds its tolerance.
2. Times (ms, dnnkit.timing.median_ms of public calls): affine_grid, grid_sample,
   grid_sample_backward (atomic, and deterministic on Numba), affine_grid_backward; PyTorch's
   forward and its backward (autograd of both, grads of input and theta).
"""

import argparse
import json

import numpy as np

import dnnkit
from dnnkit import config
from dnnkit import reference
from dnnkit.timing import median_ms

# float32 at 224 pixels: coordinates carry ~224 * 2^-24 pixels of rounding (PyTorch's too)
TOL = {"float16": 1e-2, "float32": 1e-4, "float64": 1e-12}
SUB = 4


def _inputs(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    n = shape[0]
    img = rng.standard_normal(shape).astype(dtype)
    theta = (np.tile(np.array([[1.0, 0, 0], [0, 1.0, 0]]), (n, 1, 1))
             + 0.15 * rng.standard_normal((n, 2, 3))).astype(dtype)
    # float16: dtheta sums H'*W' terms of dgrid ~ (W-1)/2 * C: at 224 x 224 unit-scale dy it
    # passes float16's 65504 (both backends give inf, as PyTorch would); a gradient of 1e-2
    # keeps it in range
    scale = 1e-2 if np.dtype(dtype) == np.float16 else 1.0
    dy = (scale * rng.standard_normal(shape)).astype(dtype)
    return img, theta, dy


def _check(shape, dtype, backend, img, theta, dy):
    from numba import cuda
    grid = dnnkit.affine_grid(theta, shape, backend=backend)
    y = dnnkit.grid_sample(cuda.to_device(img), grid, backend=backend)
    dimg, dgrid = dnnkit.grid_sample_backward(img, grid, dy, backend=backend)
    dtheta = dnnkit.affine_grid_backward(dgrid, backend=backend)
    g = grid.copy_to_host()
    rimg, rgrid = reference.grid_sample_backward(img[:SUB], g[:SUB], dy[:SUB])
    return {
        "grid": reference.rel_error(g, reference.affine_grid(theta, shape)),
        "y": reference.rel_error(y.copy_to_host()[:SUB], reference.grid_sample(img[:SUB], g[:SUB])),
        "dimg": reference.rel_error(dimg.copy_to_host()[:SUB], rimg),
        # off the kinks (pixel coordinates on an integer: one-sided slopes, reference.spatial_kinks)
        "dgrid": reference.rel_error(reference.off_kinks(dgrid.copy_to_host()[:SUB], g[:SUB], shape[2:]),
                             reference.off_kinks(rgrid, g[:SUB], shape[2:])),
        "dtheta": reference.rel_error(dtheta.copy_to_host(), reference.affine_grid_backward(dgrid.copy_to_host())),
    }


def _torch_check(shape, img, theta):
    import torch
    F = torch.nn.functional
    tg = F.affine_grid(torch.tensor(theta, device="cuda"), shape, align_corners=True)
    ty = F.grid_sample(torch.tensor(img, device="cuda"), tg, align_corners=True)
    g = tg.cpu().double().numpy()
    return {"grid": reference.rel_error(g, reference.affine_grid(theta, shape)),
            "y": reference.rel_error(ty.cpu().numpy()[:SUB], reference.grid_sample(img[:SUB], g[:SUB]))}


def _times(shape, backend, img, theta, dy, reps):
    from numba import cuda
    di, dt, ddy = cuda.to_device(img), cuda.to_device(theta), cuda.to_device(dy)
    grid = dnnkit.affine_grid(dt, shape, backend=backend)
    dgrid = dnnkit.grid_sample_backward(di, grid, ddy, backend=backend)[1]
    out = {
        "affine_grid": median_ms(lambda i: dnnkit.affine_grid(dt, shape, backend=backend), reps),
        "grid_sample": median_ms(lambda i: dnnkit.grid_sample(di, grid, backend=backend), reps),
        "grid_sample_backward": median_ms(
            lambda i: dnnkit.grid_sample_backward(di, grid, ddy, backend=backend), reps),
        "affine_grid_backward": median_ms(
            lambda i: dnnkit.affine_grid_backward(dgrid, backend=backend), reps),
    }
    if backend == "numba":
        with config.change_flags({"dnn.deterministic": True}):
            out["grid_sample_backward_det"] = median_ms(
                lambda i: dnnkit.grid_sample_backward(di, grid, ddy, backend=backend),
                max(3, reps // 4))
    return out


def _torch_times(shape, img, theta, reps):
    import torch
    F = torch.nn.functional
    ti = torch.tensor(img, device="cuda", requires_grad=True)
    tt = torch.tensor(theta, device="cuda", requires_grad=True)

    def fwd(i):
        return F.grid_sample(ti, F.affine_grid(tt, shape, align_corners=True),
                             align_corners=True)
    y = fwd(0)
    g = torch.randn_like(y)

    def bwd(i):
        torch.autograd.grad(fwd(i), (ti, tt), g)
    with torch.no_grad():
        f = median_ms(fwd, reps)
    return {"forward (grid + sample)": f, "forward + backward": median_ms(bwd, reps)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="64,3,224,224")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--dtypes", default="float32,float16")
    ap.add_argument("--json")
    a = ap.parse_args()
    shape = tuple(int(v) for v in a.shape.split(","))
    try:
        import torch  # noqa: F401
        have_torch = torch.cuda.is_available()
    except ImportError:
        have_torch = False
    report = {}
    for dtype in a.dtypes.split(","):
        img, theta, dy = _inputs(shape, dtype)
        errs, backends = {}, ["numba", "cudnn"]
        for b in list(backends):
            try:
                errs[b] = _check(shape, dtype, b, img, theta, dy)
            except dnnkit.DnnkitError as e:   # e.g. a dtype cuDNN does not support
                print(f"{dtype} {b}: cannot run: {e}")
                backends.remove(b)
        if have_torch and dtype == "float32":
            errs["torch"] = _torch_check(shape, img, theta)
        print(dtype, "max rel error vs float64:", json.dumps(errs, indent=1))
        bad = [(b, k, v) for b, e in errs.items() for k, v in e.items()
               if v > (4 if k in ("dgrid", "dtheta") else 1) * TOL[dtype]]
        if bad:
            raise SystemExit(f"{dtype}: errors above tolerance, not timing: {bad}")
        times = {b: _times(shape, b, img, theta, dy, a.reps) for b in backends}
        if have_torch and dtype == "float32":
            times["torch"] = _torch_times(shape, img, theta, a.reps)
        for b, t in times.items():
            for k, v in t.items():
                print(f"{dtype:8s} {b:6s} {k:28s} {v:9.3f} ms")
        report[dtype] = {"errors": errs, "times_ms": times}
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"shape": shape, **report}, f, indent=1)


if __name__ == "__main__":
    main()
