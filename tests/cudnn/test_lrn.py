"""cuDNN LRN layer without a GPU: its constants against the installed headers, and the LRN
descriptor set by the real library (host work only) at and past cudnnSetLRNDescriptor's limits,
which are the op's ``supports()`` reasons. The forward and backward calls run on a GPU
(tests/ops/test_lrn.py, marked cudnn)."""

import gc
import re

import numpy as np
import pytest

from dnnkit.cudnn import api, descriptors, lrn
from dnnkit.errors import CudnnError
from dnnkit.registry import PREPARE, REGISTRY
from tests.cudnn.test_conv import _headers


@pytest.fixture
def real_lib(real, monkeypatch):
    """dnnkit's cuDNN layer bound to the real library even without a GPU (a descriptor needs
    none)."""
    monkeypatch.setattr(api, "library", lambda: real.lib)
    return real.lib


def test_constants_match_the_headers(real):
    text = _headers(real)

    def define(name):
        return float(re.search(rf"#define\s+{name}\s+([0-9.e+-]+)", text).group(1))
    assert (lrn.MIN_N, lrn.MAX_N) == (define("CUDNN_LRN_MIN_N"), define("CUDNN_LRN_MAX_N"))
    assert (lrn.MIN_K, lrn.MIN_BETA) == (define("CUDNN_LRN_MIN_K"), define("CUDNN_LRN_MIN_BETA"))
    m = re.search(r"\bCUDNN_LRN_CROSS_CHANNEL_DIM1\s*=\s*(\d+)", text)
    assert int(m.group(1)) == lrn.LRN_CROSS_CHANNEL_DIM1


def _supported(n, alpha, beta, k):
    x = np.ones((1, 3, 2), np.float32)
    return REGISTRY["lrn"]["cudnn"].supports(*PREPARE["lrn"](x, n, alpha, beta, k)) is None


@pytest.mark.parametrize("n,alpha,beta,k", [
    (5, 1e-4, 0.75, 1.0), (1, 1e-4, 0.75, 1.0), (16, 1e-4, 0.75, 1.0), (4, 1e-4, 0.75, 1.0),
    (5, 0.0, 0.75, 1.0), (5, -1.0, 0.75, 1.0), (5, 1e-4, 0.01, 1.0), (5, 1e-4, 100.0, 1.0),
    (5, 1e-4, 0.75, 1e-5), (5, 1e-4, 0.75, 1e10),
    (17, 1e-4, 0.75, 1.0), (40, 1e-4, 0.75, 1.0), (5, 1e-4, 0.0099, 1.0), (5, 1e-4, 0.0, 1.0),
    (5, 1e-4, -0.75, 1.0), (5, 1e-4, 0.75, 9.9e-6), (5, 1e-4, 0.75, 0.0), (5, 1e-4, 0.75, -1.0),
])
def test_supports_is_what_the_library_accepts(real_lib, n, alpha, beta, k):
    """cudnnSetLRNDescriptor succeeds exactly where the op's supports() sends the call to
    cuDNN, and returns CUDNN_STATUS_BAD_PARAM elsewhere (alpha takes any value)."""
    before = descriptors.live_counts().get("LRNDescriptor", 0)
    if _supported(n, alpha, beta, k):
        d = lrn.LRNDescriptor(n, alpha, beta, k)
        assert descriptors.live_counts()["LRNDescriptor"] == before + 1
        d.close()
    else:
        with pytest.raises(CudnnError) as ei:
            lrn.LRNDescriptor(n, alpha, beta, k)
        assert ei.value.status_name == "CUDNN_STATUS_BAD_PARAM"
        assert f"n {n}" in str(ei.value)
    gc.collect()
    assert descriptors.live_counts().get("LRNDescriptor", 0) == before   # none leaked
