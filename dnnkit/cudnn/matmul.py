"""Matrix products through cuDNN's graph API, and the bias add of a linear layer.

``matmul`` runs C = A . B for 3-D tensors (batch, rows, cols) as one operation graph holding
a CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR (with a CUDNN_BACKEND_MATMUL_DESCRIPTOR giving the
compute type: float32 for float16 and float32 data, float64 for float64). Each operand is
described by dims and strides, so a transposed operand is the stored array with its last two
strides swapped (no copy), and a batch of 1 broadcasts over the other operand's batch. The
engine comes from cuDNN's heuristics (mode A, then the fallback list), filtered as the
convolutions' are (graph.EngineConfig.usable: tensor-core engines for float32 only when TF32
is allowed, nothing nondeterministic under determinism, nothing compiled at run time). The
first configuration that finalizes becomes the plan, kept per (handle, dims, strides, dtype,
pointer alignment, filters); a call then costs a variant pack lookup and one
cudnnBackendExecute (graph.Plan).

A graph that cuDNN refuses to build, or for which it offers no usable engine, raises CudnnError
with CUDNN_STATUS_NOT_SUPPORTED (remembered, so the heuristics are asked once per shape): under
``dnn.enabled=auto`` the dispatcher then runs the Numba GEMM, under ``forced`` the error
reaches the caller.

``add_bias`` adds a (cols,) bias to every row of a (rows, cols) array with cudnnAddTensor
(the tensors described as (rows, cols, 1, 1) and (1, cols, 1, 1)).

Tensor unique ids: 1 = A, 2 = B, 3 = C; pointers bound in that order.
"""

import threading

from ..log import log
from .. import memory
from ..errors import CudnnError
from . import api, graph, handle, workspace
from . import conv  # noqa: F401  (declares cudnnAddTensor's prototype, used by add_bias)
from .api import ptr
from .descriptors import scalar_refs, tensor
from .enums import DATA_TYPES, STATUS_NOT_SUPPORTED, STATUS_NAMES


UIDS = (1, 2, 3)
PLANS_MAX = 512
_plans = {}          # key -> _Entry (its plan is None where cuDNN has no usable engine)
# (dims, strides, dtype, allow_tc, det) -> why cuDNN has no plan, found with 16-byte aligned
# pointers (the best case: a lesser alignment cannot have more engines)
_unsupported = {}
_lock = threading.Lock()


class _Entry:
    """An operation graph and the plan made from it, or None with the reason there is none.
    The descriptors the plan was built from are kept alive with it."""
    __slots__ = ("plan", "refs", "why")

    def __init__(self, plan, refs, why):
        self.plan, self.refs, self.why = plan, refs, why


def _operation(dims, strides, dtype, align):
    """The finalized matmul operation and the descriptors it references."""
    dt = DATA_TYPES[dtype]
    tensors = [graph.Backend("TENSOR_DESCRIPTOR") for _ in range(3)]
    for uid, (t, d, s) in enumerate(zip(tensors, dims, strides), start=1):
        t.set("TENSOR_DATA_TYPE", "DATA_TYPE", [dt])
        t.set("TENSOR_DIMENSIONS", "INT64", list(d))
        t.set("TENSOR_STRIDES", "INT64", list(s))
        t.set("TENSOR_UNIQUE_ID", "INT64", [uid])
        t.set("TENSOR_BYTE_ALIGNMENT", "INT64", [align])
        t.finalize()
    desc = graph.Backend("MATMUL_DESCRIPTOR")
    desc.set("MATMUL_COMP_TYPE", "DATA_TYPE",
             [DATA_TYPES["float64" if dtype == "float64" else "float32"]])
    desc.finalize()
    op = graph.Backend("OPERATION_MATMUL_DESCRIPTOR")
    op.set("OPERATION_MATMUL_ADESC", "BACKEND_DESCRIPTOR", [tensors[0]])
    op.set("OPERATION_MATMUL_BDESC", "BACKEND_DESCRIPTOR", [tensors[1]])
    op.set("OPERATION_MATMUL_CDESC", "BACKEND_DESCRIPTOR", [tensors[2]])
    op.set("OPERATION_MATMUL_DESC", "BACKEND_DESCRIPTOR", [desc])
    op.finalize()
    return op, (tensors, desc)


def _build(h, dims, strides, dtype, align, allow_tc, det):
    """The entry for one graph: its first usable engine configuration that finalizes. A graph
    cuDNN refuses to build (a layout or data type its matmul does not take) has no plan, with
    cuDNN's status as the reason."""
    try:
        op, refs = _operation(dims, strides, dtype, align)
        g = graph.operation_graph(h, [op])
    except CudnnError as e:
        log.debug("cuDNN graph matmul: %s", e)
        return _Entry(None, (), f"cuDNN does not build this matmul graph ({e.status_name})")
    configs = graph.engine_configs(g)
    usable = [c for c in configs if c.usable(allow_tc, det)]
    for c in usable:
        try:
            return _Entry(graph.Plan(h, c, UIDS), (op, refs, g, usable), None)
        except CudnnError as e:     # this configuration does not finalize: try the next
            log.debug("cuDNN graph matmul: %s does not finalize (%s)", c.name, e.status_name)
    why = ("cuDNN's heuristics give no engine for this matmul" if not configs else
           f"none of cuDNN's {len(configs)} engine configurations for this matmul is usable "
           f"(tensor cores allowed: {allow_tc}, deterministic: {det}) and finalizes")
    return _Entry(None, (op, refs, g), why)


def _entry(h, dims, strides, dtype, align, allow_tc, det):
    key = (h.value, dims, strides, dtype, align, allow_tc, det)
    e = _plans.get(key)
    if e is None:
        e = _build(h, dims, strides, dtype, align, allow_tc, det)
        with _lock:
            if len(_plans) >= PLANS_MAX:
                _plans.clear()
            e = _plans.setdefault(key, e)
            if e.plan is None and align == 16:
                _unsupported[(dims, strides, dtype, allow_tc, det)] = e.why
    return e


def unsupported(dims, strides, dtype, allow_tc, det, stream):
    """Why cuDNN has no plan for this matmul, else None: cuDNN's heuristics are asked once per
    shape (the plan is built with 16-byte aligned pointers, the best case, and kept for the
    calls), so that ``supports()`` answers before a call instead of a call failing."""
    key = (tuple(dims), tuple(strides), dtype, allow_tc, det)
    why = _unsupported.get(key)
    if why is None:
        e = _entry(handle.get(stream), key[0], key[1], dtype, 16, allow_tc, det)
        why = e.why
    return why


def clear():
    """Forget every graph and plan (their descriptors are destroyed once no call holds them)
    and every shape found unsupported."""
    with _lock:
        _plans.clear()
        _unsupported.clear()


def _drop_packs():
    with _lock:
        entries = list(_plans.values())
    for e in entries:
        if e.plan is not None:
            e.plan.drop_packs()


memory.on_empty_cache(_drop_packs)


def matmul(a, b, c, dims, strides, dtype, allow_tc, det, stream):
    """C = A . B on device arrays a, b, c. ``dims``: the three (batch, rows, cols) of A, B and
    C; ``strides``: theirs, in elements (a transposed operand: its stored strides swapped);
    ``dtype``: the data type's name; ``allow_tc``: tensor-core engines allowed for float32
    (TF32); ``det``: deterministic engines only; ``stream``: the raw cudaStream_t. Returns
    the engine's name. Raises CudnnError (NOT_SUPPORTED) where cuDNN has no usable engine."""
    pointers = (ptr(a), ptr(b), ptr(c))
    h = handle.get(stream)
    align = graph.alignment(pointers)
    e = _entry(h, tuple(dims), tuple(strides), dtype, align, allow_tc, det)
    p = e.plan
    if p is None:
        raise CudnnError("cuDNN graph matmul", STATUS_NOT_SUPPORTED,
                         STATUS_NAMES[STATUS_NOT_SUPPORTED],
                         f"{e.why}: A {dims[0]}, B {dims[1]}, C {dims[2]} {dtype}")
    ws = workspace.alloc(p.workspace, stream)
    if p.workspace and ws is None:
        raise workspace.OutOfMemory(p.workspace)
    with workspace.held(ws) as wp:
        p.execute(h, pointers, wp, context=lambda: f"cuDNN graph matmul {p.name}: A {dims[0]}, "
                                                    f"B {dims[1]}, C {dims[2]} {dtype}")
    return p.name


def add_bias(y, bias, rows, cols, stream):
    """y (rows, cols) += bias (cols,) broadcast over the rows (cudnnAddTensor). ``conv``
    declares cudnnAddTensor's prototype (imported for it)."""
    one = scalar_refs(y.dtype)[0]   # C = alpha * A + beta * C with alpha = beta = 1
    api.call("cudnnAddTensor", handle.get(stream), one, tensor((1, cols, 1, 1), y.dtype),
             ptr(bias), one, tensor((rows, cols, 1, 1), y.dtype), ptr(y),
             context=lambda: f"bias ({cols},) onto y ({rows}, {cols})")


__all__ = ["matmul", "add_bias", "clear", "unsupported"]
