import importlib

import numpy as np
import pytest

import dnnkit
from dnnkit import reference
from dnnkit.kernels.dropout import keep_mask_host, mask_key
from dnnkit.ops.dropout import DropoutState
from tests.conftest import DTYPES, SIMULATOR, backend_params

# (imported by name: dnnkit.ops.dropout is also the function the package re-exports)
dropout_module = importlib.import_module("dnnkit.ops.dropout")

SHAPES = [(37,), (3, 5, 7), (2, 3, 4, 5)]


@pytest.fixture(autouse=True)
def _small_grid(monkeypatch):
    """The simulator runs a Python thread per CUDA thread: at most 2 blocks there (the kernel
    is a grid-stride loop, so the larger inputs also exercise several trips per thread)."""
    if SIMULATOR:
        monkeypatch.setattr(dropout_module, "_MAX_BLOCKS", 2)


def _binomial_ok(kept, p, sigmas=6):
    """Keep rate within ``sigmas`` standard deviations of 1 - p (plus one element)."""
    n = kept.size
    return abs(kept.mean() - (1 - p)) <= sigmas * np.sqrt(p * (1 - p) / n) + 1 / n


def _thr(p):
    return min(round(p * 2**32), 2**32)


def _cudnn_scale_too_coarse(p, dtype):
    """cuDNN takes p as a float32: where 1/(1 - float32(p)) misses 1/(1 - p) by more than the
    dtype's precision, dnnkit does not use it (test_cudnn_is_not_used_where_its_float32_p_...)."""
    from dnnkit.ops.dropout import cudnn_scale_error
    return cudnn_scale_error(p) > 4 * np.finfo(dtype).eps


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("p", [0.0, 0.25, 0.6])
def test_forward_backward_match_the_mask(rng, p, shape, dtype, backend):
    x = (rng.standard_normal(shape) * 3).astype(dtype)
    x[x == 0] = 1   # so that y == 0 means "dropped"
    if backend == "cudnn" and _cudnn_scale_too_coarse(p, dtype):
        with pytest.raises(dnnkit.CudnnUnavailableError, match="takes p as a float32"):
            dnnkit.dropout(x, p, seed=7, backend=backend)
        return
    with dnnkit.trace() as t:
        y, state = dnnkit.dropout(x, p, seed=7, backend=backend)
    assert t.backends() == [backend] and state.backend == backend and state.seed == 7
    mask = state.mask()
    assert mask.shape == shape and mask.dtype == bool
    got = y.copy_to_host()
    assert got.dtype == np.dtype(dtype)
    assert np.array_equal(got != 0, mask)              # y is zero exactly where dropped
    tol = {"float16": 1e-3, "float32": 1e-7, "float64": 1e-15}[dtype]
    if backend == "cudnn":   # cuDNN scales by 1/(1-p) rounded to float32, for float64 too
        tol = max(tol, 3e-7)
    assert reference.rel_error(got, reference.dropout(x, mask, p)) <= tol
    if p == 0:
        assert mask.all() and np.array_equal(got, x)   # a copy
    dy = (rng.standard_normal(shape) * 2).astype(dtype)
    dx = dnnkit.dropout_backward(dy, state).copy_to_host()
    assert np.array_equal(dx[~mask], np.zeros_like(dx[~mask]))   # exactly what was dropped
    assert reference.rel_error(dx, reference.dropout(dy, mask, p)) <= tol


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_numba_scaling_is_one_rounding_of_x_times_the_scale(rng, dtype):
    p = 0.3
    x = (rng.standard_normal(500) * 3).astype(dtype)
    y, state = dnnkit.dropout(x, p, seed=11, backend="numba")
    keep = keep_mask_host(mask_key(11), _thr(p), x.size)
    want = np.where(keep, (x.astype(np.float32) * np.float32(1 / (1 - p))).astype(dtype), 0)
    assert np.array_equal(y.copy_to_host(), want)


def test_numba_mask_is_the_documented_counter_based_function(rng):
    """The mask (the two halves of mix64(key + (j+1)*GAMMA) for elements 2j, 2j+1, against
    round(p * 2**32)): bitwise the host implementation, for an odd size that leaves the grid-stride loop a ragged end."""
    x = np.ones(2051, np.float32)
    for seed in (0, 12345, 2**64 - 1):
        y, _ = dnnkit.dropout(x, 0.4, seed=seed, backend="numba")
        assert np.array_equal(y.copy_to_host() != 0,
                              keep_mask_host(mask_key(seed), _thr(0.4), x.size))


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_generator_statistics(p):
    """On 2**20 elements of the host implementation of the same generator: the keep rate within
    6 binomial standard deviations, no correlation between neighbours or between seeds."""
    n = 2**20
    a = keep_mask_host(mask_key(1), _thr(p), n)
    b = keep_mask_host(mask_key(2), _thr(p), n)
    assert _binomial_ok(a, p) and _binomial_ok(b, p)
    q = 1 - p
    both = (a[1:] & a[:-1]).mean()           # P(keep i and keep i+1) = q^2 if independent
    assert abs(both - q * q) <= 6 * np.sqrt(q * q * (1 - q * q) / n)
    same = (a == b).mean()                   # two seeds agree with probability p^2 + q^2
    r = p * p + q * q
    assert abs(same - r) <= 6 * np.sqrt(r * (1 - r) / n)


@pytest.mark.parametrize("backend", backend_params())
def test_keep_rate_of_the_kernel(rng, backend):
    x = np.ones(4000, np.float32)
    for p in (0.2, 0.7):
        y, _ = dnnkit.dropout(x, p, seed=3, backend=backend)
        kept = y.copy_to_host() != 0
        assert _binomial_ok(kept, p)
        assert np.allclose(y.copy_to_host()[kept], 1 / (1 - p), rtol=1e-6)


@pytest.mark.parametrize("backend", backend_params())
def test_same_seed_same_mask_other_seed_other_mask(rng, backend):
    x = rng.standard_normal((4, 300)).astype(np.float32)
    y1, s1 = dnnkit.dropout(x, 0.5, seed=99, backend=backend)
    y2, s2 = dnnkit.dropout(x, 0.5, seed=99, backend=backend)
    y3, _ = dnnkit.dropout(x, 0.5, seed=100, backend=backend)
    assert np.array_equal(y1.copy_to_host(), y2.copy_to_host())
    agree = (y1.copy_to_host() != 0) == (y3.copy_to_host() != 0)
    assert 0.35 < agree.mean() < 0.65          # independent masks agree on half of them
    # seed=None: a fresh mask each call; Numba keeps the seed it drew, which reproduces it
    # (cuDNN advances one generator per stream: no seed to keep)
    y4, s4 = dnnkit.dropout(x, 0.5, backend=backend)
    y5, s5 = dnnkit.dropout(x, 0.5, backend=backend)
    assert not np.array_equal(y4.copy_to_host(), y5.copy_to_host())
    if backend == "numba":
        y6, _ = dnnkit.dropout(x, 0.5, seed=s4.seed, backend=backend)
        assert np.array_equal(y4.copy_to_host(), y6.copy_to_host())
    else:
        assert s4.seed is None


@pytest.mark.parametrize("backend", backend_params())
def test_offsets_name_a_reproducible_sequence(rng, backend):
    """Mask k of a seed's sequence: the same sequence twice, each mask new."""
    x = rng.standard_normal((4, 300)).astype(np.float32) + 4
    runs = [[dnnkit.dropout(x, 0.5, seed=11, offset=k, backend=backend)[0].copy_to_host()
             for k in range(3)] for _ in range(2)]
    for a, b in zip(*runs):
        assert np.array_equal(a, b)
    assert not np.array_equal(runs[0][0], runs[0][1])
    assert not np.array_equal(runs[0][1], runs[0][2])
    if backend == "numba":      # documented: Numba's mask (seed, k) is that of seed + k
        y, _ = dnnkit.dropout(x, 0.5, seed=13, backend=backend)
        assert np.array_equal(y.copy_to_host(), runs[0][2])


@pytest.mark.cudnn
def test_cudnn_offset_out_of_sequence_runs_numba_or_raises():
    x = np.ones((4, 300), np.float32)
    dnnkit.dropout(x, 0.5, seed=21, backend="cudnn")         # the stream's states at 1
    chosen, why = dnnkit.select_backend("dropout", x, 0.5, seed=21, offset=5, explain=True)
    assert chosen == "numba" and "one call at a time" in why and "stand at 1" in why, why
    with pytest.raises(dnnkit.CudnnUnavailableError, match="one call at a time"):
        dnnkit.dropout(x, 0.5, seed=21, offset=5, backend="cudnn")
    assert dnnkit.select_backend("dropout", x, 0.5, seed=21, offset=1) == "cudnn"


@pytest.mark.parametrize("backend", backend_params())
def test_p_near_one(backend):
    x = np.full(3000, 2.0, np.float32)
    if backend == "cudnn":     # 1/(1 - float32(0.999)) is off by 1.3e-5: too coarse for float32
        with pytest.raises(dnnkit.CudnnUnavailableError, match="takes p as a float32"):
            dnnkit.dropout(x, 0.999, seed=5, backend=backend)
        return
    y, state = dnnkit.dropout(x, 0.999, seed=5, backend=backend)
    got = y.copy_to_host()
    assert np.isfinite(got).all() and _binomial_ok(got != 0, 0.999)
    assert np.allclose(got[got != 0], 2000.0, rtol=1e-4)
    assert np.array_equal(dnnkit.dropout_backward(x, state).copy_to_host() != 0, got != 0)


def test_p_below_the_generators_resolution_drops_everything():
    # keep probability 1 - p < 2**-33 rounds to a threshold of 2**32: nothing is kept
    y, state = dnnkit.dropout(np.ones(100, np.float32), 1 - 1e-12, seed=1, backend="numba")
    assert not y.copy_to_host().any() and not state.mask().any()


@pytest.mark.parametrize("backend", backend_params())
def test_empty_input(backend):
    """Nothing to drop, on either backend (cuDNN rejects empty tensors: it is not called)."""
    y, state = dnnkit.dropout(np.zeros((0, 4), np.float32), 0.5, seed=1, backend=backend)
    assert y.shape == (0, 4) and state.backend == backend
    assert dnnkit.dropout_backward(np.zeros((0, 4), np.float32), state).shape == (0, 4)


def test_cudnn_is_not_used_where_its_float32_p_changes_the_scale():
    """cuDNN's scale is 1/(1 - float32(p)): exact for p = 0.5, off by 2.4e-7 for p = 0.9
    (fine for float32, not for float64), 1.3e-5 for p = 0.999 (too much for float32 too)."""
    from dnnkit.ops.dropout import cudnn_scale_error
    assert cudnn_scale_error(0.5) == 0.0
    assert 2.3e-7 < cudnn_scale_error(0.9) < 2.5e-7
    assert 1.2e-5 < cudnn_scale_error(0.999) < 1.4e-5
    for dtype, p in (("float64", 0.9), ("float32", 0.999)):
        x = np.ones((2, 3), dtype)
        chosen, why = dnnkit.select_backend("dropout", x, p, explain=True)
        assert chosen == "numba" and "float32" in why and f"p = {p}" in why, why
        with pytest.raises(dnnkit.CudnnUnavailableError, match=r"dropout: .*off by"):
            dnnkit.dropout(x, p, seed=1, backend="cudnn")
    for dtype, p in (("float64", 0.5), ("float32", 0.9), ("float16", 0.999)):
        why = dnnkit.select_backend("dropout", np.ones(3, dtype), p, explain=True)[1]
        assert "off by" not in why, why


def test_state_from_another_backend_is_refused():
    x = np.ones((2, 3), np.float32)
    _, numba_state = dnnkit.dropout(x, 0.5, seed=1, backend="numba")
    with pytest.raises(dnnkit.CudnnUnavailableError, match="made by the numba backend"):
        dnnkit.dropout_backward(x, numba_state, backend="cudnn")
    cudnn_state = DropoutState("cudnn", 0.5, 1, x.shape, x.dtype, saved=object())
    with pytest.raises(ValueError, match="made by the cudnn backend.*reserve space"):
        dnnkit.dropout_backward(x, cudnn_state, backend="numba")
    assert dnnkit.select_backend("dropout_backward", x, numba_state) == "numba"


@pytest.mark.parametrize("call,exc,words", [
    (lambda x: dnnkit.dropout(x, 1.0), ValueError, ["dropout", "[0, 1)", "1.0", "infinite"]),
    (lambda x: dnnkit.dropout(x, -0.1), ValueError, ["dropout", "p", "-0.1"]),
    (lambda x: dnnkit.dropout(x, float("nan")), ValueError, ["p", "nan"]),
    (lambda x: dnnkit.dropout(x, "0.5"), TypeError, ["dropout", "p", "'0.5'"]),
    (lambda x: dnnkit.dropout(x, True), TypeError, ["p", "True"]),
    (lambda x: dnnkit.dropout(x, 0.5, seed=-1), ValueError, ["dropout", "seed", "-1"]),
    (lambda x: dnnkit.dropout(x, 0.5, seed=2**64), ValueError, ["seed", str(2**64)]),
    (lambda x: dnnkit.dropout(x, 0.5, seed=1.5), TypeError, ["dropout", "seed", "1.5"]),
    (lambda x: dnnkit.dropout(x.astype(np.int16), 0.5), TypeError, ["dropout", "int16"]),
    (lambda x: dnnkit.dropout(x, 0.5, offset=2), ValueError, ["dropout", "offset 2", "seed"]),
    (lambda x: dnnkit.dropout(x, 0.5, seed=1, offset=-1), ValueError, ["offset", "-1"]),
    (lambda x: dnnkit.dropout(x, 0.5, seed=1, offset=1.0), TypeError, ["offset", "1.0"]),
    (lambda x: dnnkit.dropout_backward(x, (x, 0.5)), TypeError,
     ["dropout_backward", "DropoutState", "tuple"]),
    (lambda x: dnnkit.dropout_backward(x[:1], _state(x)), ValueError,
     ["dropout_backward", "(1, 4)", "(3, 4)"]),
    (lambda x: dnnkit.dropout_backward(x.astype(np.float64), _state(x)), TypeError,
     ["dropout_backward", "float64", "float32"]),
])
def test_bad_arguments_name_op_and_values(call, exc, words):
    x = np.ones((3, 4), np.float32)
    with pytest.raises(exc) as ei:
        call(x)
    for w in words:
        assert w in str(ei.value)


def _state(x):
    return dnnkit.dropout(x, 0.5, seed=0, backend="numba")[1]
