"""Winograd F(2x2, 3x3) in the Numba convolution backend (dnnkit/ops/conv_winograd.py,
kernels/winograd.py) against the float64 reference of tests/ops/test_conv_numba.py: every pass,
padding 0..3 (the data gradient's padding 2 - p then negative), true convolution and
correlation, odd and even outputs, the batch in chunks, the filter gradient's sum in slices
(its last slice padded with zero tiles), the GPU's GEMM tiles; and the rule that picks it."""

import numpy as np
import pytest

from dnnkit.ops import conv_numba, conv_winograd, gemm
from dnnkit.ops.conv_tuning import settings
from tests.ops.test_conv_numba import check_errors, conv_geom, gpu_rules, run_all

CASES = {
    "pad1-odd": conv_geom((2, 3, 1, 5, 6), (4, 3, 1, 3, 3), padding=(0, 1, 1)),
    "pad0-flip": conv_geom((1, 2, 1, 4, 5), (3, 2, 1, 3, 3), flip=True),
    "pad2-mixed": conv_geom((2, 2, 1, 3, 5), (2, 2, 1, 3, 3), padding=(0, 2, 1)),
    "pad3-flip": conv_geom((1, 2, 1, 2, 3), (3, 2, 1, 3, 3), padding=(0, 3, 3), flip=True),
}


@pytest.fixture
def winograd(monkeypatch):
    monkeypatch.setattr(settings, "winograd", True)


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
@pytest.mark.parametrize("name", list(CASES))
def test_matches_reference(rng, winograd, name, dtype):
    check_errors(run_all(rng, CASES[name], dtype), dtype)


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
    g = conv_geom((3, 3, 1, 4, 6), (2, 3, 1, 3, 3), padding=(0, 1, 1))
    per_image = 16 * (3 + 2) * 6 * 4
    monkeypatch.setattr(settings, "col_budget_bytes", images * per_image + 1)
    monkeypatch.setattr(settings, "winograd_parts", 4)
    t = conv_winograd.Tiles(3, 3, (4, 6), 2, (4, 6), 4)
    assert (t.chunk, t.tiles) == (images, 6)
    monkeypatch.setattr(settings, "col_budget_bytes", 1 << 40)    # the 32-bit bound
    assert conv_winograd.Tiles(10**6, 4, (1000, 1000), 4, (1000, 1000), 4).chunk == 536
    check_errors(run_all(rng, g, "float32"), "float32")


@pytest.mark.parametrize("config", ["tiny", "small", "large"])
def test_gpu_gemm_tiles(rng, winograd, monkeypatch, config):
    """The GPU's GEMM tile configurations (256 threads) on the 16 batched products."""
    monkeypatch.setattr(gemm, "gemm_config", lambda *a: config)
    check_errors(run_all(rng, CASES["pad1-odd"], "float32"), "float32")


def test_the_rule():
    """Winograd where it measured faster: ResNet-50's 3x3 stride-1 layers at batch 32 in
    float32 and float16; not at batch 2 (host-bound calls), not in float64, not for other
    kernels, strides, dilations or groups, nor past the transforms' 32-bit indexing;
    settings.winograd overrides the rule."""
    assert settings.winograd is None

    def g(n=32, c=64, hw=56, k=(1, 3, 3), stride=1, dilation=1, groups=1):
        return conv_geom((n, c, 1, hw, hw), (c, c // groups) + k, stride, (0, 1, 1), dilation,
                         groups)
    for c, hw in ((64, 56), (128, 28), (256, 14), (512, 7)):
        assert conv_winograd.pays(g(c=c, hw=hw), "float32")
        assert conv_winograd.pays(g(c=c, hw=hw), "float16")
        assert not conv_winograd.pays(g(n=2, c=c, hw=hw), "float32")
    assert not conv_winograd.pays(g(), "float64")
    # one image of 512 channels at 2048^2: its transformed tiles pass 2**31 elements
    big = conv_geom((1, 512, 1, 2048, 2048), (512, 512, 1, 3, 3), padding=(0, 1, 1))
    for other in (g(k=(1, 5, 5)), g(stride=(1, 2, 2)), g(dilation=(1, 2, 2)), g(groups=2),
                  conv_geom((32, 64, 3, 56, 56), (64, 64, 3, 3, 3), padding=1), big):
        assert not conv_winograd.applies(other) and not conv_winograd.pays(other, "float32")
    try:
        settings.winograd = False
        assert not conv_winograd.pays(g(), "float32")
        settings.winograd = True
        assert conv_winograd.pays(g(n=1, hw=8), "float64")
    finally:
        settings.winograd = None


def test_filter_slices_rule():
    """The filter gradient's tile slices (settings.winograd_parts = None) at an H100's GEMM
    tiles on the ResNet-50 3x3 layers at batch 32: the counts measured fastest on an H100 (or
    next to them: 17 for 16, 9 for 8, 3 for 4); at least 2, each at least MIN_TILES_PER_PART
    tiles long, so a short sum stays whole."""
    assert settings.winograd_parts is None
    with gpu_rules():
        assert [conv_winograd.filter_parts(c, c, 32 * ((hw + 1) // 2) ** 2)
                for c, hw in ((64, 56), (128, 28), (256, 14), (512, 7))] == [17, 9, 3, 2]
        assert conv_winograd.filter_parts(8, 8, 300) == 1


@pytest.mark.parametrize("dtype, operand", [("float16", "float16"), ("float32", "float32")])
def test_products_operands(rng, winograd, monkeypatch, dtype, operand):
    """The 16 products' operands: float16 data gives float16 U, V and dM (the pipelined HMMA
    kernel's input) with float32 sums; every operand row starts on a multiple of 8 tiles
    (16 bytes of float16: its copies), the padding columns zero; the call's math reaches the
    GEMM."""
    calls = []
    plain = gemm.gemm

    def spy(layout, a, b, c, dims, lds, grps, batch, **kw):
        calls.append((layout, a.dtype.name, b.dtype.name, c.dtype.name, dims, lds, batch,
                      kw.get("math")))
        return plain(layout, a, b, c, dims, lds, grps, batch, **kw)
    monkeypatch.setattr(gemm, "gemm", spy)
    monkeypatch.setattr(settings, "winograd_parts", 3)
    from numba import cuda
    g = CASES["pad1-odd"]           # 2 images of 3 x 3 tiles: P = 18, not a multiple of 8
    x, w, dy = (cuda.to_device(rng.standard_normal(s).astype(dtype))
                for s in (g.x_shape, g.w_shape, g.y_shape))
    s = cuda.default_stream()
    conv_numba.forward(x, w, None, g, s, math="tf32")
    conv_numba.backward_data(dy, w, g, s, math="tf32")
    conv_numba.backward_filter(x, dy, g, s, math="tf32")
    assert [c[0] for c in calls] == ["00", "00", "01"]
    for layout, a, b, c, dims, lds, batch, math in calls:
        assert (a, b, c, math) == (operand, operand, "float32", "tf32")
        assert lds[1] % 8 == 0 and (layout == "00" or (lds[0] % 8, dims[2] % 8) == (0, 0))
    assert calls[0][4][1] == calls[0][5][1] == 24                   # n = ps = 24 >= 18
    assert calls[2][4][2] == 8 and calls[2][6][3] == 8              # slices of 6 -> 8 tiles
    check_errors(run_all(rng, g, dtype), dtype)


def test_float16_operands_keep_the_data_range(winograd):
    """float16 U, V and dM are stored times F16_SCALE: a transformed value sums up to 4 inputs,
    so data of +-20000 (finite in float16, and for the direct path) made Inf and NaN unscaled.
    The centre tap alone: y = x and dx = dy, exactly."""
    from numba import cuda
    g = conv_geom((1, 1, 1, 8, 8), (1, 1, 1, 3, 3), padding=(0, 1, 1))
    big = (20000 * np.where((np.arange(64) // 2) % 2, 1.0, -1.0)).reshape(g.x_shape)
    w = np.zeros(g.w_shape)
    w[..., 1, 1] = 1.0
    x, wd = (cuda.to_device(a.astype(np.float16)) for a in (big, w))
    s = cuda.default_stream()
    y, algo = conv_numba.forward(x, wd, None, g, s)
    dx = conv_numba.backward_data(x, wd, g, s)[0]      # dy = the same pattern
    assert algo == "winograd"
    for got in (y, dx):
        assert np.array_equal(got.copy_to_host().astype(np.float64), big)
