"""Local response normalization across channels (dnnkit.lrn, lrn_backward): both backends against
the float64 reference over shapes x dtypes x window sizes, the reference against the formula
written out and against PyTorch's formulation, gradients against finite differences, autograd,
special values, empty shapes, argument errors, the cuDNN limits as fallback reasons, and the
cuDNN path's views and batch pieces with its calls faked (the real cuDNN runs on a GPU)."""

import numpy as np
import pytest

import dnnkit
from dnnkit import policy, reference
from dnnkit.cudnn import lrn as cudnn_lrn
from dnnkit.cudnn.loader import CudnnStatus
from dnnkit.ops import split
from dnnkit.registry import PREPARE, REGISTRY
from tests.conftest import DTYPES, REL_TOL, backend_params

# alpha large enough that the normalization changes y by tens of percent: with PyTorch's
# default 1e-4, y = x to four digits and a wrong window would pass every comparison
P = dict(alpha=2.0, beta=0.75, k=1.5)
SHAPES = [((2, 5, 3), 4), ((1, 6, 2, 3), 5), ((1, 4, 2, 1, 2), 3)]     # (x shape, size)


def _x(rng, shape, dtype):
    return rng.standard_normal(shape).astype(dtype)


def _loop_lrn(x, size, alpha, beta, k, before):
    """The formula element by element, the window starting ``before`` channels before c."""
    x = np.asarray(x, np.float64)
    y = np.empty_like(x)
    c_ = x.shape[1]
    for idx in np.ndindex(*x.shape):
        c = idx[1]
        s = sum(x[(idx[0], cc) + idx[2:]] ** 2
                for cc in range(c - before, c - before + size) if 0 <= cc < c_)
        y[idx] = x[idx] / (k + alpha / size * s) ** beta
    return y


def _torch_lrn(x, size, alpha, beta, k):
    """torch.nn.functional.local_response_norm's formulation in NumPy: x^2 zero-padded with
    size // 2 channels before and (size - 1) // 2 after, averaged over size channels."""
    x = np.asarray(x, np.float64)
    pad = [(0, 0)] * x.ndim
    pad[1] = (size // 2, (size - 1) // 2)
    sq = np.pad(x * x, pad)
    div = sum(sq[:, i:i + x.shape[1]] for i in range(size)) / size
    return x / (k + alpha * div) ** beta


# ---------------------------------------------------------------- against float64

@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,size", SHAPES, ids=[str(s[0]) for s in SHAPES])
def test_forward_and_backward_match_float64(rng, shape, size, dtype, backend):
    x, dy = _x(rng, shape, dtype), _x(rng, shape, dtype)
    with dnnkit.trace() as t:
        y = dnnkit.lrn(x, size, **P, backend=backend)
        dx = dnnkit.lrn_backward(x, y, dy, size, **P, backend=backend)
    assert t.backends() == [backend, backend] and t.ops() == ["lrn", "lrn_backward"]
    got = y.copy_to_host()
    assert got.dtype == np.dtype(dtype) and got.shape == shape
    assert reference.rel_error(got, reference.lrn(x, size, **P)) <= REL_TOL[dtype]
    # y enters the gradient in its own precision: allow that rounding on top of the op's
    ref_dx = reference.lrn_backward(x, dy, size, **P)
    assert dx.shape == shape
    assert reference.rel_error(dx.copy_to_host(), ref_dx) <= 4 * REL_TOL[dtype]


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("size", [1, 2, 3, 6, 7, 16, 17, 40])
def test_every_window_size_matches_float64(rng, size, backend):
    """Windows narrower and wider than C = 7, odd and even; 17 and 40 are over cuDNN's 16 and
    run on Numba under auto."""
    x, dy = _x(rng, (2, 7, 2), "float64"), _x(rng, (2, 7, 2), "float64")
    b = backend if size <= 16 else None
    y = dnnkit.lrn(x, size, **P, backend=b).copy_to_host()
    assert reference.rel_error(y, reference.lrn(x, size, **P)) <= REL_TOL["float64"]
    dx = dnnkit.lrn_backward(x, y, dy, size, **P, backend=b).copy_to_host()
    assert reference.rel_error(dx, reference.lrn_backward(x, dy, size, **P)) <= \
        4 * REL_TOL["float64"]


@pytest.mark.parametrize("backend", backend_params())
def test_the_window_is_cudnns_by_hand(backend):
    """x = [1, 2, 3] over channels, size 2 (window [c, c + 1]), alpha 2 (alpha/size = 1),
    beta 1, k 1: q = 1 + (1 + 4), 1 + (4 + 9), 1 + 9, so y = 1/6, 2/14, 3/10. PyTorch's window
    [c - 1, c] would give 1/2 for channel 0."""
    x = np.array([1.0, 2.0, 3.0]).reshape(1, 3, 1)
    y = dnnkit.lrn(x, 2, 2.0, 1.0, 1.0, backend=backend).copy_to_host().ravel()
    np.testing.assert_allclose(y, [1 / 6, 2 / 14, 3 / 10], rtol=1e-14)


# ---------------------------------------------------------------- the reference itself

@pytest.mark.parametrize("size", [1, 2, 3, 4, 5, 8])
def test_reference_is_the_formula_and_pytorchs_for_odd_sizes(rng, size):
    """The reference against the formula written out with cuDNN's window (lookBehind =
    (size - 1) // 2); PyTorch's formulation is the same for an odd size, and for an even one
    the mirror image (its window starts size // 2 channels before c)."""
    x = rng.standard_normal((2, 6, 3, 2))
    ours = reference.lrn(x, size, **P)
    np.testing.assert_allclose(ours, _loop_lrn(x, size, **P, before=(size - 1) // 2),
                               rtol=1e-13)
    torch = _torch_lrn(x, size, **P)
    np.testing.assert_allclose(torch, _loop_lrn(x, size, **P, before=size // 2), rtol=1e-13)
    if size % 2:
        np.testing.assert_allclose(ours, torch, rtol=1e-13)
    else:
        assert not np.allclose(ours, torch)
        flip = reference.lrn(x[:, ::-1], size, **P)[:, ::-1]
        np.testing.assert_allclose(flip, torch, rtol=1e-13)


@pytest.mark.parametrize("size", [1, 2, 5, 9])
def test_reference_gradient_is_the_derivative(rng, size):
    """reference.lrn_backward against central differences of reference.lrn, element by
    element (C = 6: the mirrored window of an even size is exercised at both edges)."""
    x, dy = rng.standard_normal((2, 6, 2)), rng.standard_normal((2, 6, 2))
    got = reference.lrn_backward(x, dy, size, **P)
    h, fd = 1e-6, np.empty_like(x)
    for idx in np.ndindex(*x.shape):
        e = np.zeros_like(x)
        e[idx] = h
        fd[idx] = ((reference.lrn(x + e, size, **P) - reference.lrn(x - e, size, **P))
                   * dy).sum() / (2 * h)
    np.testing.assert_allclose(got, fd, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("backend", backend_params())
def test_backward_is_the_derivative_of_the_forward(rng, backend):
    """The op's own backward against directional differences of the op's own forward
    (float64), so the backend's pair is consistent whatever the reference says."""
    shape, size = (2, 5, 2, 2), 3
    x, dy, v = (rng.standard_normal(shape) for _ in range(3))
    y = dnnkit.lrn(x, size, **P, backend=backend)
    dx = dnnkit.lrn_backward(x, y, dy, size, **P, backend=backend).copy_to_host()
    h = 1e-6
    plus = dnnkit.lrn(x + h * v, size, **P, backend=backend).copy_to_host()
    minus = dnnkit.lrn(x - h * v, size, **P, backend=backend).copy_to_host()
    numeric = ((plus - minus) * dy).sum() / (2 * h)
    assert abs(numeric - (dx * v).sum()) <= 1e-6 * max(1.0, np.abs(dx * v).sum())


@pytest.mark.parametrize("backend", backend_params())
def test_autograd_gives_the_backward(rng, backend):
    x = dnnkit.tensor(rng.standard_normal((2, 4, 3)), requires_grad=True)
    r = rng.standard_normal((2, 4, 3))
    y = dnnkit.lrn(x, 3, **P, backend=backend)
    assert isinstance(y, dnnkit.Tensor) and y.grad_fn.backend == backend
    (y * dnnkit.tensor(r)).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), reference.lrn_backward(x.numpy(), r, 3, **P),
                               rtol=1e-12, atol=1e-14)


# ---------------------------------------------------------------- special values and shapes

@pytest.mark.parametrize("backend", backend_params())
def test_nan_reaches_exactly_the_windows_that_hold_it(backend):
    """A NaN at channel 3 of 8, size 4 (window [c - 1, c + 2]): on Numba outputs 1..4 are
    NaN, the rest finite, as in the float64 reference. cuDNN (9.19, H100) keeps the NaN at
    its own channel and inside the window, but not at every output whose window holds it
    (channels 2 and 4 came out finite): the NaN never leaves the window, nor vanishes."""
    x = np.linspace(-1, 1, 16, dtype=np.float32).reshape(1, 8, 2)
    x[0, 3, 0] = np.nan
    y = dnnkit.lrn(x, 4, **P, backend=backend).copy_to_host()
    assert np.isfinite(y[0, [0, 5, 6, 7], 0]).all() and np.isfinite(y[0, :, 1]).all()
    assert np.isnan(y[0, 3, 0])
    if backend == "numba":
        assert np.isnan(y[0, 1:5, 0]).all()
        ref = reference.lrn(x, 4, **P)
        np.testing.assert_array_equal(np.isnan(y), np.isnan(ref))


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("shape", [(0, 3, 2), (2, 0, 2, 2), (2, 3, 0), (1, 2, 3, 0, 2)])
def test_empty_shapes_give_empty_results(shape, backend):
    x = np.zeros(shape, np.float32)
    y = dnnkit.lrn(x, 5, backend=backend)
    dx = dnnkit.lrn_backward(x, x, x, 5, backend=backend)
    assert y.shape == shape and dx.shape == shape


def test_beta_zero_is_the_identity_and_defaults_are_pytorchs(rng):
    x = _x(rng, (2, 6, 3), "float64")
    np.testing.assert_array_equal(dnnkit.lrn(x, 5, 3.0, 0.0, 1.0).copy_to_host(), x)
    np.testing.assert_allclose(dnnkit.lrn(x, 5).copy_to_host(),
                               reference.lrn(x, 5, 1e-4, 0.75, 1.0), rtol=1e-13)
    assert reference.lrn_window(5) == (2, 2) and reference.lrn_window(4) == (1, 2)


# ---------------------------------------------------------------- argument errors

@pytest.mark.parametrize("call,exc,words", [
    (lambda x: dnnkit.lrn(x, 0), ValueError, ["lrn", "size", "0"]),
    (lambda x: dnnkit.lrn(x, -3), ValueError, ["lrn", "size", "-3"]),
    (lambda x: dnnkit.lrn(x, 2.5), TypeError, ["lrn", "size", "2.5"]),
    (lambda x: dnnkit.lrn(x, True), TypeError, ["lrn", "size", "True"]),
    (lambda x: dnnkit.lrn(x, 5, alpha="big"), TypeError, ["lrn", "alpha", "big"]),
    (lambda x: dnnkit.lrn(x, 5, beta=float("nan")), ValueError, ["lrn", "beta", "nan"]),
    (lambda x: dnnkit.lrn(x, 5, k=float("inf")), ValueError, ["lrn", "k", "inf"]),
    (lambda x: dnnkit.lrn(x, 5, k=None), TypeError, ["lrn", "k", "None"]),
    (lambda x: dnnkit.lrn(x[0], 5), ValueError, ["lrn", "x", "3-D", "(3, 4)"]),
    (lambda x: dnnkit.lrn(x.reshape(1, 1, 1, 2, 3, 4), 5), ValueError, ["lrn", "x", "5-D"]),
    (lambda x: dnnkit.lrn(x.astype(np.int32), 5), TypeError, ["lrn", "int32"]),
    (lambda x: dnnkit.lrn("abc", 5), TypeError, ["lrn", "x"]),
    (lambda x: dnnkit.lrn(x, 5, backend="gpu"), ValueError, ["backend", "gpu"]),
    (lambda x: dnnkit.lrn_backward(x, x, x[:, :2], 5), ValueError,
     ["lrn_backward", "dy", "(2, 2, 4)", "(2, 3, 4)"]),
    (lambda x: dnnkit.lrn_backward(x, x.astype(np.float64), x, 5), TypeError,
     ["lrn_backward", "y", "float64", "float32"]),
    (lambda x: dnnkit.lrn_backward(x, x, x, 0), ValueError, ["lrn_backward", "size", "0"]),
    (lambda x: dnnkit.lrn_backward(x, x, x, 5, alpha=[1]), TypeError,
     ["lrn_backward", "alpha", "[1]"]),
])
def test_bad_arguments_name_op_and_values(call, exc, words):
    x = np.ones((2, 3, 4), np.float32)
    with pytest.raises(exc) as ei:
        call(x)
    for w in words:
        assert w in str(ei.value), (w, str(ei.value))


# ---------------------------------------------------------------- cuDNN's limits

def _supports(op, *args, **kw):
    return REGISTRY[op]["cudnn"].supports(*PREPARE[op](*args, **kw))


@pytest.mark.parametrize("kw,words", [
    (dict(size=17), ["1 to 16 channels", "size 17"]),
    (dict(size=40), ["size 40"]),
    (dict(k=9.9e-6), ["k >= 1e-05", "9.9e-06"]),
    (dict(k=0.0), ["k >= 1e-05"]),
    (dict(beta=0.0099), ["beta >= 0.01", "0.0099"]),
    (dict(beta=-0.5), ["beta >= 0.01", "-0.5"]),
])
def test_cudnn_limits_fall_back_to_numba_with_the_reason(kw, words):
    """cudnnSetLRNDescriptor's limits (tests/cudnn/test_lrn.py checks them against the real
    library): auto runs Numba and says why, forced raises with the same reason."""
    x = np.ones((1, 4, 2), np.float32)
    args = dict(size=5, alpha=1e-4, beta=0.75, k=1.0) | kw
    chosen, why = dnnkit.select_backend("lrn", x, **args, explain=True)
    assert chosen == "numba"
    for w in words:
        assert w in why, (w, why)
    assert dnnkit.select_backend("lrn_backward", x, x, x, **args, explain=True) == ("numba", why)
    with pytest.raises(dnnkit.CudnnUnavailableError) as ei:
        dnnkit.lrn(x, **args, backend="cudnn")
    assert ei.value.op == "lrn" and ei.value.reason == why
    y = dnnkit.lrn(x, **args).copy_to_host()                 # auto: Numba, the right answer
    np.testing.assert_allclose(y, reference.lrn(x, **args), rtol=1e-6)


@pytest.mark.parametrize("kw", [dict(size=1), dict(size=16), dict(k=1e-5), dict(beta=0.01),
                                dict(alpha=0.0), dict(alpha=-1.0), dict(size=2)])
def test_cudnn_takes_its_limits_themselves(kw):
    x = np.ones((1, 4, 2), np.float32)
    args = dict(size=5, alpha=1e-4, beta=0.75, k=1.0) | kw
    assert _supports("lrn", x, **args) is None
    assert _supports("lrn_backward", x, x, x, **args) is None


def test_a_sample_over_the_32_bit_limit_is_not_for_cudnn(monkeypatch):
    monkeypatch.setattr(split, "LIMIT", 23)
    x = np.ones((3, 4, 6), np.float32)                        # 24 elements per sample
    why = _supports("lrn", x, 5)
    assert "one sample of x (3, 4, 6) holds 24 elements" in why
    assert _supports("lrn_backward", x, x, x, 5) == why
    assert _supports("lrn", np.ones((3, 4, 5), np.float32), 5) is None


def _fake_cudnn(monkeypatch, limit):
    """cuDNN "available", split.LIMIT lowered, and cudnn/lrn.py's calls replaced by float64
    stand-ins that check each piece's (N, C, S, 1) view; returns the views in call order."""
    seen = []
    monkeypatch.setattr(split, "LIMIT", limit)
    monkeypatch.setattr(policy, "cudnn_status", lambda: CudnnStatus(True))

    def host(a, dims):
        assert a.size <= limit and a.is_c_contiguous()
        assert dims[3] == 1 and tuple(dims[:2]) == tuple(a.shape[:2]) and \
            dims[2] == int(np.prod(a.shape[2:]))
        return a.copy_to_host().astype(np.float64).reshape(dims)

    def forward(x, y, dims, n, alpha, beta, k, stream):
        seen.append(dims)
        y.copy_to_device(reference.lrn(host(x, dims), n, alpha, beta, k)
                         .astype(y.dtype).reshape(y.shape))

    def backward(x, y, dy, dx, dims, n, alpha, beta, k, stream):
        seen.append(dims)
        g = reference.lrn_backward(host(x, dims), host(dy, dims), n, alpha, beta, k)
        dx.copy_to_device(g.astype(dx.dtype).reshape(dx.shape))
    monkeypatch.setattr(cudnn_lrn, "forward", forward)
    monkeypatch.setattr(cudnn_lrn, "backward", backward)
    return seen


def test_cudnn_path_views_and_batch_pieces(rng, monkeypatch):
    """5-D x (5, 3, 2, 2, 2) goes to cuDNN as (N, 3, 8, 1) pieces of the batch: with the limit
    at 60 elements, two samples (48) per piece."""
    seen = _fake_cudnn(monkeypatch, limit=60)
    x, dy = _x(rng, (5, 3, 2, 2, 2), "float32"), _x(rng, (5, 3, 2, 2, 2), "float32")
    with dnnkit.trace() as t:
        y = dnnkit.lrn(x, 3, **P)
        assert split.last_pieces() == 3
        dx = dnnkit.lrn_backward(x, y, dy, 3, **P)
    assert t.backends() == ["cudnn", "cudnn"]
    assert seen == [(2, 3, 8, 1), (2, 3, 8, 1), (1, 3, 8, 1)] * 2
    np.testing.assert_allclose(y.copy_to_host(), reference.lrn(x, 3, **P), rtol=1e-6)
    np.testing.assert_allclose(dx.copy_to_host(), reference.lrn_backward(x, dy, 3, **P),
                               rtol=1e-5, atol=1e-6)
