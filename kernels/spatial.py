"""Spatial transformer: affine grid generator and bilinear sampler, forward and backward.

Layouts, C-contiguous and passed flat: theta (N, 2, 3), grid (N, H', W', 2) holding (x, y),
img (N, C, H, W), y and dy (N, C, H', W'). ``geo`` = (N, C, H, W, H', W') as int64.

THE COORDINATE CONVENTION lives here only (``_grid_coord``, ``_pixel_coord``, ALIGN_CORNERS;
dnnkit/reference.py reads ALIGN_CORNERS): with ALIGN_CORNERS output index i of n maps to
x = -1 + 2i/(n-1) (corner pixel centres at +-1; -1 when n == 1, as cuDNN) and normalized x reads pixel
u = (x + 1)(n-1)/2 -- PyTorch's align_corners=True. With ALIGN_CORNERS False:
x = -1 + (2i+1)/n and u = ((x + 1)n - 1)/2 (align_corners=False).

    grid[n, i, j] = theta[n] @ (x_j, y_i, 1)
    y[n, c, i, j] = sum over the 4 taps (u0 + a, v0 + b), a, b in {0, 1}, inside the image, of
                    img[n, c, v0 + b, u0 + a] * (a ? fu : 1 - fu) * (b ? fv : 1 - fv)
    with u0 = floor(u), fu = u - u0 (and the same for v): zero outside the image.

Backward: dimg scatters dy times the tap weights; dgrid[n, i, j] = (du * su, dv * sv) with
du = sum_c dy * dy/du (the bilinear slope, outside taps 0) and su = du/dx ((W-1)/2 here);
dtheta[n] = sum over points of dgrid (x) (x_j, y_i, 1).

Accumulation in acc's type (float32 for float16 data). Literals are float32(c) so float32 code
has no float64 instructions. Indices are int64.
"""

import math

from numba import cuda, float32

ALIGN_CORNERS = True   # see the module docstring; flip here if the GPU probe disagrees


@cuda.jit(device=True, inline=True)
def _grid_coord(i, n, zero):
    """Normalized coordinate of output index i along a dimension of n points."""
    if ALIGN_CORNERS:
        # a 1-point dimension sits at -1, as cuDNN's grid generator puts it (H200 probe)
        return (zero + float32(2 * i)) / (zero + float32(max(n - 1, 1))) - float32(1)
    return (zero + float32(2 * i + 1)) / (zero + float32(n)) - float32(1)


@cuda.jit(device=True, inline=True)
def _pixel_scale(n, zero):
    """d(pixel coordinate)/d(normalized coordinate) along a dimension of n pixels."""
    if ALIGN_CORNERS:
        return (zero + float32(n - 1)) * float32(0.5)
    return (zero + float32(n)) * float32(0.5)


@cuda.jit(device=True, inline=True)
def _pixel_coord(x, n, zero):
    """Pixel coordinate read by normalized coordinate x along a dimension of n pixels."""
    if ALIGN_CORNERS:
        return (x + float32(1)) * _pixel_scale(n, zero)
    return (x + float32(1)) * _pixel_scale(n, zero) - float32(0.5)


@cuda.jit(device=True, inline=True)
def _tap(p, n, zero):
    """(p0, fraction) of pixel coordinate p: p0 = floor(p) as int64, frac = p - p0 (p0 goes
    through float32, exact while |p0| < 2**24: farther points read no pixel anyway)."""
    p0 = int(math.floor(p))
    return p0, p - (zero + float32(p0))


@cuda.jit(device=True, inline=True)
def _read(img, base, w_, h_, yy, xx, zero):
    if 0 <= yy < h_ and 0 <= xx < w_:
        return img[base + yy * w_ + xx] + zero
    return zero


@cuda.jit(cache=True)
def spatial_grid_fwd_kernel(theta, grid, n_, oh, ow, acc):
    """grid from theta. One thread per grid point (grid-stride over N*H'*W'), consecutive
    threads along W': theta read from cache (6 values per image), grid written once."""
    zero = acc[0]
    total = n_ * oh * ow
    q = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    while q < total:
        n = q // (oh * ow)
        i = (q // ow) % oh
        j = q % ow
        x = _grid_coord(j, ow, zero)
        y = _grid_coord(i, oh, zero)
        t = n * 6
        grid[2 * q] = theta[t] * x + theta[t + 1] * y + theta[t + 2]
        grid[2 * q + 1] = theta[t + 3] * x + theta[t + 4] * y + theta[t + 5]
        q += cuda.gridDim.x * cuda.blockDim.x


@cuda.jit(cache=True)
def spatial_grid_bwd_kernel(dgrid, dtheta, oh, ow, acc):
    """dtheta from dgrid. One block per image n (blockIdx.x); each thread sums the points
    t, t + T, ... in order into 6 partials, then a fixed shared-memory tree: deterministic.
    Dynamic shared memory 6*T acc elements (T a power of two). dgrid read once."""
    zero = acc[0]
    sh = cuda.shared.array(0, dtype=acc.dtype)
    T = cuda.blockDim.x
    t = cuda.threadIdx.x
    n = cuda.blockIdx.x
    pts = oh * ow
    s0 = s1 = s2 = s3 = s4 = s5 = zero
    p = t
    while p < pts:
        x = _grid_coord(p % ow, ow, zero)
        y = _grid_coord(p // ow, oh, zero)
        gx = dgrid[2 * (n * pts + p)] + zero
        gy = dgrid[2 * (n * pts + p) + 1] + zero
        s0 += gx * x
        s1 += gx * y
        s2 += gx
        s3 += gy * x
        s4 += gy * y
        s5 += gy
        p += T
    sh[t], sh[T + t], sh[2 * T + t] = s0, s1, s2
    sh[3 * T + t], sh[4 * T + t], sh[5 * T + t] = s3, s4, s5
    cuda.syncthreads()
    half = T // 2
    while half > 0:
        if t < half:
            k = 0
            while k < 6:
                sh[k * T + t] += sh[k * T + t + half]
                k += 1
        cuda.syncthreads()
        half //= 2
    if t < 6:
        dtheta[n * 6 + t] = sh[t * T]


@cuda.jit(cache=True)
def spatial_sample_fwd_kernel(img, grid, y, geo, acc):
    """y from img and grid. One thread per output element (grid-stride over N*C*H'*W'),
    consecutive threads along W' so y is written coalesced; the grid is re-read per channel
    (from L2), img taps of neighbouring threads share lines."""
    n_, c_, h_, w_, oh, ow = geo
    zero = acc[0]
    pts = oh * ow
    total = n_ * c_ * pts
    q = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    while q < total:
        p = q % pts
        nc = q // pts
        g = 2 * ((nc // c_) * pts + p)
        u0, fu = _tap(_pixel_coord(grid[g] + zero, w_, zero), w_, zero)
        v0, fv = _tap(_pixel_coord(grid[g + 1] + zero, h_, zero), h_, zero)
        base = nc * h_ * w_
        one = zero + float32(1)
        v = ((one - fu) * (one - fv) * _read(img, base, w_, h_, v0, u0, zero)
             + fu * (one - fv) * _read(img, base, w_, h_, v0, u0 + 1, zero)
             + (one - fu) * fv * _read(img, base, w_, h_, v0 + 1, u0, zero)
             + fu * fv * _read(img, base, w_, h_, v0 + 1, u0 + 1, zero))
        y[q] = v
        q += cuda.gridDim.x * cuda.blockDim.x


@cuda.jit(device=True, inline=True)
def _scatter(dimg, base, w_, h_, yy, xx, v):
    if 0 <= yy < h_ and 0 <= xx < w_:
        cuda.atomic.add(dimg, base + yy * w_ + xx, v)


@cuda.jit(cache=True)
def spatial_sample_bwd_kernel(img, grid, dy, dimg, dgrid, geo, scatter, acc):
    """dgrid, and with scatter != 0 dimg by atomic adds (dimg in acc's type, zeroed before).
    One thread per grid point (grid-stride over N*H'*W', consecutive along W'), looping over
    the channels: dgrid written once with no atomics; img and dy read once per channel."""
    n_, c_, h_, w_, oh, ow = geo
    zero = acc[0]
    one = zero + float32(1)
    pts = oh * ow
    total = n_ * pts
    su, sv = _pixel_scale(w_, zero), _pixel_scale(h_, zero)
    q = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    while q < total:
        n = q // pts
        p = q % pts
        u0, fu = _tap(_pixel_coord(grid[2 * q] + zero, w_, zero), w_, zero)
        v0, fv = _tap(_pixel_coord(grid[2 * q + 1] + zero, h_, zero), h_, zero)
        du = zero
        dv = zero
        c = 0
        while c < c_:
            base = (n * c_ + c) * h_ * w_
            g = dy[(n * c_ + c) * pts + p] + zero
            i00 = _read(img, base, w_, h_, v0, u0, zero)
            i01 = _read(img, base, w_, h_, v0, u0 + 1, zero)
            i10 = _read(img, base, w_, h_, v0 + 1, u0, zero)
            i11 = _read(img, base, w_, h_, v0 + 1, u0 + 1, zero)
            du += g * ((one - fv) * (i01 - i00) + fv * (i11 - i10))
            dv += g * ((one - fu) * (i10 - i00) + fu * (i11 - i01))
            if scatter:
                _scatter(dimg, base, w_, h_, v0, u0, g * (one - fu) * (one - fv))
                _scatter(dimg, base, w_, h_, v0, u0 + 1, g * fu * (one - fv))
                _scatter(dimg, base, w_, h_, v0 + 1, u0, g * (one - fu) * fv)
                _scatter(dimg, base, w_, h_, v0 + 1, u0 + 1, g * fu * fv)
            c += 1
        dgrid[2 * q] = du * su
        dgrid[2 * q + 1] = dv * sv
        q += cuda.gridDim.x * cuda.blockDim.x


@cuda.jit(cache=True)
def spatial_dimg_det_bwd_kernel(grid, dy, dimg, geo, acc):
    """Deterministic dimg (acc's type), gather by input rows: one thread per (n, input row r)
    (grid-stride over N*H), the only writer of row r of image n in every channel. It zeroes
    those rows, then scans the output points p = 0, 1, ... of image n and, for each whose
    bilinear footprint touches row r (floor(v) == r or r - 1), adds its two taps in row r for
    every channel: each dimg element sums its contributions in increasing p, a fixed order,
    with no atomics and no inverse map. Consecutive threads are consecutive rows of one image,
    so the grid loads of a warp are uniform (one broadcast, from L1/L2). Cost: every thread
    scans all H'*W' points (N*H*H'*W' cheap iterations, ~7e8 at 64x3x224x224); dy and dimg
    are touched only for the ~2 rows each point hits."""
    n_, c_, h_, w_, oh, ow = geo
    zero = acc[0]
    one = zero + float32(1)
    pts = oh * ow
    q = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    while q < n_ * h_:
        n = q // h_
        r = q % h_
        c = 0
        while c < c_:
            row = ((n * c_ + c) * h_ + r) * w_
            k = 0
            while k < w_:
                dimg[row + k] = zero
                k += 1
            c += 1
        g0 = n * pts
        p = 0
        while p < pts:
            v0, fv = _tap(_pixel_coord(grid[2 * (g0 + p) + 1] + zero, h_, zero), h_, zero)
            if v0 == r or v0 + 1 == r:
                wv = one - fv if v0 == r else fv
                u0, fu = _tap(_pixel_coord(grid[2 * (g0 + p)] + zero, w_, zero), w_, zero)
                c = 0
                while c < c_:
                    g = (dy[(n * c_ + c) * pts + p] + zero) * wv
                    row = ((n * c_ + c) * h_ + r) * w_
                    if 0 <= u0 < w_:
                        dimg[row + u0] += g * (one - fu)
                    if 0 <= u0 + 1 < w_:
                        dimg[row + u0 + 1] += g * fu
                    c += 1
            p += 1
        q += cuda.gridDim.x * cuda.blockDim.x


@cuda.jit(cache=True)
def spatial_fill_bwd_kernel(buf, value):
    """buf[:] = value (zeroes the atomic accumulator). One thread per element, grid-stride."""
    q = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    while q < buf.size:
        buf[q] = value
        q += cuda.gridDim.x * cuda.blockDim.x


@cuda.jit(cache=True)
def spatial_cast_bwd_kernel(src, dst):
    """dst[:] = src[:] converted (float32 accumulator -> float16 dimg). Grid-stride."""
    q = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    while q < dst.size:
        dst[q] = src[q]
        q += cuda.gridDim.x * cuda.blockDim.x


def SIGNATURES(t, acc):
    from numba import int64
    from numba.core.types import UniTuple
    a, z = t[::1], acc[::1]
    geo = UniTuple(int64, 6)
    return {"spatial_grid_fwd_kernel": (a, a, int64, int64, int64, z),
            "spatial_grid_bwd_kernel": (a, a, int64, int64, z),
            "spatial_sample_fwd_kernel": (a, a, a, geo, z),
            "spatial_sample_bwd_kernel": (a, a, a, z, a, geo, int64, z),
            "spatial_dimg_det_bwd_kernel": (a, a, z, geo, z),
            "spatial_fill_bwd_kernel": (z, acc),
            "spatial_cast_bwd_kernel": (z, a)}
