"""Split-k matmul and linear on the Numba backend (ops/gemm_split.py): the rule splits a product
of few output tiles and a long k, and the k-slices summed give the float64 product, bias
included, for every layout; the split and the unsplit GEMM agree."""

import numpy as np
import pytest

import dnnkit
from dnnkit import reference
from dnnkit.ops import gemm, gemm_split
from dnnkit.ops import conv_launch
from tests.conftest import DTYPES, SIMULATOR

TOL = {"float16": 4e-3, "float32": 2e-5, "float64": 1e-13}
# products that split: on the simulator (8 x 8 GEMM tiles, planned as an H100's 132 SMs)
# 16 x 24 is 6 blocks, k 512 two slices; on a GPU (64 x 128 tiles) 128 x 256 is 4 blocks
M, N, K = (16, 24, 512) if SIMULATOR else (128, 256, 4096)


@pytest.mark.skipif(not SIMULATOR, reason="the simulator's tiles and planned SM count")
def test_the_rule_splits_few_tiles_with_a_long_k_only():
    assert gemm_split.parts(M, N, K, np.float32) == 2           # 6 blocks -> 12
    assert gemm_split.parts(M, N, 256, np.float32) == 1         # k too short for two slices
    assert gemm_split.parts(M, N, 509, np.float32) == 1         # no divisor within the cap
    assert gemm_split.parts(512, 512, K, np.float32) == 1       # 4,096 blocks fill the GPU
    p = gemm_split.parts(M, N, 10000, np.float32)
    assert p == gemm_split.MAX_PARTS and 10000 % p == 0


@pytest.mark.skipif(SIMULATOR or conv_launch.sm_count() != 132, reason="an H100/H200's SMs")
def test_a_language_model_decoders_data_gradient_splits_on_an_h100():
    # dy (1120 x 10000) . W (10000 x 650): 108 blocks of 64 x 128 for 264 a wave
    assert gemm_split.parts(1120, 650, 10000, np.float32) > 1


def _data(rng, shape, dtype):
    return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(dtype)


# every layout in float32, every dtype in the plain layout (the simulator runs a Python thread
# per CUDA thread: each case is a few seconds)
CASES = [(False, False, d) for d in DTYPES] + [(True, False, "float32"), (False, True, "float32")]


@pytest.mark.parametrize("ta,tb,dtype", CASES)
def test_split_matmul_matches_float64(rng, ta, tb, dtype):
    a, b = _data(rng, (M, K), dtype), _data(rng, (K, N), dtype)
    sa = np.ascontiguousarray(a.T) if ta else a
    sb = np.ascontiguousarray(b.T) if tb else b
    y = dnnkit.matmul(sa, sb, ta, tb, backend="numba").copy_to_host()
    ref = a.astype(np.float64) @ b.astype(np.float64)
    assert y.dtype == np.dtype(dtype)
    assert reference.rel_error(y, ref) <= TOL[dtype]


def test_the_split_and_the_unsplit_gemm_agree(rng, monkeypatch):
    a, b = _data(rng, (M, K), "float64"), _data(rng, (K, N), "float64")
    split = dnnkit.matmul(a, b, backend="numba").copy_to_host()
    monkeypatch.setattr(gemm_split, "parts", lambda *args: 1)
    whole = dnnkit.matmul(a, b, backend="numba").copy_to_host()
    assert reference.rel_error(split, whole) <= 1e-14


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("with_bias", [True, False])
def test_split_linear_adds_the_bias_per_output_feature(rng, with_bias, dtype, monkeypatch):
    x, w = _data(rng, (M, K), dtype), _data(rng, (N, K), dtype)
    bias = rng.standard_normal(N).astype(dtype) if with_bias else None
    launches = []
    real = gemm.gemm

    def counted(*args, **kw):
        launches.append(args[7][0])         # the batch: the number of k-slices
        return real(*args, **kw)
    monkeypatch.setattr(gemm, "gemm", counted)
    y = dnnkit.linear(x, w, bias, backend="numba").copy_to_host()
    p = gemm_split.parts(M, N, K, np.dtype(dtype))
    assert p > 1 and launches == [p]
    ref = x.astype(np.float64) @ w.astype(np.float64).T
    if with_bias:
        ref = ref + bias.astype(np.float64)
    assert reference.rel_error(y, ref) <= TOL[dtype]
