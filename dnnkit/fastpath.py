"""The per-thread memo of op calls that lets a repeated call skip its setup.

A training loop calls each op with the same shapes, dtypes and arguments every step. The first
such call takes the full path — argument checks, backend choice, descriptors, plans — and the
dispatcher stores a *runner* for it under the call's signature: the implementation's own
``bind()`` result where it has one (descriptors, plan, function pointer and handle bound once),
else for a Numba implementation the replay of this call's launches (dnnkit/replay.py), else
the implementation itself; plus the checked arguments, with the positions where the
caller's arrays go. The next call with the same signature runs the runner on its arrays
directly: the host cost of an op becomes an allocation and the cuDNN call or kernel launch
(PyTorch's per-op cost is the bar).

The signature: the op, ``backend=``, the thread's current stream (dnnkit.stream: a runner
holds the stream it was bound to), and per argument its type and value for plain values (str,
int, float, bool, None, tuples of these, NumPy scalars) and registered immutable ones
(``value_type``: an RNNConfig), (shape, strides, dtype) for a device array, the raw handle of a
stream object (Numba's, PyTorch's, CuPy's), or ``memo_key()`` of a registered per-call object
(``carried_type``: a forward's state for its backward, put in place on each call like an
array). A foreign array (PyTorch, CuPy, any ``__cuda_array_interface__`` or ``__dlpack__``)
makes ``signature`` answer ``FOREIGN``: the
dispatcher turns it into a Numba view (dnnkit/foreign.py) and the call is memoised as any.
Anything else (host arrays) is not memoised: such calls always take the full path.

Entries are dropped when any flag changes process-wide (the flags' merged dict is replaced),
when ``invalidate()`` is called (cuDNN caches cleared, algorithm cache reset), and when this
thread enters or leaves a ``change_flags`` block; they are never used inside traces, the
profiler, cross-checking or DEBUG logging. On a machine with several GPUs the signature holds
the current device, and a call whose arrays are on another device takes the full path (which
switches to theirs). ``dnn.memo = False`` turns it off.
"""

import threading

import numpy as np

from . import config
from .device import simulator, stream_pointer, stream_state

MAX_ENTRIES = 1024          # per thread; a program with more signatures starts over
_PLAIN = frozenset((str, int, float, bool, type(None)))
_arrays = set()             # the device array types (bound on first use: imports numba)
_VALUES = set()             # immutable value types, hashed into a signature as they are
_CARRIED = set()            # per-call objects (a forward's state): keyed by memo_key(), put
                            # in their place on each call like arrays
_gen = [0]                  # bumped by invalidate(): every thread's memo is stale
_local = threading.local()
stats = {"hits": 0, "stores": 0}


def value_type(cls):
    """Register an immutable, hashable class (a frozen configuration such as RNNConfig): its
    instances enter a call's signature by value, as ints and strings do."""
    _VALUES.add(cls)
    return cls


def carried_type(cls):
    """Register a class of per-call objects (a forward's state for its backward): an instance
    enters the signature as ``(type, obj.memo_key())``, which must hold everything the op's
    argument checks read of it, and a memoised call gets the caller's own object in its
    place, as it gets the caller's arrays."""
    _CARRIED.add(cls)
    return cls


def keeping():
    """Whether this thread's memo keeps runners (``dnn.memo`` on)."""
    return _memo() is not _OFF


def carried(a):
    """Whether ``a`` is a per-call object of a registered ``carried_type``."""
    return type(a) in _CARRIED


def invalidate():
    """Forget every thread's memo (the next call of each signature takes the full path)."""
    _gen[0] += 1


def _array_types():
    # numba's array classes are imported on first use: `import dnnkit` does not load numba
    if not _arrays:
        if simulator():
            from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray as cls
        else:
            from numba.cuda.cudadrv.devicearray import DeviceNDArray as cls
        _arrays.add(cls)
    return _arrays


def _memo():
    """This thread's {signature: entry}, emptied when stale."""
    try:
        m = _local.m
    except AttributeError:
        m = _local.m = [None, None, None, {}, True]
    merged, epoch = config.state.merged, config.state.local.__dict__.get("epoch")
    if m[0] != _gen[0] or m[1] is not merged or m[2] != epoch or len(m[3]) >= MAX_ENTRIES:
        m[3].clear()
        m[4] = config.get("dnn.memo")        # (merges the flags: read them again below)
        m[0], m[1], m[2] = _gen[0], config.state.merged, epoch
    return m[3] if m[4] else _OFF


_OFF = {}           # the memo of a thread with dnn.memo off: stays empty
FOREIGN = ("foreign",)     # signature()'s answer for a call with a foreign array
_STREAM, _SCALAR = 1, 2
_kinds = {}         # type -> _STREAM, _SCALAR, FOREIGN or None (asked once per type)


def _kind(t):
    """_STREAM for a stream object type (Numba's, or one carrying ``.cuda_stream`` or ``.ptr``),
    _SCALAR for a NumPy scalar (np.float32(2), a shape's np.int64: hashable values, keyed as
    ints and floats are), FOREIGN for another library's array type, None for anything else
    (not memoised)."""
    k = _kinds.get(t, 0)
    if k == 0:
        names = {c.__name__ for c in t.__mro__}
        if issubclass(t, np.generic):
            k = _SCALAR
        elif "DeviceNDArrayBase" in names or t.__module__.startswith("dnnkit"):
            k = None          # Numba's other array classes, dnnkit's own objects
        elif hasattr(t, "auto_synchronize") or hasattr(t, "cuda_stream") or \
                (hasattr(t, "ptr") and "Stream" in t.__name__):
            k = _STREAM
        elif hasattr(t, "__cuda_array_interface__") or (
                hasattr(t, "__dlpack__") and "ndarray" not in names):
            k = FOREIGN
        else:
            k = None
        _kinds[t] = k
    return k


def _other(a, t):
    """The signature part of an argument that is neither plain nor a Numba array: a stream's
    raw handle; a NumPy scalar's type and value; FOREIGN; None (not memoised)."""
    k = _kinds.get(t, 0)
    if k == 0:
        k = _kind(t)
    if k is _SCALAR:
        return t, a
    if k is _STREAM:
        if hasattr(a, "auto_synchronize"):      # a Numba stream; the simulator's have no handle
            return t, (stream_pointer(a) if getattr(a, "handle", None) is not None else id(a))
        h = getattr(a, "cuda_stream", None)
        return t, int(h if h is not None else a.ptr)
    return k


def signature(op, args, backend, kw, dev=None):
    """The call's signature (hashable); FOREIGN when an argument is another library's array;
    None when it cannot be memoised. ``dev``: the device the call runs on, on a machine with
    several (None on one GPU)."""
    arrays = _arrays or _array_types()
    k = [op, backend, stream_state.__dict__.get("key"), dev]
    plain = _PLAIN.issuperset
    for a in args:
        t = type(a)
        if t in arrays:
            k += (a.shape, a.strides, a.dtype)
        elif t in _PLAIN or (t is tuple and plain(map(type, a))):
            k += (t, a)
        elif t in _VALUES:
            k += (t, a)
        elif t in _CARRIED:
            k += (t, a.memo_key())
        else:
            o = _other(a, t)
            if o is None or o is FOREIGN:
                return o
            k += o
    for name, a in kw.items():
        t = type(a)
        if t in arrays:
            k += (name, a.shape, a.strides, a.dtype)
        elif t in _PLAIN or (t is tuple and plain(map(type, a))):
            k += (name, t, a)
        elif t in _VALUES:
            k += (name, t, a)
        elif t in _CARRIED:
            k += (name, t, a.memo_key())
        else:
            o = _other(a, t)
            if o is None or o is FOREIGN:
                return o
            k += (name, *o)
    return tuple(k)


def find(op, args, backend, kw, dev=None):
    """(signature, memoised entry or None); (None, None) when the call cannot be memoised.
    (_memo()'s check inlined: this runs on every call.)"""
    sig = signature(op, args, backend, kw, dev)
    if sig is None or sig is FOREIGN:
        return sig, None
    try:
        m = _local.m
    except AttributeError:
        return sig, _memo().get(sig)
    if m[0] != _gen[0] or m[1] is not config.state.merged or \
            m[2] != config.state.local.__dict__.get("epoch") or not m[4]:
        return sig, _memo().get(sig)
    return sig, m[3].get(sig)


def store(sig, args, kw, prepared, runner, backend):
    """Remember ``runner`` (which runs on ``backend``) for ``sig``: a later call runs
    ``runner(*prepared')`` where ``prepared'`` is ``prepared`` with the caller's new arrays in
    the places its arrays held now. Not stored when a checked array is not one of the caller's
    (a host input copied to the device, a made-contiguous copy): that work must happen on
    every call.

    A call that passes one array in several places (``add(a, a)``, a gradient rule's
    ``activation_backward(y, y, dy)``) is stored with that pattern (``same``: pairs of
    argument places that held one array): the signature cannot tell it from a call with
    distinct arrays of the same shapes, so ``usable`` lets a later call take the entry only
    when its arrays coincide in the same places; one that does not takes the full path and
    stores its own entry, which serves both."""
    arrays = _arrays or _array_types()
    where, same = {}, []         # id(array) -> its first place (index in args, or kw name)
    for place, a in (*enumerate(args), *kw.items()):
        if type(a) in arrays or type(a) in _CARRIED:
            first = where.setdefault(id(a), place)
            if first != place:
                same.append((first, place))
    named = {i: place for i, place in where.items() if type(place) is str}
    where = {i: place for i, place in where.items() if type(place) is int}
    subs = []
    for i, p in enumerate(prepared):
        if type(p) in arrays or type(p) in _CARRIED:
            if id(p) in where:
                subs.append((i, where[id(p)], None))
            elif id(p) in named:
                subs.append((i, None, named[id(p)]))
            else:
                return
        elif type(p) in (tuple, list) and any(type(v) in arrays for v in p):
            return          # arrays inside a container: not tracked, so not memoised
    m = _memo()
    if m is _OFF:
        return
    # the entry keeps no array of this call: each hit puts the caller's arrays in their places,
    # and an array held here would outlive the step that made it (a whole model's activations)
    kept = list(prepared)
    for i, _, _ in subs:
        kept[i] = None
    m[sig] = (runner, tuple(kept), tuple(subs), backend, tuple(same) or None)
    stats["stores"] += 1


def usable(entry, args, kw):
    """Whether a found entry serves this call: always, unless it was stored from a call that
    passed one array in several places and this call's arrays do not coincide there too."""
    same = entry[4]
    if same is None:
        return True
    for p, q in same:
        if (args[p] if type(p) is int else kw.get(p)) is not \
                (args[q] if type(q) is int else kw.get(q)):
            return False
    return True


def drop(sig):
    _memo().pop(sig, None)
