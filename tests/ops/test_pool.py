"""Pooling 2-D/3-D: every mode, forward and backward, against the float64 reference; ceil mode
(output sizes, divisors, the cuDNN path's extension emulated); finite differences; the max
routing and tie rule; NaN; argument errors; the cuDNN layer (stubbed)."""

import ctypes
import functools
import glob
import os
import re
import types

import numpy as np
import pytest

import dnnkit
from dnnkit import reference
from dnnkit.ops import pool as pool_ops
from tests.conftest import DTYPES, REL_TOL, backend_params

MODES = list(pool_ops.MODES)
CASES = [  # (id, x shape, window, stride, padding)
    ("2d-overlap", (2, 3, 7, 6), 3, 2, 1),                     # stride < window, padding
    ("2d-tiled", (1, 2, 6, 4), 2, None, 0),                     # stride = window, batch 1
    ("2d-gaps", (2, 1, 8, 7), 2, 3, 1),                         # stride > window
    ("2d-asym", (1, 2, 5, 7), (3, 2), (1, 2), (1, 0)),          # asymmetric everything
    ("3d-overlap", (1, 2, 4, 5, 4), (2, 3, 2), (1, 2, 1), (1, 1, 0)),
    ("3d-gaps", (2, 1, 5, 4, 6), 2, 3, 1),
]


def _fns(nd):
    return (dnnkit.pool2d, dnnkit.pool2d_backward) if nd == 2 else \
        (dnnkit.pool3d, dnnkit.pool3d_backward)


def _input(rng, shape, dtype, mode):
    """max: distinct values per window (cuDNN's MAX breaks ties its own way); max_deterministic:
    a few integer levels, so most windows hold tied maxima; else normal data."""
    if mode == "max":
        return pool_ops.tie_free(rng, shape, dtype)
    if mode == "max_deterministic":
        return rng.integers(-2, 3, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_forward_and_backward_match_float64(rng, case, mode, dtype, backend):
    _, shape, k, s, p = case
    fwd, bwd = _fns(len(shape) - 2)
    x = _input(rng, shape, dtype, mode)
    with dnnkit.trace() as t:
        y = fwd(x, k, s, p, mode, backend=backend).copy_to_host()
    assert t.backends() == [backend]
    x64 = x.astype(np.float64)
    ref = reference.pool_forward(x64, k, s, p, mode)
    assert y.dtype == np.dtype(dtype) and y.shape == ref.shape
    assert reference.rel_error(y, ref) <= REL_TOL[dtype]
    dy = rng.standard_normal(y.shape).astype(dtype)
    dx = bwd(x, y, dy, k, s, p, mode, backend=backend).copy_to_host()
    assert dx.dtype == np.dtype(dtype) and dx.shape == shape
    ref = reference.pool_backward(x64, dy.astype(np.float64), k, s, p, mode)
    assert reference.rel_error(dx, ref) <= 4 * REL_TOL[dtype]


# ---------------------------------------------------------------- ceil mode

CEIL_CASES = [  # (id, x shape, window, stride, padding): ceil mode adds a window somewhere
    ("2d-ceil-pad", (1, 2, 6, 7), 3, 2, 1),                     # H gains one, W does not
    ("2d-ceil-nopad", (2, 1, 5, 8), (2, 3), 2, 0),              # both gain one
    ("2d-ceil-wide", (1, 2, 2, 5), 3, 2, 0),                    # window wider than H
    ("3d-ceil", (1, 2, 5, 4, 6), (2, 3, 3), 2, (0, 1, 1)),
]


def _floor_shape(shape, k, s, p):
    return reference.pool_windows(shape, k, s, p)[0]


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", CEIL_CASES, ids=[c[0] for c in CEIL_CASES])
def test_ceil_mode_matches_float64(rng, case, mode, dtype, backend):
    _, shape, k, s, p = case
    fwd, bwd = _fns(len(shape) - 2)
    x = _input(rng, shape, dtype, mode)
    y = fwd(x, k, s, p, mode, ceil_mode=True, backend=backend).copy_to_host()
    x64 = x.astype(np.float64)
    ref = reference.pool_forward(x64, k, s, p, mode, ceil_mode=True)
    assert y.shape == ref.shape and y.shape[2:] != _floor_shape(shape, k, s, p)
    assert reference.rel_error(y, ref) <= REL_TOL[dtype]
    dy = rng.standard_normal(y.shape).astype(dtype)
    dx = bwd(x, y, dy, k, s, p, mode, ceil_mode=True, backend=backend).copy_to_host()
    ref = reference.pool_backward(x64, dy.astype(np.float64), k, s, p, mode, ceil_mode=True)
    assert dx.shape == shape and reference.rel_error(dx, ref) <= 4 * REL_TOL[dtype]


@pytest.mark.parametrize("n,k,s,p,floor,ceil", [
    (5, 2, 2, 0, 2, 3),         # the last window holds one input
    (6, 3, 2, 1, 3, 4),         # reaches one past the padding
    (5, 2, 2, 1, 3, 3),         # ceil would give 4, but that window starts in the padding
    (7, 3, 2, 0, 3, 3),         # exact: no difference
    (112, 3, 2, 0, 55, 56),     # GoogLeNet's (Caffe) 3/2 max pooling
    (2, 3, 2, 0, None, 1),      # a window wider than x: ceil mode only (PyTorch allows it)
])
def test_ceil_mode_output_size_is_pytorchs(n, k, s, p, floor, ceil):
    """PyTorch's pooling_output_shape: ceil((n + 2p - k) / s) + 1, less one when that window
    would start at or past n + p."""
    x = np.zeros((1, 1, n, 1), np.float32)
    if floor is not None:
        assert dnnkit.pool2d(x, (k, 1), (s, 1), (p, 0)).shape[2] == floor
    assert dnnkit.pool2d(x, (k, 1), (s, 1), (p, 0), ceil_mode=True).shape[2] == ceil
    assert reference.pool_forward(x, (k, 1), (s, 1), (p, 0), "max", True).shape[2] == ceil


def test_ceil_mode_divisors_are_pytorchs():
    """Hand-checked values (PyTorch's avg_pool2d, ceil_mode=True): average_inc_pad divides by
    the window clipped at the padded end, never by the overhang past it."""
    x = np.arange(1, 17, dtype=np.float32).reshape(1, 1, 4, 4)
    for mode in ("average_inc_pad", "average_exc_pad"):   # no padding: the two agree
        y = dnnkit.pool2d(x, 3, 2, 0, mode, ceil_mode=True).copy_to_host()
        np.testing.assert_array_equal(y[0, 0], [[6, 7.5], [12, 13.5]])
    row = np.arange(1, 6, dtype=np.float32).reshape(1, 1, 1, 5)
    y = dnnkit.pool2d(row, (1, 2), ceil_mode=True, mode="average").copy_to_host()
    np.testing.assert_array_equal(y.ravel(), [1.5, 3.5, 5])
    # 6 x 6 ones, 3/2/1: windows start at -1, 1, 3, 5; inputs per dim 2, 3, 3, 1; the
    # padded extent per dim 3, 3, 3, 2 (the last window's third position is overhang)
    ones = np.ones((1, 1, 6, 6))
    inc = dnnkit.pool2d(ones, 3, 2, 1, "average_inc_pad", ceil_mode=True).copy_to_host()[0, 0]
    per = np.array([2 / 3, 1, 1, 1 / 2])
    np.testing.assert_allclose(inc, np.outer(per, per), rtol=1e-15)
    exc = dnnkit.pool2d(ones, 3, 2, 1, "average_exc_pad", ceil_mode=True).copy_to_host()[0, 0]
    np.testing.assert_array_equal(exc, np.ones((4, 4)))
    s = dnnkit.pool2d(ones, 3, 2, 1, "sum", ceil_mode=True).copy_to_host()[0, 0]
    np.testing.assert_array_equal(s, np.outer([2, 3, 3, 1], [2, 3, 3, 1]))


@pytest.mark.parametrize("mode", ["average_inc_pad", "average_exc_pad", "sum", "max"])
@pytest.mark.parametrize("shape,window_args", [((1, 1, 4, 5), (3, 2, 1)),
                                               ((1, 1, 3, 4, 3), ((2, 3, 2), 2, (0, 1, 0)))],
                         ids=["2d", "3d"])
def test_ceil_mode_backward_is_the_derivative(rng, shape, window_args, mode):
    fwd, bwd = _fns(len(shape) - 2)
    fwd, bwd = (functools.partial(f, ceil_mode=True) for f in (fwd, bwd))
    x = pool_ops.tie_free(rng, shape, np.float64) if mode == "max" else rng.standard_normal(shape)
    y = fwd(x, *window_args, mode, backend="numba").copy_to_host()
    assert y.shape[2:] != _floor_shape(shape, *window_args)
    dy = rng.standard_normal(y.shape)
    fd = _batched_fd(fwd, x, dy, window_args, mode, 1e-3 if mode == "max" else 1e-5)
    dx = bwd(x, y, dy, *window_args, mode, backend="numba").copy_to_host()
    np.testing.assert_allclose(dx, fd, rtol=1e-7, atol=1e-9)


def _emulated_cudnn(monkeypatch, limit):
    """cuDNN's calls emulated on the simulator (tests/ops/split_fakes.py: floor-mode pooling
    by the float64 reference, cuDNN's semantics) plus the ceil-mode helpers (fill and copy,
    crop, rescale), each recording what it was given."""
    from tests.ops.split_fakes import _host, _put, fake_cudnn
    seen = fake_cudnn(monkeypatch, limit)
    seen["extend"] = []

    def extend(x, xe, fill, stream):
        seen["extend"].append((tuple(xe.shape), fill))
        h = np.full(xe.shape, fill)
        h[tuple(slice(0, n) for n in x.shape)] = _host(x)[0]
        _put(xe, h)

    def crop(xe, x, stream):
        _put(x, _host(xe)[0][tuple(slice(0, n) for n in x.shape)])

    def rescale(a, scale, c, stream):
        _put(c, _host(a)[0] * scale.copy_to_host())

    for name, fn in (("extend", extend), ("crop", crop), ("rescale", rescale)):
        monkeypatch.setattr(pool_ops.cudnn_pool, name, fn)
    return seen


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", CEIL_CASES[:2] + CEIL_CASES[3:],
                         ids=[c[0] for c in CEIL_CASES[:2] + CEIL_CASES[3:]])
def test_cudnn_ceil_mode_path_with_emulated_cudnn(rng, monkeypatch, case, mode):
    """The cuDNN path's arithmetic on the simulator: x extended at its far edges (-inf for max,
    0 otherwise), cuDNN's floor-mode pooling of it (emulated), the average modes rescaled by
    cuDNN's divisor over the true one, dx cropped; a batch of 3 in pieces of one (split)."""
    _, shape, k, s, p = case
    shape = (3,) + shape[1:]
    geom = pool_ops.make_geom("t", len(shape) - 2, shape, k, s, p, True)
    seen = _emulated_cudnn(monkeypatch, limit=pool_ops._image(geom))    # one image a piece
    fwd, bwd = _fns(len(shape) - 2)
    x = _input(rng, shape, "float64", mode)
    with dnnkit.trace() as t:
        y = fwd(x, k, s, p, mode, ceil_mode=True, backend="cudnn")
    assert t.backends() == ["cudnn"]
    ref = reference.pool_forward(x, k, s, p, mode, ceil_mode=True)
    np.testing.assert_allclose(y.copy_to_host(), ref, rtol=1e-13)
    fill = -np.inf if mode.startswith("max") else 0.0
    assert seen["extend"] == [((1,) + geom.extended_shape[1:], fill)] * 3
    assert seen["pool"] == [(1,) + geom.extended_shape[1:]] * 3
    dy = rng.standard_normal(ref.shape)
    dx = bwd(x, y, dy, k, s, p, mode, ceil_mode=True, backend="cudnn").copy_to_host()
    np.testing.assert_allclose(dx, reference.pool_backward(x, dy, k, s, p, mode, True),
                               rtol=1e-13, atol=1e-15)


def test_ceil_mode_geometry_extends_only_where_a_window_overhangs():
    g = pool_ops.make_geom("t", 2, (1, 1, 6, 7), 3, 2, 1, True)
    assert g.y_shape == (1, 1, 4, 4) and g.overhang == (1, 0)
    assert g.extended_shape == (1, 1, 7, 7)
    assert pool_ops.make_geom("t", 2, (1, 1, 6, 7), 3, 2, 1).overhang == (0, 0)
    assert pool_ops.make_geom("t", 3, (1, 1, 2, 5, 5), (3, 2, 2), 2, 0, True).overhang == \
        (1, 1, 1)
    # cuDNN's divisor on the extended x over the true one: 1 away from the overhang
    inc = pool_ops._divisor_ratio(g, "average_inc_pad")[0, 0]
    np.testing.assert_allclose(inc, np.outer([1, 1, 1, 3 / 2], [1, 1, 1, 1]))
    exc = pool_ops._divisor_ratio(g, "average_exc_pad")[0, 0]
    np.testing.assert_allclose(exc, np.outer([1, 1, 1, 2], [1, 1, 1, 1]))
    for mode in ("max", "sum"):
        assert pool_ops._divisor_ratio(g, mode) is None
    assert pool_ops._divisor_ratio(pool_ops.make_geom("t", 2, (1, 1, 7, 7), 3, 2, 0, True),
                                   "average_inc_pad") is None        # exact: no overhang


def test_output_size_and_defaults():
    x = np.zeros((1, 1, 9, 8), np.float32)
    assert dnnkit.pool2d(x, 3, 2, 1).shape == (1, 1, (9 + 2 - 3) // 2 + 1, (8 + 2 - 3) // 2 + 1)
    assert dnnkit.pool2d(x, 2).shape == (1, 1, 4, 4)                 # stride = window
    assert dnnkit.pool2d(x, (3, 2), (1, 3)).shape == (1, 1, 7, 3)
    assert dnnkit.pool3d(np.zeros((2, 3, 5, 6, 7)), (2, 3, 4), padding=(1, 1, 0)).shape == \
        (2, 3, 3, 2, 1)
    assert dnnkit.pool2d(np.zeros((0, 3, 4, 4), np.float32), 2).shape == (0, 3, 2, 2)


def test_average_alias_and_exc_pad_divisor():
    x = np.ones((1, 1, 3, 3))
    inc = dnnkit.pool2d(x, 3, 1, 1, "average").copy_to_host()[0, 0]
    exc = dnnkit.pool2d(x, 3, 1, 1, "average_exc_pad").copy_to_host()[0, 0]
    s = dnnkit.pool2d(x, 3, 1, 1, "sum").copy_to_host()[0, 0]
    np.testing.assert_allclose(inc, np.array([[4, 6, 4], [6, 9, 6], [4, 6, 4]]) / 9)
    np.testing.assert_allclose(exc, np.ones((3, 3)))
    np.testing.assert_allclose(s, [[4, 6, 4], [6, 9, 6], [4, 6, 4]])


# ---------------------------------------------------------------- gradients

def _batched_fd(fwd, x, dy, window_args, mode, h):
    """Central differences of L(x) = sum(dy * pool(x)) wrt every element of x (x has N = 1),
    all in one launch: sample 2i of the batch carries +h at element i, sample 2i+1 -h."""
    m = x.size
    xs = np.repeat(x, 2 * m, axis=0).reshape(2 * m, -1)
    xs[np.arange(0, 2 * m, 2), np.arange(m)] += h
    xs[np.arange(1, 2 * m, 2), np.arange(m)] -= h
    ys = fwd(xs.reshape((2 * m,) + x.shape[1:]), *window_args, mode,
             backend="numba").copy_to_host()
    loss = (ys * dy).reshape(2 * m, -1).sum(axis=1)
    return ((loss[0::2] - loss[1::2]) / (2 * h)).reshape(x.shape)


@pytest.mark.parametrize("mode", ["average_inc_pad", "average_exc_pad", "sum", "max"])
@pytest.mark.parametrize("shape,window_args", [((1, 1, 4, 5), (3, 2, 1)),
                                       ((1, 1, 3, 3, 4), ((2, 2, 3), (1, 2, 1), (1, 0, 1)))],
                         ids=["2d", "3d"])
def test_backward_is_the_derivative(rng, shape, window_args, mode):
    """Numba's and the reference's gradients against central differences of Numba's forward
    (float64; max on tie-free data, where the derivative exists)."""
    fwd, bwd = _fns(len(shape) - 2)
    x = pool_ops.tie_free(rng, shape, np.float64) if mode == "max" else rng.standard_normal(shape)
    y = fwd(x, *window_args, mode, backend="numba").copy_to_host()
    dy = rng.standard_normal(y.shape)
    fd = _batched_fd(fwd, x, dy, window_args, mode, 1e-3 if mode == "max" else 1e-5)
    dx = bwd(x, y, dy, *window_args, mode, backend="numba").copy_to_host()
    np.testing.assert_allclose(dx, fd, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(reference.pool_backward(x, dy, *window_args, mode), fd, rtol=1e-7,
                               atol=1e-9)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape,window", [((3, 2, 2, 3), (2, 3)), ((3, 2, 1, 3), (1, 3))],
                         ids=["global-fwd-flat", "global-both-flat"])
def test_global_pooling_walks_small_planes_flat(rng, shape, window, mode):
    """Planes of few positions (global pooling) are walked as (plane, position) pairs
    (dnnkit/ops/pool.py _launch: below 4 positions on the simulator, 128 on a GPU)."""
    x = pool_ops.tie_free(rng, shape, np.float64) if "max" in mode else rng.standard_normal(shape)
    y = dnnkit.pool2d(x, window, mode=mode, backend="numba")
    np.testing.assert_allclose(y.copy_to_host(),
                               reference.pool_forward(x, window, window, 0, mode), rtol=1e-12)
    dy = rng.standard_normal(y.shape)
    dx = dnnkit.pool2d_backward(x, y, dy, window, window, 0, mode, backend="numba")
    np.testing.assert_allclose(dx.copy_to_host(),
                               reference.pool_backward(x, dy, window, window, 0, mode), rtol=1e-12)


def test_max_backward_with_more_taps_than_a_byte(rng):
    """Windows of more than 255 taps carry their arg-max codes in int32, not uint8."""
    x = pool_ops.tie_free(rng, (1, 2, 17, 18), np.float64)
    window_args = ((16, 17), (1, 1), 0)                        # 272 taps, 2 x 2 overlapping windows
    y = dnnkit.pool2d(x, *window_args, "max", backend="numba")
    dy = rng.standard_normal(y.shape)
    dx = dnnkit.pool2d_backward(x, y, dy, *window_args, "max", backend="numba").copy_to_host()
    np.testing.assert_allclose(dx, reference.pool_backward(x, dy, *window_args, "max"), rtol=1e-12)
    assert np.count_nonzero(dx) >= 2


# Hand-checked routing: window 2, stride 1. Windows (row-major) and their first maximum:
# (0,0) [1 5;3 5] -> (0,1); (0,1) [5 5;5 0] -> (0,1); (0,2) [5 2;0 5] -> (0,2);
# (1,0) [3 5;4 4] -> (1,1); (1,1) [5 0;4 1] -> (1,1); (1,2) [0 5;1 1] -> (1,3).
TIE_X = np.array([[1, 5, 5, 2], [3, 5, 0, 5], [4, 4, 1, 1]], np.float32)[None, None]
TIE_DY = np.array([[1, 2, 4], [8, 16, 32]], np.float32)[None, None]
TIE_DX = np.array([[0, 3, 4, 0], [0, 24, 0, 32], [0, 0, 0, 0]], np.float32)[None, None]


@pytest.mark.parametrize("mode,backend", [
    ("max", "numba"), ("max_deterministic", "numba"),
    pytest.param("max_deterministic", "cudnn", marks=pytest.mark.cudnn)])
def test_max_routes_to_the_first_maximum(mode, backend):
    y = dnnkit.pool2d(TIE_X, 2, 1, 0, mode, backend=backend)
    np.testing.assert_array_equal(y.copy_to_host(), [[[[5, 5, 5], [5, 5, 5]]]])
    dx = dnnkit.pool2d_backward(TIE_X, y, TIE_DY, 2, 1, 0, mode, backend=backend)
    np.testing.assert_array_equal(dx.copy_to_host(), TIE_DX)
    np.testing.assert_array_equal(reference.pool_backward(TIE_X, TIE_DY, 2, 1, 0, mode), TIE_DX)


@pytest.mark.parametrize("backend", backend_params())
def test_padding_never_wins_a_max_and_ties_go_to_the_first_input(backend):
    x = -np.ones((1, 1, 2, 3), np.float32)          # all tied, all below the padding's 0
    y = dnnkit.pool2d(x, 2, 1, 1, "max_deterministic", backend=backend)
    np.testing.assert_array_equal(y.copy_to_host(), -np.ones((1, 1, 3, 4)))
    dy = np.arange(1, 13, dtype=np.float32).reshape(1, 1, 3, 4)
    dx = dnnkit.pool2d_backward(x, y, dy, 2, 1, 1, "max_deterministic", backend=backend)
    # output (i, j) reads rows i-1..i, cols j-1..j: its first input is (max(i-1,0), max(j-1,0))
    want = [[1 + 2 + 5 + 6, 3 + 7, 4 + 8], [9 + 10, 11, 12]]
    np.testing.assert_array_equal(dx.copy_to_host()[0, 0], want)


# ---------------------------------------------------------------- NaN

@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("mode", MODES)
def test_nan_in_a_window_propagates(rng, mode, backend):
    x = rng.standard_normal((1, 2, 6, 6)).astype(np.float32)
    x[0, 0, 2, 3] = np.nan
    y = dnnkit.pool2d(x, 2, 2, 0, mode, backend=backend).copy_to_host()
    nan = np.zeros(y.shape, bool)
    nan[0, 0, 1, 1] = True
    np.testing.assert_array_equal(np.isnan(y), nan)
    ref = reference.pool_forward(x, 2, 2, 0, mode)[~nan]
    # norm-wise, as everywhere (cuDNN's average of a small value was measured 1.6e-6 off)
    assert reference.rel_error(y[~nan], ref) <= 2e-6


def _minus_inf_windows(dtype):
    """x (1, 1, 4, 4) in 2x2/2 windows: all -inf; -inf and the lowest finite value; numbers;
    -inf and 1. IEEE's maxima: -inf, lowest, the numbers' maximum, 1."""
    lo = np.finfo(dtype).min
    x = np.array([[-np.inf, -np.inf, -np.inf, lo], [-np.inf, -np.inf, -np.inf, -np.inf],
                  [0.5, -2.0, -np.inf, 1.0], [0.25, 0.75, -np.inf, -np.inf]], dtype)
    return x.reshape(1, 1, 4, 4), np.array([-np.inf, lo, 0.75, 1.0], dtype).reshape(1, 1, 2, 2)


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", ["max", "max_deterministic"])
def test_max_of_a_window_of_minus_inf_is_minus_inf(mode, dtype, backend):
    """IEEE on every backend: cuDNN's own answer (the lowest finite value) is repaired."""
    x, want = _minus_inf_windows(dtype)
    y = dnnkit.pool2d(x, 2, 2, 0, mode, backend=backend).copy_to_host()
    np.testing.assert_array_equal(y, want)


@pytest.mark.parametrize("dtype", DTYPES)
def test_repair_of_cudnn_max_restores_minus_inf_only_where_ieee_says(dtype):
    """The repair kernel alone (it runs after cuDNN, checked here without it): given y as
    cuDNN computes it (lowest finite value for the all -inf window), it writes -inf there and
    leaves every other output, the true lowest included."""
    from numba import cuda

    x, want = _minus_inf_windows(dtype)
    cudnn_y = want.copy()
    cudnn_y[0, 0, 0, 0] = np.finfo(dtype).min
    y = cuda.to_device(cudnn_y)
    geom = pool_ops.make_geom("pool2d", 2, x.shape, 2, 2, 0)
    pool_ops.repair_max(cuda.to_device(x), y, geom, "max", dnnkit.arrays.as_stream(None))
    np.testing.assert_array_equal(y.copy_to_host(), want)


def test_repair_finds_every_lowest_output_of_a_larger_pooling(rng):
    """The repair kernel over 512 outputs (64 threads on the simulator, so every thread takes
    the unrolled trips and the tail): 3/2/1 windows, -inf blocks in several planes, cuDNN's
    answer (the lowest finite value) planted where the window is all -inf; each must come back
    as -inf, every other output untouched (the true maximum, or a planted lowest-finite input)."""
    from numba import cuda

    x = rng.standard_normal((2, 4, 16, 16)).astype(np.float32)
    lo = np.finfo(np.float32).min
    for n, c, r, s in [(0, 0, 0, 0), (0, 3, 5, 9), (1, 1, 13, 13), (1, 2, 0, 12)]:
        x[n, c, r:r + 4, s:s + 4] = -np.inf       # windows inside this block are all -inf
    x[1, 3, 6, 6] = lo                              # a true lowest: its window keeps it
    x[1, 3, 5:8, 5:8] = np.where(x[1, 3, 5:8, 5:8] == lo, lo, -np.inf)
    geom = pool_ops.make_geom("pool2d", 2, x.shape, 3, 2, 1)
    want = dnnkit.pool2d(x, 3, 2, 1, backend="numba").copy_to_host()
    assert np.isneginf(want).sum() >= 4 and (want == lo).sum() == 1
    cudnn_y = np.where(np.isneginf(want), lo, want).astype(np.float32)
    y = cuda.to_device(cudnn_y)
    pool_ops.repair_max(cuda.to_device(x), y, geom, "max", dnnkit.arrays.as_stream(None))
    np.testing.assert_array_equal(y.copy_to_host(), want)


@pytest.mark.parametrize("mode", MODES)
def test_backward_with_nan_input_on_numba(rng, mode):
    """Numba: max routes a NaN window's dy to its first NaN (the input that made y NaN);
    average and sum never read x, so a NaN in x leaves dx finite."""
    x = rng.standard_normal((1, 1, 5, 5))
    x[0, 0, 1, 2] = x[0, 0, 2, 1] = np.nan
    y = dnnkit.pool2d(x, 3, 1, 1, mode, backend="numba")
    dy = rng.standard_normal(y.shape)
    dx = dnnkit.pool2d_backward(x, y, dy, 3, 1, 1, mode, backend="numba").copy_to_host()
    np.testing.assert_allclose(dx, reference.pool_backward(x, dy, 3, 1, 1, mode), rtol=1e-13)
    assert np.isfinite(dx).all()
    if mode.startswith("max"):
        assert dx[0, 0, 1, 2] != 0 and dx[0, 0, 2, 1] != 0   # each NaN is first in some window


# ---------------------------------------------------------------- argument checks

def _x4():
    return np.ones((2, 3, 6, 6), np.float32)


@pytest.mark.parametrize("call,exc,words", [
    (lambda x: dnnkit.pool2d(x, 2, padding=2), ValueError,
     ["pool2d", "padding (2, 2)", "window (2, 2)", "cuDNN"]),
    (lambda x: dnnkit.pool2d(x, (3, 2), padding=(1, 2)), ValueError,
     ["pool2d", "padding 2 >= window 2"]),
    (lambda x: dnnkit.pool2d(x, 9, padding=1), ValueError, ["pool2d", "window 9", "6 + 2*1 = 8"]),
    (lambda x: dnnkit.pool2d(x, 0), ValueError, ["pool2d", "window", ">= 1", "0"]),
    (lambda x: dnnkit.pool2d(x, (2, -1)), ValueError, ["pool2d", "window", "(2, -1)"]),
    (lambda x: dnnkit.pool2d(x, 2, 0), ValueError, ["pool2d", "stride", ">= 1", "0"]),
    (lambda x: dnnkit.pool2d(x, 2, 1, -1), ValueError, ["pool2d", "padding", ">= 0", "-1"]),
    (lambda x: dnnkit.pool2d(x, (2, 2, 2)), TypeError, ["pool2d", "window", "(2, 2, 2)"]),
    (lambda x: dnnkit.pool2d(x, 2.0), TypeError, ["pool2d", "window", "2.0"]),
    (lambda x: dnnkit.pool2d(x, True), TypeError, ["pool2d", "window", "True"]),
    (lambda x: dnnkit.pool2d(x, 2, mode="avg"), ValueError, ["pool2d", "avg", "average_exc_pad"]),
    (lambda x: dnnkit.pool2d(x[0], 2), ValueError, ["pool2d", "x", "4-D", "(3, 6, 6)"]),
    (lambda x: dnnkit.pool3d(x, 2), ValueError, ["pool3d", "x", "5-D", "(2, 3, 6, 6)"]),
    (lambda x: dnnkit.pool2d(x.astype(np.int32), 2), TypeError, ["pool2d", "int32"]),
    (lambda x: dnnkit.pool2d(np.ones((1, 1, 0, 4), np.float32), 2, padding=1), ValueError,
     ["pool2d", "empty spatial", "(1, 1, 0, 4)"]),
    (lambda x: dnnkit.pool2d_backward(x, x[:, :, :3, :3], x[:, :, :3, :2], 2), ValueError,
     ["pool2d_backward", "dy", "(2, 3, 3, 2)", "(2, 3, 3, 3)"]),
    (lambda x: dnnkit.pool2d_backward(x, x, x, 2), ValueError,
     ["pool2d_backward", "y", "(2, 3, 6, 6)"]),
    (lambda x: dnnkit.pool2d_backward(x, x[:, :, :3, :3].astype(np.float64), x[:, :, :3, :3], 2),
     TypeError, ["pool2d_backward", "y", "float64", "float32"]),
    (lambda x: dnnkit.pool3d_backward(x, x, x, 2), ValueError, ["pool3d_backward", "5-D"]),
    (lambda x: dnnkit.pool2d(x, 2, backend="cudann"), ValueError, ["backend", "cudann"]),
    (lambda x: dnnkit.pool2d(x, 2, ceil_mode=1), TypeError, ["pool2d", "ceil_mode", "1"]),
    (lambda x: dnnkit.pool2d(x, 9, 2, ceil_mode=True), ValueError,
     ["pool2d", "window 9", "6 + 2*0 = 6", "stride - 1 = 1", "ceil_mode"]),
    (lambda x: dnnkit.pool2d_backward(x, x[:, :, :3, :3], x[:, :, :3, :3], 3, 2, 1,
                                      ceil_mode=True), ValueError,
     ["pool2d_backward", "y", "(2, 3, 3, 3)", "(2, 3, 4, 4)"]),
])
def test_bad_arguments_name_op_and_values(call, exc, words):
    with pytest.raises(exc) as ei:
        call(_x4())
    for w in words:
        assert w in str(ei.value), (w, str(ei.value))


# ---------------------------------------------------------------- dispatch and cuDNN layer

def test_cudnn_supports_every_mode_and_big_batches_but_not_huge_images():
    g = pool_ops.make_geom("t", 2, (2, 3, 8, 8), 3, 2, 1)
    gc = pool_ops.make_geom("t", 2, (2, 3, 8, 8), 3, 2, 0, True)       # ceil mode: extended
    small = types.SimpleNamespace(size=2 * 3 * 64, shape=(2, 3, 8, 8))
    for mode in MODES:
        assert pool_ops._cudnn_supports(small, g, mode, None) is None
        assert pool_ops._cudnn_supports(small, gc, mode, None) is None
    batch = types.SimpleNamespace(size=2**31, shape=(2**21, 2**10, 1, 1))   # split (split.py)
    gbatch = pool_ops.make_geom("t", 2, batch.shape, 1, 1, 0)
    assert pool_ops._cudnn_supports(batch, gbatch, "max", None) is None
    big = types.SimpleNamespace(size=2**31, shape=(1, 2**11, 2**10, 2**10))
    gb = pool_ops.make_geom("t", 2, big.shape, 1, 1, 0)
    assert "32-bit" in pool_ops._cudnn_backward_supports(big, big, big, gb, "max", None)


def test_forced_without_cudnn_names_the_op(monkeypatch):
    from dnnkit import policy
    from dnnkit.cudnn.loader import CudnnStatus
    monkeypatch.setattr(policy, "cudnn_status", lambda: CudnnStatus(False, "no GPU here"))
    x = _x4()
    assert dnnkit.select_backend("pool2d", x, 2, backend="auto") == "numba"
    with pytest.raises(dnnkit.CudnnUnavailableError, match="pool2d.*no GPU here"):
        dnnkit.pool2d(x, 2, backend="cudnn")


def test_kernel_geometry_of_2d_is_3d_with_depth_1():
    g = pool_ops.make_geom("t", 2, (2, 3, 9, 8), (3, 2), (2, 1), (1, 0))
    assert g.y_shape == (2, 3, 5, 7) and g.window_size == 6
    assert g.kernel_geo() == (1, 9, 8, 1, 5, 7, 1, 3, 2, 1, 2, 1, 0, 1, 0)


class _FakeArray:
    def __init__(self, shape, dtype, addr):
        self.shape, self.dtype, self.size = shape, np.dtype(dtype), int(np.prod(shape))
        self.device_ctypes_pointer = types.SimpleNamespace(value=addr)


@pytest.fixture
def recorded(monkeypatch, no_shared_descriptors):
    """cuDNN's calls recorded instead of made; the shared descriptor caches start and end
    empty (their fake descriptors must not outlive the test)."""
    import importlib
    from dnnkit.cudnn import api, handle
    importlib.import_module("dnnkit.cudnn.pool")   # registers the prototypes
    calls = []

    def call(name, *args, context=""):
        calls.append((name, args))
    monkeypatch.setattr(api, "call", call)
    monkeypatch.setattr(api, "function", lambda name: lambda *a: calls.append((name, a)))
    monkeypatch.setattr(handle, "get", lambda stream: "HANDLE")
    return calls


def _ints(arr, n):
    return [arr[i] for i in range(n)]


@pytest.mark.parametrize("mode,mode_id,alpha", [("max", 0, 1.0), ("max_deterministic", 3, 1.0),
                                                ("average_inc_pad", 1, 1.0),
                                                ("average_exc_pad", 2, 1.0), ("sum", 1, 6.0)])
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
def test_cudnn_calls_in_order_with_the_right_arguments(recorded, mode, mode_id, alpha, dtype):
    from dnnkit.cudnn import pool as cpool
    calls = recorded
    x, y = _FakeArray((2, 3, 7, 6), dtype, 0x1000), _FakeArray((2, 3, 4, 3), dtype, 0x2000)
    dy, dx = _FakeArray((2, 3, 4, 3), dtype, 0x3000), _FakeArray((2, 3, 7, 6), dtype, 0x4000)
    cpool.forward(x, y, (3, 2), (1, 0), (2, 2), mode, 0)
    cpool.backward(x, y, dy, dx, (3, 2), (1, 0), (2, 2), mode, 0)
    cpool.forward(x, y, (3, 2), (1, 0), (2, 2), mode, 0)
    names = [c[0] for c in calls]
    # descriptors are made on first use and shared by later calls (none destroyed per call)
    made = ["cudnnCreatePoolingDescriptor", "cudnnSetPoolingNdDescriptor",
            "cudnnCreateTensorDescriptor", "cudnnSetTensorNdDescriptor",
            "cudnnCreateTensorDescriptor", "cudnnSetTensorNdDescriptor"]
    assert names == made + ["cudnnPoolingForward", "cudnnPoolingBackward",
                            "cudnnPoolingForward"]
    _, (_, mid, nan, nd, win, pad, st) = calls[1]
    assert (mid, nan, nd) == (mode_id, 1, 2)          # CUDNN_PROPAGATE_NAN = 1
    assert (_ints(win, 2), _ints(pad, 2), _ints(st, 2)) == ([3, 2], [1, 0], [2, 2])
    _, (_, dt, n, dims, strides) = calls[3]
    assert (n, _ints(dims, 4), _ints(strides, 4)) == (4, [2, 3, 7, 6], [126, 42, 6, 1])
    assert dt == {"float32": 0, "float64": 1, "float16": 2}[dtype]
    fwd = calls[6][1]
    assert fwd[0] == "HANDLE" and (fwd[4], fwd[7]) == (0x1000, 0x2000)
    ctype = ctypes.c_double if dtype == "float64" else ctypes.c_float
    for ref, want in ((fwd[2], alpha), (fwd[5], 0.0)):     # byref(alpha), byref(beta)
        assert type(ref._obj) is ctype and ref._obj.value == want
    bwd = calls[7][1]
    # y, dy, x, beta, dx: (yDesc, y, dyDesc, dy, xDesc, x, beta, dxDesc, dx)
    assert [bwd[i] for i in (4, 6, 8, 11)] == [0x2000, 0x3000, 0x1000, 0x4000]
    assert bwd[3] is bwd[5] and bwd[7] is bwd[10] and bwd[3] is not bwd[7]
    assert type(bwd[2]._obj) is ctype and (bwd[2]._obj.value, bwd[9]._obj.value) == (alpha, 0)
    assert calls[8][1][1] is fwd[1] and calls[8][1][3] is fwd[3]    # the same descriptors


def test_cudnn_ceil_helpers_describe_the_extended_corner(recorded):
    """extend: cudnnSetTensor of the whole extended buffer, then cudnnTransformTensor of x into
    its leading corner (x's dims, the extended buffer's strides); crop: the reverse; rescale:
    cudnnOpTensor MUL with the factor broadcast over N and C."""
    from dnnkit.cudnn import pool as cpool
    calls = recorded
    x, xe = _FakeArray((2, 3, 7, 6), "float32", 0x1000), _FakeArray((2, 3, 8, 7), "float32",
                                                                     0x2000)
    cpool.extend(x, xe, -np.inf, 0)
    names = [c[0] for c in calls]
    assert names.index("cudnnSetTensor") < names.index("cudnnTransformTensor")
    value = calls[names.index("cudnnSetTensor")][1][3]._obj.value
    assert value == -np.inf
    descs = [(_ints(a[3], a[2]), _ints(a[4], a[2])) for n, a in calls
             if n == "cudnnSetTensorNdDescriptor"]
    assert ([2, 3, 7, 6], [126, 42, 6, 1]) in descs and ([2, 3, 7, 6], [168, 56, 7, 1]) in descs
    tr = calls[names.index("cudnnTransformTensor")][1]
    assert (tr[3], tr[6]) == (0x1000, 0x2000)            # from x into xe
    del calls[:]
    cpool.crop(xe, x, 0)
    tr = [a for n, a in calls if n == "cudnnTransformTensor"][0]
    assert (tr[3], tr[6]) == (0x2000, 0x1000)            # from xe's corner into x
    del calls[:]
    y, t = _FakeArray((2, 3, 4, 3), "float32", 0x3000), _FakeArray((2, 3, 4, 3), "float32",
                                                                    0x4000)
    cpool.rescale(t, _FakeArray((1, 1, 4, 3), "float32", 0x5000), y, 0)
    op = [a for n, a in calls if n == "cudnnOpTensor"][0]
    assert (op[4], op[7], op[10]) == (0x4000, 0x5000, 0x3000)
    descs = [_ints(a[3], a[2]) for n, a in calls if n == "cudnnSetTensorNdDescriptor"]
    assert [1, 1, 4, 3] in descs
    mul = [a for n, a in calls if n == "cudnnSetOpTensorDescriptor"][0]
    assert mul[1] == 1                                   # CUDNN_OP_TENSOR_MUL


def _headers(real):
    inc = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(real.path))), "include")
    text = "".join(open(f).read() for f in sorted(glob.glob(os.path.join(inc, "cudnn*.h"))))
    if "cudnnPoolingForward" not in text:
        pytest.skip(f"no cuDNN headers in {inc}")
    return re.sub(r"/\*.*?\*/|//[^\n]*", "", text, flags=re.S)


def test_prototypes_and_modes_match_the_real_library_and_headers(real):
    from dnnkit.cudnn import api, pool as cpool
    names = [n for n in api.PROTOTYPES if "Pooling" in n]
    assert len(names) == 5
    lib = ctypes.CDLL(real.path)
    assert all(hasattr(lib, n) for n in names)
    text = _headers(real)
    for name in names:
        params = re.search(rf"\b{name}\s*\(([^;{{]*?)\)\s*;", text).group(1).strip()
        assert params.count(",") + 1 == len(api.PROTOTYPES[name]), name
    for mode, value in cpool.MODES.items():
        c = {"max": "MAX", "max_deterministic": "MAX_DETERMINISTIC",
             "average_inc_pad": "AVERAGE_COUNT_INCLUDE_PADDING", "sum":
             "AVERAGE_COUNT_INCLUDE_PADDING",
             "average_exc_pad": "AVERAGE_COUNT_EXCLUDE_PADDING"}[mode]
        assert int(re.search(rf"\bCUDNN_POOLING_{c}\s*=\s*(\d+)", text).group(1)) == value


def test_selfcheck_rows_pass_on_numba():
    from dnnkit import selfcheck
    ops = ("pool2d", "pool3d", "pool2d_backward", "pool3d_backward")
    assert {c.op for c in selfcheck.cases()} >= set(ops)
    rows = [r for r in selfcheck.run(dtypes=("float32",), ops_=ops) if r["backend"] == "numba"]
    assert len(rows) == 2 * (5 + 3 + 3) and all(r["status"] == "ok" for r in rows), rows
    assert sum(r["variant"].endswith(" ceil") for r in rows) == 6


def test_deterministic_flag_makes_cudnn_max_deterministic(monkeypatch):
    from numba import cuda
    from dnnkit import config
    from dnnkit.cudnn import pool as cpool
    seen = []
    monkeypatch.setattr(cpool, "forward", lambda *a: seen.append(a[5]))
    monkeypatch.setattr(cpool, "backward", lambda *a: seen.append(a[7]))
    x = cuda.to_device(np.ones((1, 1, 4, 4), np.float32))
    y = cuda.to_device(np.ones((1, 1, 2, 2), np.float32))
    g, s = pool_ops.make_geom("t", 2, (1, 1, 4, 4), 2, 2, 0), cuda.default_stream()
    for flag in (False, True):
        with config.change_flags({"dnn.deterministic": flag}):
            pool_ops._forward_cudnn(x, g, "max", s)
            pool_ops._backward_cudnn(x, y, y, g, "max", s)
            pool_ops._forward_cudnn(x, g, "average_exc_pad", s)
    assert seen == ["max", "max", "average_exc_pad"] + ["max_deterministic"] * 2 + \
        ["average_exc_pad"]
