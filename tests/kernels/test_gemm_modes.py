"""The GEMM's tensor-core modes (kernels/gemm.py, kernels/gemm_tiles.py, kernels/tensorcore.py)
and how the ops pick them (ops/gemm.py, ops/conv_numba.py): the configuration tables, the
shared memory of the float16 slabs, the checks on ``tc`` and ``math``, the data types each
variant is declared for, and the convolution's ``allow_tf32`` / Winograd rules. The
tensor-core kernels themselves run only on a GPU (tests/gpu/test_tensorcore.py); here the
simulator takes the FP32 FMA path, whose float16 and TF32-flagged results are checked."""

import numpy as np
import pytest

import dnnkit
from dnnkit import reference


def test_configs_name_their_mode_and_data_type():
    from dnnkit.kernels import gemm_tiles as t
    assert t.config_options("large") == {} and t.config_options("sim") == {}
    assert t.config_options("tc_small") == dict(bk=t.TC_BK, tc="3xtf32")
    assert t.config_options("tf32_large") == dict(bk=t.TC_BK, tc="tf32")
    assert t.config_options("hmma_small") == dict(bk=t.HMMA_BK, tc="f16")
    for p in t.TC_PREFIXES:     # every mode has the three tiles, of the FP32 kernel's shapes
        for tile in ("large", "small", "tiny"):
            assert t.CONFIGS[f"{p}_{tile}"][:4] == t.CONFIGS[tile][:4]


def test_tc_mode_accepts_bools_and_modes_only():
    from dnnkit.kernels.gemm import gemm_kernel
    from dnnkit.kernels.gemm_tiles import tc_mode
    assert tc_mode(False) is None and tc_mode(True) == "3xtf32"
    assert tc_mode("tf32") == "tf32" and tc_mode("f16") == "f16"
    with pytest.raises(ValueError, match="tc must be"):
        tc_mode("fp8")
    with pytest.raises(ValueError, match="multiple of 16"):
        gemm_kernel(0, 0, 4, 8, 16, 16, 2, bk=8, tc="f16")     # one k16 step needs 16
    with pytest.raises(ValueError, match="16 x 16 threads"):
        gemm_kernel(0, 0, 2, 2, 4, 4, 1, bk=16, tc="f16")


def test_float16_slabs_take_two_bytes_an_element():
    from dnnkit.kernels.gemm_tiles import HMMA_BK, TC_PAD, shared_bytes
    rows = (2 * HMMA_BK + 1) * (128 + TC_PAD + 128 + TC_PAD)
    # whatever itemsize the caller passes (the accumulation type's), the slabs are float16
    assert shared_bytes(8, 8, 16, 16, 4, HMMA_BK, "f16") == 2 * rows
    assert shared_bytes(8, 8, 16, 16, 4, HMMA_BK, "tf32") == 4 * rows


def test_each_tensor_core_variant_is_declared_for_its_one_data_type():
    from dnnkit.kernels import gemm
    from dnnkit.kernels.signatures import signatures
    sigs = {dt: signatures(dt) for dt in ("float16", "float32", "float64")}
    for prefix, (_, dtype) in gemm.TC_PREFIXES.items():
        names = [n for n in gemm.VARIANTS if f"_{prefix}_" in n]
        # three layouts and two implicit ones per tile of three (and the float16 split-k
        # names), and the fused relu's three (00, 00 implicit, 01)
        assert len(names) == 3 * 8 + (3 if dtype == "float16" else 0), (prefix, names)
        for n in names:
            assert gemm.ONLY_DTYPES[n] == (dtype,)
            assert [dt for dt in sigs if n in sigs[dt]] == [dtype]
    # the FP32 FMA variants keep every data type
    assert all("gemm_00_large_kernel" in s for s in sigs.values())


def test_tc_prefix_by_data_type_and_math(monkeypatch):
    from dnnkit.ops import gemm
    if dnnkit.device.simulator():
        assert gemm.tc_prefix(np.float16) is None       # no tensor cores
    monkeypatch.setattr(gemm, "tensor_cores", lambda dtype: np.dtype(dtype) != np.float64)
    assert gemm.tc_prefix(np.float16) == "hmma"
    assert gemm.tc_prefix(np.float16, "tf32") == "hmma"      # float16 ignores float32's math
    assert gemm.tc_prefix(np.float32) == "tc"
    assert gemm.tc_prefix(np.float32, "tf32") == "tf32"
    assert gemm.tc_prefix(np.float64, "tf32") is None


def test_gemm_rejects_an_unknown_math():
    from numba import cuda

    from dnnkit.ops import gemm
    a = cuda.to_device(np.ones(4, np.float32))
    with pytest.raises(ValueError, match="math must be one of"):
        gemm.gemm("00", a, a, a, (2, 2, 1), (1, 2, 2), gemm.PLAIN * 3, gemm.NO_BATCH,
                  stream=cuda.default_stream(), math="tf16")


def _opts(dtype, compute, tf32):
    return dict(allow_tf32=tf32, dtype=dtype, compute_dtype=compute)


def test_gemm_math_follows_allow_tf32_for_float32_computed_in_float32():
    from dnnkit.ops.conv_numba import gemm_math
    assert gemm_math(_opts("float32", "float32", True)) == "tf32"
    assert gemm_math(_opts("float32", "float32", False)) == "3xtf32"
    assert gemm_math(_opts("float32", "float64", True)) == "3xtf32"
    assert gemm_math(_opts("float16", "float32", True)) == "3xtf32"    # float16: HMMA anyway
    assert gemm_math(_opts("float64", "float64", True)) == "3xtf32"


@pytest.mark.parametrize("tf32", [False, True])
@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_conv_passes_with_allow_tf32_either_way(rng, dtype, tf32):
    # the simulator's FP32 FMA path: the flag reaches the GEMM (a TF32 math) and changes
    # nothing there; float16 and float32 results against float64 at their own tolerance (on
    # a GPU the flag takes TF32 tensor cores: float32 then at TF32's, 10 bits of mantissa)
    from numba import cuda
    x = rng.standard_normal((2, 3, 5, 5)).astype(dtype)
    w = (rng.standard_normal((4, 3, 3, 3)) / 5).astype(dtype)
    dy = rng.standard_normal((2, 4, 3, 3)).astype(dtype)
    X, W, DY = (cuda.to_device(a) for a in (x, w, dy))
    x64, w64, dy64 = (a.astype(np.float64) for a in (x, w, dy))
    kw = dict(stride=2, padding=1)
    with dnnkit.config.change_flags({"dnn.conv.allow_tf32": tf32}):
        got = [dnnkit.conv2d(X, W, backend="numba", **kw),
               dnnkit.conv2d_backward_data(DY, W, x.shape, backend="numba", **kw),
               dnnkit.conv2d_backward_filter(X, DY, w.shape, backend="numba", **kw)]
    geo = ((2, 2), (1, 1), (1, 1))      # stride, padding, dilation
    ref = [reference.conv_forward(x64, w64, None, *geo),
           reference.conv_backward_data(dy64, w64, x.shape, *geo),
           reference.conv_backward_filter(x64, dy64, w.shape, *geo)]
    tol = 4e-3 if dtype == "float16" else 2e-6
    if dtype == "float32" and tf32 and not dnnkit.device.simulator():
        tol = 2e-3
    for g, r in zip(got, ref):
        g = g.copy_to_host().astype(np.float64)
        assert np.abs(g - r).max() <= tol * np.abs(r).max()
