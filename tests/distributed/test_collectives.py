"""The public collectives with two ranks in one process (tests/distributed/fakes.py) on the
simulator: values against NumPy, shapes, Tensors in and out, in place, the argument errors.
(The same checks on NCCL and two GPUs: tests/distributed/test_gpu.py.)"""

import numpy as np
import pytest

import dnnkit
import dnnkit.distributed as dist

from .fakes import run_pair


def data(rank, shape=(4, 3), dtype=np.float32):
    return (np.arange(np.prod(shape)).reshape(shape) * (rank + 1) - 5).astype(dtype)


@pytest.mark.parametrize("op", ["sum", "avg", "max", "min", "prod"])
def test_all_reduce(op):
    def fn(rank, g):
        x = dnnkit.tensor(data(rank))
        v = x.version
        assert dist.all_reduce(x, op, group=g) is x and x.version == v + 1
        return x.numpy()
    both = np.stack([data(0), data(1)])
    want = {"sum": both.sum(0), "avg": both.mean(0), "max": both.max(0), "min": both.min(0),
            "prod": both.prod(0)}[op]
    for got in run_pair(fn):
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_broadcast_all_gather_reduce_scatter():
    def fn(rank, g):
        b = dnnkit.tensor(data(rank, (2, 3), np.float64)).data       # a plain device array
        assert dist.broadcast(b, src=1, group=g) is b
        gathered = dist.all_gather(dnnkit.tensor(data(rank, (2, 3))), group=g)
        scattered = dist.reduce_scatter(dnnkit.tensor(data(rank, (4, 3))), "sum", group=g)
        scalar = dist.all_gather(dnnkit.tensor(np.array(float(rank))), group=g)
        return b.copy_to_host(), gathered, scattered, scalar.numpy()
    res = run_pair(fn)
    total = data(0, (4, 3)) + data(1, (4, 3))
    for rank, (b, gathered, scattered, scalar) in enumerate(res):
        np.testing.assert_array_equal(b, data(1, (2, 3), np.float64))
        assert isinstance(gathered, dnnkit.Tensor) and gathered.shape == (4, 3)
        np.testing.assert_array_equal(gathered.numpy(), np.concatenate([data(0, (2, 3)),
                                                                       data(1, (2, 3))]))
        assert scattered.shape == (2, 3)
        np.testing.assert_array_equal(scattered.numpy(), total[2 * rank:2 * rank + 2])
        np.testing.assert_array_equal(scalar, [0.0, 1.0])


def test_errors():
    def fn(rank, g):
        x = dnnkit.tensor(data(rank, (3, 2)))
        with pytest.raises(ValueError, match="must divide into 2 equal pieces"):
            dist.reduce_scatter(x, group=g)
        with pytest.raises(ValueError, match=r"src must be a rank in \[0, 2\); got 2"):
            dist.broadcast(x, 2, group=g)
        with pytest.raises(TypeError, match="dtype bool has no NCCL type"):
            dist.all_reduce(dnnkit.tensor(np.zeros(3, bool)), group=g)
        return True
    assert run_pair(fn) == [True, True]
