"""Argument checks shared by the op families."""

import numpy as np


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
    return tuple(int(v) for v in t)
