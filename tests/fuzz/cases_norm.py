"""Fuzz cases: batch_norm_train/inference/backward, affine_grid(+backward),
grid_sample(+backward), spatial_transformer."""

import os

import numpy as np
from hypothesis import strategies as st

import dnnkit
from dnnkit import reference
from dnnkit.ops import batchnorm as batchnorm_ops

from .common import (COMMON, REL_TOL, Presenter, common_mistake, compare, draw_dims, draw_dtype,
                     draw_mistake, draw_size, expect, normal, pick, seed_rng)

SIMULATOR = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
PDT = {"float16": "float32", "float32": "float32", "float64": "float64"}

def _train_ref(x, gamma, beta, mode, eps, momentum=0.1, rm=None, rv=None):
    # C == 0 (the only empty x drawn for training): every output is empty; the reference
    # divides by the number of statistics
    if x.size == 0:
        e = np.zeros(np.shape(gamma))
        return np.zeros(x.shape), e, e, None if rm is None else e, None if rv is None else e
    return reference.batch_norm_train(x, gamma, beta, mode, eps, momentum, rm, rv)


def _backward_ref(x, dy, gamma, smean, sinv, mode):
    if x.size == 0:
        return np.zeros(x.shape), np.zeros(np.shape(gamma)), np.zeros(np.shape(gamma))
    return reference.batch_norm_backward(x, dy, gamma, smean, sinv, mode)


BN_MISTAKES = COMMON + ("unknown mode", "epsilon <= 0", "epsilon nan", "epsilon not a number",
                        "gamma shape", "gamma device dtype", "rank 1", "rank 6")
BN_TRAIN_MISTAKES = BN_MISTAKES + ("momentum > 1", "momentum < 0", "only running_mean",
                                   "one value per statistic", "running_mean read-only")
BN_BWD_MISTAKES = BN_MISTAKES + ("dy shape mismatch", "empty batch")


def batchnorm_case(data, backend, op):
    from numba import cuda
    rng = seed_rng(data)
    dtype = draw_dtype(data)
    rank = data.draw(st.integers(2, 5), label="rank")
    mode = data.draw(st.sampled_from(batchnorm_ops.MODES), label="mode")
    shape = (draw_size(data, 0 if op == "batch_norm_inference" else 1, 3, "N"),
             draw_size(data, 0, 3, "C")) + draw_dims(data, rank - 2, 1, 3)
    m = shape[0] * (int(np.prod(shape[2:])) if mode == "spatial" else 1)
    if op == "batch_norm_train" and m < 2:     # the variance needs two values: widen N
        shape = (2,) + shape[1:]
    flat, bcast = batchnorm_ops.param_shapes(shape, mode)
    ps = data.draw(st.sampled_from([flat, bcast]), label="param form")
    pdt = PDT[dtype]
    x = (normal(rng, shape, dtype, 2.0) + 0.5).astype(dtype)
    gamma = (1 + 0.5 * rng.standard_normal(ps)).astype(pdt)
    beta = normal(rng, ps, pdt)
    mean, var = normal(rng, ps, pdt), (0.5 + rng.random(ps)).astype(pdt)
    eps = data.draw(st.sampled_from([1e-5, 1e-3, 0.1]), label="epsilon")
    momentum = data.draw(st.sampled_from([0.0, 0.1, 1.0]), label="momentum")
    running = op == "batch_norm_train" and data.draw(st.booleans(), label="running")
    if SIMULATOR and shape[1] == 0:
        # C = 0: the simulator's copy_to_device compares the strides of empty arrays (Numba's
        # real one does not), so the Numba backend's copy of the running statistics fails
        running = False
    mistake = draw_mistake(data, {"batch_norm_train": BN_TRAIN_MISTAKES,
                              "batch_norm_backward": BN_BWD_MISTAKES}.get(op, BN_MISTAKES))
    bad, be = common_mistake(data, mistake, rng, shape, backend)
    kw = dict(mode=mode, epsilon=eps)
    g_call, x_call = gamma, x
    if mistake == "unknown mode":
        kw["mode"] = pick(data, ["per_activation", "SPATIAL", None, ["spatial"]])
    elif mistake == "epsilon <= 0":
        kw["epsilon"] = pick(data, [0.0, -1e-5])
    elif mistake == "epsilon nan":
        kw["epsilon"] = pick(data, [np.nan, np.inf])
    elif mistake == "epsilon not a number":
        kw["epsilon"] = pick(data, ["small", None, [1e-5]])
    elif mistake == "gamma shape":
        g_call = np.ones((shape[1] + 1, 2), pdt)
    elif mistake == "gamma device dtype":
        g_call = cuda.to_device(gamma.astype("float64" if pdt == "float32" else "float32"))
    elif mistake in ("rank 1", "rank 6"):
        x_call = normal(rng, (4,) if mistake == "rank 1" else (2, 1, 1, 1, 1, 2), dtype)
    rm = rv = None
    if running or mistake in ("only running_mean", "running_mean read-only"):
        rm, rv = mean.copy(), var.copy()
        if mistake == "only running_mean":
            rv = None
        elif mistake == "running_mean read-only":
            rm.flags.writeable = False
    present = Presenter(data)
    tol = REL_TOL[dtype]
    stat_tol = 2 * REL_TOL[pdt]
    x64 = x.astype(np.float64)
    xi = bad[0] if bad else present(x_call, "x")
    if op == "batch_norm_train":
        if mistake == "momentum > 1":
            momentum = 1.5
        elif mistake == "momentum < 0":
            momentum = -0.1
        elif mistake == "one value per statistic":
            xi = normal(rng, (1, max(1, shape[1])) + (1,) * (rank - 2), dtype)
        rm0, rv0 = (rm.copy(), rv.copy()) if running and mistake is None else (None, None)
        gi, bi = present(g_call, "gamma"), present(beta, "beta")

        def check(out):
            y, smean, sinv = out
            ry, rmean, rinv, rrm, rrv = _train_ref(x64, gamma, beta, mode, eps,
                                                           momentum, rm0, rv0)
            compare(op, y, ry, 2 * tol, dtype=dtype)
            compare(op + " saved_mean", smean, rmean, stat_tol, floor=1.0, dtype=pdt)
            compare(op + " saved_invstd", sinv, rinv, stat_tol, dtype=pdt)
            if running:
                compare(op + " running_mean", rm, rrm, stat_tol, floor=1.0)
                compare(op + " running_var", rv, rrv, stat_tol)
        return expect(op, lambda: dnnkit.batch_norm_train(
            xi, gi, bi, momentum=momentum, running_mean=rm, running_var=rv, backend=be, **kw),
            check, mistake, present.bad)
    if op == "batch_norm_inference":
        args = [present(a, nm) for a, nm in ((g_call, "gamma"), (beta, "beta"),
                                              (mean, "mean"), (var, "var"))]

        def check_inf(y):
            ref = reference.batch_norm_inference(x64, gamma, beta, mean, var, mode, eps)
            compare(op, y, ref, 2 * tol, dtype=dtype)
        return expect(op, lambda: dnnkit.batch_norm_inference(xi, *args, backend=be, **kw),
                      check_inf, mistake, present.bad)
    # backward, from the forward's statistics (float64 reference, in the parameter dtype)
    _, smean, sinv, _, _ = _train_ref(x64, gamma, beta, mode, eps)
    smean, sinv = smean.astype(pdt), sinv.astype(pdt)
    dy = normal(rng, x.shape, dtype)
    if mistake == "dy shape mismatch":
        dy = normal(rng, x.shape[:-1] + (x.shape[-1] + 1,), dtype)
    elif mistake == "empty batch":
        xi, dy = normal(rng, (0,) + shape[1:], dtype), normal(rng, (0,) + shape[1:], dtype)
    args = [present(dy, "dy"), present(g_call, "gamma"), present(smean, "saved_mean"),
            present(sinv, "saved_invstd")]

    def check_bwd(out):
        dx, dg, db = out
        rdx, rdg, rdb = _backward_ref(x64, dy.astype(np.float64), gamma, smean, sinv,
                                              mode)
        floor = float(np.abs(dy).max(initial=0))
        # dx = gamma invstd (dy - mean(dy) - xhat mean(dy xhat)): each term is |gamma invstd dy|
        # before the cancellation, and the rounding of the bracket is scaled by gamma invstd
        # (up to 1/sqrt(eps) = 316 where a channel is constant): cuDNN's float32 order is seen
        # 2.5e-5 off where the exact dx is 0 (N=1, C=1, one element)
        amp = float(np.abs(np.asarray(gamma, np.float64) * np.asarray(sinv, np.float64))
                    .max(initial=0))
        compare(op + " dx", dx, rdx, 8 * tol, floor=floor * max(1.0, amp), dtype=dtype)
        # dgamma and dbeta sum M = x.size / C terms of size |dy|: random terms make a sum of
        # size sqrt(M) |dy|, and its rounding error grows with it (cuDNN's float32 order)
        pfloor = floor * np.sqrt(max(1, x.size // max(1, np.size(gamma))))
        compare(op + " dgamma", dg, rdg, 4 * tol, floor=pfloor, dtype=pdt)
        compare(op + " dbeta", db, rdb, 4 * tol, floor=pfloor, dtype=pdt)
    return expect(op, lambda: dnnkit.batch_norm_backward(xi, *args, backend=be, **kw),
                  check_bwd, mistake, present.bad)


# ---------------------------------------------------------------- spatial transformer

SP_TOL = {"float16": 1e-2, "float32": 2e-6, "float64": 1e-13}   # tests/ops/test_spatial.py
GRID_MISTAKES = COMMON + ("theta shape", "out_shape N", "out_shape zero", "out_shape length",
                          "out_shape floats")
SAMPLE_MISTAKES = COMMON + ("grid last dim", "grid N mismatch", "img empty spatial",
                            "dtype mismatch", "img rank 3")
SAMPLE_BWD_MISTAKES = SAMPLE_MISTAKES + ("dy shape mismatch",)
ST_MISTAKES = COMMON + ("scale <= 0", "scale not a number", "theta N mismatch",
                        "theta shape", "dtype mismatch")


def spatial_case(data, backend, op):
    rng = seed_rng(data)
    dtype = draw_dtype(data)
    n, c = draw_size(data, 0, 2, "N"), data.draw(st.integers(1, 2), label="C")
    h, w = draw_dims(data, 2, 1, 4, "H, W")
    oh, ow = draw_dims(data, 2, 1, 4, "H', W'")
    theta = (np.tile([[1.0, 0, 0], [0, 1.0, 0]], (n, 1, 1))
             + 0.3 * rng.standard_normal((n, 2, 3))).astype(dtype)
    img = normal(rng, (n, c, h, w), dtype)
    grid = rng.uniform(-1.2, 1.2, (n, oh, ow, 2)).astype(dtype)
    dy = normal(rng, (n, c, oh, ow), dtype)
    mistake = draw_mistake(data, {"affine_grid": GRID_MISTAKES, "affine_grid_backward": COMMON,
                              "grid_sample": SAMPLE_MISTAKES,
                              "grid_sample_backward": SAMPLE_BWD_MISTAKES,
                              "spatial_transformer": ST_MISTAKES}[op])
    bad, be = common_mistake(data, mistake, rng, theta.shape, backend)
    present = Presenter(data)
    tol = SP_TOL[dtype]
    out_shape = (n, c, oh, ow)
    other = "float64" if dtype != "float64" else "float32"
    if op == "affine_grid":
        if mistake == "theta shape":
            theta = normal(rng, (n, 3, 3), dtype)
        out_shape = {"out_shape N": (n + 1, c, oh, ow), "out_shape zero": (n, c, 0, ow),
                     "out_shape length": (n, c, oh), "out_shape floats": (n, c, oh * 1.0, ow),
                     }.get(mistake, out_shape)
        ti = bad[0] if bad else present(theta, "theta")

        def check(g):
            compare(op, g, reference.affine_grid(theta.astype(np.float64), (n, c, oh, ow)), tol,
                    floor=1.0, dtype=dtype)
        return expect(op, lambda: dnnkit.affine_grid(ti, out_shape, backend=be), check,
                      mistake, present.bad)
    if op == "affine_grid_backward":
        dgrid = normal(rng, (n, oh, ow, 2), dtype)
        gi = bad[0] if bad else present(dgrid, "dgrid")

        def check_gb(dtheta):
            compare(op, dtheta, reference.affine_grid_backward(dgrid.astype(np.float64)), 4 * tol,
                    floor=float(np.abs(dgrid).max(initial=0)), dtype=dtype)
        return expect(op, lambda: dnnkit.affine_grid_backward(gi, backend=be), check_gb,
                      mistake, present.bad)
    if op == "spatial_transformer":
        sh, sw = (data.draw(st.sampled_from([0.5, 1.0, 1.3]), label="scale") for _ in "hw")
        if mistake == "scale <= 0":
            sh = pick(data, [0.0, -1.0, np.nan])
        elif mistake == "scale not a number":
            sw = pick(data, ["1", None, True])
        elif mistake == "theta N mismatch":
            theta = normal(rng, (n + 1, 2, 3), dtype)
        elif mistake == "theta shape":
            theta = normal(rng, (n, 2, 2), dtype)
        elif mistake == "dtype mismatch":
            theta = theta.astype(other)
        ii, ti = bad[0] if bad else present(img, "img"), present(theta, "theta")

        def check_st(y):
            ref = reference.spatial_transformer(img.astype(np.float64), theta.astype(np.float64),
                                        sh, sw)
            compare(op, y, ref, tol, floor=float(np.abs(img).max(initial=0)), dtype=dtype)
        return expect(op, lambda: dnnkit.spatial_transformer(
            ii, ti, scale_height=sh, scale_width=sw, backend=be), check_st, mistake,
            present.bad)
    if mistake == "grid last dim":
        grid = normal(rng, (n, oh, ow, 3), dtype)
    elif mistake == "grid N mismatch":
        grid = normal(rng, (n + 1, oh, ow, 2), dtype)
    elif mistake == "img empty spatial":
        img = normal(rng, (n, c, 0, w), dtype)
    elif mistake == "dtype mismatch":
        grid = grid.astype(other)
    elif mistake == "img rank 3":
        img = normal(rng, (n, c, h), dtype)
    elif mistake == "dy shape mismatch":
        dy = normal(rng, (n, c, oh + 1, ow), dtype)
    ii, gi = bad[0] if bad else present(img, "img"), present(grid, "grid")
    img64, grid64 = img.astype(np.float64), grid.astype(np.float64)
    floor = float(np.abs(img).max(initial=0))
    if op == "grid_sample":
        def check_gs(y):
            compare(op, y, reference.grid_sample(img64, grid64), tol, floor=floor, dtype=dtype)
        return expect(op, lambda: dnnkit.grid_sample(ii, gi, backend=be), check_gs, mistake,
                      present.bad)
    dyi = present(dy, "dy")

    def check_gsb(out):
        dimg, dgrid = out
        rimg, rgrid = reference.grid_sample_backward(img64, grid64, dy.astype(np.float64))
        compare(op + " dimg", dimg, rimg, tol, floor=float(np.abs(dy).max(initial=0)),
                dtype=dtype)
        # dgrid is a one-sided slope at integer pixel coordinates: compare off those
        compare(op + " dgrid", reference.off_kinks(dgrid.copy_to_host(), grid64, (h, w)),
                reference.off_kinks(rgrid, grid64, (h, w)), 4 * tol,
                floor=floor * float(np.abs(dy).max(initial=0)) * max(h, w))
    return expect(op, lambda: dnnkit.grid_sample_backward(ii, gi, dyi, backend=be), check_gsb,
                  mistake, present.bad)
