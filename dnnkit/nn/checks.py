"""Argument checks of the layer constructors and inputs: a bad argument raises TypeError (wrong
kind) or ValueError (wrong value) naming the layer, the argument and the value, before any
array is made -- as the ops check theirs."""

import numbers

import numpy as np

from .. import arrays
from ..ops.args import int_tuple
from ..tensors import Tensor, tensor


def integer(cls, name, value, minimum):
    """``value`` as an int >= minimum (ints and NumPy integers, not bools, floats or strings)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{cls}: {name} must be an int; got {value!r}")
    if value < minimum:
        raise ValueError(f"{cls}: {name} must be >= {minimum}; got {value}")
    if value >= 2**63:      # NumPy's sizes are 64-bit: its own error would name nothing
        raise ValueError(f"{cls}: {name} must be < 2**63; got {value}")
    return int(value)


def sizes(cls, name, value, nd, minimum):
    """An int or a sequence of ``nd`` ints, each >= minimum, as a tuple."""
    return int_tuple(cls, name, value, nd, minimum)


def real(cls, name, value, *, low=None, high=None, low_open=False, high_open=False):
    """``value`` as a float in the given range (NaN refused); TypeError for a non-number."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{cls}: {name} must be a real number; got {value!r}")
    v = float(value)
    bad = v != v
    if low is not None:
        bad = bad or (v <= low if low_open else v < low)
    if high is not None:
        bad = bad or (v >= high if high_open else v > high)
    if bad:
        lo = "" if low is None else f"{'(' if low_open else '['}{low}"
        hi = "" if high is None else f"{high}{')' if high_open else ']'}"
        where = f"in {lo or '(-inf'}, {hi or 'inf)'}"
        raise ValueError(f"{cls}: {name} must be {where}; got {value!r}")
    return v


def flag(cls, name, value):
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{cls}: {name} must be a bool; got {value!r}")
    return bool(value)


def float_dtype(cls, value):
    """The NumPy name of a float dtype (float16, float32, float64)."""
    try:
        name = arrays.float_name(np.dtype(value))
    except TypeError:
        name = None
    if name is None:
        raise TypeError(f"{cls}: dtype must be one of {', '.join(arrays.FLOAT_DTYPES)}; got "
                        f"{value!r}")
    return name


def seed(cls, value):
    if value is None:
        return None
    return integer(cls, "seed", value, 0)


def as_input(cls, x, dtype=None):
    """A layer's input as a Tensor: a Tensor as it is, a device array without a copy, a NumPy
    array copied in its dtype, a list or a number as ``dtype`` (the layer's parameter dtype,
    else float32). Integer arrays stay integers (class labels, token ids)."""
    if isinstance(x, Tensor):
        return x
    if arrays.is_device_array(x) or hasattr(x, "__cuda_array_interface__"):
        return tensor(x)
    try:
        h = np.asarray(x)
    except Exception as e:
        raise TypeError(f"{cls}: the input must be an array; got {type(x).__name__}") from e
    if h.dtype.kind not in "iuf":
        raise TypeError(f"{cls}: the input must be a numeric array; got {type(x).__name__} "
                        f"of dtype {h.dtype}")
    if isinstance(x, np.ndarray):
        return tensor(h)
    if h.dtype.kind == "f" and dtype is not None:
        h = h.astype(dtype)
    return tensor(h if h.dtype.kind != "f" or dtype is not None else h.astype(np.float32))
