"""Other libraries' device arrays as op arguments, at the cost of a Numba array.

An op called with a foreign array -- PyTorch, CuPy, JAX or any object with
``__cuda_array_interface__`` (CAI) or ``__dlpack__`` -- runs on a Numba view of the same memory,
without a copy. The dispatcher calls :func:`call` before anything else looks at the arguments
(dnnkit/dispatch.py); the views are Numba arrays, so the call then takes the memo as any other
(dnnkit/fastpath.py).

The cost. Numba's ``as_cuda_array`` builds a view in pure Python (12-20 us a call) and
synchronises the host with the producer's stream. Here a view is made from a template kept per
(device, address, shape, strides, dtype) -- a training loop hands the same buffers over and over
-- by copying two attribute dicts (~1 us); a PyTorch tensor's key is read from the tensor
itself (``data_ptr()``, ``shape``, ``stride()``, ``dtype``: C calls) instead of through its
``__cuda_array_interface__`` property, which is written in Python. Each call gets its own view
object holding the foreign array: the memory stays alive as long as the view, or an output view
or an autograd node made from it, does (dnnkit.torch's views kept from call to call are the
one exception: ``torch_view(owned=False)``).

Streams (docs/interop.md). The op runs on ``stream=`` when it is given, else on this thread's
current stream (``dnnkit.stream``), else -- when a PyTorch tensor is among the arguments -- on
PyTorch's current stream of that tensor's device (read only where PyTorch is already imported:
it is, if one of its tensors is here), else on the legacy default stream. The producer's stream
is PyTorch's current stream for its tensors, and the CAI v3 ``stream`` field for the others (1:
the legacy default stream, 2: the per-thread default stream; absent or None: the producer asks
for no ordering). Where it differs from the op's stream, the op's stream waits for it (an event
recorded on one and waited for on the other, device.stream_wait); the host never waits. A
DLPack producer is handed the op's stream (``__dlpack__(stream=...)``) and orders it itself.
"""

import sys

import numpy as np

from . import arrays, device, dlpack
from .device import LEGACY_CODE, simulator, stream_pointer, stream_state

MAX_TEMPLATES = 4096
_templates = {}      # key -> (the view's attributes, its pointer's attributes)
_adapters = {}       # type -> its adapter function, or None for a type that is not foreign
_torch_dtypes = {}   # torch dtype -> NumPy dtype (filled on first use)
_classes = []        # [DeviceNDArray, MemoryPointer] once numba is loaded


def _adapter(t):
    a = _adapters.get(t, 0)
    if a == 0:
        a = _adapters[t] = _choose(t)
    return a


def _choose(t):
    names = {c.__name__ for c in t.__mro__}
    if "DeviceNDArrayBase" in names or "FakeCUDAArray" in names or \
            t.__module__.startswith("dnnkit"):
        return None           # Numba's arrays, dnnkit's Tensors: not foreign
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(getattr(torch, "Tensor", None), type) and \
            issubclass(t, torch.Tensor):
        return _torch
    if hasattr(t, "__cuda_array_interface__"):
        return _cai
    if hasattr(t, "__dlpack__") and hasattr(t, "__dlpack_device__") and "ndarray" not in names:
        return _dlpack
    return None


_SEQUENCES = (list, tuple)      # arguments whose members are looked at (concatenate's)


def call(run, args, kw, backend):
    """``run(args, kw, backend)`` with every foreign array among the arguments as a Numba view
    of it, on the op's stream, after the producers' streams (module docstring); None when there
    is no foreign array (the caller goes on as usual)."""
    found, torch_dev = False, None
    for item in (*args, *kw.values()) if kw else args:    # (and a list argument's members)
        for a in item if type(item) in _SEQUENCES else (item,):
            ad = _adapters.get(type(a), 0)
            if ad == 0:
                ad = _adapter(type(a))
            if ad is not None:
                found = True
                if ad is _torch and torch_dev is None:
                    d = a.get_device()
                    torch_dev = d if d >= 0 else None
    if not found:
        return None
    explicit = kw.get("stream") if kw else None
    current = stream_state.__dict__.get("key")
    push = None
    if explicit is not None:
        consumer = stream_pointer(arrays.as_stream(explicit))
    elif current is not None:
        consumer = current
    elif torch_dev is not None:
        consumer = torch_stream(torch_dev)
        if consumer:
            push = arrays.external(consumer)
    else:
        consumer = 0
    # producers already waited for; PyTorch's current stream per device, asked once a call
    waited = {("torch", torch_dev): consumer} if current is None and explicit is None and \
        torch_dev is not None else {}
    new_args = [_adopt(a, consumer, waited) for a in args]
    new_kw = {k: _adopt(a, consumer, waited) for k, a in kw.items()} if kw else kw
    if push is None:
        return run(new_args, new_kw, backend)
    d = stream_state.__dict__
    d["stream"], d["key"] = push, consumer
    try:
        return run(new_args, new_kw, backend)
    finally:
        d["stream"] = d["key"] = None


def torch_view(t, stream, owned=True):
    """A Numba view of CUDA ``torch.Tensor`` ``t`` for an op on raw stream ``stream``, ordered
    after the tensor's producer (PyTorch's current stream of its device) where that differs:
    :func:`as_array`'s answer for one PyTorch tensor without its general dispatch (dnnkit.torch
    views several hundred tensors a training step, on PyTorch's current stream). ``t`` may
    require grad: the view only reads its memory (an autograd.Function's inputs need no
    detached copy). ``owned=False``: the view does not hold ``t`` (dnnkit.torch's views kept
    from call to call, bridge.held: whoever uses one holds ``t``)."""
    v, producer = _torch(t, stream, {}, True, owned)
    if producer is not None and producer != stream:
        device.stream_wait(stream, producer)
    return v


def _adopt(a, consumer, waited):
    t = type(a)
    if t in _SEQUENCES:
        if not any(_adapter(type(v)) is not None for v in a):
            return a
        return t(_adopt(v, consumer, waited) for v in a)
    ad = _adapters.get(t, 0)
    if ad == 0:
        ad = _adapter(t)
    if ad is None:
        return a
    view, producer = ad(a, consumer, waited)
    if producer is not None and producer != consumer and producer not in waited:
        waited[producer] = True
        device.stream_wait(consumer, producer)
    return view


def as_array(x, stream=None):
    """A Numba view of foreign array ``x`` (None when ``x`` is not one; a host array for a
    PyTorch CPU tensor or a DLPack host array), with ``stream`` (default: the current stream,
    where later ops on it run) ordered after its producer's stream: ``dnnkit.tensor()`` of a
    PyTorch, CuPy or DLPack array."""
    if _adapter(type(x)) is None:
        return None
    return _adopt(x, stream_pointer(arrays.as_stream(stream)), {})


# ---------------------------------------------------------------- the adapters
# Each takes (foreign array, the op's raw stream, the call's ``waited`` dict) and returns (a
# Numba view -- or a host array, which the op then copies as any host input -- and the
# producer's raw stream or None).

def torch_stream(dev):
    """PyTorch's current stream on device ``dev``, a raw handle (PyTorch is imported: one of
    its tensors is at hand). ``_cuda_getCurrentRawStream`` is the C call behind
    ``torch.cuda.current_stream(dev).cuda_stream`` (~0.2 us instead of ~3)."""
    torch = sys.modules["torch"]
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return int(raw(dev))
    return int(torch.cuda.current_stream(dev).cuda_stream)


def _torch(a, consumer, waited, grad_ok=False, owned=True):
    dev = a.get_device()
    if dev < 0:
        return np.asarray(a), None       # a CPU tensor: a host input (NumPy's view of it)
    if a.requires_grad and not grad_ok:     # PyTorch's own interface gives its error
        return _cai(a, consumer, waited)
    # keyed by PyTorch's own objects (torch.Size is a tuple; its dtype hashes fast)
    key = (dev, a.data_ptr(), a.shape, a.stride(), a.dtype)
    t = _templates.get(key)
    if t is None:
        dt = (_torch_dtypes or _torch_dtype_table()).get(a.dtype)
        if dt is None:      # bfloat16 and the like: PyTorch's interface gives its answer
            v, producer = _cai(a.detach() if a.requires_grad else a, consumer, waited)
            if not owned:
                v.gpu_data.__dict__["_owner"] = None
            return v, producer
        isz = dt.itemsize
        t = _template(key, a.data_ptr(), tuple(a.shape), tuple(s * isz for s in a.stride()),
                      dt, dev)
    producer = waited.get(("torch", dev))
    if producer is None:
        producer = waited[("torch", dev)] = torch_stream(dev)
    return _view(t, a if owned else None), producer


def _torch_dtype_table():
    torch = sys.modules["torch"]
    for name in ("float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8",
                 "bool"):
        _torch_dtypes[getattr(torch, name)] = np.dtype(name)
    return _torch_dtypes


def _cai(a, consumer, waited):
    d = a.__cuda_array_interface__
    if d.get("mask") is not None:
        raise TypeError(f"a masked array ({type(a).__name__} with a CAI mask) is not supported")
    ptr = d["data"][0] or 0
    shape = tuple(d["shape"])
    strides = d.get("strides")
    strides = tuple(strides) if strides is not None else None
    s = d.get("stream") if d.get("version", 0) >= 3 else None
    producer = None if s is None else (0 if s in (0, LEGACY_CODE) else int(s))
    # keyed by the typestr as given: its dtype is made only for a new template (~0.3 us)
    key = (ptr, shape, strides, d["typestr"])
    t = _templates.get(key)
    if t is None:
        dt = np.dtype(d["typestr"])
        if strides is None:
            strides = _c_strides(shape, dt.itemsize)
        t = _template(key, ptr, shape, strides, dt, None)
    return _view(t, a), producer


def _dlpack(a, consumer, waited):
    kind, dev = a.__dlpack_device__()
    if int(kind) == dlpack.CPU:
        h = np.from_dlpack(a)
        if simulator():     # the simulator's device memory is host memory: a view, no copy
            from numba.cuda.simulator.cudadrv.devicearray import FakeCUDAArray
            return FakeCUDAArray(h), None
        return h, None                        # a host input: copied by the op
    if int(kind) not in dlpack.CUDA_KINDS:
        raise TypeError(f"a DLPack array on device type {int(kind)} (not CUDA) cannot be an "
                        f"op input")
    code = LEGACY_CODE if consumer == 0 else consumer
    try:
        capsule = a.__dlpack__(stream=code, max_version=dlpack.VERSION)
    except TypeError:              # a producer older than DLPack 1.0's keywords
        capsule = a.__dlpack__(stream=code)
    ptr, shape, strides, dt, dev, holder = dlpack.consume(capsule)
    key = ("dlpack", dev, ptr, shape, strides, dt.str)
    t = _templates.get(key) or _template(key, ptr, shape, strides, dt, dev)
    return _view(t, holder), None       # the producer ordered the op's stream itself


def _c_strides(shape, itemsize):
    out, n = [], itemsize
    for s in reversed(shape):
        out.append(n)
        n *= s
    return tuple(reversed(out))


# ---------------------------------------------------------------- views

def _template(key, ptr, shape, strides, dtype, dev):
    """(array attributes, pointer attributes) of a Numba view of ``ptr``, built once through
    Numba (its constructors lay the view out in Python) and kept under ``key``. ``dev``: the
    device holding the memory (None: asked of the driver where there are several)."""
    if simulator():
        raise TypeError("a foreign device array (CUDA array interface or DLPack on a CUDA "
                        "device) cannot be read by the CUDA simulator")
    from numba.cuda.api import from_cuda_array_interface
    if not _classes:
        from numba.cuda.cudadrv.devicearray import DeviceNDArray
        from numba.cuda.cudadrv.driver import MemoryPointer
        _classes[:] = [DeviceNDArray, MemoryPointer]
    v = from_cuda_array_interface(
        {"shape": shape, "strides": strides, "typestr": np.dtype(dtype).str,
         "data": (ptr, False), "version": 2}, owner=None, sync=False)
    v._numba_type_          # a cached property: computed once, into the template
    if dev is None:
        dev = 0 if device.device_count() <= 1 else (device.pointer_device(ptr) if ptr else None)
    attrs = dict(v.__dict__)
    pointer = dict(attrs.pop("gpu_data").__dict__)
    pointer.pop("_owner", None)
    attrs["stream"] = 0
    attrs["_dnnkit_ptr"] = ptr or None
    if dev is not None:
        attrs["_dnnkit_device"] = dev
    if len(_templates) >= MAX_TEMPLATES:
        _templates.clear()
    t = _templates[key] = (attrs, pointer)
    return t


def _view(t, owner):
    """A new Numba array from template ``t`` whose pointer holds ``owner`` (the foreign array,
    or a DLPack capsule's holder): Numba's views of it hold the pointer's owner in turn."""
    attrs, pointer = t
    arr_cls, ptr_cls = _classes
    mp = object.__new__(ptr_cls)
    md = mp.__dict__
    md.update(pointer)
    md["_owner"] = owner
    arr = object.__new__(arr_cls)
    d = arr.__dict__
    d.update(attrs)
    d["gpu_data"] = mp
    return arr
