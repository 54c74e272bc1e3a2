"""Device helpers of tests/gpu/test_scale.py: inputs of more than 2**31 elements made on the
GPU (a host copy would take longer than the op), whole-array checks done on the GPU, and NaN
poison for the allocator blocks the op's outputs will take. Every loop index is int64 (Numba
widens cuda.grid), so these helpers are themselves safe past 2**31 elements."""

import math

import numpy as np
from numba import cuda, float32

_BLOCKS, _THREADS = 4096, 256


@cuda.jit
def _pattern(a, mult, mod, offset, scale):
    """a[i] = ((i * mult) % mod - offset) * scale: a cheap scramble of the index."""
    for i in range(cuda.grid(1), a.size, cuda.gridsize(1)):
        a[i] = float32(((i * mult) % mod - offset) * scale)


@cuda.jit
def _tiles(a, hw, w_):
    """Pooling input without ties in any window of extent <= 4: in plane p, pixel (h, w) holds
    (perm_p((h % 4) * 4 + w % 4) - 8) / 4, perm_p(c) = (c * (2 * (p % 8) + 1) + 7 * p) % 16
    (an odd multiplier permutes 0..15)."""
    for i in range(cuda.grid(1), a.size, cuda.gridsize(1)):
        p, q = i // hw, i % hw
        cell = ((q // w_) % 4) * 4 + (q % w_) % 4
        a[i] = float32((cell * (2 * (p % 8) + 1) + 7 * p) % 16 - 8) * float32(0.25)


@cuda.jit
def _separable(a, f, u, v, hw, w_):
    """a[i] = f[i // hw] * u[(i % hw) // w_] * v[i % w_]: an (N*C, H, W) outer product."""
    for i in range(cuda.grid(1), a.size, cuda.gridsize(1)):
        q = i % hw
        a[i] = float32(f[i // hw]) * float32(u[q // w_]) * float32(v[q % w_])


@cuda.jit
def _fill_nan(a):
    for i in range(cuda.grid(1), a.size, cuda.gridsize(1)):
        a[i] = float32(math.nan)


@cuda.jit
def _count_nonfinite(a, out):
    for i in range(cuda.grid(1), a.size, cuda.gridsize(1)):
        v = float32(a[i])
        if not (v - v == float32(0)):           # NaN or +-inf
            cuda.atomic.add(out, 0, 1)


@cuda.jit
def _count_relu_errors(x, y, dy, dx, out):
    """Elements where y != max(x, 0) or dx != (dy if x > 0 else 0), exactly (a NaN counts)."""
    zero = float32(0)
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        xi = float32(x[i])
        want_y = xi if xi > zero else zero
        want_dx = float32(dy[i]) if xi > zero else zero
        if not (float32(y[i]) == want_y and float32(dx[i]) == want_dx):
            cuda.atomic.add(out, 0, 1)


def _flat(a):
    return a.reshape(a.size) if a.ndim != 1 else a


def _run(kernel, *args):
    kernel[_BLOCKS, _THREADS](*args)
    cuda.synchronize()


def pattern(shape, dtype, mult, mod, scale):
    """A device array of ``shape`` holding ``_pattern`` values centred on 0."""
    a = cuda.device_array(shape, dtype)
    _run(_pattern, _flat(a), mult, mod, mod // 2, scale)
    return a


def tiles(shape, dtype):
    a = cuda.device_array(shape, dtype)
    _run(_tiles, _flat(a), shape[-2] * shape[-1], shape[-1])
    return a


def separable(shape, dtype, f, u, v):
    """The (N, C, H, W) device array f[n, c] * u[h] * v[w] (f, u, v host arrays)."""
    a = cuda.device_array(shape, dtype)
    _run(_separable, _flat(a), cuda.to_device(np.ravel(f)), cuda.to_device(u), cuda.to_device(v),
         shape[-2] * shape[-1], shape[-1])
    return a


def _count(kernel, *arrays):
    out = cuda.to_device(np.zeros(1, np.int64))
    _run(kernel, *[_flat(a) for a in arrays], out)
    return int(out.copy_to_host()[0])


def nonfinite(a):
    """How many elements of ``a`` are NaN or infinite."""
    return _count(_count_nonfinite, a)


def relu_errors(x, y, dy, dx):
    return _count(_count_relu_errors, x, y, dy, dx)


def poison(*shapes_dtypes):
    """Fill with NaN, then free, one dnnkit-allocator block per (shape, dtype): the op's
    outputs of those sizes (default stream) then take these blocks (the cache hands out the
    lowest free block of a size, and at these sizes no other is free), so an element the op never writes stays NaN instead of holding
    another run's correct answer. Best effort: with another allocator the check is weaker,
    never wrong."""
    from dnnkit import arrays
    blocks = [arrays.cuda_empty(s, d, arrays.as_stream(None)) for s, d in shapes_dtypes]
    for b in blocks:
        _run(_fill_nan, _flat(b))
    del blocks
