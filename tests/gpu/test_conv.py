"""Convolution on a real GPU: cuDNN vs Numba vs float64 at realistic sizes, every named cuDNN
algorithm, the algorithm cache, determinism."""

import numpy as np
import pytest

import dnnkit
from dnnkit import config, reference
from dnnkit.testing import assert_backends_agree

pytestmark = [pytest.mark.gpu, pytest.mark.cudnn]

SHAPES = [  # (x, w, stride, padding, dilation, groups)
    ((8, 64, 28, 28), (64, 64, 3, 3), 1, 1, 1, 1),
    ((4, 32, 30, 17), (48, 16, 5, 3), (2, 1), (2, 0), (1, 2), 2),
    ((4, 32, 16, 16), (32, 1, 3, 3), 1, 1, 1, 32),
    ((2, 16, 8, 12, 10), (24, 16, 3, 3, 3), 1, 1, 1, 1),
]


def _inputs(rng, xs, ws, dtype):
    fan = int(np.prod(ws[1:]))
    return (rng.standard_normal(xs).astype(dtype),
            (rng.standard_normal(ws) / np.sqrt(fan)).astype(dtype))


@pytest.mark.parametrize("implicit", [False, True], ids=["im2col", "implicit"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
@pytest.mark.parametrize("shape", SHAPES, ids=[f"s{i}" for i in range(len(SHAPES))])
def test_backends_agree_with_each_other_and_float64(rng, monkeypatch, shape, dtype, implicit):
    """Both Numba convolution paths everywhere (im2col + GEMM, and the implicit GEMM; by
    default each pass takes the one measured faster) against cuDNN and float64 at the GPU's
    tile sizes."""
    from dnnkit.ops.conv_tuning import settings
    monkeypatch.setattr(settings, "implicit", implicit)
    xs, ws, stride, padding, dilation, groups = shape
    nd = len(xs) - 2
    fwd = dnnkit.conv2d if nd == 2 else dnnkit.conv3d
    bd = dnnkit.conv2d_backward_data if nd == 2 else dnnkit.conv3d_backward_data
    bf = dnnkit.conv2d_backward_filter if nd == 2 else dnnkit.conv3d_backward_filter
    x, w = _inputs(rng, xs, ws, dtype)
    kw = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)
    y = assert_backends_agree(fwd, x, w, **kw).copy_to_host()
    from dnnkit.ops.conv_args import make_geom
    g = make_geom("t", nd, xs, ws, stride, padding, dilation, groups, "cross")
    args = (g.user_tuple(g.stride), g.user_tuple(g.padding), g.user_tuple(g.dilation), groups)
    tol = {"float16": 5e-3, "float32": 1e-5, "float64": 1e-12}[dtype]
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    assert reference.rel_error(y, reference.conv_forward(x64, w64, None, *args)) <= tol
    dy = rng.standard_normal(y.shape).astype(dtype)
    dx = assert_backends_agree(bd, dy, w, xs, **kw).copy_to_host()
    dy64 = dy.astype(np.float64)
    assert reference.rel_error(dx, reference.conv_backward_data(dy64, w64, xs, *args)) <= tol
    dw = assert_backends_agree(bf, x, dy, ws, **kw).copy_to_host()
    assert reference.rel_error(dw, reference.conv_backward_filter(x64, dy64, ws, *args)) \
        <= 2 * tol


def _every_named(direction):
    from dnnkit.cudnn import conv_algos
    return list({"fwd": conv_algos.FWD_ALGOS, "bwd_data": conv_algos.BWD_DATA_ALGOS,
                 "bwd_filter": conv_algos.BWD_FILTER_ALGOS}[direction]) + list(conv_algos.CHOICES)


@pytest.mark.parametrize("direction", ["fwd", "bwd_data", "bwd_filter"])
def test_every_named_algorithm_gives_the_same_answer(rng, direction):
    xs, ws = (4, 32, 20, 20), (32, 32, 3, 3)
    x, w = _inputs(rng, xs, ws, "float32")
    dy = rng.standard_normal((4, 32, 20, 20)).astype(np.float32)
    ref = {"fwd": lambda: reference.conv_forward(x, w, None, (1, 1), (1, 1), (1, 1)),
           "bwd_data": lambda: reference.conv_backward_data(dy, w, xs, (1, 1), (1, 1), (1, 1)),
           "bwd_filter": lambda: reference.conv_backward_filter(x, dy, ws, (1, 1), (1, 1), (1, 1))}
    ref = ref[direction]()
    call = {"fwd": lambda a: dnnkit.conv2d(x, w, padding=1, algo=a, backend="cudnn"),
            "bwd_data": lambda a: dnnkit.conv2d_backward_data(dy, w, xs, padding=1, algo=a,
                                                              backend="cudnn"),
            "bwd_filter": lambda a: dnnkit.conv2d_backward_filter(x, dy, ws, padding=1, algo=a,
                                                                  backend="cudnn")}[direction]
    ran = {}
    for name in _every_named(direction):
        with dnnkit.trace() as t:
            out = call(name).copy_to_host()
        ran[name] = t[0].algo
        # FFT and Winograd round differently from direct summation.
        assert reference.rel_error(out, ref) <= 2e-5, (name, t[0].algo)
    assert len(set(ran.values())) >= 2, ran


def test_once_choices_hit_the_cache_on_repeat_shapes(rng):
    from dnnkit.cudnn import algo_cache
    algo_cache.clear()
    x, w = _inputs(rng, (4, 16, 12, 12), (16, 16, 3, 3), "float32")
    with config.change_flags({"dnn.conv.algo_fwd": "time_once"}), dnnkit.trace() as t:
        for _ in range(3):
            dnnkit.conv2d(x, w, padding=1, backend="cudnn")
    assert len({e.algo for e in t}) == 1
    st = algo_cache.stats()
    assert st["entries"] >= 1 and st.get("hits", 0) >= 2, st


def test_deterministic_flag_gives_bitwise_identical_gradients(rng):
    x, w = _inputs(rng, (8, 32, 24, 24), (32, 32, 3, 3), "float32")
    dy = rng.standard_normal((8, 32, 24, 24)).astype(np.float32)
    with config.change_flags({"dnn.deterministic": True}):
        runs = [dnnkit.conv2d_backward_filter(x, dy, w.shape, padding=1, backend=b)
                .copy_to_host() for b in ("cudnn",) * 3 + ("numba",) * 3]
        runs += [dnnkit.conv2d_backward_data(dy, w, x.shape, padding=1, backend=b)
                 .copy_to_host() for b in ("cudnn",) * 3 + ("numba",) * 3]
    for i in (0, 3, 6, 9):
        assert np.array_equal(runs[i], runs[i + 1]) and np.array_equal(runs[i], runs[i + 2])
