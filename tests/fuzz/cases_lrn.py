"""Fuzz cases: lrn and lrn_backward (3-D to 5-D, window sizes narrower and wider than C, sizes
from zero) against the float64 reference."""

import numpy as np
from hypothesis import strategies as st

import dnnkit
from dnnkit import reference

from .common import (COMMON, REL_TOL, Presenter, common_mistake, compare, draw_dims, draw_dtype,
                     draw_mistake, draw_size, expect, normal, pick, seed_rng)

LRN_MISTAKES = COMMON + ("size < 1", "size not an int", "alpha not a number", "beta not finite",
                         "wrong rank")
LRN_BWD_MISTAKES = LRN_MISTAKES + ("shape mismatch", "dtype mismatch")


def _first_term(x, dy, size, alpha, beta, k):
    """max |dy * q^-beta|, the backward's first term: dx is the difference of two terms that
    can cancel, so its error is measured against their size, not against dx alone."""
    x = x.astype(np.float64)
    before, after = reference.lrn_window(size)
    c = x.shape[1]
    q = np.empty_like(x)
    for i in range(c):
        q[:, i] = k + alpha / size * (x[:, max(i - before, 0):i + after + 1] ** 2).sum(axis=1)
    return float(np.abs(dy.astype(np.float64) * q ** -beta).max(initial=0.0))


def lrn_case(data, backend, op):
    rng = seed_rng(data)
    dtype = draw_dtype(data)
    rank = data.draw(st.integers(3, 5), label="rank")
    shape = (draw_size(data, 0, 2, "N"), draw_size(data, 0, 6, "C")) + \
        draw_dims(data, rank - 2, 0, 3)
    # cuDNN's descriptor takes sizes 1 to 16 (wider windows are a documented refusal, checked
    # in tests/ops/test_lrn.py); Numba takes any
    size = data.draw(st.sampled_from([1, 2, 3, 4, 5, 7] + ([17] if backend == "numba" else [])),
                     label="size")
    alpha = data.draw(st.sampled_from([0.0, 1e-4, 1.0, 2.0]), label="alpha")
    beta = data.draw(st.sampled_from([0.5, 0.75, 1.0]), label="beta")
    k = data.draw(st.sampled_from([0.5, 1.0, 2.0]), label="k")
    x = normal(rng, shape, dtype)
    mistake = draw_mistake(data, LRN_MISTAKES if op == "lrn" else LRN_BWD_MISTAKES)
    present = Presenter(data)
    bad_x, be = common_mistake(data, mistake, rng, shape, backend)
    if mistake == "size < 1":
        size = pick(data, [0, -1, -5])
    elif mistake == "size not an int":
        size = pick(data, [2.0, "3", None, True, [3]])
    elif mistake == "alpha not a number":
        alpha = pick(data, ["1e-4", None, [1.0]])
    elif mistake == "beta not finite":
        beta = pick(data, [np.inf, -np.inf, np.nan])
    elif mistake == "wrong rank":
        x = normal(rng, pick(data, [(2, 3), (1, 2, 1, 1, 2, 2)]), dtype)
    y_ref = reference.lrn(x, size, alpha, beta, k) if mistake is None else None
    tol = REL_TOL[dtype]
    if op == "lrn":
        xi = bad_x[0] if bad_x else present(x, "x")

        def check(y):
            compare("lrn", y, y_ref, tol, dtype=dtype)
        return expect(op, lambda: dnnkit.lrn(xi, size, alpha, beta, k, backend=be), check,
                      mistake, present.bad)
    y = (y_ref if y_ref is not None else x).astype(dtype)   # the forward in x's dtype
    dy = normal(rng, x.shape, dtype)
    if mistake == "shape mismatch":
        dy = normal(rng, x.shape + (2,), dtype)
    elif mistake == "dtype mismatch":
        dy = dy.astype("float32" if dtype != "float32" else "float64")
    args = [bad_x[0] if bad_x else present(x, "x"), present(y, "y"), present(dy, "dy")]

    def check_bwd(dx):
        ref = reference.lrn_backward(x, dy, size, alpha, beta, k)
        # y enters the gradient in its own precision: 4x (tests/ops/test_lrn.py)
        compare("lrn_backward", dx, ref, 4 * tol, dtype=dtype,
                floor=_first_term(x, dy, size, alpha, beta, k))
    return expect(op, lambda: dnnkit.lrn_backward(*args, size, alpha, beta, k, backend=be),
                  check_bwd, mistake, present.bad)
