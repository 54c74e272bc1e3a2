"""The ``out=`` argument of the elementwise ops (activation, activation_backward, dropout,
batch_norm_inference): the array the result is written into instead of a new one.

``out`` is a C-contiguous device array of the result's shape and dtype, on the call's device.
It is either one of the op's inputs (the very same memory: the op runs in place, each element
read before its result is written) or memory disjoint from all of them; a partial overlap is
refused, since elements would be read after another element's result overwrote them. The op
returns ``out`` itself. A ``dnnkit.Tensor`` passed as ``out`` comes back as that Tensor, its
version bumped and its history replaced (dnnkit/autograd.py ``rebase``).

Each backend runs in place where its library allows it: every Numba kernel of these ops is
elementwise (a thread reads element i, then writes element i), and cuDNN documents in-place
use for cudnnActivationForward (y == x) and cudnnActivationBackward (dx == dy), with identical
descriptors (dnnkit describes both with one). For the other cuDNN calls (dropout, batch-norm
inference, an activation backward writing over x or y) the API reference promises nothing,
so they write into a pool array that is then copied into ``out`` on the stream.
"""

import numpy as np

from .. import arrays
from ..dlpack import address


def output(op, out, like, stream, **inputs):
    """``out`` checked as the destination of ``op``'s result, which is shaped like ``like``;
    None when ``out`` is None (a new array). ``inputs``: the arrays it may equal or must not
    overlap, by parameter name. Raises TypeError for a host array or another dtype, ValueError
    for another shape, a non-contiguous array or a partial overlap, each naming ``op``."""
    if out is None:
        return None
    if isinstance(out, np.ndarray) or not (arrays.is_device_array(out) or
                                           hasattr(out, "__cuda_array_interface__")):
        raise TypeError(f"{op}: out must be a device array to write the result into; got "
                        f"{type(out).__name__}")
    out = arrays.device_input(op, "out", out, stream)
    if out.dtype != like.dtype:
        raise TypeError(f"{op}: out has dtype {out.dtype}, the result {like.dtype}")
    if tuple(out.shape) != tuple(like.shape):
        raise ValueError(f"{op}: out has shape {tuple(out.shape)}, the result "
                         f"{tuple(like.shape)}")
    if not out.size:
        return out
    lo = address(out)
    hi = lo + out.size * out.dtype.itemsize
    for name, a in inputs.items():
        if a is None or a is out or not a.size:
            continue
        a_lo = address(a)
        a_hi = a_lo + a.size * a.dtype.itemsize
        if (a_lo, a_hi) == (lo, hi) or a_hi <= lo or hi <= a_lo:
            continue
        raise ValueError(f"{op}: out overlaps {name} in part (bytes {lo:#x}-{hi:#x} against "
                         f"{a_lo:#x}-{a_hi:#x}); it must be {name} itself or separate memory")
    return out


def same(a, b):
    """Whether arrays ``a`` and ``b`` (checked by ``output``: equal size) are one memory."""
    return a is b or (a is not None and b is not None and bool(a.size) and
                      address(a) == address(b))


def result(out, like, stream):
    """The array an implementation writes into: ``out``, or a new one shaped like ``like``."""
    return arrays.empty_like(like, stream) if out is None else out


def through_copy(out, like, stream, write):
    """Run ``write(dst)`` where the library promises nothing about in-place use: into ``out``
    when it aliases no input (``like`` is the input it may equal), else into a pool array that
    is then copied into ``out`` on the stream. Returns the array holding the result."""
    if out is None:
        dst = arrays.empty_like(like, stream)
        write(dst)
        return dst
    if not same(out, like):
        write(out)
        return out
    tmp = arrays.empty_like(like, stream)
    write(tmp)
    return arrays.copy_into(out, tmp, stream)
