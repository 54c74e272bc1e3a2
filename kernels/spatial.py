"""Spatial transformer: affine grid generator and bilinear sampler, forward and backward.

Layouts, C-contiguous and passed flat: theta (N, 2, 3), grid (N, H', W', 2) holding (x, y),
img (N, C, H, W), y and dy (N, C, H', W'). ``geo`` = (N, C, H, W, H', W') as int64.

THE COORDINATE CONVENTION lives here only (``_grid_coord``, ``_pixel_coord``, ALIGN_CORNERS;
dnnkit/reference/spatial.py keeps an equal one): with ALIGN_CORNERS output index i of n maps to
x = -1 + 2i/(n-1) (corner pixel centres at +-1; -1 when n == 1, as cuDNN) and normalized x
reads pixel u = (x + 1)(n-1)/2 -- PyTorch's align_corners=True. With ALIGN_CORNERS False:
x = -1 + (2i+1)/n and u = ((x + 1)n - 1)/2 (align_corners=False).

    grid[n, i, j] = theta[n] @ (x_j, y_i, 1)
    y[n, c, i, j] = sum over the 4 taps (u0 + a, v0 + b), a, b in {0, 1}, inside the image, of
                    img[n, c, v0 + b, u0 + a] * (a ? fu : 1 - fu) * (b ? fv : 1 - fv)
    with u0 = floor(u), fu = u - u0 (and the same for v): zero outside the image.

Backward: dimg scatters dy times the tap weights; dgrid[n, i, j] = (du * su, dv * sv) with
du = sum_c dy * dy/du (the bilinear slope, outside taps 0) and su = du/dx ((W-1)/2 here);
dtheta[n] = sum over points of dgrid (x) (x_j, y_i, 1).

Accumulation in acc's type (float32 for float16 data). Literals are float32(c) so float32 code
has no float64 instructions. Indices are int64, except within an image plane in the samplers
(uint32 tap offsets, int32 tap coordinates: ``_axis``; the launcher refuses larger planes).
"""

import functools
import math

from numba import cuda, float32, int32, uint32, uint64

from .bounds import bounded_jit, inlined

ALIGN_CORNERS = True   # see the module docstring; flip here if the GPU probe disagrees


@inlined
def _grid_coord(i, n, zero):
    """Normalized coordinate of output index i along a dimension of n points."""
    if ALIGN_CORNERS:
        # a 1-point dimension sits at -1, as cuDNN's grid generator puts it (H200 probe)
        return (zero + float32(2 * i)) / (zero + float32(max(n - 1, 1))) - float32(1)
    return (zero + float32(2 * i + 1)) / (zero + float32(n)) - float32(1)


@inlined
def _pixel_scale(n, zero):
    """d(pixel coordinate)/d(normalized coordinate) along a dimension of n pixels."""
    if ALIGN_CORNERS:
        return (zero + float32(n - 1)) * float32(0.5)
    return (zero + float32(n)) * float32(0.5)


@inlined
def _pixel_coord(x, n, zero):
    """Pixel coordinate read by normalized coordinate x along a dimension of n pixels."""
    if ALIGN_CORNERS:
        return (x + float32(1)) * _pixel_scale(n, zero)
    return (x + float32(1)) * _pixel_scale(n, zero) - float32(0.5)


@inlined
def _tap(p, n, zero):
    """(p0, fraction) of pixel coordinate p: p0 = floor(p) as int64, frac = p - p0 (p0 goes
    through float32, exact while |p0| < 2**24: farther points read no pixel anyway)."""
    p0 = int(math.floor(p))
    return p0, p - (zero + float32(p0))


@inlined
def _affine(theta, n, i, j, oh, ow, zero):
    """Grid point (i, j) of image n: theta[n] @ (x_j, y_i, 1), in zero's type."""
    x = _grid_coord(j, ow, zero)
    y = _grid_coord(i, oh, zero)
    t = uint64(n * 6)     # unsigned: no negative-index fix-up (~60 SASS instructions)
    return (theta[t] * x + theta[t + uint64(1)] * y + theta[t + uint64(2)] + zero,
            theta[t + uint64(3)] * x + theta[t + uint64(4)] * y + theta[t + uint64(5)] + zero)


@cuda.jit(cache=True)
def spatial_grid_fwd_kernel(theta, grid, n_, oh, ow, acc):
    """grid from theta. One thread per grid point (grid-stride over N*H'*W'), consecutive
    threads along W': theta read from cache (6 values per image), grid written once."""
    zero = acc[0]
    total = n_ * oh * ow
    q = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    while q < total:
        gx, gy = _affine(theta, q // (oh * ow), (q // ow) % oh, q % ow, oh, ow, zero)
        grid[2 * q] = gx
        grid[2 * q + 1] = gy
        q += cuda.gridDim.x * cuda.blockDim.x


@cuda.jit(cache=True)
def spatial_grid_bwd_kernel(dgrid, part, n_, oh, ow, parts, acc):
    """Partial sums of dtheta: block (n, b) (blockIdx.x = n * parts + b) sums image n's
    points b*T + t, stepping parts*T, four at a time (their dgrid loaded together), in order
    into 6 partials per thread, then a fixed shared-memory tree: part[b][n, k] (acc's type;
    part b at b * n_ * 6), added over b in order by conv_partsum_fwd_kernel: deterministic.
    Several blocks per image so that small batches still fill the GPU. Dynamic shared memory
    6*T acc elements (T a power of two). dgrid read once."""
    zero = acc[0]
    sh = cuda.shared.array(0, dtype=acc.dtype)
    T = cuda.blockDim.x
    t = cuda.threadIdx.x
    n, b = cuda.blockIdx.x // parts, cuda.blockIdx.x % parts
    pts = oh * ow
    step = parts * T
    s0 = s1 = s2 = s3 = s4 = s5 = zero
    p = b * T + t
    while p < pts:
        gv = cuda.local.array(8, dgrid.dtype)
        for u in range(4):
            j = uint64(2 * (n * pts + min(p + u * step, pts - 1)))
            gv[2 * u] = dgrid[j]
            gv[2 * u + 1] = dgrid[j + uint64(1)]
        for u in range(4):
            pu = p + u * step
            if pu < pts:
                x = _grid_coord(pu % ow, ow, zero)
                y = _grid_coord(pu // ow, oh, zero)
                gx, gy = gv[2 * u] + zero, gv[2 * u + 1] + zero
                s0 += gx * x
                s1 += gx * y
                s2 += gx
                s3 += gy * x
                s4 += gy * y
                s5 += gy
        p += 4 * step
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
        part[(b * n_ + n) * 6 + t] = sh[t * T]


@inlined
def _axis(p, n, zero):
    """The two taps of pixel coordinate p along a dimension of n pixels, in 32-bit integers
    (a side under 2**31 pixels): (k0, k1, in0, in1, frac), k0 = floor(p) and k1 = k0 + 1
    each clamped into [0, n-1] (always a valid index), in0 and in1 whether each is inside,
    frac = p - floor(p).

    p is first clamped into [-2, n+1]: that keeps which taps are inside (none, for a point
    beyond) and bounds the conversion, so floor is one F2I.FLOOR to 32 bits (the int64 floor
    and its conversion back took two F2I.S64/I2F.S64 pairs and 64-bit compares; the
    truncation of p + 2 would round p just below an integer up to it). frac is that of the
    clamped p (0 for a finite point beyond, whose taps are all outside, so it never reaches
    the result) plus p - p, so an infinite or NaN p gives a NaN frac, as p - floor(p) does."""
    lo = zero - float32(2)
    c = lo if p < lo else p
    hi = zero + float32(int32(n + 1))
    c = hi if c > hi else c                             # a NaN stays NaN
    f = int32(math.floor(c if c == c else lo))
    frac = c - (zero + float32(f)) + (p - p)
    last = int32(n - 1)
    k0 = int32(min(max(f, int32(0)), last))
    k1 = int32(min(max(int32(f + int32(1)), int32(0)), last))
    return k0, k1, (f >= 0) & (f <= last), (f >= -1) & (f < last), frac


@inlined
def _taps(grid, theta, n, i, j, q, geo, from_theta, zero):
    """(off, ins, fu, fv) of grid point q = (image n, row i, column j), read from grid or
    computed from theta (``_affine``) where ``from_theta``: the in-plane offsets of its four
    taps (v0, u0), (v0, u0+1), (v0+1, u0), (v0+1, u0+1), each clamped into the image (always
    in bounds, masked by the caller), whether each is inside, and the fractions. Offsets are
    uint32 (a plane under 2**32 elements): computed once per point, shared by its
    channels."""
    n_, c_, h_, w_, oh, ow = geo
    if from_theta:
        gx, gy = _affine(theta, n, i, j, oh, ow, zero)
    else:
        gx, gy = grid[uint64(2 * q)] + zero, grid[uint64(2 * q + 1)] + zero
    u0, u1, iu0, iu1, fu = _axis(_pixel_coord(gx, w_, zero), w_, zero)
    v0, v1, iv0, iv1, fv = _axis(_pixel_coord(gy, h_, zero), h_, zero)
    w32 = uint32(w_)
    r0, r1 = uint32(uint32(v0) * w32), uint32(uint32(v1) * w32)
    a, b = uint32(u0), uint32(u1)
    return ((uint32(r0 + a), uint32(r0 + b), uint32(r1 + a), uint32(r1 + b)),
            (iv0 & iu0, iv0 & iu1, iv1 & iu0, iv1 & iu1), fu, fv)


@inlined
def _masked(t, k, ins, zero):
    """The four taps t[4k .. 4k+3] in zero's type, those outside the image exactly 0 (selected,
    not multiplied: an Inf in the clamped pixel must not turn into NaN)."""
    return (t[4 * k] + zero if ins[0] else zero, t[4 * k + 1] + zero if ins[1] else zero,
            t[4 * k + 2] + zero if ins[2] else zero, t[4 * k + 3] + zero if ins[3] else zero)


@inlined
def _scatter(dimg, base, inside, v):
    if inside:
        cuda.atomic.add(dimg, base, v)


# Channels per trip of the samplers (CB, the launcher takes min(C, 4)): the taps of CB
# channels are loaded before the first is used, each at its pixel clamped into the image and
# masked after the load. (A tap read behind ``if inside:`` waits for the previous one: one
# memory round trip per tap and channel.)
MAX_CB = 4
# Forward block: 32 columns x 8 rows of output points (no index division; a warp on a row)
FWD_BLOCK = (32, 8)
# Launch bounds of the samplers (blocks of 256 threads: FWD_BLOCK, and the backward's 1-D
# blocks): blocks per SM by CB, for 2- and 4-byte data. Unbounded, ptxas gives the float32
# forward of CB = 3 56 registers (4 blocks per SM) and its backward 80 (3). Bounded (sm_90,
# float32 and float16, ptxas 13): the forward 36-40 registers at 6 blocks for CB <= 3 (CB = 4
# would spill 48 bytes there: 5 blocks, 48 registers), the backward 56-64 at 4 blocks for
# CB <= 3 (CB = 4 spills 84 bytes in float16 there: 3 blocks). None spills. float64 values
# take twice the registers and spilled 24-316 bytes under these bounds: its samplers are
# bounded by threads only (``wide``).
SAMPLER_THREADS = 256
FWD_MIN_BLOCKS = {1: 6, 2: 6, 3: 6, 4: 5}
BWD_MIN_BLOCKS = {1: 4, 2: 4, 3: 4, 4: 3}


@functools.lru_cache(maxsize=None)
def sampler_kernels(CB, wide=False):
    """(forward, backward) bilinear samplers loading CB channels per trip; ``wide``: for 8-byte
    data (launch bounds on threads only, above)."""
    TAPS = 4 * CB

    @inlined
    def load(img, dy, t, gs, n, c0, c_, hw, pts, p, off, grads):
        """t[4k + m] = tap m of channel c0 + k (and gs[k] = its dy at point p when ``grads``)
        for k < CB, channels past the last clamped to it (loaded, never used)."""
        for k in range(CB):
            c = n * c_ + min(c0 + k, c_ - 1)
            base = c * hw
            for m in range(4):
                t[4 * k + m] = img[uint64(base + off[m])]
            if grads:
                gs[k] = dy[uint64(c * pts + p)]

    def forward(img, grid, theta, y, geo, from_theta, acc):
        """y from img and grid (or, with ``from_theta``, the grid of theta computed in place:
        the spatial transformer without its grid in memory; ``grid`` is then unused). One
        thread per output point: x along W' (a warp on one row: y written coalesced), y along
        H', z along N (grid-stride in y and z), looping over the channels CB at a time: the
        point's coordinates and tap offsets once, the four taps of CB channels loaded
        together."""
        n_, c_, h_, w_, oh, ow = geo
        zero = acc[0]
        one = zero + float32(1)
        pts, hw = oh * ow, h_ * w_
        j = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        if j >= ow:
            return
        n = cuda.blockIdx.z
        while n < n_:
            i = cuda.blockIdx.y * cuda.blockDim.y + cuda.threadIdx.y
            while i < oh:
                p = i * ow + j
                off, ins, fu, fv = _taps(grid, theta, n, i, j, n * pts + p, geo, from_theta,
                                         zero)
                w00, w01 = (one - fu) * (one - fv), fu * (one - fv)
                w10, w11 = (one - fu) * fv, fu * fv
                c0 = 0
                while c0 < c_:
                    t = cuda.local.array(TAPS, img.dtype)
                    load(img, img, t, t, n, c0, c_, hw, pts, p, off, False)
                    for k in range(CB):
                        if c0 + k < c_:
                            a00, a01, a10, a11 = _masked(t, k, ins, zero)
                            y[uint64((n * c_ + c0 + k) * pts + p)] = (
                                w00 * a00 + w01 * a01 + w10 * a10 + w11 * a11)
                    c0 += CB
                i += cuda.gridDim.y * cuda.blockDim.y
            n += cuda.gridDim.z

    def backward(img, grid, dy, dimg, dgrid, geo, scatter, acc):
        """dgrid, and with scatter != 0 dimg by atomic adds (dimg in acc's type, zeroed
        before). One thread per grid point (grid-stride over N*H'*W', consecutive along W'),
        looping over the channels CB at a time (dy and the four taps of CB channels loaded
        together): dgrid written once with no atomics; img and dy read once per channel."""
        n_, c_, h_, w_, oh, ow = geo
        zero = acc[0]
        one = zero + float32(1)
        pts, hw = oh * ow, h_ * w_
        su, sv = _pixel_scale(w_, zero), _pixel_scale(h_, zero)
        q = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        while q < n_ * pts:
            n, p = q // pts, q % pts
            off, ins, fu, fv = _taps(grid, grid, n, 0, 0, q, geo, 0, zero)
            du = zero
            dv = zero
            c0 = 0
            while c0 < c_:
                t = cuda.local.array(TAPS, img.dtype)
                gs = cuda.local.array(CB, dy.dtype)
                load(img, dy, t, gs, n, c0, c_, hw, pts, p, off, True)
                for k in range(CB):
                    if c0 + k < c_:
                        g = gs[k] + zero
                        a00, a01, a10, a11 = _masked(t, k, ins, zero)
                        du += g * ((one - fv) * (a01 - a00) + fv * (a11 - a10))
                        dv += g * ((one - fu) * (a10 - a00) + fu * (a11 - a01))
                        if scatter:
                            base = (n * c_ + c0 + k) * hw
                            _scatter(dimg, base + off[0], ins[0], g * (one - fu) * (one - fv))
                            _scatter(dimg, base + off[1], ins[1], g * fu * (one - fv))
                            _scatter(dimg, base + off[2], ins[2], g * (one - fu) * fv)
                            _scatter(dimg, base + off[3], ins[3], g * fu * fv)
                c0 += CB
            dgrid[2 * q] = du * su
            dgrid[2 * q + 1] = dv * sv
            q += cuda.gridDim.x * cuda.blockDim.x

    return (bounded_jit(forward, SAMPLER_THREADS, 1 if wide else FWD_MIN_BLOCKS[CB]),
            bounded_jit(backward, SAMPLER_THREADS, 1 if wide else BWD_MIN_BLOCKS[CB]))


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


# The samplers for the PTX checks (kernels/signatures.py): one and four channels per trip.
VARIANTS = {}
for _cb in (1, MAX_CB):
    _f, _b = sampler_kernels(_cb)
    VARIANTS[f"spatial_sample_c{_cb}_fwd_kernel"] = _f
    VARIANTS[f"spatial_sample_c{_cb}_bwd_kernel"] = _b


# Kernels that multiply integers in 32 bits on purpose (tests/kernels/test_ptx.py): the
# samplers' tap row offset v * W within one image plane (``_taps``), under 2**32 by the
# launcher's check (dnnkit/ops/spatial.py, ``_geo``). Plane and channel bases stay 64-bit.
INDEX32 = tuple(VARIANTS)


def SIGNATURES(t, acc):
    from numba import int64
    from numba.core.types import UniTuple
    a, z = t[::1], acc[::1]
    geo = UniTuple(int64, 6)
    return {"spatial_grid_fwd_kernel": (a, a, int64, int64, int64, z),
            "spatial_grid_bwd_kernel": (a, z, int64, int64, int64, int64, z),
            "spatial_dimg_det_bwd_kernel": (a, a, z, geo, z),
            "spatial_fill_bwd_kernel": (z, acc),
            "spatial_cast_bwd_kernel": (z, a)} | {
        name: (a, a, a, a, geo, int64, z) if "_fwd_" in name else (a, a, a, z, a, geo, int64, z)
        for name in VARIANTS}
