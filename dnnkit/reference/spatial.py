"""Float64 reference of the spatial transformer: affine grid and bilinear sampling.

The coordinate convention: with ALIGN_CORNERS output index i of n maps to x = -1 + 2i/(n-1)
(corner pixel centres at +-1; -1 when n == 1) and normalized x reads pixel u = (x + 1)(n-1)/2,
PyTorch's align_corners=True; without it x = -1 + (2i+1)/n and u = ((x + 1)n - 1)/2. The
kernels (kernels/spatial.py) keep a constant of the same name and value: they cannot import
this module (tests/kernels/test_conventions.py checks that the two agree).
"""

import numpy as np

ALIGN_CORNERS = True


def spatial_grid_coords(n):
    """Normalized coordinates of the n output points along one dimension."""
    i = np.arange(n, dtype=np.float64)
    return -1.0 + 2.0 * i / max(n - 1, 1) if ALIGN_CORNERS else -1.0 + (2.0 * i + 1.0) / n


def _spatial_pixel(x, n):
    """(pixel coordinate, d pixel / d normalized) of normalized x along n pixels."""
    s = (n - 1) / 2.0 if ALIGN_CORNERS else n / 2.0
    return ((x + 1.0) * s if ALIGN_CORNERS else (x + 1.0) * s - 0.5), s


def affine_grid(theta, out_shape):
    """grid (N, H', W', 2) = theta[n] @ (x_j, y_i, 1), stored (x, y)."""
    theta = np.asarray(theta, dtype=np.float64)
    _, _, oh, ow = out_shape
    ys, xs = np.meshgrid(spatial_grid_coords(oh), spatial_grid_coords(ow), indexing="ij")
    base = np.stack([xs, ys, np.ones_like(xs)], axis=-1)          # (H', W', 3)
    return np.einsum("hwk,nck->nhwc", base, theta)


def affine_grid_backward(dgrid):
    dgrid = np.asarray(dgrid, dtype=np.float64)
    _, oh, ow, _ = dgrid.shape
    ys, xs = np.meshgrid(spatial_grid_coords(oh), spatial_grid_coords(ow), indexing="ij")
    base = np.stack([xs, ys, np.ones_like(xs)], axis=-1)
    return np.einsum("hwk,nhwc->nck", base, dgrid)


def _spatial_taps(grid, h, w):
    u, su = _spatial_pixel(grid[..., 0], w)
    v, sv = _spatial_pixel(grid[..., 1], h)
    u0, v0 = np.floor(u), np.floor(v)
    return u0.astype(np.int64), v0.astype(np.int64), u - u0, v - v0, su, sv


def grid_sample(img, grid):
    """Bilinear sampling of img (N, C, H, W) at grid (N, H', W', 2); zero outside."""
    img, grid = np.asarray(img, dtype=np.float64), np.asarray(grid, dtype=np.float64)
    n_, c_, h, w = img.shape
    u0, v0, fu, fv, _, _ = _spatial_taps(grid, h, w)
    out = np.zeros((n_, c_) + grid.shape[1:3])
    nidx = np.arange(n_)[:, None, None]
    for a in (0, 1):
        for b in (0, 1):
            uu, vv = u0 + a, v0 + b
            wt = (fu if a else 1 - fu) * (fv if b else 1 - fv)
            ok = (uu >= 0) & (uu < w) & (vv >= 0) & (vv < h)
            vals = img[nidx, :, np.clip(vv, 0, h - 1), np.clip(uu, 0, w - 1)]  # (N,H',W',C)
            out += np.moveaxis(np.where(ok[..., None], vals * wt[..., None], 0.0), -1, 1)
    return out


def spatial_kinks(grid, hw, tol=1e-3):
    """(N, H', W') mask of grid points whose pixel coordinate u or v lies within ``tol`` of an
    integer: bilinear sampling has a kink there, so dgrid is a one-sided slope that depends on
    the last bit of the coordinate (the float64 reference and a float32 kernel may take
    different sides). Compare dgrid off these points."""
    g = np.asarray(grid, dtype=np.float64)
    h, w = hw
    u, v = _spatial_pixel(g[..., 0], w)[0], _spatial_pixel(g[..., 1], h)[0]
    return (np.abs(u - np.round(u)) < tol) | (np.abs(v - np.round(v)) < tol)


def off_kinks(dgrid, grid, hw):
    """dgrid with the points of :func:`spatial_kinks` zeroed (the comparison helper)."""
    d = np.array(dgrid, dtype=np.float64)
    d[spatial_kinks(grid, hw)] = 0.0
    return d


def grid_sample_backward(img, grid, dy):
    """(dimg, dgrid) of grid_sample."""
    img, grid = np.asarray(img, dtype=np.float64), np.asarray(grid, dtype=np.float64)
    dy = np.asarray(dy, dtype=np.float64)
    n_, c_, h, w = img.shape
    u0, v0, fu, fv, su, sv = _spatial_taps(grid, h, w)
    dimg = np.zeros_like(img)
    dgrid = np.zeros_like(grid)
    nidx = np.arange(n_)[:, None, None]
    g = np.moveaxis(dy, 1, -1)                                      # (N, H', W', C)
    for a in (0, 1):
        for b in (0, 1):
            uu, vv = u0 + a, v0 + b
            ok = (uu >= 0) & (uu < w) & (vv >= 0) & (vv < h)
            vals = np.where(ok[..., None],
                            img[nidx, :, np.clip(vv, 0, h - 1), np.clip(uu, 0, w - 1)], 0.0)
            wu, wv = (fu if a else 1 - fu), (fv if b else 1 - fv)
            dgrid[..., 0] += (g * vals).sum(-1) * (1 if a else -1) * wv * su
            dgrid[..., 1] += (g * vals).sum(-1) * (1 if b else -1) * wu * sv
            contrib = np.where(ok[..., None], g * (wu * wv)[..., None], 0.0)
            nn = np.broadcast_to(nidx, uu.shape)
            for c in range(c_):
                np.add.at(dimg[:, c], (nn[ok], vv[ok], uu[ok]), contrib[..., c][ok])
    return dimg, dgrid


def spatial_transformer(img, theta, scale_height=1.0, scale_width=1.0):
    n_, c_, h, w = np.shape(img)
    out = (n_, c_, int(np.ceil(h * scale_height)), int(np.ceil(w * scale_width)))
    return grid_sample(img, affine_grid(theta, out))
