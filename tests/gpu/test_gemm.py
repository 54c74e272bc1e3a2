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
