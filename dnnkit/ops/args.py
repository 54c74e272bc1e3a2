"""Argument checks shared by the op families."""

import numpy as np

INT64_LIMIT = 2**63     # sizes, strides and paddings reach the kernels as int64


def int_tuple(op, name, value, nd, minimum):
    """``value`` (an int, or a sequence of ``nd`` ints) as a tuple of ``nd`` ints >= minimum;
    TypeError / ValueError naming the op, the argument and the value otherwise."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        value = (int(value),) * nd
    try:
        t = tuple(value)
    except TypeError:
        raise TypeError(f"{op}: {name} must be an int or a tuple of {nd} ints; got {value!r}") \
            from None
    if len(t) != nd or not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool)
                               for v in t):
        raise TypeError(f"{op}: {name} must be an int or a tuple of {nd} ints; got {value!r}")
    if any(v < minimum for v in t):
        raise ValueError(f"{op}: {name} must be >= {minimum} in every dimension; got {value!r}")
    if any(v >= INT64_LIMIT for v in t):
        raise ValueError(f"{op}: {name} must be < 2**63 (the kernels' 64-bit sizes); got "
                         f"{value!r}")
    return tuple(int(v) for v in t)


def choice(op, name, value, allowed, *, also=()):
    """``value`` when it is one of the strings ``allowed`` (or of ``also``, accepted aliases);
    ValueError naming the op, the argument, the choices and the value otherwise -- whatever
    ``value`` is (a list, a dict, None: compared without hashing it)."""
    if isinstance(value, str) and (value in allowed or value in also):
        return value
    shown = ", ".join(allowed) + (f" (or {', '.join(also)})" if also else "")
    raise ValueError(f"{op}: {name} must be one of {shown}; got {value!r}")


# The activations an op fuses after its own result (``activation=``: None or one of these):
# batch norm, the convolutions, linear.
FUSED_ACTIVATIONS = ("relu",)


def fused_activation(op, activation):
    """None, or ``activation`` when it is one of FUSED_ACTIVATIONS (ValueError naming the op
    and the value otherwise)."""
    return None if activation is None else choice(op, "activation", activation,
                                                  FUSED_ACTIVATIONS)


def shape_tuple(op, name, shape, rank):
    """``shape`` (a sequence of ``rank`` ints >= 0: ints or NumPy integers, not bools, floats
    or strings) as a tuple of ints; TypeError / ValueError naming the op, the argument and the
    value otherwise."""
    if isinstance(shape, (str, bytes)):
        raise TypeError(f"{op}: {name} must be a tuple of {rank} ints; got {shape!r}")
    try:
        t = tuple(shape)
    except TypeError:
        raise TypeError(f"{op}: {name} must be a tuple of {rank} ints; got {shape!r}") from None
    if not all(isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))
               for v in t):
        raise TypeError(f"{op}: {name} must be a tuple of {rank} ints; got {shape!r}")
    if len(t) != rank or any(v < 0 or v >= INT64_LIMIT for v in t):
        raise ValueError(f"{op}: {name} must be {rank} sizes >= 0 and < 2**63; got {shape!r}")
    return tuple(int(v) for v in t)
