"""The Numba convolution backend (dnnkit/ops/conv_numba.py) against a float64 NumPy reference.

The reference enumerates every term x[n, c, i] * w[k, c', tap] of the convolution sum as index
triples (x, w, y) and accumulates them with bincount: forward sums into y, the data gradient
into x, the filter gradient into w. A finite-difference test checks that those gradients are
the true gradients of sum(y * dy).
"""

import contextlib
from unittest import mock

import numpy as np
import pytest

from dnnkit import device, reference
from dnnkit.geometry import ConvGeom
from dnnkit.ops import conv_depthwise, conv_implicit, conv_launch, conv_numba, gemm
from dnnkit.ops.conv_tuning import settings

TOL = {"float16": 4e-3, "float32": 2e-6, "float64": 1e-12}


def conv_geom(x, w, stride=1, padding=0, dilation=1, groups=1, flip=False, nd=None):
    t3 = [v if isinstance(v, tuple) else (v,) * 3 for v in (stride, padding, dilation)]
    return ConvGeom(nd or (2 if x[2] == w[2] == 1 else 3), x, w, *t3, groups, flip)


CASES = {
    "2d": conv_geom((2, 3, 1, 5, 6), (4, 3, 1, 3, 3), padding=(0, 1, 1)),
    "2d-s2-dil2-pad-flip": conv_geom((1, 2, 1, 6, 5), (2, 2, 1, 2, 3), (1, 2, 2), (0, 0, 1),
                                     (1, 2, 2), flip=True),
    "2d-s3-over-kernel": conv_geom((2, 2, 1, 6, 5), (3, 2, 1, 2, 2), (1, 3, 3), (0, 1, 0)),
    "2d-1x1-groups2": conv_geom((2, 4, 1, 3, 4), (4, 2, 1, 1, 1), groups=2, flip=True),
    "2d-depthwise": conv_geom((1, 4, 1, 5, 5), (4, 1, 1, 3, 3), (1, 2, 1), (0, 1, 1), groups=4,
                              flip=True),
    "2d-depthwise-x2": conv_geom((2, 2, 1, 4, 6), (4, 1, 1, 3, 2), 1, (0, 1, 0), (1, 1, 2),
                                 groups=2),
    "3d-dil-flip": conv_geom((1, 2, 4, 4, 3), (2, 2, 2, 2, 2), (1, 2, 1), (1, 0, 1), (2, 1, 1),
                             flip=True),
    "3d-groups2-s2": conv_geom((2, 4, 3, 4, 3), (4, 2, 3, 1, 2), (2, 1, 2), (1, 1, 0), groups=2),
    "3d-1x1x1-s3": conv_geom((1, 3, 3, 3, 4), (2, 3, 1, 1, 1), (2, 2, 3)),
    # col2im's undilated path (kernels/conv.py _taps) flipped, strided on every axis, padded
    "3d-s2-pad-flip": conv_geom((1, 2, 5, 5, 4), (2, 2, 3, 3, 2), (2, 2, 1), (1, 1, 1),
                                flip=True),
    # depthwise kernels (ops/conv_depthwise.py): 3-D strided, dilated, flipped, mult 2; and
    # 5 x 7 = 35 taps, two of the filter gradient's tap chunks (DW_TAPS 32)
    "3d-depthwise-s2-dil-flip": conv_geom((2, 3, 4, 5, 4), (6, 1, 2, 3, 2), (2, 1, 2),
                                          (1, 1, 0), (1, 2, 1), groups=3, flip=True),
    "2d-depthwise-5x7": conv_geom((3, 2, 1, 7, 9), (2, 1, 1, 5, 7), 1, (0, 2, 3), groups=2),
    # 6 images: a full group of DW_IMAGES (4) and a partial one; two filter-gradient slices
    "2d-depthwise-n6": conv_geom((6, 3, 1, 5, 4), (6, 1, 1, 3, 3), (1, 2, 1), (0, 1, 1),
                                 groups=3),
    # 8 x 9 = 72 output positions: two of the filter gradient's position slices (of 36; at
    # least the simulator's 32 threads each)
    "2d-depthwise-72": conv_geom((2, 2, 1, 8, 9), (4, 1, 1, 3, 3), 1, (0, 1, 1), groups=2),
    # col2im's tap period stride / gcd(dil, stride) > 1 with dilation: q = 2 (s2 d3, s4 d2)
    "2d-s2-dil3-s4-dil2": conv_geom((1, 2, 1, 9, 11), (2, 2, 1, 3, 4), (1, 2, 4), (0, 2, 3),
                                    (1, 3, 2)),
    "2d-s3-dil2-flip": conv_geom((2, 1, 1, 8, 7), (1, 1, 1, 4, 3), (1, 3, 2), (0, 3, 1),
                                 (1, 2, 3), flip=True),
    # 1x1, stride 1, no padding: the GEMMs read x and write dx in place (no im2col)
    "2d-pointwise": conv_geom((3, 5, 1, 2, 3), (4, 5, 1, 1, 1)),
    "3d-pointwise-groups-dil": conv_geom((2, 4, 2, 2, 3), (6, 2, 1, 1, 1), 1, 0, (2, 1, 3),
                                         groups=2),
}


@pytest.fixture(autouse=True)
def _gemm_paths(monkeypatch):
    """The GEMM paths' data gradients here: most of CASES has 2-16 channels per group, whose
    data gradients take the direct kernels by default (tests/ops/test_conv_direct.py)."""
    monkeypatch.setattr(settings, "direct", False)


# The geometries the GEMM paths compute (depthwise ones take ops/conv_depthwise.py's kernels
# whatever the GEMM's settings say)
GEMM_CASES = [name for name, g in CASES.items() if not conv_depthwise.applies(g)]


# ------------------------------------------------------------------ float64 reference

def _terms(g):
    """Flat indices (xi, wi, yi) of every in-bounds term of the convolution sum."""
    n_, _, *size = g.x_shape
    k_, cg, *ks = g.w_shape
    out = g.out_spatial
    n, k, c, *rest = np.meshgrid(*[np.arange(v) for v in (n_, k_, cg, *ks, *out)],
                                 indexing="ij")
    taps, outs = rest[:3], rest[3:]
    if g.flip:
        taps = [kn - 1 - t for kn, t in zip(ks, taps)]
    pos = [o * s + t * d - p for o, t, s, d, p in zip(outs, taps, g.stride, g.dilation,
                                                         g.padding)]
    inside = np.logical_and.reduce([(0 <= p) & (p < i) for p, i in zip(pos, size)])
    ci = (k // (k_ // g.groups)) * cg + c
    xi = np.ravel_multi_index([n, ci] + [np.where(inside, p, 0) for p in pos], g.x_shape)
    wi = np.ravel_multi_index([k, c] + rest[:3], g.w_shape)
    yi = np.ravel_multi_index([n, k] + outs, g.y_shape)
    return xi[inside], wi[inside], yi[inside]


def _sum_into(index, values, shape):
    return np.bincount(index, weights=values, minlength=int(np.prod(shape))).reshape(shape)


def ref_forward(x, w, b, g):
    xi, wi, yi = _terms(g)
    y = _sum_into(yi, x.ravel()[xi] * w.ravel()[wi], g.y_shape)
    return y if b is None else y + b.reshape(1, -1, 1, 1, 1)


def ref_backward_data(dy, w, g):
    xi, wi, yi = _terms(g)
    return _sum_into(xi, dy.ravel()[yi] * w.ravel()[wi], g.x_shape)


def ref_backward_filter(x, dy, g):
    xi, wi, yi = _terms(g)
    return _sum_into(wi, dy.ravel()[yi] * x.ravel()[xi], g.w_shape)


def ref_backward_bias(dy):
    return dy.sum(axis=(0,) + tuple(range(2, dy.ndim)))


@pytest.mark.parametrize("name", ["2d-s2-dil2-pad-flip", "2d-depthwise-x2", "3d-groups2-s2"])
def test_reference_gradients_are_the_finite_differences(rng, name):
    g = CASES[name]
    x, w = rng.standard_normal(g.x_shape), rng.standard_normal(g.w_shape)
    b, dy = rng.standard_normal(g.w_shape[0]), rng.standard_normal(g.y_shape)

    def fd(arr):
        # the loss is linear in each argument, so central differences are exact up to rounding
        out, h = np.zeros_like(arr), 0.5
        for idx in np.ndindex(arr.shape):
            arr[idx] += h
            up = (ref_forward(x, w, b, g) * dy).sum()
            arr[idx] -= 2 * h
            down = (ref_forward(x, w, b, g) * dy).sum()
            arr[idx] += h
            out[idx] = (up - down) / (2 * h)
        return out

    assert np.allclose(ref_backward_data(dy, w, g), fd(x), rtol=1e-10, atol=1e-10)
    assert np.allclose(ref_backward_filter(x, dy, g), fd(w), rtol=1e-10, atol=1e-10)
    assert np.allclose(ref_backward_bias(dy), fd(b), rtol=1e-10, atol=1e-10)


# ------------------------------------------------------------------ the Numba backend

def run_all(rng, g, dtype):
    """Every pass of the backend on random data vs the reference; the relative errors."""
    from numba import cuda
    host = [rng.standard_normal(s).astype(dtype) for s in
            (g.x_shape, g.w_shape, (g.w_shape[0],), g.y_shape)]
    x, w, b, dy = (cuda.to_device(a) for a in host)
    x64, w64, b64, dy64 = (a.astype(np.float64) for a in host)
    s = cuda.default_stream()
    got = {"forward": conv_numba.forward(x, w, b, g, s)[0],
           "data": conv_numba.backward_data(dy, w, g, s)[0],
           "filter": conv_numba.backward_filter(x, dy, g, s)[0],
           "bias": conv_numba.backward_bias(dy, s)}
    want = {"forward": ref_forward(x64, w64, b64, g), "data": ref_backward_data(dy64, w64, g),
            "filter": ref_backward_filter(x64, dy64, g), "bias": ref_backward_bias(dy64)}
    for key, a in got.items():
        assert a.dtype == np.dtype(dtype) and a.shape == want[key].shape, key
    return {key: reference.rel_error(a.copy_to_host(), want[key]) for key, a in got.items()}


def check_errors(errors, dtype):
    assert max(errors.values()) <= TOL[dtype], errors


@contextlib.contextmanager
def gpu_rules(sms=132):
    """The launch rules as on a GPU of ``sms`` multiprocessors (an H100's by default):
    ops/gemm.py's tile choice (on the simulator it answers "sim") and the waves of
    ops/conv_launch.py."""
    with mock.patch.object(device, "simulator", lambda: False), \
            mock.patch.object(device, "sm_count", lambda dev=None: sms):
        yield


@pytest.mark.parametrize("dtype", list(TOL))
@pytest.mark.parametrize("name", list(CASES))
def test_matches_reference(rng, name, dtype):
    check_errors(run_all(rng, CASES[name], dtype), dtype)


def test_depthwise_of_an_empty_input_with_padding(monkeypatch):
    """x with no rows, padded to an output of 2 x 3: y is the bias in every image (no image
    of a thread's group of four left unwritten: outputs start as NaN here)."""
    from numba import cuda
    from dnnkit import config
    g = conv_geom((6, 3, 1, 0, 3), (3, 1, 1, 1, 3), padding=(0, 1, 1), groups=3)
    assert conv_depthwise.applies(g)
    b = np.array([0.0, 1.0, 2.0], np.float32)
    x = cuda.to_device(np.zeros(g.x_shape, np.float32))
    w = cuda.to_device(np.ones(g.w_shape, np.float32))
    with config.change_flags({"dnn.debug.fill_uninitialized": "nan"}):
        y, algo = conv_numba.forward(x, w, cuda.to_device(b), g, cuda.default_stream())
    assert algo == "depthwise" and y.shape == g.y_shape == (6, 3, 1, 2, 3)
    assert np.array_equal(y.copy_to_host(), np.broadcast_to(b.reshape(1, 3, 1, 1, 1), y.shape))


@pytest.mark.parametrize("n,k,chunks,positions,threads", [
    (8, 64, 1, 112 * 112, 128), (6, 96, 1, 56 * 56, 128), (16, 256, 1, 28 * 28, 128),
    (16, 32, 4, 79 * 341, 128), (1, 1, 1, 5, 128), (3, 2, 2, 63, 32), (64, 1024, 2, 49, 128),
    (1, 2, 1, 129, 128), (1, 2, 1, 257, 128), (1, 2, 1, 1000, 128)])
def test_depthwise_filter_slices_fill_the_gpu(n, k, chunks, positions, threads):
    """The depthwise filter gradient's parts: two waves of blocks where the images and
    positions allow it, never more image slices than image groups nor a position slice
    shorter than a block's threads (unless it holds every position), every position in one
    slice."""
    images, per_pos = conv_depthwise.filter_parts(n, k, chunks, positions, threads)
    slices = -(-positions // per_pos)
    groups = -(-n // 4)
    assert 1 <= images <= groups and (slices == 1 or per_pos >= threads)
    assert (slices - 1) * per_pos < positions <= slices * per_pos
    blocks = k * chunks * images * slices
    most = k * chunks * groups * max(1, positions // threads)
    assert blocks >= min(2 * conv_launch.wave_blocks(), most)
    assert (8, 64) != (n, k) or slices > 1          # the 5x5 layer's 128 blocks, now more


def test_depthwise_case_takes_position_slices():
    """CASES' 2d-depthwise-72 runs the filter gradient in two position slices here (blocks of
    32 threads on the simulator)."""
    g = CASES["2d-depthwise-72"]
    assert conv_depthwise.applies(g)
    assert conv_depthwise.filter_parts(2, 4, 1, 72, 32) == (1, 36)


@pytest.mark.parametrize("name", GEMM_CASES)
def test_column_buffer_paths_match_reference(rng, monkeypatch, name):
    """im2col + GEMM and GEMM + col2im everywhere (settings.implicit = False): the default
    takes the implicit GEMM on the stride-1 geometries here, so they need this to be
    covered."""
    monkeypatch.setattr(settings, "implicit", False)
    check_errors(run_all(rng, CASES[name], "float32"), "float32")


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("name", GEMM_CASES)
def test_split_k_forward_matches_reference(rng, monkeypatch, name, dtype):
    """The column-buffer forward with its sum over rows split in parts (settings.split_k = 3:
    the largest divisor of rows up to 3) into an accumulation-type workspace, summed with the
    bias by conv_partsum_fwd_kernel."""
    monkeypatch.setattr(settings, "implicit", False)
    monkeypatch.setattr(settings, "split_k", 3)
    g = CASES[name]
    assert conv_numba.k_parts(conv_numba.ConvSizes(g, 4), 4) == \
        max(d for d in (1, 2, 3) if conv_numba.ConvSizes(g, 4).rows % d == 0)
    check_errors(run_all(rng, g, dtype), dtype)
    # without a bias (the sum kernel's per = 0 branch)
    from numba import cuda
    xh, wh = (rng.standard_normal(s).astype(dtype) for s in (g.x_shape, g.w_shape))
    y = conv_numba.forward(cuda.to_device(xh), cuda.to_device(wh), None, g,
                           cuda.default_stream())[0].copy_to_host()
    want = ref_forward(xh.astype(np.float64), wh.astype(np.float64), None, g)
    assert reference.rel_error(y, want) <= TOL[dtype]


def test_split_k_rule_fills_one_wave():
    """The rule (settings.split_k = None) at an H100's tiles on the ResNet-50 layers at
    batch 32 (the counts measured fastest on an H100): 512 channels at 7^2 make 104 blocks
    of 64 x 128 (8 parts: 416 blocks of 128 x 128 fill 0.79 of their last wave, as 2 and 4
    parts do; 3 and 6 only 0.59), 256 at 14^2 196 (8), 128 at 28^2 392 (4: each part keeps
    >= 256 of the 1152 rows); 64 at 56^2 fills 0.99 of its wave alone (1)."""
    def parts(c, k, hw):
        g = conv_geom((32, c, 1, hw, hw), (k, c, 1, 3, 3), padding=(0, 1, 1), nd=2)
        sz = conv_numba.ConvSizes(g, 4)
        return conv_numba.k_parts(sz, 4 * 32 * k * hw * hw)

    with gpu_rules():
        assert (parts(512, 512, 7), parts(256, 256, 14), parts(128, 128, 28),
                parts(64, 64, 56)) == (8, 8, 4, 1)
        assert parts(8, 8, 2) == 1          # 72 rows: too short a sum to split


@pytest.mark.parametrize("implicit", [False, True])
@pytest.mark.parametrize("name", GEMM_CASES)
def test_filter_gradient_in_image_slices_matches_reference(rng, monkeypatch, name, implicit):
    """The filter gradient reduced in settings.filter_parts = 2 slices of whole images (the
    largest divisor of the batch up to 2) by separate blocks, summed by
    conv_partsum_fwd_kernel, on both paths (the rule keeps tiny problems whole)."""
    monkeypatch.setattr(settings, "implicit", implicit)
    monkeypatch.setattr(settings, "filter_parts", 2)
    check_errors(run_all(rng, CASES[name], "float32"), "float32")


@pytest.mark.parametrize("images", [None, 1, 2])
@pytest.mark.parametrize("geo", [
    ((3, 2, 1, 7, 8), (4, 2, 1, 3, 2), (1, 2, 1), (0, 1, 1), (1, 1, 2), False),   # out 4 x 6
    ((2, 1, 3, 5, 6), (3, 1, 2, 3, 3), (1, 1, 2), (1, 1, 0), (1, 2, 1), True)])   # 4 x 1 x 2
def test_filter_gradient_in_position_slices_matches_reference(rng, monkeypatch, geo, images):
    """The column path's filter gradient with each image's output positions in slices
    (settings.filter_positions = 3: the largest divisor of the positions up to 3), batched
    over (image, slice) and summed by conv_partsum_fwd_kernel; ``images``: a column budget of
    that many images (chunks of 2 + 1 or 1 + 1 + 1, a short last chunk adding into the first
    chunk's slots)."""
    x, w, stride, pad, dil, flip = geo
    g = conv_geom(x, w, stride, pad, dil, flip=flip)
    sz = conv_numba.ConvSizes(g, 4)
    if images is not None:
        per_image = sz.rows * sz.out * 4
        monkeypatch.setattr(settings, "col_budget_bytes", images * per_image + 1)
    monkeypatch.setattr(settings, "implicit", False)
    monkeypatch.setattr(settings, "filter_positions", 3)
    sz = conv_numba.ConvSizes(g, 4)
    assert conv_numba.position_slices(sz, 4) in (2, 3) and sz.chunk == (images or g.x_shape[0])
    check_errors(run_all(rng, g, "float32"), "float32")


def test_position_slice_rule():
    """The rule (settings.filter_positions = None) with an H100's tiles: where a slice per
    image leaves less than a wave of blocks, the fewest position slices that make about a
    wave, within the sum's length floor and with the slices' starts as aligned as the images'
    -- the counts measured fastest (or within 5%) on an H100: DeepBench's first speech layer
    (32 x 100 from one channel, 16 blocks otherwise) 31, the 7x7/2 stem at batch 16 8 and at
    batch 32 4, the 32-channel speech layer 19 (6,308 positions: 2 and 4 slices would start
    off 8-byte boundaries); none where the images alone fill a wave (ResNet-50's 128 channels
    at 28^2), for groups, or for a 1x1 convolution."""
    def slices(x, w, stride, pad, groups=1):
        g = conv_geom(x, w, stride, pad, groups=groups)
        sz = conv_numba.ConvSizes(g, 4)
        return conv_numba.position_slices(sz, 4 * int(np.prod(g.w_shape)))

    with gpu_rules():
        assert slices((16, 1, 1, 161, 700), (32, 1, 1, 5, 20), (1, 2, 2), 0) == 31
        assert slices((16, 3, 1, 224, 224), (64, 3, 1, 7, 7), (1, 2, 2), (0, 3, 3)) == 8
        assert slices((32, 3, 1, 224, 224), (64, 3, 1, 7, 7), (1, 2, 2), (0, 3, 3)) == 4
        assert slices((16, 32, 1, 79, 341), (32, 32, 1, 5, 10), (1, 2, 2), 0) == 19
        assert slices((32, 128, 1, 28, 28), (128, 128, 1, 3, 3), 1, (0, 1, 1)) == 1
        assert slices((4, 8, 1, 64, 64), (8, 4, 1, 3, 3), 1, (0, 1, 1), groups=2) == 1
        assert slices((4, 8, 1, 64, 64), (8, 8, 1, 1, 1), 1, 0) == 1


def test_filter_split_rule():
    """The filter gradient's image slices (settings.filter_parts = None) on the ResNet-50 3x3
    layers at batch 32 with an H100's tiles: the last-wave rule with each slice's sum at least
    MIN_K_PER_PART long, measured fastest or within 2% on an H100: 128 channels at 28^2 32
    slices, 256 at 14^2 16, 512 at 7^2 4 (16 without the length floor); a tiny problem stays
    whole."""
    def parts(n, c, hw):
        g = conv_geom((n, c, 1, hw, hw), (c, c, 1, 3, 3), padding=(0, 1, 1), nd=2)
        sz = conv_numba.ConvSizes(g, 4)
        return conv_numba.filter_parts(sz, 4 * c * c * 9)

    with gpu_rules():
        assert [parts(32, c, hw) for c, hw in ((128, 28), (256, 14), (512, 7))] == [32, 16, 4]
        assert parts(2, 4, 4) == 1


def test_default_takes_the_implicit_gemm_where_it_measured_faster():
    """settings.implicit = None (the default): the implicit GEMM for a stride-1 undilated
    ungrouped 2-D 3x3 forward or data gradient with at most 128 channels out; the column
    buffer for strided ones, for more channels, for other kernels and for every filter
    gradient (validation/implicit_bench.py on an H100)."""
    from numba import cuda
    assert settings.implicit is None
    s = cuda.default_stream()

    def algos(x, w, stride=1, padding=1):
        g = conv_geom(x, w, stride, (0, padding, padding), nd=2)
        a, b, d = (cuda.to_device(np.ones(sh, np.float32))
                   for sh in (g.x_shape, g.w_shape, g.y_shape))
        return (conv_numba.forward(a, b, None, g, s)[1],
                conv_numba.backward_data(d, b, g, s)[1],
                conv_numba.backward_filter(a, d, g, s)[1])

    im = ("im2col+gemm", "gemm+col2im", "im2col+gemm")
    assert algos((1, 2, 1, 3, 3), (3, 2, 1, 3, 3)) == ("implicit_gemm", "implicit_gemm",
                                                      "im2col+gemm")
    assert algos((1, 2, 1, 4, 4), (3, 2, 1, 3, 3), stride=(1, 2, 2)) == im
    assert algos((1, 2, 1, 3, 3), (3, 2, 1, 1, 1), padding=1) == im           # one tap
    assert algos((1, 2, 1, 5, 5), (3, 2, 1, 5, 5), padding=2) == im           # not timed: 5x5
    g = conv_geom((1, 2, 1, 3, 3), (2, 1, 1, 3, 3), padding=(0, 1, 1), groups=2, nd=2)
    assert not conv_implicit.implicit_pays(g, conv_numba.ConvSizes(g, 4), False)  # nor grouped
    # 129 channels out: the column buffer forward; the data gradient makes 2 channels
    assert algos((1, 2, 1, 2, 2), (129, 2, 1, 3, 3)) == ("im2col+gemm", "implicit_gemm",
                                                        "im2col+gemm")
    assert algos((1, 129, 1, 2, 2), (2, 129, 1, 3, 3)) == ("implicit_gemm", "gemm+col2im",
                                                          "im2col+gemm")


@pytest.mark.parametrize("dtype", list(TOL))
@pytest.mark.parametrize("name", list(CASES))
def test_implicit_paths_match_reference(rng, monkeypatch, name, dtype):
    """The forward, the filter gradient (x read as its im2col matrix, or its transpose, through
    the tap table: no column buffer) and the stride-1 data gradient (dy read as the column
    matrix of a convolution) through the implicit GEMM (settings.implicit = True) on every
    geometry; 1x1 stride-1 unpadded ones keep the in-place path."""
    monkeypatch.setattr(settings, "implicit", True)
    check_errors(run_all(rng, CASES[name], dtype), dtype)
    from numba import cuda
    g, s = CASES[name], cuda.default_stream()
    x, w, dy = (cuda.to_device(np.ones(sh, dtype)) for sh in (g.x_shape, g.w_shape, g.y_shape))
    pointwise = conv_numba.ConvSizes(g, 4).pointwise
    want = "im2col+gemm" if pointwise else "implicit_gemm"
    # the data gradient: a convolution of dy only at stride 1
    data = "implicit_gemm" if not pointwise and max(g.stride) == 1 else "gemm+col2im"
    if conv_depthwise.applies(g):       # depthwise geometries keep their direct kernels
        want = data = "depthwise"
    assert conv_numba.forward(x, w, None, g, s)[1] == want
    assert conv_numba.backward_filter(x, dy, g, s)[1] == want
    assert conv_numba.backward_data(dy, w, g, s)[1] == data


@pytest.mark.parametrize("config", ["tiny", "small", "large"])
def test_implicit_paths_on_gpu_gemm_tiles(rng, monkeypatch, config):
    """The implicit forward and filter gradient with the GPU's tile configurations (256
    threads; forward columns decoded by the first 128 threads, edge tiles past the last
    column read as padding; the filter gradient's (image, position) walk over several
    images per slice)."""
    monkeypatch.setattr(gemm, "gemm_config", lambda *a: config)
    monkeypatch.setattr(settings, "implicit", True)
    g = conv_geom((3, 3, 1, 4, 3), (5, 3, 1, 2, 2), (1, 1, 1), (0, 1, 0), (1, 1, 2))
    check_errors(run_all(rng, g, "float32"), "float32")


@pytest.mark.parametrize("images", [1, 2])
def test_batch_in_chunks(rng, monkeypatch, images):
    """A column budget of `images` images: N = 3 runs as chunks of 2 + 1 (the filter gradient's
    image split then differs in the last chunk) or 1 + 1 + 1; the forward (strided: the
    column buffer) with its k split in 2, each chunk writing its images' partial sums."""
    g = conv_geom((3, 4, 1, 4, 5), (4, 2, 1, 2, 3), (1, 1, 2), (0, 1, 1), groups=2, flip=True)
    per_image = 4 * 6 * int(np.prod(g.out_spatial)) * 4      # C*T*R*S * O * sizeof(float32)
    monkeypatch.setattr(settings, "col_budget_bytes", images * per_image + 1)
    monkeypatch.setattr(settings, "filter_parts", 2)
    monkeypatch.setattr(settings, "split_k", 2)
    assert conv_numba.ConvSizes(g, 4).chunk == images
    assert conv_numba.k_parts(conv_numba.ConvSizes(g, 4), 4) == 2
    check_errors(run_all(rng, g, "float32"), "float32")


@pytest.mark.parametrize("config", ["tiny", "small", "large"])
def test_gpu_gemm_tiles(rng, monkeypatch, config):
    """The GPU's GEMM tile configurations (256 threads, 32, 64 or 128 rows x 128 columns) on the
    simulator: multi-round staging of both operands, the register double buffering, edge
    tiles in every dimension and the grouped (image, position) columns."""
    monkeypatch.setattr(gemm, "gemm_config", lambda *a: config)
    g = conv_geom((3, 3, 1, 4, 3), (5, 3, 1, 2, 2), padding=(0, 1, 0))
    check_errors(run_all(rng, g, "float32"), "float32")
    g = conv_geom((3, 3, 1, 4, 3), (5, 3, 1, 1, 1))          # pointwise: x and dx in place
    assert conv_numba.ConvSizes(g, 4).pointwise
    check_errors(run_all(rng, g, "float32"), "float32")


@pytest.mark.parametrize("shape", [(3, 4), (2, 3, 5), (1, 2, 3, 1, 4)])
def test_bias_gradient_any_rank(rng, shape):
    from numba import cuda
    dy = rng.standard_normal(shape)
    db = conv_numba.backward_bias(cuda.to_device(dy), cuda.default_stream()).copy_to_host()
    assert reference.rel_error(db, ref_backward_bias(dy)) <= TOL["float64"]


def test_waves_follow_the_device():
    """The split rules' wave and the GEMM's large-tile threshold come from the device's SM
    count: 264 blocks on an H100 or H200 (132 SMs), 216 on an A100 (108), 116 on an L4 (58);
    the simulator keeps an H100's wave."""
    assert conv_launch.wave_blocks() == 264
    for sms in (132, 108, 58):
        with gpu_rules(sms):
            assert conv_launch.wave_blocks() == 2 * sms
            # 128 x 128 tiles from two blocks per SM on: m = 128, n = 128 * blocks
            assert gemm.gemm_config(128, 128 * 2 * sms) == "large"
            assert gemm.gemm_config(128, 128 * (2 * sms - 1)) == "small"
            # 32 rows or fewer: 32 x 128 tiles, whatever n
            assert gemm.gemm_config(32, 1 << 20) == gemm.gemm_config(1, 128) == "tiny"
            assert gemm.gemm_config(33, 1 << 20) == "small"


@pytest.mark.parametrize("bias", [False, True])
def test_repeated_implicit_calls_run_their_packed_gemm(rng, monkeypatch, bias):
    """ops/conv_prepared.py: a repeated forward or data gradient of one signature on the
    implicit GEMM runs a launch packed once (gemm.prepared), with each call's own arrays
    (gemm.gemm, the full path's, is never called), and matches the float64 reference on new
    inputs every call; its output is a fresh array each call."""
    import dnnkit
    from numba import cuda
    xs = [rng.standard_normal((2, 3, 5, 5)) for _ in range(3)]
    w = rng.standard_normal((4, 3, 3, 3))
    b = rng.standard_normal(4)
    dys = [rng.standard_normal((2, 4, 5, 5)) for _ in range(3)]
    real, calls = gemm.gemm, []
    monkeypatch.setattr(gemm, "gemm", lambda *a, **k: calls.append(1) or real(*a, **k))
    dw, db = cuda.to_device(w), cuda.to_device(b) if bias else None
    outs = []
    for k, (x, dy) in enumerate(zip(xs, dys)):
        calls.clear()
        y = dnnkit.conv2d(cuda.to_device(x), dw, db, padding=1, backend="numba")
        dx = dnnkit.conv2d_backward_data(cuda.to_device(dy), dw, x.shape, padding=1,
                                         backend="numba")
        assert not calls            # the first call's runner is the packed launch too
        want = reference.conv_forward(x, w, b if bias else None, padding=(1, 1), stride=(1, 1), dilation=(1, 1))
        assert reference.rel_error(y.copy_to_host(), want) <= 1e-10
        assert reference.rel_error(dx.copy_to_host(),
                                   reference.conv_backward_data(dy, w, x.shape, padding=(1, 1), stride=(1, 1), dilation=(1, 1))) \
            <= 1e-10
        outs.append((y, dx))
    for k, (x, dy) in enumerate(zip(xs, dys)):      # each call's outputs are its own
        want = reference.conv_forward(x, w, b if bias else None, padding=(1, 1), stride=(1, 1), dilation=(1, 1))
        assert reference.rel_error(outs[k][0].copy_to_host(), want) <= 1e-10


def test_a_switch_change_reaches_a_signature_already_repeated(rng, monkeypatch):
    """conv_tuning.settings are read at call time: a runner kept for a repeated signature
    (the implicit GEMM's) is dropped when a switch changes, so the next call takes the path
    the switch asks for (the column buffer's im2col launch)."""
    import dnnkit
    from numba import cuda
    x, w = cuda.to_device(rng.standard_normal((1, 2, 4, 4))), \
        cuda.to_device(rng.standard_normal((3, 2, 3, 3)))
    for _ in range(2):
        dnnkit.conv2d(x, w, padding=1, backend="numba")
    seen = []
    real = conv_numba._im2col
    monkeypatch.setattr(conv_numba, "_im2col", lambda *a: seen.append(1) or real(*a))
    monkeypatch.setattr(settings, "implicit", False)
    y = dnnkit.conv2d(x, w, padding=1, backend="numba").copy_to_host()
    assert seen, "the kept implicit runner ran instead of the column buffer"
    want = reference.conv_forward(x.copy_to_host(), w.copy_to_host(), padding=(1, 1),
                                  stride=(1, 1), dilation=(1, 1))
    assert reference.rel_error(y, want) <= 1e-10


def test_setting_tensor_cores_drops_the_kept_runners(monkeypatch):
    """gemm.TENSOR_CORES is read when a GEMM is planned: setting it drops the memo's runners
    (which keep their plan), as the conv_tuning switches do."""
    from dnnkit import fastpath
    before = fastpath._gen[0]
    monkeypatch.setattr(gemm, "TENSOR_CORES", not gemm.TENSOR_CORES)
    assert fastpath._gen[0] == before + 1


def test_repeated_calls_with_an_empty_image_return_empty_and_zero_outputs():
    """x of 0x0 pixels padded to a 2x2 output: the data gradient is empty and the forward is
    zeros (a sum over padding only), on the first call and on the memo's repeats (the
    runners of ops/conv_prepared.py leave these to the full path)."""
    import dnnkit
    from numba import cuda
    dy = cuda.to_device(np.ones((1, 3, 2, 2)))
    w = cuda.to_device(np.ones((3, 2, 3, 3)))
    x = cuda.to_device(np.ones((1, 2, 0, 0)))
    for _ in range(3):
        dx = dnnkit.conv2d_backward_data(dy, w, (1, 2, 0, 0), padding=2, backend="numba")
        assert dx.shape == (1, 2, 0, 0)
        y = dnnkit.conv2d(x, w, padding=2, backend="numba").copy_to_host()
        assert y.shape == (1, 3, 2, 2) and not y.any()


def test_depthwise_calls_skip_the_implicit_runners(rng, monkeypatch):
    """Repeated public calls (the memo's runners, ops/conv_prepared.py) keep the depthwise
    kernels with settings.implicit = True, which sends other stride-1 3x3 calls to the
    implicit GEMM's runners."""
    import dnnkit
    from numba import cuda
    monkeypatch.setattr(settings, "implicit", True)
    x = cuda.to_device(rng.standard_normal((2, 4, 5, 5)).astype(np.float32))
    w = cuda.to_device(rng.standard_normal((4, 1, 3, 3)).astype(np.float32))
    dy = cuda.to_device(rng.standard_normal((2, 4, 5, 5)).astype(np.float32))
    with dnnkit.trace() as t:
        for _ in range(3):
            dnnkit.conv2d(x, w, padding=1, groups=4, backend="numba")
            dnnkit.conv2d_backward_data(dy, w, (2, 4, 5, 5), padding=1, groups=4,
                                        backend="numba")
    assert [e.algo for e in t] == ["depthwise"] * 6
