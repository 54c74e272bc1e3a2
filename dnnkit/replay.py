"""Replays of a Numba implementation's call for repeated calls of one signature (dispatch's
memo), the runner of every Numba op that has none of its own.

A Numba implementation's host work -- the launch plan, the kernels and their geometry, the
scratch and output arrays it allocates, its copies and fills -- is a function of the call's
signature (shapes, strides, dtypes, plain arguments, flags, the device): no op reads device
data on the host. So the first call is recorded (``bind``): every array allocated
(dnnkit.memory), every kernel launched (dnnkit.launch) and every device copy and fill
(dnnkit.arrays), in order. Each array a launch, copy or output refers to is resolved, by its
device address, to a *source*: one of the call's input arrays or one of its allocations, at an
element offset. A later call of the signature then allocates arrays of the same shapes, writes
its sources' addresses into launches packed once (``launch.Prepared``) and launches them,
copies and fills as recorded, and returns its outputs in the recorded structure: an
allocation, an input, or a view of one. What it skips is the op's Python: argument
arithmetic, plans, views and the typing and packing of every kernel's arguments (the Numba
path of a convolution's filter gradient: an im2col, a GEMM and a reduction, each with a dozen
arguments).

An array no source holds was made before the call (a constant table, the accumulator
template): it is kept as it is. A call is not replayed (its runner is the implementation
itself) when an array cannot be resolved to one source alone (inputs that overlap, empty or
non-contiguous arrays, an offset not a whole element), when an output is neither a source nor
a whole view of one, when it returns anything but arrays and immutable values, when it made
a cuDNN call (a nested op on cuDNN: the handle reports it), or while another recording is under
way (a nested op call is recorded as part of its caller; it is recorded on a later call made
outside any recording). ``refused`` counts the reasons.

What the recording reads besides the signature is frozen into the replay: the flags (a change
clears the memo), the device, and module-level tunables of the kernels' launch plans, whose
setters clear the memo where they are public (ops/conv_tuning.settings, gemm's TENSOR_CORES);
after changing another module constant, call ``fastpath.invalidate()``.
"""

import collections
import threading

import numpy as np

from . import arrays, fastpath, launch, memory

_lock = threading.Lock()
_PLAIN = (str, int, float, bool, type(None), np.generic)


class Unreplayable(Exception):
    """A recorded call that cannot be replayed (module docstring)."""


class _Recorder:
    """What dnnkit.memory, dnnkit.launch and dnnkit.arrays report while a call runs, from the
    recording thread only."""

    def __init__(self):
        self.tid = threading.get_ident()
        self.allocs, self.events = [], []
        self.untracked_work = None

    def untracked(self, what):
        """Work the replay could not repeat was done (a cuDNN call of a nested op)."""
        if threading.get_ident() == self.tid:
            self.untracked_work = what

    def alloc(self, a, stream):
        if threading.get_ident() == self.tid:
            self.allocs.append((a, stream))

    def launch(self, kernel, grid, block, stream, args, shared):
        if threading.get_ident() == self.tid:
            self.events.append(("launch", kernel, grid, block, stream, args, shared))

    def copy(self, dst, src, stream):
        if threading.get_ident() == self.tid:
            self.events.append(("copy", dst, src, stream))

    def fill(self, a, stream):
        if threading.get_ident() == self.tid:
            self.events.append(("fill", a, stream))


def bind(fn, args):
    """A runner doing ``fn(*args)``'s work for later calls of this signature: it runs ``fn``
    now, recorded, and its first call with these same argument objects returns that result.
    ``args``: the implementation's arguments (its NamedTuple). None when another recording is
    under way, an argument is a per-call object (``fastpath.carried_type``: what it holds
    beyond its memo key may reach the kernels) or the call writes into a caller's array
    (``out``: whether it overlaps an input, which decides the implementation's way, is not in
    the signature); the runner calls ``fn`` itself when the call cannot be replayed."""
    if any(fastpath.carried(a) for a in args) or getattr(args, "out", None) is not None:
        return None           # a forward's state (a dropout seed), or an in-place write
    return _record(fn, tuple(args)) or _Later(fn)


refused = collections.Counter()     # why calls were not replayed: {reason: count}


def _record(fn, args):
    """``bind``'s runner, or None while another recording is under way (a nested op's call,
    or another thread's)."""
    rec = _Recorder()
    with _lock:
        if memory.watch is not None or launch.watch is not None:
            return None
        memory.watch = launch.watch = rec
    try:
        out = fn(*args)
    finally:
        memory.watch = launch.watch = None
    try:
        run = Replay(rec, args, out)
    except Unreplayable as e:
        refused[str(e)] += 1
        run = _Plain(fn)
    run.first = (args, out)
    return run


class _Later:
    """The runner of a call made while another was recorded: ``fn`` itself, until a call
    outside any recording records one (kept here: the memo keeps this object)."""
    __slots__ = ("fn", "run")

    def __init__(self, fn):
        self.fn, self.run = fn, None

    def __call__(self, *args):
        if self.run is None:
            self.run = _record(self.fn, args)
            if self.run is None:
                return self.fn(*args)
        return self.run(*args)


class _Plain:
    """The runner of a call that cannot be replayed: ``fn`` itself, after the recorded call."""
    __slots__ = ("fn", "first")

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, *args):
        if self.first is not None:
            out = _recorded(self, args)
            if out is not _NOT:
                return out
        return self.fn(*args)


_NOT = object()


def _recorded(run, args):
    """The recorded call's result when this call is that one, handed the same argument objects
    (the call the dispatcher makes right after binding); else _NOT. Asked once: ``run.first``
    (which holds the recorded call's arrays) is dropped."""
    first, run.first = run.first, None
    if len(first[0]) == len(args) and all(x is y for x, y in zip(first[0], args)):
        return first[1]
    return _NOT


def _address(a):
    """A device array's address: a pooled array carries it; Numba's pointer object; the
    simulator's NumPy memory."""
    p = a.__dict__.get("_dnnkit_ptr")
    if p is not None:
        return p
    c = getattr(a, "device_ctypes_pointer", None)
    return (c.value or 0) if c is not None else a.ctypes.data


def _is_array(a):
    return type(a) is not launch.At and arrays.is_device_array(a)


class Replay:
    """The replay of one recorded call (module docstring). Sources: the call's input arrays
    (by argument index), then its allocations (made anew on each call)."""
    __slots__ = ("inputs", "allocators", "steps", "out", "first")

    def __init__(self, rec, args, out):
        if rec.untracked_work is not None:
            raise Unreplayable(rec.untracked_work)
        self.inputs = [i for i, a in enumerate(args) if _is_array(a)]
        srcs = [args[i] for i in self.inputs] + [a for a, _ in rec.allocs]
        spans = []
        for a in srcs:
            if not a.size or not a.is_c_contiguous():
                raise Unreplayable("an empty or non-contiguous array")
            p = _address(a)
            spans.append((p, p + a.size * a.dtype.itemsize, a))
        self.allocators = [arrays.allocator(a.shape, a.dtype, s) for a, s in rec.allocs]
        resolve = _Resolver(spans)
        self.steps = []
        for ev in rec.events:
            if ev[0] == "launch":
                _, kernel, grid, block, stream, kargs, shared = ev
                sets, packed = [], []
                for i, v in enumerate(kargs):
                    if type(v) is tuple:
                        members = []
                        for j, m in enumerate(v):
                            if type(m) is tuple and any(type(e) is launch.At or _is_array(e)
                                                        for e in m):
                                raise Unreplayable("arrays in a tuple inside a tuple")
                            r = resolve.arg(m)
                            members.append(m if r is None else None)
                            if r is not None:
                                sets.append(((i, j),) + r)
                        packed.append(tuple(members))
                        continue
                    r = resolve.arg(v)
                    packed.append(v if r is None else None)
                    if r is not None:
                        sets.append((i,) + r)
                self.steps.append((launch.Prepared(kernel, grid, block, tuple(packed), shared),
                                   stream, tuple(sets)))
            else:
                self.steps.append((ev[0], ev[-1]) + tuple(resolve.whole(a) for a in ev[1:-1]))
        self.out = resolve.output(out)
        self.first = None

    def __call__(self, *args):
        if self.first is not None:
            out = _recorded(self, args)
            if out is not _NOT:
                return out
        srcs = [args[i] for i in self.inputs]
        srcs += [alloc() for alloc in self.allocators]
        At = launch.At
        for step in self.steps:
            pl = step[0]
            if type(pl) is str:
                if pl == "copy":
                    arrays.copy_into(srcs[step[2]], srcs[step[3]], step[1])
                else:
                    arrays.zero_fill(srcs[step[2]], step[1])
                continue
            for where, k, off, form in step[2]:
                a = srcs[k]
                pl.set(where, a if form is None else At(a, off) if form is _FLAT else
                       memory.reshaped(a, form))
            pl(step[1])
        return _build(self.out, srcs)


_FLAT = "flat"


class _Resolver:
    """Device arrays of a recorded call as (source index, element offset, form): form None
    for the source itself, _FLAT for a flat read from the offset to the source's end
    (``launch.At``), a shape for a whole C-contiguous view of the source."""

    def __init__(self, spans):
        self.spans = spans

    def _find(self, a, p, nbytes):
        hits = [k for k, (lo, hi, _) in enumerate(self.spans) if lo <= p and p + nbytes <= hi]
        same = [k for k in hits if self.spans[k][2] is a]
        if same:
            return same[0]
        if len(hits) > 1:
            raise Unreplayable("an array held by two sources")
        return hits[0] if hits else None

    def arg(self, v):
        """(source, offset, form) of kernel argument ``v``; None for anything else (a value, or
        an array made before the call: kept as it is)."""
        if type(v) is launch.At:
            b = v.base
            if not _is_array(b):
                return None
            if not v.size:
                raise Unreplayable("an empty flat argument")
            p = _address(b) + v.offset * b.dtype.itemsize
            k = self._find(b, p, max(1, v.size) * b.dtype.itemsize)
            if k is None:
                return None
            return self._at(k, p, b.dtype, v.size)
        if not _is_array(v):
            return None
        if not v.size or not v.is_c_contiguous():
            raise Unreplayable("an empty or non-contiguous kernel argument")
        p = _address(v)
        k = self._find(v, p, v.size * v.dtype.itemsize)
        if k is None:
            return None
        lo, hi, src = self.spans[k]
        if src is v:
            return k, 0, None
        if v.ndim == 1:
            return self._at(k, p, v.dtype, v.size)
        if p == lo and v.size * v.dtype.itemsize == hi - lo and v.dtype == src.dtype:
            return k, 0, tuple(v.shape)
        raise Unreplayable("a kernel argument viewing part of a source")

    def _at(self, k, p, dtype, size):
        """A flat read of ``size`` elements at address ``p``: it must run to the source's end
        (``At``'s size is the rest of its base)."""
        lo, hi, src = self.spans[k]
        item = src.dtype.itemsize
        if dtype != src.dtype or (p - lo) % item or p + size * item != hi:
            raise Unreplayable("a flat argument that is not the rest of its source")
        return k, (p - lo) // item, _FLAT

    def whole(self, a):
        """The source a copy or fill writes or reads whole."""
        k = self._find(a, _address(a), a.size * a.dtype.itemsize) if _is_array(a) else None
        if k is None or self.spans[k][0] != _address(a) or \
                self.spans[k][1] - self.spans[k][0] != a.size * a.dtype.itemsize:
            raise Unreplayable("a copy or fill of part of a source")
        return k

    def output(self, out):
        """The recipe of the call's return value."""
        if type(out) in (tuple, list) or (isinstance(out, tuple) and hasattr(out, "_fields")):
            return ("seq", type(out), tuple(self.output(o) for o in out))
        if isinstance(out, _PLAIN):
            return ("value", out)
        if not _is_array(out):
            raise Unreplayable(f"an output of type {type(out).__name__}")
        r = self.arg(out) if out.size else None
        if r is None or r[1] != 0:
            raise Unreplayable("an output that is not a source or a whole view of one")
        if r[2] is None or (r[2] is _FLAT and self.spans[r[0]][2].shape == out.shape):
            return ("source", r[0])
        if r[2] is _FLAT:          # a flat view of a source of another shape
            return ("view", r[0], tuple(out.shape))
        return ("view", r[0], r[2])


def _build(recipe, srcs):
    kind = recipe[0]
    if kind == "source":
        return srcs[recipe[1]]
    if kind == "value":
        return recipe[1]
    if kind == "view":
        return memory.reshaped(srcs[recipe[1]], recipe[2])
    t, parts = recipe[1], [_build(r, srcs) for r in recipe[2]]
    return t(*parts) if hasattr(t, "_fields") else t(parts)
