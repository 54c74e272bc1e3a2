"""Spatial transformer on a real GPU: the coordinate-convention probe (cuDNN against the
convention of kernels/spatial.py), cuDNN vs Numba vs float64 at 64x3x224x224, bitwise repeats
of the deterministic backward, and PyTorch's affine_grid + grid_sample (align_corners=True)
where torch is importable."""

import numpy as np
import pytest

import dnnkit
from dnnkit import config
from dnnkit import reference

pytestmark = [pytest.mark.gpu]

DTYPES = ["float32", "float16", "float64"]
# rel. error vs float64. float32 at 224 pixels: a coordinate carries ~224 * 2^-24 = 1.3e-5
# pixels of rounding, so sampled values are off by that much of the local slope (PyTorch too)
TOL = {"float16": 1e-2, "float32": 1e-4, "float64": 1e-12}
BIG = (64, 3, 224, 224)


def _host(a):
    return a.copy_to_host()


def _theta(rng, n, scale=0.15):
    eye = np.tile(np.array([[1.0, 0, 0], [0, 1.0, 0]]), (n, 1, 1))
    return eye + scale * rng.standard_normal((n, 2, 3))


@pytest.mark.cudnn
def test_convention_probe():
    """If this fails, cuDNN's convention differs from kernels/spatial.py's: the messages say
    which part (grid corners, axis order, sampler pixel mapping) to change there."""
    n, c, h, w, oh, ow = 1, 1, 5, 7, 3, 4
    eye = np.array([[[1.0, 0, 0], [0, 1.0, 0]]], np.float32)
    g = _host(dnnkit.affine_grid(eye, (n, c, oh, ow), backend="cudnn"))
    assert np.allclose(g[0, 0, 0], [-1, -1], atol=1e-6), \
        f"identity grid corner (0, 0) is {g[0, 0, 0]}, expected (-1, -1) (align corners)"
    assert np.allclose(g[0, -1, -1], [1, 1], atol=1e-6), \
        f"identity grid corner (H'-1, W'-1) is {g[0, -1, -1]}, expected (1, 1)"
    assert np.allclose(g[0, 0, 1], [-1 + 2 / 3, -1], atol=1e-6), \
        f"grid[0, 0, 1] = {g[0, 0, 1]}: the last axis is not (x, y) with x along W'"
    np.testing.assert_allclose(g, reference.affine_grid(eye, (n, c, oh, ow)), atol=1e-6)
    # theta rows: x' = t00 x + t01 y + t02
    th = np.array([[[0.5, 0.25, 0.1], [-0.2, 0.75, -0.3]]], np.float32)
    np.testing.assert_allclose(_host(dnnkit.affine_grid(th, (n, c, oh, ow), backend="cudnn")),
                               reference.affine_grid(th, (n, c, oh, ow)), atol=1e-6)
    # sampler: pixel (v, u) of a ramp image; (x, y) = (-1, -1) must read pixel (0, 0),
    # (1, 1) pixel (H-1, W-1), and a quarter pixel interpolates
    img = np.arange(h * w, dtype=np.float32).reshape(1, 1, h, w)
    pts = np.array([[[[-1, -1], [1, 1], [-1, 1], [1, -1],
                      [-1 + 2 * 1.25 / (w - 1), -1 + 2 * 2.5 / (h - 1)]]]], np.float32)
    y = _host(dnnkit.grid_sample(img, pts, backend="cudnn"))[0, 0, 0]
    want = [0, h * w - 1, (h - 1) * w, w - 1, 2.5 * w + 1.25]
    np.testing.assert_allclose(y, want, atol=1e-4,
                               err_msg="cuDNN's sampler maps normalized to pixel coordinates "
                                       "differently from u = (x + 1)(W - 1)/2")
    # outside: zero beyond one pixel, partial taps at half a pixel out
    out = np.array([[[[-1 - 4 / (w - 1), 0], [-1 - 1 / (w - 1), -1 + 4 / (h - 1)]]]],
                   np.float32)
    y = _host(dnnkit.grid_sample(img, out, backend="cudnn"))[0, 0, 0]
    np.testing.assert_allclose(y, [0, 0.5 * img[0, 0, 2, 0]], atol=1e-5,
                               err_msg="zero padding: a tap outside should contribute 0")
    # every op, Numba vs cuDNN, on a random case including outside points
    rng = np.random.default_rng(0)
    img = rng.standard_normal((2, 3, 9, 11)).astype(np.float32)
    grid = (1.3 * rng.uniform(-1, 1, (2, 6, 5, 2))).astype(np.float32)
    dy = rng.standard_normal((2, 3, 6, 5)).astype(np.float32)
    for fn, args in ((dnnkit.grid_sample, (img, grid)),
                     (dnnkit.grid_sample_backward, (img, grid, dy)),
                     (dnnkit.affine_grid_backward, (grid,))):
        dnnkit.testing.assert_backends_agree(fn, *args, rtol=1e-4, atol=1e-5)


@pytest.mark.cudnn
def test_one_point_dimension():
    """A 1-point output dimension sits at -1 in cuDNN's grid (measured on an H200; PyTorch puts
    it at 0): the Numba kernel and the reference follow cuDNN."""
    th = np.array([[[1.0, 0.5, 0.25], [0.5, 1.0, -0.25]]], np.float32)
    for shape in ((1, 1, 1, 4), (1, 1, 3, 1), (1, 1, 1, 1)):
        got = _host(dnnkit.affine_grid(th, shape, backend="cudnn"))
        np.testing.assert_allclose(got, reference.affine_grid(th, shape), atol=1e-6,
                                   err_msg=f"cuDNN's 1-point convention differs at {shape}")


@pytest.mark.cudnn
@pytest.mark.parametrize("dtype", DTYPES)
def test_backends_agree_at_224(rng, dtype):
    n, c, h, w = BIG
    img = rng.standard_normal(BIG).astype(dtype)
    theta = _theta(rng, n).astype(dtype)
    grid = dnnkit.testing.assert_backends_agree(dnnkit.affine_grid, theta, BIG)
    g = _host(grid)
    assert reference.rel_error(g, reference.affine_grid(theta, BIG)) <= TOL[dtype]
    y = dnnkit.testing.assert_backends_agree(dnnkit.grid_sample, img, grid)
    sub = slice(0, 4)   # the float64 reference on 4 images (host time)
    assert reference.rel_error(_host(y)[sub], reference.grid_sample(img[sub], g[sub])) <= TOL[dtype]
    dy = rng.standard_normal(y.shape).astype(dtype)
    dimg, dgrid = dnnkit.testing.assert_backends_agree(dnnkit.grid_sample_backward, img, grid,
                                                       dy)
    rimg, rgrid = reference.grid_sample_backward(img[sub], g[sub], dy[sub])
    assert reference.rel_error(_host(dimg)[sub], rimg) <= 2 * TOL[dtype]
    # off the kinks (a pixel coordinate on an integer: one-sided slopes; reference.spatial_kinks)
    gd, hw = g[sub], (h, w)
    assert reference.rel_error(reference.off_kinks(_host(dgrid)[sub], gd, hw),
                               reference.off_kinks(rgrid, gd, hw)) <= 4 * TOL[dtype]
    dnnkit.testing.assert_backends_agree(dnnkit.affine_grid_backward, dgrid)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_deterministic_backward_is_bitwise_repeatable(rng, dtype):
    config.set("dnn.deterministic", True)
    img = rng.standard_normal((16, 3, 224, 224)).astype(dtype)
    # a zoom
    grid = reference.affine_grid(_theta(rng, 16, 0.3) * 0.5, (16, 3, 224, 224)).astype(dtype)
    dy = rng.standard_normal((16, 3, 224, 224)).astype(dtype)
    first = [_host(a) for a in dnnkit.grid_sample_backward(img, grid, dy)]
    for _ in range(3):
        again = [_host(a) for a in dnnkit.grid_sample_backward(img, grid, dy)]
        for a, b in zip(first, again):
            assert np.array_equal(a.view(np.uint8), b.view(np.uint8))
    config.set("dnn.deterministic", False)
    atomic = _host(dnnkit.grid_sample_backward(img, grid, dy, backend="numba")[0])
    assert reference.rel_error(atomic, first[0]) <= 10 * TOL[dtype]


@pytest.mark.parametrize("backend", ["numba", pytest.param("cudnn", marks=pytest.mark.cudnn)])
def test_matches_pytorch_align_corners(rng, backend):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    n, c, h, w = 8, 3, 224, 224
    img = rng.standard_normal((n, c, h, w)).astype(np.float32)
    theta = _theta(rng, n).astype(np.float32)
    ti, tt = torch.tensor(img, device="cuda"), torch.tensor(theta, device="cuda")
    tg = F.affine_grid(tt, (n, c, h, w), align_corners=True)
    ty = F.grid_sample(ti, tg, mode="bilinear", padding_mode="zeros", align_corners=True)
    grid = dnnkit.affine_grid(theta, (n, c, h, w), backend=backend)
    np.testing.assert_allclose(_host(grid), tg.cpu().numpy(), atol=1e-5)
    y = _host(dnnkit.grid_sample(img, tg.cpu().numpy(), backend=backend))
    assert reference.rel_error(y, ty.cpu().numpy()) <= 1e-5
