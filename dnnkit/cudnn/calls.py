"""Array-level cuDNN operations (the second layer, as CuPy's cupyx.cudnn over its bindings).

Inputs are device arrays exposing ``__cuda_array_interface__`` (already validated by the op);
``stream`` is the raw ``cudaStream_t`` value (0 = the legacy default stream).
"""


import numpy as np

from ..errors import DnnkitError
from . import api, descriptors, handle
from .descriptors import scalar_refs
from .enums import ACTIVATION, SOFTMAX_ALGO, SOFTMAX_MODE


def copy_async(dst_ptr, src, nbytes, stream_ptr):
    """Copy the first ``nbytes`` of device array ``src`` to the device address ``dst_ptr``,
    ordered on the raw stream ``stream_ptr`` and asynchronous to the host. (Numba's
    ``copy_to_device`` takes the synchronous cuMemcpyDtoD for the legacy default stream,
    which holds the host until the GPU has caught up: 0.23 ms a call in cuDNN dropout's
    RNG-state reset, H100.)"""
    if not nbytes:
        return
    from cuda.bindings import driver
    (err,) = driver.cuMemcpyDtoDAsync(dst_ptr, (_ptr(src) or 0), nbytes, stream_ptr)
    if int(err) != 0:
        raise DnnkitError(f"cuMemcpyDtoDAsync failed with {err} copying {nbytes} bytes")


def _ptr(a):
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


def _ctx(op, detail, **arrays):
    """A function that describes the call (only formatted when cuDNN reports an error)."""
    return lambda: f"{op}: " + ", ".join(f"{k} {tuple(v.shape)} {v.dtype}"
                                         for k, v in arrays.items()) + detail()


def _activation_desc(mode, coef):
    if mode == "swish":
        return descriptors.activation(ACTIVATION[mode], 0.0, coef)
    return descriptors.activation(ACTIVATION[mode], coef)


def bind_activation(backward, size, dtype, mode, coef, stream):
    """``run(x, y)`` (forward: y = f(x)) or ``run(x, y, dy, dx)`` (backward) for tensors of
    ``size`` elements of ``dtype`` (described as (1, 1, 1, size)): descriptors, scalars, the
    function and its checks bound once, for repeated calls of one signature."""
    alpha, beta = scalar_refs(dtype)
    tdesc = descriptors.tensor((1, 1, 1, size), dtype)
    adesc = _activation_desc(mode, coef)
    td, act = tdesc.ptr.value, adesc.ptr.value   # raw addresses: no conversion per call
    name = "cudnnActivationBackward" if backward else "cudnnActivationForward"
    fn, check, get = api.function(name), api.check, handle.getter(stream)

    def context():
        return f"activation{'_backward' if backward else ''}: {size} elements " \
               f"{np.dtype(dtype).name}, mode {mode}, coef {coef}"
    if backward:
        def run(x, y, dy, dx):
            st = fn(get(), act, alpha, td, _ptr(y), td, _ptr(dy), td, _ptr(x), beta, td,
                    _ptr(dx))
            if st:
                check(name, st, context)
    else:
        def run(x, y):
            st = fn(get(), act, alpha, td, _ptr(x), beta, td, _ptr(y))
            if st:
                check(name, st, context)
    run.keep = (tdesc, adesc)     # the descriptors live as long as the runner
    return run


def activation_forward(x, y, mode, coef, stream):
    """y = f(x) elementwise; the tensor is described as (1, 1, 1, size)."""
    bind_activation(False, x.size, x.dtype, mode, coef, stream)(x, y)


def activation_backward(x, y, dy, dx, mode, coef, stream):
    bind_activation(True, x.size, x.dtype, mode, coef, stream)(x, y, dy, dx)


def softmax_forward(x, y, dims, mode, algo, stream):
    """``dims`` is the 4-D (N, C, H, W) view of x that cuDNN's softmax reduces over."""
    alpha, beta = scalar_refs(x.dtype)
    td = descriptors.tensor(dims, x.dtype)
    api.call("cudnnSoftmaxForward", handle.get(stream), SOFTMAX_ALGO[algo], SOFTMAX_MODE[mode],
             alpha, td, _ptr(x), beta, td, _ptr(y),
             context=_ctx("softmax", lambda: f", algo {algo}, mode {mode}", x=x))


def softmax_backward(y, dy, dx, dims, mode, algo, stream):
    alpha, beta = scalar_refs(y.dtype)
    td = descriptors.tensor(dims, y.dtype)
    api.call("cudnnSoftmaxBackward", handle.get(stream), SOFTMAX_ALGO[algo], SOFTMAX_MODE[mode],
             alpha, td, _ptr(y), td, _ptr(dy), beta, td, _ptr(dx),
             context=_ctx("softmax_backward", lambda: f", algo {algo}, mode {mode}", y=y))
