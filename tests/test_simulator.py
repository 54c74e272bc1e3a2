"""The test harness's repair of Numba's CUDA simulator (tests/conftest.py): every thread of a
block must see one static shared array. Without the lock, threads that reach their first
``cuda.shared.array`` together can each get an array of their own (about 2 implicit-GEMM
calls in 100 read garbage with the CPU busy)."""

import numpy as np
import pytest
from numba import cuda, int64

from tests.conftest import SIMULATOR

pytestmark = pytest.mark.skipif(not SIMULATOR, reason="the simulator's behaviour")


@cuda.jit
def _neighbour(out):
    sh = cuda.shared.array(64, dtype=int64)
    t = cuda.threadIdx.x
    sh[t] = t + 1
    cuda.syncthreads()
    out[cuda.blockIdx.x, t] = sh[(t + 1) % cuda.blockDim.x]


def test_static_shared_arrays_are_one_array_per_block():
    """Each thread reads its neighbour's slot: right only if they share the array. (Without
    the lock, about one run in 30 failed here; 20 runs.)"""
    from numba.cuda.simulator import kernelapi
    assert getattr(kernelapi.FakeCUDAShared.array, "_dnnkit_locked", False)

    for _ in range(20):
        out = np.zeros((2, 64), np.int64)
        _neighbour[2, 64](out)
        want = (np.arange(64) + 1) % 64 + 1
        assert (out == want).all(), np.argwhere(out != want)[:5]
