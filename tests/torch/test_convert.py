"""dnnkit.torch.convert (dnnkit/torch/convert.py): modules converted in place with the same
Parameters and buffers, the report, exclude, options dnnkit cannot honour left to PyTorch,
and convert(model, "torch") restoring PyTorch's classes. Host-only: nothing runs."""

import copy
import pickle

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import dnnkit.torch as dt  # noqa: E402
from dnnkit.torch import modules  # noqa: E402


def _model():
    return nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(inplace=True),
        nn.MaxPool2d(2), nn.Conv2d(4, 4, 3, padding="same", bias=False), nn.Sigmoid(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.5), nn.Linear(4, 3),
        nn.LogSoftmax(dim=1))


def test_convert_keeps_the_same_parameter_and_buffer_objects_and_state_dict():
    m = _model()
    params = {n: p for n, p in m.named_parameters()}
    buffers = {n: b for n, b in m.named_buffers()}
    objects = [id(x) for x in m.modules()]
    keys = list(m.state_dict())
    report = dt.convert(m, "numba")
    assert {n: id(p) for n, p in m.named_parameters()} == {n: id(p) for n, p in params.items()}
    assert {n: id(b) for n, b in m.named_buffers()} == {n: id(b) for n, b in buffers.items()}
    assert [id(x) for x in m.modules()] == objects          # the same module objects
    assert list(m.state_dict()) == keys
    paths = [p for p, _ in report.converted]
    assert paths == ["0", "1", "2", "3", "4", "5", "6", "8", "9", "10"]   # not Flatten
    assert type(m[0]) is modules.DnnConv2d and isinstance(m[0], nn.Conv2d)
    assert m[0].dnnkit_backend == "numba"
    assert dt.converted(m) == {p: "numba" for p in paths}
    assert "dnnkit=numba" in repr(m[1])


def test_convert_torch_restores_the_classes_and_drops_the_attributes():
    m = _model()
    before = [type(x) for x in m.modules()]
    dt.convert(m, "cudnn")
    report = dt.convert(m, "torch")
    assert [type(x) for x in m.modules()] == before
    assert len(report.restored) == 10 and not report.converted
    assert not any(hasattr(x, "dnnkit_backend") for x in m.modules())
    assert dt.converted(m) == {}


def test_converting_again_changes_the_backend():
    m = _model()
    dt.convert(m, "numba")
    report = dt.convert(m, "cudnn")
    assert set(dt.converted(m).values()) == {"cudnn"}
    assert len(report.converted) == 10


def test_exclude_leaves_modules_alone_and_reports_them():
    m = _model()
    report = dt.convert(m, "auto", exclude=lambda mod: isinstance(mod, nn.BatchNorm2d))
    assert type(m[1]) is nn.BatchNorm2d
    assert ("1", "excluded") in report.skipped
    assert type(m[0]) is modules.DnnConv2d


@pytest.mark.parametrize("make, words", [
    (lambda: nn.Conv2d(2, 2, 3, padding=1, padding_mode="reflect"), "padding_mode='reflect'"),
    (lambda: nn.Conv2d(2, 2, 2, padding="same"), "pads one side more"),
    (lambda: nn.ConvTranspose2d(2, 2, 3, stride=1, dilation=3, output_padding=2),
     "output_padding"),
    (lambda: nn.MaxPool2d(2, dilation=2), "dilation"),
    (lambda: nn.MaxPool2d(2, return_indices=True), "return_indices"),
    (lambda: nn.AvgPool2d(2, divisor_override=3), "divisor_override"),
    (lambda: nn.AdaptiveAvgPool2d(2), "output_size"),
    (lambda: nn.BatchNorm2d(3).half(), "float16"),
    (lambda: nn.Conv2d(2, 2, 3).to(torch.bfloat16), "bfloat16"),
    (lambda: nn.Softmax(), "dim=None"),
    (lambda: nn.Hardtanh(-1.0, 1.0), "min_val"),
    (lambda: nn.Dropout(1.0), "p=1.0"),
    (lambda: nn.LSTM(3, 4).to(torch.bfloat16), "bfloat16"),
])
def test_options_dnnkit_cannot_honour_leave_the_module_to_pytorch_with_the_reason(make, words):
    m = nn.Sequential(make())
    cls = type(m[0])
    report = dt.convert(m, "numba")
    assert type(m[0]) is cls
    assert not report.converted
    [(path, reason)] = report.skipped
    assert path == "0" and words in reason
    assert words in str(report)


def test_supported_options_convert():
    m = nn.Sequential(nn.Conv2d(2, 2, 3, padding="same"), nn.Conv3d(2, 2, 3, padding="valid"),
                      nn.ConvTranspose2d(2, 2, 3, stride=2, output_padding=1),
                      nn.AvgPool2d(3, 2, 1, ceil_mode=True, count_include_pad=False),
                      nn.MaxPool3d(2), nn.BatchNorm1d(3, affine=False, momentum=None),
                      nn.ReLU6(), nn.Hardtanh(0.0, 2.0), nn.ELU(0.5), nn.SiLU(), nn.Tanh(),
                      nn.Softmax(dim=-1), nn.LSTM(3, 4, 2, bidirectional=True),
                      nn.GRU(3, 4, batch_first=True), nn.RNN(3, 4, nonlinearity="relu"),
                      nn.LSTM(3, 4, proj_size=2), nn.GRU(3, 4, num_layers=2, dropout=0.5))
    report = dt.convert(m, "numba")
    assert not report.skipped
    assert len(report.converted) == len(m)
    assert m[0].__class__.__name__ == "DnnConv2d"
    assert modules.ORIGINAL[type(m[12])] is nn.LSTM


def test_conv1d_and_conv_transpose1d_convert_and_are_reported():
    m = nn.Sequential(nn.Conv1d(2, 4, 3, padding="same"), nn.ConvTranspose1d(4, 2, 3, stride=2),
                      nn.Conv1d(2, 2, 3, padding=1, padding_mode="circular"))
    report = dt.convert(m, "numba")
    assert report.converted == [("0", "Conv1d"), ("1", "ConvTranspose1d")]
    assert report.skipped == [("2", "padding_mode='circular'; dnnkit pads with zeros only")]
    assert "    0: Conv1d" in str(report) and isinstance(m[0], nn.Conv1d)
    dt.convert(m, "torch")
    assert type(m[0]) is nn.Conv1d and type(m[1]) is nn.ConvTranspose1d


def test_subclasses_are_not_converted():
    class MyConv(nn.Conv2d):
        def forward(self, x):
            return super().forward(x) * 2
    m = nn.Sequential(MyConv(2, 2, 3))
    report = dt.convert(m, "numba")
    assert type(m[0]) is MyConv and not report.converted and not report.skipped


def test_a_converted_model_deep_copies_and_pickles():
    m = _model()
    dt.convert(m, "numba")
    for c in (copy.deepcopy(m), pickle.loads(pickle.dumps(m))):
        assert dt.converted(c) == dt.converted(m)
        assert type(c[0]) is modules.DnnConv2d


def test_bad_arguments_raise_naming_the_value():
    with pytest.raises(ValueError, match="backend must be one of auto, cudnn, numba; got 'gpu'"):
        dt.convert(_model(), "gpu")
    with pytest.raises(TypeError, match="model must be a torch.nn.Module; got list"):
        dt.convert([nn.ReLU()], "numba")
    with pytest.raises(TypeError, match="exclude must be a callable"):
        dt.convert(_model(), "numba", exclude=3)
    with pytest.raises(TypeError, match="custom_ops must be None, True or False; got 'yes'"):
        dt.convert(_model(), "numba", custom_ops="yes")


def test_the_report_prints_every_row():
    m = nn.Sequential(nn.Conv2d(2, 2, 3), nn.Conv2d(2, 2, 3, padding_mode="circular", padding=1))
    text = str(dt.convert(m, "numba"))
    assert text.splitlines()[0] == ("dnnkit.torch.convert(backend='numba'): 1 converted, "
                                    "1 left to PyTorch")
    assert "    0: Conv2d" in text and "    1: padding_mode='circular'" in text
