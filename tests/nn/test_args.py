"""Layer constructors and losses check their arguments like the ops: a TypeError (wrong kind)
or ValueError (wrong value) naming the layer, the argument and the value, never a raw
Python or NumPy error; and a rejected call leaves nothing half-made."""

import numpy as np
import pytest

from dnnkit import nn

CASES = [
    (lambda: nn.Conv2d(2, 4, 3, groups=0), ValueError, ["Conv2d", "groups", "0"]),
    (lambda: nn.Conv2d(2, 4, 3, groups=3), ValueError, ["Conv2d", "groups=3", "in_channels=2"]),
    (lambda: nn.Conv2d(2, 4, "3"), TypeError, ["Conv2d", "kernel_size", "'3'"]),
    (lambda: nn.Conv2d(2, 4, 0), ValueError, ["Conv2d", "kernel_size", "0"]),
    (lambda: nn.Conv2d(2, 4, (3, 3, 3)), TypeError, ["Conv2d", "kernel_size", "(3, 3, 3)"]),
    (lambda: nn.Conv2d(-1, 4, 3), ValueError, ["Conv2d", "in_channels", "-1"]),
    (lambda: nn.Conv2d(2, 4.0, 3), TypeError, ["Conv2d", "out_channels", "4.0"]),
    (lambda: nn.Conv2d(2, 4, 3, stride=0), ValueError, ["Conv2d", "stride", "0"]),
    (lambda: nn.Conv2d(2, 4, 3, padding=-1), ValueError, ["Conv2d", "padding", "-1"]),
    (lambda: nn.Conv2d(2, 4, 3, padding="same"), ValueError, ["Conv2d", "padding", "'same'"]),
    (lambda: nn.Conv2d(2, 4, 3, dtype="int32"), TypeError, ["Conv2d", "dtype", "int32"]),
    (lambda: nn.Conv2d(2, 4, 3, bias="yes"), TypeError, ["Conv2d", "bias", "'yes'"]),
    (lambda: nn.Conv3d(1, 1, 2, dilation=0), ValueError, ["Conv3d", "dilation", "0"]),
    (lambda: nn.Linear(-1, 3), ValueError, ["Linear", "in_features", "-1"]),
    (lambda: nn.Linear(3, None), TypeError, ["Linear", "out_features", "None"]),
    (lambda: nn.Linear(3, 2, seed=-1), ValueError, ["Linear", "seed", "-1"]),
    (lambda: nn.BatchNorm2d(-1), ValueError, ["BatchNorm2d", "num_features", "-1"]),
    (lambda: nn.BatchNorm1d(3, eps="x"), TypeError, ["BatchNorm1d", "eps", "'x'"]),
    (lambda: nn.BatchNorm1d(3, eps=0), ValueError, ["BatchNorm1d", "eps", "0"]),
    (lambda: nn.BatchNorm1d(3, momentum=1.5), ValueError, ["BatchNorm1d", "momentum", "1.5"]),
    (lambda: nn.BatchNorm3d(3, momentum=float("nan")), ValueError, ["BatchNorm3d", "momentum"]),
    (lambda: nn.ClippedReLU("a"), TypeError, ["ClippedReLU", "ceiling", "'a'"]),
    (lambda: nn.ClippedReLU(0), ValueError, ["ClippedReLU", "ceiling", "0"]),
    (lambda: nn.ELU([1]), TypeError, ["ELU", "alpha", "[1]"]),
    (lambda: nn.Dropout(None), TypeError, ["Dropout", "p", "None"]),
    (lambda: nn.Dropout(1.0), ValueError, ["Dropout", "p", "1.0"]),
    (lambda: nn.Dropout(0.5, seed="s"), TypeError, ["Dropout", "seed", "'s'"]),
    (lambda: nn.MaxPool2d(0), ValueError, ["MaxPool2d", "kernel_size", "0"]),
    (lambda: nn.MaxPool2d(2, padding=2), ValueError, ["MaxPool2d", "padding", "kernel_size"]),
    (lambda: nn.AvgPool2d(2, count_include_pad=None), TypeError, ["AvgPool2d",
                                                                   "count_include_pad"]),
    (lambda: nn.AdaptiveAvgPool2d(2), ValueError, ["AdaptiveAvgPool2d", "output_size", "2"]),
    (lambda: nn.Softmax(["channel"]), ValueError, ["Softmax", "mode", "['channel']"]),
    (lambda: nn.Embedding(0, 3), ValueError, ["Embedding", "num_embeddings", "0"]),
    (lambda: nn.Embedding(4, 3, padding_idx=4), ValueError, ["Embedding", "padding_idx", "4"]),
    (lambda: nn.SpatialTransformer(scale_height=0), ValueError, ["SpatialTransformer",
                                                                 "scale_height"]),
    (lambda: nn.LSTM(0, 3), ValueError, ["LSTM", "input_size", "0"]),
    (lambda: nn.GRU(3, 2.5), TypeError, ["GRU", "hidden_size", "2.5"]),
    (lambda: nn.LSTM(3, 3, batch_first=1), TypeError, ["LSTM", "batch_first"]),
    (lambda: nn.RNN(3, 3, nonlinearity="sigmoid"), ValueError, ["RNN", "nonlinearity"]),
    (lambda: nn.CrossEntropyLoss("avg"), ValueError, ["CrossEntropyLoss", "reduction", "'avg'"]),
    (lambda: nn.NLLLoss(ignore_index=1.5), TypeError, ["NLLLoss", "ignore_index", "1.5"]),
    (lambda: nn.MSELoss(["mean"]), ValueError, ["MSELoss", "reduction"]),
]


@pytest.mark.parametrize("make, exc, words", CASES, ids=[" ".join(map(str, c[2]))
                                                         for c in CASES])
def test_constructor_errors_name_layer_and_value(make, exc, words):
    with pytest.raises(exc) as e:
        make()
    for w in words:
        assert w in str(e.value), (w, str(e.value))


def test_setattr_checks():
    lin = nn.Linear(2, 2)
    with pytest.raises(TypeError, match="weight is a parameter"):
        lin.weight = np.zeros((2, 2))
    lin.bias = None
    assert [n for n, _ in lin.named_parameters()] == ["weight"]

    class Early(nn.Module):
        def __init__(self):
            self.w = 1          # before Module.__init__
    with pytest.raises(AttributeError, match=r"call super\(\)\.__init__\(\) first"):
        Early()
