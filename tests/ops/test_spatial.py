"""Spatial transformer: affine grid and bilinear sampler, forward and backward, against the
float64 reference and an independent per-point evaluation of the equations; identity and
one-pixel translation; finite differences wrt img, grid and theta; deterministic mode;
argument errors."""

import ctypes
import glob
import math
import os
import re
import types

import numpy as np
import pytest
from numba import cuda

import dnnkit
from dnnkit import config
from dnnkit import reference
from dnnkit.kernels.spatial import _axis
from tests.conftest import DTYPES, REL_TOL, backend_params

SHAPES = [  # (img shape (N, C, H, W), output (H', W'))
    ((2, 3, 5, 4), (4, 3)),
    ((1, 2, 3, 6), (1, 5)),      # a 1-point output dimension (coordinate -1, as cuDNN)
]
_TOL16 = 1e-2   # float16 grids round coordinates to ~1e-3 pixel


def _theta(rng, n, scale=0.2):
    eye = np.tile(np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]), (n, 1, 1))
    return eye + scale * rng.standard_normal((n, 2, 3))


def _host(a):
    return a.copy_to_host() if hasattr(a, "copy_to_host") else np.asarray(a)


def _naive_sample(img, grid):
    """The sampler's equations evaluated point by point (align-corners convention)."""
    n_, c_, h, w = img.shape
    out = np.zeros((n_, c_) + grid.shape[1:3])
    for n in range(n_):
        for i in range(grid.shape[1]):
            for j in range(grid.shape[2]):
                u = (grid[n, i, j, 0] + 1) * (w - 1) / 2
                v = (grid[n, i, j, 1] + 1) * (h - 1) / 2
                u0, v0 = math.floor(u), math.floor(v)
                for a in (0, 1):
                    for b in (0, 1):
                        if 0 <= u0 + a < w and 0 <= v0 + b < h:
                            wt = (u - u0 if a else 1 - (u - u0)) * (v - v0 if b else 1 - (v - v0))
                            out[n, :, i, j] += wt * img[n, :, v0 + b, u0 + a]
    return out


@cuda.jit
def _axis_probe(p, n, out, acc):
    """out[i] = kernels.spatial._axis(p[i], n) (the simulator's ``cuda`` is a kernel global)."""
    i = cuda.threadIdx.x
    if i < p.size:
        k0, k1, in0, in1, frac = _axis(p[i], n, acc[0])
        out[i, 0], out[i, 1], out[i, 2], out[i, 3], out[i, 4] = k0, k1, in0, in1, frac


@pytest.mark.filterwarnings("ignore::RuntimeWarning")   # the simulator's inf - inf
def test_tap_axis_is_the_exact_floor_clamped():
    """kernels.spatial._axis, the samplers' per-axis taps: floor exact just below an integer
    (truncating p + 2 instead rounded 0.99999994 up to 1: slopes of the wrong pixel pair, a
    GPU backend mismatch on dgrid), both taps clamped into the side, the inside flags, the
    fraction (0 for a finite point beyond the side, NaN for an infinite or NaN one)."""
    n = 5
    below = [np.nextafter(np.float32(k), np.float32(-np.inf)) for k in range(-2, n + 3)]
    p = np.array(below + list(range(-3, n + 3)) + [-2.5, -1.5, -0.5, 0.25, 4.5, 5.5, 6.5,
                                                   -1e30, 1e30, np.inf, -np.inf, np.nan],
                 np.float32)
    out = np.zeros((p.size, 5), np.float32)
    _axis_probe[1, 64](p, n, out, np.zeros(1, np.float32))
    fin = np.isfinite(p)
    fl = np.floor(p.astype(np.float64))
    clamp = lambda v: np.clip(v, 0, n - 1)                         # noqa: E731
    np.testing.assert_array_equal(out[fin, 0], clamp(fl[fin]))
    np.testing.assert_array_equal(out[fin, 1], clamp(fl[fin] + 1))
    np.testing.assert_array_equal(out[:, 2], fin & (fl >= 0) & (fl <= n - 1))
    np.testing.assert_array_equal(out[:, 3], fin & (fl >= -1) & (fl <= n - 2))
    near = fin & (p >= -2) & (p <= n + 1)
    np.testing.assert_array_equal(out[near, 4], (p - fl)[near])
    assert (out[fin & ~near, 4] == 0).all()
    assert np.isnan(out[~fin, 4]).all()
    assert ((out[:, :2] >= 0) & (out[:, :2] <= n - 1)).all()      # always a valid index


def test_numba_sampler_refuses_planes_past_its_32_bit_offsets():
    """The samplers index within a plane in 32 bits: H*W >= 2**32 (or a side of 2**31 - 1)
    is refused by name, not read out of bounds (the launcher's check reads only shapes)."""
    from dnnkit.ops import spatial_numba
    img = lambda h, w: types.SimpleNamespace(shape=(1, 2, h, w))   # noqa: E731
    assert spatial_numba.kernel_geo("grid_sample", img(2**16, 2**16 - 1), 3, 4) == (1, 2, 2**16, 2**16 - 1, 3, 4)
    for h, w in [(2**16, 2**16), (1, 2**31 - 1), (2**31, 1)]:
        with pytest.raises(ValueError, match=rf"grid_sample: .*2\*\*32.*H={h}, W={w}"):
            spatial_numba.kernel_geo("grid_sample", img(h, w), 3, 4)


def test_reference_follows_the_equations(rng):
    img = rng.standard_normal((2, 2, 4, 5))
    theta = _theta(rng, 2, 0.5)
    grid = reference.affine_grid(theta, (2, 2, 3, 4))
    xs, ys = np.linspace(-1, 1, 4), np.linspace(-1, 1, 3)
    want = np.einsum("nck,hwk->nhwc", theta, np.stack(
        np.broadcast_arrays(xs[None, :], ys[:, None], 1.0), axis=-1))
    np.testing.assert_allclose(grid, want, atol=1e-14)
    np.testing.assert_allclose(reference.grid_sample(img, grid), _naive_sample(img, grid),
                               atol=1e-13)
    assert np.array_equal(reference.spatial_grid_coords(1), [-1.0])    # cuDNN's 1-point rule


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("det", [False, True], ids=["atomic", "det"])
@pytest.mark.parametrize("shapes", SHAPES, ids=["4x3", "1x5"])
def test_match_float64_reference(rng, shapes, det, dtype, backend):
    config.set("dnn.deterministic", det)
    (n, c, h, w), (oh, ow) = shapes
    img = rng.standard_normal((n, c, h, w)).astype(dtype)
    theta = _theta(rng, n).astype(dtype)
    tol = max(REL_TOL[dtype], _TOL16 if dtype == "float16" else 0)
    with dnnkit.trace() as t:
        grid = dnnkit.affine_grid(theta, (n, c, oh, ow), backend=backend)
    assert t.backends() == [backend]
    g = _host(grid)
    assert g.shape == (n, oh, ow, 2) and g.dtype == np.dtype(dtype)
    assert reference.rel_error(g, reference.affine_grid(theta, (n, c, oh, ow))) <= tol
    y = _host(dnnkit.grid_sample(img, grid, backend=backend))
    assert y.shape == (n, c, oh, ow) and y.dtype == np.dtype(dtype)
    assert reference.rel_error(y, reference.grid_sample(img, g)) <= tol
    dy = rng.standard_normal(y.shape).astype(dtype)
    if det and backend == "cudnn":
        # cuDNN's sampler backward is not documented as deterministic: forcing it refuses
        with pytest.raises(dnnkit.CudnnUnavailableError, match="deterministic"):
            dnnkit.grid_sample_backward(img, grid, dy, backend=backend)
        return
    dimg, dgrid = dnnkit.grid_sample_backward(img, grid, dy, backend=backend)
    rimg, rgrid = reference.grid_sample_backward(img, g, dy)
    assert _host(dimg).dtype == np.dtype(dtype) and _host(dgrid).shape == g.shape
    assert reference.rel_error(_host(dimg), rimg) <= tol
    assert reference.rel_error(_host(dgrid), rgrid) <= 4 * tol   # slopes: differences of pixels
    dtheta = _host(dnnkit.affine_grid_backward(dgrid, backend=backend))
    assert dtheta.shape == (n, 2, 3)
    assert reference.rel_error(dtheta, reference.affine_grid_backward(_host(dgrid))) <= 4 * tol


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("dtype", DTYPES)
def test_spatial_transformer_composes_and_scales(rng, dtype, backend):
    img = rng.standard_normal((2, 2, 5, 4)).astype(dtype)
    theta = _theta(rng, 2).astype(dtype)
    y = _host(dnnkit.spatial_transformer(img, theta, scale_height=0.5, scale_width=1.3,
                                         backend=backend))
    assert y.shape == (2, 2, 3, 6)   # ceil(5 * 0.5), ceil(4 * 1.3)
    tol = max(REL_TOL[dtype], _TOL16 if dtype == "float16" else 0)
    assert reference.rel_error(y, reference.spatial_transformer(img, theta, 0.5, 1.3)) <= tol


@pytest.mark.parametrize("dtype", DTYPES)
def test_numba_channel_trips_grid_in_the_sampler_and_dtheta_over_blocks(rng, dtype):
    """The Numba paths' splits: more channels than a sampler trip loads (kernels/spatial.py
    MAX_CB), the spatial transformer's grid computed inside the sampler (no grid array), and
    dtheta summed by several blocks per image (143 and 256 points: a partial last trip)."""
    from dnnkit.kernels.spatial import MAX_CB
    n, c, h, w = 1, MAX_CB + 1, 6, 7
    tol = max(REL_TOL[dtype], _TOL16 if dtype == "float16" else 0)
    img = rng.standard_normal((n, c, h, w)).astype(dtype)
    theta = _theta(rng, n).astype(dtype)
    y = _host(dnnkit.spatial_transformer(img, theta, scale_height=2.0, scale_width=1.5,
                                         backend="numba"))
    assert y.shape == (n, c, 12, 11)
    assert reference.rel_error(y, reference.spatial_transformer(img, theta, 2.0, 1.5)) <= tol
    grid = _host(dnnkit.affine_grid(theta, y.shape, backend="numba"))
    two_step = _host(dnnkit.grid_sample(img, grid, backend="numba"))
    assert reference.rel_error(y, two_step) <= tol
    dy = rng.standard_normal(y.shape).astype(dtype)
    dimg, dgrid = (_host(a) for a in dnnkit.grid_sample_backward(img, grid, dy,
                                                                  backend="numba"))
    rimg, rgrid = reference.grid_sample_backward(img, grid, dy)
    assert reference.rel_error(dimg, rimg) <= tol and reference.rel_error(dgrid, rgrid) <= 4 * tol
    for shape in ((n, 13, 11, 2), (2, 16, 16, 2)):
        dg = rng.standard_normal(shape).astype(dtype)
        dtheta = _host(dnnkit.affine_grid_backward(dg, backend="numba"))
        assert reference.rel_error(dtheta, reference.affine_grid_backward(dg)) <= tol
        # the split depends on the image's size only: image 0's dtheta, bit for bit, alone
        alone = _host(dnnkit.affine_grid_backward(np.ascontiguousarray(dg[:1]),
                                                  backend="numba"))
        assert np.array_equal(alone[0], dtheta[0])


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("dtype", DTYPES)
def test_identity_and_one_pixel_translation(rng, dtype, backend):
    # H-1 and W-1 powers of two: the grid coordinates are exact in every dtype, so the
    # identity is exact (align corners: every pixel, borders included)
    n, c, h, w = 2, 2, 5, 3
    img = rng.standard_normal((n, c, h, w)).astype(dtype)
    eye = np.tile(np.array([[1.0, 0, 0], [0, 1.0, 0]]), (n, 1, 1))
    y = _host(dnnkit.spatial_transformer(img, eye.astype(dtype), backend=backend))
    assert np.array_equal(y, img)
    # other sizes: exact up to the rounding of the coordinates
    img2 = rng.standard_normal((1, 1, 4, 7)).astype(dtype)
    y2 = _host(dnnkit.spatial_transformer(img2, eye[:1].astype(dtype), backend=backend))
    assert reference.rel_error(y2, img2) <= (2e-3 if dtype == "float16" else REL_TOL[dtype])
    shift = eye.copy()
    shift[:, 0, 2] = 2.0 / (w - 1)   # x + one pixel: output column j reads column j + 1
    y = _host(dnnkit.spatial_transformer(img, shift.astype(dtype), backend=backend)).astype(
        np.float64)
    tol = 1e-3 if dtype == "float16" else 1e-6 if dtype == "float32" else 1e-14
    np.testing.assert_allclose(y[..., :-1], img[..., 1:].astype(np.float64), atol=tol * 10)
    assert np.all(np.abs(y[..., -1]) <= tol * 10)   # reads column w: outside, zero


# ---------------------------------------------------------------- finite differences

def _grid_off_boundaries(rng, n, oh, ow, h, w):
    """A grid whose pixel coordinates have fractions in [0.2, 0.8] (bilinear is smooth there),
    some beyond the image (partly or wholly outside taps)."""
    u = rng.integers(-2, w + 1, (n, oh, ow)) + rng.uniform(0.2, 0.8, (n, oh, ow))
    v = rng.integers(-2, h + 1, (n, oh, ow)) + rng.uniform(0.2, 0.8, (n, oh, ow))
    return np.stack([2 * u / (w - 1) - 1, 2 * v / (h - 1) - 1], axis=-1)


def _theta_off_boundaries(rng, n, oh, ow, h, w):
    for _ in range(200):
        theta = _theta(rng, n, 0.3)
        g = reference.affine_grid(theta, (n, 1, oh, ow))
        u, v = (g[..., 0] + 1) * (w - 1) / 2, (g[..., 1] + 1) * (h - 1) / 2
        frac = np.concatenate([(u % 1).ravel(), (v % 1).ravel()])
        if np.min(np.minimum(frac, 1 - frac)) > 0.05:
            return theta
    raise AssertionError("no theta found away from pixel boundaries")


@pytest.mark.parametrize("det", [False, True], ids=["atomic", "det"])
def test_finite_differences(rng, det):
    config.set("dnn.deterministic", det)
    n, c, h, w, oh, ow = 2, 2, 4, 5, 3, 4
    img = rng.standard_normal((n, c, h, w))
    grid = _grid_off_boundaries(rng, n, oh, ow, h, w)
    dy = rng.standard_normal((n, c, oh, ow))
    dimg, dgrid = (_host(a) for a in dnnkit.grid_sample_backward(img, grid, dy,
                                                                 backend="numba"))
    eps = 1e-6

    def loss_of(im, gr):
        return float(np.sum(dy * reference.grid_sample(im, gr)))

    for arr, grad in ((img, dimg), (grid, dgrid)):
        for idx in list(np.ndindex(arr.shape))[::3]:
            plus, minus = arr.copy(), arr.copy()
            plus[idx] += eps
            minus[idx] -= eps
            args = ((plus, grid), (minus, grid)) if arr is img else ((img, plus), (img, minus))
            fd = (loss_of(*args[0]) - loss_of(*args[1])) / (2 * eps)
            assert abs(fd - grad[idx]) <= 1e-6 * (1 + abs(fd)), (idx, fd, grad[idx])
    # theta, through the whole transformer: dtheta = affine_grid_backward(dgrid)
    theta = _theta_off_boundaries(rng, n, oh, ow, h, w)
    out = (n, c, oh, ow)
    g = dnnkit.affine_grid(theta, out, backend="numba")
    _, dg = dnnkit.grid_sample_backward(img, g, dy, backend="numba")
    dtheta = _host(dnnkit.affine_grid_backward(dg, backend="numba"))
    for idx in np.ndindex(theta.shape):
        plus, minus = theta.copy(), theta.copy()
        plus[idx] += eps
        minus[idx] -= eps
        fd = (np.sum(dy * reference.spatial_transformer(img, plus, oh / h, ow / w))
              - np.sum(dy * reference.spatial_transformer(img, minus, oh / h, ow / w))) / (2 * eps)
        assert abs(fd - dtheta[idx]) <= 1e-6 * (1 + abs(fd)), (idx, fd, dtheta[idx])


# ---------------------------------------------------------------- determinism

@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_deterministic_mode_is_bitwise_repeatable(rng, dtype):
    config.set("dnn.deterministic", True)
    img = rng.standard_normal((1, 2, 3, 4)).astype(dtype)
    # a zoom-out: many output points share each input pixel, so order matters
    grid = (0.4 * rng.uniform(-1, 1, (1, 5, 6, 2))).astype(dtype)
    dy = rng.standard_normal((1, 2, 5, 6)).astype(dtype)
    with dnnkit.trace() as t:
        first = [_host(a) for a in dnnkit.grid_sample_backward(img, grid, dy, backend="numba")]
    assert t[0].algo == "gather_rows"
    for _ in range(2):
        again = [_host(a) for a in dnnkit.grid_sample_backward(img, grid, dy, backend="numba")]
        for a, b in zip(first, again):
            assert np.array_equal(a.view(np.uint8), b.view(np.uint8))
    # under auto, the deterministic flag keeps the sampler backward off cuDNN
    assert dnnkit.select_backend("grid_sample_backward", img, grid, dy) == "numba"


# ---------------------------------------------------------------- errors

def test_argument_errors():
    img = np.zeros((2, 1, 3, 3), np.float32)
    theta = np.zeros((2, 2, 3), np.float32)
    grid = np.zeros((2, 2, 2, 2), np.float32)
    dy = np.zeros((2, 1, 2, 2), np.float32)
    bad = [
        (ValueError, "theta must be", lambda: dnnkit.affine_grid(np.zeros((2, 3, 3)),
                                                                (2, 1, 2, 2))),
        (ValueError, "3-D", lambda: dnnkit.affine_grid(np.zeros((2, 6)), (2, 1, 2, 2))),
        (TypeError, "out_shape", lambda: dnnkit.affine_grid(theta, (2, 1, 2))),
        (TypeError, "out_shape", lambda: dnnkit.affine_grid(theta, 5)),
        (TypeError, "out_shape", lambda: dnnkit.affine_grid(theta, (2, 1, 2.0, 2))),
        (ValueError, "N = 3", lambda: dnnkit.affine_grid(theta, (3, 1, 2, 2))),
        (ValueError, ">= 1", lambda: dnnkit.affine_grid(theta, (2, 1, 0, 2))),
        (TypeError, "floating-point", lambda: dnnkit.affine_grid(np.zeros((2, 2, 3), int),
                                                                 (2, 1, 2, 2))),
        (ValueError, "4-D", lambda: dnnkit.grid_sample(img[0], grid)),
        (ValueError, "grid must be", lambda: dnnkit.grid_sample(img, grid[..., :1])),
        (ValueError, "grid must be", lambda: dnnkit.grid_sample(img, grid[:1])),
        (TypeError, "dtype", lambda: dnnkit.grid_sample(img, grid.astype(np.float64))),
        (ValueError, "dy has shape", lambda: dnnkit.grid_sample_backward(img, grid, dy[:, :, :1])),
        (TypeError, "dtype", lambda: dnnkit.grid_sample_backward(img, grid, dy.astype(np.float16))),
        (ValueError, "dgrid must be", lambda: dnnkit.affine_grid_backward(grid[..., :1])),
        (ValueError, "scale_height", lambda: dnnkit.spatial_transformer(img, theta,
                                                                         scale_height=0)),
        (ValueError, "scale_width", lambda: dnnkit.spatial_transformer(img, theta,
                                                                        scale_width=-1.0)),
        (ValueError, "scale_width", lambda: dnnkit.spatial_transformer(img, theta,
                                                                        scale_width=np.inf)),
        (TypeError, "scale_height", lambda: dnnkit.spatial_transformer(img, theta,
                                                                        scale_height="2")),
        (TypeError, "dtype", lambda: dnnkit.spatial_transformer(img, theta.astype(np.float64))),
        (ValueError, "N = 1", lambda: dnnkit.spatial_transformer(img, theta[:1])),
        (ValueError, "3-D", lambda: dnnkit.spatial_transformer(img, theta[0])),
        (ValueError, "4-D", lambda: dnnkit.spatial_transformer(img[0], theta)),
    ]
    for exc, words, fn in bad:
        with pytest.raises(exc, match=words):
            fn()


def test_cudnn_layer_declares_the_calls():
    from dnnkit.cudnn import api
    from dnnkit.cudnn import spatial as cs
    from dnnkit.cudnn.descriptors import Descriptor
    for name in ("cudnnCreateSpatialTransformerDescriptor",
                 "cudnnSetSpatialTransformerNdDescriptor",
                 "cudnnDestroySpatialTransformerDescriptor",
                 "cudnnSpatialTfGridGeneratorForward", "cudnnSpatialTfGridGeneratorBackward",
                 "cudnnSpatialTfSamplerForward", "cudnnSpatialTfSamplerBackward"):
        assert name in api.PROTOTYPES
    assert len(api.PROTOTYPES["cudnnSpatialTfSamplerBackward"]) == 14
    assert issubclass(cs.SpatialTransformerDescriptor, Descriptor)


# ---------------------------------------------------------------- the cuDNN layer (stubbed)

class _FakeArray:
    def __init__(self, shape, dtype, addr):
        self.shape, self.dtype, self.size = shape, np.dtype(dtype), int(np.prod(shape))
        self.device_ctypes_pointer = types.SimpleNamespace(value=addr)


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
def test_cudnn_calls_with_the_right_arguments(monkeypatch, no_shared_descriptors, dtype):
    from dnnkit.cudnn import api, handle
    from dnnkit.cudnn import spatial as cs
    calls = []
    monkeypatch.setattr(api, "call", lambda name, *a, context="": calls.append((name, a)))
    monkeypatch.setattr(api, "function", lambda name: lambda *a: calls.append((name, a)))
    monkeypatch.setattr(handle, "get", lambda stream: "HANDLE")
    img, grid = _FakeArray((2, 3, 7, 6), dtype, 0x1000), _FakeArray((2, 4, 5, 2), dtype, 0x2000)
    dy, dimg = _FakeArray((2, 3, 4, 5), dtype, 0x3000), _FakeArray((2, 3, 7, 6), dtype, 0x4000)
    dgrid, theta = _FakeArray((2, 4, 5, 2), dtype, 0x5000), _FakeArray((2, 2, 3), dtype, 0x6000)
    cs.grid_forward(theta, grid, 0)
    set_st = calls[1][1]
    assert calls[1][0] == "cudnnSetSpatialTransformerNdDescriptor"
    assert set_st[1:4] == (0, {"float32": 0, "float64": 1, "float16": 2}[dtype], 4)
    assert [set_st[4][i] for i in range(4)] == [2, 1, 4, 5]
    assert calls[2][0] == "cudnnSpatialTfGridGeneratorForward"
    assert list(calls[2][1][2:]) == [0x6000, 0x2000]
    calls.clear()
    cs.sampler_backward(img, grid, dy, dimg, dgrid, 0)
    name, a = [c for c in calls if c[0] == "cudnnSpatialTfSamplerBackward"][0]
    assert len(a) == 14 and a[0] == "HANDLE"
    # (h, st, alpha, xDesc, x, beta, dxDesc, dx, alphaDgrid, dyDesc, dy, grid, betaDgrid, dgrid)
    assert [a[i] for i in (4, 7, 10, 11, 13)] == [0x1000, 0x4000, 0x3000, 0x2000, 0x5000]
    ctype = ctypes.c_double if dtype == "float64" else ctypes.c_float
    assert [(type(a[i]._obj), a[i]._obj.value) for i in (2, 5, 8, 12)] == \
        [(ctype, 1.0), (ctype, 0.0), (ctype, 1.0), (ctype, 0.0)]
    assert a[3] is a[6] and a[3] is not a[9]
    st_dims = [c for c in calls if c[0] == "cudnnSetSpatialTransformerNdDescriptor"][0][1][4]
    assert [st_dims[i] for i in range(4)] == [2, 3, 4, 5]   # the output (dy) dims


def test_cudnn_prototypes_match_the_real_library_and_headers(real):
    from dnnkit.cudnn import api
    from dnnkit.cudnn import spatial as cs
    names = [n for n in api.PROTOTYPES if "SpatialT" in n]
    assert len(names) == 7
    lib = ctypes.CDLL(real.path)
    assert all(hasattr(lib, n) for n in names)
    inc = os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(real.path))), "include")
    text = "".join(open(f).read() for f in sorted(glob.glob(os.path.join(inc, "cudnn*.h"))))
    if "cudnnSpatialTfSamplerBackward" not in text:
        pytest.skip(f"no cuDNN headers in {inc}")
    text = re.sub(r"/\*.*?\*/|//[^\n]*", "", text, flags=re.S)
    for name in names:
        params = re.search(rf"\b{name}\s*\(([^;{{]*?)\)\s*;", text).group(1).strip()
        assert params.count(",") + 1 == len(api.PROTOTYPES[name]), name
    assert int(re.search(r"\bCUDNN_SAMPLER_BILINEAR\s*=\s*(\d+)", text).group(1)) == \
        cs.SAMPLER_BILINEAR


def test_selfcheck_rows_pass_on_numba():
    from dnnkit import selfcheck
    ops = ("affine_grid", "affine_grid_backward", "grid_sample", "grid_sample_backward",
           "spatial_transformer")
    assert {c.op for c in selfcheck.cases()} >= set(ops)
    rows = [r for r in selfcheck.run(dtypes=("float32",), ops_=ops) if r["backend"] == "numba"]
    assert len(rows) == 6 and all(r["status"] == "ok" for r in rows), rows


def test_forced_without_cudnn_names_the_op(monkeypatch):
    from dnnkit import policy
    from dnnkit.cudnn.loader import CudnnStatus
    monkeypatch.setattr(policy, "cudnn_status", lambda: CudnnStatus(False, "no GPU here"))
    theta = np.zeros((1, 2, 3), np.float32)
    assert dnnkit.select_backend("affine_grid", theta, (1, 1, 2, 2), backend="auto") == "numba"
    with pytest.raises(dnnkit.CudnnUnavailableError, match="affine_grid.*no GPU here"):
        dnnkit.affine_grid(theta, (1, 1, 2, 2), backend="cudnn")
