"""A caching device allocator for dnnkit's outputs and scratch buffers.

Numba allocates every array with cuMemAlloc and frees it with cuMemFree, and cuMemFree waits
for the device: a loop of ops that allocate their outputs stalls the host on every free, and
each allocation costs tens of microseconds. Like PyTorch's and CuPy's allocators, this one keeps
freed blocks and hands them out again.

Stream safety: a block is cached per (device, stream) and only reused by work on that same
stream, so the reuse is ordered after every kernel queued on the block before it was dropped
(the same rule as PyTorch's allocator). An array created for one stream and then used on
another must be kept alive by the caller until that work is done — as with any stream-ordered
allocator.

Sizes are rounded up (to 512 bytes below 1 MiB, to 2 MiB above), so a training loop's
repeated shapes hit the cache exactly. When cuMemAlloc fails the cache is emptied and the
allocation retried once. ``dnn.allocator = caching | numba`` (default caching) chooses;
``empty_cache()`` releases every cached block; ``stats()`` reports hits, misses and bytes.
"""

import threading

import numpy as np

from . import config
from .arrays import device_id, simulator, stream_pointer

_SMALL, _SMALL_ROUND, _LARGE_ROUND = 1 << 20, 512, 2 << 20


def _allocator(flag, value):
    v = str(value).strip().lower()
    if v not in ("caching", "numba"):
        raise ValueError(f"flag {flag}: bad value {value!r}; allowed: caching, numba")
    return v


config.register_flag("dnn.allocator", "caching", _allocator,
                     "device allocations of dnnkit's ops: caching (reuse freed blocks per "
                     "stream) or numba (cuMemAlloc/cuMemFree every time)")


def rounded(nbytes):
    """The block size serving a request of ``nbytes`` (pure)."""
    step = _SMALL_ROUND if nbytes <= _SMALL else _LARGE_ROUND
    return max(step, -(-nbytes // step) * step)


class _Pool:
    def __init__(self):
        # reentrant: a block's __del__ (gives it back) can run inside take()/give() when an
        # allocation there triggers the garbage collector
        self.lock = threading.RLock()
        self.free = {}            # (device, stream, size) -> [numba MemoryPointer, ...]
        self.hits = self.misses = self.cached_bytes = 0

    def take(self, key):
        with self.lock:
            blocks = self.free.get(key)
            if blocks:
                self.hits += 1
                self.cached_bytes -= key[2]
                return blocks.pop()
            self.misses += 1
            return None

    def give(self, key, raw):
        with self.lock:
            self.free.setdefault(key, []).append(raw)
            self.cached_bytes += key[2]

    def clear(self):
        """Drop every cached block; True when there were any."""
        with self.lock:
            dropped, self.free, self.cached_bytes = self.free, {}, 0
        had = bool(dropped)
        dropped.clear()
        return had


_pool = _Pool()


def _raw_alloc(ctx, size):
    """cuMemAlloc through Numba; on failure, empty the cache and retry once."""
    try:
        return ctx.memalloc(size)
    except Exception:  # noqa: BLE001 - out of memory or otherwise: retry with the cache freed
        if not _pool.cached_bytes:
            raise
        empty_cache()
        return ctx.memalloc(size)


_templates = {}            # (shape, dtype) -> (nbytes, the attributes of such an array)
_MemoryPointer = _DeviceNDArray = None    # Numba's classes, bound by the first _template()


def _template(shape, dtype):
    """(nbytes, attribute dict) of a C-contiguous DeviceNDArray of ``shape`` and ``dtype``,
    built once through Numba's constructor (which computes the layout in pure Python: ~5 us a
    call). New arrays of that shape copy the dict and get their own memory and stream."""
    global _MemoryPointer, _DeviceNDArray
    from numba.cuda.cudadrv import devicearray, driver
    _MemoryPointer, _DeviceNDArray = driver.MemoryPointer, devicearray.DeviceNDArray
    dtype = np.dtype(dtype)
    strides, n = [], dtype.itemsize          # C-contiguous strides, innermost first
    for s in reversed(shape):
        strides.append(n)
        n *= s
    attrs = None
    if n and shape:
        probe = devicearray.DeviceNDArray(
            shape, tuple(reversed(strides)), dtype, stream=0,
            gpu_data=driver.MemoryPointer(None, driver.binding.CUdeviceptr(0), n))
        attrs = dict(probe.__dict__)
        del attrs["gpu_data"], attrs["stream"]
    if len(_templates) > 4096:
        _templates.clear()
    t = _templates[(shape, dtype)] = (n, attrs)
    return t


def device_array(shape, dtype, stream):
    """An uninitialised C-contiguous device array from the cache, for work on ``stream`` (a
    Numba stream, or a raw cudaStream_t int)."""
    if type(shape) is not tuple:
        shape = tuple(int(s) for s in shape)
    nbytes, attrs = (None, None) if simulator() else \
        _templates.get((shape, dtype)) or _template(shape, dtype)
    if attrs is None or config.get("dnn.allocator") != "caching":
        from numba import cuda
        return cuda.device_array(shape, dtype=dtype,
                                 stream=0 if isinstance(stream, int) else stream)
    if isinstance(stream, int):
        key, stream = (device_id(), stream, rounded(nbytes)), 0
    else:
        key = (device_id(), stream_pointer(stream), rounded(nbytes))
    raw = _pool.take(key) or _raw_alloc(_context(), key[2])
    arr = object.__new__(_DeviceNDArray)
    d = arr.__dict__
    d.update(attrs)
    d["gpu_data"], d["stream"], d["_dnnkit_ptr"] = _lend(key, raw), stream, _address(raw)
    return arr


def allocator(shape, dtype, stream):
    """``alloc()`` -> a new array like ``device_array(shape, dtype, stream)``, for repeated
    allocations of one signature (dispatch's memo): the template, pool key and flag read once.
    (Memoised calls are dropped when a flag changes, so ``dnn.allocator`` cannot change under
    it.)"""
    shape = tuple(int(s) for s in shape)
    nbytes, attrs = (None, None) if simulator() else \
        _templates.get((shape, dtype)) or _template(shape, dtype)
    if attrs is None or config.get("dnn.allocator") != "caching":
        return lambda: device_array(shape, dtype, stream)
    if isinstance(stream, int):
        key, stream = (device_id(), stream, rounded(nbytes)), 0
    else:
        key = (device_id(), stream_pointer(stream), rounded(nbytes))
    new, lock, size = object.__new__, _pool.lock, key[2]

    def alloc():
        with lock:                 # _Pool.take, inlined (clear() replaces the dict: read it)
            blocks = _pool.free.get(key)
            if blocks:
                _pool.hits += 1
                _pool.cached_bytes -= size
                raw = blocks.pop()
            else:
                _pool.misses += 1
                raw = None
        if raw is None:
            raw = _raw_alloc(_context(), size)
        rd = raw.__dict__
        lend, ptr = rd.get("_dnnkit_lend"), rd.get("_dnnkit_ptr")
        if lend is None or ptr is None:       # a new block: the slow path sets both up
            mem, ptr = _lend(key, raw), _address(raw)
        else:                                 # _lend, inlined
            mem = new(_Lent)
            md = mem.__dict__
            md.update(lend)
            md["refct"], md["_key"], md["_raw"] = 1, key, raw
        arr = new(_DeviceNDArray)
        d = arr.__dict__
        d.update(attrs)
        d["gpu_data"], d["stream"], d["_dnnkit_ptr"] = mem, stream, ptr
        return arr
    return alloc


def _address(raw):
    """The device address of a pool block, as an int (read once per block)."""
    d = raw.__dict__
    p = d.get("_dnnkit_ptr")
    if p is None:
        p = d["_dnnkit_ptr"] = int(raw.device_pointer) or None
    return p


def _context():
    from numba import cuda
    return cuda.current_context()


_Lent = None     # the class of a block lent to one array (a subclass of Numba's MemoryPointer)


def _lend(key, raw):
    """A view of pool block ``raw`` that owns nothing: when the array holding it dies, the
    block goes back to the pool. Built from the block's attributes (Numba's constructor
    registers a weakref finalizer per pointer: ~4 us a call)."""
    global _Lent
    if _Lent is None:
        _Lent = _lent_class()
    attrs = raw.__dict__.get("_dnnkit_lend")
    if attrs is None:        # what MemoryPointer.__init__ would set, read once per block
        p = raw.device_pointer       # (raw is Numba's OwnedPointer: attributes by delegation)
        attrs = raw.__dict__["_dnnkit_lend"] = dict(
            context=raw.context, device_pointer=p, handle=p, size=key[2],
            _cuda_memsize_=key[2], is_managed=True, _owner=None)
    mem = object.__new__(_Lent)
    d = mem.__dict__
    d.update(attrs)
    d["refct"], d["_key"], d["_raw"] = 1, key, raw
    return mem


def _lent_class():
    class Lent(_MemoryPointer):
        """A pool block lent to one array; ``__del__`` (or ``free()``) gives it back once."""

        def free(self):
            raw = self.__dict__.pop("_raw", None)
            if raw is not None:
                _pool.give(self._key, raw)

        def __del__(self):
            raw = self.__dict__.pop("_raw", None)
            if raw is not None:
                try:                        # _Pool.give, inlined
                    with _pool.lock:
                        _pool.free.setdefault(self._key, []).append(raw)
                        _pool.cached_bytes += self._key[2]
                except Exception:  # noqa: BLE001 - interpreter shutdown: no pool to give to
                    pass
    return Lent


class scratch:
    """``with scratch(nbytes, stream_ptr) as ptr:`` a raw device pointer (int; None for 0
    bytes) for work queued on that stream inside the block; the block goes back to the pool at
    the end, to be reused by later work on the same stream (stream order keeps it safe). No
    array object is built: a workspace only needs its address."""
    __slots__ = ("key", "raw")

    def __init__(self, nbytes, stream_ptr):
        self.key = self.raw = None
        if not nbytes:
            return
        if simulator() or config.get("dnn.allocator") != "caching":
            from numba import cuda
            self.raw = cuda.device_array(int(nbytes), dtype=np.uint8)
            return
        self.key = (device_id(), int(stream_ptr), rounded(int(nbytes)))
        self.raw = _pool.take(self.key) or _raw_alloc(_context(), self.key[2])

    def __enter__(self):
        if self.raw is None:
            return None
        p = getattr(self.raw, "device_ctypes_pointer", None)
        return (p.value if p is not None else int(self.raw.device_pointer)) or None

    def __exit__(self, *exc):
        if self.key is not None:
            _pool.give(self.key, self.raw)
        self.key = self.raw = None


_on_empty = []     # functions called by empty_cache() (caches keyed by device addresses)


def on_empty_cache(fn):
    """Call ``fn()`` whenever the cache is emptied (e.g. conv_graph drops the variant packs
    it keeps by device address: those addresses are no longer handed out)."""
    _on_empty.append(fn)


def empty_cache():
    """Give every cached block back to the device now (arrays in use are unaffected).
    Numba's device pointers sit in reference cycles and Numba defers their cuMemFree: a
    dropped block would otherwise stay allocated until the next garbage collection and the
    next flush of Numba's pending frees (measured on an H100: a 652 MiB workspace still held
    after the cache was emptied), so both are forced here."""
    if _pool.clear() and not simulator():
        import gc
        gc.collect()
        _context().deallocations.clear()
    for fn in _on_empty:
        fn()


def stats():
    """{'hits', 'misses', 'cached_bytes', 'cached_blocks'} of the caching allocator."""
    with _pool.lock:
        return dict(hits=_pool.hits, misses=_pool.misses, cached_bytes=_pool.cached_bytes,
                    cached_blocks=sum(len(v) for v in _pool.free.values()))
