"""Batch normalization and dropout on a real GPU at realistic sizes: cuDNN vs Numba vs a
float64 reference (BN 64x256x56x56), statistics of both dropout generators, cuDNN's cached
RNG states, PyTorch as an independent oracle where installed."""

import numpy as np
import pytest

import dnnkit
from dnnkit import reference
from dnnkit.kernels.dropout import keep_mask_host, mask_key
from dnnkit.testing import assert_backends_agree

pytestmark = pytest.mark.gpu

BIG = (64, 256, 56, 56)
BOTH = ["numba", pytest.param("cudnn", marks=pytest.mark.cudnn)]
PDT = {"float16": np.float32, "float32": np.float32, "float64": np.float64}
# norm-wise (max|got - ref| / max|ref|) vs float64: y, statistics, dx (vs max|dy|), dgamma/dbeta
TOL = {"float16": (4e-3, 2e-5, 1e-2, 2e-3), "float32": (2e-6, 2e-6, 2e-5, 2e-5),
       "float64": (1e-13, 1e-13, 1e-12, 1e-12)}


def _err(got, ref, floor=0.0):
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    return np.abs(got - ref).max() / max(np.abs(ref).max(), floor)


def _bn_inputs(rng, shape, mode, dtype):
    from dnnkit.ops.batchnorm import param_shapes
    ps, pdt = param_shapes(shape, mode)[0], PDT[dtype]
    x = (rng.standard_normal(shape, np.float32) * 2 + 0.5).astype(dtype)
    return (x, (1 + 0.3 * rng.standard_normal(ps)).astype(pdt), rng.standard_normal(ps).astype(pdt),
            rng.standard_normal(ps).astype(pdt), (0.5 + rng.random(ps)).astype(pdt))


def _check_bn(rng, shape, mode, dtype, backend, ts=None):
    ty, ts_default, tdx, tdg = TOL[dtype]
    ts = ts_default if ts is None else ts
    x, g, b, rm, rv = _bn_inputs(rng, shape, mode, dtype)
    rm0, rv0 = rm.copy(), rv.copy()
    y, mean, invstd = dnnkit.batch_norm_train(x, g, b, mode=mode, running_mean=rm,
                                              running_var=rv, backend=backend)
    ry, rmean, rinv, rrm, rrv = reference.batch_norm_train(x, g, b, mode, 1e-5, 0.1, rm0, rv0)
    assert _err(y.copy_to_host(), ry) <= ty
    for got, ref in ((mean.copy_to_host(), rmean), (invstd.copy_to_host(), rinv),
                     (rm, rrm), (rv, rrv)):
        assert _err(got, ref) <= ts
    del ry
    dy = np.random.default_rng(1).standard_normal(shape, np.float32).astype(dtype)
    dx, dg, db = dnnkit.batch_norm_backward(x, dy, g, mean, invstd, mode=mode, backend=backend)
    rdx, rdg, rdb = reference.batch_norm_backward(x, dy, g, mean.copy_to_host(),
                                                  invstd.copy_to_host(), mode)
    assert _err(dx.copy_to_host(), rdx, np.abs(dy).max()) <= tdx
    assert _err(dg.copy_to_host(), rdg) <= tdg and _err(db.copy_to_host(), rdb) <= tdg
    del rdx
    yi = dnnkit.batch_norm_inference(x, g, b, rm0, rv0, mode=mode, backend=backend)
    assert _err(yi.copy_to_host(), reference.batch_norm_inference(x, g, b, rm0, rv0, mode)) <= ty


@pytest.mark.parametrize("backend", BOTH)
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_bn_spatial_64x256x56x56_vs_float64(rng, dtype, backend):
    _check_bn(rng, BIG, "spatial", dtype, backend)


@pytest.mark.parametrize("backend", BOTH)
@pytest.mark.parametrize("shape,mode", [((32, 64, 14, 14), "per-activation"),
                                        ((8192, 1024), "spatial"),
                                        ((8, 32, 16, 32, 32), "spatial"),
                                        ((4, 3, 224, 224), "spatial")])
def test_bn_other_layouts_vs_float64(rng, shape, mode, backend):
    # Statistics over 8192 to 200,704 values per channel: measured on an H200, Numba's
    # float32 merges reach 6e-6 to 8e-6 relative (cuDNN < 2e-6); 1e-5 still fails anything
    # worse than a few dozen ulps.
    _check_bn(rng, shape, mode, "float32", backend, ts=1e-5)


@pytest.mark.cudnn
@pytest.mark.parametrize("mode", ["spatial", "per-activation"])
def test_bn_cudnn_and_numba_agree(rng, mode):
    shape = BIG if mode == "spatial" else (64, 64, 28, 28)
    x, g, b, _, _ = _bn_inputs(rng, shape, mode, "float32")
    _, mean, invstd = assert_backends_agree(dnnkit.batch_norm_train, x, g, b, mode=mode)
    dy = rng.standard_normal(shape, np.float32)
    assert_backends_agree(dnnkit.batch_norm_backward, x, dy, g, mean, invstd, mode=mode)


@pytest.mark.parametrize("backend", BOTH)
def test_bn_large_mean_does_not_cancel(rng, backend):
    x = (1e4 + rng.standard_normal((64, 64, 56, 56), np.float32)).astype(np.float32)
    g, b = np.ones(64, np.float32), np.zeros(64, np.float32)
    _, mean, invstd = dnnkit.batch_norm_train(x, g, b, backend=backend)
    _, rmean, rinv, _, _ = reference.batch_norm_train(x, g, b)
    # Numba: full float32 accuracy. cuDNN's algorithm is not documented: only catastrophic
    # cancellation (errors of order 1, as E[x^2] - E[x]^2 gives) fails it.
    assert np.abs(invstd.copy_to_host() / rinv - 1).max() <= (1e-6 if backend == "numba" else 1e-2)
    # 2.5 ulps of float32 at 1e4 (one ulp is 9.8e-4): cuDNN was measured 1.2 ulps off
    assert np.abs(mean.copy_to_host() - rmean).max() <= 2.5e-3


def test_bn_numba_is_bitwise_repeatable(rng):
    x, g, b, _, _ = _bn_inputs(rng, BIG, "spatial", "float32")
    dy = rng.standard_normal(BIG, np.float32)
    runs = []
    for _ in range(2):
        y, m, v = dnnkit.batch_norm_train(x, g, b, backend="numba")
        dx, dg, db = dnnkit.batch_norm_backward(x, dy, g, m, v, backend="numba")
        runs.append([a.copy_to_host() for a in (y, m, v, dx, dg, db)])
    for a, c in zip(*runs):
        assert np.array_equal(a, c)


@pytest.mark.cudnn
def test_bn_small_epsilon_runs_numba_under_auto_and_raises_when_forced(rng):
    x, g, b, _, _ = _bn_inputs(rng, (16, 8, 7, 7), "spatial", "float32")
    with dnnkit.trace() as t:
        dnnkit.batch_norm_train(x, g, b, epsilon=1e-5)
        dnnkit.batch_norm_train(x, g, b, epsilon=1e-6)
    assert t.backends() == ["cudnn", "numba"]
    with pytest.raises(dnnkit.CudnnUnavailableError, match="epsilon 1e-06"):
        dnnkit.batch_norm_train(x, g, b, epsilon=1e-6, backend="cudnn")


def test_bn_matches_pytorch(rng):
    torch = pytest.importorskip("torch")
    x, g, b, rm, rv = _bn_inputs(rng, (32, 64, 28, 28), "spatial", "float32")
    t = [torch.as_tensor(a, device="cuda", dtype=torch.float64) for a in (x, g, b, rm, rv)]
    ty = torch.nn.functional.batch_norm(t[0], t[3], t[4], t[1], t[2], training=True,
                                        momentum=0.1, eps=1e-5)
    for backend in ("numba", "cudnn"):
        try:
            rm_, rv_ = rm.copy(), rv.copy()
            y, _, _ = dnnkit.batch_norm_train(x, g, b, running_mean=rm_, running_var=rv_,
                                              backend=backend)
        except dnnkit.CudnnUnavailableError:
            continue
        assert _err(y.copy_to_host(), ty.cpu().numpy()) <= 2e-6
        assert _err(rv_, t[4].cpu().numpy()) <= 2e-6    # PyTorch's running var is unbiased too


# ---------------------------------------------------------------- dropout

def _binomial_ok(kept, p, sigmas=6):
    n = kept.size
    return abs(kept.mean() - (1 - p)) <= sigmas * np.sqrt(p * (1 - p) / n) + 1 / n


@pytest.mark.parametrize("backend", BOTH)
@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("p", [0.1, 0.5])
def test_dropout_statistics_scale_and_backward(rng, p, dtype, backend):
    x = (rng.standard_normal(BIG, np.float32) + 4).astype(dtype)   # no zeros
    y, state = dnnkit.dropout(x, p, seed=42, backend=backend)
    h = y.copy_to_host()
    kept = h != 0
    assert _binomial_ok(kept, p)
    want = (x.astype(np.float32) * np.float32(1 / (1 - p))).astype(dtype)
    rtol = 2e-3 if dtype == "float16" else 1e-6     # one float16 rounding either way
    assert np.allclose(h[kept], want[kept], rtol=rtol)
    dx = dnnkit.dropout_backward(x, state).copy_to_host()
    assert np.array_equal(dx != 0, kept) and np.allclose(dx, h, rtol=rtol)
    assert np.array_equal(state.mask(), kept)


@pytest.mark.parametrize("backend", BOTH)
def test_dropout_same_seed_same_mask_across_calls_and_streams(rng, backend):
    from numba import cuda
    x = rng.standard_normal((1 << 22,), np.float32) + 4
    d = cuda.to_device(x)
    first, _ = dnnkit.dropout(d, 0.3, seed=7, backend=backend)
    again = [dnnkit.dropout(d, 0.3, seed=7, backend=backend)[0] for _ in range(3)]
    s1, s2 = cuda.stream(), cuda.stream()
    on_streams = [dnnkit.dropout(d, 0.3, seed=7, backend=backend, stream=s)[0] for s in (s1, s2)]
    s1.synchronize()
    s2.synchronize()
    ref = first.copy_to_host()
    for y in again + on_streams:
        assert np.array_equal(y.copy_to_host(), ref)
    other = dnnkit.dropout(d, 0.3, seed=8, backend=backend)[0].copy_to_host()
    r = 0.3 ** 2 + 0.7 ** 2       # two independent masks agree with probability p^2 + q^2
    assert abs(((other != 0) == (ref != 0)).mean() - r) < 0.01


def test_dropout_numba_mask_is_the_counter_based_function():
    n = (1 << 24) + 3
    y, _ = dnnkit.dropout(np.ones(n, np.float32), 0.37, seed=2**63 + 5, backend="numba")
    assert np.array_equal(y.copy_to_host() != 0,
                          keep_mask_host(mask_key(2**63 + 5), round(0.37 * 2**32), n))


@pytest.mark.cudnn
def test_dropout_states_are_kept_per_backend(rng):
    x = rng.standard_normal((64, 1000), np.float32) + 4
    _, numba_state = dnnkit.dropout(x, 0.5, seed=1, backend="numba")
    _, cudnn_state = dnnkit.dropout(x, 0.5, seed=1, backend="cudnn")
    with pytest.raises(dnnkit.CudnnUnavailableError, match="numba backend"):
        dnnkit.dropout_backward(x, numba_state, backend="cudnn")
    with pytest.raises(ValueError, match="cudnn backend"):
        dnnkit.dropout_backward(x, cudnn_state, backend="numba")
    with dnnkit.trace() as t:
        dnnkit.dropout_backward(x, numba_state)
        dnnkit.dropout_backward(x, cudnn_state)
    assert t.backends() == ["numba", "cudnn"]
