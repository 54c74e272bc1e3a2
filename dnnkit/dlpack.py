"""DLPack: dnnkit's arrays to other libraries and theirs to dnnkit, without a copy.

Export (``Tensor.__dlpack__``, :func:`to_dlpack`): a PyCapsule that ``torch.from_dlpack``,
``cupy.from_dlpack``, ``jax.dlpack.from_dlpack`` or ``numpy.from_dlpack`` read. Named
"dltensor_versioned" and holding a ``DLManagedTensorVersioned`` (DLPack 1.0) when the consumer
passes ``max_version`` (1, 0) or later, else "dltensor" with a ``DLManagedTensor`` (the 0.8 ABI).
The structs are built with ctypes (layouts below, from dlpack.h); the struct, its shape and
strides arrays (strides in elements, always given) and the exported array are kept in a table
under the struct's address until the consumer calls the deleter -- PyTorch, CuPy and NumPy call
it when their array dies -- so the memory cannot go back to dnnkit's pool while another library
reads it. A capsule nobody consumed calls the deleter itself when it is collected (its
destructor checks the name: a consumer renames it "used_dltensor[_versioned]").

Streams: the consumer passes its stream (``stream=``: 1 the legacy default stream, 2 the
per-thread default, another int a handle, -1 "no ordering", None the legacy default). When it
differs from the stream the array was made on (the one Numba records on the array, which
dnnkit's allocator sets to the op's stream; else this thread's current stream), the consumer's
stream waits for it by an event; the host never waits.

Import (:func:`consume`, used by dnnkit/foreign.py for inputs that have ``__dlpack__`` but no
``__cuda_array_interface__``): the capsule's struct is read, the capsule renamed as used, and
a holder calls the producer's deleter when the last view of the memory dies.

On Numba's CUDA simulator the "device" memory is host memory: its arrays are exported as
kDLCPU, which ``numpy.from_dlpack`` reads (the tests' round trip).
"""

import ctypes

import numpy as np

from . import arrays, device
from .device import LEGACY_CODE, PER_THREAD, PER_THREAD_CODE, simulator, stream_pointer, \
    stream_state

CPU, CUDA, CUDA_HOST, CUDA_MANAGED = 1, 2, 3, 13      # DLDeviceType
CUDA_KINDS = (CUDA, CUDA_MANAGED)
VERSION = (1, 0)
IS_COPIED = 1 << 1                                     # DLPACK_FLAG_BITMASK_IS_COPIED
_INT, _UINT, _FLOAT, _BOOL = 0, 1, 2, 6                # DLDataTypeCode


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    # deleter: void (*)(DLManagedTensor *self), kept as its address
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("version", DLPackVersion), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p), ("flags", ctypes.c_uint64),
                ("dl_tensor", DLTensor)]


NAMES = {False: b"dltensor", True: b"dltensor_versioned"}
USED = {False: b"used_dltensor", True: b"used_dltensor_versioned"}
_DELETER_T = ctypes.CFUNCTYPE(None, ctypes.c_void_p)

_api = ctypes.pythonapi
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
_api.PyCapsule_SetName.restype = ctypes.c_int
_api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]

_alive = {}       # struct address -> (struct, shape, strides, the exported array)


def _delete(addr):
    """The deleter of every exported struct: drop what kept the array alive."""
    _alive.pop(addr, None)


def _capsule_gone(capsule):
    """The capsule's destructor: a capsule still named as made was never consumed."""
    for versioned in (False, True):
        if _api.PyCapsule_IsValid(capsule, NAMES[versioned]):
            _delete(_api.PyCapsule_GetPointer(capsule, NAMES[versioned]))
            return


_DELETER = _DELETER_T(_delete)
_DESTRUCTOR = _DELETER_T(_capsule_gone)
_DELETER_ADDR = ctypes.cast(_DELETER, ctypes.c_void_p).value
_DESTRUCTOR_ADDR = ctypes.cast(_DESTRUCTOR, ctypes.c_void_p).value
# A consumer may call the deleter late (a PyTorch tensor freed while the interpreter shuts
# down): the callbacks' code must outlive every module, so one reference to each is never
# given back.
for _cb in (_DELETER, _DESTRUCTOR):
    _api.Py_IncRef(ctypes.py_object(_cb))


def pending():
    """How many exported structs are still held (consumed or not, not yet deleted)."""
    return len(_alive)


# ---------------------------------------------------------------- export

def dl_dtype(dtype):
    """The DLDataType of a NumPy dtype; TypeError for one DLPack cannot name here."""
    dt = np.dtype(dtype)
    code = {"f": _FLOAT, "i": _INT, "u": _UINT, "b": _BOOL}.get(dt.kind)
    if code is None:
        raise TypeError(f"DLPack export: dtype {dt} has no DLPack type here")
    return DLDataType(code, dt.itemsize * 8, 1)


def device_of_array(a):
    """(DLDeviceType, device ordinal) of a dnnkit/Numba array: (kDLCPU, 0) on the simulator,
    whose arrays live in host memory."""
    if simulator():
        return CPU, 0
    dev = device.device_of(a)
    return CUDA, (device.device_id() if dev is None else dev)


def address(a):
    """The data address of a dnnkit/Numba array (the simulator's: its NumPy buffer's)."""
    if simulator():
        return a.ctypes.data if a.size else 0     # the simulated array's NumPy buffer
    p = a.device_ctypes_pointer.value
    return p or 0


def _consumer_handle(stream):
    """The raw handle a DLPack ``stream=`` names; None for -1 (no ordering asked). 0, which the
    protocol leaves out as ambiguous, is taken as the legacy default stream."""
    if stream is None:
        return 0
    if isinstance(stream, bool) or not isinstance(stream, int) or stream < -1:
        raise ValueError(f"__dlpack__: stream must be None, -1, 1, 2 or a stream handle; got "
                         f"{stream!r}")
    if stream == -1:
        return None
    return {LEGACY_CODE: 0, PER_THREAD_CODE: PER_THREAD}.get(stream, stream)


def export(a, stream=None, max_version=None, dl_device=None, copy=None):
    """A DLPack capsule of C-contiguous or strided dnnkit/Numba array ``a`` (the protocol's
    ``__dlpack__``; module docstring). ``copy=True`` exports a fresh device copy (flag
    IS_COPIED); ``dl_device``: must be the array's device (BufferError otherwise)."""
    kind, dev = device_of_array(a)
    if dl_device is not None and (int(dl_device[0]), int(dl_device[1])) != (kind, dev):
        raise BufferError(f"__dlpack__: the array is on device {(kind, dev)}, "
                          f"dl_device={tuple(dl_device)} asked (dnnkit does not copy across "
                          f"devices)")
    versioned = max_version is not None and tuple(max_version)[0] >= 1
    flags = 0
    if not simulator():
        consumer = _consumer_handle(stream)
        rec = getattr(a, "stream", 0)
        producer = stream_pointer(rec) if rec else (stream_state.__dict__.get("key") or 0)
        if copy:
            a = _device_copy(a, producer)
            flags |= IS_COPIED
        if consumer is not None:
            device.stream_wait(consumer, producer)
    elif copy:
        a = a.copy_to_host()
        from numba import cuda
        a = cuda.to_device(a)
        flags |= IS_COPIED
    return _capsule(a, kind, dev, versioned, flags)


def _device_copy(a, stream_ptr):
    out = arrays.cuda_empty(a.shape, a.dtype, arrays.external(stream_ptr))
    nbytes = int(a.size) * a.dtype.itemsize
    if nbytes:
        (err,) = device.driver().cuMemcpyDtoDAsync(address(out), address(a), nbytes,
                                                   stream_ptr)
        if int(err):
            raise BufferError(f"__dlpack__(copy=True): cuMemcpyDtoDAsync failed with {err}")
    return out


def _capsule(a, kind, dev, versioned, flags):
    ndim, isz = len(a.shape), a.dtype.itemsize
    shape = (ctypes.c_int64 * max(ndim, 1))(*a.shape)
    strides = (ctypes.c_int64 * max(ndim, 1))(*(s // isz for s in a.strides))
    m = DLManagedTensorVersioned() if versioned else DLManagedTensor()
    t = m.dl_tensor
    t.data = address(a) or None
    t.device = DLDevice(kind, dev)
    t.ndim = ndim
    t.dtype = dl_dtype(a.dtype)
    t.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
    t.strides = ctypes.cast(strides, ctypes.POINTER(ctypes.c_int64))
    t.byte_offset = 0
    m.manager_ctx = None
    m.deleter = _DELETER_ADDR
    if versioned:
        m.version = DLPackVersion(*VERSION)
        m.flags = flags
    addr = ctypes.addressof(m)
    _alive[addr] = (m, shape, strides, a)
    return _api.PyCapsule_New(addr, NAMES[versioned], _DESTRUCTOR_ADDR)


def to_dlpack(a, stream=None):
    """A DLPack capsule ("dltensor", the form every consumer reads) of dnnkit Tensor or Numba
    device array ``a``, for ``torch.from_dlpack(capsule)`` or ``cupy.from_dlpack(capsule)``;
    ``stream``: the consumer's stream as in ``__dlpack__`` (default: the legacy default
    stream)."""
    return export(a.data if hasattr(a, "grad_fn") else a, stream=stream)


# ---------------------------------------------------------------- import

class Holder:
    """Keeps a consumed DLPack tensor alive: calls the producer's deleter when collected (the
    views of its memory hold it)."""

    __slots__ = ("addr", "deleter", "__weakref__")

    def __init__(self, addr, deleter):
        self.addr, self.deleter = addr, deleter

    def __del__(self):
        if self.deleter:
            d, self.deleter = self.deleter, None
            _DELETER_T(d)(self.addr)


def _np_dtype(t):
    if t.lanes != 1:
        raise TypeError(f"DLPack input: vector types (lanes={t.lanes}) are not supported")
    kind = {_FLOAT: "f", _INT: "i", _UINT: "u", _BOOL: "b"}.get(t.code)
    if kind is None:
        raise TypeError(f"DLPack input: type code {t.code} ({t.bits} bits; bfloat16, complex "
                        f"or opaque) is not supported")
    return np.dtype("bool" if kind == "b" else f"{kind}{t.bits // 8}")


def consume(capsule):
    """(address, shape, strides in bytes, NumPy dtype, device ordinal, holder) of an unused
    DLPack capsule; the capsule is renamed as used, and ``holder`` calls the producer's
    deleter when it is collected."""
    for versioned in (True, False):
        if _api.PyCapsule_IsValid(id(capsule), NAMES[versioned]):
            break
    else:
        raise TypeError("not an unused DLPack capsule (named 'dltensor' or "
                        "'dltensor_versioned')")
    addr = _api.PyCapsule_GetPointer(id(capsule), NAMES[versioned])
    m = (DLManagedTensorVersioned if versioned else DLManagedTensor).from_address(addr)
    if versioned and m.version.major > VERSION[0]:
        raise BufferError(f"DLPack input: version {m.version.major}.{m.version.minor} is newer "
                          f"than {VERSION[0]}.{VERSION[1]}")
    t = m.dl_tensor
    dt = _np_dtype(t.dtype)
    shape = tuple(int(t.shape[i]) for i in range(t.ndim))
    if t.strides:
        strides = tuple(int(t.strides[i]) * dt.itemsize for i in range(t.ndim))
    else:                    # NULL: compact row-major
        strides, n = [], dt.itemsize
        for s in reversed(shape):
            strides.append(n)
            n *= s
        strides = tuple(reversed(strides))
    ptr = (t.data or 0) + int(t.byte_offset)
    holder = Holder(addr, m.deleter)
    _api.PyCapsule_SetName(capsule, USED[versioned])
    return ptr, shape, strides, dt, int(t.device.device_id), holder
