"""DistributedSampler against PyTorch's documented algorithm (torch.utils.data.distributed):
exact index sets without shuffling (padding by wrapping round, drop_last cutting the tail,
every world_size-th index from the rank), and with shuffling the same structure over one
permutation per seed and epoch, the same on every rank."""

import math

import numpy as np
import pytest

from dnnkit.distributed import DistributedSampler


def torch_reference(n, world, rank, shuffle, seed, epoch, drop_last, perm=None):
    """PyTorch's DistributedSampler.__iter__, line for line, with ``perm`` standing for
    torch.randperm(n, generator seeded seed + epoch)."""
    if drop_last and n % world != 0:
        num_samples = math.ceil((n - world) / world)
    else:
        num_samples = math.ceil(n / world)
    total_size = num_samples * world
    indices = list(perm) if shuffle else list(range(n))
    if not drop_last:
        padding_size = total_size - len(indices)
        if padding_size <= len(indices):
            indices += indices[:padding_size]
        else:
            indices += (indices * math.ceil(padding_size / len(indices)))[:padding_size]
    else:
        indices = indices[:total_size]
    assert len(indices) == total_size
    return indices[rank:total_size:world]


@pytest.mark.parametrize("n,world,drop_last,want", [
    (10, 4, False, [[0, 4, 8], [1, 5, 9], [2, 6, 0], [3, 7, 1]]),
    (10, 4, True, [[0, 4], [1, 5], [2, 6], [3, 7]]),
    (8, 4, False, [[0, 4], [1, 5], [2, 6], [3, 7]]),
    (2, 5, False, [[0], [1], [0], [1], [0]]),          # padding wraps round more than once
    (3, 5, True, [[], [], [], [], []]),
    (7, 1, False, [[0, 1, 2, 3, 4, 5, 6]]),
])
def test_exact_indices_without_shuffle(n, world, drop_last, want):
    got = [list(DistributedSampler(n, rank=r, world_size=world, shuffle=False,
                                   drop_last=drop_last)) for r in range(world)]
    assert got == want
    assert got == [torch_reference(n, world, r, False, 0, 0, drop_last) for r in range(world)]
    assert {len(DistributedSampler(n, rank=r, world_size=world, shuffle=False,
                                   drop_last=drop_last)) for r in range(world)} == \
        {len(want[0])}


@pytest.mark.parametrize("n,world,drop_last", [(10, 4, False), (10, 4, True), (17, 3, False),
                                               (5, 8, False), (64, 8, True)])
def test_shuffled_indices_follow_the_same_rules(n, world, drop_last):
    seed, epoch = 7, 3
    samplers = [DistributedSampler(list(range(n)), rank=r, world_size=world, seed=seed,
                                   drop_last=drop_last) for r in range(world)]
    for s in samplers:
        s.set_epoch(epoch)
    perm = np.random.default_rng(seed + epoch).permutation(n)
    got = [list(s) for s in samplers]
    assert got == [torch_reference(n, world, r, True, seed, epoch, drop_last, perm)
                   for r in range(world)]
    flat = sum(got, [])
    if drop_last:
        assert len(set(flat)) == len(flat)          # disjoint, the tail dropped
    else:
        assert set(flat) == set(range(n))           # every index, a few twice


def test_epochs_and_seeds():
    a = DistributedSampler(50, rank=0, world_size=2, seed=1)
    b = DistributedSampler(50, rank=0, world_size=2, seed=1)
    first = list(a)
    assert first == list(b) and first == list(a)        # no set_epoch: the same order
    a.set_epoch(1)
    assert list(a) != first
    b.set_epoch(1)
    assert list(a) == list(b)
    assert list(DistributedSampler(50, rank=0, world_size=2, seed=2)) != first
    assert sorted(first) != first                        # shuffled


def test_defaults_without_a_process_group():
    s = DistributedSampler(5)
    assert (s.rank, s.world_size) == (0, 1) and len(s) == 5
    assert sorted(s) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("kw,message", [
    (dict(n=-1), "n .* must be an int >= 0"),
    (dict(n=2.5), "n .* must be an int >= 0"),
    (dict(n=4, world_size=0), "world_size must be an int >= 1"),
    (dict(n=4, world_size=2, rank=2), r"rank must be an int in \[0, 2\)"),
    (dict(n=4, world_size=2, rank=-1), r"rank must be an int in \[0, 2\)"),
    (dict(n=4, seed=-3), "seed must be an int >= 0"),
])
def test_errors(kw, message):
    with pytest.raises(ValueError, match="DistributedSampler: " + message):
        DistributedSampler(**kw)
    with pytest.raises(ValueError, match="epoch must be an int >= 0"):
        DistributedSampler(4).set_epoch(-1)
