"""dnnkit.torch on a real GPU with CUDA tensors: a ResNet-18 and an LSTM language model
written in PyTorch, converted to numba and to cudnn, take one SGD step to PyTorch's own
parameters; gradcheck in float64 of every function; a torch.cuda.graph capture of a converted
model's step replays to the eager steps; compare names a perturbed layer; the stream rule."""

import copy

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import dnnkit  # noqa: E402
import dnnkit.torch as dt  # noqa: E402
from dnnkit.torch import modules  # noqa: E402
from dnnkit.torch.functions_rnn import config as rnn_config, flat_weights, layout  # noqa: E402
from tests.conftest import backend_params  # noqa: E402
from tests.torch.models import LSTMLM, ResNet18  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(),
                                 reason="needs PyTorch with CUDA")]
F64 = torch.float64


@pytest.fixture(autouse=True)
def _no_tf32():
    """PyTorch's reference in true float32 (dnnkit's convolutions do not use TF32)."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def _sgd_step(model, x, target, loss_fn):
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    opt.zero_grad()
    loss = loss_fn(model(x), target)
    loss.backward()
    opt.step()
    return loss.detach()


def _assert_same_step(ref, m, before, tol):
    for (n, p), (_, q), b in zip(m.named_parameters(), ref.named_parameters(), before):
        upd, upd_ref = p.detach() - b, q.detach() - b
        scale = float(upd_ref.abs().max()) or 1.0
        err = float((upd - upd_ref).abs().max())
        assert err <= tol * scale, f"{n}: update differs by {err:g} (largest update {scale:g})"
    for (n, b), (_, c) in zip(m.named_buffers(), ref.named_buffers()):
        if b.is_floating_point():
            assert torch.allclose(b, c, rtol=1e-4, atol=1e-5), n


@pytest.mark.parametrize("backend", backend_params())
def test_resnet18_sgd_step_matches_pytorch(backend):
    torch.manual_seed(0)
    ref = ResNet18(width=16).cuda().train()
    m = copy.deepcopy(ref)
    report = dt.convert(m, backend)
    assert not report.skipped, str(report)
    assert len(report.converted) == 20 + 20 + 9 + 2    # conv, bn, relu modules, pool + fc
    before = [p.detach().clone() for p in ref.parameters()]
    x = torch.randn(8, 3, 32, 32, device="cuda")
    y = torch.randint(0, 10, (8,), device="cuda")
    loss_fn = nn.CrossEntropyLoss()
    la, lb = _sgd_step(m, x, y, loss_fn), _sgd_step(ref, x, y, loss_fn)
    assert torch.allclose(la, lb, rtol=1e-4)
    _assert_same_step(ref, m, before, 2e-3)


@pytest.mark.parametrize("backend", backend_params())
def test_lstm_language_model_sgd_step_matches_pytorch(backend):
    torch.manual_seed(0)
    ref = LSTMLM().cuda()
    m = copy.deepcopy(ref)
    report = dt.convert(m, backend)
    assert [p for p, _ in report.converted] == ["lstm", "out"], str(report)
    before = [p.detach().clone() for p in ref.parameters()]
    tokens = torch.randint(0, 50, (7, 4), device="cuda")
    target = torch.randint(0, 50, (7, 4), device="cuda")

    def loss_fn(out, t):
        return nn.functional.cross_entropy(out.reshape(-1, 50), t.reshape(-1))
    la, lb = _sgd_step(m, tokens, target, loss_fn), _sgd_step(ref, tokens, target, loss_fn)
    assert torch.allclose(la, lb, rtol=1e-4)
    _assert_same_step(ref, m, before, 2e-3)


# ---------------------------------------------------------------- gradcheck, float64

def _r(*shape, scale=1.0):
    return (torch.randn(*shape, dtype=F64, device="cuda") * scale).requires_grad_()


def _cases(backend):
    torch.manual_seed(1)
    lstm = nn.LSTM(2, 3).to("cuda", F64)
    lcfg = rnn_config(lstm)
    w = flat_weights(lstm, layout(lcfg)).detach().requires_grad_()

    def drop(x):
        torch.manual_seed(5)        # the same mask for every evaluation
        # p = 0.5: cuDNN takes p as a float32, exact for float64 data only where 1/(1 - p) is
        return dt.dropout(x, 0.5, backend=backend)
    return {
        "conv2d": (lambda x, w, b: dt.Conv.apply(x, w, b, 2, (2, 1), (1, 0), (1, 2), 1, backend),
                   (_r(1, 2, 5, 5), _r(3, 2, 3, 2), _r(3))),
        "conv3d": (lambda x, w: dt.Conv.apply(x, w, None, 3, (1, 1, 1), (1, 1, 1), (1, 1, 1),
                                              1, backend), (_r(1, 2, 3, 3, 3), _r(2, 2, 2, 2, 2))),
        "conv_transpose2d": (lambda x, w, b: dt.ConvTranspose.apply(
            x, w, b, 2, (2, 2), (1, 1), (1, 0), (1, 1), 1, backend),
            (_r(1, 2, 3, 3), _r(2, 3, 3, 3), _r(3))),
        "conv_transpose3d": (lambda x, w: dt.ConvTranspose.apply(
            x, w, None, 3, (2, 2, 2), (0, 0, 0), (0, 0, 0), (1, 1, 1), 1, backend),
            (_r(1, 2, 2, 2, 2), _r(2, 1, 2, 2, 2))),
        "max_pool2d": (lambda x: dt.Pool.apply(x, 2, (3, 3), (2, 2), (1, 1), "max", True,
                                               backend), (_r(1, 2, 6, 6),)),
        "avg_pool3d": (lambda x: dt.Pool.apply(x, 3, (2, 2, 2), (1, 1, 1), (0, 0, 0),
                                               "average_exc_pad", False, backend),
                       (_r(1, 1, 3, 3, 3),)),
        "linear": (lambda x, w, b: dt.Linear.apply(x, w, b, backend),
                   (_r(2, 3, 4), _r(5, 4), _r(5))),
        "batch_norm_train": (lambda x, g, b: dt.BatchNormTrain.apply(
            x, g, b, None, None, 1e-5, 0.1, backend), (_r(3, 2, 2, 2), _r(2), _r(2))),
        "batch_norm_eval": (lambda x, g, b: dt.BatchNormEval.apply(
            x, g, b, torch.zeros(2, dtype=F64, device="cuda") + 0.3,
            torch.ones(2, dtype=F64, device="cuda") * 1.7, 1e-5, backend),
            (_r(3, 2, 2, 2), _r(2), _r(2))),
        "softmax": (lambda x: dt.softmax(x, 1, backend=backend), (_r(2, 4, 3),)),
        "log_softmax": (lambda x: dt.log_softmax(x, -1, backend=backend), (_r(3, 5),)),
        **{f"activation_{mode}": (lambda x, mode=mode, c=c: dt.activation(x, mode, c,
                                                                          backend=backend),
                                  (_r(3, 4, scale=2.0),))
           for mode, c in (("relu", 0.0), ("sigmoid", 0.0), ("tanh", 0.0), ("elu", 0.8),
                           ("swish", 1.0), ("clipped_relu", 1.5))},
        "dropout": (drop, (_r(4, 6),)),
        "lstm": (lambda x, h, c, w: dt.RNN.apply(x, h, c, w, lcfg, True, backend, None)[:2],
                 (_r(3, 2, 2), _r(1, 2, 3), _r(1, 2, 3), w)),
        "affine_grid": (lambda t: dt.affine_grid(t, (2, 1, 3, 4), backend=backend),
                        (_r(2, 2, 3),)),
        "grid_sample": (lambda i, g: dt.grid_sample(i, g, backend=backend),
                        (_r(1, 2, 3, 4), _r(1, 2, 3, 2, scale=0.7))),
    }


NAMES = ["conv2d", "conv3d", "conv_transpose2d", "conv_transpose3d", "max_pool2d",
         "avg_pool3d", "linear", "batch_norm_train", "batch_norm_eval", "softmax",
         "log_softmax", "activation_relu", "activation_sigmoid", "activation_tanh",
         "activation_elu", "activation_swish", "activation_clipped_relu", "dropout", "lstm",
         "affine_grid", "grid_sample"]


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("name", NAMES)
def test_gradcheck_float64(name, backend):
    fn, inputs = _cases(backend)[name]
    assert torch.autograd.gradcheck(fn, inputs, eps=1e-6, atol=1e-5, rtol=1e-4)


# ---------------------------------------------------------------- CUDA graphs

def _cnn():
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                         nn.MaxPool2d(2), nn.Flatten(), nn.Linear(8 * 4 * 4, 10))


@pytest.mark.parametrize("backend", backend_params())
def test_cuda_graph_of_a_converted_step_replays_to_the_eager_steps(backend):
    torch.manual_seed(0)
    eager = _cnn().cuda()
    dt.convert(eager, backend)
    captured = copy.deepcopy(eager)
    batches = [(torch.randn(4, 3, 8, 8, device="cuda"), torch.randint(0, 10, (4,), device="cuda"))
               for _ in range(6)]
    loss_fn = nn.CrossEntropyLoss()

    def trainer(model):
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

        def step(x, y):
            opt.zero_grad(set_to_none=False)
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            return loss
        return step
    step_e, step_c = trainer(eager), trainer(captured)
    sx, sy = batches[0][0].clone(), batches[0][1].clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):                 # warm-up: the first 3 batches
        for x, y in batches[:3]:
            sx.copy_(x)
            sy.copy_(y)
            step_c(sx, sy)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with dt.graph(g):
        static_loss = step_c(sx, sy)
    assert g.dnnkit_pool is not None
    for x, y in batches[:3]:
        step_e(x, y)
    for x, y in batches[3:]:
        sx.copy_(x)
        sy.copy_(y)
        g.replay()
        loss = step_e(x, y)
        assert torch.allclose(static_loss, loss, rtol=1e-5, atol=1e-6)
    for (n, p), (_, q) in zip(captured.named_parameters(), eager.named_parameters()):
        assert torch.allclose(p, q, rtol=1e-5, atol=1e-6), n
    for (n, b), (_, c) in zip(captured.named_buffers(), eager.named_buffers()):
        assert torch.equal(b, c) if not b.is_floating_point() else \
            torch.allclose(b, c, rtol=1e-5, atol=1e-6), n


@pytest.mark.parametrize("backend", backend_params())
def test_a_plain_torch_cuda_graph_of_a_converted_model_is_refused(backend):
    """Inside torch.cuda.graph (not dnnkit.torch.graph) a converted layer's outputs would come
    from dnnkit's shared pool, handed to eager calls after the capture while every replay
    writes them: the first converted layer raises CaptureError naming the fix, and the same
    model then captures with dnnkit.torch.graph and replays."""
    from dnnkit.errors import CaptureError
    torch.manual_seed(0)
    model = _cnn().cuda()
    dt.convert(model, backend)
    x = torch.randn(4, 3, 8, 8, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            model(x).sum().backward()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with pytest.raises(CaptureError, match="dnnkit.torch.graph"):
        with torch.cuda.graph(g):
            model(x)
    g = torch.cuda.CUDAGraph()
    with dt.graph(g):
        static = model(x)
    g.replay()
    torch.cuda.synchronize()
    assert torch.allclose(static, model(x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", backend_params())
def test_a_side_stream_joined_into_a_dnnkit_torch_graph_capture_takes_its_pool(backend):
    """A converted layer run on another stream inside dnnkit.torch.graph (the stream joined to
    the capture by wait_stream) belongs to the same capture: served by the graph's pool, not
    refused; its backward (PyTorch's autograd thread, on that stream) too."""
    torch.manual_seed(0)
    model = _cnn().cuda()
    dt.convert(model, backend)
    x = torch.randn(4, 3, 8, 8, device="cuda")
    side = torch.cuda.Stream()

    def step():
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            out = model(x)
            out.sum().backward()
        torch.cuda.current_stream().wait_stream(side)
        return out
    for _ in range(2):
        step()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with dt.graph(g):
        static = step()
    g.replay()
    torch.cuda.synchronize()
    assert len(g.dnnkit_pool.lent) + sum(len(v) for v in g.dnnkit_pool.free.values()) > 0
    assert torch.allclose(static, model(x), rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- compare, streams, trace

def test_compare_names_a_perturbed_layer_on_both_backends(monkeypatch):
    torch.manual_seed(0)
    model = ResNet18(width=8).cuda()
    x = torch.randn(2, 3, 16, 16, device="cuda")
    c = dt.compare(model, x)
    assert c.ok, str(c)
    assert set(c.differences) == ({"numba", "cudnn"} if dnnkit.cudnn.is_available()
                                  else {"numba"})
    plain = modules.DnnLinear.forward
    monkeypatch.setattr(modules.DnnLinear, "forward", lambda self, v: plain(self, v) + 1e-2)
    c = dt.compare(model, x)
    for d in c.differences.values():
        assert d is not None and (d.path, d.kind) == ("fc", "output"), str(c)
    with pytest.raises(AssertionError, match="output of fc differs"):
        c.raise_if_different()


def test_a_side_stream_is_followed():
    torch.manual_seed(0)
    m = _cnn().cuda()
    ref = copy.deepcopy(m)
    dt.convert(m, "auto")
    s = torch.cuda.Stream()
    x = torch.randn(16, 3, 8, 8, device="cuda")
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        x2 = x * 2                          # produced on s, consumed by dnnkit on s
        y = m(x2)
    torch.cuda.current_stream().wait_stream(s)
    assert torch.allclose(y, ref(x * 2), rtol=1e-4, atol=1e-5)


def test_trace_records_the_forward_ops_and_their_backend():
    m = _cnn().cuda()
    dt.convert(m, "numba")
    with dnnkit.trace() as t:
        m(torch.randn(2, 3, 8, 8, device="cuda"))
    assert {"conv2d", "batch_norm_train", "activation", "pool2d", "linear"} <= set(t.ops())
    assert set(t.backends()) == {"numba"}
