"""dnnkit.torch's custom operators (dnnkit/torch/library.py, library_norm.py): the fake
kernels' shapes against PyTorch's own ops on meta tensors; the operators run eagerly through
converted modules (CPU tensors on Numba's CUDA simulator, CUDA ones on a GPU) against PyTorch;
torch.compile of converted models with fullgraph=True (no graph break), on real tensors and on
meta tensors (fake kernels only); opcheck; on a GPU, a compiled converted ResNet-18 gives the
uncompiled one's loss and gradients under aot_eager and inductor."""

import copy

import pytest

torch = pytest.importorskip("torch")
if not hasattr(torch.library, "custom_op"):
    pytest.skip("torch.library.custom_op needs PyTorch >= 2.4", allow_module_level=True)
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

import dnnkit.torch as dt  # noqa: E402
from dnnkit.torch import library as L, library_norm as N  # noqa: E402
from tests.conftest import backend_params  # noqa: E402
from tests.torch.helpers import (DEVICE, check_half_dropout, check_module, close,  # noqa: E402
                                 weighted_sum)
from tests.torch.models import ResNet18  # noqa: E402

F64 = torch.float64


def rand(*shape, scale=1.0):
    g = torch.Generator().manual_seed(sum(shape) + 3 * len(shape))
    return torch.randn(shape, generator=g, dtype=F64) * scale


def meta(*shape, dtype=torch.float32):
    return torch.empty(shape, device="meta", dtype=dtype)


# ---------------------------------------------------------------- fake kernels vs PyTorch

CONV = [  # x, w, stride, padding, dilation, groups
    ((2, 4, 7, 9), (6, 2, 3, 2), (1, 1), (0, 0), (1, 1), 2),
    ((1, 3, 8, 8), (5, 3, 3, 3), (2, 3), (1, 2), (2, 1), 1),
    ((1, 2, 5, 6), (4, 1, 1, 1), (3, 2), (0, 0), (1, 1), 2),
    ((3, 6, 11, 4), (6, 1, 5, 2), (2, 1), (2, 1), (2, 3), 6),
    ((1, 2, 5, 6, 7), (4, 2, 3, 3, 2), (1, 2, 1), (1, 0, 1), (1, 1, 2), 1),
    ((2, 4, 4, 5, 6), (4, 1, 2, 2, 2), (2, 2, 2), (1, 1, 1), (1, 2, 1), 4),
]


@pytest.mark.parametrize("xs, ws, stride, padding, dilation, groups", CONV)
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64])
def test_conv_fake_shapes_match_pytorch(xs, ws, stride, padding, dilation, groups, dtype):
    x, w, b = meta(*xs, dtype=dtype), meta(*ws, dtype=dtype), meta(ws[0], dtype=dtype)
    fn = F.conv2d if len(xs) == 4 else F.conv3d
    want = fn(x, w, b, stride, padding, dilation, groups)
    y = L.conv(x, w, b, stride, padding, dilation, groups, "auto")
    assert (y.shape, y.dtype, y.device) == (want.shape, want.dtype, want.device)
    assert y.is_contiguous()
    assert L.conv_backward_data(y, w, xs, stride, padding, dilation, groups, "auto").shape == xs
    assert L.conv_backward_filter(x, y, ws, stride, padding, dilation, groups,
                                  "auto").shape == ws
    assert L.conv_backward_bias(y, "auto").shape == (ws[0],)


TRANSPOSE = [  # x, w (C_in, C_out/g, k...), stride, padding, output_padding, dilation, groups
    ((1, 2, 3, 3), (2, 3, 3, 3), (2, 2), (1, 1), (1, 0), (1, 1), 1),
    ((2, 4, 5, 4), (4, 2, 2, 3), (3, 1), (0, 1), (2, 0), (1, 2), 2),
    ((1, 2, 2, 2, 3), (2, 1, 2, 2, 2), (2, 2, 2), (0, 0, 1), (0, 1, 1), (1, 1, 1), 1),
]


@pytest.mark.parametrize("xs, ws, stride, padding, out_pad, dilation, groups", TRANSPOSE)
def test_conv_transpose_fake_shapes_match_pytorch(xs, ws, stride, padding, out_pad, dilation,
                                                  groups):
    x, w = meta(*xs), meta(*ws)
    fn = F.conv_transpose2d if len(xs) == 4 else F.conv_transpose3d
    want = fn(x, w, None, stride, padding, out_pad, groups, dilation)
    y = L.conv_transpose(x, w, None, stride, padding, out_pad, dilation, groups, "auto")
    assert (y.shape, y.dtype) == (want.shape, want.dtype)


POOL = [  # x, window, stride, padding, ceil_mode
    ((1, 2, 7, 7), (3, 3), (2, 2), (1, 1), False),
    ((1, 2, 7, 7), (3, 3), (2, 2), (1, 1), True),
    ((2, 3, 6, 9), (2, 3), (2, 3), (0, 1), True),
    ((1, 1, 5, 8), (2, 2), (1, 3), (1, 0), False),
    ((1, 2, 5, 6, 7), (2, 3, 2), (2, 2, 3), (1, 1, 0), True),
    ((1, 2, 4, 4, 4), (2, 2, 2), (2, 2, 2), (0, 0, 0), False),
]


@pytest.mark.parametrize("xs, window, stride, padding, ceil", POOL)
def test_pool_fake_shapes_match_pytorch(xs, window, stride, padding, ceil):
    x = meta(*xs)
    mx = F.max_pool2d if len(xs) == 4 else F.max_pool3d
    av = F.avg_pool2d if len(xs) == 4 else F.avg_pool3d
    for mode, fn in (("max", mx), ("average_exc_pad", av)):
        want = fn(x, window, stride, padding, ceil_mode=ceil)
        assert L.pool(x, window, stride, padding, mode, ceil, "auto").shape == want.shape
    y = L.pool(x, (), (), (), "average_inc_pad", False, "auto")       # global
    assert y.shape == (xs[0], xs[1]) + (1,) * (len(xs) - 2)
    assert L.pool_backward(x, y, y, (), (), (), "max", False, "auto").shape == xs


def test_linear_softmax_activation_dropout_and_batch_norm_fake_shapes():
    x, w = meta(2, 5, 3), meta(4, 3)
    assert L.linear(x, w, meta(4), "auto").shape == F.linear(x, w).shape == (2, 5, 4)
    assert L.matmul(meta(5, 3), meta(5, 4), True, False, "auto").shape == (3, 4)
    assert L.matmul(meta(5, 3), meta(4, 3), False, True, "auto").shape == (5, 4)
    for dim in (0, 1, -1):
        assert N.softmax(x, dim, True, "auto").shape == x.shape
    assert N.activation(x, "elu", 1.0, "auto").shape == x.shape
    assert N.dropout(x, N.draw_seed(), 0.3, "auto").shape == x.shape
    for dtype, stat in ((torch.float16, torch.float32), (torch.float64, torch.float64)):
        xb = meta(4, 3, 2, 2, dtype=dtype)
        rm, rv = meta(3, dtype=stat), meta(3, dtype=stat)
        y, mean, invstd, nrm, nrv = N.batch_norm_train(xb, rm, rm, rm, rv, 1e-5, 0.1, "auto")
        assert (y.shape, y.dtype) == (xb.shape, dtype)
        assert [(t.shape, t.dtype) for t in (mean, invstd, nrm, nrv)] == [((3,), stat)] * 4
        assert N.batch_norm_eval(xb, None, None, rm, rv, 1e-5, "auto").shape == xb.shape
        grads = N.batch_norm_eval_backward(xb, xb, None, rm, rv, 1e-5, [True, False, True],
                                           "auto")
        assert [tuple(g.shape) for g in grads] == [xb.shape, (0,), (3,)]


def test_fake_kernels_check_the_arguments_as_the_ops_do():
    with pytest.raises(ValueError, match="conv2d: the dilated kernel"):
        L.conv(meta(1, 1, 3, 3), meta(1, 1, 5, 5), None, (1, 1), (0, 0), (1, 1), 1, "auto")
    with pytest.raises(ValueError, match="groups=2 must divide"):
        L.conv(meta(1, 3, 3, 3), meta(2, 1, 1, 1), None, (1, 1), (0, 0), (1, 1), 2, "auto")
    with pytest.raises(ValueError, match=r"4-D \(N, C, H, W\) or 5-D"):
        L.conv(meta(1, 3, 3), meta(2, 3, 1), None, (1,), (0,), (1,), 1, "auto")
    with pytest.raises(ValueError, match="output_padding"):
        L.conv_transpose(meta(1, 2, 3, 3), meta(2, 2, 3, 3), None, (1, 1), (0, 0), (1, 0),
                         (1, 1), 1, "auto")
    with pytest.raises(ValueError, match="pool2d: padding"):
        L.pool(meta(1, 1, 4, 4), (2, 2), (2, 2), (2, 0), "max", False, "auto")
    with pytest.raises(ValueError, match="dim 3 is out of range"):
        N.softmax(meta(2, 3), 3, False, "auto")
    with pytest.raises(ValueError, match="do not match"):
        L.linear(meta(2, 3), meta(4, 5), None, "auto")


# ---------------------------------------------------------------- the operators, eagerly

MODULES = [
    (lambda: nn.Conv2d(4, 4, 3, stride=2, padding=1, groups=2), (2, 4, 5, 5), True),
    (lambda: nn.Conv3d(2, 2, 2, bias=False), (1, 2, 3, 3, 3), True),
    (lambda: nn.ConvTranspose2d(2, 3, 3, stride=2, padding=1, output_padding=1), (1, 2, 3, 3),
     True),
    (lambda: nn.Conv1d(2, 4, 3, padding=2, dilation=2, groups=2), (2, 2, 6), True),
    (lambda: nn.ConvTranspose1d(2, 2, 2, stride=2), (1, 2, 3), True),
    (lambda: nn.MaxPool2d(3, 2, 1, ceil_mode=True), (1, 2, 6, 6), True),
    (lambda: nn.AvgPool3d(2, count_include_pad=False, padding=1), (1, 1, 3, 2, 2), True),
    (lambda: nn.AdaptiveAvgPool2d(1), (2, 3, 3, 3), True),
    (lambda: nn.BatchNorm2d(3), (2, 3, 2, 2), True),
    (lambda: nn.BatchNorm1d(3, affine=False), (4, 3), True),
    (lambda: nn.BatchNorm2d(3), (2, 3, 2, 2), False),
    (lambda: nn.LogSoftmax(1), (2, 5, 2), True),
    (lambda: nn.Softmax(-1), (2, 3, 4), True),
    (lambda: nn.Sequential(nn.Linear(5, 4), nn.ELU(0.7)), (2, 3, 5), True),
    (nn.Tanh, (3, 4), True),
]


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("make, shape, train", MODULES, ids=[f"m{i}" for i in range(len(MODULES))])
def test_converted_modules_on_the_custom_operators_match_pytorch(make, shape, train, backend):
    check_module(make, rand(*shape), backend, steps=2, train=train, custom_ops=True)


@pytest.mark.parametrize("backend", backend_params())
def test_dropout_operator_is_a_function_of_its_seed_and_its_gradient_reuses_the_mask(backend):
    x = (rand(4, 8).abs() + 0.5).to(DEVICE).requires_grad_()
    seed = torch.tensor(12345)
    y = N.dropout(x, seed, 0.5, backend)
    check_half_dropout(y, N.dropout(x, seed.clone(), 0.5, backend), x, rand(4, 8).to(DEVICE))
    with pytest.raises(TypeError, match="seed must be a CPU int64 tensor"):
        N.dropout(x, torch.tensor(1.5), 0.5, backend)


def test_custom_ops_none_uses_the_functions_in_eager_mode():
    m = nn.Conv2d(2, 2, 3).to(DEVICE, F64)
    dt.convert(m, "numba")
    y = m(rand(1, 2, 3, 3).to(DEVICE).requires_grad_())
    assert type(y.grad_fn).__name__ == "ConvBackward"          # the autograd.Function
    dt.convert(m, "numba", custom_ops=True)
    y = m(rand(1, 2, 3, 3).to(DEVICE).requires_grad_())
    assert "dnnkit_conv" in type(y.grad_fn).__name__           # the custom operator's


# ---------------------------------------------------------------- torch.compile

def _recording():
    """A torch.compile backend that keeps every graph Dynamo hands it and runs it as is."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward
    return graphs, backend


def _dnnkit_ops(graphs):
    return {str(n.target).split(".")[1] for g in graphs for n in g.graph.nodes
            if n.op == "call_function" and str(n.target).startswith("dnnkit.")}


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.seq = nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                                 nn.MaxPool2d(2), nn.ConvTranspose2d(4, 2, 2, stride=2),
                                 nn.Sigmoid(), nn.AvgPool2d(2), nn.AdaptiveAvgPool2d(1))
        self.conv1d = nn.Conv1d(2, 2, 3, padding=1)
        self.fc = nn.Linear(2, 3)

    def forward(self, x):
        h = self.seq(x).flatten(2)                          # (N, 2, 1)
        h = self.conv1d(h.expand(-1, -1, 3)).mean(-1)       # (N, 2)
        return F.log_softmax(self.fc(h), 1) + nn.functional.silu(self.fc(h))


@pytest.mark.parametrize("compiler", ["eager", "aot_eager"])
def test_compiled_converted_model_has_no_graph_break_and_matches(compiler):
    torch.manual_seed(0)
    ref = _Net().to(DEVICE, F64)
    eager, compiled = copy.deepcopy(ref), copy.deepcopy(ref)
    dt.convert(eager, "numba")
    dt.convert(compiled, "numba")
    x = rand(2, 2, 4, 4).to(DEVICE)
    graphs, record = _recording()
    run = torch.compile(compiled, backend=record if compiler == "eager" else compiler,
                        fullgraph=True)
    for _ in range(2):                                    # the running statistics move twice
        outs = []
        for model in (run, eager, ref):
            xi = x.clone().requires_grad_()
            y = model(xi)
            weighted_sum(y).backward()
            outs.append((y, xi.grad))
        for (y, dx), what in zip(outs[1:], ("uncompiled converted", "PyTorch")):
            close(outs[0][0], y, 1e-9, f"output vs {what}")
            close(outs[0][1], dx, 1e-9, f"input gradient vs {what}")
    for (n, p), (_, q) in zip(compiled.named_parameters(), ref.named_parameters()):
        close(p.grad, q.grad, 1e-9, f"gradient of {n}")
    for (n, b), (_, c) in zip(compiled.named_buffers(), ref.named_buffers()):
        close(b, c, 1e-9, f"buffer {n}")
    if compiler == "eager":
        assert len(graphs) == 1
        assert {"conv", "batch_norm_train", "activation", "pool", "conv_transpose",
                "linear"} <= _dnnkit_ops(graphs)


@pytest.mark.slow
def test_inductor_compiles_a_converted_model_around_the_operators():
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Conv2d(2, 3, 3, padding=1), nn.BatchNorm2d(3), nn.ReLU(),
                        nn.MaxPool2d(2), nn.Flatten(), nn.Linear(12, 2)).to(DEVICE, F64)
    m = copy.deepcopy(ref)
    dt.convert(m, "numba")
    torch._dynamo.reset()
    run = torch.compile(m, fullgraph=True)                 # the default backend, Inductor
    x = rand(2, 2, 4, 4).to(DEVICE)
    y, yr = run(x), ref(x)
    close(y, yr, 1e-9, "output")
    y.square().sum().backward()
    yr.square().sum().backward()
    for (n, p), (_, q) in zip(m.named_parameters(), ref.named_parameters()):
        close(p.grad, q.grad, 1e-9, f"gradient of {n}")
    close(m[1].running_var, ref[1].running_var, 1e-12, "running variance")


def test_explain_counts_no_graph_break_on_the_covered_layers():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3), nn.ReLU6(), nn.Dropout(0.3),
                      nn.Flatten(), nn.Linear(3, 2), nn.Softmax(1)).to(DEVICE, F64)
    dt.convert(m, "numba")
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(m)(rand(2, 2, 3, 3).to(DEVICE))
    assert explanation.graph_break_count == 0, str(explanation.break_reasons)
    assert explanation.graph_count == 1


def test_compiled_dropout_is_seeded_by_pytorchs_generator_and_replays():
    m = nn.Sequential(nn.Linear(6, 6), nn.Dropout(0.5)).to(DEVICE, F64)
    dt.convert(m, "numba")
    run = torch.compile(m, backend="aot_eager", fullgraph=True)
    x = rand(3, 6).to(DEVICE)
    ys = []
    for model in (run, run, m):
        torch.manual_seed(11)
        ys.append(model(x))
    close(ys[0], ys[1], 0, "the same seed, the same mask")
    # aot_eager draws the seed with the eager generator: the eager module's mask
    close(ys[0], ys[2], 1e-12, "compiled vs eager")
    xi = x.clone().requires_grad_()
    torch.manual_seed(11)
    y = run(xi)
    h = m[0](x).detach()
    kept = y != 0
    close(y, torch.where(kept, 2 * h, torch.zeros_like(h)), 1e-12, "y = h * mask / (1 - p)")
    y.sum().backward()
    close(xi.grad, torch.where(kept, 2.0, 0.0).to(x) @ m[0].weight.detach(), 1e-12,
          "the backward applies the forward's mask")


def test_compile_with_dynamic_shapes_traces_the_fake_kernels_symbolically():
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Conv2d(2, 3, 3, padding=1), nn.BatchNorm2d(3), nn.ReLU(),
                        nn.MaxPool2d(2, ceil_mode=True), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                        nn.Linear(3, 2)).to(DEVICE, F64)
    m = copy.deepcopy(ref)
    dt.convert(m, "numba")
    run = torch.compile(m, backend="aot_eager", fullgraph=True, dynamic=True)
    for shape in ((2, 2, 4, 4), (3, 2, 5, 3)):
        x = rand(*shape).to(DEVICE)
        close(run(x), ref(x), 1e-9, f"output for {shape}")


def test_a_meta_resnet18_compiles_without_graph_break_on_fake_kernels_only():
    # on meta tensors nothing runs: the graph is traced and run through the fake kernels
    model = ResNet18(width=64).to("meta")
    dt.convert(model, "auto")
    graphs, record = _recording()
    run = torch.compile(model, backend=record, fullgraph=True)
    y = run(meta(8, 3, 32, 32))
    assert y.shape == (8, 10) and y.device.type == "meta"
    assert len(graphs) == 1
    assert _dnnkit_ops(graphs) == {"conv", "batch_norm_train", "activation", "pool", "linear"}
    torch._dynamo.reset()
    run = torch.compile(model, backend="aot_eager", fullgraph=True)
    loss = run(meta(8, 3, 32, 32)).sum()
    loss.backward()
    assert model.fc.weight.grad.shape == (10, 512) and model.stem[0].weight.grad.device.type \
        == "meta"


class _Recurrent(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp, self.gru, self.out = nn.Linear(2, 2), nn.GRU(2, 2), nn.Linear(2, 2)

    def forward(self, x):
        return self.out(self.gru(self.inp(x))[0])


def test_recurrent_layers_run_outside_the_compiled_graphs():
    torch.manual_seed(0)
    ref = _Recurrent().to(DEVICE, F64)
    m = copy.deepcopy(ref)
    dt.convert(m, "numba")
    torch._dynamo.reset()
    x = rand(2, 1, 2).to(DEVICE)
    explanation = torch._dynamo.explain(m)(x)
    assert explanation.graph_break_count == 1 and explanation.graph_count == 2
    xa, xr = x.clone().requires_grad_(), x.clone().requires_grad_()
    y = torch.compile(m, backend="aot_eager")(xa)
    yr = ref(xr)
    close(y, yr, 1e-9, "output")
    y.sum().backward()
    yr.sum().backward()
    close(xa.grad, xr.grad, 1e-9, "input gradient")


class _Small(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.act, self.fc = nn.Conv2d(2, 2, 3), nn.ReLU(), nn.Linear(2, 2)

    def forward(self, x):
        h = self.act(self.conv(x) + 1) * 2
        return self.fc(h.flatten(1)) - 1


def test_custom_ops_false_breaks_the_graph_at_the_converted_modules():
    m = _Small().to(DEVICE, F64)
    ref = copy.deepcopy(m)
    dt.convert(m, "numba", custom_ops=False)
    torch._dynamo.reset()
    x = rand(1, 2, 3, 3).to(DEVICE)
    explanation = torch._dynamo.explain(m)(x)
    assert explanation.graph_break_count >= 2, str(explanation)
    close(torch.compile(m, backend="aot_eager")(x), ref(x), 1e-9, "output")
    dt.convert(m, "numba")
    torch._dynamo.reset()
    assert torch._dynamo.explain(m)(x).graph_break_count == 0


def test_functions_switch_to_the_operators_under_compile_and_the_transformer_breaks():
    x = rand(2, 3, 4).to(DEVICE)

    def f(v):
        return dt.log_softmax(dt.activation(v, "tanh", backend="numba"), 1, backend="numba") \
            + dt.softmax(v, -1, backend="numba")
    graphs, record = _recording()
    close(torch.compile(f, backend=record, fullgraph=True)(x), f(x), 1e-12, "output")
    assert _dnnkit_ops(graphs) == {"activation", "softmax"}
    img = rand(1, 2, 3, 4).to(DEVICE)
    theta = torch.tensor([[[0.9, 0.1, 0.05], [-0.1, 0.8, 0.1]]], dtype=F64).to(DEVICE)

    def g(i, t):
        return dt.spatial_transformer(i * 2, t, backend="numba") + 1
    torch._dynamo.reset()
    assert torch._dynamo.explain(g)(img, theta).graph_break_count >= 1
    close(torch.compile(g, backend="aot_eager")(img, theta), g(img, theta), 1e-12, "output")


# ---------------------------------------------------------------- opcheck

def _r(*shape, grad=True):
    t = rand(*shape).to(DEVICE)
    return t.requires_grad_() if grad else t


def _opcheck_cases():
    rm, rv = torch.zeros(3, dtype=F64, device=DEVICE), torch.ones(3, dtype=F64, device=DEVICE)
    return {
        "conv": (L.conv, (_r(1, 2, 4, 4), _r(3, 2, 3, 3), _r(3), [2, 1], [1, 1], [1, 1], 1,
                          "numba")),
        "conv3d": (L.conv, (_r(1, 2, 3, 3, 3), _r(2, 1, 2, 2, 2), None, [1, 1, 1], [0, 1, 0],
                            [1, 1, 1], 2, "numba")),
        "conv_transpose": (L.conv_transpose, (_r(1, 2, 3, 3), _r(2, 3, 3, 3), _r(3), [2, 2],
                                              [1, 1], [1, 0], [1, 1], 1, "numba")),
        "pool": (L.pool, (_r(1, 2, 5, 5), [3, 3], [2, 2], [1, 1], "max", True, "numba")),
        "global_pool": (L.pool, (_r(2, 3, 3, 3), [], [], [], "average_inc_pad", False,
                                 "numba")),
        "linear": (L.linear, (_r(2, 3, 4), _r(5, 4), _r(5), "numba")),
        "batch_norm_train": (N.batch_norm_train, (_r(4, 3, 2, 2), _r(3), _r(3), rm, rv, 1e-5,
                                                  0.1, "numba")),
        "batch_norm_eval": (N.batch_norm_eval, (_r(2, 3, 2), _r(3), _r(3), rm + 0.2, rv * 1.5,
                                                1e-5, "numba")),
        "softmax": (N.softmax, (_r(2, 4, 3), 1, False, "numba")),
        "log_softmax": (N.softmax, (_r(3, 5), -1, True, "numba")),
        "activation": (N.activation, (_r(3, 4), "elu", 0.8, "numba")),
        "dropout": (N.dropout, (_r(4, 6), torch.tensor(7), 0.5, "numba")),
    }


@pytest.mark.parametrize("name", ["conv", "conv3d", "conv_transpose", "pool", "global_pool",
                                  "linear", "batch_norm_train", "batch_norm_eval", "softmax",
                                  "log_softmax", "activation", "dropout"])
def test_opcheck(name):
    op, args = _opcheck_cases()[name]
    torch.library.opcheck(op, args)


# ---------------------------------------------------------------- GPU: a compiled ResNet-18

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs PyTorch with CUDA")
@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("compiler", ["aot_eager", "inductor"])
def test_compiled_resnet18_gives_the_uncompiled_loss_and_gradients(compiler, backend):
    torch.manual_seed(0)
    eager = ResNet18(width=16).cuda().train()
    dt.convert(eager, backend)
    compiled = copy.deepcopy(eager)
    torch._dynamo.reset()
    run = torch.compile(compiled, backend=compiler, fullgraph=True)
    loss_fn = nn.CrossEntropyLoss()
    for step in range(2):
        x = torch.randn(8, 3, 32, 32, device="cuda")
        t = torch.randint(0, 10, (8,), device="cuda")
        la, lb = loss_fn(run(x), t), loss_fn(eager(x), t)
        la.backward()
        lb.backward()
        assert torch.allclose(la, lb, rtol=1e-5, atol=1e-6), (step, float(la), float(lb))
    for (n, p), (_, q) in zip(compiled.named_parameters(), eager.named_parameters()):
        scale = float(q.grad.abs().max()) or 1.0
        err = float((p.grad - q.grad).abs().max())
        assert err <= 1e-4 * scale, f"{n}: gradient differs by {err:g} (largest {scale:g})"
    for (n, b), (_, c) in zip(compiled.named_buffers(), eager.named_buffers()):
        assert torch.allclose(b.float(), c.float(), rtol=1e-5, atol=1e-6), n
