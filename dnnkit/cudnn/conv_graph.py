"""Convolutions through cuDNN's graph API (graph.py): the runtime choices ``guess_*`` (cuDNN's
heuristics, mode A then the fallback list: PyTorch's default) and ``time_*`` (the candidates
run and timed: PyTorch's ``cudnn.benchmark``).

One operation graph per (handle, direction, shapes, geometry, dtypes, alignment); its engine
configurations are filtered (graph.EngineConfig.usable) and turned into execution plans on
demand. The chosen plan is remembered twice: by its name (``engine<i>_k<knob>=<v>...``) in
``algo_cache`` under the same key as the legacy choices, so save/load keeps it across processes,
and as the plan object itself, keyed by the call's raw arguments, so a steady loop's call is a
dict lookup, a workspace from the per-stream cache and one ``cudnnBackendExecute``.

Tensor unique ids: 1 = x (or dx), 2 = w (or dw), 3 = y (or dy); pointers are bound in the
direction's (a, b, o) argument order (``UIDS``), as in conv.py.

Numba is imported inside ``_time``: ``import dnnkit`` must not load it.
"""

import threading

from ..log import log
from .. import device, fastpath, memory
from ..errors import CudnnError
from . import algo_cache, graph, handle, workspace
from .enums import CONVOLUTION, CROSS_CORRELATION, DATA_TYPES


TIME_MAX = 12               # candidates timed by time_* (heuristics order: the best are first)
TIME_REPS = 3
UIDS = {"fwd": (1, 2, 3), "bwd_data": (2, 3, 1), "bwd_filter": (1, 3, 2)}   # (a, b, o)
_OPS = {  # direction -> (operation type, attribute prefix, {attribute suffix: tensor uid})
    "fwd": ("OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR", "OPERATION_CONVOLUTION_FORWARD_",
            {"X": 1, "W": 2, "Y": 3}),
    "bwd_data": ("OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR",
                 "OPERATION_CONVOLUTION_BWD_DATA_", {"DX": 1, "W": 2, "DY": 3}),
    "bwd_filter": ("OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR",
                   "OPERATION_CONVOLUTION_BWD_FILTER_", {"X": 1, "DW": 2, "DY": 3}),
}


def build_operation(direction, dims, dtype, compute_dtype, flip, align):
    """The finalized convolution operation of ``direction`` and what it references (pure
    cuDNN host work: no handle, no GPU). ``dims`` is conv_plans.ConvDims."""
    dt = DATA_TYPES[dtype]
    tensors = {1: graph.tensor(1, dims.x, dt, align), 2: graph.tensor(2, dims.w, dt, align),
               3: graph.tensor(3, dims.y, dt, align)}
    conv = graph.Backend("CONVOLUTION_DESCRIPTOR")
    conv.set("CONVOLUTION_COMP_TYPE", "DATA_TYPE", [DATA_TYPES[compute_dtype]])
    conv.set("CONVOLUTION_CONV_MODE", "CONVOLUTION_MODE",
             [CONVOLUTION if flip else CROSS_CORRELATION])
    conv.set("CONVOLUTION_SPATIAL_DIMS", "INT64", [len(dims.padding)])
    conv.set("CONVOLUTION_DILATIONS", "INT64", list(dims.dilation))
    conv.set("CONVOLUTION_FILTER_STRIDES", "INT64", list(dims.stride))
    conv.set("CONVOLUTION_PRE_PADDINGS", "INT64", list(dims.padding))
    conv.set("CONVOLUTION_POST_PADDINGS", "INT64", list(dims.padding))
    conv.finalize()
    kind, prefix, uids = _OPS[direction]
    op = graph.Backend(kind)
    for suffix, uid in uids.items():
        op.set(prefix + suffix, "BACKEND_DESCRIPTOR", [tensors[uid]])
    op.set(prefix + "CONV_DESC", "BACKEND_DESCRIPTOR", [conv])
    scalar = "DOUBLE" if dtype == "float64" else "FLOAT"   # alpha, beta as cuDNN reads them
    op.set(prefix + "ALPHA", scalar, [1.0])
    op.set(prefix + "BETA", scalar, [0.0])
    op.finalize()
    return op, (tensors, conv)


class _Graph:
    """An operation graph on one handle, its usable engine configurations and the plans made
    from them so far (by name)."""

    def __init__(self, h, direction, dims, dtype, compute_dtype, flip, align, allow_tc, det):
        self.op, self.refs = build_operation(direction, dims, dtype, compute_dtype, flip, align)
        self.graph = graph.operation_graph(h, [self.op])
        self.configs = [c for c in graph.engine_configs(self.graph) if c.usable(allow_tc, det)]
        self.uids = UIDS[direction]
        self.plans = {}
        self.lock = threading.Lock()

    def plan(self, h, config):
        """The execution plan of ``config`` (made on first use), or None when cuDNN cannot
        finalize it for this graph."""
        p = self.plans.get(config.name)
        if p is None:
            try:
                p = graph.Plan(h, config, self.uids)
            except CudnnError as e:
                log.debug("cuDNN graph: %s does not finalize (%s)", config.name, e.status_name)
                return None
            with self.lock:
                p = self.plans.setdefault(config.name, p)
        return p

    def named(self, h, name):
        return next((self.plan(h, c) for c in self.configs if c.name == name), None)


GRAPHS_MAX = 512
_graphs = {}                 # (handle, direction, dims, ...) -> _Graph
_fast = {}                   # (handle value, alignment, raw call arguments) -> (plan, graph)
_lock = threading.Lock()


def clear():
    """Forget every graph and plan (their descriptors are destroyed when no call holds them)."""
    with _lock:
        _graphs.clear()
        _fast.clear()
    fastpath.invalidate()     # memoised calls hold plans


def drop_variant_packs():
    """Forget the variant packs every plan keeps by device address (called when the caching
    allocator is emptied: those addresses will not come back)."""
    with _lock:
        graphs = list(_graphs.values())
    for g in graphs:
        for p in list(g.plans.values()):
            p.drop_packs()


memory.on_empty_cache(drop_variant_packs)


def fast_plans():
    """A copy of the remembered choices: {(handle value, alignment, raw): (plan, graph)}."""
    with _lock:
        return dict(_fast)


def chosen(key, raw):
    """The plan a ``*_once`` choice made for (handle value, alignment) ``key`` and ``raw``
    (convolve's arguments), or None."""
    hit = _fast.get((*key, raw))
    return hit[0] if hit is not None else None


def cached_graph(h, direction, dims, dtype, compute_dtype, flip, align, allow_tc, det):
    """The operation graph of these arguments on handle ``h`` (built on first use)."""
    key = (h.value, direction, dims, dtype, compute_dtype, flip, align, allow_tc, det)
    g = _graphs.get(key)
    if g is None:
        g = _Graph(h, direction, dims, dtype, compute_dtype, flip, align, allow_tc, det)
        with _lock:
            if len(_graphs) >= GRAPHS_MAX:
                _graphs.clear()
                _fast.clear()
            g = _graphs.setdefault(key, g)
    return g


def _guess(g, h, limit):
    """The first plan in heuristics order that finalizes and fits the workspace limit."""
    for c in g.configs:
        p = g.plan(h, c)
        if p is not None and (limit is None or p.workspace <= limit):
            return p
    return None


def _time(g, h, pointers, limit, stream):
    """The fastest of the first TIME_MAX plans that fit (each run once, then TIME_REPS times
    between CUDA events). Writes into the output, which the chosen plan then overwrites."""
    from numba import cuda
    device.refuse_in_capture("cuDNN graph engine timing", "it runs every candidate plan and "
                             "waits for the timings; the warm-up calls time the shapes they "
                             "see", stream)
    plans = []
    for c in g.configs:
        p = g.plan(h, c)
        if p is not None and (limit is None or p.workspace <= limit):
            plans.append(p)
        if len(plans) == TIME_MAX:
            break
    if not plans:
        return None
    s = cuda.external_stream(stream) if stream else cuda.default_stream()
    nbytes = max(p.workspace for p in plans)
    ws = workspace.alloc(nbytes, stream)
    if nbytes and ws is None:             # no memory to time with: take the heuristics' pick
        return _guess(g, h, limit)
    best, best_ms = None, None
    with workspace.held(ws) as wp:
        for p in plans:
            try:
                p.execute(h, pointers, wp)
                start, stop = cuda.event(), cuda.event()
                start.record(s)
                for _ in range(TIME_REPS):
                    p.execute(h, pointers, wp)
                stop.record(s)
                stop.synchronize()
            except CudnnError as e:
                log.debug("cuDNN graph: %s fails to run (%s)", p.name, e.status_name)
                continue
            ms = cuda.event_elapsed_time(start, stop) / TIME_REPS
            if best_ms is None or ms < best_ms:
                best, best_ms = p, ms
    return best


def _choose(g, h, choice, key, direction, pointers, limit, stream):
    name = algo_cache.lookup(choice, direction, key)
    if name is not None and name.startswith("engine"):
        p = g.named(h, name)
        if p is not None and (limit is None or p.workspace <= limit):
            return p
    p = _time(g, h, pointers, limit, stream) if choice.startswith("time") else None
    p = p or _guess(g, h, limit)
    if p is not None:
        algo_cache.store(choice, direction, key, p.name)
    return p


def convolve(direction, pointers, raw, make_key, make_spec, limit, stream, choice):
    """Run the convolution through a graph-API plan; returns the plan's name, or None when
    the graph API has no usable plan for it (the caller then takes the legacy path).

    ``raw``: a hashable tuple of every argument that shapes the choice (the fast key);
    ``make_key()``: the algorithm cache's key; ``make_spec()``: (dims, dtype, compute dtype,
    flip, allow tensor cores, deterministic) for building the graph (both only called on a
    miss); ``pointers``: (a, b, o)."""
    h = handle.get(stream)
    align = graph.alignment(pointers)
    fast_key = (h.value, align, raw)
    hit = _fast.get(fast_key) if choice.endswith("once") else None
    if hit is not None and (limit is None or hit[0].workspace <= limit):
        p, g = hit
        algo_cache.hit()
    else:
        spec = make_spec()
        g = cached_graph(h, direction, *spec[:4], align, *spec[4:])
        p = _choose(g, h, choice, make_key(), direction, pointers, limit, stream)
        if p is None:
            log.debug("cuDNN graph %s: no usable engine configuration (%d after the filters, "
                      "workspace limit %s); using the legacy API", direction, len(g.configs),
                      limit)
            return None
        _fast[fast_key] = (p, g)
    ws = workspace.alloc(p.workspace, stream)
    if p.workspace and ws is None:
        # out of device memory for this plan's workspace: this call takes the first plan that
        # needs none (not remembered: memory may be back by the next call)
        log.debug("cuDNN graph %s: cannot allocate the %d-byte workspace of %s; running a "
                  "plan without workspace", direction, p.workspace, p.name)
        p = _guess(g, h, 0)
        if p is None:
            return None
    with workspace.held(ws) as wp:
        p.execute(h, pointers, wp, context=lambda: f"cuDNN graph {direction} {p.name}")
    return p.name
