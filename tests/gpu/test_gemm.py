"""The Numba GEMM on tensor cores (3xTF32, ops/gemm.py TENSOR_CORES) against FP32 FMA on a real
GPU, through the convolution's three passes (layouts 00, 10 and 01 of kernels/gemm.py): both
against float64, the tensor-core error no worse than twice FP32's (measured below it:
validation/notes/gemm.md)."""

import numpy as np
import pytest

import dnnkit
from dnnkit import reference

pytestmark = pytest.mark.gpu


def _run(direction, x, w, dy):
    if direction == "fwd":
        return dnnkit.conv2d(x, w, padding=1, backend="numba")
    if direction == "bwd_data":
        return dnnkit.conv2d_backward_data(dy, w, x.shape, padding=1, backend="numba")
    return dnnkit.conv2d_backward_filter(x, dy, w.shape, padding=1, backend="numba")


def _reference(direction, x, w, dy):
    x, w, dy = (a.astype(np.float64) for a in (x, w, dy))
    if direction == "fwd":
        return reference.conv_forward(x, w, None, (1, 1), (1, 1), (1, 1))
    if direction == "bwd_data":
        return reference.conv_backward_data(dy, w, x.shape, (1, 1), (1, 1), (1, 1))
    return reference.conv_backward_filter(x, dy, w.shape, (1, 1), (1, 1), (1, 1))


@pytest.mark.parametrize("direction", ["fwd", "bwd_data", "bwd_filter"])
def test_tensor_core_gemm_is_as_accurate_as_fp32(rng, monkeypatch, direction):
    from numba import cuda

    from dnnkit.ops import gemm
    if tuple(cuda.get_current_device().compute_capability) < (8, 0):
        pytest.skip("tensor cores (mma tf32) need compute capability 8.0")
    x = rng.standard_normal((8, 96, 14, 14)).astype(np.float32)
    w = (rng.standard_normal((96, 96, 3, 3)) / np.sqrt(96 * 9)).astype(np.float32)
    dy = rng.standard_normal((8, 96, 14, 14)).astype(np.float32)
    ref = _reference(direction, x, w, dy)
    err = {}
    for tc in (True, False):
        monkeypatch.setattr(gemm, "TENSOR_CORES", tc)
        assert gemm.tensor_cores(np.float32) is tc
        got = _run(direction, *(cuda.to_device(a) for a in (x, w, dy))).copy_to_host()
        got = got.astype(np.float64)
        assert np.isfinite(got).all()
        err[tc] = np.abs(got - ref).max() / np.abs(ref).max()
    assert err[False] < 1e-5, err
    assert err[True] <= 2 * err[False] + 1e-7, err


def test_tensor_cores_never_for_float64():
    from dnnkit.ops import gemm
    assert not gemm.tensor_cores(np.float64)


def _tiny_plans():
    """The kernels/gemm.py variant names of the plans made so far that use the 32-row tiles."""
    from dnnkit.kernels.gemm import VARIANTS
    from dnnkit.ops import gemm
    names = {id(k): n for n, k in VARIANTS.items()}
    return {names.get(id(p[0]), "") for p in gemm._plans.values()} - {""}


@pytest.mark.parametrize("k", [1, 17, 32])
@pytest.mark.parametrize("math", ["3xtf32", "tf32", "float16"])
def test_32_row_tiles_match_the_reference(rng, math, k):
    """Products of at most 32 rows (gemm.TINY_ROWS) on 32 x 128 tiles: a convolution of k
    filters (forward: m = k rows, layout 00, and with stride 2 the column buffer; filter
    gradient: m = k, layout 01) against float64, edge tiles in every dimension."""
    from numba import cuda

    from dnnkit import config
    from dnnkit.ops import gemm
    if tuple(cuda.get_current_device().compute_capability) < (8, 0):
        pytest.skip("tensor cores need compute capability 8.0")
    dtype = np.float16 if math == "float16" else np.float32
    gemm._plans.clear()
    x = rng.standard_normal((3, 40, 19, 13)).astype(dtype)
    w = (rng.standard_normal((k, 40, 3, 3)) / np.sqrt(360)).astype(dtype)
    tol = {"3xtf32": 1e-5, "tf32": 8 * 2.0**-11, "float16": 2e-3}[math]
    with config.change_flags({"dnn.conv.allow_tf32": math == "tf32"}):
        for stride in (1, 2):
            y = dnnkit.conv2d(cuda.to_device(x), cuda.to_device(w), padding=1, stride=stride,
                              backend="numba").copy_to_host()
            ref = reference.conv_forward(x.astype(np.float64), w.astype(np.float64), None,
                                         (stride, stride), (1, 1), (1, 1))
            assert reference.rel_error(y, ref) <= tol, (stride, "fwd")
            dy = rng.standard_normal(ref.shape).astype(dtype)
            dw = dnnkit.conv2d_backward_filter(cuda.to_device(x), cuda.to_device(dy), w.shape,
                                               padding=1, stride=stride,
                                               backend="numba").copy_to_host()
            ref = reference.conv_backward_filter(x.astype(np.float64), dy.astype(np.float64),
                                                 w.shape, (stride, stride), (1, 1), (1, 1))
            assert reference.rel_error(dw, ref) <= tol, (stride, "filter")
    assert any("tiny" in n for n in _tiny_plans()), _tiny_plans()
