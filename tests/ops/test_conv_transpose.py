"""conv_transpose2d / conv_transpose3d: output sizes, both backends against a float64 scatter
reference written here (itself checked by hand and as the adjoint of the convolution), strides,
padding, output_padding (beyond the stride too), dilation, groups, mode; gradients wrt x, w and
bias by finite differences in float64 (the gradient rule of conv*_backward_data); the ops it
runs in trace(); help(); argument errors naming the values."""

import inspect
import itertools

import numpy as np
import pytest

import dnnkit
from dnnkit import reference
from tests.conftest import backend_params
from tests.nn.gradcheck import directional_check, weighted_sum

TOL = {"float16": 4e-3, "float32": 2e-6, "float64": 1e-12}


def _tuple(v, nd):
    return (v,) * nd if isinstance(v, int) else tuple(v)


def ref_transpose(x, w, bias=None, stride=1, padding=0, output_padding=0, dilation=1,
                  groups=1, flip=False):
    """The definition, in float64: every input position x[n, k, o] adds x * w[k, c, t] at
    o*stride + t*dilation of a buffer as long as the uncropped output; the output is that
    buffer without ``padding`` at both ends (output_padding extends the far end)."""
    nd = x.ndim - 2
    s, p, op, d = (_tuple(v, nd) for v in (stride, padding, output_padding, dilation))
    n, cin = x.shape[:2]
    cog, ks = w.shape[1], w.shape[2:]
    if flip:
        w = w[(slice(None), slice(None)) + (slice(None, None, -1),) * nd]
    full = [(i - 1) * si + di * (k - 1) + 1 + oi
            for i, k, si, di, oi in zip(x.shape[2:], ks, s, d, op)]
    buf = np.zeros((n, cog * groups, *full))
    kg = cin // groups
    for g in range(groups):
        xs, ws = x[:, g * kg:(g + 1) * kg], w[g * kg:(g + 1) * kg]
        for o in itertools.product(*(range(i) for i in x.shape[2:])):
            for t in itertools.product(*(range(k) for k in ks)):
                at = tuple(oi * si + ti * di for oi, si, ti, di in zip(o, s, t, d))
                buf[(slice(None), slice(g * cog, (g + 1) * cog)) + at] += \
                    xs[(Ellipsis,) + o] @ ws[(slice(None), slice(None)) + t]
    y = buf[(slice(None), slice(None)) + tuple(slice(pi, f - pi) for pi, f in zip(p, full))]
    if bias is not None:
        y = y + bias.reshape((1, -1) + (1,) * nd)
    return y


def test_reference_by_hand():
    # 1-D at stride 2: each input spreads the kernel [1, 2, 3] two places on, overlapping once
    x = np.array([[[[1.0, 10.0]]]])
    w = np.array([[[[1.0, 2.0, 3.0]]]])
    np.testing.assert_array_equal(ref_transpose(x, w, stride=(1, 2)),
                                  [[[[1, 2, 13, 20, 30]]]])
    np.testing.assert_array_equal(ref_transpose(x, w, stride=(1, 2), padding=(0, 1),
                                                output_padding=(0, 1)), [[[[2, 13, 20, 30]]]])
    np.testing.assert_array_equal(ref_transpose(x, w, stride=(1, 2), dilation=(1, 2),
                                                flip=True), [[[[3, 0, 32, 0, 21, 0, 10]]]])


@pytest.mark.parametrize("nd", [2, 3])
def test_reference_is_the_adjoint_of_the_convolution(rng, nd):
    """<conv(z, w), x> = <conv_transpose(x, w), z>: the transposed convolution is the
    convolution's adjoint (dnnkit.reference.conv_forward, itself checked by loops in
    tests/ops/test_conv.py). In dim 1 output_padding (1) >= stride (1): the convolution of y
    has one more position there than x, the one a zero row of x would take."""
    s, p, d, g = (2, 1, 2)[:nd], (1, 0, 2)[:nd], (1, 2, 1)[:nd], 2
    op = (1, 1, 0)[:nd]
    x = rng.standard_normal((2, 4) + (3, 2, 3)[:nd])
    w = rng.standard_normal((4, 3) + (3, 2, 2)[:nd])
    for flip in (False, True):
        y = ref_transpose(x, w, None, s, p, op, d, g, flip)
        z = rng.standard_normal(y.shape)
        cz = reference.conv_forward(z, w, None, s, p, d, g, flip)
        assert cz.shape == x.shape[:3] + (x.shape[3] + 1,) + x.shape[4:]
        cz = cz[:, :, :, :x.shape[3]]
        assert np.isclose((cz * x).sum(), (y * z).sum(), rtol=1e-12)


CASES = [  # (nd, x_shape, w_shape, stride, padding, output_padding, dilation, groups, mode)
    (2, (2, 3, 3, 2), (3, 2, 3, 3), 1, 0, 0, 1, 1, "cross"),
    (2, (1, 2, 3, 3), (2, 3, 3, 3), 2, 1, 1, 1, 1, "cross"),        # 2x upsampling
    (2, (1, 4, 2, 3), (4, 1, 2, 3), (2, 1), (0, 1), (1, 0), (1, 2), 2, "conv"),
    (2, (1, 2, 2, 2), (2, 2, 2, 2), 1, 0, (2, 1), (3, 2), 1, "cross"),  # output_padding >= stride
    (3, (1, 2, 2, 2, 1), (2, 2, 2, 1, 2), (1, 2, 1), (0, 1, 0), (0, 1, 0), 1, 1, "cross"),
    (3, (1, 2, 2, 1, 2), (2, 1, 2, 2, 1), (2, 1, 1), 0, (1, 1, 0), (1, 2, 1), 2, "conv"),
]
IDS = [f"case{i}" for i in range(len(CASES))]


def _fn(nd):
    return dnnkit.conv_transpose2d if nd == 2 else dnnkit.conv_transpose3d


def _kw(case):
    _, _, _, stride, padding, output_padding, dilation, groups, mode = case
    return dict(stride=stride, padding=padding, output_padding=output_padding,
                dilation=dilation, groups=groups, mode=mode)


def _ref(case, x, w, b):
    kw = _kw(case)
    mode = kw.pop("mode")
    return ref_transpose(x, w, b, **kw, flip=mode == "conv")


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_forward_matches_reference(rng, case, dtype, backend):
    nd, xs, ws = case[:3]
    groups = case[7]
    x = rng.standard_normal(xs).astype(dtype)
    w = rng.standard_normal(ws).astype(dtype)
    b = rng.standard_normal(ws[1] * groups).astype(dtype)
    with dnnkit.trace() as t:
        y = _fn(nd)(x, w, b, backend=backend, **_kw(case)).copy_to_host()
    ref = _ref(case, x.astype(np.float64), w.astype(np.float64), b.astype(np.float64))
    assert y.shape == ref.shape and y.dtype == np.dtype(dtype)
    assert reference.rel_error(y, ref) <= TOL[dtype]
    data_op = f"conv{nd}d_backward_data"
    assert t.backends(data_op) == [backend]
    assert t.ops()[-1] == "add" and data_op in t.ops()
    assert set(t.backends()) <= {backend, "numba"}    # reshape is a view: Numba's


@pytest.mark.parametrize("nd", [2, 3])
def test_output_size_is_pytorchs(nd):
    """(I - 1)*s - 2p + d(k - 1) + output_padding + 1 per dim: a stride-2, 3-tap, padding-1
    transposed convolution with output_padding 1 doubles the size (the decoder's upsampling)."""
    x = np.ones((1, 2) + (4, 3, 2)[:nd], np.float32)
    w = np.ones((2, 3) + (3,) * nd, np.float32)
    y = _fn(nd)(x, w, stride=2, padding=1, output_padding=1)
    assert y.shape == (1, 3) + tuple(2 * v for v in (4, 3, 2)[:nd])
    y = _fn(nd)(x, w, stride=3, padding=(0, 1, 2)[:nd], dilation=2)
    assert y.shape == (1, 3) + tuple((i - 1) * 3 - 2 * p + 2 * 2 + 1
                                     for i, p in zip((4, 3, 2), (0, 1, 2)))[:nd]


def test_no_bias_runs_only_the_data_gradient(rng):
    x = rng.standard_normal((1, 2, 2, 2))
    w = rng.standard_normal((2, 1, 2, 2))
    with dnnkit.trace() as t:
        y = dnnkit.conv_transpose2d(x, w, stride=2, backend="numba")
    assert t.ops() == ["conv2d_backward_data"]
    np.testing.assert_allclose(y.copy_to_host(), ref_transpose(x, w, stride=2), rtol=1e-12)


def test_large_output_padding_extends_x_with_zeros():
    """output_padding >= stride (dilation > stride): the convolution of y's shape has more
    positions than x; x is extended by zeros there (concatenate), never changing y's values."""
    x = np.arange(1.0, 7.0).reshape(1, 1, 2, 3)
    w = np.ones((1, 1, 2, 2))
    with dnnkit.trace() as t:
        y = dnnkit.conv_transpose2d(x, w, output_padding=(2, 1), dilation=(3, 2))
    assert t.ops() == ["concatenate", "concatenate", "conv2d_backward_data"]
    ref = ref_transpose(x, w, output_padding=(2, 1), dilation=(3, 2))
    assert y.shape == ref.shape == (1, 1, 2 - 1 + 3 + 2 + 1, 3 - 1 + 2 + 1 + 1)
    np.testing.assert_allclose(y.copy_to_host(), ref, rtol=1e-12)


def test_empty_batch_gives_an_empty_output():
    y = dnnkit.conv_transpose2d(np.ones((0, 2, 3, 3)), np.ones((2, 4, 2, 2)), np.ones(4))
    assert y.shape == (0, 4, 4, 4)


def test_arrays_in_arrays_out_tensors_in_tensors_out(rng):
    x = rng.standard_normal((1, 2, 2, 2)).astype(np.float32)
    w = rng.standard_normal((2, 2, 3, 3)).astype(np.float32)
    y = dnnkit.conv_transpose2d(x, w)
    assert not isinstance(y, dnnkit.Tensor) and dnnkit.arrays.is_device_array(y)
    yt = dnnkit.conv_transpose2d(dnnkit.tensor(x), w)
    assert isinstance(yt, dnnkit.Tensor) and not yt.requires_grad
    np.testing.assert_array_equal(yt.numpy(), y.copy_to_host())


# ---------------------------------------------------------------- gradients

GRAD_CASES = [CASES[1], CASES[2], CASES[3], CASES[5]]


@pytest.mark.parametrize("case", GRAD_CASES, ids=[f"case{CASES.index(c)}" for c in GRAD_CASES])
def test_gradients_match_finite_differences(rng, case):
    """x, w and bias Tensors in float64: backward() (the rule of conv*_backward_data, add's
    and concatenate's) against central differences along random directions."""
    nd, xs, ws = case[:3]
    x = dnnkit.tensor(rng.standard_normal(xs), requires_grad=True)
    w = dnnkit.tensor(rng.standard_normal(ws), requires_grad=True)
    b = dnnkit.tensor(rng.standard_normal(ws[1] * case[7]), requires_grad=True)
    fn, kw = _fn(nd), _kw(case)
    with dnnkit.no_grad():
        y = fn(x, w, b, **kw)
    r = rng.standard_normal(y.shape)
    directional_check(lambda: weighted_sum(fn(x, w, b, **kw), r), [x, w, b], rng,
                      directions=2)


def test_gradients_are_the_documented_ops(rng):
    """dx = conv2d(dy, w), dw = conv2d_backward_filter(dy, x, w.shape) (dy in the input's
    role, x in the output gradient's), dbias = the sum of dy per channel."""
    kw = dict(stride=2, padding=1, dilation=1, groups=2)
    x = dnnkit.tensor(rng.standard_normal((2, 4, 3, 2)), requires_grad=True)
    w = dnnkit.tensor(rng.standard_normal((4, 1, 3, 3)), requires_grad=True)
    b = dnnkit.tensor(rng.standard_normal(2), requires_grad=True)
    y = dnnkit.conv_transpose2d(x, w, b, output_padding=1, **kw)
    dy = rng.standard_normal(y.shape)
    y.backward(dnnkit.tensor(dy).data)
    np.testing.assert_allclose(x.grad.numpy(), dnnkit.conv2d(dy, w.data, **kw).copy_to_host(),
                               rtol=1e-12)
    want_w = dnnkit.conv2d_backward_filter(dy, x.data, w.shape, **kw).copy_to_host()
    np.testing.assert_allclose(w.grad.numpy(), want_w, rtol=1e-12)
    np.testing.assert_allclose(b.grad.numpy(), dy.sum(axis=(0, 2, 3)), rtol=1e-12)


def test_backward_data_is_differentiable_with_its_own_geometry(rng):
    """The rule reads the call's padding (a border mode), dilation and mode."""
    kw = dict(stride=1, padding="half", dilation=2, mode="conv")
    dy = dnnkit.tensor(rng.standard_normal((1, 2, 3, 4)), requires_grad=True)
    w = dnnkit.tensor(rng.standard_normal((2, 3, 3, 2)), requires_grad=True)
    xs = (1, 3, 3, 4)
    with dnnkit.no_grad():
        dx = dnnkit.conv2d_backward_data(dy, w, xs, **kw)
    r = rng.standard_normal(dx.shape)
    directional_check(lambda: weighted_sum(dnnkit.conv2d_backward_data(dy, w, xs, **kw), r),
                      [dy, w], rng, directions=2)


@pytest.mark.parametrize("backend", backend_params())
def test_gradients_on_each_backend_match_the_reference(rng, backend):
    """float32 gradients on one backend against the float64 formulas of the reference."""
    case = CASES[2]
    nd, xs, ws = case[:3]
    kw = _kw(case)
    x64, w64 = rng.standard_normal(xs), rng.standard_normal(ws)
    b64 = rng.standard_normal(ws[1] * case[7])
    x, w, b = (dnnkit.tensor(a.astype(np.float32), requires_grad=True) for a in (x64, w64, b64))
    y = _fn(nd)(x, w, b, backend=backend, **kw)
    dy = rng.standard_normal(y.shape)
    y.backward(dnnkit.tensor(dy.astype(np.float32)).data)
    # d<y, dy>/dx = conv(dy, w) (reference), d/dw: the filter gradient with dy as the input
    geom = (_tuple(kw["stride"], 2), _tuple(kw["padding"], 2), _tuple(kw["dilation"], 2),
            kw["groups"], kw["mode"] == "conv")
    xs64, ws64 = (a.numpy().astype(np.float64) for a in (x, w))
    assert reference.rel_error(x.grad.numpy(), reference.conv_forward(dy, ws64, None, *geom)) \
        <= 2 * TOL["float32"]
    assert reference.rel_error(w.grad.numpy(),
                               reference.conv_backward_filter(dy, xs64, ws, *geom)) \
        <= 2 * TOL["float32"]
    assert reference.rel_error(b.grad.numpy(), dy.sum(axis=(0, 2, 3))) <= 2 * TOL["float32"]


# ---------------------------------------------------------------- help and errors

@pytest.mark.parametrize("name", ["conv_transpose2d", "conv_transpose3d"])
def test_help_shows_the_real_signature(name):
    fn = getattr(dnnkit, name)
    params = inspect.signature(fn).parameters
    assert list(params)[:8] == ["x", "w", "bias", "stride", "padding", "output_padding",
                                "dilation", "groups"]
    assert params["backend"].kind is inspect.Parameter.KEYWORD_ONLY
    doc = inspect.getdoc(fn)
    assert "{" not in doc and "output_padding" in doc and '"winograd"' in doc
    assert fn is dnnkit.ops.conv_transpose2d or fn is dnnkit.ops.conv_transpose3d


X, W = np.ones((1, 4, 3, 3), np.float32), np.ones((4, 2, 3, 3), np.float32)


@pytest.mark.parametrize("kw,exc,words", [
    (dict(stride=2, output_padding=2), ValueError,
     ["conv_transpose2d", "output_padding=(2, 2)", "stride=(2, 2)", "dilation=(1, 1)"]),
    (dict(output_padding=(0, 1)), ValueError, ["output_padding=(0, 1)", "stride=(1, 1)"]),
    (dict(dilation=2, stride=1, output_padding=(1, 2)), ValueError,
     ["output_padding=(1, 2)", "dilation=(2, 2)"]),
    (dict(stride=0), ValueError, ["stride", "0"]),
    (dict(padding=-1), ValueError, ["padding", "-1"]),
    (dict(padding="half"), TypeError, ["padding", "'half'"]),
    (dict(output_padding=1.5), TypeError, ["output_padding", "1.5"]),
    (dict(groups=3), ValueError, ["groups=3", "C_in=4"]),
    (dict(groups=0), ValueError, ["groups", "0"]),
    (dict(groups=True), ValueError, ["groups", "True"]),
    (dict(mode="full"), ValueError, ["mode", "'full'"]),
    (dict(algo="small"), ValueError, ["algo", "'small'"]),
    (dict(precision="int8"), ValueError, ["precision", "'int8'"]),
    (dict(padding=3), ValueError, ["output size", "(-1, -1)", "padding (3, 3)"]),
])
def test_bad_arguments_name_the_values(kw, exc, words):
    with pytest.raises(exc) as e:
        dnnkit.conv_transpose2d(X, W, **kw)
    for word in words:
        assert word in str(e.value), (word, str(e.value))


@pytest.mark.parametrize("args,exc,words", [
    ((X, np.ones((3, 2, 3, 3), np.float32)), ValueError, ["C_in=4", "(3, 2, 3, 3)"]),
    ((X, W.astype(np.float64)), TypeError, ["float64", "float32"]),
    ((X, W, np.ones(3, np.float32)), ValueError, ["bias", "(2,)", "(3,)"]),
    ((X, W, np.ones(2, np.float64)), TypeError, ["bias", "float64", "float32"]),
    ((X, np.ones((4, 2, 0, 3), np.float32)), ValueError, ["tap", "(4, 2, 0, 3)"]),
    ((np.ones((1, 4, 0, 3), np.float32), W), ValueError, ["empty", "(1, 4, 0, 3)"]),
    ((X[0], W), ValueError, ["x", "4-D", "(4, 3, 3)"]),
    ((X.astype(np.int32), W), TypeError, ["x", "int32"]),
])
def test_bad_arrays_name_the_values(args, exc, words):
    with pytest.raises(exc) as e:
        dnnkit.conv_transpose2d(*args)
    assert "conv_transpose2d" in str(e.value)
    for word in words:
        assert word in str(e.value), (word, str(e.value))


def test_3d_checks_name_its_op():
    with pytest.raises(ValueError, match=r"conv_transpose3d: output_padding .*\(1, 1, 1\)"):
        dnnkit.conv_transpose3d(np.ones((1, 1, 2, 2, 2)), np.ones((1, 1, 2, 2, 2)),
                                output_padding=1)
    with pytest.raises(ValueError, match="conv_transpose3d: x must be 5-D"):
        dnnkit.conv_transpose3d(X, W)
