import numpy as np
import pytest

import dnnkit
from dnnkit import reference
from dnnkit.ops import batchnorm, batchnorm_numba
from tests.conftest import DTYPES, REL_TOL, SIMULATOR, backend_params

# (shape, parameter shape form): 2-D to 5-D, with (C,) and (1, C, 1...) parameters.
SHAPES = [((5, 3), "flat"), ((3, 2, 7), "broadcast"), ((3, 2, 3, 4), "flat"),
          ((2, 2, 2, 3, 3), "broadcast")]
MODES = ["spatial", "per-activation"]
PDT = {"float16": np.float32, "float32": np.float32, "float64": np.float64}


@pytest.fixture(autouse=True)
def _small_blocks(monkeypatch):
    """The simulator runs a Python thread per CUDA thread: cap blocks at 64 threads there (the
    kernels take any power-of-two block; test_plans_cover_every_mapping checks the mappings)."""
    if SIMULATOR:
        monkeypatch.setattr(batchnorm_numba, "THREADS", 64)


def _pshape(shape, mode, form="flat"):
    flat, broadcast = batchnorm.param_shapes(shape, mode)
    return flat if form == "flat" else broadcast


def _params(rng, shape, mode, dtype, form="flat"):
    ps, pdt = _pshape(shape, mode, form), PDT[dtype]
    return ((1 + 0.5 * rng.standard_normal(ps)).astype(pdt), rng.standard_normal(ps).astype(pdt),
            rng.standard_normal(ps).astype(pdt), (0.5 + rng.random(ps)).astype(pdt))


def _err(got, ref, scale=None):
    """max|got - ref| over the natural scale (max|ref|, or a given floor)."""
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    s = max(np.abs(ref).max(), scale or 0.0)
    return np.abs(got - ref).max() / s


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape,form", SHAPES)
def test_train_backward_inference_match_float64(rng, shape, form, mode, dtype, backend):
    x = (rng.standard_normal(shape) * 2 + 0.5).astype(dtype)
    gamma, beta, rm, rv = _params(rng, shape, mode, dtype, form)
    rm0, rv0 = rm.copy(), rv.copy()
    with dnnkit.trace() as t:
        y, mean, invstd = dnnkit.batch_norm_train(x, gamma, beta, mode=mode, momentum=0.2,
                                                  running_mean=rm, running_var=rv,
                                                  backend=backend)
    assert t.backends() == [backend]
    ry, rmean, rinv, rrm, rrv = reference.batch_norm_train(x, gamma, beta, mode, 1e-5, 0.2,
                                                           rm0, rv0)
    assert y.shape == shape and y.dtype == np.dtype(dtype)
    assert mean.shape == gamma.shape and mean.dtype == PDT[dtype] == invstd.dtype
    tol = REL_TOL[dtype]
    assert _err(y.copy_to_host(), ry) <= 2 * tol
    # Statistics are float32 even for float16 data: only the float16 input rounding is left.
    stat_tol = 2 * REL_TOL["float32" if dtype == "float16" else dtype]
    for got, ref in ((mean.copy_to_host(), rmean), (invstd.copy_to_host(), rinv),
                     (rm, rrm), (rv, rrv)):
        assert got.dtype == PDT[dtype]
        assert _err(got, ref) <= stat_tol

    dy = rng.standard_normal(shape).astype(dtype)
    dx, dgamma, dbeta = dnnkit.batch_norm_backward(x, dy, gamma, mean, invstd, mode=mode,
                                                   backend=backend)
    rdx, rdg, rdb = reference.batch_norm_backward(x, dy, gamma, mean.copy_to_host(),
                                                  invstd.copy_to_host(), mode)
    assert dgamma.shape == dbeta.shape == gamma.shape and dgamma.dtype == PDT[dtype]
    # dx is a difference of O(|dy|) terms: measure it against max|dy| as well.
    assert _err(dx.copy_to_host(), rdx, np.abs(dy).max()) <= 4 * tol
    assert _err(dgamma.copy_to_host(), rdg, np.abs(dy).max()) <= 4 * tol
    assert _err(dbeta.copy_to_host(), rdb, np.abs(dy).max()) <= 4 * tol

    yi = dnnkit.batch_norm_inference(x, gamma, beta, rm0, rv0, mode=mode, epsilon=1e-3,
                                     backend=backend)
    ryi = reference.batch_norm_inference(x, gamma, beta, rm0, rv0, mode, 1e-3)
    assert _err(yi.copy_to_host(), ryi) <= 2 * tol


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("running", [True, False])
@pytest.mark.parametrize("shape,form,mode", [((3, 2, 3, 4), "flat", "spatial"),
                                             ((3, 2, 7), "broadcast", "spatial"),
                                             ((4, 2, 3), "flat", "per-activation")])
def test_repeated_device_calls_run_their_runner_on_each_calls_arrays(rng, shape, form, mode,
                                                                      dtype, running, backend):
    """Device arrays: the second and third calls of one signature are memo hits and run the
    op's runner (ops/batchnorm_runners.py: Numba launches packed once, or the bound cuDNN
    call) on their own arrays; each call's outputs, running statistics (updated in place, in
    the caller's array) and gradients match the float64 reference."""
    from numba import cuda
    from dnnkit import fastpath
    hits = fastpath.stats["hits"]
    for k in range(3):
        x = (rng.standard_normal(shape) * 2 + 0.5).astype(dtype)
        dy = rng.standard_normal(shape).astype(dtype)
        gamma, beta, rm, rv = _params(rng, shape, mode, dtype, form)
        kw = {}
        if running:
            kw = dict(running_mean=cuda.to_device(rm), running_var=cuda.to_device(rv))
        d = [cuda.to_device(a) for a in (x, gamma, beta, dy)]
        y, mean, invstd = dnnkit.batch_norm_train(d[0], d[1], d[2], mode=mode, momentum=0.3,
                                                  backend=backend, **kw)
        ry, rmean, rinv, rrm, rrv = reference.batch_norm_train(x, gamma, beta, mode, 1e-5, 0.3,
                                                               rm, rv)
        stat_tol = 2 * REL_TOL["float32"]
        assert mean.shape == invstd.shape == gamma.shape
        assert _err(y.copy_to_host(), ry) <= 2 * REL_TOL[dtype]
        assert _err(mean.copy_to_host(), rmean) <= stat_tol
        assert _err(invstd.copy_to_host(), rinv) <= stat_tol
        if running:
            assert _err(kw["running_mean"].copy_to_host(), rrm) <= stat_tol
            assert _err(kw["running_var"].copy_to_host(), rrv) <= stat_tol
        dx, dgamma, dbeta = dnnkit.batch_norm_backward(d[0], d[3], d[1], mean, invstd, mode=mode,
                                                       backend=backend)
        rdx, rdg, rdb = reference.batch_norm_backward(x, dy, gamma, mean.copy_to_host(),
                                                      invstd.copy_to_host(), mode)
        assert dgamma.shape == dbeta.shape == gamma.shape
        for got, ref in ((dx, rdx), (dgamma, rdg), (dbeta, rdb)):
            assert _err(got.copy_to_host(), ref, np.abs(dy).max()) <= 4 * REL_TOL[dtype]
    assert fastpath.stats["hits"] - hits == 4      # calls 2 and 3, forward and backward


@pytest.mark.parametrize("mode", MODES)
def test_reference_gradient_is_the_jacobian(rng, mode):
    """The float64 backward reference against central differences of the training forward
    (batch statistics depend on x), for x, gamma and beta."""
    x = rng.standard_normal((3, 2, 2))
    gamma, beta = 1 + rng.random(_pshape(x.shape, mode)), rng.standard_normal(
        _pshape(x.shape, mode))
    w = rng.standard_normal(x.shape)    # loss = sum(w * y): dy = w

    def loss(x_, g_, b_):
        return (w * reference.batch_norm_train(x_, g_, b_, mode)[0]).sum()

    _, mean, invstd, _, _ = reference.batch_norm_train(x, gamma, beta, mode)
    dx, dg, db = reference.batch_norm_backward(x, w, gamma, mean, invstd, mode)
    h = 1e-6
    for arr, grad, which in ((x, dx, 0), (gamma, dg, 1), (beta, db, 2)):
        fd = np.zeros_like(arr)
        for idx in np.ndindex(arr.shape):
            args_p, args_m = [x.copy(), gamma.copy(), beta.copy()], [x.copy(), gamma.copy(),
                                                                      beta.copy()]
            args_p[which][idx] += h
            args_m[which][idx] -= h
            fd[idx] = (loss(*args_p) - loss(*args_m)) / (2 * h)
        np.testing.assert_allclose(grad, fd, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("mode", MODES)
def test_backend_gradient_by_directional_difference(rng, mode, backend):
    """float64: <dx, v> + <dgamma, vg> + <dbeta, vb> equals the central difference of
    sum(w * y) along (v, vg, vb), with y and the gradients from the backend itself."""
    x = rng.standard_normal((4, 2, 3))
    ps = _pshape(x.shape, mode)
    gamma, beta = 1 + rng.random(ps), rng.standard_normal(ps)
    w = rng.standard_normal(x.shape)
    v, vg, vb = rng.standard_normal(x.shape), rng.standard_normal(ps), rng.standard_normal(ps)

    def loss(t):
        y, _, _ = dnnkit.batch_norm_train(x + t * v, gamma + t * vg, beta + t * vb, mode=mode,
                                          backend=backend)
        return (w * y.copy_to_host()).sum()

    _, mean, invstd = dnnkit.batch_norm_train(x, gamma, beta, mode=mode, backend=backend)
    dx, dg, db = dnnkit.batch_norm_backward(x, w, gamma, mean, invstd, mode=mode,
                                            backend=backend)
    analytic = ((dx.copy_to_host() * v).sum() + (dg.copy_to_host() * vg).sum()
                + (db.copy_to_host() * vb).sum())
    h = 1e-5
    fd = (loss(h) - loss(-h)) / (2 * h)
    assert abs(analytic - fd) <= 1e-7 * max(1.0, abs(fd))


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("shape", [(16, 2, 40), (200, 3)])
def test_large_mean_does_not_cancel(rng, shape, backend):
    """Mean 1e4, std 1 in float32: E[x^2] - E[x]^2 loses every digit (shown below); the
    statistics must not."""
    x = (1e4 + rng.standard_normal(shape)).astype(np.float32)
    c = shape[1]
    gamma, beta = np.ones(c, np.float32), np.zeros(c, np.float32)
    y, mean, invstd = dnnkit.batch_norm_train(x, gamma, beta, backend=backend)
    ry, rmean, rinv, _, _ = reference.batch_norm_train(x, gamma, beta)
    axes = (0,) + tuple(range(2, x.ndim))
    naive_var = (x * x).mean(axis=axes, dtype=np.float32) - x.mean(axis=axes) ** 2
    naive_inv = 1 / np.sqrt(np.maximum(naive_var, 0) + np.float32(1e-5))
    assert np.abs(naive_inv / rinv - 1).max() > 0.1      # the naive formula fails here
    tol = 1e-6 if backend == "numba" else 1e-4
    assert np.abs(invstd.copy_to_host() / rinv - 1).max() <= tol
    # the saved mean is one float32 near 1e4: within an ulp (9.8e-4)
    assert np.abs(mean.copy_to_host() - rmean).max() <= 1e-3
    assert _err(y.copy_to_host(), ry) <= 1e-3     # mostly that mean rounding, times invstd


def test_numba_results_are_bitwise_repeatable(rng, monkeypatch):
    monkeypatch.setattr(batchnorm_numba, "THREADS", 32)
    x = rng.standard_normal((4, 3, 40)).astype(np.float32)
    gamma, beta = np.ones(3, np.float32), np.zeros(3, np.float32)
    plan = batchnorm_numba.plan(*batchnorm_numba.ncs(x.shape, "spatial"))
    assert plan.grid[0] > 1     # several partials per channel: the merge order matters
    dy = rng.standard_normal(x.shape).astype(np.float32)
    runs = []
    for _ in range(2):
        y, m, v = dnnkit.batch_norm_train(x, gamma, beta, backend="numba")
        dx, dg, db = dnnkit.batch_norm_backward(x, dy, gamma, m, v, backend="numba")
        runs.append([a.copy_to_host() for a in (y, m, v, dx, dg, db)])
    for a, b in zip(*runs):
        assert np.array_equal(a, b)


# (shape, mode, threads cap, grid-y cap, what the plan must show)
PLANS = [
    ((2, 2, 300), "spatial", 32, 1, lambda p: p.sw == 32 and p.splits_i > 1),   # long rows,
    ((64, 3), "spatial", 32, 65535, lambda p: p.sw == 1 and p.grid[0] > 1),    # S == 1 split
    ((3, 20, 6), "spatial", 64, 1, lambda p: p.cw == 8 and p.grid[1] == 1),    # 3 groups
    ((5, 3, 2, 2), "per-activation", 64, 65535, lambda p: p.sw == 1 and p.cw == 16),
]


@pytest.mark.parametrize("shape,mode,threads,grid_y,check", PLANS)
def test_plans_cover_every_mapping(rng, monkeypatch, shape, mode, threads, grid_y, check):
    """Long rows split along positions, sample splits with S == 1, channel groups walked by
    a short grid, per-activation: each mapping against the float64 reference."""
    monkeypatch.setattr(batchnorm_numba, "THREADS", threads)
    monkeypatch.setattr(batchnorm_numba, "MAX_GRID_Y", grid_y)
    assert check(batchnorm_numba.plan(*batchnorm_numba.ncs(shape, mode)))
    x = (rng.standard_normal(shape) * 3 + 2).astype(np.float32)
    gamma, beta, _, _ = _params(rng, shape, mode, "float32")
    y, m, v = dnnkit.batch_norm_train(x, gamma, beta, mode=mode, backend="numba")
    ry, rm, rv, _, _ = reference.batch_norm_train(x, gamma, beta, mode)
    assert _err(y.copy_to_host(), ry) <= 1e-6
    assert _err(v.copy_to_host(), rv) <= 1e-6 and _err(m.copy_to_host(), rm) <= 1e-6
    dy = rng.standard_normal(shape).astype(np.float32)
    dx, dg, db = dnnkit.batch_norm_backward(x, dy, gamma, m, v, mode=mode, backend="numba")
    rdx, rdg, rdb = reference.batch_norm_backward(x, dy, gamma, m.copy_to_host(),
                                                  v.copy_to_host(), mode)
    for got, ref in ((dx, rdx), (dg, rdg), (db, rdb)):
        assert _err(got.copy_to_host(), ref, np.abs(dy).max()) <= 1e-5


@pytest.mark.parametrize("backend", backend_params())
def test_running_statistics(rng, backend):
    from numba import cuda
    x = rng.standard_normal((6, 2, 5)).astype(np.float32)
    gamma, beta = np.ones(2, np.float32), np.zeros(2, np.float32)
    m, var_u = x.mean(axis=(0, 2)), x.astype(np.float64).var(axis=(0, 2), ddof=1)
    # NumPy float64 arrays, updated in place (computed in float32, written back)
    rm, rv = np.zeros(2), np.ones(2)
    dnnkit.batch_norm_train(x, gamma, beta, momentum=1.0, running_mean=rm, running_var=rv,
                            backend=backend)
    np.testing.assert_allclose(rm, m, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(rv, var_u, rtol=1e-6)     # unbiased: m/(m-1)
    # device arrays, updated in place; momentum 0 leaves them
    drm, drv = cuda.to_device(np.full((1, 2, 1), 3.0, np.float32)), cuda.to_device(
        np.full((1, 2, 1), 4.0, np.float32))
    dnnkit.batch_norm_train(x, gamma, beta, momentum=0.0, running_mean=drm, running_var=drv,
                            backend=backend)
    assert np.array_equal(drm.copy_to_host(), np.full((1, 2, 1), 3.0, np.float32))
    dnnkit.batch_norm_train(x, gamma, beta, momentum=0.25, running_mean=drm, running_var=drv,
                            backend=backend)
    np.testing.assert_allclose(drm.copy_to_host().ravel(), 0.75 * 3 + 0.25 * m, rtol=1e-6)
    np.testing.assert_allclose(drv.copy_to_host().ravel(), 0.75 * 4 + 0.25 * var_u, rtol=1e-6)


def test_parameter_forms_and_host_conversion(rng):
    x = rng.standard_normal((3, 2, 4)).astype(np.float16)
    g64 = 1 + rng.random(2)          # float64 host parameters are converted to float32
    b = rng.standard_normal((1, 2, 1))
    y1, m1, _ = dnnkit.batch_norm_train(x, g64, b.ravel(), backend="numba")
    y2, m2, _ = dnnkit.batch_norm_train(x, g64.reshape(1, 2, 1), b, backend="numba")
    assert m1.shape == (2,) and m2.shape == (1, 2, 1) and m1.dtype == np.float32
    assert np.array_equal(y1.copy_to_host(), y2.copy_to_host())


def test_inference_takes_a_single_sample_and_empty_batch():
    x = np.arange(6, dtype=np.float32).reshape(1, 2, 3)
    g, b, m, v = (np.array(a, np.float32) for a in ([2, 1], [0, 1], [1, 4], [4, 1]))
    y = dnnkit.batch_norm_inference(x, g, b, m, v, epsilon=1e-5, backend="numba").copy_to_host()
    np.testing.assert_allclose(y, reference.batch_norm_inference(x, g, b, m, v), rtol=1e-6,
                               atol=1e-6)
    e = dnnkit.batch_norm_inference(np.zeros((0, 2, 3), np.float32), g, b, m, v)
    assert e.shape == (0, 2, 3)


@pytest.mark.parametrize("backend", backend_params())
def test_empty_inputs_on_every_backend(monkeypatch, backend):
    """Empty images (backward: the parameter gradients sum nothing, so they are 0, not
    whatever the allocator handed out: outputs are NaN-poisoned here) and C = 0 (every output
    empty) on each backend; cuDNN, which rejects empty tensors, is not called."""
    from dnnkit import arrays

    real = arrays.cuda_empty

    def poisoned(shape, dtype, stream):
        a = real(shape, dtype, stream)
        if a.size:
            a.copy_to_device(np.full(a.shape, np.nan, dtype), stream=stream)
        return a
    monkeypatch.setattr(arrays, "cuda_empty", poisoned)
    x = np.zeros((2, 3, 0, 2), np.float32)
    g, m, s = np.ones(3, np.float32), np.zeros(3, np.float32), np.ones(3, np.float32)
    dx, dg, db = dnnkit.batch_norm_backward(x, x, g, m, s, backend=backend)
    assert dx.shape == x.shape
    np.testing.assert_array_equal(dg.copy_to_host(), np.zeros(3))
    np.testing.assert_array_equal(db.copy_to_host(), np.zeros(3))
    assert dnnkit.batch_norm_inference(x, g, g, m, s, backend=backend).shape == x.shape
    x0, p0 = np.zeros((2, 0, 2, 2), np.float32), np.zeros(0, np.float32)
    y, mean, invstd = dnnkit.batch_norm_train(x0, p0, p0, backend=backend)
    assert (y.shape, mean.shape, invstd.shape) == ((2, 0, 2, 2), (0,), (0,))


def test_small_epsilon_runs_numba_under_auto_and_refuses_cudnn():
    x = np.ones((4, 2), np.float32)
    g = np.ones(2, np.float32)
    chosen, why = dnnkit.select_backend("batch_norm_train", x, g, g, epsilon=1e-6, explain=True)
    assert chosen == "numba" and "epsilon 1e-06" in why and "1e-05" in why
    with dnnkit.trace() as t:
        dnnkit.batch_norm_train(x, g, g, epsilon=1e-6)
    assert t.backends() == ["numba"]
    with pytest.raises(dnnkit.CudnnUnavailableError, match=r"batch_norm_train: .*epsilon 1e-06"):
        dnnkit.batch_norm_train(x, g, g, epsilon=1e-6, backend="cudnn")
    for op, args in (("batch_norm_inference", (x, g, g, g, g)),
                     ("batch_norm_backward", (x, x, g, g, g))):
        with pytest.raises(dnnkit.CudnnUnavailableError, match="epsilon 1e-06"):
            dnnkit.select_backend(op, *args, epsilon=1e-6, backend="cudnn")


def _x():
    return np.ones((3, 2, 4), np.float32)


_g = np.ones(2, np.float32)


@pytest.mark.parametrize("call,exc,words", [
    (lambda x: dnnkit.batch_norm_train(x, _g, _g, mode="channel"), ValueError,
     ["batch_norm_train", "mode", "channel", "per-activation"]),
    (lambda x: dnnkit.batch_norm_train(x, _g, _g, epsilon=0), ValueError, ["epsilon", "0"]),
    (lambda x: dnnkit.batch_norm_train(x, _g, _g, epsilon=float("nan")), ValueError,
     ["epsilon", "nan"]),
    (lambda x: dnnkit.batch_norm_inference(x, _g, _g, _g, _g, epsilon="small"), TypeError,
     ["batch_norm_inference", "epsilon", "small"]),
    (lambda x: dnnkit.batch_norm_train(x, _g, _g, momentum=1.5), ValueError,
     ["momentum", "1.5"]),
    (lambda x: dnnkit.batch_norm_train(x, _g, _g, momentum=None), TypeError,
     ["momentum", "None"]),
    (lambda x: dnnkit.batch_norm_train(x[0, 0], _g, _g), ValueError, ["2-D", "(4,)"]),
    (lambda x: dnnkit.batch_norm_train(x.reshape(1, 3, 1, 2, 1, 4), _g, _g), ValueError,
     ["batch_norm_train", "x", "(1, 3, 1, 2, 1, 4)"]),
    (lambda x: dnnkit.batch_norm_train(x.astype(np.int32), _g, _g), TypeError,
     ["batch_norm_train", "int32"]),
    (lambda x: dnnkit.batch_norm_train(x, np.ones(3, np.float32), _g), ValueError,
     ["gamma", "(3,)", "(2,)", "(1, 2, 1)"]),
    (lambda x: dnnkit.batch_norm_train(x, _g, _g, mode="per-activation"), ValueError,
     ["gamma", "(2,)", "(2, 4)", "(1, 2, 4)"]),
    (lambda x: dnnkit.batch_norm_train(x.astype(np.float16), _dev(np.float16), _g), TypeError,
     ["gamma", "float32", "float16"]),
    (lambda x: dnnkit.batch_norm_train(x.astype(np.float64), _g, _dev(np.float32)), TypeError,
     ["beta", "float64", "float32"]),
    (lambda x: dnnkit.batch_norm_train(x[:1, :, :1], _g, _g), ValueError,
     ["more than one value", "(1, 2, 1)", "1"]),
    (lambda x: dnnkit.batch_norm_train(x, _g, _g, running_mean=np.zeros(2)), ValueError,
     ["running_mean", "running_var", "both"]),
    (lambda x: dnnkit.batch_norm_train(x, _g, _g, running_mean=[0.0, 0.0],
                                       running_var=np.ones(2)), TypeError,
     ["running_mean", "list", "in place"]),
    (lambda x: dnnkit.batch_norm_train(x, _g, _g, running_mean=_readonly(),
                                       running_var=np.ones(2)), ValueError,
     ["running_mean", "read-only"]),
    (lambda x: dnnkit.batch_norm_backward(x, x[:2], _g, _g, _g), ValueError,
     ["batch_norm_backward", "dy", "(2, 2, 4)", "(3, 2, 4)"]),
    (lambda x: dnnkit.batch_norm_backward(x[:0], x[:0], _g, _g, _g), ValueError,
     ["batch_norm_backward", "empty batch"]),
    (lambda x: dnnkit.batch_norm_backward(x, x, _g, np.ones(5, np.float32), _g), ValueError,
     ["saved_mean", "(5,)"]),
    (lambda x: dnnkit.batch_norm_inference(x, _g, _g, _g, np.ones((2, 2))), ValueError,
     ["batch_norm_inference", "var", "(2, 2)"]),
])
def test_bad_arguments_name_op_and_values(call, exc, words):
    with pytest.raises(exc) as ei:
        call(_x())
    for w in words:
        assert w in str(ei.value)


def _dev(dtype):
    from numba import cuda
    return cuda.to_device(np.ones(2, dtype))


def _readonly():
    a = np.zeros(2)
    a.flags.writeable = False
    return a
