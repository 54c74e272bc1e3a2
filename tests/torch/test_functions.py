"""The dnnkit-backed modules against PyTorch's own, forward and backward, float64, tiny shapes
(they run on Numba's CUDA simulator here, on CPU tensors, and on a GPU with CUDA tensors):
outputs, input gradients, parameter gradients and running statistics."""

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import dnnkit.torch as dt  # noqa: E402
from tests.conftest import backend_params  # noqa: E402
from tests.torch.helpers import DEVICE, check_half_dropout, check_module, close  # noqa: E402

F64 = torch.float64


def rand(*shape, scale=1.0):
    g = torch.Generator().manual_seed(sum(shape) + len(shape))
    return torch.randn(shape, generator=g, dtype=F64) * scale


CONV = [
    (lambda: nn.Conv2d(2, 3, 3, stride=2, padding=1), (2, 2, 5, 5)),
    (lambda: nn.Conv2d(4, 4, 3, groups=2, dilation=2, padding=2, bias=False), (1, 4, 5, 5)),
    (lambda: nn.Conv2d(2, 2, 3, padding="same"), (1, 2, 4, 4)),
    (lambda: nn.Conv3d(2, 2, 2), (1, 2, 3, 3, 3)),
    (lambda: nn.ConvTranspose2d(2, 3, 3, stride=2, padding=1, output_padding=1), (1, 2, 3, 3)),
    (lambda: nn.ConvTranspose3d(2, 2, 2, stride=2, bias=False), (1, 2, 2, 2, 2)),
    (lambda: nn.Linear(3, 2), (2, 4, 3)),
    (lambda: nn.Conv1d(4, 2, 3, stride=2, padding=1, dilation=2, groups=2), (2, 4, 9)),
    (lambda: nn.Conv1d(2, 3, 3, padding="same", bias=False), (1, 2, 5)),
    (lambda: nn.Conv1d(2, 3, 3), (2, 6)),                               # unbatched (C, L)
    (lambda: nn.ConvTranspose1d(2, 4, 3, stride=2, padding=1, output_padding=1, groups=2),
     (2, 2, 4)),
]


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("make, shape", CONV, ids=[f"conv{i}" for i in range(len(CONV))])
def test_convolutions_and_linear_match_pytorch(make, shape, backend):
    check_module(make, rand(*shape), backend)


POOL = [
    (lambda: nn.MaxPool2d(2), (1, 2, 4, 4)),
    (lambda: nn.MaxPool2d(3, 2, 1, ceil_mode=True), (1, 2, 6, 6)),
    (lambda: nn.AvgPool2d(3, 2, 1, count_include_pad=False), (1, 2, 5, 5)),
    (lambda: nn.AvgPool2d(3, 2, 1, ceil_mode=True), (1, 1, 6, 6)),
    (lambda: nn.MaxPool3d(2), (1, 1, 2, 4, 4)),
    (lambda: nn.AvgPool3d(2), (1, 1, 2, 2, 4)),
    (lambda: nn.AdaptiveAvgPool2d(1), (2, 3, 3, 3)),
    (lambda: nn.AdaptiveAvgPool3d((1, 1, 1)), (1, 2, 2, 2, 2)),
]


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("make, shape", POOL, ids=[f"pool{i}" for i in range(len(POOL))])
def test_pooling_matches_pytorch(make, shape, backend):
    check_module(make, rand(*shape), backend)


BN = [
    (lambda: nn.BatchNorm2d(3), (2, 3, 2, 2), True),
    (lambda: nn.BatchNorm1d(3, momentum=None), (4, 3), True),
    (lambda: nn.BatchNorm2d(3, affine=False), (2, 3, 2, 2), True),
    (lambda: nn.BatchNorm2d(3, track_running_stats=False), (2, 3, 2, 2), True),
    (lambda: nn.BatchNorm3d(2), (2, 2, 1, 2, 2), True),
    (lambda: nn.BatchNorm2d(3), (2, 3, 2, 2), False),
    (lambda: nn.BatchNorm1d(3, affine=False), (2, 3, 2), False),
]


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("make, shape, train", BN, ids=[f"bn{i}" for i in range(len(BN))])
def test_batch_norm_matches_pytorch_and_updates_its_running_statistics(make, shape, train,
                                                                       backend):
    def made():
        m = make()
        if m.running_mean is not None:     # statistics that are not the defaults
            m.running_mean.uniform_(-1, 1)
            m.running_var.uniform_(0.5, 2)
        if m.weight is not None:
            m.weight.data.uniform_(0.5, 2)
            m.bias.data.uniform_(-1, 1)
        return m
    m = check_module(made, rand(*shape), backend, steps=2, train=train)
    if train and m.track_running_stats:
        assert int(m.num_batches_tracked) == 2


SOFTMAX = [
    (lambda: nn.Softmax(1), (2, 3, 2, 2)), (lambda: nn.Softmax(-1), (2, 3, 4)),
    (lambda: nn.LogSoftmax(0), (3, 2)), (lambda: nn.LogSoftmax(1), (2, 5)),
]


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("make, shape", SOFTMAX, ids=[f"softmax{i}" for i in range(len(SOFTMAX))])
def test_softmax_over_any_dim_matches_pytorch(make, shape, backend):
    check_module(make, rand(*shape, scale=3.0), backend)


ACT = [nn.ReLU, nn.Sigmoid, nn.Tanh, lambda: nn.ELU(0.7), nn.SiLU, nn.ReLU6,
       lambda: nn.Hardtanh(0.0, 2.0), lambda: nn.Sequential(nn.Linear(5, 5), nn.ReLU(inplace=True))]


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("make", ACT, ids=[f"act{i}" for i in range(len(ACT))])
def test_activations_match_pytorch(make, backend):
    # values away from the kinks (0, and the ceilings 2 and 6), where the slopes are choices
    x = rand(2, 3, 5, scale=4.0)
    x = torch.where((x.abs() < 1e-3) | ((x - 2).abs() < 1e-3) | ((x - 6).abs() < 1e-3),
                    x + 0.01, x)
    check_module(make, x, backend)


RNN = [
    (lambda: nn.LSTM(2, 3), (2, 1, 2)),
    (lambda: nn.GRU(2, 2, batch_first=True), (1, 2, 2)),
    (lambda: nn.RNN(2, 2, num_layers=2, nonlinearity="relu", bidirectional=True), (2, 1, 2)),
    (lambda: nn.RNN(2, 2, bias=False), (2, 2)),                      # unbatched (T, I)
]


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("make, shape", RNN, ids=["lstm", "gru", "rnn_relu_bi", "unbatched"])
def test_recurrent_layers_match_pytorch(make, shape, backend):
    check_module(make, rand(*shape), backend)


@pytest.mark.parametrize("backend", backend_params())
def test_lstm_with_initial_states_matches_pytorch(backend):
    h0, c0 = rand(1, 1, 2).to(DEVICE), rand(1, 1, 2, scale=0.5).to(DEVICE)
    check_module(lambda: nn.LSTM(2, 2), rand(2, 1, 2), backend, args=((h0, c0),))


@pytest.mark.parametrize("backend", backend_params())
def test_dropout_scales_the_kept_elements_and_repeats_with_the_seed(backend):
    m = nn.Dropout(0.5)
    dt.convert(m, backend)
    x = (rand(4, 8).abs() + 0.5).to(DEVICE).requires_grad_()
    torch.manual_seed(3)
    y = m(x)
    torch.manual_seed(3)
    y2 = m(x)
    check_half_dropout(y, y2, x, rand(4, 8).to(DEVICE))
    m.eval()
    assert m(x) is x


@pytest.mark.parametrize("backend", backend_params())
def test_spatial_transformer_matches_pytorch_align_corners(backend):
    img = rand(2, 2, 3, 4).to(DEVICE).requires_grad_()
    theta = (torch.tensor([[[0.9, 0.1, 0.05], [-0.1, 0.8, 0.1]]], dtype=F64).repeat(2, 1, 1)
             + rand(2, 2, 3, scale=0.05)).to(DEVICE).requires_grad_()
    y = dt.spatial_transformer(img, theta, backend=backend)
    img2 = img.detach().clone().requires_grad_()
    theta2 = theta.detach().clone().requires_grad_()
    grid = torch.nn.functional.affine_grid(theta2, img2.shape, align_corners=True)
    y2 = torch.nn.functional.grid_sample(img2, grid, align_corners=True)
    close(y, y2, 1e-9, "output")
    g = rand(*y.shape).to(DEVICE)
    y.backward(g)
    y2.backward(g)
    close(img.grad, img2.grad, 1e-9, "dimg")
    close(theta.grad, theta2.grad, 1e-9, "dtheta")


def test_functional_arguments_dnnkit_lacks_raise():
    x = rand(1, 1, 2, 2).to(DEVICE)
    with pytest.raises(ValueError, match="align_corners=True"):
        dt.grid_sample(x, rand(1, 2, 2, 2).to(DEVICE), align_corners=False)
    with pytest.raises(ValueError, match="mode='bilinear'"):
        dt.grid_sample(x, rand(1, 2, 2, 2).to(DEVICE), mode="nearest")
    with pytest.raises(ValueError, match="backend must be one of"):
        dt.softmax(x, 1, backend="cuda")


def test_gradcheck_float64_conv_and_softmax():
    x = rand(1, 2, 3, 3).to(DEVICE).requires_grad_()
    w = rand(2, 2, 2, 2).to(DEVICE).requires_grad_()
    assert torch.autograd.gradcheck(
        lambda x, w: dt.Conv.apply(x, w, None, 2, (1, 1), (0, 0), (1, 1), 1, "numba"), (x, w))
    assert torch.autograd.gradcheck(lambda x: dt.log_softmax(x, 1, backend="numba"), (x,))


def test_calls_go_through_the_dispatcher_trace_and_policy():
    import dnnkit
    from dnnkit import config
    m = nn.Conv2d(2, 2, 3, padding=1).to(DEVICE, F64)
    dt.convert(m, "auto")
    x = rand(1, 2, 3, 3).to(DEVICE).requires_grad_()
    with config.change_flags(**{"dnn.enabled": "disabled"}), dnnkit.trace() as t:
        m(x).sum().backward()
    assert t.ops() == ["conv2d", "conv2d_backward_data", "conv2d_backward_filter",
                       "conv_backward_bias"]
    assert set(t.backends()) == {"numba"}


def test_a_backward_on_another_thread_follows_the_callers_flags_trace_and_profile():
    """PyTorch runs the backward of CUDA tensors on its own autograd thread. Here the backward
    is started from a second thread (PyTorch runs a CPU backward on the thread that calls it,
    a CUDA one on its device thread: another thread either way), and the forward caller's
    scoped flags, trace and profile must reach its op calls."""
    import threading

    import dnnkit
    from dnnkit import config
    m = nn.Conv2d(2, 2, 3, padding=1).to(DEVICE, F64)
    dt.convert(m, "auto")
    x = rand(1, 2, 3, 3).to(DEVICE).requires_grad_()
    errors = []

    def backward(loss):
        try:
            loss.backward()
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)
    with config.change_flags(**{"dnn.enabled": "disabled"}), dnnkit.trace() as t, \
            dnnkit.profile() as p:
        th = threading.Thread(target=backward, args=(m(x).sum(),))
        th.start()
        th.join()
    assert not errors, errors
    assert t.ops() == ["conv2d", "conv2d_backward_data", "conv2d_backward_filter",
                       "conv_backward_bias"]
    assert set(t.backends()) == {"numba"}            # the scoped flag reached the backward
    assert {op for op, _ in p.rows} == set(t.ops())
    assert config.thread_layers() == ()             # nothing left behind on this thread
    # outside the blocks a backward on another thread sees no trace and the default policy
    with dnnkit.trace() as after:
        pass
    backward(m(x).sum())
    assert after.ops() == [] and not errors


@pytest.mark.parametrize("backend", backend_params())
def test_lstm_with_a_projection_matches_pytorch(backend):
    check_module(lambda: nn.LSTM(2, 3, proj_size=2), rand(2, 1, 2), backend)


@pytest.mark.parametrize("backend", backend_params())
def test_rnn_dropout_between_layers_applies_in_training_only(backend):
    # eval mode: no dropout, PyTorch's results (its native RNN: PyTorch's cuDNN RNN has no
    # backward in eval mode)
    with torch.backends.cudnn.flags(enabled=False):
        check_module(lambda: nn.GRU(2, 2, num_layers=2, dropout=0.5), rand(2, 1, 2), backend,
                     train=False)
    torch.manual_seed(0)
    m = nn.GRU(2, 2, num_layers=2, dropout=0.5).to(DEVICE, F64)
    dt.convert(m, backend)
    x = rand(3, 2, 2).to(DEVICE)
    torch.manual_seed(4)
    y1, _ = m(x)
    torch.manual_seed(4)
    y2, h = m(x)
    close(y1, y2, 0, "the same seed, the same masks")
    m.eval()
    y3, _ = m(x)
    assert float((y3 - y1).detach().abs().max()) > 1e-6      # training drew masks
    (y2.sum() + h.sum()).backward()
    assert all(torch.isfinite(p.grad).all() for p in m.parameters())


def test_an_eval_batch_norm_of_half_data_says_why_it_has_no_gradient():
    bn = nn.BatchNorm2d(3).to(DEVICE).eval()
    dt.convert(bn, "numba")
    x = torch.randn(2, 3, 2, 2, device=DEVICE).half().requires_grad_()
    y = bn(x)
    with pytest.raises(RuntimeError, match="gradient of torch.float16 data with torch.float32"):
        y.float().sum().backward()



def test_a_second_derivative_through_a_converted_layer_raises_instead_of_dropping_terms():
    """The backwards are dnnkit op calls, not PyTorch operations autograd could record: a
    backward asked for a graph of itself (create_graph=True) raises, where its gradient used
    to come back without one (every second-order term through the layer silently zero)."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(2, 2, 3, padding=1), nn.Tanh()).to(DEVICE, torch.float64)
    dt.convert(m, "numba")
    x = torch.randn(1, 2, 3, 3, dtype=torch.float64, device=DEVICE, requires_grad=True)
    with pytest.raises(RuntimeError, match="cannot be differentiated"):
        torch.autograd.grad(m(x).sum(), x, create_graph=True)
    (gx,) = torch.autograd.grad(m(x).sum(), x)            # a first derivative as before
    assert torch.isfinite(gx).all()
