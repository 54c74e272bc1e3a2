"""nn.Sequential's fusion of BatchNorm + ReLU into one op call (ops.batch_norm_*(activation=
"relu")), the BatchNorm layers' ``activation=`` and the ResNet blocks that use it: the same
results and gradients as the modules one by one, fewer op calls, and no fusion where a hook or
a backend pin asks for the modules' own calls."""

import numpy as np
import pytest

import dnnkit
from dnnkit import models, nn
from tests.conftest import backend_params


def _pair(seed=1, channels=3):
    def build():
        return nn.Sequential(nn.Conv2d(2, channels, 3, padding=1, bias=False, seed=seed),
                             nn.BatchNorm2d(channels), nn.ReLU(), nn.MaxPool2d(2))
    return build(), build()


def _run(model, x, dy, one_by_one=False):
    xt = dnnkit.tensor(x, requires_grad=True)
    with dnnkit.trace() as t:
        if one_by_one:
            y = xt
            for m in model:
                y = m(y)
        else:
            y = model(xt)
    y.backward(dnnkit.tensor(dy))
    grads = [xt.grad.numpy()] + [p.grad.numpy() for p in model.parameters()]
    return y.numpy(), grads, t.ops()


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("training", [True, False])
def test_sequential_fuses_batchnorm_relu_with_the_same_results(rng, backend, training):
    fused, plain = _pair()
    for m in (fused, plain):
        nn.convert(m, backend)
        m.train(training)
    x = rng.standard_normal((2, 2, 4, 4)).astype(np.float32)
    dy = rng.standard_normal((2, 3, 2, 2)).astype(np.float32)
    yf, gf, ops_f = _run(fused, x, dy)
    yp, gp, ops_p = _run(plain, x, dy, one_by_one=True)
    bn = "batch_norm_train" if training else "batch_norm_inference"
    assert ops_f == ["conv2d", bn, "pool2d"]
    assert ops_p == ["conv2d", bn, "activation", "pool2d"]
    np.testing.assert_allclose(yf, yp, rtol=1e-6, atol=1e-6)
    for a, b in zip(gf, gp):
        assert np.isfinite(a).all()
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    if training:     # the running statistics were updated once, alike
        np.testing.assert_array_equal(fused[1].running_mean.numpy(),
                                      plain[1].running_mean.numpy())
        assert fused[1].num_batches_tracked == plain[1].num_batches_tracked == 1


@pytest.mark.parametrize("where", ["bn", "relu"])
def test_a_forward_hook_keeps_the_modules_apart(rng, where):
    """A hook sees its module's own output: the BatchNorm's before the relu."""
    model, _ = _pair()
    seen = []
    target = model[1] if where == "bn" else model[2]
    target.register_forward_hook(lambda m, i, o: seen.append(o.numpy().min()))
    x = rng.standard_normal((2, 2, 4, 4)).astype(np.float32)
    with dnnkit.trace() as t:
        model(x)
    assert "activation" in t.ops()
    assert (seen[0] < 0) if where == "bn" else (seen[0] == 0)


def test_different_backend_pins_keep_the_modules_apart(rng):
    model, _ = _pair()
    model[2].backend = "numba"
    with dnnkit.trace() as t:
        model(rng.standard_normal((2, 2, 4, 4)).astype(np.float32))
    assert "activation" in t.ops()


def test_only_a_plain_relu_module_is_fused(rng):
    """A subclass of ReLU may compute something else; other activations are not fused."""
    class Mine(nn.ReLU):
        pass
    for act in (Mine(), nn.Tanh()):
        model = nn.Sequential(nn.BatchNorm2d(2), act)
        with dnnkit.trace() as t:
            model(rng.standard_normal((2, 2, 3, 3)).astype(np.float32))
        assert t.ops()[-1] == "activation"


def test_batchnorm_activation_argument(rng):
    bn = nn.BatchNorm1d(3)
    x = rng.standard_normal((4, 3)).astype(np.float32)
    y = bn(x, activation="relu").numpy()
    assert y.min() == 0 and (y > 0).any()
    with pytest.raises(ValueError, match="batch_norm_train.*activation.*gelu"):
        bn(x, activation="gelu")


def test_resnet_blocks_fuse_their_relus_and_residual_adds(rng):
    """relu(bn1(conv1(x))) and relu(bn2(conv2(.)) + shortcut) are one op call each in every
    BasicBlock, as the stem's relu(bn1(conv1(x))): ResNet-18's forward makes no activation or
    add call, and its gradients are those of the same model run op by op."""
    model = models.resnet18(width=2, num_classes=3)
    x = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    xt = dnnkit.tensor(x, requires_grad=True)
    with dnnkit.trace() as t:
        y = model(xt)
    ops = t.ops()
    assert ops.count("batch_norm_train") == 20
    assert "activation" not in ops and "add" not in ops
    y.sum().backward()
    fused = [xt.grad.numpy()] + [p.grad.numpy() for p in model.parameters()]

    block = model.layer2[0]               # op by op: the block as it reads
    xb = dnnkit.tensor(rng.standard_normal((2, 2, 8, 8)).astype(np.float32),
                       requires_grad=True)
    want = block.relu(dnnkit.add(block.bn2(block.conv2(block.relu(block.bn1(block.conv1(
        xb))))), block.downsample(xb)))
    got = block(xb)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)
    assert all(np.isfinite(f).all() for f in fused)


def test_a_subclass_overriding_forward_is_not_fused(rng):
    """fused_activations belongs to the forward of the class that declares it: a subclass with
    its own forward (SyncBatchNorm's kind) gets its own call and the ReLU's."""
    class Logged(nn.BatchNorm2d):
        def forward(self, x):
            return super().forward(x)

    class Declared(Logged):
        fused_activations = ("relu",)

        def forward(self, x, activation=None):
            return super(Logged, self).forward(x, activation=activation)
    x = rng.standard_normal((2, 2, 3, 3)).astype(np.float32)
    for cls, fused in ((Logged, False), (Declared, True)):
        with dnnkit.trace() as t:
            nn.Sequential(cls(2), nn.ReLU())(x)
        assert ("activation" not in t.ops()) == fused


@pytest.mark.parametrize("case", ["hook", "pin", "sync", "instance"])
def test_resnet_blocks_fall_back_to_the_modules_own_calls(rng, case):
    """nn.norm_relu (the blocks' fused calls) keeps the modules apart as Sequential does: a
    hook on the BatchNorm sees its own output, a ReLU pinned elsewhere runs there, a
    BatchNorm subclass with its own forward (SyncBatchNorm's kind) and a forward set on the
    instance get their plain calls; the results match the fused model's."""
    class Plain(nn.BatchNorm2d):
        def forward(self, x):
            return super().forward(x)
    x = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    ref = models.resnet18(width=2, num_classes=3)(x).numpy()
    model = models.resnet18(width=2, num_classes=3)
    block = model.layer1[0]
    seen = []
    if case == "hook":
        block.bn1.register_forward_hook(lambda m, i, o: seen.append(o.numpy().min()))
    elif case == "pin":
        block.relu.backend = "numba"
    elif case == "sync":
        old = block.bn1
        block.bn1 = Plain(old.num_features)
        block.bn1.load_state_dict(old.state_dict())
    else:
        block.bn1.forward = block.bn1.forward           # an instrumented instance
    with dnnkit.trace() as t:
        y = model(x)
    assert t.ops().count("activation") >= 1
    np.testing.assert_allclose(y.numpy(), ref, rtol=1e-4, atol=1e-5)
    if case == "hook":
        assert seen[0] < 0                                # the BatchNorm's own output


def test_resnet_converted_to_sync_batch_norm_runs_unfused(rng):
    """SyncBatchNorm.forward takes no activation: its blocks call the modules one by one (eval
    mode: no process group needed) and give the plain model's output."""
    import dnnkit.distributed as dist
    x = rng.standard_normal((2, 3, 8, 8)).astype(np.float32)
    plain = models.resnet18(width=1, num_classes=2).eval()
    synced = dist.SyncBatchNorm.convert(models.resnet18(width=1, num_classes=2)).eval()
    with dnnkit.trace() as t:
        y = synced(x)
    assert t.ops().count("activation") == 17 and t.ops().count("add") == 8
    np.testing.assert_allclose(y.numpy(), plain(x).numpy(), rtol=1e-5, atol=1e-6)


def test_a_forward_patched_onto_the_class_later_is_seen(rng):
    """The per-class answer is keyed by the class's forward: patching it after a fused call
    takes the modules apart from then on."""
    class Norm(nn.BatchNorm2d):
        pass
    model = nn.Sequential(Norm(2), nn.ReLU())
    x = rng.standard_normal((2, 2, 3, 3)).astype(np.float32)
    with dnnkit.trace() as t:
        model(x)
    assert "activation" not in t.ops()
    Norm.forward = lambda self, x: nn.BatchNorm2d.forward(self, x)
    with dnnkit.trace() as t:
        model(x)
    assert t.ops()[-1] == "activation"


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("nd", [2, 3])
def test_sequential_fuses_conv_relu_with_the_same_results(rng, backend, nd):
    """Conv (with its bias) + ReLU as one conv call (activation="relu"), forward and backward
    equal to the modules one by one."""
    conv = nn.Conv2d if nd == 2 else nn.Conv3d

    def build():
        return nn.Sequential(conv(2, 3, 3, padding=1, seed=4), nn.ReLU(),
                             conv(3, 2, 1, seed=5), nn.ReLU())
    fused, plain = build(), build()
    for m in (fused, plain):
        nn.convert(m, backend)
    x = rng.standard_normal((2, 2) + (4,) * nd).astype(np.float32)
    dy = rng.standard_normal((2, 2) + (4,) * nd).astype(np.float32)
    yf, gf, ops_f = _run(fused, x, dy)
    yp, gp, ops_p = _run(plain, x, dy, one_by_one=True)
    op = f"conv{nd}d"
    assert ops_f == [op, op]
    assert ops_p == [op, "activation", op, "activation"]
    assert yf.min() == 0
    np.testing.assert_allclose(yf, yp, rtol=1e-6, atol=1e-6)
    for a, b in zip(gf, gp):
        assert np.isfinite(a).all()
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_conv_layer_takes_activation(rng):
    m = nn.Conv2d(2, 3, 3, padding=1, seed=2)
    x = rng.standard_normal((1, 2, 4, 4)).astype(np.float32)
    y, plain = m(x, activation="relu").numpy(), m(x).numpy()
    np.testing.assert_array_equal(y, np.maximum(plain, 0))
    with pytest.raises(ValueError, match="activation"):
        m(x, activation="gelu")


@pytest.mark.parametrize("with_residual", [False, True])
def test_norm_relu_with_a_convolution(rng, with_residual):
    """A convolution fuses the relu but takes no residual (``fused_residual`` False): norm_relu
    calls it with the relu alone, and with a residual falls back to the modules' calls."""
    conv = nn.Conv2d(2, 3, 3, padding=1, seed=3)
    x = rng.standard_normal((1, 2, 4, 4)).astype(np.float32)
    z = rng.standard_normal((1, 3, 4, 4)).astype(np.float32) if with_residual else None
    with dnnkit.trace() as t:
        y = nn.norm_relu(conv, nn.ReLU(), x, residual=z)
    want = conv(x).numpy() + (0 if z is None else z)
    np.testing.assert_allclose(y.numpy(), np.maximum(want, 0), rtol=1e-6, atol=1e-6)
    assert t.ops() == (["conv2d", "add", "activation"] if with_residual else ["conv2d"])


def test_a_subclass_overriding_forward_takes_no_residual():
    """``fused_residual`` follows the forward that runs, as ``fused_activations`` does."""
    from dnnkit.nn import containers

    class Plain(nn.BatchNorm2d):
        fused_activations = ("relu",)

        def forward(self, x, activation=None):
            return super().forward(x, activation=activation)
    assert containers._takes(nn.BatchNorm2d, "fused_residual") is True
    assert containers._takes(Plain, "fused_residual") is False
    assert containers._takes(nn.Conv2d, "fused_residual") is False
