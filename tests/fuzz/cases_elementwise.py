"""Fuzz cases: activation(+backward), softmax/log_softmax(+backward), dropout(+backward)."""

import importlib

import numpy as np
from hypothesis import strategies as st

import dnnkit
from dnnkit import reference

from .common import (COMMON, REL_TOL, Presenter, common_mistake, compare, draw_dims, draw_dtype,
                     draw_mistake, expect, inject_nonfinite, normal, pick, seed_rng)

# (imported by name: the package re-exports functions of the same names)
activation_ops = importlib.import_module("dnnkit.ops.activation")
softmax_ops = importlib.import_module("dnnkit.ops.softmax")
dropout_ops = importlib.import_module("dnnkit.ops.dropout")


# ---------------------------------------------------------------- activation

ACT_MISTAKES = COMMON + ("unknown mode", "mode not a str", "coef not a number", "coef inf",
                         "clipped_relu coef <= 0")
ACT_BWD_MISTAKES = ACT_MISTAKES + ("shape mismatch", "dtype mismatch")


def activation_case(data, backend, op):
    rng = seed_rng(data)
    dtype = draw_dtype(data)
    shape = draw_dims(data, data.draw(st.integers(0, 4), label="rank"), 0, 5)
    mode = data.draw(st.sampled_from(activation_ops.MODES), label="mode")
    coef = {"clipped_relu": data.draw(st.sampled_from([0.5, 1.0, 6.0])),
            "elu": data.draw(st.sampled_from([0.0, 0.7, 1.0])),
            "swish": data.draw(st.sampled_from([-1.0, 0.0, 1.3]))}.get(mode, 0.0)
    if backend == "cudnn" and mode == "identity":
        mode = "relu"   # cuDNN has no stand-alone identity (a documented refusal, not fuzzed)
    if backend == "cudnn" and op == "activation_backward" and mode == "elu" and coef == 0.0:
        coef = 0.7      # cuDNN's ELU slope from y with alpha = 0: refused (tests/ops), not fuzzed
    nonfinite = data.draw(st.booleans(), label="nonfinite")
    x = normal(rng, shape, dtype, 3.0)
    if nonfinite:
        x = inject_nonfinite(rng, x)
    mistake = draw_mistake(data, ACT_MISTAKES if op == "activation" else ACT_BWD_MISTAKES)
    present = Presenter(data)
    bad_x, be = common_mistake(data, mistake, rng, shape, backend)
    if mistake == "unknown mode":
        mode = pick(data, ["RELU", "leaky_relu", "", "softplus"])
    elif mistake == "mode not a str":
        mode = pick(data, [0, None, 3.5, ["relu"], {"tanh": 1}, ("relu",)])
    elif mistake == "coef not a number":
        coef = pick(data, ["1.0x", None, [1.0]])
    elif mistake == "coef inf":
        coef = pick(data, [np.inf, -np.inf, np.nan])
    elif mistake == "clipped_relu coef <= 0":
        mode, coef = "clipped_relu", pick(data, [0.0, -1.0])
    y_ref = reference.activation(x.astype(np.float64), mode, coef) if mistake is None else None
    tol = REL_TOL[dtype]
    if op == "activation":
        xi = bad_x[0] if bad_x else present(x, "x")

        def check(y):
            compare("activation", y, y_ref, tol, dtype=dtype)
        return expect(op, lambda: dnnkit.activation(xi, mode, coef, backend=be), check,
                      mistake, present.bad)
    # backward: y is the forward in x's dtype (as a caller has it); dy may hold NaN/Inf too
    y = (y_ref if y_ref is not None else x).astype(dtype)
    dy = normal(rng, shape, dtype, 2.0)
    if nonfinite:
        dy = inject_nonfinite(rng, dy, 0.1)
    if mistake == "shape mismatch":
        dy = normal(rng, shape + (2,), dtype)
    elif mistake == "dtype mismatch":
        dy = dy.astype("float32" if dtype != "float32" else "float64")
    args = [bad_x[0] if bad_x else present(x, "x"), present(y, "y"), present(dy, "dy")]

    def check_bwd(dx):
        ref = reference.activation_backward(x.astype(np.float64), dy.astype(np.float64), mode, coef)
        floor = 0.0
        if mode in ("tanh", "sigmoid", "elu", "swish"):
            # the slope comes from y (rounded to the dtype): NaN where y is and x is not
            ref = np.where(np.isnan(y) & ~np.isnan(ref), np.nan, ref)
            # and its rounding error is absolute, ~eps * |dy| (times alpha for elu): against
            # a small max|ref| (saturated tanh or sigmoid, elu at x = -inf, whose slope
            # y + alpha is fl(-alpha) + alpha ~ eps * alpha, not 0: float16, cuDNN on an
            # H100) a purely relative check fails on rounding alone
            fin = np.isfinite(dy)
            floor = float(np.abs(dy[fin]).max()) * max(1.0, abs(coef)) if fin.any() else 0.0
        # y enters the slope in y's precision: 4x (tests/ops/test_activation.py)
        compare("activation_backward", dx, ref, 4 * tol, floor=floor, dtype=dtype)
    return expect(op, lambda: dnnkit.activation_backward(*args, mode, coef, backend=be),
                  check_bwd, mistake, present.bad)


# ---------------------------------------------------------------- softmax

SM_MISTAKES = COMMON + ("unknown algo", "unknown mode", "rank 1", "rank 6")
SM_BWD_MISTAKES = SM_MISTAKES + ("shape mismatch", "dtype mismatch")


def _softmax_ref(x, algo, mode):
    # the reference reduces with max(), which has no identity: an empty x gives an empty y
    return reference.softmax(x, algo, mode) if np.size(x) else np.zeros(np.shape(x))


def _softmax_backward_ref(y, dy, algo, mode):
    return reference.softmax_backward(y, dy, algo, mode) if np.size(y) else np.zeros(np.shape(y))


def _sm_tol(dtype, algo):
    return REL_TOL[dtype] * (4 if algo == "log" else 1) * (2 if dtype == "float32" else 1)


def softmax_case(data, backend, op):
    rng = seed_rng(data)
    dtype = draw_dtype(data)
    rank = data.draw(st.sampled_from([2, 3, 4, 5]), label="rank")
    shape = draw_dims(data, rank, 0, 4)
    algo = "log" if op == "log_softmax" else \
        data.draw(st.sampled_from(softmax_ops.ALGOS), label="algo")
    mode = data.draw(st.sampled_from(softmax_ops.MODES), label="mode")
    mistake = draw_mistake(data, SM_MISTAKES if op != "softmax_backward" else SM_BWD_MISTAKES)
    if op == "log_softmax" and mistake == "unknown algo":
        mistake = "unknown mode"
    x = normal(rng, shape, dtype, 2.0)
    bad_x, be = common_mistake(data, mistake, rng, shape, backend)
    if mistake and mistake.startswith("rank"):
        x = normal(rng, draw_dims(data, int(mistake[-1]), 1, 3), dtype)
    if mistake == "unknown algo":
        algo = pick(data, ["precise", "LOG", None, ["log"], {"fast": 1}])
    elif mistake == "unknown mode":
        mode = pick(data, ["spatial", "CHANNEL", None, 1, ["channel"]])
    present = Presenter(data)
    tol = _sm_tol(dtype, algo)
    name = "softmax" if op == "log_softmax" else op
    if op != "softmax_backward":
        xi = bad_x[0] if bad_x else present(x, "x")
        if op == "log_softmax":
            call = lambda: dnnkit.log_softmax(xi, mode, backend=be)  # noqa: E731
        else:
            call = lambda: dnnkit.softmax(xi, algo, mode, backend=be)  # noqa: E731

        def check(y):
            compare(op, y, _softmax_ref(x.astype(np.float64), algo, mode), tol, dtype=dtype)
        return expect(op, call, check, mistake, present.bad, names=(name,))
    y = _softmax_ref(x.astype(np.float64), algo, mode).astype(dtype) if mistake is None or \
        not mistake.startswith("rank") else x
    dy = normal(rng, y.shape, dtype)
    if mistake == "shape mismatch":
        dy = normal(rng, y.shape[:-1] + (y.shape[-1] + 1,), dtype)
    elif mistake == "dtype mismatch":
        dy = dy.astype("float32" if dtype != "float32" else "float16")
    yi = bad_x[0] if bad_x else present(y, "y")
    dyi = present(dy, "dy")

    def check_bwd(dx):
        ref = _softmax_backward_ref(y.astype(np.float64), dy.astype(np.float64), algo, mode)
        # C == 1 leaves only rounding: measure against max|dy| (tests/ops/test_softmax.py)
        compare(op, dx, ref, 4 * tol, floor=float(np.abs(dy).max(initial=0)), dtype=dtype)
    return expect(op, lambda: dnnkit.softmax_backward(yi, dyi, algo, mode, backend=be),
                  check_bwd, mistake, present.bad)


# ---------------------------------------------------------------- dropout

DROP_MISTAKES = COMMON + ("p = 1", "p < 0", "p > 1", "p nan", "p not a number", "seed < 0",
                          "seed >= 2**64", "seed not an int")
DROP_BWD_MISTAKES = COMMON + ("state not a DropoutState", "dy shape mismatch",
                              "dy dtype mismatch")


def dropout_case(data, backend, op):
    rng = seed_rng(data)
    dtype = draw_dtype(data)
    shape = draw_dims(data, data.draw(st.integers(1, 4), label="rank"), 0, 5)
    p = data.draw(st.sampled_from([0.0, 0.1, 0.5, 0.9, 0.999]), label="p")
    if backend == "cudnn" and dropout_ops.cudnn_scale_error(p) > 4 * np.finfo(dtype).eps:
        p = 0.5         # cuDNN's float32 p too coarse for the dtype: refused (tests/ops)
    seed = data.draw(st.integers(0, 2**64 - 1), label="dropout seed")
    nonfinite = data.draw(st.booleans(), label="nonfinite")
    x = normal(rng, shape, dtype, 2.0)
    if nonfinite:
        x = inject_nonfinite(rng, x)
    mistake = draw_mistake(data, DROP_MISTAKES if op == "dropout" else DROP_BWD_MISTAKES)
    bad_x, be = common_mistake(data, mistake, rng, shape, backend)
    p_call, seed_call = p, seed
    p_call = {"p = 1": 1.0, "p < 0": -0.25, "p > 1": 1.5, "p nan": float("nan"),
              "p not a number": pick(data, ["0.5", None, True])}.get(mistake, p)
    seed_call = {"seed < 0": -1, "seed >= 2**64": 2**64,
                 "seed not an int": pick(data, [1.5, "7", True])}.get(mistake, seed)
    present = Presenter(data)
    tol = REL_TOL[dtype]

    def mask_ref(state, a):
        # the state's mask (the backward of ones); dropped elements are 0 (a select, as cuDNN:
        # a NaN or Inf there does not leak), kept ones are a / (1 - p), IEEE
        m = state.mask()
        assert m.shape == shape and (p > 0 or m.all())
        with np.errstate(invalid="ignore", over="ignore"):
            return np.where(m, a.astype(np.float64) / (1.0 - p), 0.0)

    if op == "dropout":
        xi = bad_x[0] if bad_x else present(x, "x")

        def check(out):
            y, state = out
            assert isinstance(state, dnnkit.DropoutState) and state.p == p
            compare("dropout", y, mask_ref(state, x), tol, dtype=dtype)
        return expect(op, lambda: dnnkit.dropout(xi, p_call, seed=seed_call, backend=be),
                      check, mistake, present.bad)
    _, state = dnnkit.dropout(x, p, seed=seed, backend=backend)
    dy = normal(rng, shape, dtype)
    if nonfinite:
        dy = inject_nonfinite(rng, dy)
    if mistake == "dy shape mismatch":
        dy = normal(rng, shape + (1,), dtype)
    elif mistake == "dy dtype mismatch":
        dy = dy.astype("float64" if dtype != "float64" else "float32")
    st_call = pick(data, [None, "state", (p, seed)]) if mistake == "state not a DropoutState" \
        else state
    dyi = bad_x[0] if bad_x else present(dy, "dy")

    def check_bwd(dx):
        compare("dropout_backward", dx, mask_ref(state, dy), tol, dtype=dtype)
    return expect(op, lambda: dnnkit.dropout_backward(dyi, st_call, backend=be), check_bwd,
                  mistake, present.bad)
