"""Bucket planning and DataParallel on the simulator: plan_buckets (ready order, size limit,
dtypes, a parameter over the limit), the reducer's launches during backward (a phantom second
rank), two ranks in one process (tests/distributed/fakes.py) matching one process on the whole
batch, re-planning by the observed order, no_sync, unused parameters, and the model
comparison. Tiny float64 models: the simulator runs one Python thread per CUDA thread."""

import numpy as np
import pytest

import dnnkit
from dnnkit import nn, optim
from dnnkit.distributed import DataParallel, DistributedError
from dnnkit.distributed.buckets import plan_buckets
from dnnkit.distributed.data_parallel import compare_models, model_entries
from tests.conftest import backend_params

from .fakes import PhantomComm, group_of, run_pair

F64, F32 = np.dtype(np.float64), np.dtype(np.float32)


# ---------------------------------------------------------------- planning

def members(buckets):
    return [list(b.members) for b in buckets]


def test_plan_fills_in_ready_order_up_to_the_limit():
    specs = [(4, F64)] * 5                     # 32 bytes each
    bs = plan_buckets(specs, [4, 3, 2, 1, 0], 64)
    assert members(bs) == [[4, 3], [2, 1], [0]]
    assert [(b.offsets, b.sizes, b.total, b.nbytes) for b in bs] == [
        ((0, 4), (4, 4), 8, 64), ((0, 4), (4, 4), 8, 64), ((0,), (4,), 4, 32)]
    assert members(plan_buckets(specs, [0, 2, 4, 1, 3], 96)) == [[0, 2, 4], [1, 3]]
    assert members(plan_buckets(specs, [4, 3, 2, 1, 0], 1 << 20)) == [[4, 3, 2, 1, 0]]


def test_plan_a_parameter_over_the_limit_and_dtypes():
    specs = [(2, F64), (100, F64), (2, F64), (8, F32), (8, F32)]
    bs = plan_buckets(specs, [4, 3, 2, 1, 0], 40)
    # float32: [4] (32 bytes), then [3] (adding 3 passes 40); float64: [2], [1] alone (800
    # bytes > limit), [0]; launched when their last member is ready
    assert members(bs) == [[4], [3], [2], [1], [0]]
    assert [b.dtype for b in bs] == [F32, F32, F64, F64, F64]
    bs = plan_buckets(specs, [4, 2, 3, 0, 1], 1000)
    assert members(bs) == [[4, 3], [2, 0, 1]]        # one open bucket per dtype
    with pytest.raises(ValueError, match="every parameter index once"):
        plan_buckets(specs, [0, 1, 2, 3], 40)


# ---------------------------------------------------------------- one rank and a phantom

def mlp(seed, dtype="float64"):
    rng = np.random.default_rng(seed)
    m = nn.Sequential(nn.Linear(3, 4, dtype=dtype), nn.Tanh(), nn.Linear(4, 2, dtype=dtype))
    m.load_state_dict({k: rng.standard_normal(v.shape).astype(v.dtype)
                       for k, v in m.state_dict().items()})
    return m


def loss_of(model, x, y):
    d = model(dnnkit.tensor(x)) - dnnkit.tensor(y)
    return (d * d).mean()


def test_buckets_are_reduced_during_backward_and_averaged(rng):
    """Partner gradients 3x ours: every gradient comes out 2x the local one. The last
    layer's bucket is all-reduced while the first layer has no gradient yet."""
    model = mlp(0)
    first = model[0].weight
    comm = PhantomComm(3.0, probe=lambda: first.grad is None)
    dp = DataParallel(model, bucket_mb=16 / 2**20, group=group_of(comm))   # 16 bytes
    assert [c[0] for c in comm.calls] == ["broadcast"] * 4         # the model, from rank 0
    assert members(dp.buckets) == [[3], [2], [1], [0]]
    x, y = rng.standard_normal((5, 3)), rng.standard_normal((5, 2))
    ref = mlp(0)
    loss_of(ref, x, y).backward()
    comm.calls.clear()
    loss_of(dp, x, y).backward()
    assert [c[:3] for c in comm.calls] == [("all_reduce", 2, "avg"), ("all_reduce", 8, "avg"),
                                           ("all_reduce", 4, "avg"), ("all_reduce", 12, "avg")]
    # the last layer's two buckets go before the first layer's gradients exist (one linear
    # node makes a layer's weight and bias gradients together)
    assert [c[3] for c in comm.calls] == [True, True, False, False]
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        np.testing.assert_allclose(p.grad.numpy(), 2.0 * q.grad.numpy(), rtol=1e-13,
                                   err_msg=name)
    assert dp.reducer.launched_last == [0, 1, 2, 3]


def test_unused_parameter_and_no_sync(rng):
    class TwoHeads(nn.Module):
        def __init__(self):
            super().__init__()
            self.used, self.unused = nn.Linear(3, 2, dtype="float64"), \
                nn.Linear(3, 2, dtype="float64")

        def forward(self, x):
            return self.used(x)

    comm = PhantomComm(1.0)
    dp = DataParallel(TwoHeads(), group=group_of(comm))
    x, y = rng.standard_normal((4, 3)), rng.standard_normal((4, 2))
    loss_of(dp, x, y).backward()
    with pytest.raises(DistributedError, match=r"no gradient to 2 parameter\(s\) \(unused."
                                               r"weight, unused.bias\)"):
        dp(dnnkit.tensor(x))
    dp.close()                                      # unhooks the parameters
    dp.module.unused.requires_grad_(False)
    dp = DataParallel(dp.module, group=group_of(comm))
    dp.zero_grad()
    comm.calls.clear()
    with dp.no_sync():
        loss_of(dp, x, y).backward()
        loss_of(dp, x, y).backward()
    assert comm.calls == []                        # accumulated locally
    w = dp.module.used.weight
    two = w.grad.numpy().copy()
    loss_of(dp, x, y).backward()                   # reduces the sum of three
    assert len(comm.calls) == 1
    np.testing.assert_allclose(w.grad.numpy(), two * 1.5, rtol=1e-13)


def test_buckets_follow_the_observed_order_after_the_first_step(rng):
    class Reversed(nn.Module):
        """Registered a, b; used b then a: backward makes a's gradient first."""
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(2, 2, dtype="float64"), nn.Linear(2, 2, dtype="float64")

        def forward(self, x):
            return self.a(self.b(x))

    dp = DataParallel(Reversed(), bucket_mb=32 / 2**20, group=group_of(PhantomComm(1.0)))
    names = [n for n, _ in dp.module.named_parameters()]
    assert [[names[i] for i in m] for m in members(dp.buckets)] == \
        [["b.bias"], ["b.weight"], ["a.bias"], ["a.weight"]]
    x = rng.standard_normal((3, 2))
    dp(dnnkit.tensor(x)).sum().backward()
    assert dp.reducer.launched_last == [0, 1, 2, 3]   # in plan order (a's waited for b's)
    dp(dnnkit.tensor(x))                               # re-planned before this forward
    got = [[names[i] for i in m] for m in members(dp.buckets)]
    assert got[0][0].startswith("a.") and got[-1][0].startswith("b."), got


def test_compare_models_names_rank_and_parameter():
    a = model_entries(mlp(0))
    assert compare_models(a, model_entries(mlp(1)), 1) is None       # values do not matter
    assert compare_models(a, model_entries(mlp(0, "float32")), 2) == \
        "parameter '0.weight' has dtype float32 on rank 2 but float64 on rank 0"
    other = nn.Sequential(nn.Linear(3, 5, dtype="float64"), nn.Tanh(),
                          nn.Linear(5, 2, dtype="float64"))
    assert compare_models(a, model_entries(other), 1) == \
        "parameter '0.weight' has shape (5, 3) on rank 1 but (4, 3) on rank 0"
    assert compare_models(a, model_entries(nn.Sequential(nn.Linear(3, 4, dtype="float64"))),
                          3) == "rank 3 lacks parameter '2.weight' (shape (2, 4)) of rank 0"
    frozen = mlp(0)
    frozen[2].bias.requires_grad_(False)
    assert "'2.bias' has requires_grad False on rank 1 but True" in \
        compare_models(a, model_entries(frozen), 1)
    assert "registers its parameters in another order" in \
        compare_models(a, a[1:2] + a[:1] + a[2:], 1)


def test_arguments():
    g = group_of(PhantomComm())
    with pytest.raises(TypeError, match="module must be a dnnkit.nn.Module"):
        DataParallel(lambda x: x, group=g)
    for bad in (0, -1, "25", True):
        with pytest.raises(ValueError, match="bucket_mb must be a number of MiB > 0"):
            DataParallel(mlp(0), bucket_mb=bad, group=g)


# ---------------------------------------------------------------- two ranks in one process

@pytest.mark.parametrize("backend", backend_params())
def test_two_ranks_match_one_process_on_the_whole_batch(rng, backend):
    """Two replicas seeded differently (rank 0's weights broadcast), each on half the batch,
    three SGD steps: the parameters equal one model's trained on the whole batch."""
    x, y = rng.standard_normal((6, 3)), rng.standard_normal((6, 2))

    def rank_fn(rank, g):
        model = nn.convert(mlp(rank), backend)
        dp = DataParallel(model, bucket_mb=40 / 2**20, group=g)
        opt = optim.SGD(dp.parameters(), lr=0.1, momentum=0.9)
        part = slice(3 * rank, 3 * rank + 3)
        for _ in range(3):
            opt.zero_grad()
            loss_of(dp, x[part], y[part]).backward()
            opt.step()
        return dp.module.state_dict()

    got = run_pair(rank_fn)
    ref = nn.convert(mlp(0), backend)
    opt = optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    for _ in range(3):
        opt.zero_grad()
        loss_of(ref, x, y).backward()
        opt.step()
    for k, v in ref.state_dict().items():
        for rank in (0, 1):
            np.testing.assert_allclose(got[rank][k], v, rtol=1e-12, atol=1e-14,
                                       err_msg=f"rank {rank} {k}")
