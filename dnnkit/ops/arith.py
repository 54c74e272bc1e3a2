"""Elementwise arithmetic with broadcasting: add, subtract, multiply, divide.

    add(a, b)        y = a + b
    subtract(a, b)   y = a - b
    multiply(a, b)   y = a * b
    divide(a, b)     y = a / b      (IEEE: x / 0 = +-inf, 0 / 0 = NaN)

``a`` and ``b`` are arrays (device arrays, NumPy arrays, Tensors) or Python scalars, not both
scalars; arrays must share one float dtype (float16, float32, float64), which y takes. Shapes
broadcast by NumPy's rule (aligned at the right; each dimension equal, or 1 and stretched);
y is a new C-contiguous array of the broadcast shape. Arithmetic is in the accumulation type
(float32 for float16), rounded once into y; a scalar is used in that type.

Gradients (``@gradient`` below): each operand's gradient is summed over the axes it was
broadcast along (``sum_to``, ops/reduce.py): da = sum_to(dy), db = +-sum_to(dy) for add and
subtract; da = sum_to(dy * b), db = sum_to(dy * a) for multiply; da = sum_to(dy / b),
db = -sum_to(dy * a / b^2), computed as -sum_to((dy / b) * y), for divide.

Backends. Numba: kernels/arith.py (one walk over y with per-dimension strides, 0 where an
operand is broadcast, after merging neighbouring dimensions that broadcast alike). cuDNN:
cudnnOpTensor (ADD with alpha2 = -1 for subtract; MUL) needs one operand of y's shape and the
other's dims equal or 1: when a is the broadcast one, the operands are swapped (subtract as
-b + a); when both are broadcast, add and subtract run as two cudnnAddTensor calls (y = a,
then y += +-b), multiply on Numba. A scalar operand: y = s * x is one cudnnAddTensor (alpha =
s); x + s and x - s are cudnnSetTensor then cudnnAddTensor. At most 5 dims after merging
(cudnnOpTensor's and cudnnAddTensor's limit) and tensors under cuDNN's 32-bit limit; divide
has no cuDNN call (cudnnOpTensor has no division) and runs on Numba under every policy.
"""

from __future__ import annotations

import numbers
from typing import NamedTuple

import numpy as np

from .. import arrays, device
from ..autograd import gradient
from ..cudnn import optensor as cudnn_optensor
from ..dispatch import public_op
from ..hints import Backend, Operand, Stream
from ..launch import flat as flat_arg, launch
from ..registry import register
from . import split
from .broadcasting import CUDNN_ADD_DIMS, broadcast, elementwise_geo, grid, merge, read_strides
from .reduce import sum_to

OPS = ("add", "subtract", "multiply", "divide")
OP_ID = {op: i for i, op in enumerate(OPS)}        # kernels/arith.py
_TOL = {"float16": (2e-3, 1e-3), "float32": (1e-5, 1e-6), "float64": (1e-12, 1e-14)}


class ArithArgs(NamedTuple):
    """add's, subtract's, multiply's and divide's checked arguments. ``a``/``b``: a device
    array or a float (a scalar operand); ``shape``: y's; ``dims``, ``a_dims``, ``b_dims``: y's
    and the operands' dims after merging neighbours that broadcast alike (an operand's 1 where
    it is broadcast); ``geo``: kernels/arith.py's walk."""
    a: object
    b: object
    op: str
    shape: tuple
    dims: tuple
    a_dims: tuple
    b_dims: tuple
    geo: tuple
    stream: object


def is_scalar(v):
    """A Python or NumPy real number (not a bool, not an array)."""
    return isinstance(v, numbers.Real) and not isinstance(v, (bool, np.bool_, np.ndarray))


def _operands(op, a, b, stream):
    s = arrays.as_stream(stream)
    sa, sb = is_scalar(a), is_scalar(b)
    if sa and sb:
        raise TypeError(f"{op}: at least one of a and b must be an array; got the scalars "
                        f"{a!r} and {b!r}")
    a = float(a) if sa else arrays.device_input(op, "a", a, s)
    b = float(b) if sb else arrays.device_input(op, "b", b, s)
    if not (sa or sb) and a.dtype != b.dtype:
        raise TypeError(f"{op}: a has dtype {a.dtype} and b has {b.dtype}; both arrays must "
                        "have one float dtype (convert one first)")
    a_shape = () if sa else tuple(a.shape)
    b_shape = () if sb else tuple(b.shape)
    shape = broadcast(op, a=a_shape, b=b_shape)
    dims, ast, bst = merge(shape, read_strides(a_shape, shape), read_strides(b_shape, shape))
    geo = elementwise_geo(op, dims, ast, bst, not sa, not sb)
    a_dims = tuple(n if st else 1 for n, st in zip(dims, ast))
    b_dims = tuple(n if st else 1 for n, st in zip(dims, bst))
    return ArithArgs(a, b, op, shape, dims, a_dims, b_dims, geo, s)


@public_op("add")
def add(a: Operand, b: Operand, *, stream: Stream = None,
        backend: Backend | None = None) -> ArithArgs:
    """Elementwise sum ``y = a + b`` with NumPy broadcasting.

    {ARITH}"""
    return _operands("add", a, b, stream)


@public_op("subtract")
def subtract(a: Operand, b: Operand, *, stream: Stream = None,
             backend: Backend | None = None) -> ArithArgs:
    """Elementwise difference ``y = a - b`` with NumPy broadcasting.

    {ARITH}"""
    return _operands("subtract", a, b, stream)


@public_op("multiply")
def multiply(a: Operand, b: Operand, *, stream: Stream = None,
             backend: Backend | None = None) -> ArithArgs:
    """Elementwise product ``y = a * b`` with NumPy broadcasting.

    {ARITH}"""
    return _operands("multiply", a, b, stream)


@public_op("divide")
def divide(a: Operand, b: Operand, *, stream: Stream = None,
           backend: Backend | None = None) -> ArithArgs:
    """Elementwise quotient ``y = a / b`` with NumPy broadcasting; IEEE division (x / 0 = +-inf,
    0 / 0 = NaN). Runs on Numba only (cuDNN's cudnnOpTensor has no division).

    {ARITH}"""
    return _operands("divide", a, b, stream)


# ---------------------------------------------------------------- Numba
# (The kernel is imported inside the function: it imports numba, which ``import dnnkit`` does
# not pay for.)

@register("add", "numba", tolerance=_TOL)
@register("subtract", "numba", tolerance=_TOL)
@register("multiply", "numba", tolerance=_TOL)
@register("divide", "numba", tolerance=_TOL,
          numba_only="cudnnOpTensor has no division")
def _arith_numba(a, b, op, shape, dims, a_dims, b_dims, geo, stream):
    from ..kernels.arith import arith_fwd_kernel
    ref = b if isinstance(a, float) else a
    y = arrays.cuda_empty(shape, ref.dtype, stream)
    if y.size:
        acc = arrays.acc_array(ref.dtype)
        t = acc.dtype.type
        blocks, threads = grid(y.size)
        # a scalar operand: its value, and y (never read) in its array's place
        launch(arith_fwd_kernel, blocks, threads, stream,
               (flat_arg(y if isinstance(a, float) else a),
                flat_arg(y if isinstance(b, float) else b), flat_arg(y),
                t(a if isinstance(a, float) else 0), t(b if isinstance(b, float) else 0),
                OP_ID[op], geo, acc))
    return y


# ---------------------------------------------------------------- cuDNN

def _cudnn_supports(a, b, op, shape, dims, a_dims, b_dims, geo, stream):
    if len(dims) > CUDNN_ADD_DIMS:
        return (f"cudnnOpTensor and cudnnAddTensor take at most {CUDNN_ADD_DIMS} dimensions; "
                f"{op} of shapes {_shape(a)} and {_shape(b)} needs {len(dims)} after merging "
                "neighbours that broadcast alike")
    if op == "multiply" and a_dims != dims and b_dims != dims:
        return (f"cudnnOpTensor needs one operand of the output's shape {shape}; multiply of "
                f"{_shape(a)} and {_shape(b)} broadcasts both")
    return split.too_big(int(np.prod(shape, dtype=np.int64)), lambda: f"the output {shape}")


def _shape(v):
    return "a scalar" if isinstance(v, float) else str(tuple(v.shape))


@register("add", "cudnn", supports=_cudnn_supports)
@register("subtract", "cudnn", supports=_cudnn_supports)
@register("multiply", "cudnn", supports=_cudnn_supports)
def _arith_cudnn(a, b, op, shape, dims, a_dims, b_dims, geo, stream):
    ref = b if isinstance(a, float) else a
    y = arrays.cuda_empty(shape, ref.dtype, stream)
    if not y.size:
        return y
    sp = device.stream_pointer(stream)
    sign = -1.0 if op == "subtract" else 1.0
    if isinstance(a, float) or isinstance(b, float):
        _scalar_cudnn(a, b, op, y, dims, sp)
    elif a_dims == dims or b_dims == dims:
        # cudnnOpTensor broadcasts its B only: the full-shape operand goes first (for
        # subtract, a - b = -b + a when b is the full one)
        first, second = (a, b) if a_dims == dims else (b, a)
        s1, s2 = (1.0, sign) if a_dims == dims else (sign, 1.0)
        d2 = b_dims if a_dims == dims else a_dims
        cudnn_optensor.op_tensor("mul" if op == "multiply" else "add", s1, first, dims, s2,
                                 second, d2, y, dims, sp)
    else:       # both broadcast (add, subtract): y = a, then y += +-b
        cudnn_optensor.add_tensor(1.0, a, a_dims, 0.0, y, dims, sp)
        cudnn_optensor.add_tensor(sign, b, b_dims, 1.0, y, dims, sp)
    return y


def _scalar_cudnn(a, b, op, y, dims, sp):
    """One operand a scalar s, the other an array x of y's shape."""
    s_first = isinstance(a, float)
    s, x = (a, b) if s_first else (b, a)
    if op == "multiply":
        cudnn_optensor.add_tensor(s, x, dims, 0.0, y, dims, sp)
        return
    # x + s, x - s, s - x: one cudnnOpTensor ADD against a one-element B holding s, which it
    # broadcasts. (cudnnSetTensor + cudnnAddTensor gave float16 sums off by up to 1.25 on an
    # NVIDIA H200, cuDNN 9.19.)
    ones = (1,) * len(dims)
    const = arrays.constant(np.full(ones, s), y.dtype)
    a1, a2 = (-1.0, 1.0) if op == "subtract" and s_first else \
        ((1.0, -1.0) if op == "subtract" else (1.0, 1.0))
    cudnn_optensor.op_tensor("add", a1, x, dims, a2, const, ones, y, dims, sp)


# ---------------------------------------------------------------- gradients

def _to(dy, v, g):
    """dy summed to operand v's shape (dy itself where v was not broadcast)."""
    if tuple(v.shape) == tuple(dy.shape):
        return dy
    return sum_to(dy, tuple(v.shape), backend=g.backend, stream=g.stream)


def _wants(g):
    return [n for n in ("a", "b") if g.needs(n)]


@gradient("add")
def _add_grad(g, dy):
    return {n: _to(dy, getattr(g, n), g) for n in _wants(g)}


@gradient("subtract")
def _subtract_grad(g, dy):
    out = {}
    if g.needs("a"):
        out["a"] = _to(dy, g.a, g)
    if g.needs("b"):       # negated after the sum: the smaller array
        out["b"] = multiply(_to(dy, g.b, g), -1.0, backend=g.backend, stream=g.stream)
    return out


@gradient("multiply")
def _multiply_grad(g, dy):
    out = {}
    for n, other in (("a", g.b), ("b", g.a)):
        if g.needs(n):
            out[n] = _to(multiply(dy, other, backend=g.backend, stream=g.stream),
                         getattr(g, n), g)
    return out


@gradient("divide")
def _divide_grad(g, dy):
    if not (g.needs("a") or g.needs("b")):
        return {}
    kw = {"backend": g.backend, "stream": g.stream}
    q = divide(dy, g.b, **kw)           # dy / b: a's gradient, and a factor of b's
    out = {}
    if g.needs("a"):
        out["a"] = _to(q, g.a, g)
    if g.needs("b"):
        # -dy * a / b^2 = -(dy / b) * y, from the saved output y = a / b
        out["b"] = multiply(_to(multiply(q, g.out, **kw), g.b, g), -1.0, **kw)
    return out


# ---------------------------------------------------------------- python -m dnnkit check

_NUMPY = {"add": np.add, "subtract": np.subtract, "multiply": np.multiply, "divide": np.divide}


def _check_inputs(a_small, b_small, a_big, b_big):
    def make(rng, dtype, big):
        a, b = (a_big, b_big) if big else (a_small, b_small)
        d = rng.standard_normal(b)
        # divisors away from 0, so that the quotient's error stays relative
        return (rng.standard_normal(a).astype(dtype),
                (np.sign(d) * (0.5 + np.abs(d))).astype(dtype))
    return make


def selfcheck_cases(Case):
    out = []
    for op in OPS:
        fn, ref = globals()[op], _NUMPY[op]
        for name, shapes in (("same shape", ((3, 70), (3, 70), (32, 64, 32, 32),
                                             (32, 64, 32, 32))),
                             ("per-channel", ((2, 3, 4, 5), (1, 3, 1, 1), (32, 64, 32, 32),
                                              (1, 64, 1, 1)))):
            out.append(Case(op, name, lambda b, s, i, f=fn: f(i[0], i[1], backend=b, stream=s),
                            lambda i, r=ref: r(i[0], i[1]), _check_inputs(*shapes)))
        out.append(Case(op, "scalar 0.75", lambda b, s, i, f=fn: f(i[0], 0.75, backend=b,
                                                                      stream=s),
                        lambda i, r=ref: r(i[0], 0.75),
                        _check_inputs((3, 70), (1,), (32, 64, 32, 32), (1,))))
    return out
