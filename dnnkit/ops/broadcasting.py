"""Broadcasting geometry shared by ops/arith.py, ops/reduce.py and ops/shape.py: NumPy's
broadcast rule, the strides that read an array as a broadcast shape, the merging of
neighbouring dimensions that are walked alike, the Numba kernels' ``geo`` tuples, and the
shape and axis arguments' checks.

A walk is y's C-order traversal over some dims, with one element stride per operand and dim
(0 where the operand is broadcast). Merging drops dims of size 1 and joins neighbours k, k+1
where every operand steps alike (stride[k] == stride[k+1] * shape[k+1]): a same-shape
operation becomes one dim, a per-channel one (N, C, H*W); each merged dim is then either
read whole or broadcast whole by each operand, which is also the form cuDNN's broadcasting
calls take (an operand's dim equal to the output's or 1).
"""

import numpy as np

from .. import arrays, device

MAXDIM = 8           # kernels/arith.py and kernels/reduce.py: dimensions per walk
CUDNN_ADD_DIMS = 5   # cudnnAddTensor / cudnnOpTensor: at most 5-D tensors
COPY, MULTIPLY = 4, 2            # kernels/arith.py's ops used by broadcast_to, mean_backward


def c_strides(shape):
    """Element strides of a C-contiguous array of ``shape``."""
    out, step = [], 1
    for n in reversed(shape):
        out.append(step)
        step *= n
    return tuple(reversed(out))


def broadcast(op, **shapes):
    """The broadcast shape of the named shapes (NumPy's rule: aligned at the right, each
    dimension equal or 1); ValueError naming the op and the shapes otherwise."""
    try:
        return tuple(int(n) for n in np.broadcast_shapes(*shapes.values()))
    except ValueError:
        said = " and ".join(f"{k} {tuple(v)}" for k, v in shapes.items())
        raise ValueError(f"{op}: shapes do not broadcast: {said} (NumPy's rule: aligned at the "
                         "right, each dimension equal or 1)") from None


def read_strides(shape, out_shape):
    """Strides reading a C-contiguous array of ``shape`` as ``out_shape`` (it broadcasts to
    it): 0 on the leading dimensions it lacks and where it has 1 and out_shape does not."""
    lead = len(out_shape) - len(shape)
    own = c_strides(shape)
    return (0,) * lead + tuple(0 if n == 1 and m != 1 else s
                               for n, m, s in zip(shape, out_shape[lead:], own))


def merge(shape, *strides):
    """(shape, strides...) of the same walk over fewer dimensions: size-1 dimensions dropped,
    neighbours k, k+1 merged where every operand steps alike (stride[k] == stride[k+1] *
    shape[k+1]; both 0 for a broadcast one). At least one dimension."""
    dims, sts = [], [[] for _ in strides]
    for k, n in enumerate(shape):
        if n == 1:
            continue
        if dims and all(st[-1] == s[k] * n for st, s in zip(sts, strides)):
            dims[-1] *= n
            for st, s in zip(sts, strides):
                st[-1] = s[k]
            continue
        dims.append(n)
        for st, s in zip(sts, strides):
            st.append(s[k])
    if not dims:
        return ((1,),) + tuple((0,) for _ in strides)
    return (tuple(dims),) + tuple(tuple(st) for st in sts)


def grid(n):
    """(blocks, threads) of a grid-stride walk over n elements (blocks of 32 threads on the
    simulator, which runs one Python thread per CUDA thread)."""
    return arrays.grid_1d(n, 32 if device.simulator() else 256)


def pad(values):
    return tuple(values) + (0,) * (MAXDIM - len(values))


def elementwise_geo(op, dims, a_strides, b_strides, use_a=True, use_b=True):
    """kernels/arith.py's geo for a walk over ``dims`` (merged); ValueError past MAXDIM."""
    if len(dims) > MAXDIM:
        raise ValueError(f"{op}: the broadcast needs {len(dims)} dimensions after merging "
                         f"neighbours that broadcast alike; at most {MAXDIM} are supported "
                         f"(dims {dims})")
    return (len(dims), int(use_a), int(use_b)) + pad(dims) + pad(a_strides) + pad(b_strides)


def shape_arg(op, name, shape):
    if not isinstance(shape, (int, np.integer, tuple, list)):   # not a str, dict, set, ...
        raise TypeError(f"{op}: {name} must be a tuple of ints; got {shape!r}")
    t = tuple(shape) if not isinstance(shape, (int, np.integer)) else (shape,)
    if not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in t):
        raise TypeError(f"{op}: {name} must be a tuple of ints; got {shape!r}")
    if any(v < 0 for v in t):
        raise ValueError(f"{op}: {name} must not have negative sizes; got {t}")
    return tuple(int(v) for v in t)


def axes(op, axis, ndim):
    """``axis`` (None, an int or a tuple of ints, negative from the end) as a sorted tuple of
    distinct axes of an ndim-D array; ValueError naming the op otherwise."""
    if axis is None:
        return tuple(range(ndim))
    if not isinstance(axis, (int, np.integer, tuple, list)):   # not a str, dict, float, ...
        raise TypeError(f"{op}: axis must be None, an int or a tuple of ints; got {axis!r}")
    raw = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    out = []
    for a in raw:
        if not isinstance(a, (int, np.integer)) or isinstance(a, bool):
            raise TypeError(f"{op}: axis must be None, an int or a tuple of ints; got {axis!r}")
        if not -ndim <= a < ndim:
            raise ValueError(f"{op}: axis {int(a)} is out of range for an array of {ndim} "
                             f"dimension(s)")
        out.append(int(a) % ndim)
    if len(set(out)) != len(out):
        raise ValueError(f"{op}: axis {axis!r} repeats an axis")
    return tuple(sorted(out))
