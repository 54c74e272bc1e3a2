"""The current device and its properties, below every other host module.

Which device is current (cheaply: several times per op call), whether Numba's CUDA simulator
runs, how many devices there are, the device that holds an array, a stream's raw handle, the
thread's current stream (set by ``dnnkit.stream``), waits between streams, CUDA-graph
capture status, and the device's properties (multiprocessor count, shared memory) read from
the device once and kept: launch shapes and algorithm rules scale with them instead of
assuming one GPU.

numba and cuda-bindings are imported inside the functions that need them: ``import dnnkit``
does not load them, and the tests choose Numba's simulator before numba is first imported.
"""

import contextlib
import itertools
import sys
import threading

from .errors import CaptureError, DnnkitError, NumbaUnavailableError

_available = None             # numba.cuda once a device (or the simulator) answered


def numba_cuda():
    """The ``numba.cuda`` module once a device (or the simulator) answers; else
    NumbaUnavailableError."""
    global _available
    if _available is not None:
        return _available
    from numba import cuda as numba_cuda
    if numba_cuda.is_available():      # a device does not go away: ask until the first yes
        _available = numba_cuda
        return numba_cuda
    raise NumbaUnavailableError(
        "no CUDA GPU or driver found for the Numba kernels; on a machine without a GPU set "
        "NUMBA_ENABLE_CUDASIM=1 before importing numba to use its (slow) CUDA simulator")


_ctx_devices = {}          # CUcontext handle -> device ordinal
_driver = None             # cuda.bindings.driver, imported on first use


def driver():
    global _driver
    if _driver is None:
        from cuda.bindings import driver as _driver
    return _driver


_simulator = None


def simulator():
    """Numba's CUDA simulator in use? (Read lazily: numba's configuration must not be loaded
    before the tests' conftest chooses the simulator; it is fixed once numba is imported.)"""
    global _simulator
    if _simulator is None:
        from numba import config
        _simulator = bool(config.ENABLE_CUDASIM)
    return _simulator


def device_id():
    """The current device's ordinal, cheaply: one driver call (cuCtxGetCurrent) and a dict
    lookup, instead of Numba's context machinery (~10 us). The first call in a thread with no
    current context goes through Numba, which creates or activates it."""
    if _one_device.__dict__.get("ready") or simulator():
        return 0
    nc = numba_cuda()
    err, ctx = driver().cuCtxGetCurrent()
    key = int(ctx) if err == 0 else 0
    dev = _ctx_devices.get(key) if key else None
    if dev is None:
        dev = getattr(nc.get_current_device(), "id", 0)
        err, ctx = driver().cuCtxGetCurrent()
        if err == 0 and int(ctx):
            _ctx_devices[int(ctx)] = dev
    if dev == 0 and key and device_count() == 1:
        _one_device.ready = True     # this thread has its context; no other device exists
    return dev


# Per thread: "one GPU, and this thread has made its context current" -- then device_id() is 0
# without asking the driver (it runs several times per op call).
_one_device = threading.local()
_devices = None


def device_count():
    global _devices
    if _devices is None:
        try:
            _devices = len(numba_cuda().gpus)
        except Exception:  # noqa: BLE001 - no driver: ask again next time
            return 0
    return _devices


def stream_pointer(stream):
    """The raw cudaStream_t of a Numba stream (0 for the legacy default stream)."""
    h = getattr(stream, "handle", None)
    if h is None:
        return 0
    v = getattr(h, "value", None) if not isinstance(h, int) else h
    if v is None and not hasattr(h, "value"):
        v = int(h)  # cuda-bindings CUstream
    return int(v or 0)


# ---------------------------------------------------------------- streams

# Per thread: the stream that ops called with stream=None run on, set by dnnkit.stream()
# (dnnkit/arrays.py): "stream" the Numba stream object, "key" its raw handle (an int; the
# memo's signature reads it). Empty: the legacy default stream.
stream_state = threading.local()

# The handles that the CUDA array interface and DLPack give the two default streams, and
# CU_STREAM_PER_THREAD's handle value
LEGACY_CODE, PER_THREAD_CODE, PER_THREAD = 1, 2, 2
CAPTURE_IMPLICIT = 906         # CUDA_ERROR_STREAM_CAPTURE_IMPLICIT


_thread_serial = threading.local()      # .key: its stream_key, .end: its _ThreadEnd
_serials = itertools.count(1)
_ended_hooks = []      # fn(stream key): a thread whose per-thread stream had a key has ended
_live_keys = set()     # the stream keys of threads that have not ended


def on_thread_end(fn):
    """Call ``fn(key)`` in a thread that was given :func:`stream_key` ``key`` for its
    per-thread default stream, as it ends: no work can be queued on that stream any more, so
    what is kept for it alone (cached blocks, a workspace, generator states) can go. Not
    called where another thread clears the ended one's state (daemon threads at exit, the
    other threads in a forked child): that thread may have died holding the locks the hooks
    take; what they would free stays until ``memory.empty_cache()``."""
    _ended_hooks.append(fn)


def thread_alive(key):
    """Whether the thread of per-thread stream key ``key`` has not ended."""
    return key in _live_keys


class _ThreadEnd:
    """Kept in a thread's ``threading.local``, which the thread drops as it ends. (Threads
    that C code gives a thread state per call, ctypes callbacks from a foreign thread, end at
    each call's return: their blocks are freed then.)"""
    __slots__ = ("key", "ident")

    def __init__(self, key):
        self.key, self.ident = key, threading.get_ident()

    def __del__(self):
        _live_keys.discard(self.key)
        if threading.get_ident() != self.ident or sys.is_finalizing():
            return
        error = None
        for fn in _ended_hooks:
            try:
                fn(self.key)
            except Exception as e:  # noqa: BLE001 - every hook runs; the first error is shown
                error = error or e
        if error is not None:
            raise error     # Python reports it ("Exception ignored in ... __del__")


def stream_key(stream_ptr):
    """What names raw stream ``stream_ptr`` in a cache kept per stream (the allocator's free
    blocks, kept workspaces, dropout generator states): the pointer itself, except for
    CU_STREAM_PER_THREAD, whose one handle value stands for each thread's own per-thread
    default stream -- work two threads queue there is not ordered, so what one thread's stream
    gave back must not serve the other's: (PER_THREAD, a number of the thread's own) there.
    Not the thread's ident: Python gives an ended thread's ident to the next thread, whose
    per-thread stream is another one."""
    if stream_ptr != PER_THREAD:
        return stream_ptr
    d = _thread_serial.__dict__
    key = d.get("key")
    if key is None:
        key = d["key"] = (PER_THREAD, next(_serials))
        _live_keys.add(key)
        d["end"] = _ThreadEnd(key)
    return key


def key_stream(key):
    """The raw stream pointer of a :func:`stream_key`."""
    return PER_THREAD if type(key) is tuple else key


def _check(err, what):
    if int(err):
        raise DnnkitError(f"{what} failed with {err}")


_events = threading.local()     # per thread: {device ordinal: the CUevent of stream_wait}


def stream_wait(consumer, producer):
    """Order the work queued on raw stream ``consumer`` from now on after everything queued
    so far on raw stream ``producer``: an event recorded on the producer and waited for on the
    consumer (cuEventRecord + cuStreamWaitEvent, ~2 us of host time); the host does not wait.
    One event per thread and device serves every call: the wait takes the event's latest
    record, made just before it on this thread. Nothing to do on the simulator (it runs every
    launch to the end at once)."""
    if consumer == producer or simulator():
        return
    drv, dev = driver(), device_id()
    ev = _events.__dict__.get(dev)
    if ev is None:
        err, ev = drv.cuEventCreate(int(drv.CUevent_flags.CU_EVENT_DISABLE_TIMING))
        _check(err, "cuEventCreate")
        _events.__dict__[dev] = ev
    (err,) = drv.cuEventRecord(ev, producer)
    _check(err, f"cuEventRecord on stream {producer:#x}")
    (err,) = drv.cuStreamWaitEvent(consumer, ev, 0)
    _check(err, f"cuStreamWaitEvent of stream {consumer:#x} on stream {producer:#x}")


def create_stream():
    """A new non-blocking stream's raw handle (cuStreamCreate, CU_STREAM_NON_BLOCKING: no
    implicit ordering with the legacy default stream, so default-stream work elsewhere neither
    waits for it nor joins a capture on it)."""
    drv = driver()
    err, s = drv.cuStreamCreate(int(drv.CUstream_flags.CU_STREAM_NON_BLOCKING))
    _check(err, "cuStreamCreate")
    return int(s)


def destroy_stream(ptr):
    (err,) = driver().cuStreamDestroy(ptr)
    _check(err, f"cuStreamDestroy of stream {ptr:#x}")


def is_capturing(stream_ptr):
    """Whether raw stream ``stream_ptr`` is being captured into a CUDA graph (an invalidated
    capture still counts until it ends); for the legacy stream 0, whether a blocking stream it
    would wait for is. Always False on the simulator, which cannot capture."""
    if simulator():
        return False
    err, status = driver().cuStreamIsCapturing(stream_ptr)
    if int(err) == CAPTURE_IMPLICIT:
        return True
    return not int(err) and int(status) != 0


def refuse_in_capture(what, why, stream_ptr=None):
    """Raise CaptureError naming ``what`` when the stream it would use -- ``stream_ptr``, else
    this thread's current stream -- is being captured into a CUDA graph: ``why`` says what a
    graph cannot hold (a host read, a timing run, a synchronisation). One driver query
    (cuStreamIsCapturing, under a microsecond), made where such work happens, never per op."""
    if stream_ptr is None:
        stream_ptr = stream_state.__dict__.get("key") or 0
    if is_capturing(stream_ptr):
        raise CaptureError(
            f"{what} cannot run while stream {stream_ptr:#x} is being captured into a CUDA "
            f"graph: {why}. Run it before the capture (the warm-up calls do) or after a "
            f"replay", what=what)


def capture_id(stream_ptr):
    """The id of the capture sequence raw stream ``stream_ptr`` is part of (a stream joined
    into a capture by an event shares the capturing stream's), or None when it is not being
    captured (always on the simulator)."""
    if simulator():
        return None
    out = driver().cuStreamGetCaptureInfo(stream_ptr)
    if int(out[0]) or int(out[1]) != 1:         # CU_STREAM_CAPTURE_STATUS_ACTIVE
        return None
    return int(out[2])


def refuse_foreign_capture(stream_ptr):
    """CaptureError when raw stream ``stream_ptr`` is being captured into a CUDA graph that
    dnnkit does not know of (``torch.cuda.graph``, CuPy's capture): dnnkit.memory asks before
    handing a block of its shared pool to work on a stream other than the legacy default
    (which cannot be captured) while no graph pool of dnnkit's is active on the thread. Such a
    block goes back to eager calls when its array dies, while every replay still writes it.
    One driver query, under a microsecond."""
    if is_capturing(stream_ptr):
        raise CaptureError(
            f"dnnkit: an allocation for work on stream {stream_ptr:#x}, which is being "
            f"captured into a CUDA graph that dnnkit does not know of. Capture dnnkit's ops "
            f"with dnnkit.graphs.capture, or with dnnkit.torch.graph(g) in place of "
            f"torch.cuda.graph(g): they give dnnkit's allocations a pool private to the graph "
            f"(a block of the shared pool would be handed to eager calls after the capture "
            f"while every replay still writes it)", what="dnnkit.memory")


@contextlib.contextmanager
def capture_relaxed():
    """This thread's stream-capture mode RELAXED inside the block (cuThreadExchangeStreamCapture
    Mode, restored after): a cuMemAlloc made while this thread captures is then allowed (under
    THREAD_LOCAL the driver refuses it and invalidates the capture). dnnkit.memory's
    graph-private pools allocate this way; the address is not part of the captured work and is
    never freed while the graph lives (PyTorch's allocator does the same)."""
    if simulator():
        yield
        return
    drv = driver()
    err, old = drv.cuThreadExchangeStreamCaptureMode(
        drv.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED)
    _check(err, "cuThreadExchangeStreamCaptureMode")
    try:
        yield
    finally:
        drv.cuThreadExchangeStreamCaptureMode(old)


def device_of(a):
    """The ordinal of the device holding Numba device array ``a``; None when unknown (the
    simulator's arrays). Kept on the array: it cannot change."""
    d = getattr(a, "__dict__", None)
    dev = d.get("_dnnkit_device") if d is not None else None
    if dev is None:
        try:
            dev = a.gpu_data.context.device.id
        except AttributeError:
            return None
        if d is not None:
            d["_dnnkit_device"] = dev
    return dev


def pointer_device(ptr):
    """The ordinal of the device that owns device address ``ptr``; None when the driver cannot
    tell. Asked through the runtime's cudaPointerGetAttributes: cuda-bindings 13.3's
    cuPointerGetAttribute answers 0 for CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL whatever the
    device (seen on two H200s), and the CONTEXT attribute is NULL for virtual-memory
    allocations (PyTorch's expandable segments)."""
    from cuda.bindings import runtime
    err, attrs = runtime.cudaPointerGetAttributes(ptr)
    if int(err) != 0 or int(attrs.type) != int(runtime.cudaMemoryType.cudaMemoryTypeDevice):
        return None
    return int(attrs.device)


def foreign_device(x):
    """The ordinal of the device holding foreign device array ``x`` (one exporting
    ``__cuda_array_interface__``); None when it holds no memory or the driver cannot tell."""
    ptr = x.__cuda_array_interface__["data"][0]
    return pointer_device(ptr) if ptr else None


# ---------------------------------------------------------------- properties

_properties = {}          # device ordinal -> DeviceProperties


class DeviceProperties:
    """What launch rules read of a device: its multiprocessor count and shared memory per
    block (opt-in maximum) and per multiprocessor. On the simulator: one small
    multiprocessor, so that grids stay a few blocks."""

    __slots__ = ("sm_count", "shared_per_block", "shared_per_sm", "name")

    def __init__(self, sm_count, shared_per_block, shared_per_sm, name):
        self.sm_count = sm_count
        self.shared_per_block = shared_per_block
        self.shared_per_sm = shared_per_sm
        self.name = name

    def __repr__(self):
        return (f"DeviceProperties({self.name!r}, sm_count={self.sm_count}, "
                f"shared_per_block={self.shared_per_block}, shared_per_sm={self.shared_per_sm})")


_SIMULATED = DeviceProperties(1, 48 * 1024, 64 * 1024, "simulator")


def properties(dev=None):
    """The properties of device ``dev`` (default: the current one), asked of the driver once."""
    if simulator():
        return _SIMULATED
    if dev is None:
        dev = device_id()
    p = _properties.get(dev)
    if p is None:
        h = numba_cuda().gpus[dev]       # the Device's attributes, no context switch
        p = DeviceProperties(
            int(h.MULTIPROCESSOR_COUNT),
            int(getattr(h, "MAX_SHARED_MEMORY_PER_BLOCK_OPTIN", 0)
                or h.MAX_SHARED_MEMORY_PER_BLOCK),
            int(h.MAX_SHARED_MEMORY_PER_MULTIPROCESSOR),
            h.name.decode() if isinstance(h.name, bytes) else str(h.name))
        _properties[dev] = p
    return p


def sm_count(dev=None):
    """The multiprocessor count of device ``dev`` (default: the current one); 1 on the
    simulator."""
    return properties(dev).sm_count
