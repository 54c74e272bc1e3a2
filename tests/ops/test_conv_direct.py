"""The direct kernels for few channels per group (dnnkit/ops/conv_direct.py): forward and data
gradient against the float64 reference of test_conv_numba.py, the rule, and repeated calls."""

import numpy as np
import pytest

from dnnkit import config
from dnnkit.ops import conv_depthwise, conv_direct, conv_numba
from dnnkit.ops.conv_tuning import settings

from .test_conv_numba import CASES, TOL, check_errors, conv_geom, run_all

# Partial tiles everywhere: 6 images (a group of four and one of two), 5 channels (a tile of
# four and one of one), 6 filters per group; grouped, strided, dilated, flipped and 3-D.
DIRECT_CASES = {
    "2d-c5-k6-n6": conv_geom((6, 5, 1, 5, 6), (6, 5, 1, 3, 3), padding=(0, 1, 1)),
    "2d-g2-s2-dil-flip": conv_geom((5, 6, 1, 7, 6), (12, 3, 1, 3, 2), (1, 2, 1), (0, 1, 1),
                                   (1, 1, 2), groups=2, flip=True),
    "3d-g3-s2": conv_geom((2, 6, 3, 4, 5), (9, 2, 2, 2, 3), (2, 1, 2), (1, 1, 1), groups=3),
    "2d-c1-k5": conv_geom((3, 1, 1, 6, 7), (5, 1, 1, 2, 3), padding=(0, 1, 0)),
}
ALL = {**{n: g for n, g in CASES.items() if not conv_depthwise.applies(g)}, **DIRECT_CASES}


def _algos(g, dtype="float32"):
    from numba import cuda
    s = cuda.default_stream()
    x, w, dy = (cuda.to_device(np.ones(sh, dtype)) for sh in (g.x_shape, g.w_shape, g.y_shape))
    return conv_numba.forward(x, w, None, g, s)[1], conv_numba.backward_data(dy, w, g, s)[1]


@pytest.mark.parametrize("dtype", list(TOL))
@pytest.mark.parametrize("name", list(ALL))
def test_direct_kernels_match_reference(rng, monkeypatch, name, dtype):
    """settings.direct = True: the forward (with a bias) and the data gradient on the direct
    kernels, every output written (new arrays start as NaN here)."""
    monkeypatch.setattr(settings, "direct", True)
    g = ALL[name]
    with config.change_flags({"dnn.debug.fill_uninitialized": "nan"}):
        assert _algos(g, dtype) == ("direct", "direct")
        check_errors(run_all(rng, g, dtype), dtype)


def test_tiles_beyond_the_grid_rows(rng, monkeypatch):
    """More tiles than the grid has block rows: the kernels walk them grid-stride."""
    monkeypatch.setattr(settings, "direct", True)
    monkeypatch.setattr(conv_direct, "MAX_GRID_ROWS", 2)
    g = DIRECT_CASES["2d-g2-s2-dil-flip"]
    assert conv_direct.grid(30, 5, 2, 6)[0] == (1, 2)
    check_errors(run_all(rng, g, "float32"), "float32")


@pytest.mark.parametrize("cg,groups,data,fwd", [
    (1, 1, False, False), (2, 1, True, False), (3, 1, True, False), (16, 1, True, False),
    (17, 1, False, False), (4, 32, True, True), (16, 32, True, True), (32, 32, False, False)])
def test_rule_takes_few_channels_per_group(cg, groups, data, fwd):
    """The default rule on 2-D convolutions: data gradients with 2-16 channels per group,
    forwards of grouped ones with at most 16 channels and filters per group; 3-D ones and
    depthwise ones (their own kernels) never."""
    assert settings.direct is None
    g = conv_geom((2, cg * groups, 1, 8, 8), (4 * groups, cg, 1, 3, 3), padding=(0, 1, 1),
                  groups=groups)
    assert conv_direct.pays(g, "bwd_data") is data
    assert conv_direct.pays(g, "fwd") is fwd
    wide = conv_geom((2, 4 * groups, 1, 8, 8), (17 * groups, 4, 1, 3, 3), groups=groups)
    assert not conv_direct.pays(wide, "fwd")                  # 17 filters per group
    deep = conv_geom((2, cg * groups, 3, 8, 8), (4 * groups, cg, 3, 3, 3), groups=groups)
    assert not conv_direct.pays(deep, "bwd_data") and not conv_direct.pays(deep, "fwd")
    depthwise = conv_geom((2, 8, 1, 8, 8), (16, 1, 1, 3, 3), groups=8)
    assert not conv_direct.pays(depthwise, "bwd_data")


def test_setting_overrides_the_rule(monkeypatch):
    g = conv_geom((2, 3, 1, 8, 8), (4, 3, 1, 3, 3), padding=(0, 1, 1))
    monkeypatch.setattr(settings, "direct", False)
    assert not conv_direct.pays(g, "bwd_data")
    assert _algos(g)[1] == "implicit_gemm"
    monkeypatch.setattr(settings, "direct", True)
    assert conv_direct.pays(g, "fwd") and _algos(g) == ("direct", "direct")


def test_repeated_calls_keep_the_direct_kernels(rng):
    """Repeated public calls (the memo: runners, replays) of a stride-1 3x3 data gradient with
    3 channels take the direct kernels, not the implicit GEMM's runner, and match the
    reference each time."""
    import dnnkit
    from numba import cuda
    from .test_conv_numba import ref_backward_data
    g = conv_geom((2, 3, 1, 5, 5), (4, 3, 1, 3, 3), padding=(0, 1, 1))
    dy64, w64 = rng.standard_normal((2, 4, 5, 5)), rng.standard_normal((4, 3, 3, 3))
    dy, w = (cuda.to_device(a.astype(np.float32)) for a in (dy64, w64))
    want = ref_backward_data(dy64.reshape(g.y_shape), w64.reshape(g.w_shape), g)
    with dnnkit.trace() as t:
        for _ in range(3):
            dx = dnnkit.conv2d_backward_data(dy, w, (2, 3, 5, 5), padding=1, backend="numba")
            err = np.abs(dx.copy_to_host() - want.reshape(2, 3, 5, 5)).max()
            assert err <= 1e-5 * np.abs(want).max()
    assert [e.algo for e in t] == ["direct"] * 3
