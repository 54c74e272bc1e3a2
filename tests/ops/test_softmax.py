import numpy as np
import pytest

import dnnkit
from dnnkit import reference
from tests.conftest import DTYPES, REL_TOL, backend_params

SHAPES = [(3, 7), (2, 3, 4, 5), (1, 6, 1, 1), (2, 1, 3, 3)]
ALGOS = ["accurate", "fast", "log"]
MODES = ["channel", "instance"]


def _softmax_tol(dtype, algo):
    # log-softmax values near 0 make max|ref| small, so relative error is a little larger.
    return REL_TOL[dtype] * (4 if algo == "log" else 1) * (2 if dtype == "float32" else 1)


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("algo", ALGOS)
def test_forward_and_backward_match_float64(rng, algo, mode, shape, dtype, backend):
    x = (rng.standard_normal(shape) * 2).astype(dtype)
    with dnnkit.trace() as t:
        y = dnnkit.softmax(x, algo, mode, backend=backend)
    assert [(e.op, e.backend, e.algo, e.shapes, e.dtype) for e in t] == \
        [("softmax", backend, algo, (shape,), dtype)]
    got = y.copy_to_host()
    ref = reference.softmax(x.astype(np.float64), algo, mode)
    assert reference.rel_error(got, ref) <= _softmax_tol(dtype, algo)

    dy = rng.standard_normal(shape).astype(dtype)
    dx = dnnkit.softmax_backward(got, dy, algo, mode, backend=backend).copy_to_host()
    ref_dx = reference.softmax_backward(got.astype(np.float64), dy.astype(np.float64), algo, mode)
    # With C == 1 the exact gradient is 0 and only rounding is left, so measure the error
    # against the gradient's natural scale, max|dy|, when max|ref| is smaller.
    assert not np.isnan(dx).any()
    err = np.abs(dx - ref_dx).max() / max(np.abs(ref_dx).max(), np.abs(dy).max())
    assert err <= 4 * _softmax_tol(dtype, algo)


@pytest.mark.parametrize("algo", ["accurate", "log"])
@pytest.mark.parametrize("mode", MODES)
def test_reference_gradient_is_the_jacobian(rng, algo, mode):
    """softmax_backward's float64 reference equals J^T dy from finite differences."""
    x = rng.standard_normal((2, 3, 2, 2))
    dy = rng.standard_normal(x.shape)
    y = reference.softmax(x, algo, mode)
    analytic = reference.softmax_backward(y, dy, algo, mode)
    h, fd = 1e-6, np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        e = np.zeros_like(x)
        e[idx] = h
        fd[idx] = ((reference.softmax(x + e, algo, mode) - reference.softmax(x - e, algo, mode))
                   * dy).sum() / (2 * h)
    assert np.allclose(analytic, fd, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("c", [1, 1025])
def test_row_lengths(rng, c, backend):
    x = rng.standard_normal((2, c)).astype(np.float32)
    y = dnnkit.softmax(x, backend=backend).copy_to_host()
    assert reference.rel_error(y, reference.softmax(x.astype(np.float64))) <= 4e-6
    assert np.allclose(y.sum(axis=1), 1.0, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("algo", ["accurate", "log"])
def test_row_of_66000(rng, algo, backend):
    x = rng.standard_normal((1, 66000)).astype(np.float32) * 4
    y = dnnkit.softmax(x, algo, backend=backend).copy_to_host()
    ref = reference.softmax(x.astype(np.float64), algo)
    assert reference.rel_error(y, ref) <= 1e-5


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("algo", ["accurate", "log"])
@pytest.mark.parametrize("mode", MODES)
def test_huge_logits_do_not_overflow(rng, algo, mode, backend):
    x = (rng.standard_normal((2, 4, 2, 3)) * 1e4).astype(np.float32)
    x[0, 0, 0, 0] = 3e38
    y = dnnkit.softmax(x, algo, mode, backend=backend).copy_to_host()
    assert np.isfinite(y).all()
    ref = reference.softmax(x.astype(np.float64), algo, mode)
    assert reference.rel_error(y, ref) <= 1e-6


@pytest.mark.parametrize("backend", backend_params())
def test_nan_in_a_row_poisons_only_that_row(backend):
    x = np.arange(12, dtype=np.float32).reshape(3, 4) / 7
    x[1, 2] = np.nan
    y = dnnkit.softmax(x, backend=backend).copy_to_host()
    assert np.isnan(y[1]).all() and np.isfinite(y[[0, 2]]).all()


def test_log_softmax_is_softmax_log(rng):
    x = rng.standard_normal((2, 3, 2, 2)).astype(np.float32)
    a = dnnkit.log_softmax(x, "instance").copy_to_host()
    b = dnnkit.softmax(x, "log", "instance").copy_to_host()
    assert np.array_equal(a, b)


@pytest.mark.parametrize("call,exc,words", [
    (lambda x: dnnkit.softmax(x, "exact"), ValueError, ["softmax", "algo", "exact", "accurate"]),
    (lambda x: dnnkit.softmax(x, mode="spatial"), ValueError, ["mode", "spatial", "channel"]),
    (lambda x: dnnkit.softmax(x[0, 0, 0]), ValueError, ["softmax", "2-D or 3-D or 4-D or 5-D",
                                                        "(5,)"]),
    (lambda x: dnnkit.softmax(x[None, None]), ValueError, ["(1, 1, 2, 3, 4, 5)"]),
    (lambda x: dnnkit.softmax_backward(x, x[:1]), ValueError, ["dy", "(1, 3, 4, 5)"]),
    (lambda x: dnnkit.softmax(x.astype(np.int64)), TypeError, ["softmax", "int64"]),
])
def test_bad_arguments_name_op_and_values(call, exc, words):
    x = np.ones((2, 3, 4, 5), np.float32)
    with pytest.raises(exc) as ei:
        call(x)
    for w in words:
        assert w in str(ei.value)


def test_empty_batch():
    y = dnnkit.softmax(np.zeros((0, 5), np.float32))
    assert y.shape == (0, 5)


def test_cudnn_view_uses_instance_mode_when_spatial_size_is_one():
    """(N, C) and (N, C, 1, 1) go to cuDNN in instance mode (the same function; cuDNN's
    channel-mode backward is 250x slower there); real spatial maps keep the mode asked for."""
    from dnnkit.ops.softmax import dims4
    assert dims4((8, 4), "channel") == ((8, 4, 1, 1), "instance")
    assert dims4((8, 4, 1, 1), "channel") == ((8, 4, 1, 1), "instance")
    assert dims4((8, 4, 3, 1), "channel") == ((8, 4, 3, 1), "channel")
    assert dims4((8, 4, 2, 2), "instance") == ((8, 4, 2, 2), "instance")


# ---------------------------------------------------------------- the Numba kernel variants
# The launcher (dnnkit.ops.softmax._config) picks a register-cached variant (the row held in
# K registers per thread) or the streaming one (K values at a time, two passes); these tests
# force each on tiny shapes. (bx, by, K, cached): bx rows side by side, by threads per row.

VARIANTS = [
    pytest.param((3, 37), "channel", (1, 4, 16, True), id="cached-odd-C"),
    pytest.param((3, 37), "channel", (1, 4, 3, False), id="streaming-partial-chunk"),
    pytest.param((3, 5, 7, 1), "channel", (4, 2, 4, True), id="cached-S7-tiles-cross-n"),
    pytest.param((3, 5, 7, 1), "channel", (4, 2, 2, False), id="streaming-S7"),
    pytest.param((2, 3, 2, 3), "instance", (1, 8, 4, True), id="cached-instance"),
    pytest.param((2, 9, 1, 1), "channel", (1, 16, 4, True), id="cached-threads-beyond-C"),
]


def _force(monkeypatch, cfg, max_blocks=None):
    import importlib
    ops = importlib.import_module("dnnkit.ops.softmax")   # (the package re-exports softmax)
    monkeypatch.setattr(ops, "_config", lambda n, c, s, itemsize=4: cfg)
    if max_blocks is not None:
        monkeypatch.setattr(ops, "_MAX_BLOCKS", max_blocks)


def _check_variant(rng, shape, mode, algo, dtype):
    x = (rng.standard_normal(shape) * 3).astype(dtype)
    y = dnnkit.softmax(x, algo, mode, backend="numba").copy_to_host()
    ref = reference.softmax(x.astype(np.float64), algo, mode)
    assert reference.rel_error(y, ref) <= _softmax_tol(dtype, algo)
    dy = rng.standard_normal(shape).astype(dtype)
    dx = dnnkit.softmax_backward(y, dy, algo, mode, backend="numba").copy_to_host()
    ref_dx = reference.softmax_backward(y.astype(np.float64), dy.astype(np.float64), algo, mode)
    assert reference.rel_error(dx, ref_dx) <= 4 * _softmax_tol(dtype, algo)


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("shape,mode,cfg", VARIANTS)
def test_every_kernel_variant_matches_float64(monkeypatch, rng, shape, mode, cfg, algo, dtype):
    _force(monkeypatch, cfg)
    _check_variant(rng, shape, mode, algo, dtype)


# The row-block variant (softmax_kernels' BY: S == 1, one block of ROW_BY threads per row,
# its strides compile-time constants) runs on the GPU for rows of ROW_BY threads (256); here
# ROW_BY is set to the forced configuration's by, and the launch is checked to take it.
ROW_VARIANTS = [
    pytest.param((3, 37), (1, 4, 16, True), id="row-odd-C"),
    pytest.param((2, 64), (1, 4, 16, True), id="row-full"),
    pytest.param((2, 9), (1, 4, 4, True), id="row-threads-beyond-C"),
    pytest.param((2, 4, 3, 3), (1, 4, 16, True), id="row-instance"),
]


def _force_rows(monkeypatch, cfg):
    """Force ``cfg`` and the row-block variant; returns the list of the kernels' BY launched."""
    import dnnkit.kernels.softmax as ks
    seen, make = [], ks.softmax_kernels
    monkeypatch.setattr(ks, "ROW_BY", cfg[1])
    monkeypatch.setattr(ks, "softmax_kernels", lambda k, c, by=0: seen.append(by) or make(k, c, by))
    _force(monkeypatch, cfg)
    return seen


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("shape,cfg", ROW_VARIANTS)
def test_row_block_variant_matches_float64(monkeypatch, rng, shape, cfg, algo, dtype):
    seen = _force_rows(monkeypatch, cfg)
    _check_variant(rng, shape, "instance" if len(shape) > 2 else "channel", algo, dtype)
    assert seen == [cfg[1], cfg[1]]             # forward and backward both took it


def test_row_block_variant_is_taken_for_full_blocks():
    """The launcher's own choice: a 4096-element row gets K = 16 and 256 threads, the row-block
    variant; a row along S (channel mode, S > 1) never does."""
    import importlib
    ops = importlib.import_module("dnnkit.ops.softmax")   # (the package re-exports softmax)
    from dnnkit.kernels.softmax import ROW_BY
    assert ops._config(8, 4096, 1) == (1, ROW_BY, 16, True)
    assert ops._config(8, 4096, 3)[0] > 1


@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("cfg", [(1, 4, 4, True), (1, 4, 2, False), (4, 4, 4, True), "row"])
def test_blocks_walk_several_row_tiles(monkeypatch, rng, cfg, algo):
    """A grid smaller than the row tiles: each block takes several rows in turn (and its
    reductions alternate between the two halves of the scratch)."""
    if cfg == "row":
        cfg = (1, 4, 4, True)
        _force_rows(monkeypatch, cfg)
    _force(monkeypatch, cfg, max_blocks=2)
    _check_variant(rng, (5, 11, 3, 1) if cfg[0] > 1 else (7, 13), "channel", algo, "float32")


SPECIAL = [np.nan, np.inf, -np.inf, "all -inf", 3e38]


def _special_rows():
    """(rows, 13) float32: row 2i holds SPECIAL[i] (the -inf row two of them), odd rows are
    ordinary."""
    rows = 2 * len(SPECIAL) + 1
    x = (np.arange(rows * 13, dtype=np.float32).reshape(rows, 13) % 7) / 3 - 1
    for i, v in enumerate(SPECIAL):
        if v == "all -inf":
            x[2 * i] = -np.inf
        else:
            x[2 * i, 5] = v
    x[2 * SPECIAL.index(-np.inf), 9] = -np.inf
    return x


@pytest.mark.filterwarnings("ignore::RuntimeWarning")   # the simulator's inf - inf, 1 / 0
@pytest.mark.parametrize("algo", ALGOS)
@pytest.mark.parametrize("cfg", [None, (1, 4, 16, True), (1, 4, 3, False), (4, 4, 4, True),
                                 (4, 2, 2, False), "row"])
def test_special_values_follow_the_reference(monkeypatch, cfg, algo):
    """A NaN makes its row NaN; +inf makes its row NaN (exp(inf - inf)); an all -inf row is
    NaN; -inf elements of other rows give 0 (log: -inf); huge finite logits are fine
    (accurate, log); other rows are untouched: as the float64 reference. Fast (no max) only
    promises the NaN rows and the ordinary rows. Rows along S (bx > 1) too."""
    if cfg == "row":
        cfg = (1, 4, 16, True)
        _force_rows(monkeypatch, cfg)
    if cfg is not None:
        _force(monkeypatch, cfg)
    r = _special_rows()
    if algo == "fast":
        r[2 * SPECIAL.index(3e38), 5] = 0       # exp(3e38): the simulator's math.exp raises
    strided = cfg is not None and cfg[0] > 1
    # rows of an (N, C) input, or positions s of a (1, C, S, 1) input in channel mode
    x = np.ascontiguousarray(r.T)[None, :, :, None] if strided else r
    as_rows = (lambda a: a[0, :, :, 0].T) if strided else (lambda a: a)
    with np.errstate(all="ignore"):
        ref = as_rows(reference.softmax(x.astype(np.float64), algo, "channel"))
    y = as_rows(dnnkit.softmax(x, algo, "channel", backend="numba").copy_to_host())
    if algo == "fast":
        ordinary = np.arange(1, len(r), 2)
        np.testing.assert_allclose(y[ordinary], ref[ordinary], rtol=2e-6, atol=1e-7)
        assert np.isnan(y[2 * SPECIAL.index(np.nan)]).all()
    else:
        np.testing.assert_allclose(y, ref, rtol=2e-6, atol=1e-7)
        assert np.isnan(y[[0, 2, 6]]).all() and not np.isnan(np.delete(y, [0, 2, 6], 0)).any()


def test_config_keeps_rows_in_registers_where_they_fit():
    """The launcher's choices for the benchmark shapes (validation/softmax_bench.py)."""
    import importlib
    _config = importlib.import_module("dnnkit.ops.softmax")._config
    assert _config(8192, 4096, 1) == (1, 256, 16, True)        # 16 registers a thread
    assert _config(8192, 1000, 1) == (1, 256, 4, True)
    assert _config(64, 1000, 49) == (8, 32, 32, True)          # 32-byte runs along S
    assert _config(64, 32, 3136) == (32, 8, 4, True)           # 128-byte runs along S
    assert _config(2, 66000, 1) == (1, 256, 8, False)          # streaming: two passes
    assert _config(64, 4096, 1, itemsize=8) == (1, 256, 8, False)   # float64: K = 4 only
    assert _config(64, 1000, 1, itemsize=8) == (1, 256, 4, True)
    assert _config(5, 10, 1) == (1, 16, 4, True)               # small rows: at least C threads
    assert _config(5, 3, 2) == (2, 4, 4, True)
