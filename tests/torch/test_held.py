"""The views dnnkit.torch keeps for parameters and batch-norm statistics (bridge.held) and the
C apply of its Functions (bridge.function).

held() runs on the GPU path only (the simulator passes NumPy views); its bookkeeping is plain
Python, so here foreign.torch_view is replaced by a recorder that returns a new object per
view made, and the tensors are CPU tensors (their addresses, shapes and strides are real)."""

import gc
import io

import pytest

torch = pytest.importorskip("torch")

from dnnkit import foreign  # noqa: E402
from dnnkit.torch import bridge  # noqa: E402
from dnnkit.torch.functions import Conv  # noqa: E402
from tests.torch.helpers import DEVICE  # noqa: E402

S, S2 = 7, 9          # two raw stream handles


@pytest.fixture
def made(monkeypatch):
    """[(tensor, stream, owned)] per view made; views are fresh objects."""
    log = []

    def torch_view(t, stream, owned=True):
        log.append((t, stream, owned))
        return object()
    monkeypatch.setattr(foreign, "torch_view", torch_view)
    return log


def test_a_parameter_is_viewed_once_per_stream_and_address(made):
    p = torch.nn.Parameter(torch.ones(4, 3))
    v = bridge.view(p, S)
    assert bridge.view(p, S) is v and bridge.held(p, S) is v
    assert [(s, o) for _, s, o in made] == [(S, False)]     # made once, not holding p
    v2 = bridge.view(p, S2)                                 # another stream: a new view
    assert v2 is not v and len(made) == 2
    p.data = torch.zeros(4, 3)                              # new memory: a new view
    v3 = bridge.view(p, S2)
    assert v3 is not v2 and len(made) == 3
    with torch.no_grad():
        p.data = p.data.reshape(3, 4)                       # same memory, new shape
    v4 = bridge.view(p, S2)
    assert v4 is not v3 and len(made) == 4
    q = torch.nn.Parameter(torch.ones(4), requires_grad=False)
    w = bridge.view(q, S)
    q.data = q.data.view(torch.int32)       # same memory, shape and strides, another dtype
    assert bridge.view(q, S) is not w and len(made) == 6


def test_plain_tensors_are_viewed_each_call_unless_held(made):
    t = torch.ones(5)
    a, b = bridge.view(t, S), bridge.view(t, S)
    assert a is not b and [o for _, _, o in made] == [True, True]
    assert bridge.held(t, S) is bridge.held(t, S)           # a buffer, held explicitly
    assert len(made) == 3


def test_a_non_contiguous_tensor_is_copied_and_not_kept(made):
    p = torch.nn.Parameter(torch.ones(3, 4).t())
    bridge.view(p, S)
    bridge.view(p, S)
    assert len(made) == 2 and all(t.is_contiguous() and o for t, _, o in made)
    assert id(p) not in bridge._HELD


def test_the_kept_view_goes_with_its_tensor(made):
    p = torch.nn.Parameter(torch.ones(2))
    bridge.view(p, S)
    i = id(p)
    assert i in bridge._HELD
    made.clear()                        # (the recorder's reference)
    del p
    gc.collect()
    assert i not in bridge._HELD


def test_a_viewed_parameter_saves_and_loads_with_weights_only(made):
    m = torch.nn.Linear(3, 2)
    bridge.view(m.weight, S)
    buf = io.BytesIO()
    torch.save(m.weight, buf)
    buf.seek(0)
    w = torch.load(buf)                 # weights_only: nothing of dnnkit's rides along
    assert torch.equal(w, m.weight.detach())


class _WithSetup(torch.autograd.Function):
    @staticmethod
    def forward(x):
        return x * 2

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, g):
        return g * 2


def test_function_takes_the_c_apply_where_the_python_one_adds_nothing():
    bridge._applies.pop(Conv, None)
    x = torch.randn(1, 2, 4, 4, dtype=torch.float64, device=DEVICE, requires_grad=True)
    w = torch.randn(3, 2, 3, 3, dtype=torch.float64, device=DEVICE, requires_grad=True)
    y = bridge.function(Conv, x, w, None, 2, (1, 1), (1, 1), (1, 1), 1, "numba")
    assert bridge._applies[Conv] is not None
    ref = torch.nn.functional.conv2d(x, w, None, 1, 1)
    assert torch.allclose(y, ref) and y.grad_fn is not None
    y.backward(torch.ones_like(y))
    gx = x.grad.clone()
    x.grad = None
    ref.backward(torch.ones_like(ref))
    assert torch.allclose(gx, x.grad)
    # a Function with setup_context (functorch-ready) keeps PyTorch's apply
    z = bridge.function(_WithSetup, torch.ones(2, requires_grad=True))
    assert bridge._applies[_WithSetup] is None and torch.equal(z.detach(), torch.full((2,), 2.))


class _OwnApply(torch.autograd.Function):
    calls = 0

    @staticmethod
    def forward(ctx, x):
        return x * 3

    @staticmethod
    def backward(ctx, g):
        return g * 3

    @classmethod
    def apply(cls, *args):
        cls.calls += 1
        return super().apply(*args)


def test_an_overridden_or_patched_apply_is_called(monkeypatch):
    x = torch.ones(2, requires_grad=True)
    bridge.function(_OwnApply, x)
    assert _OwnApply.calls == 1 and bridge._applies[_OwnApply] is None
    seen = []
    py_apply = torch.autograd.Function.apply.__func__

    def patched(cls, *args, **kw):
        seen.append(cls)
        return py_apply(cls, *args, **kw)
    monkeypatch.setattr(torch.autograd.Function, "apply", classmethod(patched))
    bridge.function(Conv, torch.randn(1, 2, 4, 4, dtype=torch.float64, device=DEVICE),
                    torch.randn(3, 2, 3, 3, dtype=torch.float64, device=DEVICE), None, 2,
                    (1, 1), (1, 1), (1, 1), 1, "numba")
    assert seen == [Conv]


def test_pytorchs_python_apply_does_what_bridge_function_repeats():
    """A canary: bridge.function stands in for torch.autograd.Function.apply's Python body
    (setup_context's default arguments, the functorch check, dead wrappers unwrapped). A
    PyTorch whose apply reads other names may do more: read it and update bridge.function."""
    code = torch.autograd.Function.apply.__func__.__code__
    assert set(code.co_names) <= {
        "_is_setup_context_defined", "setup_context", "forward", "torch", "_C",
        "_are_functorch_transforms_active", "_functorch", "utils", "unwrap_dead_wrappers",
        "super", "apply", "RuntimeError", "custom_function_call"}, code.co_names


def test_batch_norm_keeps_its_weight_beside_the_view_it_keeps_for_the_backward():
    """The scale's view may be a kept one, which does not hold the weight; saved-tensor hooks
    may hand the backward a copy instead of the weight: the Function holds it."""
    import dnnkit.torch as dt
    m = torch.nn.BatchNorm2d(3).to(DEVICE, torch.float64)
    dt.convert(m, "numba")
    x = torch.randn(2, 3, 2, 2, dtype=torch.float64, device=DEVICE, requires_grad=True)
    y = m(x)
    assert y.grad_fn.saved[3] is m.weight
    m.eval()
    y = m(x)
    assert y.grad_fn.g[1] is m.weight
