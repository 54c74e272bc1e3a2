"""Batch normalization with a fused relu (``activation="relu"``) and residual (``residual=z``):
the three ops against the float64 reference on both backends, the memo's runners, the gradient
rules, the in-place checks and the argument errors."""

import numpy as np
import pytest

import dnnkit
from dnnkit import fastpath, reference
from dnnkit.ops import batchnorm, batchnorm_numba
from tests.conftest import REL_TOL, SIMULATOR, backend_params

SHAPES = [((4, 3, 2, 5), "spatial"), ((6, 5), "spatial"), ((4, 2, 3), "per-activation"),
          ((3, 2, 2, 2, 3), "spatial")]
PDT = {"float16": np.float32, "float32": np.float32, "float64": np.float64}


@pytest.fixture(autouse=True)
def _small_blocks(monkeypatch):
    if SIMULATOR:         # one Python thread per CUDA thread (as tests/ops/test_batchnorm.py)
        monkeypatch.setattr(batchnorm_numba, "THREADS", 64)


def _err(got, ref, scale=None):
    got, ref = np.asarray(got, np.float64), np.asarray(ref, np.float64)
    return np.abs(got - ref).max() / max(np.abs(ref).max(), scale or 0.0)


def _inputs(rng, shape, mode, dtype):
    ps, pdt = batchnorm.param_shapes(shape, mode)[0], PDT[dtype]
    x = (rng.standard_normal(shape) * 2 + 0.5).astype(dtype)
    return (x, (1 + 0.5 * rng.standard_normal(ps)).astype(pdt),
            rng.standard_normal(ps).astype(pdt), rng.standard_normal(ps).astype(pdt),
            (0.5 + rng.random(ps)).astype(pdt))


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("shape,mode", SHAPES)
def test_fused_relu_matches_float64(rng, shape, mode, dtype, backend):
    x, gamma, beta, rm, rv = _inputs(rng, shape, mode, dtype)
    rm0, rv0 = rm.copy(), rv.copy()
    with dnnkit.trace() as t:
        y, mean, invstd = dnnkit.batch_norm_train(x, gamma, beta, mode=mode, running_mean=rm,
                                                  running_var=rv, backend=backend,
                                                  activation="relu")
    assert t.ops() == ["batch_norm_train"] and t.backends() == [backend]
    ry, rmean, rinv, rrm, rrv = reference.batch_norm_train(x, gamma, beta, mode, 1e-5, 0.1,
                                                           rm0, rv0, "relu")
    yh = y.copy_to_host()
    tol = REL_TOL[dtype]
    assert yh.min() == 0 and (yh == 0).mean() > 0.1      # the relu ran: a share clipped
    assert _err(yh, ry) <= 2 * tol
    stat_tol = 2 * REL_TOL["float32" if dtype == "float16" else dtype]
    for got, ref in ((mean.copy_to_host(), rmean), (invstd.copy_to_host(), rinv), (rm, rrm),
                     (rv, rrv)):
        assert _err(got, ref) <= stat_tol

    dy = rng.standard_normal(shape).astype(dtype)
    dx, dgamma, dbeta = dnnkit.batch_norm_backward(x, dy, gamma, mean, invstd, mode=mode,
                                                   backend=backend, activation="relu", y=y)
    # the slope from the op's own y (a reference y rounding across 0 would flip it)
    rdx, rdg, rdb = reference.batch_norm_backward(x, dy, gamma, mean.copy_to_host(),
                                                  invstd.copy_to_host(), mode, "relu", yh)
    for got, ref in ((dx, rdx), (dgamma, rdg), (dbeta, rdb)):
        assert _err(got.copy_to_host(), ref, np.abs(dy).max()) <= 4 * tol
    # against the unfused gradient: a plain backward of dy masked where y == 0
    masked = np.where(yh > 0, dy, 0).astype(dtype)
    ux, _, _ = dnnkit.batch_norm_backward(x, masked, gamma, mean, invstd, mode=mode,
                                          backend=backend)
    assert _err(dx.copy_to_host(), ux.copy_to_host(), np.abs(dy).max()) <= 4 * tol

    yi = dnnkit.batch_norm_inference(x, gamma, beta, rm0, rv0, mode=mode, backend=backend,
                                     activation="relu")
    ryi = reference.batch_norm_inference(x, gamma, beta, rm0, rv0, mode, 1e-5, "relu")
    assert yi.copy_to_host().min() == 0
    assert _err(yi.copy_to_host(), ryi) <= 2 * tol


@pytest.mark.parametrize("backend", backend_params())
def test_fused_relu_inference_in_place(rng, backend):
    x, gamma, beta, rm, rv = _inputs(rng, (3, 2, 3, 4), "spatial", "float32")
    from numba import cuda
    d = cuda.to_device(x)
    dnnkit.batch_norm_inference(d, gamma, beta, rm, rv, out=d, backend=backend,
                                activation="relu")
    ref = reference.batch_norm_inference(x, gamma, beta, rm, rv, activation="relu")
    assert d.copy_to_host().min() == 0
    assert _err(d.copy_to_host(), ref) <= 2 * REL_TOL["float32"]


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("into", ["x", "residual"])
def test_residual_inference_in_place(rng, backend, into):
    """out=x or out=residual: y = relu(bn(x) + z) written over either input (cuDNN writes y
    before adding z, so out=residual adds a copy of z)."""
    from numba import cuda
    x, gamma, beta, rm, rv = _inputs(rng, (3, 2, 3, 4), "spatial", "float32")
    z = rng.standard_normal(x.shape).astype(np.float32)
    dx, dz = cuda.to_device(x), cuda.to_device(z)
    out = dx if into == "x" else dz
    dnnkit.batch_norm_inference(dx, gamma, beta, rm, rv, out=out, backend=backend,
                                activation="relu", residual=dz)
    ref = reference.batch_norm_inference(x, gamma, beta, rm, rv, activation="relu", residual=z)
    assert _err(out.copy_to_host(), ref) <= 4 * REL_TOL["float32"]


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_repeated_fused_calls_run_their_runners(rng, dtype, backend):
    """The second and third calls of each signature are memo hits (the runners of
    ops/batchnorm_runners.py with the relu) and still match the reference, each on its own
    arrays; an unfused call of the same shapes is a different signature."""
    from numba import cuda
    shape, mode = (3, 2, 3, 4), "spatial"
    hits = fastpath.stats["hits"]
    for _ in range(3):
        x, gamma, beta, rm, rv = _inputs(rng, shape, mode, dtype)
        dy = rng.standard_normal(shape).astype(dtype)
        d = [cuda.to_device(a) for a in (x, gamma, beta, dy)]
        y, mean, invstd = dnnkit.batch_norm_train(d[0], d[1], d[2], backend=backend,
                                                  activation="relu")
        ry = reference.batch_norm_train(x, gamma, beta, activation="relu")[0]
        assert _err(y.copy_to_host(), ry) <= 2 * REL_TOL[dtype]
        dx, dg, db = dnnkit.batch_norm_backward(d[0], d[3], d[1], mean, invstd, backend=backend,
                                                activation="relu", y=y)
        ref = reference.batch_norm_backward(x, dy, gamma, mean.copy_to_host(),
                                            invstd.copy_to_host(), mode, "relu",
                                            y.copy_to_host())
        for got, r in zip((dx, dg, db), ref):
            assert _err(got.copy_to_host(), r, np.abs(dy).max()) <= 4 * REL_TOL[dtype]
    assert fastpath.stats["hits"] - hits == 4
    y2, _, _ = dnnkit.batch_norm_train(d[0], d[1], d[2], backend=backend)
    assert y2.copy_to_host().min() < 0            # no relu: not the fused call's runner


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("training", [True, False])
def test_gradient_equals_the_unfused_graph(rng, backend, training):
    """Tensors: x, gamma and beta's gradients through the fused op are those through batch
    norm then a separate relu (same backend), in training and inference form."""
    x, gamma, beta, rm, rv = _inputs(rng, (4, 3, 2, 3), "spatial", "float64")
    dy = rng.standard_normal(x.shape)
    grads = []
    for fused in (True, False):
        ts = [dnnkit.tensor(a, requires_grad=True) for a in (x, gamma, beta)]
        act = "relu" if fused else None
        if training:
            y = dnnkit.batch_norm_train(*ts, backend=backend, activation=act)[0]
        else:
            y = dnnkit.batch_norm_inference(*ts, rm, rv, backend=backend, activation=act)
        if not fused:
            y = dnnkit.relu(y, backend=backend)
        y.backward(dnnkit.tensor(dy))
        grads.append([t.grad.numpy() for t in ts])
    for f, u in zip(*grads):
        assert np.isfinite(f).all()
        assert _err(f, u, 1.0) <= 1e-12


@pytest.mark.parametrize("backend", backend_params())
def test_fused_output_changed_in_place_refuses_backward(rng, backend):
    """The fused rule reads y (relu's slope): changing y in place after the forward makes
    backward raise; the plain rule does not read y, so an in-place relu on its output (the
    unfused pattern) still differentiates."""
    x, gamma, beta, _, _ = _inputs(rng, (4, 3, 2, 3), "spatial", "float32")
    xt = dnnkit.tensor(x, requires_grad=True)
    y = dnnkit.batch_norm_train(xt, gamma, beta, backend=backend, activation="relu")[0]
    dnnkit.relu(y, out=y, backend=backend)
    with pytest.raises(RuntimeError, match="batch_norm_train.*changed in place"):
        y.backward(dnnkit.tensor(np.ones(x.shape, np.float32)))
    xt = dnnkit.tensor(x, requires_grad=True)
    y = dnnkit.batch_norm_train(xt, gamma, beta, backend=backend)[0]
    dnnkit.relu(y, out=y, backend=backend)
    y.backward(dnnkit.tensor(np.ones(x.shape, np.float32)))
    assert np.isfinite(xt.grad.numpy()).all()


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("act", [None, "relu"])
@pytest.mark.parametrize("shape,mode", SHAPES[:3])
def test_residual_matches_float64(rng, shape, mode, act, dtype, backend):
    """y = act(bn(x) + z) in one call; backward(residual=True) returns z's gradient too."""
    x, gamma, beta, rm, rv = _inputs(rng, shape, mode, dtype)
    z = rng.standard_normal(shape).astype(dtype)
    with dnnkit.trace() as t:
        y, mean, invstd = dnnkit.batch_norm_train(x, gamma, beta, mode=mode, backend=backend,
                                                  activation=act, residual=z)
    assert t.ops() == ["batch_norm_train"]
    ry = reference.batch_norm_train(x, gamma, beta, mode, activation=act, residual=z)[0]
    tol = REL_TOL[dtype]
    yh = y.copy_to_host()
    assert _err(yh, ry) <= 4 * tol
    dy = rng.standard_normal(shape).astype(dtype)
    got = dnnkit.batch_norm_backward(x, dy, gamma, mean, invstd, mode=mode, backend=backend,
                                     activation=act, y=y if act else None, residual=True)
    ref = reference.batch_norm_backward(x, dy, gamma, mean.copy_to_host(),
                                        invstd.copy_to_host(), mode, act, yh, True)
    assert len(got) == 4 and got[3].shape == shape and got[3].dtype == np.dtype(dtype)
    for g, r in zip(got, ref):
        assert _err(g.copy_to_host(), r, np.abs(dy).max()) <= 4 * tol
    yi = dnnkit.batch_norm_inference(x, gamma, beta, rm, rv, mode=mode, backend=backend,
                                     activation=act, residual=z)
    ryi = reference.batch_norm_inference(x, gamma, beta, rm, rv, mode, activation=act,
                                         residual=z)
    assert _err(yi.copy_to_host(), ryi) <= 4 * tol


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("training", [True, False])
def test_residual_gradients_equal_the_unfused_graph(rng, backend, training):
    """relu(bn(x) + z) fused against batch norm, add and relu as three calls: the same
    gradients for x, gamma, beta and z (z needing one or not)."""
    x, gamma, beta, rm, rv = _inputs(rng, (4, 3, 2, 3), "spatial", "float64")
    z = rng.standard_normal(x.shape)
    dy = rng.standard_normal(x.shape)
    for z_grad in (True, False):
        grads = []
        for fused in (True, False):
            ts = [dnnkit.tensor(a, requires_grad=True) for a in (x, gamma, beta)]
            zt = dnnkit.tensor(z, requires_grad=z_grad)
            kw = dict(activation="relu", residual=zt) if fused else {}
            if training:
                y = dnnkit.batch_norm_train(*ts, backend=backend, **kw)[0]
            else:
                y = dnnkit.batch_norm_inference(*ts, rm, rv, backend=backend, **kw)
            if not fused:
                y = dnnkit.relu(dnnkit.add(y, zt, backend=backend), backend=backend)
            y.backward(dnnkit.tensor(dy))
            grads.append([t.grad.numpy() for t in ts] +
                         ([zt.grad.numpy()] if z_grad else [zt.grad]))
        for f, u in zip(*grads):
            if u is None:
                assert f is None
                continue
            assert np.isfinite(f).all()
            assert _err(f, u, 1.0) <= 1e-12


@pytest.mark.parametrize("backend", backend_params())
def test_repeated_residual_calls_run_their_runners(rng, backend):
    from numba import cuda
    shape = (3, 2, 3, 4)
    hits = fastpath.stats["hits"]
    for _ in range(3):
        x, gamma, beta, _, _ = _inputs(rng, shape, "spatial", "float32")
        z, dy = (rng.standard_normal(shape).astype(np.float32) for _ in range(2))
        d = [cuda.to_device(a) for a in (x, gamma, beta, z, dy)]
        y, mean, invstd = dnnkit.batch_norm_train(d[0], d[1], d[2], backend=backend,
                                                  activation="relu", residual=d[3])
        ry = reference.batch_norm_train(x, gamma, beta, activation="relu", residual=z)[0]
        assert _err(y.copy_to_host(), ry) <= 4 * REL_TOL["float32"]
        got = dnnkit.batch_norm_backward(d[0], d[4], d[1], mean, invstd, backend=backend,
                                         activation="relu", y=y, residual=True)
        ref = reference.batch_norm_backward(x, dy, gamma, mean.copy_to_host(),
                                            invstd.copy_to_host(), "spatial", "relu",
                                            y.copy_to_host(), True)
        for g, r in zip(got, ref):
            assert _err(g.copy_to_host(), r, np.abs(dy).max()) <= 4 * REL_TOL["float32"]
    assert fastpath.stats["hits"] - hits == 4


_x = np.ones((3, 2, 4), np.float32)
_g = np.ones(2, np.float32)


@pytest.mark.parametrize("call,words", [
    (lambda: dnnkit.batch_norm_train(_x, _g, _g, activation="gelu"),
     ["batch_norm_train", "activation", "relu", "gelu"]),
    (lambda: dnnkit.batch_norm_inference(_x, _g, _g, _g, _g, activation="tanh"),
     ["batch_norm_inference", "activation", "tanh"]),
    (lambda: dnnkit.batch_norm_backward(_x, _x, _g, _g, _g, activation="relu"),
     ["batch_norm_backward", "needs y"]),
    (lambda: dnnkit.batch_norm_backward(_x, _x, _g, _g, _g, activation="relu", y=_x[:2]),
     ["batch_norm_backward", "y", "(2, 2, 4)", "(3, 2, 4)"]),
    (lambda: dnnkit.batch_norm_backward(_x, _x, _g, _g, _g, activation=True),
     ["batch_norm_backward", "activation", "True"]),
])
def test_bad_activation_arguments_name_op_and_values(call, words):
    with pytest.raises(ValueError) as ei:
        call()
    for w in words:
        assert w in str(ei.value)


@pytest.mark.parametrize("call,exc,words", [
    (lambda: dnnkit.batch_norm_train(_x, _g, _g, residual=_x[:2]), ValueError,
     ["batch_norm_train", "residual", "(2, 2, 4)", "(3, 2, 4)"]),
    (lambda: dnnkit.batch_norm_train(_x, _g, _g, residual=_x.astype(np.float64)), TypeError,
     ["batch_norm_train", "residual", "float64", "float32"]),
    (lambda: dnnkit.batch_norm_inference(_x, _g, _g, _g, _g, residual=_x[:, :1]), ValueError,
     ["batch_norm_inference", "residual", "(3, 1, 4)"]),
    (lambda: dnnkit.batch_norm_backward(_x, _x, _g, _g, _g, residual="yes"), TypeError,
     ["batch_norm_backward", "residual", "yes"]),
])
def test_bad_residual_arguments_name_op_and_values(call, exc, words):
    with pytest.raises(exc) as ei:
        call()
    for w in words:
        assert w in str(ei.value)


@pytest.mark.parametrize("op,args", [("batch_norm_train", batchnorm.BatchNormTrainArgs),
                                     ("batch_norm_inference", batchnorm.BatchNormInferenceArgs),
                                     ("batch_norm_backward", batchnorm.BatchNormBackwardArgs)])
def test_every_implementation_takes_every_checked_argument(op, args):
    """The dispatcher calls each backend's function, ``supports`` and ``bind`` (and a bound
    runner) with the checked arguments' fields in order: every one of them must take them all,
    the fused ones included. (The cuDNN ones run only on a GPU: this catches a missing
    parameter on any machine.)"""
    import inspect
    from dnnkit.registry import REGISTRY
    fields = args._fields
    for backend, impl in REGISTRY[op].items():
        for what in ("fn", "supports", "bind"):
            f = getattr(impl, what)
            if f is not None:
                inspect.signature(f).bind(*fields)       # TypeError if one is missing
