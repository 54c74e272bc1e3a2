"""Input and output arrays, and streams.

Inputs: any object with ``__cuda_array_interface__`` (Numba, CuPy, PyTorch) is wrapped without
a copy (the dispatcher turns foreign arrays into Numba views before an op sees them:
dnnkit/foreign.py); NumPy arrays (and anything ``np.asarray`` accepts) are copied to the device.
Outputs are Numba device arrays. Streams: None (this thread's current stream: the one
``stream()`` made current, else the legacy default stream), 0 (the legacy default stream), a
Numba stream, a raw ``cudaStream_t`` int, or an object with ``.cuda_stream`` (PyTorch) or
``.ptr`` (CuPy).
"""

import contextlib

import numpy as np

from . import memory
from .device import (LEGACY_CODE, device_id, driver, foreign_device, numba_cuda, simulator,
                     stream_pointer, stream_state, stream_wait)
from .errors import DnnkitError

FLOAT_DTYPES = ("float16", "float32", "float64")
# dtype -> name by dict lookup (np.dtype(...).name costs ~2 us, called many times per op)
_FLOAT_NAMES = {np.dtype(n): n for n in FLOAT_DTYPES}


def float_name(dtype):
    """'float16' | 'float32' | 'float64', or None for any other dtype."""
    try:
        return _FLOAT_NAMES.get(dtype) or _FLOAT_NAMES.get(np.dtype(dtype))
    except TypeError:
        return None


_device_types = set()     # classes whose instances are Numba device arrays (asked once)


def is_device_array(a):
    if type(a) in _device_types:
        return True
    # imported here, as every numba import of dnnkit: `import dnnkit` does not load numba
    from numba.cuda.cudadrv import devicearray
    if not devicearray.is_cuda_ndarray(a):
        return False
    if getattr(type(a), "__cuda_ndarray__", False):     # a class attribute: every instance
        _device_types.add(type(a))
    return True


_default_streams = {}      # device id -> Numba's default-stream object
_external = {}             # (device id, raw handle) -> a Numba stream object wrapping it


def as_stream(stream):
    """A Numba stream object for kernel launches; ``None``: this thread's current stream (one
    read of a thread-local dict, on every op call)."""
    if stream is None:
        s = stream_state.__dict__.get("stream")
        if s is not None:
            return s
    cuda = numba_cuda()
    if stream is None or (isinstance(stream, int) and stream == 0):
        dev = device_id()
        s = _default_streams.get(dev)
        if s is None:
            s = _default_streams[dev] = cuda.default_stream()
        return s
    if hasattr(stream, "auto_synchronize"):  # already a Numba stream (real or simulated)
        return stream
    # PyTorch streams carry the handle as .cuda_stream, CuPy's as .ptr; either may be 0 (the
    # default stream), which must not read as "no handle"
    ptr = getattr(stream, "cuda_stream", None)
    if ptr is None:
        ptr = getattr(stream, "ptr", None)
    if ptr is None and isinstance(stream, int):
        ptr = stream
    if ptr is None:
        raise TypeError(f"stream must be None, a Numba stream, a cudaStream_t int or a PyTorch/"
                        f"CuPy stream, got {type(stream).__name__}")
    return external(int(ptr))


def external(ptr):
    """The Numba stream object for raw handle ``ptr`` (0: the legacy default stream), made
    once per device and handle: Numba's external_stream builds a new object each call, and a
    handle names one stream until it is destroyed (a later stream given the same handle is
    then the one it names)."""
    if ptr == 0:
        return as_stream(0)
    key = (device_id(), ptr)
    s = _external.get(key)
    if s is None:
        if len(_external) >= 256:
            _external.clear()
        s = _external[key] = numba_cuda().external_stream(ptr)
    return s


def current_stream():
    """This thread's current stream, a Numba stream object: the one ``stream()`` made current,
    else the legacy default stream. Ops called with ``stream=None`` run on it."""
    return as_stream(None)


@contextlib.contextmanager
def stream(s):
    """``with dnnkit.stream(s):`` -- ops called with ``stream=None`` inside the block run on
    ``s`` (this thread only; an inner block restores the outer one), as with
    ``torch.cuda.stream``. ``s``: anything ``stream=`` takes (a Numba, PyTorch or CuPy stream,
    a raw ``cudaStream_t``; 0 the legacy default stream); ``None`` changes nothing, as in
    PyTorch. Yields the Numba stream object. The memo keys calls by the current stream, so a
    call inside the block never replays a runner bound to another stream."""
    if s is None:
        yield as_stream(None)
        return
    ns = as_stream(s)
    d = stream_state.__dict__
    saved = d.get("stream"), d.get("key")
    d["stream"], d["key"] = ns, stream_pointer(ns)
    try:
        yield ns
    finally:
        d["stream"], d["key"] = saved


def host_contiguous(h):
    """h, or a C-ordered copy of it, with h's shape and the canonical C strides. NumPy calls an
    array C-contiguous whatever the strides of its length-1 axes (a reversed 1-element view
    has stride -itemsize), and Numba's copy to a real GPU then fails ("incompatible shape";
    the simulator does not check); np.ascontiguousarray returns such views unchanged and makes
    a 0-d array 1-d. tests/fuzz/test_fuzz.py exercises both."""
    if h.size == 0:
        return np.empty(h.shape, h.dtype)
    expect, step = [], h.itemsize
    for n in reversed(h.shape):
        expect.append(step)
        step *= n
    if h.strides == tuple(reversed(expect)):
        return h
    return np.array(h, dtype=h.dtype, order="C", copy=True)


def _foreign(cuda, x, stream):
    """A Numba view of a foreign device array (PyTorch, CuPy) reaching an op's checks directly
    (the dispatcher makes its views first, more cheaply: dnnkit/foreign.py). The CAI v3 stream
    is waited for by ``stream`` (an event), not by the host as Numba's ``as_cuda_array`` would.
    Numba ties the view to the current context whatever device holds the memory: the true
    device is asked of the driver and kept for the dispatcher's device check."""
    desc = x.__cuda_array_interface__
    d = cuda.from_cuda_array_interface(desc, owner=x, sync=False)
    s = desc.get("stream") if desc.get("version", 0) >= 3 else None
    if s is not None:
        stream_wait(stream_pointer(stream), 0 if s == LEGACY_CODE else int(s))
    dev = foreign_device(x)
    if dev is not None:
        d._dnnkit_device = dev
    return d


def device_input(op, name, x, stream, *, ndim=None):
    """Validate one floating-point input of ``op`` and return it as a Numba device array."""
    cuda = numba_cuda()
    if is_device_array(x):
        d = x
    elif hasattr(x, "__cuda_array_interface__"):
        if not hasattr(cuda, "as_cuda_array"):  # the simulator cannot wrap foreign memory
            raise TypeError(f"{op}: {name} is a foreign device array, which the CUDA "
                            "simulator cannot read")
        d = _foreign(cuda, x, stream)
    else:
        try:
            h = np.asarray(x)
        except Exception as e:
            raise TypeError(f"{op}: {name} must be an array, got {type(x).__name__}") from e
        if h.dtype.kind in "iub":
            raise TypeError(f"{op}: {name} must be a floating-point array (one of "
                            f"{', '.join(FLOAT_DTYPES)}), got dtype {h.dtype}")
        d = h
    if float_name(d.dtype) is None:
        raise TypeError(f"{op}: {name} must have dtype {', '.join(FLOAT_DTYPES)}; "
                        f"got {d.dtype}")
    if ndim is not None and d.ndim not in ndim:
        raise ValueError(f"{op}: {name} must be {' or '.join(f'{n}-D' for n in ndim)}; "
                         f"got shape {tuple(d.shape)}")
    if isinstance(d, np.ndarray):
        return cuda.to_device(host_contiguous(d), stream=stream)
    if not d.is_c_contiguous():
        raise ValueError(f"{op}: {name} must be C-contiguous; got shape {tuple(d.shape)} with "
                         f"strides {tuple(d.strides)} (copy it first)")
    return d


def same_shape(op, ref_name, ref, **others):
    for name, a in others.items():
        if tuple(a.shape) != tuple(ref.shape):
            raise ValueError(f"{op}: {name} has shape {tuple(a.shape)} but {ref_name} has "
                             f"{tuple(ref.shape)}")
        if a.dtype != ref.dtype:
            raise TypeError(f"{op}: {name} has dtype {a.dtype} but {ref_name} has {ref.dtype}")


def empty_like(a, stream):
    return cuda_empty(a.shape, a.dtype, stream)


def zero_fill(a, stream):
    """Fill the C-contiguous device array ``a`` with zeros, ordered on ``stream``; returns
    ``a``. A memset (cuMemsetD8Async), not a kernel: the answer of a sum over nothing (an
    empty batch, input or filter set) on any backend, cuDNN forced included."""
    if not a.size:
        return a
    if memory.watch is not None:
        memory.watch.fill(a, stream)
    if simulator():
        a.copy_to_device(np.zeros(a.shape, a.dtype), stream=stream)
        return a
    nbytes = int(a.size) * a.dtype.itemsize
    (err,) = driver().cuMemsetD8Async(a.device_ctypes_pointer.value, 0, nbytes,
                                    stream_pointer(stream))
    if int(err):
        raise DnnkitError(f"cuMemsetD8Async failed with {err} zeroing {nbytes} bytes")
    return a


def copy_into(dst, src, stream):
    """Copy C-contiguous device array ``src`` into ``dst`` (same number of bytes), ordered on
    ``stream`` and asynchronous to the host; returns ``dst``. (Numba's ``copy_to_device``
    lays out both arrays in pure Python and takes the synchronous cuMemcpyDtoD on the legacy
    default stream: the host waits for the GPU -- 0.3 ms a call in a training step.)"""
    nbytes = int(src.size) * src.dtype.itemsize
    if nbytes != int(dst.size) * dst.dtype.itemsize:
        raise ValueError(f"copy_into: {nbytes} bytes into {dst.size * dst.dtype.itemsize}")
    if not nbytes:
        return dst
    if memory.watch is not None:
        memory.watch.copy(dst, src, stream)
    if simulator():
        dst.copy_to_device(src.reshape(dst.shape), stream=stream)
        return dst
    (err,) = driver().cuMemcpyDtoDAsync(dst.device_ctypes_pointer.value,
                                        src.device_ctypes_pointer.value, nbytes,
                                        stream_pointer(stream))
    if int(err):
        raise DnnkitError(f"cuMemcpyDtoDAsync failed with {err} copying {nbytes} bytes")
    return dst


def flat(a):
    """A 1-D view of a C-contiguous device array (no copy)."""
    return reshaped(a, (a.size,)) if a.ndim != 1 else a


def reshaped(a, shape):
    """``a.reshape(shape)`` of a C-contiguous device array, without Numba's pure-Python layout
    (dnnkit.memory.reshaped)."""
    return memory.reshaped(a, shape)


def rows(a, start, stop=None):
    """``a[start]`` (``stop`` None) or ``a[start:stop]`` on the first dimension, a view. An empty
    array is reshaped instead: Numba refuses any slice of a buffer that has no memory ("non-empty
    slice into empty slice"), even one whose result is empty too."""
    if not a.size:
        rest = tuple(a.shape[1:])
        return reshaped(a, rest if stop is None else (stop - start,) + rest)
    return a[start] if stop is None else a[start:stop]


def to_host(a):
    """A NumPy copy of a device or host array."""
    if isinstance(a, np.ndarray):
        return a
    if hasattr(a, "copy_to_host"):
        return a.copy_to_host()
    return np.asarray(a)


_acc_dtypes = {}      # dtype as asked -> its accumulation dtype
_acc_cache = {}       # (device, accumulation dtype) -> the acc array
_acc_fast = {}        # (device, dtype as asked) -> the acc array


def acc_dtype(dtype):
    """Accumulation dtype of the Numba kernels: float32 for float16 and float32, else float64.
    (Kept per dtype as asked: ``np.dtype(d) == np.float64`` costs a few us of NumPy's Python
    on every Numba op call.)"""
    dt = _acc_dtypes.get(dtype)
    if dt is None:
        dt = np.dtype(np.float64) if np.dtype(dtype) == np.float64 else np.dtype(np.float32)
        _acc_dtypes[dtype] = dt
    return dt


def acc_array(dtype):
    """The kernels' one-element ``acc`` array (0 in the accumulation type), per device: one
    dict lookup a call once made."""
    dev = device_id()
    a = _acc_fast.get((dev, dtype))
    if a is None:
        dt = acc_dtype(dtype)
        a = _acc_cache.get((dev, dt.str))
        if a is None:
            a = _acc_cache[(dev, dt.str)] = numba_cuda().to_device(np.zeros(1, dtype=dt))
        _acc_fast[(dev, dtype)] = a
    return a


_constants = {}


def constant(values, dtype):
    """A small read-only device array of ``values``, made once per device and content. (Copying
    from pageable host memory makes the host wait for the stream's earlier work: per call, it
    would serialise the host's launches with the GPU.) Kernels must not write into it."""
    h = np.array(values, dtype=dtype, order="C")     # (ascontiguousarray makes 0-d 1-d)
    key = (device_id(), h.dtype.str, h.shape, h.tobytes())
    a = _constants.get(key)
    if a is None:
        if len(_constants) >= 256:
            _constants.clear()
        a = _constants[key] = numba_cuda().to_device(h)
    return a


def grid_1d(n, threads=256, max_blocks=4096):
    """(blocks, threads) for a grid-stride loop over ``n`` elements."""
    return max(1, min(max_blocks, (n + threads - 1) // threads)), threads


def allocator(shape, dtype, stream):
    """``alloc()`` -> ``cuda_empty(shape, dtype, stream)``, its setup done once
    (dnnkit.memory.allocator)."""
    return memory.allocator(shape, dtype, stream)


def cuda_empty(shape, dtype, stream):
    """An uninitialised device array (from dnnkit.memory's caching allocator)."""
    return memory.device_array(shape, dtype, stream)
