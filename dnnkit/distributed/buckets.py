"""Gradient buckets: which parameters are all-reduced together, and the reducer that does it
while backward runs.

Planning (:func:`plan_buckets`): parameters are taken in the order their gradients are
expected to be ready -- at first the reverse of their registration order (backward meets the
last layer first), after the first step the order observed -- and packed greedily, one
bucket per dtype at a time, until the next one would pass the size limit (a parameter larger
than the limit gets a bucket of its own). The first bucket of each dtype has a smaller limit
(1 MiB by default, PyTorch DDP's ``_DEFAULT_FIRST_BUCKET_BYTES``): the last layers' gradients,
ready first, start their all-reduce while most of backward is still to run, instead of
waiting until 25 MiB of gradients are done. Buckets are launched in the order their last
member becomes ready, and only in that order: every rank must queue its NCCL calls in the
same order.

Per step (:class:`Reducer`), on the host, from each parameter's post-accumulate hook
(``Tensor.register_post_accumulate_grad_hook``: its gradient of this backward is complete):

    bucket k complete, buckets < k launched ->
        comm stream waits for the compute stream (an event: the gradients' producers)
        copy each gradient into the bucket's flat buffer   (cuMemcpyDtoDAsync, comm stream)
        all_reduce(buffer, avg)                             (NCCL, comm stream)
        p.grad = a view of p's slice of the buffer          (no copy back)
    last bucket launched ->
        compute stream waits for the comm stream (an event): the optimizer step, queued
        after backward, reads the averaged gradients

The rest of backward keeps running on the compute stream meanwhile; the host never waits.
Host work per bucket: one event wait each way, one copy call per member (the gradients are
new arrays each step: the optimizers' ``zero_grad`` sets them to None, and autograd's first
accumulation takes the incoming array), one NCCL call, and the members' ``grad`` set to
Tensors made once per plan (views of the buffer); no polling, no per-step allocation.
The gradient arrays read by the comm stream are kept referenced until the compute stream's
wait is queued: their memory returns to the caching pool only when no later work on the
compute stream can run before the copies (the pool reuses a block on the stream it was
made on).

After a step ``p.grad`` is a view of the bucket (PyTorch's ``gradient_as_bucket_view``): the
next step overwrites it; copy a gradient to keep it.
"""

import weakref

import numpy as np

from .. import arrays, device
from ..tensors import Tensor
from .env import DistributedError


class Bucket:
    """Parameters reduced together: ``members`` (parameter indices, in buffer order),
    ``offsets`` and ``sizes`` (elements) in the flat buffer of ``total`` elements of
    ``dtype``."""

    __slots__ = ("index", "dtype", "members", "offsets", "sizes", "total")

    def __init__(self, index, dtype, members, sizes):
        self.index, self.dtype, self.members = index, np.dtype(dtype), tuple(members)
        self.sizes = tuple(sizes)
        self.offsets = tuple(int(v) for v in np.cumsum((0,) + self.sizes[:-1]))
        self.total = int(sum(self.sizes))

    @property
    def nbytes(self):
        return self.total * self.dtype.itemsize

    def __repr__(self):
        return (f"Bucket({self.index}, {self.dtype.name}, members={list(self.members)}, "
                f"{self.nbytes} bytes)")


def plan_buckets(specs, order, limit_bytes, first_bytes=None):
    """Buckets for parameters ``specs`` ([(number of elements, dtype)] by parameter index),
    filled in ``order`` (every index once) up to ``limit_bytes`` each, the first of each
    dtype up to ``first_bytes`` (default: ``limit_bytes``; module docstring); returns them
    in launch order."""
    order = list(order)
    if sorted(order) != list(range(len(specs))):
        raise ValueError(f"plan_buckets: order must list every parameter index once; got "
                         f"{order}")
    first = limit_bytes if first_bytes is None else min(first_bytes, limit_bytes)
    closed, open_ = [], {}                 # dtype -> [members, bytes, limit]
    for i in order:
        n, dt = specs[i]
        dt = np.dtype(dt)
        nbytes = int(n) * dt.itemsize
        cur = open_.get(dt)
        if cur is not None and cur[0] and cur[1] + nbytes > cur[2]:
            closed.append((dt, cur[0]))
            cur = open_[dt] = [[], 0, limit_bytes]
        if cur is None:
            cur = open_[dt] = [[], 0, first]
        cur[0].append(i)
        cur[1] += nbytes
    closed += [(dt, cur[0]) for dt, cur in open_.items() if cur[0]]
    pos = {i: k for k, i in enumerate(order)}
    closed.sort(key=lambda c: pos[c[1][-1]])     # ready when its last member is
    return [Bucket(k, dt, members, [int(specs[i][0]) for i in members])
            for k, (dt, members) in enumerate(closed)]


def _comm_stream():
    """(Numba stream, raw handle) of a new non-blocking stream for the reductions; the
    simulator's stand-in (it runs every call at once) on the simulator."""
    if device.simulator():
        return device.numba_cuda().stream(), 0
    ptr = device.create_stream()
    return arrays.external(ptr), ptr


def _destroy_stream(ptr):
    try:
        device.destroy_stream(ptr)
    except Exception:  # noqa: BLE001 - at exit the context may be gone already
        pass


class Reducer:
    """The bucketed all-reduce of ``params``' gradients (averaged over ``group``'s ranks),
    started by their post-accumulate hooks. ``names``: the parameters' names, for errors."""

    def __init__(self, group, params, names, limit_bytes, first_bytes=None):
        self.group, self.params, self.names = group, list(params), list(names)
        self.limit, self.first = limit_bytes, first_bytes
        self.index = {id(p): i for i, p in enumerate(self.params)}
        self.specs = [(p.size, p.dtype) for p in self.params]
        self.stream, ptr = _comm_stream()
        self.stream_ptr = ptr
        if ptr:
            weakref.finalize(self, _destroy_stream, ptr)
        self.sync = True
        self.observed = []                 # the first step's ready order
        self.replan = None                 # "pending" after the first step, then "done"
        self.launched = []                 # bucket indices launched so far in this step
        self.launched_last = []            # ... and in the last complete step
        self._plan(list(range(len(self.params)))[::-1])
        self._reset()
        self.handles = [p.register_post_accumulate_grad_hook(self._ready)
                        for p in self.params]

    def _plan(self, order):
        self.buckets = plan_buckets(self.specs, order, self.limit, self.first)
        self.bucket_of = {}
        s = arrays.as_stream(None)
        self.buffers, self.views, self.grads, self.whats = [], [], [], []
        for b in self.buckets:
            buf = arrays.cuda_empty((b.total,), b.dtype, s)
            self.buffers.append(buf)
            views = [arrays.reshaped(buf[o:o + n], self.params[i].shape)
                     for i, o, n in zip(b.members, b.offsets, b.sizes)]
            self.views.append(views)
            # (parameter, its view, the Tensor its grad becomes): made once, reused each step
            self.grads.append([(self.params[i], v, Tensor(v)) for i, v in zip(b.members, views)])
            self.whats.append(f"DataParallel bucket {b.index} ({b.nbytes} bytes)")
            for i in b.members:
                self.bucket_of[i] = b.index

    def _reset(self):
        self.ready = [False] * len(self.params)
        self.left = [len(b.members) for b in self.buckets]
        self.next = 0
        self.held = []
        self.started = False

    def close(self):
        for h in self.handles:
            h.remove()

    # ------------------------------------------------------------ between steps

    def prepare(self):
        """Before a forward: an incomplete last step is an error (parameters that got no
        gradient); after the first complete step, the buckets follow the order observed."""
        if self.started:
            missing = [self.names[i] for i, r in enumerate(self.ready) if not r]
            self._reset()
            raise DistributedError(
                f"DataParallel: the last backward gave no gradient to {len(missing)} "
                f"parameter(s) ({', '.join(missing[:8])}{', ...' if len(missing) > 8 else ''})"
                f", so their buckets were never all-reduced and the step used un-averaged "
                f"gradients. Every parameter that requires grad must get one each step: "
                f"freeze unused ones (requires_grad_(False)) before wrapping the model")
        if self.replan == "pending":
            self.replan = "done"
            order = self.observed
            if self.group.store is not None:        # rank 0's order, so every rank agrees
                key = self.group.tag("dnnkit/bucket-order")
                if self.group.rank == 0:
                    self.group.store.set(key, " ".join(map(str, order)).encode())
                order = [int(v) for v in self.group.store.get(key, timeout=self.group.timeout,
                                                              from_rank=0).split()]
            old = [b.members for b in self.buckets]
            if [b.members for b in plan_buckets(self.specs, order, self.limit,
                                                self.first)] != old:
                self._plan(order)
                self._reset()

    # ------------------------------------------------------------ during backward

    def _ready(self, p):
        if not self.sync:
            return
        i = self.index[id(p)]
        if self.ready[i]:
            raise DistributedError(
                f"DataParallel: parameter {self.names[i]} got a second gradient before its "
                f"bucket was all-reduced (a backward before the previous one reduced every "
                f"bucket?); use DataParallel.no_sync() for the backward calls that only "
                f"accumulate")
        self.ready[i] = self.started = True
        if self.replan is None:
            self.observed.append(i)
        self.left[self.bucket_of[i]] -= 1
        while self.next < len(self.buckets) and not self.left[self.next]:
            self._launch(self.buckets[self.next])
            self.next += 1
        if self.next == len(self.buckets):
            self._finish()

    def _launch(self, b):
        g = self.group
        g.check()
        k, stream = b.index, self.stream
        device.stream_wait(self.stream_ptr, device.stream_pointer(arrays.as_stream(None)))
        buf, members, held = self.buffers[k], self.grads[k], self.held
        for p, view, _ in members:
            grad = p.grad.data
            arrays.copy_into(view, grad, stream)
            held.append(grad)
        g.run(self.whats[k], lambda c: c.all_reduce(buf, buf, "avg", stream), stream)
        for p, _, t in members:
            p.grad = t
        self.launched.append(k)

    def _finish(self):
        device.stream_wait(device.stream_pointer(arrays.as_stream(None)), self.stream_ptr)
        if self.replan is None:
            self.replan = "pending"
        self.launched_last = self.launched
        self.launched = []
        self._reset()
