"""dnnkit.ops.args and the argument checks that use it: arguments of the wrong kind -- a mode
given as a list, a shape holding a string, a size past 64 bits -- are refused by the op's own
check with a message naming the op and the value, never by a Python internal ("unhashable
type", "invalid literal for int()") or a NumPy one."""

import numpy as np
import pytest

import dnnkit
from dnnkit import config
from dnnkit.ops import args

X = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
X4 = np.ones((1, 2, 4, 4), np.float32)
W4 = np.ones((3, 2, 3, 3), np.float32)


def test_choice():
    assert args.choice("op", "mode", "max", ("max", "sum")) == "max"
    assert args.choice("op", "mode", "average", ("max",), also=("average",)) == "average"
    for bad in (["max"], {"max": 1}, None, 3, "MAX", ("max",)):
        with pytest.raises(ValueError) as ei:
            args.choice("op", "mode", bad, ("max", "sum"))
        assert str(ei.value) == f"op: mode must be one of max, sum; got {bad!r}"


def test_shape_tuple():
    assert args.shape_tuple("op", "x_shape", (1, np.int64(2), 0), 3) == (1, 2, 0)
    for bad in [(1, 2, "a"), (1, 2, 3.0), (1, True, 2), "abc", None, 5]:
        with pytest.raises(TypeError, match=r"op: x_shape must be a tuple of 3 ints; got"):
            args.shape_tuple("op", "x_shape", bad, 3)
    for bad in [(1, 2), (1, -1, 2), (1, 2, 2**63)]:
        with pytest.raises(ValueError, match="op: x_shape must be 3 sizes >= 0 and < 2\\*\\*63"):
            args.shape_tuple("op", "x_shape", bad, 3)


def test_int_tuple_refuses_sizes_past_64_bits():
    assert args.int_tuple("op", "stride", 2**63 - 1, 2, 1) == (2**63 - 1,) * 2
    with pytest.raises(ValueError, match="op: stride must be < 2\\*\\*63"):
        args.int_tuple("op", "stride", (1, 2**64), 2, 1)


@pytest.mark.parametrize("call,exc,words", [
    (lambda: dnnkit.conv2d_backward_data(np.ones((1, 3, 2, 2), np.float32), W4,
                                         (1, 2, "a", 4)), TypeError,
     ["conv2d_backward_data", "x_shape", "(1, 2, 'a', 4)"]),
    (lambda: dnnkit.conv2d_backward_filter(X4, np.ones((1, 3, 2, 2), np.float32),
                                           (3, 2, "3", 3)), TypeError,
     ["conv2d_backward_filter", "w_shape", "'3'"]),
    (lambda: dnnkit.conv3d_backward_filter(np.ones((1, 2, 3, 3, 3), np.float32),
                                           np.ones((1, 3, 1, 1, 1), np.float32), "abcde"),
     TypeError, ["conv3d_backward_filter", "w_shape", "'abcde'"]),
    (lambda: dnnkit.conv2d(X4, W4, mode=["cross"]), ValueError, ["conv2d", "mode", "['cross']"]),
    (lambda: dnnkit.conv2d(X4, W4, algo=["small"]), ValueError, ["conv2d", "algo"]),
    (lambda: dnnkit.conv2d(X4, W4, precision={"float32": 1}), ValueError,
     ["conv2d", "precision"]),
    (lambda: dnnkit.conv2d(X4, W4, stride=2**64), ValueError, ["conv2d", "stride", "2**63"]),
    (lambda: dnnkit.activation(X, ["relu"]), ValueError, ["activation", "mode", "['relu']"]),
    (lambda: dnnkit.activation_backward(X, X, X, {"relu": 1}), ValueError,
     ["activation_backward", "mode"]),
    (lambda: dnnkit.softmax(X, ["log"]), ValueError, ["softmax", "algo", "['log']"]),
    (lambda: dnnkit.softmax(X, "log", ["channel"]), ValueError, ["softmax", "mode"]),
    (lambda: dnnkit.softmax_backward(X, X, ["fast"]), ValueError, ["softmax_backward", "algo"]),
    (lambda: dnnkit.pool2d(X4, 2, mode=["max"]), ValueError, ["pool2d", "mode", "['max']"]),
    (lambda: dnnkit.pool2d_backward(X4, X4[:, :, :2, :2], X4[:, :, :2, :2], 2, mode=["sum"]),
     ValueError, ["pool2d_backward", "mode"]),
    (lambda: dnnkit.batch_norm_inference(X, *(np.ones(3, np.float32),) * 4, mode=["spatial"]),
     ValueError, ["batch_norm_inference", "mode"]),
    (lambda: dnnkit.cross_entropy(X, np.array([0, 1]), ["sum"]), ValueError,
     ["cross_entropy", "reduction"]),
    (lambda: dnnkit.ops.rnn.make_config("lstm", 2, 3, 2**64), ValueError,
     ["num_layers", "2**31"]),
    (lambda: dnnkit.reshape(X, (3, "2")), TypeError, ["reshape", "shape", "'2'"]),
    (lambda: dnnkit.reshape(X, {3: 2}), TypeError, ["reshape", "shape"]),
    (lambda: dnnkit.take_batch_backward(X[:1], (2, "3"), 0), TypeError,
     ["take_batch_backward", "x_shape"]),
    (lambda: dnnkit.sum(X, {0: 1}), TypeError, ["sum", "axis"]),
    (lambda: dnnkit.broadcast_to(X[0], {2: 3}), TypeError, ["broadcast_to", "shape"]),
    (lambda: config.set(["dnn.enabled"], "auto"), TypeError, ["flag name", "['dnn.enabled']"]),
    (lambda: config.get({"dnn": 1}), TypeError, ["flag name"]),
])
def test_arguments_of_the_wrong_kind_are_refused_by_the_op(call, exc, words):
    with pytest.raises(exc) as ei:
        call()
    msg = str(ei.value)
    assert "unhashable" not in msg and "invalid literal" not in msg, msg
    for w in words:
        assert w in msg, msg
