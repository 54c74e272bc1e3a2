"""The core of the ctypes layer over the cuDNN 9 C API, shared by every op family.

- ``PROTOTYPES``: the functions every family uses (handles, tensor descriptors, the version and
  error strings). Each family declares its own functions in its own file with
  ``register_prototypes`` (C signatures as comments), so a family's calls and their prototypes
  sit together.
- ``library()``, ``function(name)``: the loaded library and its functions, prototypes set.
- ``check()`` and ``call(name, *args, context=...)``: a status other than
  CUDNN_STATUS_SUCCESS raises ``dnnkit.CudnnError`` with the function, the status name and the
  context (shapes, values).
- ``ptr()`` and ``copy_async()``: device arrays as cuDNN takes them (raw addresses).
"""

import ctypes
import threading
from ctypes import POINTER, c_int, c_size_t, c_void_p

from .. import config, device
from ..errors import CudnnError, CudnnUnavailableError, DnnkitError
from . import loader
from .enums import STATUS_SUCCESS

_p = c_void_p     # every opaque handle/descriptor and every device pointer
_int_p = POINTER(c_int)

PROTOTYPES = {
    # cudnnStatus_t cudnnCreate(cudnnHandle_t *handle);
    "cudnnCreate": [POINTER(_p)],
    # cudnnStatus_t cudnnDestroy(cudnnHandle_t handle);
    "cudnnDestroy": [_p],
    # cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t streamId);
    "cudnnSetStream": [_p, _p],
    # cudnnStatus_t cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t *tensorDesc);
    "cudnnCreateTensorDescriptor": [POINTER(_p)],
    # cudnnStatus_t cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t tensorDesc);
    "cudnnDestroyTensorDescriptor": [_p],
    # cudnnStatus_t cudnnSetTensorNdDescriptor(cudnnTensorDescriptor_t tensorDesc,
    #     cudnnDataType_t dataType, int nbDims, const int dimA[], const int strideA[]);
    "cudnnSetTensorNdDescriptor": [_p, c_int, c_int, _int_p, _int_p],
    # const char *cudnnGetErrorString(cudnnStatus_t status);
    "cudnnGetErrorString": [c_int],
    # size_t cudnnGetVersion(void);
    "cudnnGetVersion": [],
}
RESTYPES = {"cudnnGetErrorString": ctypes.c_char_p, "cudnnGetVersion": c_size_t}


def register_prototypes(prototypes, restypes=None):
    """Add an op family's prototypes (kept beside its calls, C signatures as comments)."""
    clash = set(prototypes) & set(PROTOTYPES)
    if clash:
        raise ValueError(f"cuDNN prototypes declared twice: {sorted(clash)}")
    PROTOTYPES.update(prototypes)
    RESTYPES.update(restypes or {})


_bound = {}  # id(lib) -> {name: function with prototype set}


def library():
    """The loaded ctypes library; raises CudnnUnavailableError when cuDNN cannot be used."""
    st = loader.status()
    if not st.available:
        raise CudnnUnavailableError(f"cuDNN cannot be used: {st.describe()}", reason=st.reason)
    return st.lib


# Per thread (a change_flags block is per thread): [merged flags, epoch, probe cache,
# {name: function}]
_fast = threading.local()


def function(name):
    """cuDNN function ``name`` of the library the flags name, its prototype set. Repeated
    lookups under the same flags (no ``change_flags`` block entered or left, no new probe)
    are one dict lookup: every cuDNN call asks."""
    f = _fast.__dict__.get("v")
    if f is not None and f[0] is config.state.merged and f[2] is loader.probed() and \
            f[1] == config.state.local.__dict__.get("epoch"):
        fn = f[3].get(name)
        if fn is not None:
            return fn
    fn = _function(name)
    merged, epoch, probed = (config.state.merged, config.state.local.__dict__.get("epoch"),
                             loader.probed())
    if merged is None:
        return fn
    if f is None or f[0] is not merged or f[1] != epoch or f[2] is not probed:
        f = _fast.v = [merged, epoch, probed, {}]
    f[3][name] = fn
    return fn


def _function(name):
    lib = library()
    table = _bound.get(id(lib))
    if table is None:
        table = _bound.setdefault(id(lib), {})
    fn = table.get(name)
    if fn is None:
        fn = getattr(lib, name)
        fn.argtypes = PROTOTYPES[name]
        fn.restype = RESTYPES.get(name, c_int)
        table[name] = fn
    return fn


def status_name(status):
    return loader.status_name(library(), status)


def check(name, status, context=""):
    """Raise CudnnError unless ``status`` is CUDNN_STATUS_SUCCESS. ``context`` is a string
    or a function returning one (called only on failure: formatting shapes into a message on
    every successful call costs more than the call itself)."""
    if status != STATUS_SUCCESS:
        if callable(context):
            context = context()
        raise CudnnError(name, status, status_name(status), context)


def call(name, *args, context=""):
    """Call cuDNN function ``name`` and check its status."""
    status = function(name)(*args)
    if status != STATUS_SUCCESS:
        check(name, status, context)


def ptr(a):
    """The device address of an array, as an int (ctypes passes it as void*). A Numba array's
    is read once and kept on the array (it cannot change); others through the interface."""
    d = getattr(a, "__dict__", None)
    if d is not None:
        p = d.get("_dnnkit_ptr")
        if p is not None:
            return p
    c = getattr(a, "device_ctypes_pointer", None)
    if c is None:
        return a.__cuda_array_interface__["data"][0] or None
    p = c.value or None
    if d is not None:
        d["_dnnkit_ptr"] = p
    return p


def copy_async(dst_ptr, src, nbytes, stream_ptr):
    """Copy the first ``nbytes`` of device array ``src`` to the device address ``dst_ptr``,
    ordered on the raw stream ``stream_ptr`` and asynchronous to the host. (Numba's
    ``copy_to_device`` takes the synchronous cuMemcpyDtoD for the legacy default stream,
    which holds the host until the GPU has caught up: 0.23 ms a call in cuDNN dropout's
    RNG-state reset, H100.)"""
    if not nbytes:
        return
    (err,) = device.driver().cuMemcpyDtoDAsync(dst_ptr, (ptr(src) or 0), nbytes, stream_ptr)
    if int(err) != 0:
        raise DnnkitError(f"cuMemcpyDtoDAsync failed with {err} copying {nbytes} bytes")
