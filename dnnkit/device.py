"""The current device and its properties, below every other host module.

Which device is current (cheaply: several times per op call), whether Numba's CUDA simulator
runs, how many devices there are, the device that holds an array, a stream's raw handle, and
the device's properties (multiprocessor count, shared memory) read from the device once and
kept: launch shapes and algorithm rules scale with them instead of assuming one GPU.

numba and cuda-bindings are imported inside the functions that need them: ``import dnnkit``
does not load them, and the tests choose Numba's simulator before numba is first imported.
"""

import threading

from .errors import NumbaUnavailableError

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
