"""Pooling on a real GPU: cuDNN vs Numba vs float64 at realistic sizes, every mode, forward and
backward, floor and ceil mode; the tie rule of max_deterministic; what cuDNN's max does with
ties and NaN."""

import numpy as np
import pytest

import dnnkit
from dnnkit import reference
from dnnkit.ops.pool import MODES, tie_free
from dnnkit.testing import assert_backends_agree

pytestmark = [pytest.mark.gpu, pytest.mark.cudnn]

DTYPES = ["float32", "float16", "float64"]
TOL = {"float16": 5e-3, "float32": 1e-5, "float64": 1e-12}   # rel. error vs float64
SHAPES = [  # (x, window, stride, padding)
    ((64, 64, 112, 112), 3, 2, 1),                   # ResNet's stem pooling
    ((32, 128, 56, 56), 2, 2, 0),
    ((32, 512, 7, 7), 7, 1, 0),                       # global average pooling
    ((16, 32, 33, 47), (3, 2), (1, 2), (1, 0)),
    ((8, 32, 16, 56, 56), 3, 2, 1),
    ((4, 16, 9, 17, 13), (2, 3, 3), (2, 1, 3), (0, 1, 1)),
]


def _fns(nd):
    return (dnnkit.pool2d, dnnkit.pool2d_backward) if nd == 2 else \
        (dnnkit.pool3d, dnnkit.pool3d_backward)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape", SHAPES, ids=[f"s{i}" for i in range(len(SHAPES))])
def test_backends_agree_with_each_other_and_float64(rng, shape, mode, dtype):
    """max: tie-free data (cuDNN's MAX breaks ties as it likes); max_deterministic: random
    data, whose float16 and float32 ties both backends must resolve alike."""
    xs, k, s, p = shape
    fwd, bwd = _fns(len(xs) - 2)
    x = tie_free(rng, xs, dtype, period=max(4, *np.atleast_1d(k))) if mode == "max" else \
        rng.standard_normal(xs).astype(dtype)
    y = assert_backends_agree(fwd, x, k, s, p, mode)
    x64 = x.astype(np.float64)
    assert reference.rel_error(y.copy_to_host(), reference.pool_forward(x64, k, s, p, mode)) \
        <= TOL[dtype]
    dy = rng.standard_normal(y.shape).astype(dtype)
    dx = assert_backends_agree(bwd, x, y, dy, k, s, p, mode).copy_to_host()
    ref = reference.pool_backward(x64, dy.astype(np.float64), k, s, p, mode)
    assert reference.rel_error(dx, ref) <= 2 * TOL[dtype]


CEIL_SHAPES = [  # (x, window, stride, padding): ceil mode adds a window in some dim
    ((32, 64, 112, 112), 3, 2, 0),                  # GoogLeNet's (Caffe) max pooling
    ((16, 32, 56, 56), 3, 2, 1),
    ((16, 32, 34, 48), (3, 2), (2, 3), (1, 0)),
    ((8, 32, 15, 28, 28), 3, 2, 1),
    ((4, 16, 9, 17, 13), (2, 3, 3), (2, 2, 3), (0, 1, 1)),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape", CEIL_SHAPES, ids=[f"c{i}" for i in range(len(CEIL_SHAPES))])
def test_ceil_mode_backends_agree_with_each_other_and_float64(rng, shape, mode, dtype):
    """cuDNN pools x extended at its far edges (and rescales the average modes): both backends
    must give the float64 reference's ceil-mode result, forward and backward."""
    xs, k, s, p = shape
    fwd, bwd = _fns(len(xs) - 2)
    x = tie_free(rng, xs, dtype, period=max(4, *np.atleast_1d(k))) if mode == "max" else \
        rng.standard_normal(xs).astype(dtype)
    y = assert_backends_agree(fwd, x, k, s, p, mode, ceil_mode=True)
    x64 = x.astype(np.float64)
    ref = reference.pool_forward(x64, k, s, p, mode, ceil_mode=True)
    assert y.shape == ref.shape and ref.shape[2:] != reference.pool_windows(xs, k, s, p)[0]
    assert reference.rel_error(y.copy_to_host(), ref) <= TOL[dtype]
    dy = rng.standard_normal(y.shape).astype(dtype)
    dx = assert_backends_agree(bwd, x, y, dy, k, s, p, mode, ceil_mode=True).copy_to_host()
    ref = reference.pool_backward(x64, dy.astype(np.float64), k, s, p, mode, ceil_mode=True)
    assert reference.rel_error(dx, ref) <= 2 * TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
def test_ceil_mode_max_deterministic_ties_and_minus_inf_match_numba_bitwise(rng, dtype):
    """Integer data (ties everywhere) and a block of -inf reaching into the overhanging
    windows: the extension's -inf fill must win no maximum and draw no gradient, so cuDNN and
    Numba agree bit for bit, and y is -inf where a window holds only -inf."""
    xs, k, s, p = (16, 32, 56, 56), 3, 2, 0
    x = rng.integers(-2, 3, xs).astype(dtype)
    x[:, :4, -3:, :] = -np.inf                     # the last row of windows: all -inf
    ys = [dnnkit.pool2d(x, k, s, p, "max_deterministic", ceil_mode=True, backend=b)
          for b in ("cudnn", "numba")]
    y = ys[1].copy_to_host()
    np.testing.assert_array_equal(ys[0].copy_to_host(), y)
    assert np.isneginf(y[:, :4, -1, :]).all()
    dy = rng.integers(-8, 9, y.shape).astype(dtype)
    got, want = (dnnkit.pool2d_backward(x, yb, dy, k, s, p, "max_deterministic", ceil_mode=True,
                                        backend=b).copy_to_host()
                 for yb, b in zip(ys, ("cudnn", "numba")))
    finite = np.isfinite(y).all(axis=(2, 3))        # planes without -inf windows
    np.testing.assert_array_equal(got[finite], want[finite])
    np.testing.assert_array_equal(want, reference.pool_backward(x, dy, k, s, p, "max", True))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("geo", [((32, 64, 56, 56), 3, 2, 1), ((32, 64, 56, 56), 2, 1, 1),
                                 ((8, 16, 12, 28, 28), 3, 2, 1)], ids=["3/2/1", "2/1/1", "3d"])
def test_max_deterministic_resolves_ties_like_numba_bitwise(rng, geo, dtype):
    """Five integer levels: nearly every window holds tied maxima. Integer dy: every sum is
    exact whatever its order, so the two backends must agree bit for bit."""
    xs, k, s, p = geo
    fwd, bwd = _fns(len(xs) - 2)
    x = rng.integers(-2, 3, xs).astype(dtype)
    y = fwd(x, k, s, p, "max_deterministic", backend="cudnn")
    dy = rng.integers(-8, 9, y.shape).astype(dtype)
    got = bwd(x, y, dy, k, s, p, "max_deterministic", backend="cudnn").copy_to_host()
    want = bwd(x, y, dy, k, s, p, "max_deterministic", backend="numba").copy_to_host()
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(want, reference.pool_backward(x, dy, k, s, p, "max"))


def _maxima(x, y, k, s, p):
    """Mask of the inputs equal to the maximum of some window that covers them."""
    _, spans, _ = reference.pool_windows(x.shape, k, s, p)
    mask = np.zeros(x.shape, bool)
    for o, sl in spans:
        at = (slice(None), slice(None)) + sl
        mask[at] |= x[at] == y[(slice(None), slice(None)) + o][(...,) + (None,) * len(sl)]
    return mask


def test_cudnn_max_routes_every_gradient_to_some_maximum(rng):
    """CUDNN_POOLING_MAX may pick any of tied maxima: the gradient must still land on maxima
    only, and none of it may be lost or duplicated (integer data: exact sums)."""
    x = rng.integers(-2, 3, (16, 32, 28, 28)).astype(np.float32)
    y = dnnkit.pool2d(x, 3, 2, 1, "max", backend="cudnn")
    dy = rng.integers(1, 9, y.shape).astype(np.float32)
    dx = dnnkit.pool2d_backward(x, y, dy, 3, 2, 1, "max", backend="cudnn").copy_to_host()
    assert not dx[~_maxima(x, y.copy_to_host(), 3, 2, 1)].any()
    np.testing.assert_array_equal(dx.sum(axis=(2, 3)), dy.sum(axis=(2, 3)))


def _nan_covered(x, k, s, p):
    """Mask of the inputs covered by a window that holds a NaN."""
    _, spans, _ = reference.pool_windows(x.shape, k, s, p)
    mask = np.zeros(x.shape, bool)
    for _o, sl in spans:
        at = (slice(None), slice(None)) + sl
        nan = np.isnan(x[at]).any(axis=tuple(range(2, x.ndim)), keepdims=True)
        mask[at] |= nan
    return mask


@pytest.mark.parametrize("mode", MODES)
def test_nan_propagates_on_both_backends(rng, mode, record_property):
    x = rng.standard_normal((8, 16, 30, 30)).astype(np.float32)
    x.reshape(-1)[rng.choice(x.size, 60, replace=False)] = np.nan
    y = assert_backends_agree(dnnkit.pool2d, x, 3, 2, 1, mode)   # NaN positions must match
    assert np.isnan(y.copy_to_host()).sum() > 60
    dy = rng.standard_normal(y.shape).astype(np.float32)
    got = dnnkit.pool2d_backward(x, y, dy, 3, 2, 1, mode, backend="cudnn").copy_to_host()
    want = dnnkit.pool2d_backward(x, y, dy, 3, 2, 1, mode, backend="numba").copy_to_host()
    if not mode.startswith("max"):   # average/sum never look at x
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        return
    # Outside the windows that hold a NaN the two must agree; inside, record what cuDNN does
    # (docs/pool.md: Numba routes a NaN window's dy to its first NaN).
    covered = _nan_covered(x, 3, 2, 1)
    np.testing.assert_allclose(got[~covered], want[~covered], rtol=1e-5, atol=1e-6)
    same = np.array_equal(got[covered], want[covered])
    at_nan = np.count_nonzero(got[np.isnan(x)])
    record_property("cudnn_max_nan_backward", f"matches Numba's first-NaN rule: {same}; "
                    f"nonzero dx at {at_nan} of {np.isnan(x).sum()} NaN inputs")
    print(f"\n{mode}: cuDNN backward in NaN windows matches Numba's first-NaN routing: {same} "
          f"(nonzero dx at {at_nan} of {np.isnan(x).sum()} NaN inputs)")


@pytest.mark.parametrize("backend", ["numba", "cudnn"])
def test_non_default_stream_and_empty_batch(rng, backend):
    from numba import cuda
    s = cuda.stream()
    x = rng.standard_normal((16, 32, 40, 40)).astype(np.float32)
    d = cuda.to_device(x, stream=s)
    y = dnnkit.pool2d(d, 3, 2, 1, "average_exc_pad", backend=backend, stream=s)
    dx = dnnkit.pool2d_backward(d, y, y, 3, 2, 1, "average_exc_pad", backend=backend, stream=s)
    s.synchronize()
    ref = reference.pool_forward(x, 3, 2, 1, "average_exc_pad")
    assert reference.rel_error(y.copy_to_host(), ref) <= 1e-5
    assert reference.rel_error(dx.copy_to_host(),
                               reference.pool_backward(x, ref, 3, 2, 1, "average_exc_pad")) <= 1e-5
    e = dnnkit.pool2d(np.zeros((0, 3, 8, 8), np.float32), 2, backend=backend)
    assert e.shape == (0, 3, 4, 4)
