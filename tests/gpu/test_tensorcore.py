"""The GEMM's tensor-core modes on a real GPU (compute capability 8.0 or later): float16 on HMMA
(``mma.m16n8k16`` with float32 accumulators) through the GEMM's three layouts and the
convolution's three passes, and float32's single TF32 product where ``dnn.conv.allow_tf32``
is on, each against float64.

Expected errors (max |got - ref| / max |ref|): float16 products are exact in float32, so a
GEMM into float32 C is as accurate as float32 accumulation (~1e-6); a float16 output adds its
rounding (2^-11 of an element, under 1e-3 of the maximum). One TF32 product rounds A and B to
10 mantissa bits: errors of order 1e-4, far above 3xTF32's ~1e-6, below 2^-11 x 8."""

import numpy as np
import pytest

import dnnkit
from dnnkit import reference

pytestmark = pytest.mark.gpu


def _need_tensor_cores():
    from numba import cuda
    if tuple(cuda.get_current_device().compute_capability) < (8, 0):
        pytest.skip("tensor cores (mma f16 / tf32) need compute capability 8.0")


def _rel(got, ref):
    return float(np.abs(got.astype(np.float64) - ref).max() / np.abs(ref).max())


def _kernels(prefix):
    from dnnkit.kernels import hmma
    from dnnkit.kernels.gemm import VARIANTS
    pipelined = list(hmma.VARIANTS.values()) if prefix == "hmma" else []
    return [k for n, k in VARIANTS.items() if f"_{prefix}_" in n] + pipelined


@pytest.mark.parametrize("layout", ["00", "10", "01"])
@pytest.mark.parametrize("m, n, k", [(200, 300, 72), (64, 1000, 1000), (513, 129, 16)])
def test_hmma_gemm_against_float64(rng, layout, m, n, k):
    from numba import cuda

    from dnnkit.ops import gemm
    _need_tensor_cores()
    assert gemm.tc_prefix(np.float16) == "hmma"
    a = rng.standard_normal((m, k)).astype(np.float16)
    b = rng.standard_normal((k, n)).astype(np.float16)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    sa = a.T.copy() if layout[0] == "1" else a      # stored k x m
    sb = b.T.copy() if layout[1] == "1" else b      # stored n x k
    lda, ldb = (m if layout[0] == "1" else k), (k if layout[1] == "1" else n)
    c = cuda.device_array(m * n, np.float32)         # float32 C: the accumulation itself
    gemm.gemm(layout, cuda.to_device(sa.ravel()), cuda.to_device(sb.ravel()), c, (m, n, k),
              (lda, ldb, n), gemm.PLAIN * 3, gemm.NO_BATCH, stream=cuda.default_stream())
    got = c.copy_to_host().reshape(m, n)
    assert _rel(got, ref) < 1e-5
    plans = [p for key, p in gemm._plans.items() if key[0] == layout and key[1] == (m, n, k)
             and key[4] == np.float16]
    assert plans and all(any(p[0] is kern for kern in _kernels("hmma")) for p in plans)


# (x shape, w shape, stride, padding, groups): im2col + GEMM (strided 5x5), the implicit GEMM
# (stride-1 3x3, 64 channels), 1x1 (x read in place), grouped, depthwise, 3-D
CONVS = [((4, 16, 31, 17), (32, 16, 5, 5), 2, 2, 1),
         ((2, 64, 20, 20), (64, 64, 3, 3), 1, 1, 1),
         ((4, 128, 9, 9), (96, 128, 1, 1), 1, 0, 1),
         ((2, 32, 14, 14), (64, 8, 3, 3), 1, 1, 4),
         ((2, 32, 14, 14), (32, 1, 3, 3), 2, 1, 32),
         ((2, 8, 6, 10, 10), (16, 8, 3, 3, 3), 1, 1, 1)]


def _passes(X, W, DY, x_shape, w_shape, stride, padding, groups):
    nd = len(x_shape) - 2
    fwd, bwd_d, bwd_f = ((dnnkit.conv2d, dnnkit.conv2d_backward_data,
                          dnnkit.conv2d_backward_filter) if nd == 2 else
                         (dnnkit.conv3d, dnnkit.conv3d_backward_data,
                          dnnkit.conv3d_backward_filter))
    kw = dict(stride=stride, padding=padding, groups=groups, backend="numba")
    return [fwd(X, W, **kw).copy_to_host(),
            bwd_d(DY, W, x_shape, **kw).copy_to_host(),
            bwd_f(X, DY, w_shape, **kw).copy_to_host()]


def _references(x, w, dy, stride, padding, groups):
    nd = x.ndim - 2
    geo = ((stride,) * nd, (padding,) * nd, (1,) * nd)
    x, w, dy = (a.astype(np.float64) for a in (x, w, dy))
    return [reference.conv_forward(x, w, None, *geo, groups=groups),
            reference.conv_backward_data(dy, w, x.shape, *geo, groups=groups),
            reference.conv_backward_filter(x, dy, w.shape, *geo, groups=groups)]


def _inputs(rng, dtype, x_shape, w_shape, stride, padding):
    from numba import cuda
    nd = len(x_shape) - 2
    out = tuple((i + 2 * padding - r) // stride + 1 for i, r in zip(x_shape[2:], w_shape[2:]))
    fan_in = int(np.prod(w_shape[1:]))
    x = rng.standard_normal(x_shape).astype(dtype)
    w = (rng.standard_normal(w_shape) / np.sqrt(fan_in)).astype(dtype)
    dy = rng.standard_normal((x_shape[0], w_shape[0]) + out).astype(dtype)
    assert len(out) == nd
    return (x, w, dy), tuple(cuda.to_device(a) for a in (x, w, dy))


@pytest.mark.parametrize("x_shape, w_shape, stride, padding, groups", CONVS)
def test_float16_convs_on_hmma_against_float64(rng, x_shape, w_shape, stride, padding, groups):
    from dnnkit.ops import gemm
    _need_tensor_cores()
    (x, w, dy), (X, W, DY) = _inputs(rng, np.float16, x_shape, w_shape, stride, padding)
    gemm._plans.clear()
    got = _passes(X, W, DY, x_shape, w_shape, stride, padding, groups)
    ref = _references(x, w, dy, stride, padding, groups)
    for name, g, r in zip(("forward", "data gradient", "filter gradient"), got, ref):
        assert np.isfinite(g).all(), name
        # float16 outputs: their rounding (2^-11 of an element) and float32 sums
        assert _rel(g, r) < 2e-3, (name, _rel(g, r))
    # the float16 GEMMs ran on HMMA; a depthwise convolution runs none (its direct kernels)
    hmma = _kernels("hmma")
    plans = [p for key, p in gemm._plans.items() if key[4] == np.float16]
    if groups == x_shape[1] == w_shape[0]:
        assert not plans
    else:
        assert plans and all(any(p[0] is k for k in hmma) for p in plans)


@pytest.mark.parametrize("x_shape, w_shape, stride, padding, groups",
                         [CONVS[0], CONVS[1], CONVS[2]])
def test_allow_tf32_switches_the_float32_gemm(rng, monkeypatch, x_shape, w_shape, stride,
                                             padding, groups):
    _need_tensor_cores()
    # the GEMM paths: the direct kernels (a 16-channel layer's data gradient) multiply in
    # FP32 whatever the flag says (docs/conv.md)
    from dnnkit.ops.conv_tuning import settings
    monkeypatch.setattr(settings, "direct", False)
    (x, w, dy), (X, W, DY) = _inputs(rng, np.float32, x_shape, w_shape, stride, padding)
    ref = _references(x, w, dy, stride, padding, groups)
    err = {}
    for tf32 in (False, True):
        with dnnkit.config.change_flags({"dnn.conv.allow_tf32": tf32}):
            got = _passes(X, W, DY, x_shape, w_shape, stride, padding, groups)
        err[tf32] = [_rel(g, r) for g, r in zip(got, ref)]
    for off, on in zip(err[False], err[True]):
        assert off < 1e-5, err           # 3xTF32: float32's order
        assert on < 8 * 2.0**-11, err    # one TF32 product: 10-bit operands
        assert on > 5 * off, err         # and TF32 did run


def test_precision_float16_runs_and_accumulates_in_float32(rng):
    # dnn.conv.precision float16 (a float16 compute type): the same HMMA path with float32
    # accumulators, so as accurate as the default
    _need_tensor_cores()
    x_shape, w_shape = (4, 64, 12, 12), (64, 64, 3, 3)
    (x, w, dy), (X, W, DY) = _inputs(rng, np.float16, x_shape, w_shape, 1, 1)
    ref = reference.conv_forward(x.astype(np.float64), w.astype(np.float64), None, (1, 1),
                                 (1, 1), (1, 1))
    for precision in ("float16", "as_input_f32"):
        got = dnnkit.conv2d(X, W, padding=1, precision=precision,
                            backend="numba").copy_to_host()
        assert _rel(got, ref) < 2e-3, precision
