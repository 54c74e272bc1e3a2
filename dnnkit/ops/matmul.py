"""Matrix products, forward, with their gradient rules.

    matmul(a, b, transpose_a=False, transpose_b=False)    y = op(a) @ op(b)
    linear(x, weight, bias=None)                           y = x @ weight^T (+ bias)

``op(a)`` is ``a``, or ``a`` with its last two axes swapped when ``transpose_a`` (read in
place, no copy). matmul takes (m, k) @ (k, n) -> (m, n) and batches (B, m, k) @ (B, k, n) ->
(B, m, n); a 2-D operand, or a batch of 1, is broadcast over the other operand's batch.
linear takes x (..., in), weight (out, in) (PyTorch's layout) and bias (out,), and gives
y (..., out): every leading axis of x is a row of one GEMM. A product over k = 0 is zero (plus
the bias): a sum over nothing.

Numba: the register-tiled GEMM of kernels/gemm.py (launched by ops/gemm.py, float32
accumulation for float16 data) in the layout the transposes give: "00", "10" (A stored
transposed) or "01" (B stored transposed). With both transposed, y^T = b . a is run as "00"
with C written through a grouped index (row stride 1, column stride n): y comes out in place,
no transpose pass. A 3-D a (not transposed) against a 2-D b is one GEMM over B*m rows. linear
without a bias is y = x W^T (layout "01"); with a bias it computes y^T = W x^T ("01", C
written transposed), so that the kernel's per-row bias is the per-feature bias: no second
pass over y.

cuDNN: the graph API's matmul operation (dnnkit/cudnn/matmul.py; plan kept per shape, one
cudnnBackendExecute per call), the transposes and the broadcast given by tensor strides and a
batch of 1; linear's bias then by cudnnAddTensor. Float32 engines on tensor cores (TF32) only
with ``dnn.matmul.allow_tf32``. Where cuDNN offers no usable engine for a shape (float64, or
float32 on a GPU whose float32 engines all use tensor cores, for instance) the call falls back
to Numba at run time under ``auto`` and later calls of that shape go to Numba directly
(supports()); ``forced`` raises.

Gradients (the rules below; each runs on the backend of the forward):
    matmul, with A = op(a), B = op(b):   dA = dy B^T,  dB = A^T dy
        each one matmul with transposes (da = b dy^T when a is transposed, ...); the gradient
        of a broadcast operand is summed over the batch: ones(1, B) @ (B, rest), a matmul too
        (or, for a 3-D a not transposed against a 2-D b, one GEMM over the B*m rows).
    linear:  dx = dy W,  dW = dy^T x (over all rows),  db = dy summed over the rows
        (conv_backward_bias of dy viewed as (rows, out, 1, 1)).
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import numpy as np

from .. import arrays, config, device
from ..launch import flat as flat_arg
from ..autograd import gradient
from ..cudnn import activation as cudnn_act, loader, matmul as cudnn_matmul
from ..dispatch import public_op
from ..hints import ArrayLike, Backend, Stream
from ..registry import NoCudnnCall, register
from ..tracing import note_algo
from . import gemm, gemm_split, split
from .activation import fused_reads, through_fused
from .args import fused_activation
from .conv import conv_backward_bias

_TOL = {"float16": (1e-2, 1e-3), "float32": (1e-4, 1e-6), "float64": (1e-11, 1e-13)}
config.register_flag("dnn.matmul.allow_tf32", False, config.parse_bool,
                     "let cuDNN use TF32 tensor cores for float32 matmul and linear "
                     "(off: float32 means float32)")


@dataclasses.dataclass(frozen=True)
class MatmulGeom:
    """A checked product: y (batch, m, n) = op(a) (m, k) . op(b) (k, n) per batch entry.
    ``a_batch`` / ``b_batch``: the operand has its own matrix per batch entry (else it is
    broadcast); ``y_shape``: the user's output shape."""
    batch: int
    m: int
    n: int
    k: int
    ta: bool
    tb: bool
    a_batch: bool
    b_batch: bool
    y_shape: tuple

    @property
    def flat_rows(self):
        """A 3-D a (not transposed) against a broadcast b: one GEMM of batch*m rows."""
        return self.a_batch and not self.b_batch and not self.ta

    def cudnn_tensors(self):
        """(dims, strides) of A, B, C as cuDNN's 3-D (batch, rows, cols) tensors."""
        bt, m, n, k = self.batch, self.m, self.n, self.k
        if self.flat_rows:
            return (((1, bt * m, k), (1, k, n), (1, bt * m, n)),
                    ((bt * m * k, k, 1), (k * n, 1, k) if self.tb else (k * n, n, 1),
                     (bt * m * n, n, 1)))
        dims = ((bt if self.a_batch else 1, m, k), (bt if self.b_batch else 1, k, n),
                (bt, m, n))
        strides = ((m * k, 1, m) if self.ta else (m * k, k, 1),
                   (k * n, 1, k) if self.tb else (k * n, n, 1), (m * n, n, 1))
        return dims, strides


@dataclasses.dataclass(frozen=True)
class LinearGeom:
    """A checked linear layer: ``rows`` rows of ``in_f`` features to ``out_f``."""
    rows: int
    in_f: int
    out_f: int
    y_shape: tuple


class MatmulArgs(NamedTuple):
    """matmul's checked arguments, as its implementations take them."""
    a: object
    b: object
    geom: MatmulGeom
    stream: object


class LinearArgs(NamedTuple):
    """linear's checked arguments, as its implementations take them."""
    x: object
    weight: object
    bias: object
    geom: LinearGeom
    stream: object
    activation: object = None     # None or "relu", applied after the bias


def _flag(op, name, v):
    if not isinstance(v, (bool, np.bool_)):
        raise TypeError(f"{op}: {name} must be a bool; got {v!r}")
    return bool(v)


def _same_dtype(op, ref_name, ref, **others):
    for name, a in others.items():
        if a.dtype != ref.dtype:
            raise TypeError(f"{op}: {name} has dtype {a.dtype} but {ref_name} has {ref.dtype}")


@public_op("matmul")
def matmul(a: ArrayLike, b: ArrayLike, transpose_a: bool = False, transpose_b: bool = False, *,
           stream: Stream = None, backend: Backend | None = None) -> MatmulArgs:
    """Matrix product ``op(a) @ op(b)``: (m, k) @ (k, n) -> (m, n), or batched (B, m, k) @
    (B, k, n) -> (B, m, n); a 2-D operand or a batch of 1 is broadcast over the other's batch.

    ``transpose_a``, ``transpose_b``: False (default) or True: op() swaps the operand's last two
    axes, read in place (no copy). a, b: 2-D or 3-D, one dtype (float16, float32 or float64);
    float16 accumulates in float32. A product over k = 0 is zero.
    Raises ValueError when the inner dimensions or the batches do not match or an operand is not
    2-D or 3-D; TypeError for mixed dtypes or a transpose flag that is not a bool."""
    op = "matmul"
    ta, tb = _flag(op, "transpose_a", transpose_a), _flag(op, "transpose_b", transpose_b)
    s = arrays.as_stream(stream)
    a = arrays.device_input(op, "a", a, s, ndim=(2, 3))
    b = arrays.device_input(op, "b", b, s, ndim=(2, 3))
    _same_dtype(op, "a", a, b=b)
    sa, sb = tuple(a.shape), tuple(b.shape)
    m, ka = (sa[-1], sa[-2]) if ta else (sa[-2], sa[-1])
    kb, n = (sb[-1], sb[-2]) if tb else (sb[-2], sb[-1])
    if ka != kb:
        raise ValueError(f"{op}: op(a) is {m} x {ka} but op(b) is {kb} x {n} (a {tuple(a.shape)}"
                         f", b {tuple(b.shape)}, transpose_a={ta}, transpose_b={tb}): the inner "
                         f"dimensions differ")
    ba = a.shape[0] if a.ndim == 3 else 1
    bb = b.shape[0] if b.ndim == 3 else 1
    if ba != bb and 1 not in (ba, bb):
        raise ValueError(f"{op}: the batches of a {tuple(a.shape)} and b {tuple(b.shape)} "
                         f"differ ({ba} and {bb}); they must be equal or one of them 1")
    batch = max(ba, bb)
    y_shape = (m, n) if a.ndim == b.ndim == 2 else (batch, m, n)
    geom = MatmulGeom(batch, m, n, ka, ta, tb, ba == batch and ba > 1, bb == batch and bb > 1,
                      y_shape)
    return MatmulArgs(a, b, geom, s)


@public_op("linear")
def linear(x: ArrayLike, weight: ArrayLike, bias: ArrayLike | None = None, *,
           stream: Stream = None, backend: Backend | None = None,
           activation: str | None = None) -> LinearArgs:
    """Affine map ``y = x @ weight.T + bias``: x (..., in), weight (out, in) (PyTorch's layout),
    bias (out,) or None (default); returns y (..., out), every leading axis of x a row of one
    matrix product. One dtype for all (float16, float32 or float64).
    ``activation``: None (default) or "relu": y = max(y, 0) after the bias, in the same call
    (on the Numba GEMM in the pass that stores y; on cuDNN an activation call on y in place).
    Raises ValueError when x's last axis is not ``in``, weight is not 2-D, bias is not (out,),
    x is 0-d or the activation is not listed; TypeError for mixed dtypes."""
    op = "linear"
    s = arrays.as_stream(stream)
    x = arrays.device_input(op, "x", x, s)
    weight = arrays.device_input(op, "weight", weight, s, ndim=(2,))
    _same_dtype(op, "x", x, weight=weight)
    if x.ndim < 1:
        raise ValueError(f"{op}: x must have at least one axis (..., in); got a 0-d array")
    out_f, in_f = weight.shape
    xs = tuple(x.shape)
    if xs[-1] != in_f:
        raise ValueError(f"{op}: x {xs} has {xs[-1]} features but weight "
                         f"{tuple(weight.shape)} (out, in) takes {in_f}")
    if bias is not None:
        bias = arrays.device_input(op, "bias", bias, s, ndim=(1,))
        _same_dtype(op, "x", x, bias=bias)
        if bias.shape[0] != out_f:
            raise ValueError(f"{op}: bias has shape {tuple(bias.shape)} but weight "
                             f"{tuple(weight.shape)} gives {out_f} output features")
    act = fused_activation(op, activation)
    return LinearArgs(x, weight, bias, LinearGeom(math.prod(xs[:-1]), in_f, out_f,
                                                  xs[:-1] + (out_f,)), s, act)


# ---------------------------------------------------------------- Numba

def _numba_product(a, b, y, geom, stream):
    """y = op(a) . op(b) by the GEMM (module docstring)."""
    bt, m, n, k, ta, tb = geom.batch, geom.m, geom.n, geom.k, geom.ta, geom.tb
    a1, b1 = (m * k if geom.a_batch else 0), (k * n if geom.b_batch else 0)
    fa, fb, fy = flat_arg(a), flat_arg(b), flat_arg(y)
    if ta and tb:       # y^T = b_stored (n x k) . a_stored (k x m), written as y (m x n)
        gemm.gemm("00", fb, fa, fy, (n, m, k), (k, m, 1), gemm.PLAIN * 2 + (1, n),
                  (bt, 1, b1, 0, a1, 0, m * n, 0), stream=stream)
        return
    lds = (m if ta else k, k if tb else n, n)
    if geom.flat_rows:
        dims, batch = (bt * m, n, k), gemm.NO_BATCH
    else:
        dims, batch = (m, n, k), (bt, 1, a1, 0, b1, 0, m * n, 0)
    layout = f"{int(ta)}{int(tb)}"
    p = gemm_split.parts(*dims, y.dtype) if batch[0] == 1 else 1
    if p > 1:       # few output tiles, a long k: k-slices summed (ops/gemm_split.py)
        gemm_split.gemm_parts(layout, fa, fb, fy, dims, lds, p, stream=stream)
        return
    gemm.gemm(layout, fa, fb, fy, dims, lds, gemm.PLAIN * 3, batch, stream=stream)


@register("matmul", "numba", tolerance=_TOL)
def _matmul_numba(a, b, geom, stream):
    y = arrays.cuda_empty(geom.y_shape, a.dtype, stream)
    if y.size:
        note_algo("gemm")
        _numba_product(a, b, y, geom, stream)
    return y


@register("linear", "numba", tolerance=_TOL)
def _linear_numba(x, weight, bias, geom, stream, activation=None):
    y = arrays.cuda_empty(geom.y_shape, x.dtype, stream)
    if not y.size:
        return y
    note_algo("gemm")
    r, i, o = geom.rows, geom.in_f, geom.out_f
    relu = activation == "relu"       # (in the store of each algorithm below: the epilogue)
    fx, fw, fy = flat_arg(x), flat_arg(weight), flat_arg(y)
    p = gemm_split.parts(r, o, i, x.dtype)
    if p > 1:               # few output tiles, a long k: k-slices summed, the bias with them
        gemm_split.gemm_parts("01", fx, fw, fy, (r, o, i), (i, i, o), p, bias=bias,
                              stream=stream, relu=relu)
    elif bias is None:      # y (r x o) = x (r x i) . W^T
        gemm.gemm("01", fx, fw, fy, (r, o, i), (i, i, o), gemm.PLAIN * 3, gemm.NO_BATCH,
                  stream=stream, relu=relu)
    else:                   # y^T (o x r) = W . x^T + bias per row, stored as y
        gemm.gemm("01", fw, fx, fy, (o, r, i), (i, i, 1), gemm.PLAIN * 2 + (1, o),
                  gemm.NO_BATCH, bias=bias, stream=stream, relu=relu)
    return y


# ---------------------------------------------------------------- cuDNN

def _engine_filters(dtype):
    """(tensor cores allowed, deterministic engines only) for cuDNN's heuristics."""
    name = arrays.float_name(dtype)
    allow_tc = name == "float16" or (name == "float32" and config.get("dnn.matmul.allow_tf32"))
    return bool(allow_tc), bool(config.get("dnn.deterministic"))


def _cudnn_reason(dims, strides, dtype, stream):
    for what, d in zip(("a", "b", "y"), dims):
        why = split.too_big(math.prod(d), what)
        if why:
            return why
    name = arrays.float_name(dtype)
    if name == "float64":
        return NoCudnnCall("cuDNN 9's matmul engines take no float64")
    if name == "float32" and not config.get("dnn.matmul.allow_tf32"):
        # measured (cuDNN 9.19, NVIDIA H200): its float32 matmul engines round the inputs to
        # TF32 (relative error 2e-4 to 7e-4 against float64) or have none usable
        return NoCudnnCall("cuDNN 9's float32 matmul computes in TF32 (error ~3e-4); it runs "
                           "on cuDNN with dnn.matmul.allow_tf32 = True")
    if not loader.status().available:
        return None          # the policy reports the library's own state
    why = cudnn_matmul.unsupported(dims, strides, name, *_engine_filters(dtype),
                                   device.stream_pointer(stream))
    return NoCudnnCall(why) if why else None


def _cudnn_matmul_supports(a, b, geom, stream):
    return _cudnn_reason(*geom.cudnn_tensors(), a.dtype, stream)


def _linear_tensors(geom):
    r, i, o = geom.rows, geom.in_f, geom.out_f
    return ((1, r, i), (1, i, o), (1, r, o)), ((r * i, i, 1), (o * i, 1, i), (r * o, o, 1))


def _cudnn_linear_supports(x, weight, bias, geom, stream, activation=None):
    return _cudnn_reason(*_linear_tensors(geom), x.dtype, stream)


def _cudnn_run(a, b, y, dims, strides, stream):
    note_algo(cudnn_matmul.matmul(a, b, y, dims, strides, arrays.float_name(y.dtype),
                                  *_engine_filters(y.dtype), device.stream_pointer(stream)))


@register("matmul", "cudnn", supports=_cudnn_matmul_supports, tolerance=_TOL)
def _matmul_cudnn(a, b, geom, stream):
    y = arrays.cuda_empty(geom.y_shape, a.dtype, stream)
    if not y.size:
        return y
    if geom.k == 0:
        return arrays.zero_fill(y, stream)
    _cudnn_run(a, b, y, *geom.cudnn_tensors(), stream)
    return y


@register("linear", "cudnn", supports=_cudnn_linear_supports, tolerance=_TOL)
def _linear_cudnn(x, weight, bias, geom, stream, activation=None):
    y = arrays.cuda_empty(geom.y_shape, x.dtype, stream)
    if not y.size:
        return y
    if geom.in_f == 0:
        arrays.zero_fill(y, stream)
    else:
        _cudnn_run(x, weight, y, *_linear_tensors(geom), stream)
    if bias is not None:
        cudnn_matmul.add_bias(y, bias, geom.rows, geom.out_f, device.stream_pointer(stream))
    if activation is not None:        # in place (cuDNN allows x == y)
        cudnn_act.forward(y, y, activation, 0.0, device.stream_pointer(stream))
    return y


# ---------------------------------------------------------------- gradients

def _batch_sum(d, like, kw):
    """``d`` (batch, ...) summed over its batch into ``like``'s shape: ones(1, B) @ d."""
    if tuple(d.shape) == tuple(like.shape):
        return d
    bt = d.shape[0]
    ones = arrays.constant(np.ones((1, bt)), d.dtype)
    s = matmul(ones, arrays.reshaped(d, (bt, d.size // bt)), **kw)
    return arrays.reshaped(s, tuple(like.shape))


@gradient("matmul")
def _matmul_grad(g, dy):
    a, b, ta, tb = g.a, g.b, g.transpose_a, g.transpose_b
    kw = dict(backend=g.backend, stream=g.stream)
    out = {}
    if g.needs("a"):
        da = matmul(b, dy, tb, True, **kw) if ta else matmul(dy, b, False, not tb, **kw)
        out["a"] = _batch_sum(da, a, kw)
    if g.needs("b"):
        if a.ndim == 3 and b.ndim == 2 and not ta:      # one GEMM over the batch's rows
            rows = a.shape[0] * a.shape[1]
            a2 = arrays.reshaped(a, (rows, a.shape[2]))
            dy2 = arrays.reshaped(dy, (rows, dy.shape[2]))
            out["b"] = matmul(dy2, a2, True, False, **kw) if tb else \
                matmul(a2, dy2, True, False, **kw)
        else:
            db = matmul(dy, a, True, ta, **kw) if tb else matmul(a, dy, not ta, False, **kw)
            out["b"] = _batch_sum(db, b, kw)
    return out


@gradient("linear", reads_out=fused_reads)
def _linear_grad(g, dy):
    x, w, bias, dy = g.x, g.weight, g.bias, through_fused(g, dy)
    rows, out_f = math.prod(tuple(x.shape)[:-1]), w.shape[0]
    kw = dict(backend=g.backend, stream=g.stream)
    dy2 = arrays.reshaped(dy, (rows, out_f))
    out = {}
    if g.needs("x"):
        out["x"] = arrays.reshaped(matmul(dy2, w, **kw), tuple(x.shape))
    if g.needs("weight"):
        out["weight"] = matmul(dy2, arrays.reshaped(x, (rows, w.shape[1])), True, False, **kw)
    if bias is not None and g.needs("bias"):
        out["bias"] = conv_backward_bias(arrays.reshaped(dy2, (rows, out_f, 1, 1)), **kw)
    return out


# ---------------------------------------------------------------- python -m dnnkit check

def _ref_matmul(a, b, ta, tb):
    return np.matmul(np.swapaxes(a, -1, -2) if ta else a, np.swapaxes(b, -1, -2) if tb else b)


def _inputs(shapes):
    def make(rng, dtype, big):
        return tuple((rng.standard_normal(s) / np.sqrt(s[-1])).astype(dtype)
                     for s in shapes[big])
    return make


def selfcheck_cases(Case):
    # (variant, transposes, small shapes, big shapes)
    table = [("2-D", (False, False), ((5, 7), (7, 6)), ((1024, 1024), (1024, 1024))),
             ("batched a^T", (True, False), ((3, 7, 5), (3, 7, 6)),
              ((16, 256, 128), (16, 256, 512))),
             ("3-D x 2-D b^T", (False, True), ((2, 5, 7), (6, 7)),
              ((32, 128, 512), (1024, 512)))]
    out = [Case("matmul", name,
                lambda bk, s, i, t=t: matmul(i[0], i[1], *t, backend=bk, stream=s),
                lambda i, t=t: _ref_matmul(i[0], i[1], *t), _inputs({False: sm, True: bg}))
           for name, t, sm, bg in table]
    out.append(Case("linear", "bias",
                    lambda bk, s, i: linear(i[0], i[1], i[2], backend=bk, stream=s),
                    lambda i: i[0] @ i[1].T + i[2],
                    _inputs({False: ((2, 3, 7), (5, 7), (5,)),
                             True: ((4096, 1024), (1024, 1024), (1024,))})))
    return out
