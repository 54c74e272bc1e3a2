"""cuDNN descriptors as context managers; ``weakref.finalize`` destroys any that escape.

``Descriptor`` is the base of every legacy descriptor (tensors here; each op family subclasses
it in its own file), ``DescriptorCache`` shares descriptors by their arguments, and
``scalar_refs`` gives the alpha/beta host scalars. Every cuDNN object dnnkit creates
(descriptors, graph-API descriptors in ``graph.py``, handles in ``handle.py``) is counted per
kind on creation and on destruction, so leak tests can check that ``live_counts()`` returns to
where it started.
"""

import collections
import ctypes
import threading
import weakref

import numpy as np

from .. import fastpath
from . import api
from .enums import DATA_TYPES

INT_MAX = 2**31 - 1


# kind (the C type's name: "TensorDescriptor", "Handle", ...) -> [created, destroyed]
_counts = collections.defaultdict(lambda: [0, 0])
_counts_lock = threading.Lock()   # finalizers run on whichever thread drops the last reference


def count(kind, created=0, destroyed=0):
    """Record cuDNN objects of ``kind`` created/destroyed (for every Create/Destroy call)."""
    with _counts_lock:
        c = _counts[kind]
        c[0] += created
        c[1] += destroyed


def live_counts():
    """``{kind: objects created and not yet destroyed}`` for every kind dnnkit has created
    (a debugging aid: cached plans and per-thread handles are live by design)."""
    with _counts_lock:
        return {k: c[0] - c[1] for k, c in _counts.items()}


def total_counts():
    """``{kind: (created, destroyed)}`` since the process started."""
    with _counts_lock:
        return {k: tuple(c) for k, c in _counts.items()}


def kind_of(create_fn):
    """'cudnnCreateTensorDescriptor' -> 'TensorDescriptor' ('cudnnCreate' -> 'Handle')."""
    return create_fn[len("cudnnCreate"):] or "Handle"


def _destroy(fn_name, ptr, kind):
    try:
        api.function(fn_name)(ptr)
    except Exception:  # pragma: no cover - best effort
        pass
    # Counted even when the call failed: the object is gone for dnnkit either way, and a
    # failing destroy (the library unusable) would otherwise read as a leak of ours.
    count(kind, destroyed=1)


class Descriptor:
    """A legacy cuDNN descriptor: subclasses name their C create and destroy functions
    (``create_fn``, ``destroy_fn``) and set the descriptor in ``__init__``."""
    create_fn = destroy_fn = None

    def __init__(self):
        self.ptr = ctypes.c_void_p()
        api.call(self.create_fn, ctypes.byref(self.ptr))
        kind = kind_of(self.create_fn)
        count(kind, created=1)   # only after cuDNN succeeded: a failed create made nothing
        self._fin = weakref.finalize(self, _destroy, self.destroy_fn, self.ptr, kind)

    def close(self):
        self._fin()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def _as_parameter_(self):  # lets ctypes take the descriptor itself as an argument
        return self.ptr


class TensorDescriptor(Descriptor):
    """A packed (C-contiguous) tensor of 3 to 8 dims; ranks below ``min_rank`` are padded with
    1s (most calls want 4; the RNN's state tensors are exactly 3-D)."""
    create_fn, destroy_fn = "cudnnCreateTensorDescriptor", "cudnnDestroyTensorDescriptor"

    def __init__(self, shape, dtype, min_rank=4):
        super().__init__()
        dims = [int(d) for d in shape] + [1] * (min_rank - len(shape))
        strides, step = [], 1
        for d in reversed(dims):           # packed: each stride the product of the dims after
            strides.append(step)
            step *= d
        strides.reverse()
        if max(dims + strides + [step]) > INT_MAX:       # step: the element count
            self.close()
            raise ValueError(f"tensor {tuple(shape)} exceeds cuDNN's 32-bit dimension limit")
        n = len(dims)
        self.shape = tuple(dims)
        try:
            api.call("cudnnSetTensorNdDescriptor", self.ptr, DATA_TYPES[np.dtype(dtype).name], n,
                     (ctypes.c_int * n)(*dims), (ctypes.c_int * n)(*strides),
                     context=f"dims {tuple(dims)}, dtype {np.dtype(dtype).name}")
        except Exception:
            self.close()
            raise


def int_array(values, what):
    """``values`` as a C int array; ValueError naming ``what`` when one exceeds 32 bits."""
    values = [int(v) for v in values]
    if values and max(abs(v) for v in values) > INT_MAX:
        raise ValueError(f"{what} {tuple(values)} exceeds cuDNN's 32-bit dimension limit")
    return (ctypes.c_int * len(values))(*values)


def scalars(dtype):
    """(alpha=1, beta=0) host scalars: double for double data, float otherwise (cuDNN's rule)."""
    t = ctypes.c_double if np.dtype(dtype) == np.float64 else ctypes.c_float
    return t(1.0), t(0.0)


_SCALAR_REFS = {}


def scalar_refs(dtype, alpha=1.0):
    """``(byref(alpha), byref(beta=0))`` in cuDNN's scalar type for ``dtype``, made once per
    (dtype, alpha): cuDNN only reads them, so every call and thread can pass the same two."""
    refs = _SCALAR_REFS.get((dtype, alpha))
    if refs is None:
        one, zero = scalars(dtype)
        one.value = alpha
        refs = _SCALAR_REFS[(dtype, alpha)] = (ctypes.byref(one), ctypes.byref(zero))
    return refs


_CACHES = []      # every DescriptorCache, so clear_cached() reaches the op families' too


class DescriptorCache:
    """Descriptors by their arguments, made once and shared by every call and thread (cuDNN
    only reads a descriptor once it is set; creating, setting and destroying one costs tens of
    microseconds of host time, more than a small op's own call). Bounded: when full it is
    emptied, and each dropped descriptor is destroyed by its finalizer once the last call
    still holding it lets go (never under a running call)."""

    def __init__(self, make, size=1024):
        self.make, self.size, self.items = make, size, {}
        self.lock = threading.Lock()
        _CACHES.append(self)

    def get(self, *key):
        d = self.items.get(key)
        if d is None:
            made = self.make(*key)
            with self.lock:
                if len(self.items) >= self.size:
                    self.items.clear()
                d = self.items.setdefault(key, made)
        return d

    def clear(self):
        with self.lock:
            self.items = {}


_tensors = DescriptorCache(TensorDescriptor)


def tensor(shape, dtype, min_rank=4):
    """The shared (cached) packed tensor descriptor of ``shape``; callers must not close it."""
    return _tensors.get(tuple(shape), dtype, min_rank)


def clear_cached():
    """Drop every shared descriptor, of every family (each is destroyed once no call holds
    it): leak tests, and tests that fake cuDNN's calls."""
    for c in _CACHES:
        c.clear()
    fastpath.invalidate()     # memoised calls hold descriptors
