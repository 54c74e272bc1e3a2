"""SyncBatchNorm on the simulator against BatchNorm on the whole batch: one rank (its
statistics are the batch's), and two ranks in one process (tests/distributed/fakes.py), each
holding half the batch: outputs, the gradient of the summed losses with respect to x,
weight and bias, the running statistics; both backends (cuDNN where it runs); convert(); the
errors. float64, tiny shapes."""

import numpy as np
import pytest

import dnnkit
from dnnkit import nn
from dnnkit.distributed import SyncBatchNorm
from dnnkit.distributed.nccl import LocalComm
from tests.conftest import backend_params

from .fakes import group_of, run_pair

SHAPES = [(4, 3), (4, 3, 5), (4, 3, 2, 2)]


def norm_for(shape):
    return {2: nn.BatchNorm1d, 3: nn.BatchNorm1d, 4: nn.BatchNorm2d}[len(shape)]


def set_affine(m, rng):
    c = m.num_features
    m.load_state_dict(dict(m.state_dict(), weight=rng.standard_normal(c) + 1.0,
                           bias=rng.standard_normal(c)))


def reference(x, w, backend, affine=True, track=True):
    """BatchNorm on the whole batch: y, and the gradients of sum(y * w)."""
    bn = nn.convert(norm_for(x.shape)(x.shape[1], affine=affine, track_running_stats=track,
                                      dtype="float64"), backend)
    if affine:
        set_affine(bn, np.random.default_rng(5))
    xt = dnnkit.tensor(x, requires_grad=True)
    y = bn(xt)
    (y * w).sum().backward()
    return bn, y.numpy(), xt.grad.numpy()


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("shape", SHAPES)
def test_one_rank_is_batch_norm(rng, shape, backend):
    x = rng.standard_normal(shape) * 2.0 + 0.5
    w = rng.standard_normal(shape)
    bn, y_ref, dx_ref = reference(x, w, backend)
    sbn = nn.convert(SyncBatchNorm(shape[1], dtype="float64",
                                   group=group_of(LocalComm(), world=1)), backend)
    set_affine(sbn, np.random.default_rng(5))
    xt = dnnkit.tensor(x, requires_grad=True)
    y = sbn(xt)
    (y * w).sum().backward()
    np.testing.assert_allclose(y.numpy(), y_ref, rtol=1e-11, atol=1e-12)
    np.testing.assert_allclose(xt.grad.numpy(), dx_ref, rtol=1e-10, atol=1e-11)
    for name in ("weight", "bias"):
        np.testing.assert_allclose(getattr(sbn, name).grad.numpy(),
                                   getattr(bn, name).grad.numpy(), rtol=1e-11, atol=1e-12)
    for name in ("running_mean", "running_var"):
        np.testing.assert_allclose(getattr(sbn, name).numpy(), getattr(bn, name).numpy(),
                                   rtol=1e-12)
    assert sbn.num_batches_tracked == 1
    sbn.eval()
    bn.eval()
    np.testing.assert_allclose(sbn(dnnkit.tensor(x)).numpy(), bn(dnnkit.tensor(x)).numpy(),
                               rtol=1e-12)


@pytest.mark.parametrize("affine,track", [(False, True), (True, False)])
def test_one_rank_without_affine_or_running_statistics(rng, affine, track):
    x, w = rng.standard_normal((4, 3, 2)), rng.standard_normal((4, 3, 2))
    _, y_ref, dx_ref = reference(x, w, "numba", affine, track)
    sbn = SyncBatchNorm(3, affine=affine, track_running_stats=track, dtype="float64",
                        group=group_of(LocalComm(), world=1))
    if affine:
        set_affine(sbn, np.random.default_rng(5))
    xt = dnnkit.tensor(x, requires_grad=True)
    y = sbn(xt)
    (y * w).sum().backward()
    np.testing.assert_allclose(y.numpy(), y_ref, rtol=1e-11, atol=1e-12)
    np.testing.assert_allclose(xt.grad.numpy(), dx_ref, rtol=1e-10, atol=1e-11)
    if not track:                  # batch statistics in eval mode too
        sbn.eval()
        np.testing.assert_allclose(sbn(dnnkit.tensor(x)).numpy(), y_ref, rtol=1e-11,
                                   atol=1e-12)


@pytest.mark.parametrize("backend", backend_params())
def test_two_ranks_are_batch_norm_on_the_whole_batch(rng, backend):
    shape = (6, 3, 2, 2)
    x = rng.standard_normal(shape) * 3.0 - 1.0
    w = rng.standard_normal(shape)
    bn, y_ref, dx_ref = reference(x, w, backend)
    halves = [slice(0, 2), slice(2, 6)]            # unequal shares: the counts are reduced

    def rank_fn(rank, g):
        sbn = nn.convert(SyncBatchNorm(3, dtype="float64", group=g), backend)
        set_affine(sbn, np.random.default_rng(5))
        xt = dnnkit.tensor(x[halves[rank]], requires_grad=True)
        y = sbn(xt)
        (y * w[halves[rank]]).sum().backward()
        return (y.numpy(), xt.grad.numpy(), sbn.weight.grad.numpy(), sbn.bias.grad.numpy(),
                sbn.running_mean.numpy(), sbn.running_var.numpy())

    got = run_pair(rank_fn)
    for rank, part in enumerate(halves):
        y, dx, _, _, rm, rv = got[rank]
        np.testing.assert_allclose(y, y_ref[part], rtol=1e-11, atol=1e-12)
        np.testing.assert_allclose(dx, dx_ref[part], rtol=1e-10, atol=1e-11)
        np.testing.assert_allclose(rm, bn.running_mean.numpy(), rtol=1e-12)
        np.testing.assert_allclose(rv, bn.running_var.numpy(), rtol=1e-12)
    # weight and bias: each rank its share (DataParallel averages them); the sum is the whole
    np.testing.assert_allclose(got[0][2] + got[1][2], bn.weight.grad.numpy(), rtol=1e-11)
    np.testing.assert_allclose(got[0][3] + got[1][3], bn.bias.grad.numpy(), rtol=1e-11)


def test_convert_keeps_the_parameters():
    model = nn.Sequential(nn.Conv2d(2, 3, 3, dtype="float64"),
                          nn.BatchNorm2d(3, dtype="float64"),
                          nn.Sequential(nn.Flatten(), nn.BatchNorm1d(12, dtype="float64")))
    model.eval()
    nn.convert(model, "numba")
    old = model[1]
    old.num_batches_tracked = 7
    got = SyncBatchNorm.convert(model)
    assert got is model
    new = model[1]
    assert type(new) is SyncBatchNorm and type(model[2][1]) is SyncBatchNorm
    assert new.weight is old.weight and new.running_var is old.running_var
    assert (new.num_batches_tracked, new.training, new.backend) == (7, False, "numba")
    assert list(model.state_dict()) == ["0.weight", "0.bias", "1.weight", "1.bias",
                                        "1.running_mean", "1.running_var",
                                        "1.num_batches_tracked", "2.1.weight", "2.1.bias",
                                        "2.1.running_mean", "2.1.running_var",
                                        "2.1.num_batches_tracked"]
    one = nn.BatchNorm1d(4, affine=False)
    assert type(SyncBatchNorm.convert(one)) is SyncBatchNorm
    assert SyncBatchNorm.convert(new) is new


def test_errors(rng):
    g = group_of(LocalComm(), world=1)
    sbn = SyncBatchNorm(3, group=g)
    with pytest.raises(TypeError, match="float16 input is not supported"):
        sbn(rng.standard_normal((4, 3)).astype(np.float16))
    with pytest.raises(ValueError, match=r"input must be \(N, 3, ...\)"):
        sbn(rng.standard_normal((4, 2)).astype(np.float32))
    with pytest.raises(ValueError, match="needs more than one value per channel"):
        sbn(rng.standard_normal((1, 3)).astype(np.float32))
    with pytest.raises(RuntimeError, match="call dnnkit.distributed.init"):
        SyncBatchNorm(3)(rng.standard_normal((4, 3)).astype(np.float32))
