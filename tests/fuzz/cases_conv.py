"""Fuzz cases: conv2d/conv3d (+backward data/filter), conv_backward_bias, pool2d/pool3d
(+backward)."""

import importlib
import warnings

import numpy as np
from hypothesis import strategies as st

import dnnkit
from dnnkit import reference

from .common import (COMMON, Presenter, common_mistake, compare, draw_dims, draw_dtype,
                     draw_mistake, draw_size, expect, inject_nonfinite, normal, pick, seed_rng)

# (imported by name: the package re-exports the functions pool2d, pool3d, ...)
pool_ops = importlib.import_module("dnnkit.ops.pool")

CONV_TOL = {"float16": 4e-3, "float32": 2e-6, "float64": 1e-12}   # tests/ops/test_conv.py
POOL_TOL = {"float16": 4e-3, "float32": 2e-6, "float64": 1e-13}


def _resolve_padding(padding, ks, dil):
    if isinstance(padding, str):
        eff = [(k - 1) * d for k, d in zip(ks, dil)]
        return tuple({"valid": 0, "full": e, "half": (e + 1) // 2}[padding] for e in eff)
    return tuple(padding)


CONV_MISTAKES = COMMON + (
    "negative padding", "stride 0", "dilation 0", "groups not dividing C", "groups 0",
    "groups not an int", "kernel larger than the input", "w channels mismatch", "wrong rank",
    "dtype mismatch", "unknown mode", "unknown padding", "unknown algo", "unknown precision",
    "stride tuple too short", "window of 0 taps", "shape not ints")
CONV_OPS = ("fwd", "bwd_data", "bwd_filter", "bias")


def conv_case(data, backend, op):
    rng = seed_rng(data)
    nd = 3 if op.startswith("conv3d") else 2
    which = ("bwd_data" if op.endswith("_data") else "bwd_filter" if op.endswith("_filter")
             else "bias" if op == "conv_backward_bias" else "fwd")
    if which == "bias":
        nd = data.draw(st.sampled_from([2, 3]), label="nd")
    dtype = draw_dtype(data)
    groups = data.draw(st.integers(1, 2), label="groups")
    # C = 0 is valid: a sum over no channels (y = bias)
    cg, kg = draw_size(data, 0, 2, "C/g", zero_pct=8), draw_size(data, 0, 2, "K/g")
    n = draw_size(data, 0, 2, "N")
    ks = draw_dims(data, nd, 1, 3 if nd == 2 else 2, "kernel")
    dil = draw_dims(data, nd, 1, 2, "dilation")
    stride = draw_dims(data, nd, 1, 2, "stride")
    padding = data.draw(st.one_of(st.sampled_from(["valid", "full", "half"]),
                                  st.lists(st.integers(0, 2), min_size=nd, max_size=nd)
                                  .map(tuple)), label="padding")
    pad = _resolve_padding(padding, ks, dil)
    # spatial sizes from 0 up: the dilated kernel must fit in the padded input
    lo = [max(0, (k - 1) * d + 1 - 2 * p) for k, d, p in zip(ks, dil, pad)]
    sp = tuple(draw_size(data, lo_, lo_ + (3 if nd == 2 else 1)) for lo_ in lo)
    mode = data.draw(st.sampled_from(["cross", "conv"]), label="mode")
    c, k = cg * groups, kg * groups
    xs, ws = (n, c) + sp, (k, cg) + ks
    x, w = normal(rng, xs, dtype), normal(rng, ws, dtype)
    bias = normal(rng, (k,), dtype) if data.draw(st.booleans(), label="bias") else None
    kw = dict(stride=stride, padding=padding, dilation=dil, groups=groups, mode=mode)
    ref_args = (stride, pad, dil, groups, mode == "conv")
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    y64 = reference.conv_forward(x64, w64, None, *ref_args)
    dy = normal(rng, y64.shape, dtype)
    mistake = draw_mistake(data, CONV_MISTAKES if which != "bias" else COMMON + ("wrong rank",))
    bad, be = common_mistake(data, mistake, rng, xs, backend)
    x_shape, w_shape = xs, ws
    if mistake == "negative padding":
        kw["padding"] = tuple(-1 if i == 0 else p for i, p in enumerate(pad))
    elif mistake == "stride 0":
        kw["stride"] = pick(data, [0, (1,) * (nd - 1) + (0,), -1])
    elif mistake == "dilation 0":
        kw["dilation"] = pick(data, [0, (0,) * nd])
    elif mistake == "groups not dividing C":
        x, x_shape = normal(rng, (n, 3) + sp, dtype), (n, 3) + sp
        kw["groups"], w = 2, normal(rng, (2 * max(kg, 1), 1) + ks, dtype)
        w_shape = w.shape
    elif mistake == "groups 0":
        kw["groups"] = pick(data, [0, -1])
    elif mistake == "groups not an int":
        kw["groups"] = pick(data, [1.0, True, "1", None])
    elif mistake == "kernel larger than the input":
        # no padding, and the last dim one narrower than the (at least 2 wide) kernel
        kw["padding"], kw["dilation"] = 0, 1
        w_shape = ws[:-1] + (max(2, ks[-1]),)
        x_shape = (n, c) + sp[:-1] + (w_shape[-1] - 1,)
        x, w = normal(rng, x_shape, dtype), normal(rng, w_shape, dtype)
    elif mistake == "w channels mismatch":
        w_shape = (k, cg + 1) + ks
        w = normal(rng, w_shape, dtype)
    elif mistake == "wrong rank":
        x = dy = normal(rng, (2, 2) + (3,) * (nd - 1 if which != "bias" else 0), dtype)
        x_shape = (n, c)   # bwd_data: x_shape of the wrong length
        if which == "bias":
            dy = normal(rng, (4,), dtype)
    elif mistake == "dtype mismatch":
        other = "float64" if dtype != "float64" else "float32"
        if which == "bwd_filter":
            dy = dy.astype(other)
        else:
            w = w.astype(other)
    elif mistake == "unknown mode":
        kw["mode"] = pick(data, ["correlation", "CROSS", None, ["cross"], {"conv": 1}])
    elif mistake == "unknown padding":
        kw["padding"] = pick(data, ["same", "VALID", 1.5, (1, "a")])
    elif mistake == "unknown algo":
        kw["algo"] = pick(data, ["fastest", "implicit_gemm", 3, ["small"]])
    elif mistake == "unknown precision":
        kw["precision"] = pick(data, ["bfloat16", "half", 32, ["float32"]])
    elif mistake == "stride tuple too short":
        kw["stride"] = (1,) * (nd - 1)
    elif mistake == "window of 0 taps":
        i = data.draw(st.integers(0, nd - 1), label="empty tap dim")
        w_shape = ws[:2 + i] + (0,) + ws[3 + i:]
        w = normal(rng, w_shape, dtype)
    elif mistake == "shape not ints":
        if which == "bwd_data":
            x_shape = xs[:-1] + (pick(data, ["a", 2.0, None]),)
        elif which == "bwd_filter":
            w_shape = pick(data, [ws[:-1] + ("3",), ws[:-1] + (1.0,), "abcd"])
        else:
            kw["dilation"] = (1,) * (nd - 1) + ("2",)
    present = Presenter(data)
    tol = CONV_TOL[dtype]
    fwd, bwd_data, bwd_filter = {
        2: (dnnkit.conv2d, dnnkit.conv2d_backward_data, dnnkit.conv2d_backward_filter),
        3: (dnnkit.conv3d, dnnkit.conv3d_backward_data, dnnkit.conv3d_backward_filter)}[nd]
    if which == "fwd":
        xi, wi = bad[0] if bad else present(x, "x"), present(w, "w")
        bi = present(bias, "bias") if bias is not None else None

        def check(y):
            ref = y64 + (0 if bias is None else
                         bias.astype(np.float64).reshape((1, -1) + (1,) * nd))
            compare(op, y, ref, tol, dtype=dtype)
        return expect(op, lambda: fwd(xi, wi, bi, backend=be, **kw), check, mistake,
                      present.bad)
    if which == "bwd_data":
        dyi, wi = bad[0] if bad else present(dy, "dy"), present(w, "w")

        def check_data(dx):
            # the reference reshapes with -1, which an empty dy (N or K = 0) cannot take
            ref = reference.conv_backward_data(dy.astype(np.float64), w64, xs, *ref_args) \
                if dy.size and w.size else np.zeros(xs)
            compare(op, dx, ref, 2 * tol, dtype=dtype)
        return expect(op, lambda: bwd_data(dyi, wi, x_shape, backend=be, **kw), check_data,
                      mistake, present.bad)
    if which == "bwd_filter":
        xi, dyi = bad[0] if bad else present(x, "x"), present(dy, "dy")

        def check_filter(dw):
            ref = reference.conv_backward_filter(x64, dy.astype(np.float64), ws, *ref_args) \
                if 0 not in ws else np.zeros(ws)
            compare(op, dw, ref, 2 * tol, dtype=dtype)
        return expect(op, lambda: bwd_filter(xi, dyi, w_shape, backend=be, **kw),
                      check_filter, mistake, present.bad)
    dyi = bad[0] if bad else present(dy, "dy")

    def check_bias(db):
        # a sum: its error scales with the summands, not with the (possibly cancelled) result
        dy64 = dy.astype(np.float64)
        compare(op, db, reference.conv_backward_bias(dy64), 2 * tol, dtype=dtype,
                floor=float(reference.conv_backward_bias(np.abs(dy64)).max(initial=0.0)))
    return expect(op, lambda: dnnkit.conv_backward_bias(dyi, backend=be), check_bias, mistake,
                  present.bad)


# ---------------------------------------------------------------- pooling

POOL_MISTAKES = COMMON + (
    "window 0", "negative padding", "padding >= window", "stride 0",
    "window larger than the input", "empty spatial dim", "wrong rank", "unknown mode",
    "window not an int", "window tuple too long")
POOL_BWD_MISTAKES = POOL_MISTAKES + ("y shape mismatch", "dy dtype mismatch")


def pool_case(data, backend, op):
    rng = seed_rng(data)
    nd, backward = int(op[4]), op.endswith("_backward")
    dtype = draw_dtype(data)
    mode = data.draw(st.sampled_from(pool_ops.MODES + ("average",)), label="mode")
    n, c = draw_size(data, 0, 2, "N"), draw_size(data, 0, 2, "C")
    window = draw_dims(data, nd, 1, 3, "window")
    stride = data.draw(st.one_of(st.none(), st.lists(st.integers(1, 3), min_size=nd,
                                                     max_size=nd).map(tuple)), label="stride")
    padding = tuple(data.draw(st.integers(0, k - 1), label="padding") for k in window)
    sp = tuple(data.draw(st.integers(max(1, k - 2 * p), max(1, k - 2 * p) + 3), label="size")
               for k, p in zip(window, padding))
    xs = (n, c) + sp
    kmode = pool_ops.ALIASES.get(mode, mode)
    # max: distinct values per window (cuDNN's MAX breaks ties its own way)
    x = pool_ops.tie_free(rng, xs, dtype) if kmode == "max" else normal(rng, xs, dtype)
    nonfinite = not backward and data.draw(st.booleans(), label="nonfinite")
    if nonfinite:
        x = inject_nonfinite(rng, x, 0.15)
    mistake = draw_mistake(data, POOL_BWD_MISTAKES if backward else POOL_MISTAKES)
    bad, be = common_mistake(data, mistake, rng, xs, backend)
    args = dict(window=window, stride=stride, padding=padding, mode=mode)
    if mistake == "window 0":
        args["window"] = (0,) + window[1:]
    elif mistake == "negative padding":
        args["padding"] = pick(data, [-1, (0,) * (nd - 1) + (-1,)])
    elif mistake == "padding >= window":
        args["padding"] = window
    elif mistake == "stride 0":
        args["stride"] = pick(data, [0, (1,) * (nd - 1) + (0,)])
    elif mistake == "window larger than the input":
        args["window"], args["padding"] = tuple(s + 1 for s in sp), 0
    elif mistake == "empty spatial dim":
        x = normal(rng, (n, c) + sp[:-1] + (0,), dtype)
    elif mistake == "wrong rank":
        x = normal(rng, (n, c) + sp[:-1], dtype)
    elif mistake == "unknown mode":
        args["mode"] = pick(data, ["avg", "MAX", "min", None, ["max"], {"sum": 1}])
    elif mistake == "window not an int":
        args["window"] = pick(data, [2.0, "2", None, (1.5,) * nd])
    elif mistake == "window tuple too long":
        args["window"] = (1,) * (nd + 1)
    fwd, bwd = (dnnkit.pool2d, dnnkit.pool2d_backward) if nd == 2 else \
        (dnnkit.pool3d, dnnkit.pool3d_backward)
    present = Presenter(data)
    tol = POOL_TOL[dtype]
    x64 = x.astype(np.float64)
    if not backward:
        xi = bad[0] if bad else present(x, "x")

        def check(y):
            with np.errstate(invalid="ignore"):
                ref = reference.pool_forward(x64, window, stride, padding, kmode)
            compare(op, y, ref, tol, dtype=dtype)
        def run():
            with warnings.catch_warnings():
                if nonfinite and kmode != "max":
                    # a window holding +inf and -inf averages (sums) to NaN, as IEEE says; on
                    # the simulator NumPy reports that sum: "invalid value encountered in
                    # scalar add" (the filter is process-wide: the kernel's threads see it)
                    warnings.filterwarnings("ignore", ".*invalid value encountered",
                                            RuntimeWarning)
                return fwd(xi, backend=be, **args)
        return expect(op, run, check, mistake, present.bad)
    y = reference.pool_forward(x64, window, stride, padding, kmode).astype(dtype) \
        if x.shape == xs else x
    dy = normal(rng, y.shape, dtype)
    if mistake == "y shape mismatch":
        y = normal(rng, y.shape[:-1] + (y.shape[-1] + 1,), dtype)
    elif mistake == "dy dtype mismatch":
        dy = dy.astype("float64" if dtype != "float64" else "float16")
    xi = bad[0] if bad else present(x, "x")
    yi, dyi = present(y, "y"), present(dy, "dy")

    def check_bwd(dx):
        ref = reference.pool_backward(x64, dy.astype(np.float64), window, stride, padding, kmode)
        compare(op, dx, ref, 2 * tol, dtype=dtype)
    return expect(op, lambda: bwd(xi, yi, dyi, backend=be, **args), check_bwd, mistake,
                  present.bad)
