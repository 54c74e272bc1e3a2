"""Winograd F(2x2, 3x3) in the Numba convolution backend (dnnkit/ops/conv_winograd.py,
kernels/winograd.py) against the float64 reference of tests/ops/test_conv_numba.py: every pass,
padding 0..3 (the data gradient's padding 2 - p then negative), true convolution and
correlation, odd and even outputs, the batch in chunks, the filter gradient's sum in slices
(its last slice padded with zero tiles), the GPU's GEMM tiles; and the rule that picks it."""

import numpy as np
import pytest

from dnnkit.ops import conv_numba
from dnnkit.ops import conv_winograd as W
from tests.ops.test_conv_numba import _check, _geom, _run_all

CASES = {
    "pad1-odd": _geom((2, 3, 1, 5, 6), (4, 3, 1, 3, 3), padding=(0, 1, 1)),
    "pad0-flip": _geom((1, 2, 1, 4, 5), (3, 2, 1, 3, 3), flip=True),
    "pad2-mixed": _geom((2, 2, 1, 3, 5), (2, 2, 1, 3, 3), padding=(0, 2, 1)),
    "pad3-flip": _geom((1, 2, 1, 2, 3), (3, 2, 1, 3, 3), padding=(0, 3, 3), flip=True),
}


@pytest.fixture
def winograd(monkeypatch):
    monkeypatch.setattr(W, "WINOGRAD", True)


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
@pytest.mark.parametrize("name", list(CASES))
def test_matches_reference(rng, winograd, name, dtype):
    _check(_run_all(rng, CASES[name], dtype), dtype)


def test_reports_its_algorithm(rng, winograd):
    from numba import cuda
    g = CASES["pad1-odd"]
    x, w, dy = (cuda.to_device(rng.standard_normal(s).astype(np.float32))
                for s in (g.x_shape, g.w_shape, g.y_shape))
    s = cuda.default_stream()
    assert conv_numba.forward(x, w, None, g, s)[1] == "winograd"
    assert conv_numba.backward_data(dy, w, g, s)[1] == "winograd"
    assert conv_numba.backward_filter(x, dy, g, s)[1] == "winograd"


@pytest.mark.parametrize("images", [1, 2])
def test_batch_in_chunks_and_filter_slices(rng, winograd, monkeypatch, images):
    """A budget of ``images`` images per pass (N = 3: chunks 2 + 1 or 1 + 1 + 1, the filter
    gradient accumulating over them), the filter gradient's tiles in 4 slices: 2 or 1 images
    of 6 tiles, so the last slice holds zero tiles past the chunk's."""
    g = _geom((3, 3, 1, 4, 6), (2, 3, 1, 3, 3), padding=(0, 1, 1))
    per_image = 16 * (3 + 2) * 6 * 4
    monkeypatch.setattr(conv_numba, "COL_BUDGET_BYTES", images * per_image + 1)
    monkeypatch.setattr(W, "PARTS", 4)
    t = W._Tiles(3, 3, (4, 6), 2, (4, 6), 4)
    assert (t.chunk, t.tiles) == (images, 6)
    monkeypatch.setattr(conv_numba, "COL_BUDGET_BYTES", 1 << 40)    # the 32-bit bound
    assert W._Tiles(10**6, 4, (1000, 1000), 4, (1000, 1000), 4).chunk == 536
    _check(_run_all(rng, g, "float32"), "float32")


@pytest.mark.parametrize("config", ["small", "large"])
def test_gpu_gemm_tiles(rng, winograd, monkeypatch, config):
    """The GPU's GEMM tile configurations (256 threads) on the 16 batched products."""
    from dnnkit.ops import gemm
    monkeypatch.setattr(gemm, "gemm_config", lambda *a: config)
    _check(_run_all(rng, CASES["pad1-odd"], "float32"), "float32")


def test_the_rule():
    """Winograd where it measured faster: ResNet-50's 3x3 stride-1 layers at batch 32 in
    float32 and float16; not at batch 2 (host-bound calls), not in float64, not for other
    kernels, strides, dilations or groups, nor past the transforms' 32-bit indexing;
    WINOGRAD overrides the rule."""
    assert W.WINOGRAD is None

    def g(n=32, c=64, hw=56, k=(1, 3, 3), stride=1, dilation=1, groups=1):
        return _geom((n, c, 1, hw, hw), (c, c // groups) + k, stride, (0, 1, 1), dilation,
                     groups)
    for c, hw in ((64, 56), (128, 28), (256, 14), (512, 7)):
        assert W.pays(g(c=c, hw=hw), "float32") and W.pays(g(c=c, hw=hw), "float16")
        assert not W.pays(g(n=2, c=c, hw=hw), "float32")
    assert not W.pays(g(), "float64")
    # one image of 512 channels at 2048^2: its transformed tiles pass 2**31 elements
    big = _geom((1, 512, 1, 2048, 2048), (512, 512, 1, 3, 3), padding=(0, 1, 1))
    for other in (g(k=(1, 5, 5)), g(stride=(1, 2, 2)), g(dilation=(1, 2, 2)), g(groups=2),
                  _geom((32, 64, 3, 56, 56), (64, 64, 3, 3, 3), padding=1), big):
        assert not W.applies(other) and not W.pays(other, "float32")
    try:
        W.WINOGRAD = False
        assert not W.pays(g(), "float32")
        W.WINOGRAD = True
        assert W.pays(g(n=1, hw=8), "float64")
    finally:
        W.WINOGRAD = None


def test_filter_slices_rule():
    """The filter gradient's tile slices (PARTS = None) at the GPU's GEMM tiles on the
    ResNet-50 3x3 layers at batch 32: the counts measured fastest on an H100 (or next to
    them: 17 for 16, 9 for 8, 3 for 4); at least 2, each at least MIN_TILES_PER_PART tiles
    long, so a short sum stays whole."""
    from unittest import mock
    from dnnkit.ops import gemm
    assert W.PARTS is None
    with mock.patch.object(gemm.arrays, "simulator", lambda: False):
        assert [W._filter_parts(c, c, 32 * ((hw + 1) // 2) ** 2)
                for c, hw in ((64, 56), (128, 28), (256, 14), (512, 7))] == [17, 9, 3, 2]
        assert W._filter_parts(8, 8, 300) == 1
