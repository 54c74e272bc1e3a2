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

Debugging: ``dnn.debug.fill_uninitialized = nan`` (default off) fills every new array with
0xFF bytes (a NaN in every float dtype) by a memset on its stream: an element no kernel wrote
reads as NaN (dnnkit/memory_fill.py). cuDNN workspaces are not filled.
"""

import contextlib
import gc
import heapq
import threading

import numpy as np

from . import config
from .device import capture_relaxed, device_id, key_stream, numba_cuda, on_thread_end, \
    refuse_foreign_capture, simulator, stream_key, stream_pointer, thread_alive
from .memory_fill import fill

_SMALL, _SMALL_ROUND, _LARGE_ROUND = 1 << 20, 512, 2 << 20


config.register_flag("dnn.allocator", "caching", config.enum("caching", "numba"),
                     "device allocations of dnnkit's ops: caching (reuse freed blocks per "
                     "stream) or numba (cuMemAlloc/cuMemFree every time)")


def address(raw):
    """The device address of pool block ``raw`` (an int; 0 for none)."""
    lend = raw.__dict__.get("_dnnkit_lend")
    if lend is not None:
        return lend[1] or 0
    p = getattr(raw, "device_ctypes_pointer", None)
    return (p.value if p is not None else int(raw.device_pointer)) or 0


def rounded(nbytes):
    """The block size serving a request of ``nbytes`` (pure)."""
    step = _SMALL_ROUND if nbytes <= _SMALL else _LARGE_ROUND
    return max(step, -(-nbytes // step) * step)


class _Pool:
    def __init__(self):
        # reentrant: a block's __del__ (gives it back) can run inside take()/give() when an
        # allocation there triggers the garbage collector
        self.lock = threading.RLock()
        self.free = {}            # (device, stream, size) -> heap of (address, id, block)
        # block address -> block, while lent to an array. The pool holds it: an array dying
        # in a reference cycle would take its block into the garbage, where Numba frees the
        # memory before __del__ gives it back (the GPU fuzzer saw cuMemcpy reject it).
        self.lent = {}
        self.hits = self.misses = self.cached_bytes = 0

    # Free lists are heaps of (address, block): a request takes the lowest address of its size,
    # so a step allocating in the same order gets the same addresses every step (a LIFO list's
    # drift) and cuDNN's variant packs, kept by address (cudnn/graph.py), stay valid.

    def take(self, key):
        with self.lock:
            blocks = self.free.get(key)
            if blocks:
                self.hits += 1
                self.cached_bytes -= key[2]
                return heapq.heappop(blocks)[2]
            self.misses += 1
            return None

    def give(self, key, raw, addr=None):
        with self.lock:
            if type(key[1]) is tuple and self is _pool and not thread_alive(key[1]):
                return      # an ended thread's per-thread stream: no one can take it (freed)
            if addr is None:
                addr = address(raw)
            heapq.heappush(self.free.setdefault(key, []), (addr, id(raw), raw))
            self.cached_bytes += key[2]

    def give_back(self, key, addr):
        """The block lent at ``addr`` comes back (once: a second call finds nothing)."""
        with self.lock:
            raw = self.lent.pop(addr, None)
            if raw is not None:
                self.give(key, raw, addr)

    def clear(self):
        """Drop every cached block; True when there were any."""
        with self.lock:
            dropped, self.free, self.cached_bytes = self.free, {}, 0
        return bool(dropped)        # the blocks go with ``dropped``


_pool = _Pool()


def _thread_ended(skey):
    """A thread that used its per-thread default stream ended: the blocks cached for that
    stream go back to the device, and its blocks still lent are not cached when they return
    (``give``; a program that starts many threads would otherwise keep them). A graph's
    private pool keeps its blocks as long as the graph."""
    with _pool.lock:
        for key in [k for k in _pool.free if k[1] == skey]:
            _pool.cached_bytes -= key[2] * len(_pool.free.pop(key))


on_thread_end(_thread_ended)

# Graph-private pools (dnnkit/graphs.py). While a thread captures a CUDA graph, every block it
# takes -- arrays and scratch alike -- comes from a pool of that graph's own and goes back to
# it: the graph holds the blocks' addresses, so no eager call may be handed one while the graph
# lives. Inside the capture, reuse is ordered as in eager code (one stream). A new block is
# allocated with the thread's capture mode relaxed (device.capture_relaxed), never freed while
# the pool lives, and never retried through empty_cache (a capture must not free memory).
_private = threading.local()      # .pool: this thread's graph pool inside private_pool()
_private_users = [0]              # threads inside private_pool(); 0 keeps the hook one check


def new_pool():
    """An empty pool for one CUDA graph, kept as long as it; ``kept``: Numba arrays' memory."""
    pool = _Pool()
    pool.kept = []
    return pool


@contextlib.contextmanager
def private_pool(pool):
    """Inside the block, this thread's allocations come from ``pool`` and go back to it."""
    d = _private.__dict__
    saved, d["pool"] = d.get("pool"), pool
    with _pool.lock:
        _private_users[0] += 1
    try:
        yield pool
    finally:
        with _pool.lock:
            _private_users[0] -= 1
        d["pool"] = saved


def in_private_pool():
    """Whether this thread's allocations come from a graph's pool (inside private_pool())."""
    return _private.__dict__.get("pool") is not None


def _private_alloc(size):
    with capture_relaxed():
        return _context().memalloc(size)


def _raw_alloc(ctx, size):
    """cuMemAlloc through Numba; on failure, empty the cache and retry once."""
    try:
        return ctx.memalloc(size)
    except Exception:  # noqa: BLE001 - out of memory or otherwise: retry with the cache freed
        if not _pool.cached_bytes and not _held_bytes():
            raise
        empty_cache()
        return ctx.memalloc(size)


_templates = {}            # (shape, dtype) -> (nbytes, the attributes of such an array)
_MemoryPointer = _DeviceNDArray = None    # Numba's classes, bound by the first _template()


def _template(shape, dtype):
    """(nbytes, attribute dict) of a C-contiguous DeviceNDArray of ``shape`` and ``dtype``,
    built once through Numba's constructor (~5 us of Python); new arrays copy the dict."""
    global _MemoryPointer, _DeviceNDArray
    # imported here, as every numba import of dnnkit: `import dnnkit` does not load numba
    from numba.cuda.cudadrv import devicearray, driver
    _MemoryPointer, _DeviceNDArray = driver.MemoryPointer, devicearray.DeviceNDArray
    asked, dtype = dtype, np.dtype(dtype)
    strides, n = [], dtype.itemsize          # C-contiguous strides, innermost first
    for s in reversed(shape):
        strides.append(n)
        n *= s
    attrs = None
    if n:                   # (0-d arrays too: a loss is one, made every training step)
        probe = devicearray.DeviceNDArray(
            shape, tuple(reversed(strides)), dtype, stream=0,
            gpu_data=driver.MemoryPointer(None, driver.binding.CUdeviceptr(0), n))
        probe._numba_type_    # (a cached property: its Numba type goes into the template)
        attrs = dict(probe.__dict__)
        del attrs["gpu_data"], attrs["stream"]
    if len(_templates) > 4096:
        _templates.clear()
    # kept under the dtype as asked too: np.uint8 (the type) equals np.dtype("uint8") but does
    # not hash like it, and a miss rebuilds the template (~5 us) on every call
    t = _templates[(shape, dtype)] = _templates[(shape, asked)] = (n, attrs)
    return t


def reshaped(a, shape):
    """``a.reshape(shape)`` (same size, no copy) for a C-contiguous device array, built from
    the shape's template instead of Numba's reshape, which lays the view out in pure Python
    (~20 us a call on a GPU machine's host; a convolution reshapes its arrays several times a
    call). The view shares ``a``'s memory (and so keeps a pool block lent while it lives);
    anything else (a strided array, the simulator's) goes through ``a.reshape``."""
    if type(shape) is not tuple:
        shape = tuple(int(s) for s in shape)
    if simulator() or not a.size:
        return a.reshape(shape)
    src = _templates.get((a.shape, a.dtype)) or _template(a.shape, a.dtype)
    dst = _templates.get((shape, a.dtype)) or _template(shape, a.dtype)
    if type(a) is not _DeviceNDArray or src[1] is None or dst[1] is None or src[0] != dst[0] \
            or a.strides != src[1]["strides"]:
        return a.reshape(shape)
    arr = object.__new__(_DeviceNDArray)
    d = arr.__dict__
    d.update(dst[1])
    d["gpu_data"], d["stream"] = a.gpu_data, a.stream
    ptr = a.__dict__.get("_dnnkit_ptr")
    if ptr is not None:
        d["_dnnkit_ptr"] = ptr
    return arr


def _pooled(shape, dtype, stream):
    """(pool key, array attributes, the stream the array records) for an array of ``shape``
    and ``dtype`` from the pool; None when it does not come from the pool (the simulator, an
    empty array, ``dnn.allocator = numba``)."""
    nbytes, attrs = (None, None) if simulator() else \
        _templates.get((shape, dtype)) or _template(shape, dtype)
    if attrs is None or config.get("dnn.allocator") != "caching":
        return None
    if isinstance(stream, int):
        return (device_id(), stream_key(stream), rounded(nbytes)), attrs, 0
    return (device_id(), stream_key(stream_pointer(stream)), rounded(nbytes)), attrs, stream


def _numba_array(shape, dtype, stream):
    pool = _private.__dict__.get("pool") if _private_users[0] else None
    st = 0 if isinstance(stream, int) else stream
    if pool is None:
        a = numba_cuda().device_array(shape, dtype=dtype, stream=st)
    else:
        # an array the pool does not serve (an empty one) inside a graph pool: Numba's
        # cuMemAlloc with the capture mode relaxed, its memory kept as long as the pool
        with capture_relaxed():
            a = numba_cuda().device_array(shape, dtype=dtype, stream=st)
        pool.kept.append(getattr(a, "gpu_data", a))
    if watch is not None:
        watch.alloc(a, stream)
    return a


# While not None (dnnkit.replay's recording of an op call): told of every new array.
watch = None


# Per thread, per flags (merged dict, change_flags epoch): {(shape, dtype, stream, device):
# _pooled()'s answer}, half of an allocation's host time in a training step. It holds the
# stream objects (no id reused under it); emptied when the flags change or past _FAST_MAX.
_fast, _FAST_MAX = threading.local(), 4096


def device_array(shape, dtype, stream):
    """An uninitialised C-contiguous device array from the cache, for work on ``stream`` (a
    Numba stream, or a raw cudaStream_t int); all 0xFF bytes under fill_uninitialized."""
    if type(shape) is not tuple:
        shape = tuple(int(s) for s in shape)
    f, st = _fast.__dict__, config.state
    merged, epoch = st.merged, st.local.__dict__.get("epoch")
    if f.get("merged", f) is not merged or f.get("epoch") != epoch:
        f["merged"], f["epoch"], f["map"] = merged, epoch, {}
    k = (shape, dtype, stream, device_id())
    p = f["map"].get(k)
    if p is not None:
        return _new(*p)
    p = _pooled(shape, dtype, stream)
    a = _numba_array(shape, dtype, stream) if p is None else _new(*p)
    if config.get("dnn.debug.fill_uninitialized") != "off":
        return fill(a, stream)
    if p is not None and merged is not None and merged is st.merged:
        m = f["map"]
        if len(m) >= _FAST_MAX:
            m.clear()
        m[k] = p
    return a


def allocator(shape, dtype, stream):
    """``alloc()`` -> a new array like ``device_array(shape, dtype, stream)``, for repeated
    allocations of one signature (dispatch's memo): the template, pool key and flags read
    once. (Memoised calls are dropped when a flag changes, so ``dnn.allocator`` and
    ``dnn.debug.fill_uninitialized`` cannot change under it.)"""
    shape = tuple(int(s) for s in shape)
    p = _pooled(shape, dtype, stream)
    if p is None:
        alloc = lambda: _numba_array(shape, dtype, stream)   # noqa: E731
    else:
        key, attrs, recorded = p
        alloc = lambda: _new(key, attrs, recorded)           # noqa: E731
    if config.get("dnn.debug.fill_uninitialized") == "off":
        return alloc
    return lambda: fill(alloc(), stream)


def _block(key):
    """(pool, block) for ``key``: this thread's graph pool inside private_pool(), else the
    shared one (refused on a stream captured by a graph dnnkit does not know of); a cached
    block, or a new one."""
    pool = _pool if not _private_users[0] else (_private.__dict__.get("pool") or _pool)
    if pool is _pool and key[1]:
        refuse_foreign_capture(key_stream(key[1]))
    return pool, pool.take(key) or (
        _raw_alloc(_context(), key[2]) if pool is _pool else _private_alloc(key[2]))


def _new(key, attrs, stream):
    """A new array of template ``attrs``: a pool block (or a new one) lent to it. Neither the
    array nor its pointer goes through Numba's constructors (the array's computes its layout
    in Python, the pointer's registers a weakref finalizer: ~5 and ~4 us a call)."""
    pool, raw = _block(key)
    lend = raw.__dict__.get("_dnnkit_lend") or _lend_attrs(key, raw)
    mem = object.__new__(_Lent)
    md = mem.__dict__
    md.update(lend[0])
    md["refct"], md["_key"], md["_addr"] = 1, key, lend[1]
    pool.lent[lend[1]] = raw
    if pool is not _pool:
        md["home"] = pool
    arr = object.__new__(_DeviceNDArray)
    d = arr.__dict__
    d.update(attrs)
    d["gpu_data"], d["stream"], d["_dnnkit_ptr"] = mem, stream, lend[1]
    d["_dnnkit_device"] = key[0]       # device.device_of: the memo's check on several GPUs
    if watch is not None:
        watch.alloc(arr, key_stream(key[1]) if isinstance(stream, int) else stream)
    return arr


def _context():
    return numba_cuda().current_context()


_Lent = None     # the class of a block lent to one array (a subclass of Numba's MemoryPointer)


def _lend_attrs(key, raw):
    """(what MemoryPointer.__init__ would set on a view of pool block ``raw`` that owns
    nothing, the block's address as an int): read once per block and kept on it. ``raw`` is
    Numba's OwnedPointer, whose attributes are read by delegation."""
    global _Lent
    if _Lent is None:
        _Lent = _lent_class()
    p = raw.device_pointer
    lend = raw.__dict__["_dnnkit_lend"] = (
        dict(context=raw.context, device_pointer=p, handle=p, size=key[2],
             _cuda_memsize_=key[2], is_managed=True, _owner=None),
        int(p) or None)
    return lend


def _lent_class():
    class Lent(_MemoryPointer):
        """A pool block lent to one array: ``__del__`` (or ``free()``) gives it back once,
        when the array and every view of it are gone."""

        def free(self):
            d = self.__dict__
            addr = d.pop("_addr", None)
            if addr is not None:
                (d.get("home") or _pool).give_back(d["_key"], addr)

        def __del__(self):
            try:
                self.free()
            except Exception:  # noqa: BLE001 - interpreter shutdown: no pool to give to
                pass
    return Lent


class scratch:
    """``with scratch(nbytes, stream_ptr) as ptr:`` a raw device pointer (int; None for 0
    bytes) for work queued on that stream inside the block, back to the pool at its end (for
    later work on the same stream). No array object: a workspace only needs its address."""
    __slots__ = ("key", "raw", "pool")

    def __init__(self, nbytes, stream_ptr):
        self.key = self.raw = self.pool = None
        if not nbytes:
            return
        if simulator() or config.get("dnn.allocator") != "caching":
            self.raw = numba_cuda().device_array(int(nbytes), dtype=np.uint8)
            return
        self.key = (device_id(), stream_key(int(stream_ptr)), rounded(int(nbytes)))
        self.pool, self.raw = _block(self.key)

    def __enter__(self):
        if self.raw is None:
            return None
        p = getattr(self.raw, "device_ctypes_pointer", None)
        return (p.value if p is not None else int(self.raw.device_pointer)) or None

    def __exit__(self, *exc):
        if self.key is not None:
            self.pool.give(self.key, self.raw)
        self.key = self.raw = self.pool = None


_on_empty = []     # functions called by empty_cache() (caches keyed by device addresses)
_holders = []      # (release, held_bytes) of blocks kept outside the cache


def on_empty_cache(fn):
    """Call ``fn()`` whenever the cache is emptied (e.g. conv_graph drops its variant packs,
    kept by device address)."""
    _on_empty.append(fn)


def register_holder(release, held_bytes):
    """A keeper of pool blocks outside the cache (cudnn/workspace.py's kept workspaces):
    ``release()`` gives them back at the start of every empty_cache(), so they are freed too;
    ``held_bytes()`` is their size (stats(); an out-of-memory retry runs while any are held)."""
    _holders.append((release, held_bytes))


def _held_bytes():
    return sum(held() for _, held in _holders)


def empty_cache():
    """Give every cached block back to the device now (arrays in use are unaffected). Numba's
    pointers sit in reference cycles and Numba defers their cuMemFree (an H100 still held a
    652 MiB workspace after the cache was emptied): a collection and the flush are forced."""
    for release, _ in _holders:
        release()
    if _pool.clear() and not simulator():
        gc.collect()
        _context().deallocations.clear()
    for fn in _on_empty:
        fn()


def stats():
    """{'hits', 'misses', 'cached_bytes', 'cached_blocks', 'held_bytes'} of the caching
    allocator (``held_bytes``: blocks kept outside the cache, cuDNN's workspaces)."""
    held = _held_bytes()
    with _pool.lock:
        return dict(hits=_pool.hits, misses=_pool.misses, cached_bytes=_pool.cached_bytes,
                    cached_blocks=sum(len(v) for v in _pool.free.values()), held_bytes=held)
