"""dnnkit.torch.fuse: a converted model's batch norm + (residual add +) relu in one call each,
computing what the unfused converted model computes, sharing its parameters, and leaving alone
what it cannot fuse."""

import copy

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import dnnkit.torch as dt  # noqa: E402
from tests.conftest import SIMULATOR, backend_params  # noqa: E402
from tests.torch.helpers import DEVICE, close  # noqa: E402
from tests.torch.models import BasicBlock, ResNet18  # noqa: E402

F64 = torch.float64


def _pair(model, backend):
    """(fused GraphModule of a converted model, an unfused converted copy)."""
    model = model.to(DEVICE, F64)
    plain = copy.deepcopy(model)
    dt.convert(model, backend)
    dt.convert(plain, backend)
    return dt.fuse(model), plain


def _same_step(fused, plain, x, train=True):
    """Forward and backward of both from the same x: outputs, x's and every parameter's
    gradient, and the running statistics, equal to rounding."""
    fused.train(train)
    plain.train(train)
    xa, xb = (x.clone().requires_grad_() for _ in range(2))
    ya, yb = fused(xa), plain(xb)
    close(ya, yb, 1e-12, "output")
    g = torch.randn_like(ya)
    ya.backward(g)
    yb.backward(g)
    close(xa.grad, xb.grad, 1e-12, "dx")
    for (name, a), b in zip(fused.named_parameters(), plain.parameters()):
        close(a.grad, b.grad, 1e-12, name)
    for (name, a), b in zip(fused.named_buffers(), plain.buffers()):
        close(a, b, 1e-12, name)


def _blocks():
    """A stem and two ResNet blocks, the second with a strided 1x1 shortcut (small enough
    for the simulator)."""
    return nn.Sequential(nn.Conv2d(3, 2, 3, 1, 1, bias=False), nn.BatchNorm2d(2),
                         nn.ReLU(inplace=True), BasicBlock(2, 2, 1), BasicBlock(2, 4, 2))


@pytest.mark.parametrize("backend", backend_params())
def test_resnet_blocks_fuse_every_relu_and_compute_the_same(backend):
    torch.manual_seed(0)
    fused, plain = _pair(_blocks(), backend)
    assert fused.dnnkit_fused == ("1 + relu", "3.bn1 + relu", "3.bn2 + add + relu",
                                  "4.bn1 + relu", "4.bn2 + add + relu")
    assert "relu" not in fused.code.replace("activation = 'relu'", "")
    x = torch.randn(2, 3, 4, 4, dtype=F64, device=DEVICE)
    _same_step(fused, plain, x)
    _same_step(fused, plain, x, train=False)                 # the inference batch norm


@pytest.mark.parametrize("backend", backend_params())
def test_resnet18_fuses_its_17_relus(backend):
    torch.manual_seed(0)
    fused, plain = _pair(ResNet18(width=4), backend)
    assert len(fused.dnnkit_fused) == 17                     # the stem's and every block's two
    assert sum(" + add + " in f for f in fused.dnnkit_fused) == 8
    if not SIMULATOR:           # (a ResNet-18 step takes minutes on the simulator)
        _same_step(fused, plain, torch.randn(2, 3, 8, 8, dtype=F64, device=DEVICE))


def test_the_fused_module_shares_the_models_parameters_and_state():
    torch.manual_seed(0)
    model = _blocks().to(DEVICE, F64)
    dt.convert(model, "numba")
    fused = dt.fuse(model)
    assert list(fused.state_dict()) == list(model.state_dict())
    assert all(a is b for a, b in zip(fused.parameters(), model.parameters()))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = model[0].weight.detach().clone()
    fused(torch.randn(2, 3, 4, 4, dtype=F64, device=DEVICE)).sum().backward()
    opt.step()                                   # the model's optimizer trains the fused graph
    assert not torch.equal(model[0].weight, before)


class _Tails(nn.Module):
    """One batch norm per pattern; ``forward`` returns them all."""

    def __init__(self):
        super().__init__()
        self.bns = nn.ModuleList(nn.BatchNorm2d(3) for _ in range(9))
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        b = self.bns
        return (F.relu(b[0](x)),                          # fused
                torch.relu(b[1](x)),                      # fused
                b[2](x).relu(),                           # fused
                self.relu(x + b[3](x)),                   # fused: the residual first
                F.relu(torch.add(b[4](x), x)),            # fused
                self.relu(b[5](x).add(x)),                # fused
                F.relu(torch.add(b[6](x), x, alpha=2)),   # not: alpha
                F.relu(b[7](x) * 2),                      # not: a product
                self._twice(b[8](x)))                     # not: two users

    def _twice(self, y):
        return F.relu(y) + y


@pytest.mark.parametrize("backend", backend_params())
def test_the_patterns_fused_and_those_left_alone(backend):
    torch.manual_seed(0)
    fused, plain = _pair(_Tails(), backend)
    assert [f.split(" ")[0] for f in fused.dnnkit_fused] == [f"bns.{i}" for i in range(6)]
    assert [" + add" in f for f in fused.dnnkit_fused] == [False] * 3 + [True] * 3
    x = torch.randn(2, 3, 4, 4, dtype=F64, device=DEVICE)
    fused.train()
    plain.train()
    xa, xb = (x.clone().requires_grad_() for _ in range(2))
    ya, yb = fused(xa), plain(xb)
    for i, (a, b) in enumerate(zip(ya, yb)):
        close(a, b, 1e-12, f"output {i}")
    sum((t * (k + 1)).sum() for k, t in enumerate(ya)).backward()
    sum((t * (k + 1)).sum() for k, t in enumerate(yb)).backward()
    close(xa.grad, xb.grad, 1e-12, "dx")


class _Broadcast(nn.Module):
    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm2d(3)

    def forward(self, x, z):
        return F.relu(self.bn(x) + z)


def test_a_residual_that_does_not_match_x_takes_pytorchs_add():
    torch.manual_seed(0)
    fused, plain = _pair(_Broadcast(), "numba")
    assert fused.dnnkit_fused == ("bn + add + relu",)
    x = torch.randn(2, 3, 4, 4, dtype=F64, device=DEVICE)
    for z in (torch.randn(1, 3, 1, 1, dtype=F64, device=DEVICE),    # broadcast
              torch.randn(2, 3, 4, 4, dtype=F64, device=DEVICE)):   # x's shape: fused
        _same_residual_step(fused, plain, x, z)


def _same_residual_step(fused, plain, x, z):
    za, zb = (z.clone().requires_grad_() for _ in range(2))
    ya, yb = fused(x, za), plain(x, zb)
    close(ya, yb, 1e-12, "output")
    ya.sum().backward()
    yb.sum().backward()
    close(za.grad, zb.grad, 1e-12, "dz")


def test_a_batch_norm_left_to_pytorch_is_not_fused():
    torch.manual_seed(0)
    model = nn.Sequential(nn.BatchNorm2d(3), nn.ReLU(), nn.BatchNorm2d(3), nn.ReLU()).to(F64)
    dt.convert(model, "numba", exclude=lambda m: m is model[0])
    assert dt.fuse(model).dnnkit_fused == ("2 + relu",)


class _Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm2d(3)

    def forward(self, x):
        if x.sum() > 0:             # data-dependent control flow: fx cannot trace it
            return F.relu(self.bn(x))
        return x


def test_a_model_fx_cannot_trace_raises_a_clear_error():
    model = _Branchy().to(F64)
    dt.convert(model, "numba")
    with pytest.raises(TypeError, match="torch.fx cannot trace _Branchy"):
        dt.fuse(model)


@pytest.mark.parametrize("backend", backend_params())
def test_the_batch_norm_modules_take_a_residual_and_a_relu(backend):
    torch.manual_seed(0)
    bn = nn.BatchNorm2d(3).to(DEVICE, F64)
    ref = copy.deepcopy(bn)
    dt.convert(bn, backend)
    dt.convert(ref, backend)
    x = torch.randn(2, 3, 4, 4, dtype=F64, device=DEVICE)
    z = torch.randn_like(x)
    for act in (None, "relu"):
        for train in (True, False):
            bn.train(train)
            ref.train(train)
            za, zb = (z.clone().requires_grad_() for _ in range(2))
            xa, xb = (x.clone().requires_grad_() for _ in range(2))
            ya = bn(xa, residual=za, activation=act)
            yb = ref(xb) + zb
            yb = yb if act is None else F.relu(yb)
            close(ya, yb, 1e-12, f"{act} {train}")
            g = torch.randn_like(ya)
            ya.backward(g)
            yb.backward(g)
            for a, b, what in ((za, zb, "dz"), (xa, xb, "dx"), (bn.weight, ref.weight, "dw"),
                               (bn.bias, ref.bias, "db")):
                close(a.grad, b.grad, 1e-12, f"{what} {act} {train}")
            bn.zero_grad()
            ref.zero_grad()
    with pytest.raises(ValueError, match="activation must be None or 'relu'"):
        bn(x, activation="tanh")


def test_under_the_custom_operators_the_fused_calls_take_pytorchs_add_and_relu():
    pytest.importorskip("dnnkit.torch.library")
    torch.manual_seed(0)
    model = _Broadcast().to(DEVICE, F64)
    plain = copy.deepcopy(model)
    dt.convert(model, "numba", custom_ops=True)
    dt.convert(plain, "numba", custom_ops=True)
    fused = dt.fuse(model)
    x, z = (torch.randn(2, 3, 4, 4, dtype=F64, device=DEVICE) for _ in range(2))
    _same_residual_step(fused, plain, x, z)


class _Unsafe(nn.Module):
    """Pairs whose batch-norm call cannot move down to its add: an in-place op on its input
    in between, and a second call of the same batch norm in between; and a number as the
    'residual'."""

    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm2d(3)
        self.bn2 = nn.BatchNorm2d(3)

    def forward(self, x, w):
        y = self.bn(x)
        z = x.mul_(2)                           # in place: bn must read x before it
        a = F.relu(y + z)
        b = self.bn2(x)
        c = self.bn2(w)                         # the same batch norm again
        d = F.relu(b + x)
        e = F.relu(self.bn(w) + w.size(1))      # fused; the int residual takes PyTorch's add
        return a, c, d, e


def test_pairs_the_move_could_change_are_left_and_a_number_residual_works():
    torch.manual_seed(0)
    fused, plain = _pair(_Unsafe(), "numba")
    assert fused.dnnkit_fused == ("bn + add + relu",)
    x, w = (torch.randn(2, 3, 4, 4, dtype=F64, device=DEVICE) for _ in range(2))
    for train in (True, False):
        fused.train(train)
        plain.train(train)
        ya, yb = fused(x.clone(), w.clone()), plain(x.clone(), w.clone())
        for i, (a, b) in enumerate(zip(ya, yb)):
            close(a, b, 1e-12, f"output {i} {train}")
        for (name, a), b in zip(fused.named_buffers(), plain.buffers()):
            close(a, b, 1e-12, name)


def test_hooked_modules_are_left_and_the_result_survives_deepcopy():
    torch.manual_seed(0)
    model = _blocks().to(DEVICE, F64)
    dt.convert(model, "numba")
    seen = []
    handle = model[1].register_forward_hook(lambda m, i, o: seen.append(o))
    fused = dt.fuse(model)
    assert "1 + relu" not in fused.dnnkit_fused and len(fused.dnnkit_fused) == 4
    handle.remove()
    model[3].relu.register_forward_pre_hook(lambda m, i: None)
    assert dt.fuse(model).dnnkit_fused == ("1 + relu", "4.bn1 + relu", "4.bn2 + add + relu")
    assert copy.deepcopy(fused).dnnkit_fused == fused.dnnkit_fused


class _Convs(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv1d(2, 3, 3, padding=1)
        self.c2 = nn.Conv2d(2, 3, 3, padding=1)
        self.c3 = nn.Conv3d(2, 2, 3, padding=1, bias=False)
        self.fc1, self.fc2 = nn.Linear(4, 5), nn.Linear(5, 3)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x1, x2, x3, v):
        return (F.relu(self.c1(x1)), self.relu(self.c2(x2)), self.c3(x3).relu(),
                self.fc2(torch.relu(self.fc1(v))))


@pytest.mark.parametrize("backend", backend_params())
def test_convolutions_and_linear_layers_fuse_their_relu(backend):
    torch.manual_seed(0)
    fused, plain = _pair(_Convs(), backend)
    assert fused.dnnkit_fused == ("c1 + relu", "c2 + relu", "c3 + relu", "fc1 + relu")
    shapes = ((2, 2, 5), (2, 2, 4, 4), (1, 2, 3, 3, 3), (2, 3, 4))
    xs = [torch.randn(sh, dtype=F64, device=DEVICE) for sh in shapes]
    xa, xb = ([x.clone().requires_grad_() for x in xs] for _ in range(2))
    ya, yb = fused(*xa), plain(*xb)
    for i, (a, b) in enumerate(zip(ya, yb)):
        close(a, b, 1e-12, f"output {i}")
    sum((t * (k + 1)).sum() for k, t in enumerate(ya)).backward()
    sum((t * (k + 1)).sum() for k, t in enumerate(yb)).backward()
    for i, (a, b) in enumerate(zip(xa, xb)):
        close(a.grad, b.grad, 1e-12, f"dx {i}")
    for (name, a), b in zip(fused.named_parameters(), plain.parameters()):
        close(a.grad, b.grad, 1e-12, name)
    with pytest.raises(ValueError, match="activation must be None or 'relu'"):
        fused.c2(xs[1], activation="gelu")


class _Writes(nn.Module):
    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm2d(3)

    def forward(self, x, z):
        y = self.bn(x)
        torch.mul(x, 2, out=x)                  # writes the batch norm's input (out=)
        torch.ops.aten.relu_.default(z)         # an ATen in-place overload
        return F.relu(y + z)


def test_writes_through_out_and_aten_overloads_keep_a_pair_apart():
    fused, _ = _pair(_Writes(), "numba")
    assert fused.dnnkit_fused == ()
