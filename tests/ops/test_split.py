"""Splitting cuDNN calls under its 32-bit tensor limit (dnnkit/ops/split.py) on the simulator:
the piece boundaries (pure), and every split op end to end through the dispatcher with
``split.LIMIT`` lowered and cuDNN's per-piece calls replaced by float64 fakes that check each
piece's size and geometry. The real cuDNN run is tests/gpu/test_scale.py."""

import math

import numpy as np
import pytest

import dnnkit
from dnnkit import reference
from dnnkit.ops import split
from tests.ops.split_fakes import fake_cudnn


def _check_bounds(count, per, limit, align):
    b = split.bounds(count, per, limit, align)
    if per > limit:
        assert b is None
        return
    assert b[0][0] == 0 and b[-1][1] == count
    assert all(a1 == b0 for (_, a1), (b0, _) in zip(b, b[1:]))          # contiguous
    assert all((stop - start) * per <= limit for start, stop in b)
    sizes = [stop - start for start, stop in b]
    assert len(set(sizes[:-1])) <= 1 and sizes[-1] <= sizes[0]          # balanced
    most = count if per == 0 else limit // per
    if most >= align:
        most -= most % align
        assert all(start % align == 0 for start, _ in b)
    assert len(b) == max(1, -(-count // max(most, 1)))                   # the fewest


def test_bounds_cover_the_items_in_the_fewest_pieces_under_the_limit():
    for count in range(41):
        for per in (0, 1, 2, 3, 7):
            for limit, align in ((1, 1), (6, 1), (7, 4), (20, 4), (64, 1)):
                _check_bounds(count, per, limit, align)


def test_bounds_examples():
    assert split.bounds(10, 3, 9) == [(0, 3), (3, 6), (6, 9), (9, 10)]
    assert split.bounds(7, 1, 4) == [(0, 4), (4, 7)]
    assert split.bounds(1000, 1, 300, 64) == [(0, 256), (256, 512), (512, 768), (768, 1000)]
    assert split.bounds(5, 2**31 - 1) == [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)]
    assert split.bounds(3, 2**31) is None
    # 2**32 elements: three pieces of ceil(2**32 / 3) rounded up to 256 (the last shorter)
    assert split.bounds(2**32, 1, align=split.ALIGN) == \
        [(0, 1431655936), (1431655936, 2863311872), (2863311872, 2**32)]


def test_too_big_names_what_and_the_sizes():
    assert split.too_big(2**31 - 1, "x") is None
    why = split.too_big(2**31, lambda: "one image of x (1, 2**31)")
    assert "one image of x (1, 2**31) holds 2147483648 elements" in why
    assert str(2**31 - 1) in why


def _x(rng, shape, dtype="float32"):
    return rng.standard_normal(shape).astype(dtype)


def test_activation_runs_as_flat_pieces(rng, monkeypatch):
    seen = fake_cudnn(monkeypatch, limit=300)
    x, dy = _x(rng, (3, 7, 50)), _x(rng, (3, 7, 50))
    with dnnkit.trace() as t:
        y = dnnkit.activation(x, "elu", 0.5, backend="cudnn")
        assert split.last_pieces() == 5                      # 1050 = 4 x 256 + 26
        dx = dnnkit.activation_backward(x, y, dy, "elu", 0.5, backend="cudnn")
    assert t.backends() == ["cudnn", "cudnn"]
    assert seen["activation"] == ([(256,)] * 4 + [(26,)]) * 2          # forward, backward
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(y.copy_to_host(), reference.activation(x64, "elu", 0.5), rtol=1e-6)
    np.testing.assert_allclose(dx.copy_to_host(),
                               reference.activation_backward(x64, dy, "elu", 0.5), rtol=1e-6)


@pytest.mark.parametrize("shape,mode", [((10, 12), "instance"), ((5, 3, 2, 4), "channel"),
                                        ((5, 3, 2, 4), "instance")])
def test_softmax_runs_as_pieces_of_the_batch(rng, monkeypatch, shape, mode):
    per = math.prod(shape[1:])
    seen = fake_cudnn(monkeypatch, limit=2 * per + 1)
    x, dy = _x(rng, shape), _x(rng, shape)
    y = dnnkit.softmax(x, "log", mode, backend="cudnn")
    assert split.last_pieces() == -(-shape[0] // 2)
    dx = dnnkit.softmax_backward(y, dy, "log", mode, backend="cudnn").copy_to_host()
    sizes = [2] * (shape[0] // 2) + [shape[0] % 2] * (shape[0] % 2)
    assert seen["softmax"] == [(s,) + shape[1:] for s in sizes] * 2     # forward, backward
    ref = reference.softmax(x, "log", mode)
    np.testing.assert_allclose(y.copy_to_host(), ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dx, reference.softmax_backward(y.copy_to_host(), dy, "log", mode),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("nd", [2, 3])
@pytest.mark.parametrize("mode", ["max", "average_exc_pad", "sum"])
def test_pooling_runs_as_pieces_of_the_batch(rng, monkeypatch, nd, mode):
    shape = (5, 2) + (6, 5, 7)[3 - nd:]
    seen = fake_cudnn(monkeypatch, limit=2 * math.prod(shape[1:]))
    fwd, bwd = (dnnkit.pool2d, dnnkit.pool2d_backward) if nd == 2 else \
        (dnnkit.pool3d, dnnkit.pool3d_backward)
    x = _x(rng, shape)
    y = fwd(x, 3, 2, 1, mode, backend="cudnn")
    assert split.last_pieces() == 3 and [s[0] for s in seen["pool"]] == [2, 2, 1]
    dy = _x(rng, y.shape)
    dx = bwd(x, y, dy, 3, 2, 1, mode, backend="cudnn").copy_to_host()
    np.testing.assert_allclose(y.copy_to_host(), reference.pool_forward(x, 3, 2, 1, mode),
                               rtol=1e-6)
    np.testing.assert_allclose(dx, reference.pool_backward(x, dy, 3, 2, 1, mode), rtol=1e-6)


_CONV = dict(stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=2, mode="conv")
_REF = dict(stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=2, flip=True)


def test_convolution_runs_as_pieces_of_the_batch(rng, monkeypatch):
    """Five images in pieces of two: forward (+ bias), both gradients and the bias gradient;
    the gradients of w and b are the sums of the pieces' partial sums."""
    x, w, b = _x(rng, (5, 4, 6, 7)), _x(rng, (6, 2, 3, 2)), _x(rng, (6,))
    ref_y = reference.conv_forward(x, w, b, **_REF)
    seen = fake_cudnn(monkeypatch, limit=2 * max(x[0].size, ref_y[0].size))
    with dnnkit.trace() as t:
        y = dnnkit.conv2d(x, w, b, backend="cudnn", **_CONV)
        assert split.last_pieces() == 3
        dy = _x(rng, y.shape)
        dx = dnnkit.conv2d_backward_data(dy, w, x.shape, backend="cudnn", **_CONV)
        dw = dnnkit.conv2d_backward_filter(x, dy, w.shape, backend="cudnn", **_CONV)
        db = dnnkit.conv_backward_bias(dy, backend="cudnn")
    assert t.backends() == ["cudnn"] * 4 and t[0].algo == "fake"
    assert [s[0] for s in seen["conv"]] == [2, 2, 1] * 3
    np.testing.assert_allclose(y.copy_to_host(), ref_y, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(dx.copy_to_host(),
                               reference.conv_backward_data(dy, w, x.shape, **_REF), rtol=1e-5,
                               atol=1e-5)
    np.testing.assert_allclose(dw.copy_to_host(),
                               reference.conv_backward_filter(x, dy, w.shape, **_REF), rtol=1e-5,
                               atol=1e-5)
    np.testing.assert_allclose(db.copy_to_host(), reference.conv_backward_bias(dy), rtol=1e-5)


def test_3d_convolution_pieces_keep_the_5d_geometry(rng, monkeypatch):
    x, w = _x(rng, (3, 2, 3, 4, 5)), _x(rng, (2, 2, 2, 2, 2))
    seen = fake_cudnn(monkeypatch, limit=2 * 4 * 5 * 6)      # one image of y (K, OD, OH, OW)
    y = dnnkit.conv3d(x, w, padding=1, backend="cudnn").copy_to_host()
    assert seen["conv"] == [(1, 2, 3, 4, 5)] * 3
    ref = reference.conv_forward(x, w, None, stride=(1,) * 3, padding=(1,) * 3, dilation=(1,) * 3)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)


def _one_item_over(monkeypatch, rng):
    """(op, call, words its reason must hold) where one item is over the lowered limit."""
    fake_cudnn(monkeypatch, limit=20)
    x4 = _x(rng, (2, 3, 4, 4))
    return [
        ("softmax", lambda b: dnnkit.softmax(x4, mode="instance", backend=b),
         "one sample of x (2, 3, 4, 4) holds 48 elements"),
        ("pool2d", lambda b: dnnkit.pool2d(x4, 2, backend=b), "one image of x (2, 3, 4, 4)"),
        ("conv2d", lambda b: dnnkit.conv2d(x4, _x(rng, (1, 3, 1, 1)), backend=b),
         "one image of x (2, 3, 4, 4) or of y (2, 1, 4, 4) holds 48"),
        ("conv2d", lambda b: dnnkit.conv2d(_x(rng, (2, 8, 1, 1)), _x(rng, (3, 8, 1, 1)),
                                           backend=b), "w (3, 8, 1, 1) holds 24"),
        ("conv_backward_bias", lambda b: dnnkit.conv_backward_bias(x4, backend=b),
         "one image of dy (2, 3, 4, 4)"),
    ]


def test_an_item_over_the_limit_runs_on_numba_or_raises_when_forced(rng, monkeypatch):
    for op, call, words in _one_item_over(monkeypatch, rng):
        with dnnkit.trace() as t:
            call("auto")
        assert t.backends() == ["numba"] and words in t[0].reason, (op, t[0].reason)
        with pytest.raises(dnnkit.CudnnUnavailableError, match=op) as e:
            call("cudnn")
        assert words in str(e.value) and "32-bit limit of 20" in str(e.value)
