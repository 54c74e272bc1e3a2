"""The loss modules (CrossEntropyLoss, NLLLoss, MSELoss): a 0-d Tensor on the device, values and
gradients (through ``loss.backward()``) against float64 NumPy references written from the
equations, ignore_index, the reductions, and argument errors. (The loss ops themselves are
tested in tests/ops/test_loss.py.)"""

import numpy as np
import pytest

import dnnkit
from dnnkit import nn
from dnnkit.reference import rel_error

DTYPES = ["float16", "float32", "float64"]
TOL = {"float16": 1e-2, "float32": 1e-6, "float64": 1e-12}
SHAPES = [(4, 5), (2, 3, 2, 3)]   # (N, C) and (N, C, H, W)


def ce_ref(x, target, reduction="mean", ignore=-100):
    """(loss, dloss/dx) of -sum log_softmax(x)[n, target] over counted positions / K."""
    x = np.asarray(x, np.float64)
    m = x.max(axis=1, keepdims=True)
    logp = x - m - np.log(np.exp(x - m).sum(axis=1, keepdims=True))
    keep = target != ignore
    t = np.where(keep, target, 0)
    picked = np.take_along_axis(logp, t[:, None], axis=1)[:, 0]
    k = keep.sum() if reduction == "mean" else 1
    loss = -(picked * keep)
    onehot = np.zeros_like(x)
    np.put_along_axis(onehot, t[:, None], 1.0, axis=1)
    grad = (np.exp(logp) - onehot) * keep[:, None] / k
    return (loss if reduction == "none" else loss.sum() / k), grad, logp


def logits_and_target(rng, shape, dtype, ignore=None):
    x = (2 * rng.standard_normal(shape)).astype(dtype)
    t = rng.integers(0, shape[1], size=(shape[0],) + shape[2:])
    if ignore is not None:
        t.flat[::3] = ignore
    return x, t


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_cross_entropy(rng, dtype, shape, reduction):
    x, t = logits_and_target(rng, shape, dtype)
    xt = dnnkit.tensor(x, requires_grad=True)
    loss = nn.CrossEntropyLoss(reduction)(xt, t)
    assert isinstance(loss, dnnkit.Tensor) and loss.shape == () and loss.dtype == x.dtype
    ref_loss, ref_grad, _ = ce_ref(x, t, reduction)
    assert rel_error(loss.item(), ref_loss) <= TOL[dtype]
    loss.backward()
    assert rel_error(xt.grad.numpy(), ref_grad) <= TOL[dtype]


@pytest.mark.parametrize("shape", SHAPES)
def test_cross_entropy_ignore_index_and_none(rng, shape):
    x, t = logits_and_target(rng, shape, "float64", ignore=7)
    xt = dnnkit.tensor(x, requires_grad=True)
    loss = nn.CrossEntropyLoss(ignore_index=7)(xt, t)
    ref_loss, ref_grad, _ = ce_ref(x, t, "mean", ignore=7)
    assert rel_error(loss.item(), ref_loss) <= 1e-12
    loss.backward()
    assert rel_error(xt.grad.numpy(), ref_grad) <= 1e-12
    per = nn.CrossEntropyLoss("none", ignore_index=7)(x, t)
    assert per.shape == t.shape
    assert rel_error(per.numpy(), ce_ref(x, t, "none", ignore=7)[0]) <= 1e-12


def test_nll_loss_after_log_softmax(rng):
    x, t = logits_and_target(rng, (3, 4), "float64")
    xt = dnnkit.tensor(x, requires_grad=True)
    logp = nn.LogSoftmax()(xt)
    loss = nn.NLLLoss()(logp, t)
    ref_loss, ref_grad, ref_logp = ce_ref(x, t)
    assert rel_error(logp.numpy(), ref_logp) <= 1e-12
    assert rel_error(loss.item(), ref_loss) <= 1e-12
    loss.backward()
    assert rel_error(xt.grad.numpy(), ref_grad) <= 1e-12


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_mse(rng, reduction):
    x, t = rng.standard_normal((2, 3)), rng.standard_normal((2, 3))
    xt = dnnkit.tensor(x, requires_grad=True)
    loss = nn.MSELoss(reduction)(xt, t)
    d = x - t
    k = d.size if reduction == "mean" else 1
    if reduction == "none":
        assert rel_error(loss.numpy(), d * d) <= 1e-12
        return
    assert loss.shape == () and rel_error(loss.item(), (d * d).sum() / k) <= 1e-12
    loss.backward()
    assert rel_error(xt.grad.numpy(), 2 * d / k) <= 1e-12


def test_mse_target_gradient(rng):
    x, t = (dnnkit.tensor(rng.standard_normal(4), requires_grad=True) for _ in range(2))
    nn.MSELoss("sum")(x, t).backward()
    np.testing.assert_allclose(t.grad.numpy(), -x.grad.numpy(), rtol=1e-13)


def test_loss_is_queued_not_read(rng):
    """forward returns at once a device value: no Python float anywhere."""
    x, t = logits_and_target(rng, (2, 3), "float32")
    loss = nn.CrossEntropyLoss()(x, dnnkit.tensor(t))
    assert isinstance(loss, dnnkit.Tensor) and not isinstance(loss, float)
    assert loss.data.shape == ()


def test_pinned_loss_runs_its_log_softmax_there(rng):
    x, t = logits_and_target(rng, (2, 3), "float32")
    crit = nn.convert(nn.CrossEntropyLoss(), "numba")
    with dnnkit.trace() as tr:
        crit(x, t)
    assert "cross_entropy" in tr.ops() and set(tr.backends()) == {"numba"}


def test_loss_errors(rng):
    x, t = logits_and_target(rng, (2, 3), "float32")
    crit = nn.CrossEntropyLoss()
    with pytest.raises(ValueError, match=r"cross_entropy.*\(3,\).*\(2, 3\)"):
        crit(x, np.array([0, 1, 2]))
    with pytest.raises(ValueError, match=r"cross_entropy.*\[0, 3\)"):
        crit(x, np.array([0, 3]))
    with pytest.raises(TypeError, match="cross_entropy.*integer"):
        crit(x, np.array([0.0, 1.0]))
    with pytest.raises(TypeError, match="CrossEntropyLoss: the input must be a numeric array"):
        crit([["a", "b", "c"]], np.array([0]))
    with pytest.raises(ValueError, match=r"mse_loss.*\(3, 2\).*\(2, 3\)"):
        nn.MSELoss()(x, np.zeros((3, 2)))
