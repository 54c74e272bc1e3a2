"""What a forward keeps for its backward (dnnkit/torch/bridge.py keep/kept): the backward runs
on the forward's views and lets go of them, as PyTorch lets go of saved tensors, and a graph
kept for a second backward (retain_graph) views its tensors again, to the same gradients."""

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import dnnkit.torch as dt  # noqa: E402
from tests.conftest import backend_params  # noqa: E402
from tests.torch.helpers import DEVICE, close  # noqa: E402

F64 = torch.float64

LAYERS = [
    lambda: nn.Conv2d(2, 3, 3, padding=1),
    lambda: nn.ConvTranspose2d(2, 3, 3, stride=2, padding=1, output_padding=1),
    lambda: nn.MaxPool2d(2),
    lambda: nn.BatchNorm2d(2),
    lambda: nn.ReLU(),
    lambda: nn.Tanh(),
]


def _nodes(y):
    """The dnnkit nodes of y's graph (the autograd.Functions' contexts)."""
    seen, todo, out = set(), [y.grad_fn], []
    while todo:
        n = todo.pop()
        if n is None or id(n) in seen:
            continue
        seen.add(id(n))
        if hasattr(n, "dnnkit_views"):
            out.append(n)
        todo.extend(f for f, _ in n.next_functions)
    return out


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("make", LAYERS, ids=["conv", "conv_t", "maxpool", "bn", "relu", "tanh"])
def test_a_backward_lets_go_of_the_forwards_views_and_a_second_one_views_again(make, backend):
    torch.manual_seed(0)
    m = make().to(DEVICE, F64)
    dt.convert(m, backend)
    x = torch.randn(2, 2, 4, 4, dtype=F64, device=DEVICE, requires_grad=True)
    y = m(x)
    nodes = _nodes(y)
    assert len(nodes) == 1 and nodes[0].dnnkit_views is not None
    g = torch.randn_like(y)
    y.backward(g, retain_graph=True)
    assert nodes[0].dnnkit_views is None          # the views went with the backward
    first = [x.grad.clone()] + [p.grad.clone() for p in m.parameters()]
    for t in [x, *m.parameters()]:
        t.grad = None
    y.backward(g)                                 # the retained graph: views made again
    second = [x.grad] + [p.grad for p in m.parameters()]
    for a, b in zip(first, second):
        close(b, a, 0, "the second backward's gradient")


def _conv_pair(backend):
    torch.manual_seed(1)
    ref = nn.Conv2d(2, 3, 3, padding=1).to(DEVICE, F64)
    m = _copy(ref)
    dt.convert(m, backend)
    return ref, m


def _copy(module):
    import copy
    return copy.deepcopy(module)


@pytest.mark.parametrize("backend", backend_params())
def test_a_weight_whose_storage_was_swapped_after_the_forward_is_viewed_again(backend):
    """FSDP frees and re-allocates a parameter's storage between forward and backward: the
    backward must read the weight's current memory, not the forward's view of the old one."""
    ref, m = _conv_pair(backend)
    x = torch.randn(1, 2, 4, 4, dtype=F64, device=DEVICE, requires_grad=True)
    xr = x.detach().clone().requires_grad_()
    y, yr = m(x), ref(xr)
    old = m.weight.data
    m.weight.data = old.clone()        # the same values in new memory
    old.zero_()                        # the old memory no longer holds the weight
    g = torch.randn_like(y)
    y.backward(g)
    yr.backward(g)
    close(x.grad, xr.grad, 1e-9, "dx after the weight's storage moved")


@pytest.mark.parametrize("backend", backend_params())
def test_nothing_is_kept_under_saved_tensor_hooks_and_non_contiguous_inputs_are_not(backend):
    ref, m = _conv_pair(backend)
    x = torch.randn(1, 2, 4, 4, dtype=F64, device=DEVICE, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
        y = m(x)
    assert _nodes(y)[0].dnnkit_views is None        # the hooks decide what is saved
    y.sum().backward()
    xr = x.detach().clone().requires_grad_()
    ref(xr).sum().backward()
    close(x.grad, xr.grad, 1e-9, "dx under saved-tensor hooks")
    xt = torch.randn(1, 2, 4, 4, dtype=F64, device=DEVICE).transpose(2, 3).requires_grad_()
    y = m(xt)                       # viewed through a contiguous copy
    views = _nodes(y)[0].dnnkit_views[1]
    assert views[0] is None and views[1] is not None    # the copy is not kept; the weight is
    y.sum().backward()
    xr = xt.detach().clone().requires_grad_()
    ref(xr).sum().backward()
    close(xt.grad, xr.grad, 1e-9, "dx of a non-contiguous input")
