"""``DistributedSampler``: each rank's share of a dataset's indices, PyTorch's semantics.

For a dataset of ``n`` items over ``world_size`` ranks, in an epoch:

1. the indices ``0 .. n-1``, permuted when ``shuffle`` (the same permutation on every rank:
   NumPy's ``default_rng(seed + epoch).permutation(n)``; PyTorch draws ``torch.randperm`` from
   a generator seeded alike, so the two libraries' orders differ, everything else is equal);
2. made a multiple of ``world_size``: without ``drop_last``, the first indices repeated at
   the end (wrapping round as often as needed: every rank gets ``ceil(n / world_size)``);
   with ``drop_last``, the tail cut off (every rank gets ``floor(n / world_size)``);
3. rank r takes every ``world_size``-th index from position r.

Call :meth:`set_epoch` before each epoch: without it every epoch repeats the first one's
order.
"""

import math
import numbers

import numpy as np

from . import group as group_mod


def _count(name, value, low):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        raise ValueError(f"DistributedSampler: {name} must be an int >= {low}; got {value!r}")
    return int(value)


class DistributedSampler:
    """``DistributedSampler(n, rank=None, world_size=None, shuffle=True, seed=0,
    drop_last=False)``: iterating gives this rank's indices for the current epoch (module
    docstring); ``len()`` is their number. ``n``: the dataset's length, or a dataset (its
    ``len()``). ``rank``/``world_size``: default the process group's (rank 0 of 1 without
    one)."""

    def __init__(self, n, rank=None, world_size=None, shuffle=True, seed=0, drop_last=False):
        if not isinstance(n, numbers.Integral) and hasattr(n, "__len__"):
            n = len(n)
        self.n = _count("n (the dataset's length)", n, 0)
        self.world_size = _count("world_size", group_mod.get_world_size()
                                 if world_size is None else world_size, 1)
        self.rank = group_mod.get_rank() if rank is None else rank
        if isinstance(self.rank, bool) or not isinstance(self.rank, numbers.Integral) or \
                not 0 <= self.rank < self.world_size:
            raise ValueError(f"DistributedSampler: rank must be an int in [0, "
                             f"{self.world_size}); got {self.rank!r}")
        self.rank = int(self.rank)
        self.shuffle = bool(shuffle)
        self.seed = _count("seed", seed, 0)
        self.drop_last = bool(drop_last)
        self.epoch = 0
        if self.drop_last and self.n % self.world_size:
            self.num_samples = math.ceil((self.n - self.world_size) / self.world_size)
        else:
            self.num_samples = math.ceil(self.n / self.world_size)
        self.total_size = self.num_samples * self.world_size

    def set_epoch(self, epoch):
        """Use the permutation of epoch ``epoch`` (seed + epoch) from now on."""
        self.epoch = _count("epoch", epoch, 0)

    def indices(self):
        """This rank's indices for the current epoch, a NumPy int64 array."""
        if self.shuffle:
            order = np.random.default_rng(self.seed + self.epoch).permutation(self.n)
        else:
            order = np.arange(self.n)
        if not self.drop_last:
            pad = self.total_size - self.n
            if pad and self.n:
                order = np.concatenate([order, np.resize(order, pad)])
        else:
            order = order[:self.total_size]
        return order[self.rank:self.total_size:self.world_size].astype(np.int64)

    def __iter__(self):
        return iter(self.indices().tolist())

    def __len__(self):
        return self.num_samples

    def __repr__(self):
        return (f"DistributedSampler(n={self.n}, rank={self.rank}, world_size="
                f"{self.world_size}, shuffle={self.shuffle}, seed={self.seed}, drop_last="
                f"{self.drop_last}, epoch={self.epoch})")
