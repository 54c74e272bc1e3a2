"""dnnkit.torch.compare (dnnkit/torch/compare.py): the judgement on host arrays (tolerances,
order of search, shapes, NaN), and whole comparisons of small models -- matching, and a
deliberately perturbed dnnkit layer found and named."""

import importlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import dnnkit.torch as dt  # noqa: E402
from dnnkit.torch import modules  # noqa: E402

# the module (the package's attribute `compare` is the function)
cmp = importlib.import_module("dnnkit.torch.compare")
from tests.torch.helpers import DEVICE  # noqa: E402


def test_differs_scales_the_tolerance_by_the_references_largest_value():
    r = np.array([1e-6, -2e-6, 4e-6])
    assert cmp.differs(r, r * (1 + 1e-4), 1e-3, 0.0) is None
    worst, index, scale, allowed = cmp.differs(r, r + [0, 0, 1e-8], 1e-3, 0.0)
    assert index == (2,) and scale == 4e-6 and np.isclose(worst, 1e-8)
    assert np.isclose(allowed, 4e-9)
    assert cmp.differs(np.zeros(3), np.full(3, 1e-10), 1e-3, 1e-9) is None   # atol for zeros


def test_differs_on_shapes_and_nans():
    assert cmp.differs(np.zeros((2, 3)), np.zeros((3, 2)), 1e-3, 0)[0] == np.inf
    nan = np.array([1.0, np.nan])
    assert cmp.differs(nan, nan.copy(), 1e-3, 0) is None      # NaN where the reference has it
    worst, index, _, _ = cmp.differs(np.array([1.0, 2.0]), nan, 1e-3, 0)
    assert worst == np.inf and index == (1,)


def _record(out=(), grad=(), param=()):
    return {"output": list(out), "input gradient": list(grad), "parameter gradient": list(param)}


def test_first_difference_searches_outputs_then_input_gradients_then_parameters():
    a, b = np.ones(4, np.float32), np.ones(4, np.float32) * 1.1
    ref = _record([("0", a), ("1", a)], [("1[0]", a), ("0[0]", a)], [("0.weight", a)])
    assert cmp.first_difference("numba", ref, ref) is None
    got = _record([("0", a), ("1", b)], [("1[0]", b), ("0[0]", a)], [("0.weight", b)])
    d = cmp.first_difference("numba", ref, got)
    assert (d.path, d.kind) == ("1", "output")
    assert np.isclose(d.max_abs, 0.1) and np.isclose(d.relative, 0.1)
    got = _record([("0", a), ("1", a)], [("1[0]", a), ("0[0]", b)], [("0.weight", b)])
    d = cmp.first_difference("cudnn", ref, got)
    assert (d.backend, d.path, d.kind) == ("cudnn", "0[0]", "input gradient")
    assert "cudnn: input gradient of 0[0] differs: max |difference| 0.1" in str(d)
    got = _record([("0", a), ("1", a)], [("1[0]", a), ("0[0]", a)], [("0.weight", b)])
    assert cmp.first_difference("numba", ref, got).path == "0.weight"
    got = _record([("0", a)], [], [])
    d = cmp.first_difference("numba", ref, got)
    assert (d.path, d.max_abs) == ("1", np.inf)          # missing counts as different


def test_tolerances_per_dtype_and_overrides():
    assert cmp.tolerance(np.float32) == (1e-3, 1e-9)
    assert cmp.tolerance(np.float16) == (1e-2, 1e-6)
    assert cmp.tolerance(np.float64, rtol=1e-5) == (1e-5, 1e-12)
    a = np.ones(2, np.float32)
    ref, got = _record([("x", a)]), _record([("x", a * 1.002)])
    assert cmp.first_difference("numba", ref, got) is not None
    assert cmp.first_difference("numba", ref, got, rtol=1e-2) is None


def _net():
    return nn.Sequential(nn.Conv2d(2, 3, 3, padding=1), nn.BatchNorm2d(3), nn.ReLU(inplace=True),
                         nn.MaxPool2d(2), nn.Flatten(), nn.Dropout(0.5), nn.Linear(12, 2))


def _inputs():
    return torch.randn(2, 2, 4, 4, generator=torch.Generator().manual_seed(0),
                       dtype=torch.float64).to(DEVICE)


def test_compare_a_model_that_matches():
    torch.manual_seed(0)
    m = _net().double().to(DEVICE)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    c = dt.compare(m, _inputs(), backends=("numba",))
    assert c.ok and c.differences == {"numba": None}
    # outputs (8 modules incl. the model), input gradients, parameter gradients
    assert c.checked["numba"] > 15
    assert "numba: " in str(c) and "tensors match PyTorch" in str(c)
    assert c.raise_if_different() is c
    for k, v in m.state_dict().items():       # the model itself did not run
        assert torch.equal(v, before[k]), k
    assert not dt.converted(m)


def test_compare_names_a_perturbed_layer(monkeypatch):
    plain = modules.DnnReLU.forward

    def perturbed(self, x):
        return plain(self, x) + 1e-2
    monkeypatch.setattr(modules.DnnReLU, "forward", perturbed)
    torch.manual_seed(0)
    m = _net().double().to(DEVICE)
    loss = lambda out: (out ** 2).sum()       # noqa: E731
    c = dt.compare(m, _inputs(), loss_fn=loss, backends=("numba",))
    d = c.differences["numba"]
    assert not c.ok and (d.path, d.kind) == ("2", "output")
    assert np.isclose(d.max_abs, 1e-2, rtol=1e-6)
    with pytest.raises(AssertionError, match="output of 2 differs"):
        c.raise_if_different()
    with pytest.raises(cmp.ComparisonError):
        dt.compare(m, _inputs(), loss_fn=loss, backends=("numba",), check=True)
    # the perturbed layer kept PyTorch's: nothing differs
    assert dt.compare(m, _inputs(), loss_fn=loss, backends=("numba",),
                      exclude=lambda mod: isinstance(mod, nn.ReLU)).ok


def test_compare_finds_a_gradient_only_difference(monkeypatch):
    """A backward that is wrong while the forward is right: named by its input gradient."""
    from dnnkit.torch import functions_norm
    plain = functions_norm.Activation.backward

    def bad(ctx, dy):
        dx, *rest = plain(ctx, dy)
        return (dx * 1.5, *rest)
    monkeypatch.setattr(functions_norm.Activation, "backward", staticmethod(bad))
    torch.manual_seed(0)
    c = dt.compare(_net().double().to(DEVICE), _inputs(), backends=("numba",))
    d = c.differences["numba"]
    assert (d.path, d.kind) == ("2[0]", "input gradient")


def test_compare_bad_arguments():
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        dt.compare(lambda x: x, _inputs())
    with pytest.raises(ValueError, match="backends must be among numba, cudnn, auto; got 'gpu'"):
        dt.compare(_net(), _inputs(), backends=("gpu",))
