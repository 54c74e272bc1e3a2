"""validation/torch_parts.py's stamps: every part of a converted step is seen once per call,
the derived rows add up, and everything patched is put back (run on the simulator's CPU
tensors with a small model; the tool itself runs torch_bench's ResNet-18 on a GPU)."""

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import dnnkit.torch as dt  # noqa: E402
from dnnkit import ops  # noqa: E402
from dnnkit.torch import bridge, functions, functions_norm  # noqa: E402
from validation import torch_parts  # noqa: E402


def _model():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(2, 3, 3, padding=1, bias=False), nn.BatchNorm2d(3), nn.ReLU(),
                      nn.Flatten(), nn.Linear(3 * 4 * 4, 5))
    dt.convert(m, "numba")
    return m


def test_each_part_is_stamped_once_per_call_and_everything_is_put_back():
    before = (functions.Conv.__dict__["forward"], functions_norm.view, ops.conv2d,
              functions._CONV[2], bridge.function)
    m = _model()
    x, y = torch.randn(2, 2, 4, 4), torch.tensor([1, 3])
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    parts, plain, stamped = torch_parts.measure(torch, m, nn.CrossEntropyLoss(), opt, x, y,
                                                steps=2, warm=1)
    assert plain > 0 and stamped > 0
    calls = {k: v / 2 for k, v in parts.calls.items()}
    for name in ("Conv.forward", "Conv.backward", "BatchNormTrain.forward",
                 "BatchNormTrain.backward", "Activation.forward", "Activation.backward",
                 "Linear.forward", "Linear.backward", "op conv2d", "op batch_norm_train",
                 "op activation", "op linear"):
        assert calls.get(name) == 1, (name, calls)
    assert calls["apply"] == 4 and calls["step"] == 1
    assert calls["op conv2d_backward_filter"] == 1     # (through functions._CONV)
    assert "op conv2d_backward_data" not in calls       # x needs no gradient
    assert calls["held"] == 2                            # the running mean and variance
    rows = {name: ms for name, ms, _, _ in torch_parts.rows(parts)}
    s = parts.seconds
    assert rows["(derived) forward bodies"] == pytest.approx(
        sum(s[k] for k in s if k.endswith(".forward")) / 2 * 1e3)
    assert 0 < rows["(derived) forward bodies"] <= rows["apply"]
    assert rows["(derived) dnnkit op calls"] < rows["(derived) forward bodies"] + \
        rows["(derived) backward bodies"]
    assert "| apply |" in torch_parts.table("t", parts)
    after = (functions.Conv.__dict__["forward"], functions_norm.view, ops.conv2d,
             functions._CONV[2], bridge.function)
    assert all(a is b for a, b in zip(before, after))


def test_rows_need_a_timed_step():
    with pytest.raises(ValueError, match="no step"):
        torch_parts.rows(torch_parts.Parts())
