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
