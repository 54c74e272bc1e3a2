"""``DataParallel``: one model replica per rank, gradients averaged over the ranks in backward.

    import dnnkit.distributed as dist
    dist.init()                                   # RANK, WORLD_SIZE, ... (the launcher sets them)
    model = dist.DataParallel(build_model())      # rank 0's weights everywhere, checked alike
    opt = dnnkit.optim.SGD(model.parameters(), lr=0.1)
    for x, y in shard_of_the_batch:               # DistributedSampler picks this rank's share
        opt.zero_grad()
        loss_fn(model(x), y).backward()           # the all-reduces run during backward
        opt.step()                                # queued after them on the compute stream

Construction (collective: every rank constructs its DataParallel at the same point):

1. the model is compared across ranks through the store: every parameter's and buffer's
   name, shape, dtype and ``requires_grad`` (and their order, which the buckets follow); a
   difference raises ValueError on every rank naming the rank and the parameter;
2. parameters and buffers are broadcast from rank 0 (one NCCL group), so every replica
   starts from rank 0's weights whatever their seeds;
3. the gradients are planned into buckets of up to ``bucket_mb`` MiB, the first of each
   dtype up to ``first_bucket_mb``, and hooked (buckets.py: the all-reduce of a bucket
   starts, on a stream of its own, as soon as its gradients are complete; the compute stream
   waits for the last one before anything queued after backward).

Each forward in training mode first broadcasts the buffers from rank 0
(``broadcast_buffers``, as PyTorch's DDP: BatchNorm's running statistics stay those of rank
0; SyncBatchNorm computes its batch statistics over all ranks). The buffers are coalesced, as
DDP's ``_sync_buffers`` coalesces them: at construction each buffer's ``data`` becomes a view
of one flat array per dtype, so the broadcast is one NCCL call per dtype (one for a model
whose buffers are all float32: BatchNorm's running statistics), with no copy per step. It
runs at every training forward, not only when the buffers changed: BatchNorm changes them at
every training forward. ``broadcast_buffers=False`` leaves the buffers alone (each rank keeps
its own statistics; the buffers' arrays are not replaced). The loss each rank computes is its
shard's; the gradients are averaged (``avg``), so with equal shards and a mean loss the step
equals one process's step on the whole batch.

State: ``state_dict()`` keys are the model's with a ``module.`` prefix, as PyTorch's DDP;
save ``model.module.state_dict()`` on rank 0 for a checkpoint any replica can load.
"""

import contextlib
import json
import weakref

import numpy as np

from .. import arrays
from ..nn.module import Module
from . import group as group_mod
from .buckets import Reducer


def model_entries(module):
    """What every rank's model must agree on: [[kind, name, shape, dtype, requires_grad]] for
    each parameter, then each buffer, in registration order."""
    out = [["parameter", n, list(p.shape), p.dtype.name, bool(p.requires_grad)]
           for n, p in module.named_parameters()]
    out += [["buffer", n, list(b.shape), b.dtype.name, False]
            for n, b in module.named_buffers()]
    return out


def compare_models(reference, other, rank, ref_rank=0):
    """The first difference between rank ``rank``'s ``model_entries`` and the reference
    rank's, as a sentence naming the rank and the parameter; None when they agree."""
    ref = {(e[0], e[1]): e for e in reference}
    mine = {(e[0], e[1]): e for e in other}
    for key, e in mine.items():
        if key not in ref:
            return (f"rank {rank} has {e[0]} {e[1]!r} (shape {tuple(e[2])}) that rank "
                    f"{ref_rank} does not have")
    for key, r in ref.items():
        e = mine.get(key)
        if e is None:
            return f"rank {rank} lacks {r[0]} {r[1]!r} (shape {tuple(r[2])}) of rank {ref_rank}"
        for what, k in (("shape", 2), ("dtype", 3), ("requires_grad", 4)):
            if e[k] != r[k]:
                mv, rv = (tuple(e[k]), tuple(r[k])) if k == 2 else (e[k], r[k])
                return (f"{e[0]} {e[1]!r} has {what} {mv} on rank {rank} but {rv} on rank "
                        f"{ref_rank}")
    order_ref = [e[1] for e in reference]
    order = [e[1] for e in other]
    if order != order_ref:
        k = next(i for i, (a, b) in enumerate(zip(order, order_ref)) if a != b)
        return (f"rank {rank} registers its parameters in another order: #{k} is "
                f"{order[k]!r} there, {order_ref[k]!r} on rank {ref_rank} (the gradient "
                f"buckets follow this order)")
    return None


def check_same_model(group, entries, what="DataParallel"):
    """Compare ``entries`` (:func:`model_entries`) across ``group``'s ranks through its store:
    every rank sets its own, rank 0 compares them all and sets the verdict, every rank reads
    it. Raises ValueError on every rank when a rank differs, naming it and the parameter. A
    group without a store (one rank) has nothing to compare."""
    store = group.store
    if store is None:
        return
    tag = group.tag("dnnkit/model")
    t = group.timeout
    store.set(f"{tag}/{group.rank}", json.dumps(entries).encode())
    if group.rank == 0:
        problems = []
        for r in range(1, group.world_size):
            other = json.loads(store.get(f"{tag}/{r}", timeout=t, from_rank=r))
            diff = compare_models(entries, other, r)
            if diff:
                problems.append(diff)
        store.set(f"{tag}/verdict", "; ".join(problems).encode())
    verdict = store.get(f"{tag}/verdict", timeout=t, from_rank=0).decode()
    if verdict:
        raise ValueError(f"{what}: the model differs across ranks: {verdict}")


def broadcast_from_rank0(group, tensors, what):
    """Overwrite ``tensors`` with rank 0's values (one NCCL group, on the current stream);
    their versions are bumped."""
    tensors = [t for t in tensors if t.size]
    if group.world_size == 1 or not tensors:
        return
    s = arrays.as_stream(None)

    def queue(comm):
        with comm.group():
            for t in tensors:
                comm.broadcast(t.data, t.data, 0, s)
    group.run(what, queue, s)
    for t in tensors:
        t.bump_version()


class BufferBroadcast:
    """Rank 0's ``buffers`` (Tensors) to every rank, one NCCL broadcast per dtype on the
    current stream (module docstring): each buffer's ``data`` is made a view of its dtype's
    flat array (copied in). A buffer whose ``data`` was replaced since (assigned anew) is
    copied in again before the next broadcast (an identity check per buffer and step)."""

    WHAT = "DataParallel: broadcast of the buffers"

    def __init__(self, group, buffers):
        self.group = group
        self.buffers = [b for b in buffers if b.size]
        self.flats, self.views, self.retired = [], [], []
        self._pack()

    def _pack(self):
        s = arrays.as_stream(None)
        by_dtype = {}
        for b in self.buffers:
            by_dtype.setdefault(np.dtype(b.dtype), []).append(b)
        flats, old = [], []
        for dt, bufs in by_dtype.items():
            flat = arrays.cuda_empty((sum(int(b.size) for b in bufs),), dt, s)
            o = 0
            for b in bufs:
                n = int(b.size)
                view = arrays.reshaped(flat[o:o + n], b.shape)
                arrays.copy_into(view, b.data, s)
                old.append(b.data)
                b.data = view
                b.bump_version()
                o += n
            flats.append(flat)
        self.flats = flats
        self.views = [b.data for b in self.buffers]
        # the replaced arrays stay referenced until the next packing: the copies out of them
        # are queued, not done (one generation: a later copy is queued after this one)
        self.retired = old

    def __call__(self):
        if self.group.world_size == 1 or not self.buffers:
            return
        for b, v in zip(self.buffers, self.views):
            if b.data is not v:
                self._pack()
                break
        s = arrays.as_stream(None)
        flats = self.flats

        def queue(comm):
            if len(flats) == 1:
                comm.broadcast(flats[0], flats[0], 0, s)
                return
            with comm.group():
                for f in flats:
                    comm.broadcast(f, f, 0, s)
        self.group.run(self.WHAT, queue, s)
        for b in self.buffers:
            b.bump_version()


def _mib(what, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"DataParallel: {what} must be a number of MiB > 0; got {value!r}")
    return float(value)


class DataParallel(Module):
    """Data-parallel training of ``module`` over the process group (module docstring).
    ``bucket_mb``: the gradient buckets' size limit in MiB (default 25, PyTorch's);
    ``first_bucket_mb``: the first bucket's of each dtype (default 1, PyTorch's), so that
    the all-reduce starts early in backward; ``broadcast_buffers``: copy rank 0's buffers at
    each training forward (default True; the buffers' ``data`` become views of one flat
    array per dtype); ``group``: the process group (default: the one
    ``dnnkit.distributed.init()`` made). The buffers are those the model has when wrapped
    (as DDP's)."""

    def __init__(self, module, bucket_mb=25, *, first_bucket_mb=1, broadcast_buffers=True,
                 group=None):
        super().__init__()
        if not isinstance(module, Module):
            raise TypeError(f"DataParallel: module must be a dnnkit.nn.Module; got "
                            f"{type(module).__name__}")
        limit = int(_mib("bucket_mb", bucket_mb) * (1 << 20))
        first = int(_mib("first_bucket_mb", first_bucket_mb) * (1 << 20))
        g = group if group is not None else group_mod.current()
        g.check()
        self.module = module
        self.group = g
        self.bucket_mb, self.first_bucket_mb = bucket_mb, first_bucket_mb
        self.broadcast_buffers = bool(broadcast_buffers)
        check_same_model(g, model_entries(module))
        self.buffer_sync = (BufferBroadcast(g, module.buffers())
                            if self.broadcast_buffers and g.world_size > 1 else None)
        broadcast_from_rank0(g, module.parameters() + module.buffers(),
                             "DataParallel: broadcast of the model")
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad and p.size]
        self.reducer = Reducer(g, [p for _, p in named], [n for n, _ in named], limit,
                               max(1, first))
        # the hooks hold the reducer, not this module: they go when the wrapper goes
        weakref.finalize(self, self.reducer.close)

    def close(self):
        """Unhook the parameters (the wrapped model trains alone again, or is wrapped anew);
        done when the DataParallel is garbage-collected, too."""
        self.reducer.close()

    def forward(self, *args, **kw):
        self.group.check()
        self.reducer.prepare()
        if self.training and self.buffer_sync is not None:
            self.buffer_sync()
        return self.module(*args, **kw)

    @contextlib.contextmanager
    def no_sync(self):
        """Backward calls inside accumulate gradients locally without all-reducing them
        (gradient accumulation over several micro-batches); the first backward outside
        reduces the accumulated sums."""
        saved, self.reducer.sync = self.reducer.sync, False
        try:
            yield
        finally:
            self.reducer.sync = saved

    @property
    def buckets(self):
        """The gradient buckets in launch order (buckets.Bucket: members, sizes, dtype)."""
        return list(self.reducer.buckets)

    def extra_repr(self):
        return (f"world_size={self.group.world_size}, bucket_mb={self.bucket_mb}, "
                f"first_bucket_mb={self.first_bucket_mb}, buckets={len(self.reducer.buckets)}")
