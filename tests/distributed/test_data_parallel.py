"""Bucket planning and DataParallel on the simulator: plan_buckets (ready order, size limit,
the smaller first bucket, dtypes, a parameter over the limit), the reducer's launches during
backward (a phantom second rank), the buffers' coalesced broadcast (one NCCL call per dtype,
the buffers views of it), a training step through NcclComm on a fake binding making exactly
its collectives' calls and no polling, two ranks in one process (tests/distributed/fakes.py)
matching one process on the whole batch and sharing rank 0's buffers, re-planning by the
observed order, no_sync, unused parameters, and the model comparison. Tiny float64 models:
the simulator runs one Python thread per CUDA thread."""

import numpy as np
import pytest

import dnnkit
from dnnkit import nn, optim
from dnnkit.distributed import DataParallel, DistributedError
from dnnkit.distributed import nccl as nccl_mod
from dnnkit.distributed.buckets import plan_buckets
from dnnkit.distributed.data_parallel import BufferBroadcast, compare_models, model_entries
from tests.conftest import backend_params

from .fakes import FakeNcclLib, PhantomComm, group_of, run_pair

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


def test_plan_the_first_bucket_of_each_dtype_is_smaller():
    specs = [(4, F64)] * 5                     # 32 bytes each
    bs = plan_buckets(specs, [4, 3, 2, 1, 0], 96, first_bytes=40)
    assert members(bs) == [[4], [3, 2, 1], [0]]
    assert members(plan_buckets(specs, [4, 3, 2, 1, 0], 64, first_bytes=1000)) == \
        [[4, 3], [2, 1], [0]]                  # never above the limit
    specs = [(4, F64), (4, F64), (8, F32), (8, F32), (8, F32)]
    bs = plan_buckets(specs, [4, 3, 1, 2, 0], 64, first_bytes=32)
    # float32: [4] (32 bytes; 3 would pass 32), then [3, 2]; float64: [1] then [0]
    assert members(bs) == [[4], [1], [3, 2], [0]]
    assert [b.dtype for b in bs] == [F32, F64, F32, F64]


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
        with pytest.raises(ValueError, match="first_bucket_mb must be a number of MiB > 0"):
            DataParallel(mlp(0), first_bucket_mb=bad, group=g)


def test_the_first_bucket_is_small():
    """Ready order 2.bias (16 bytes), 2.weight (64), 0.bias (32), 0.weight (96): a first
    bucket of at most 16 bytes, then one of up to 200."""
    dp = DataParallel(mlp(0), bucket_mb=200 / 2**20, first_bucket_mb=16 / 2**20,
                      group=group_of(PhantomComm()))
    assert members(dp.buckets) == [[3], [2, 1, 0]]
    assert "first_bucket_mb=" in repr(dp)
    dp = DataParallel(mlp(0), group=group_of(PhantomComm()))
    assert members(dp.buckets) == [[3, 2, 1, 0]]        # 208 bytes: under 1 MiB


# ---------------------------------------------------------------- the buffers

def bn_mlp(seed):
    rng = np.random.default_rng(seed)
    m = nn.Sequential(nn.Linear(3, 4, dtype="float64"), nn.BatchNorm1d(4, dtype="float64"),
                      nn.Tanh(), nn.Linear(4, 2, dtype="float64"))
    m.load_state_dict({k: (np.abs(rng.standard_normal(v.shape)) + 0.5).astype(v.dtype)
                       if v.ndim else v for k, v in m.state_dict().items()})
    return m


def test_buffers_are_broadcast_as_one_flat_array_per_dtype():
    comm = PhantomComm()
    g = group_of(comm)
    vals = [np.arange(3.0), np.arange(2, dtype=np.float32), np.zeros(0), np.ones((2, 2))]
    bufs = [dnnkit.tensor(v) for v in vals]
    versions = [b.version for b in bufs]
    sync = BufferBroadcast(g, bufs)
    assert comm.calls == []                           # packing queues no collective
    for b, v in zip(bufs, vals):
        np.testing.assert_array_equal(b.numpy(), v)   # values kept; now views of the flats
    assert [f.size for f in sync.flats] == [7, 2]
    sync()
    assert comm.calls == [("broadcast", 7, 0, None), ("broadcast", 2, 0, None)]
    assert all(b.version > v for b, v in zip(bufs[:2] + bufs[3:], versions))
    bufs[0].data = dnnkit.tensor(np.full(3, 5.0)).data          # replaced: packed again
    comm.calls.clear()
    sync()
    assert comm.calls == [("broadcast", 7, 0, None), ("broadcast", 2, 0, None)]
    np.testing.assert_array_equal(sync.flats[0].copy_to_host(), [5, 5, 5, 1, 1, 1, 1])


def test_a_training_forward_broadcasts_the_buffers_once(rng):
    comm = PhantomComm()
    model = bn_mlp(0)
    dp = DataParallel(model, group=group_of(comm))
    bn = model[1]
    assert len(dp.buffer_sync.flats) == 1
    x = dnnkit.tensor(rng.standard_normal((5, 3)))
    comm.calls.clear()
    loss_of(dp, x.numpy(), np.zeros((5, 2))).backward()
    assert [c[:3] for c in comm.calls] == [("broadcast", 8, 0), ("all_reduce", 34, "avg")]
    dp.eval()
    comm.calls.clear()
    dp(x)
    assert comm.calls == []                            # eval: no broadcast
    running = bn.running_mean.data
    kept = DataParallel(bn_mlp(0), broadcast_buffers=False, group=group_of(comm))
    assert kept.buffer_sync is None
    comm.calls.clear()
    loss_of(kept, x.numpy(), np.zeros((5, 2))).backward()
    assert [c[0] for c in comm.calls] == ["all_reduce"]
    assert bn.running_mean.data is running


def test_a_step_through_nccl_makes_only_its_collectives_calls(monkeypatch, rng):
    """NcclComm on a fake binding under DataParallel: a training step is one broadcast (the
    buffers) and one all_reduce per bucket, each one call of the binding, and not one
    ncclCommGetAsyncError: no host polling per collective."""
    lib = FakeNcclLib()
    monkeypatch.setattr(nccl_mod, "load", lambda: lib)
    monkeypatch.delenv("NCCL_COMM_BLOCKING", raising=False)
    comm = nccl_mod.NcclComm(0, 2, b"\x00" * 128, 5.0)
    dp = DataParallel(bn_mlp(0), bucket_mb=100 / 2**20, first_bucket_mb=16 / 2**20,
                      group=group_of(comm))
    assert len(dp.buckets) == 4
    opt = optim.SGD(dp.parameters(), lr=0.1)
    x, y = rng.standard_normal((5, 3)), rng.standard_normal((5, 2))
    for _ in range(2):
        lib.calls.clear()
        opt.zero_grad()
        loss_of(dp, x, y).backward()
        opt.step()
        assert lib.names() == ["broadcast"] + ["all_reduce"] * len(dp.buckets)
    dp(dnnkit.tensor(x))                               # re-planned by the observed order
    assert comm.busy == 0 and not comm.aborted


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


def test_two_ranks_share_rank_0s_buffers(rng):
    """Each rank's BatchNorm updates its running statistics with its own shard; the next
    training forward's broadcast makes them rank 0's on both."""
    x = rng.standard_normal((8, 3))

    def rank_fn(rank, g):
        dp = DataParallel(bn_mlp(rank), group=g)
        bn = dp.module[1]
        part = x[4 * rank:4 * rank + 4]
        loss_of(dp, part, np.zeros((4, 2))).backward()
        before = bn.running_mean.numpy().copy()
        dp.buffer_sync()
        return before, bn.running_mean.numpy().copy(), bn.running_var.numpy().copy()

    (b0, m0, v0), (b1, m1, v1) = run_pair(rank_fn)
    assert not np.allclose(b0, b1)                     # different shards
    np.testing.assert_array_equal(m1, m0)
    np.testing.assert_array_equal(v1, v0)
    np.testing.assert_array_equal(m0, b0)
