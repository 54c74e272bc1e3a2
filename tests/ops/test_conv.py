"""The public convolution ops: arguments, border modes, flags, and both backends against the
float64 reference (dnnkit.reference, itself checked by loops and finite differences here)."""

import numpy as np
import pytest

import dnnkit
from dnnkit import config, reference
from tests.conftest import backend_params

TOL = {"float16": 4e-3, "float32": 2e-6, "float64": 1e-12}


def _direct_conv2d(x, w, stride, pad, dil, groups, flip):
    """Plain loops: the definition, to check the vectorised reference."""
    n, c, h, wd = x.shape
    k, cg, r, s = w.shape
    if flip:
        w = w[:, :, ::-1, ::-1]
    xp = np.pad(x, ((0, 0), (0, 0), (pad[0], pad[0]), (pad[1], pad[1])))
    oh = (h + 2 * pad[0] - dil[0] * (r - 1) - 1) // stride[0] + 1
    ow = (wd + 2 * pad[1] - dil[1] * (s - 1) - 1) // stride[1] + 1
    y = np.zeros((n, k, oh, ow))
    kg = k // groups
    for b in range(n):
        for f in range(k):
            g = f // kg
            for i in range(oh):
                for j in range(ow):
                    for cc in range(cg):
                        for a in range(r):
                            for e in range(s):
                                y[b, f, i, j] += (xp[b, g * cg + cc, i * stride[0] + a * dil[0],
                                                     j * stride[1] + e * dil[1]] * w[f, cc, a, e])
    return y


@pytest.mark.parametrize("stride,pad,dil,groups,flip", [
    ((1, 1), (0, 0), (1, 1), 1, False), ((2, 1), (1, 2), (1, 2), 2, True),
    ((3, 3), (1, 0), (2, 1), 4, False)])
def test_reference_matches_loops(rng, stride, pad, dil, groups, flip):
    x = rng.standard_normal((2, 4, 7, 6))
    w = rng.standard_normal((4, 4 // groups, 3, 2))
    assert np.allclose(reference.conv_forward(x, w, None, stride, pad, dil, groups, flip),
                       _direct_conv2d(x, w, stride, pad, dil, groups, flip), atol=1e-12)


@pytest.mark.parametrize("nd", [2, 3])
@pytest.mark.parametrize("flip", [False, True])
def test_reference_gradients_by_finite_differences(rng, nd, flip):
    xs, ws = (2, 4) + (5, 4, 3)[:nd], (6, 2) + (3, 2, 2)[:nd]
    args = ((2, 1, 1)[:nd], (1, 0, 1)[:nd], (1, 2, 1)[:nd], 2, flip)
    x, w = rng.standard_normal(xs), rng.standard_normal(ws)
    dy = rng.standard_normal(reference.conv_forward(x, w, None, *args).shape)
    h, ex, ew = 1e-6, rng.standard_normal(xs), rng.standard_normal(ws)
    f = lambda a, b: (reference.conv_forward(a, b, None, *args) * dy).sum()  # noqa: E731
    fd_x = (f(x + h * ex, w) - f(x - h * ex, w)) / (2 * h)
    fd_w = (f(x, w + h * ew) - f(x, w - h * ew)) / (2 * h)
    assert np.isclose((reference.conv_backward_data(dy, w, xs, *args) * ex).sum(), fd_x,
                      rtol=1e-7)
    assert np.isclose((reference.conv_backward_filter(x, dy, ws, *args) * ew).sum(), fd_w,
                      rtol=1e-7)
    assert np.allclose(reference.conv_backward_bias(dy),
                       dy.sum(axis=(0,) + tuple(range(2, 2 + nd))))


CASES = [  # (nd, x_shape, w_shape, stride, padding, dilation, groups, mode)
    (2, (2, 3, 6, 5), (4, 3, 3, 3), 1, "half", 1, 1, "cross"),
    (2, (1, 4, 7, 6), (4, 2, 3, 2), (2, 1), (1, 0), (1, 2), 2, "conv"),
    (2, (2, 4, 5, 5), (4, 1, 3, 3), 3, "full", 1, 4, "cross"),      # depthwise, stride > kernel
    (2, (1, 2, 4, 6), (3, 2, 1, 1), 1, "valid", 1, 1, "cross"),     # 1x1
    (3, (1, 2, 4, 5, 3), (2, 2, 2, 3, 2), (1, 2, 1), 1, 1, 1, "conv"),
]


def _fns(nd):
    if nd == 2:
        return dnnkit.conv2d, dnnkit.conv2d_backward_data, dnnkit.conv2d_backward_filter
    return dnnkit.conv3d, dnnkit.conv3d_backward_data, dnnkit.conv3d_backward_filter


def _geom_args(nd, w_shape, stride, padding, dilation, groups):
    from dnnkit.ops.conv_args import make_geom
    g = make_geom("t", nd, (1, w_shape[1] * groups) + (64,) * nd, w_shape, stride, padding,
                  dilation, groups, "cross")
    return g.user_tuple(g.stride), g.user_tuple(g.padding), g.user_tuple(g.dilation)


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
@pytest.mark.parametrize("case", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_forward_and_gradients_match_reference(rng, case, dtype, backend):
    nd, xs, ws, stride, padding, dilation, groups, mode = case
    fwd, bwd_data, bwd_filter = _fns(nd)
    x = rng.standard_normal(xs).astype(dtype)
    w = rng.standard_normal(ws).astype(dtype)
    b = rng.standard_normal(ws[0]).astype(dtype)
    kw = dict(stride=stride, padding=padding, dilation=dilation, groups=groups, mode=mode)
    ref_args = _geom_args(nd, ws, stride, padding, dilation, groups) + (groups, mode == "conv")
    with dnnkit.trace() as t:
        y = fwd(x, w, b, backend=backend, **kw).copy_to_host()
    assert t.backends() == [backend] and t[0].algo
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    ref = reference.conv_forward(x64, w64, b.astype(np.float64), *ref_args)
    assert y.shape == ref.shape and reference.rel_error(y, ref) <= TOL[dtype]
    dy = rng.standard_normal(ref.shape).astype(dtype)
    dx = bwd_data(dy, w, xs, backend=backend, **kw).copy_to_host()
    dy64 = dy.astype(np.float64)
    assert reference.rel_error(dx, reference.conv_backward_data(dy64, w64, xs, *ref_args)) \
        <= 2 * TOL[dtype]
    dw = bwd_filter(x, dy, ws, backend=backend, **kw).copy_to_host()
    assert reference.rel_error(dw, reference.conv_backward_filter(x64, dy64, ws, *ref_args)) \
        <= 2 * TOL[dtype]
    db = dnnkit.conv_backward_bias(dy, backend=backend).copy_to_host()
    assert reference.rel_error(db, reference.conv_backward_bias(dy64)) <= 2 * TOL[dtype]


def test_border_modes_give_the_documented_output_sizes():
    x = np.ones((1, 1, 9, 8), np.float32)
    w = np.ones((1, 1, 3, 4), np.float32)
    assert dnnkit.conv2d(x, w, padding="valid").shape == (1, 1, 7, 5)
    assert dnnkit.conv2d(x, w, padding="full").shape == (1, 1, 11, 11)
    # half: p = ((k-1)d + 1) // 2, "same" for odd kernels only: (1, 2) here, then (2, 3)
    assert dnnkit.conv2d(x, w, padding="half").shape == (1, 1, 9, 9)
    assert dnnkit.conv2d(x, w, padding="half", dilation=2).shape == (1, 1, 9, 8)


@pytest.mark.parametrize("call,exc,words", [
    (lambda x, w: dnnkit.conv2d(x, w, stride=0), ValueError, ["conv2d", "stride", ">= 1"]),
    (lambda x, w: dnnkit.conv2d(x, w, padding=-1), ValueError, ["padding", ">= 0"]),
    (lambda x, w: dnnkit.conv2d(x, w, padding="same"), ValueError, ["'same'", "half"]),
    (lambda x, w: dnnkit.conv2d(x, w, stride=(1, 2, 3)), TypeError, ["stride", "(1, 2, 3)"]),
    (lambda x, w: dnnkit.conv2d(x, w, groups=3), ValueError, ["groups=3", "C=4"]),
    (lambda x, w: dnnkit.conv2d(x, w[:, :2]), ValueError, ["2 input channels", "C=4"]),
    (lambda x, w: dnnkit.conv2d(x, w[:, :, :0, :0]), ValueError,
     ["conv2d", ">= 1 tap", "(2, 4, 0, 0)"]),
    (lambda x, w: dnnkit.conv2d(x, np.ones((2, 4, 9, 3), np.float32)), ValueError,
     ["larger than the padded input", "9"]),
    (lambda x, w: dnnkit.conv2d(x, w, mode="corr"), ValueError, ["mode", "'corr'"]),
    (lambda x, w: dnnkit.conv2d(x, w, algo="fastest"), ValueError, ["algo", "fastest", "small"]),
    (lambda x, w: dnnkit.conv2d(x, w, precision="bf16"), ValueError, ["precision", "bf16"]),
    (lambda x, w: dnnkit.conv2d(x, w.astype(np.float64)), TypeError, ["w", "float64"]),
    (lambda x, w: dnnkit.conv2d(x[0], w), ValueError, ["conv2d", "4-D"]),
    (lambda x, w: dnnkit.conv3d(x, w), ValueError, ["conv3d", "5-D"]),
    (lambda x, w: dnnkit.conv2d(x, w, np.ones(3, np.float32)), ValueError, ["bias", "(2,)"]),
    (lambda x, w: dnnkit.conv2d_backward_data(np.ones((1, 2, 3, 3), np.float32), w,
                                              (1, 4, 6, 6)), ValueError, ["dy", "(1, 2, 4, 4)"]),
    (lambda x, w: dnnkit.conv2d_backward_filter(x, x, (2, 4, 3)), ValueError, ["w_shape"]),
])
def test_bad_arguments_name_op_and_values(call, exc, words):
    x = np.ones((1, 4, 6, 6), np.float32)
    w = np.ones((2, 4, 3, 3), np.float32)
    with pytest.raises(exc) as ei:
        call(x, w)
    for word in words:
        assert word in str(ei.value)


def test_conv_flags_validate_and_resolve():
    assert config.get("dnn.conv.algo_fwd") == "guess_once"
    assert config.get("dnn.conv.algo_bwd_data") == "guess_once"
    assert config.get("dnn.conv.algo_bwd_filter") == "guess_once"
    assert config.get("dnn.conv.workspace_limit") == "auto"
    config.set("dnn.conv.algo_fwd", "time_once")
    config.set("dnn.conv.workspace_limit", "1048576")
    assert config.get("dnn.conv.workspace_limit") == 2**20
    with pytest.raises(ValueError, match="algo_bwd_filter.*'large'.*deterministic"):
        config.set("dnn.conv.algo_bwd_filter", "large")
    with pytest.raises(ValueError, match="workspace_limit"):
        config.set("dnn.conv.workspace_limit", -5)
    from dnnkit.ops.conv_args import resolve_opts
    o = resolve_opts("conv2d", "fwd", np.float16, None, None)
    assert (o["algo"], o["compute_dtype"], o["workspace"]) == ("time_once", "float32", 2**20)
    assert resolve_opts("conv2d", "fwd", np.float16, "fft", "as_input")["compute_dtype"] == \
        "float16"


@pytest.mark.parametrize("backend", backend_params())
def test_empty_batch_and_no_filters(backend):
    x = np.ones((0, 4, 6, 6), np.float32)
    w = np.ones((2, 4, 3, 3), np.float32)
    assert dnnkit.conv2d(x, w, backend=backend).shape == (0, 2, 4, 4)
    x = np.ones((1, 4, 6, 6), np.float32)
    assert dnnkit.conv2d(x, w[:0], backend=backend).shape == (1, 0, 4, 4)
    dw = dnnkit.conv2d_backward_filter(x, np.ones((1, 2, 4, 4), np.float32), w.shape,
                                       backend=backend).copy_to_host()
    assert np.allclose(dw, 16.0)
    # sums over nothing are zeros, on either backend (cuDNN itself rejects empty tensors)
    x0, dy0 = np.ones((0, 4, 6, 6), np.float32), np.ones((0, 2, 4, 4), np.float32)
    dw = dnnkit.conv2d_backward_filter(x0, dy0, w.shape, backend=backend).copy_to_host()
    assert dw.shape == w.shape and not dw.any()
    dx = dnnkit.conv2d_backward_data(np.ones((1, 0, 4, 4), np.float32), w[:0], x.shape,
                                     backend=backend).copy_to_host()
    assert dx.shape == x.shape and not dx.any()
    assert dnnkit.conv2d_backward_data(dy0, w, x0.shape, backend=backend).shape == x0.shape
    db = dnnkit.conv_backward_bias(dy0, backend=backend).copy_to_host()
    assert db.shape == (2,) and not db.any()
    # an empty input padded out to a y: the sum is over padding only, y is the bias
    b = np.array([1.5, -2.0], np.float32)
    y = dnnkit.conv2d(np.ones((1, 4, 0, 3), np.float32), np.ones((2, 4, 1, 1), np.float32), b,
                      padding=(1, 0), backend=backend).copy_to_host()
    assert y.shape == (1, 2, 2, 3) and \
        np.array_equal(y, np.broadcast_to(b[None, :, None, None], y.shape))


def test_select_backend_for_conv():
    x = np.ones((1, 4, 6, 6), np.float32)
    w = np.ones((2, 4, 3, 3), np.float32)
    assert dnnkit.select_backend("conv2d", x, w, backend="numba") == "numba"
    with pytest.raises(ValueError, match="conv2d: stride"):
        dnnkit.select_backend("conv2d", x, w, stride=0)


def test_flag_values_are_exactly_the_cudnn_tables():
    """conv_args validates names without loading cuDNN; they must match cudnn/conv_algos.py's
    maps."""
    from dnnkit.cudnn import conv_algos
    from dnnkit.ops import conv_args
    tables = {"fwd": conv_algos.FWD_ALGOS, "bwd_data": conv_algos.BWD_DATA_ALGOS,
              "bwd_filter": conv_algos.BWD_FILTER_ALGOS}
    for direction, table in tables.items():
        assert set(conv_args.ALGOS[direction]) == set(table) | set(conv_algos.CHOICES)
    assert conv_args.CHOICES == conv_algos.CHOICES
