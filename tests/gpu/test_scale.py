"""Ops on tensors of more than 2**31 elements, on both backends, on a real GPU: relu, softmax
(instance mode), max and average pooling, and convolution (forward with bias, data, filter and
bias gradients). The Numba kernels index in 64 bits; the cuDNN path splits each call into
pieces under cuDNN's 32-bit limit (dnnkit/ops/split.py) and must report more than one piece.

Inputs are float16 (half the memory; every check below allows for it) made on the GPU.
Checks: relu against its closed form on every element (on the GPU); the others against the
float64 reference (dnnkit.reference) on sampled rows / planes / images, always including the
first, those around element 2**31, those around the cuDNN piece boundaries and the last ones,
and the convolution's filter and bias gradients against a closed form (separable inputs);
every output of every op is checked for NaN on the GPU after its allocator block was filled
with NaN (tests/gpu/scale_kernels.py ``poison``): an element never written fails. Device
memory per test: relu and softmax 17.5 GB of arrays, pooling 11.5 GB, convolution 8.8 GB plus
cuDNN's workspace (<= 4 GiB); a test is skipped, with the reason, unless that plus a 4 GiB
margin is free (so it fits an 80 GB H100), and frees everything when it ends.

Run: python3 -m pytest tests/gpu/test_scale.py -q -rs -s   (-s prints what ran, per test)
"""

import gc

import numpy as np
import pytest

import dnnkit
from dnnkit import memory, reference
from dnnkit.ops import split
from tests.gpu import scale_kernels
from tests.conftest import REL_TOL, backend_params

pytestmark = pytest.mark.gpu

F16 = np.dtype(np.float16)
TOL = REL_TOL["float16"]
# Sizes (elements past 2**31: the last pieces and the last elements matter most)
RELU_N = 2**31 + 2**25
SOFTMAX = (2**19 + 2**13, 4096)              # rows x columns, instance mode
POOL_X, POOL_GEO = (8600, 16, 126, 126), (3, 2, 1)   # window, stride, padding
CONV_X = (152000, 4, 60, 60)                 # element 2**31 is in image 149130
CONV_W = (4, 4, 3, 3)                        # padding 1: y has x's shape
GIB = 2**30
MARGIN = 4 * GIB       # cuDNN workspaces (dnn.conv.workspace_limit: <= 4 GiB), Numba scratch


@pytest.fixture(autouse=True)
def _release():
    _flush()
    yield
    _flush()


def _flush():
    """Give every freed block back to the driver: Python's, Numba's deferred frees, dnnkit's
    allocator cache."""
    from numba import cuda
    gc.collect()
    memory.empty_cache()
    cuda.current_context().deallocations.clear()


def _need(*arrays_bytes):
    from numba import cuda
    need = sum(arrays_bytes) + MARGIN
    free, total = cuda.current_context().get_memory_info()
    if free < need:
        pytest.skip(f"needs {need / GIB:.1f} GiB of free GPU memory; {free / GIB:.1f} GiB "
                    f"free of {total / GIB:.1f}")


@pytest.fixture
def ran(request, record_property):
    """ran(trace): print and record which backend ran each call and, on cuDNN, in how many
    pieces (read right after the call)."""
    def report(t, pieces):
        line = f"{request.node.name}: {[(e.op, e.backend) for e in t]}, cuDNN pieces {pieces}"
        print(line)
        record_property("ran", line)
    return report


def _call(fn, *args, backend, **kw):
    """(output, trace, cuDNN pieces or None) of one op call."""
    with dnnkit.trace() as t:
        out = fn(*args, backend=backend, **kw)
    assert t.backends() == [backend], (t.backends(), [e.reason for e in t])
    pieces = split.last_pieces() if backend == "cudnn" else None
    if backend == "cudnn":
        assert pieces > 1, "a call over cuDNN's 32-bit limit ran unsplit"
    return out, t, pieces


def _samples(count, per_item, rng, group=1, extra=4):
    """Indices of items (of ``per_item`` elements) to check: the first, the last, those
    holding elements 2**31 - 1 and 2**31, either side of each cuDNN piece boundary (pieces
    of whole groups of ``group`` items: pooling splits images of C planes), ``extra`` random
    ones."""
    edge = split.LIMIT + 1                   # 2**31: the first element past 32-bit indexing
    at = {0, 1, count - 2, count - 1, (edge - 1) // per_item, edge // per_item}
    for start, _ in split.bounds(count // group, per_item * group)[1:]:
        at |= {start * group - 1, start * group}
    at |= set(rng.integers(0, count, extra).tolist())
    return sorted(i for i in at if 0 <= i < count)


def _close(got, ref, tol, what):
    got = np.asarray(got, np.float64)
    assert np.isfinite(got).all(), f"{what}: non-finite values"
    err = reference.rel_error(got, ref)
    assert err <= tol, f"{what}: relative error {err:.3g} > {tol:.3g}"


def _written(*outputs):
    for i, a in enumerate(outputs):
        assert scale_kernels.nonfinite(a) == 0, \
            f"output {i}: NaN or inf (unwritten elements stay NaN)"


# ---------------------------------------------------------------- relu

@pytest.mark.parametrize("backend", backend_params())
def test_relu_past_2_31_elements(backend, ran):
    n = RELU_N
    _need(4 * n * 2)
    x = scale_kernels.pattern((n,), F16, 69069, 2001, 1 / 256)   # multiples of 1/256, +-3.9
    dy = scale_kernels.pattern((n,), F16, 40503, 255, 1 / 64)
    scale_kernels.poison(((n,), F16), ((n,), F16))
    y, t1, p1 = _call(dnnkit.activation, x, "relu", backend=backend)
    dx, t2, p2 = _call(dnnkit.activation_backward, x, y, dy, "relu", backend=backend)
    ran(t1 + t2, (p1, p2))
    assert scale_kernels.relu_errors(x, y, dy, dx) == 0


# ---------------------------------------------------------------- softmax

@pytest.mark.parametrize("backend", backend_params())
def test_softmax_instance_past_2_31_elements(backend, ran, rng):
    rows, cols = SOFTMAX
    _need(4 * rows * cols * 2)
    x = scale_kernels.pattern((rows, cols), F16, 69069, 8191, 1 / 1024)    # [-4, 4]
    dy = scale_kernels.pattern((rows, cols), F16, 40503, 255, 1 / 128)
    scale_kernels.poison(((rows, cols), F16), ((rows, cols), F16))
    y, t1, p1 = _call(dnnkit.softmax, x, "accurate", "instance", backend=backend)
    dx, t2, p2 = _call(dnnkit.softmax_backward, y, dy, "accurate", "instance", backend=backend)
    ran(t1 + t2, (p1, p2))
    _written(y, dx)
    for r in _samples(rows, cols, rng):
        xr, dyr = x[r:r + 1].copy_to_host(), dy[r:r + 1].copy_to_host()
        ref = reference.softmax(xr, "accurate", "instance")
        _close(y[r:r + 1].copy_to_host(), ref, TOL, f"y row {r}")
        _close(dx[r:r + 1].copy_to_host(),
               reference.softmax_backward(ref, dyr, "accurate", "instance"), 4 * TOL,
               f"dx row {r}")


# ---------------------------------------------------------------- pooling

@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("mode", ["max", "average_inc_pad"])
def test_pooling_past_2_31_elements(backend, mode, ran, rng):
    (shape, (k, s, p)) = POOL_X, POOL_GEO
    y_shape = shape[:2] + tuple((d + 2 * p - k) // s + 1 for d in shape[2:])
    nx, ny = int(np.prod(shape)), int(np.prod(y_shape))
    _need(2 * nx * 2 + 2 * ny * 2 + ny)
    x = scale_kernels.tiles(shape, F16)                  # no ties in a window: any max rule agrees
    dy = scale_kernels.pattern(y_shape, F16, 40503, 15, 1 / 8)
    scale_kernels.poison((y_shape, F16), (shape, F16))
    y, t1, p1 = _call(dnnkit.pool2d, x, k, s, p, mode, backend=backend)
    dx, t2, p2 = _call(dnnkit.pool2d_backward, x, y, dy, k, s, p, mode, backend=backend)
    ran(t1 + t2, (p1, p2))
    _written(y, dx)
    plane = shape[2] * shape[3]
    for q in _samples(shape[0] * shape[1], plane, rng, group=shape[1]):
        at = tuple(int(v) for v in np.unravel_index(q, shape[:2]))
        xq = x[at].copy_to_host()[None, None]
        _close(y[at].copy_to_host()[None, None], reference.pool_forward(xq, k, s, p, mode), TOL,
               f"y plane {at}")
        ref = reference.pool_backward(xq, dy[at].copy_to_host()[None, None], k, s, p, mode)
        _close(dx[at].copy_to_host()[None, None], ref, 2 * TOL, f"dx plane {at}")


# ---------------------------------------------------------------- convolution

GEO = dict(stride=(1, 1), padding=(1, 1), dilation=(1, 1))


def _factors(rng, n, c, h, w):
    """Separable data f[n, c] * u[h] * v[w] in powers of two: exact in float16."""
    pick = lambda *size: rng.choice([-1.0, -0.5, 0.5, 1.0], size)   # noqa: E731
    return pick(n, c) / 4, pick(h), pick(w)


def _conv_need():
    _need(2 * int(np.prod(CONV_X)) * 2)


def _images(a, i):
    return a[i:i + 1].copy_to_host()


@pytest.mark.parametrize("backend", backend_params())
def test_conv_forward_past_2_31_elements(backend, ran, rng):
    _conv_need()
    x = scale_kernels.separable(CONV_X, F16, *_factors(rng, *CONV_X))
    w = rng.standard_normal(CONV_W).astype(F16)
    b = rng.standard_normal(CONV_W[0]).astype(F16)
    scale_kernels.poison((CONV_X, F16))
    y, t, pieces = _call(dnnkit.conv2d, x, w, b, padding=1, backend=backend)
    ran(t, pieces)
    _written(y)
    for i in _samples(CONV_X[0], int(np.prod(CONV_X[1:])), rng):
        ref = reference.conv_forward(_images(x, i), w, b, **GEO)
        _close(_images(y, i), ref, TOL, f"y image {i}")


@pytest.mark.parametrize("backend", backend_params())
def test_conv_backward_data_past_2_31_elements(backend, ran, rng):
    _conv_need()
    dy = scale_kernels.separable(CONV_X, F16, *_factors(rng, *CONV_X))
    w = rng.standard_normal(CONV_W).astype(F16)
    scale_kernels.poison((CONV_X, F16))
    dx, t, pieces = _call(dnnkit.conv2d_backward_data, dy, w, CONV_X, padding=1,
                          backend=backend)
    ran(t, pieces)
    _written(dx)
    for i in _samples(CONV_X[0], int(np.prod(CONV_X[1:])), rng):
        ref = reference.conv_backward_data(_images(dy, i), w, (1,) + CONV_X[1:], **GEO)
        _close(_images(dx, i), ref, TOL, f"dx image {i}")


def _shifted_dot(a, b, tap):
    """sum_o a[o + tap - 1] * b[o] with a zero outside: a separable factor of dw (padding 1)."""
    pad = np.concatenate([[0.0], a, [0.0]])
    return float(np.dot(pad[tap:tap + len(b)], b))


@pytest.mark.parametrize("backend", backend_params())
def test_conv_filter_and_bias_gradients_past_2_31_elements(backend, ran, rng):
    """With x = f[n, c] u[h] v[w] and dy = g[n, k] p[h] q[w], the gradients factor:
    dw[k, c, r, s] = (sum_n f[n, c] g[n, k]) (sum_h u[h + r - 1] p[h]) (sum_w v[w + s - 1] q[w])
    and db[k] = (sum_n g[n, k]) (sum p) (sum q): a float64 reference without a 2**31 loop."""
    _conv_need()
    fx, fy = _factors(rng, *CONV_X), _factors(rng, *CONV_X)
    x, dy = scale_kernels.separable(CONV_X, F16, *fx), scale_kernels.separable(CONV_X, F16, *fy)
    dw, t1, p1 = _call(dnnkit.conv2d_backward_filter, x, dy, CONV_W, padding=1,
                       backend=backend)
    db, t2, p2 = _call(dnnkit.conv_backward_bias, dy, backend=backend)
    ran(t1 + t2, (p1, p2))
    taps = [[_shifted_dot(fx[i], fy[i], t) for t in range(3)] for i in (1, 2)]
    ref = np.einsum("nc,nk,r,s->kcrs", fx[0], fy[0], taps[0], taps[1])
    _close(dw.copy_to_host(), ref, TOL, "dw")
    _close(db.copy_to_host(), fy[0].sum(axis=0) * fy[1].sum() * fy[2].sum(), TOL, "db")
