"""cuDNN 2-D and 3-D convolutions: forward, backward data, backward filter, bias.

Arrays come in ConvGeom's 5-D form; a 2-D convolution is described to cuDNN as 4-D (the dummy
depth dimension dropped), since cuDNN picks among different kernels for 4-D and 5-D tensors.

``algo`` is a named algorithm (``FWD_ALGOS``, ``BWD_DATA_ALGOS``, ``BWD_FILTER_ALGOS``: Theano's
flag values) or one of ``CHOICES``. ``guess_*`` asks cuDNN's heuristics
(cudnnGet...Algorithm_v7), ``time_*`` runs every algorithm once (cudnnFind...AlgorithmEx); from
either list the first entry that succeeded, fits in ``workspace_limit`` bytes and, when
``deterministic``, is deterministic, is taken; with none, the direction's default. ``*_once``
remembers the answer for the process, ``*_on_shape_change`` only for the latest key
(``dnnkit.cudnn.algo_cache``).

Defaults, which need no workspace in the common case: forward IMPLICIT_GEMM, backward ALGO_0, or
ALGO_1 when ``deterministic``.

``deterministic=True`` replaces a named algorithm that is not bitwise reproducible by ALGO_1
(every forward algorithm is deterministic; backward-data ALGO_0 and backward-filter ALGO_0 and
ALGO_3 use atomic adds and are not).

Fallbacks, each logged at debug level on the ``dnnkit`` logger: an algorithm whose workspace
exceeds ``workspace_limit``, or whose workspace cannot be allocated, gives way to the default;
an algorithm other than the default that raises a NOT_SUPPORTED status (e.g. WINOGRAD on
Hopper, FFT with a stride > 1) is retried once with the default. Each function returns the name
of the algorithm that ran (``enums.CONV_*_ALGO`` keys, e.g. ``"implicit_precomp_gemm"``).
When the default itself needs more than ``workspace_limit`` (or its workspace cannot be had),
DnnkitError is raised. ``workspace_limit=None`` means no limit.

``time_*`` times into the caller's output array: harmless, since the chosen algorithm then
overwrites all of it (beta = 0), and the inputs are only read.
"""

import collections
import contextlib
import ctypes
import dataclasses
import logging
import math
import threading
import types

import numpy as np

from ..arrays import float_name
from ..errors import CudnnError, DnnkitError
from . import algo_cache, api, conv_graph, graph, handle, loader
from .workspace import alloc as _alloc, held as _held
from .calls import _ptr
from .descriptors import (INT_MAX, ConvolutionDescriptor, FilterDescriptor, TensorDescriptor,
                          scalar_refs, tensor)
from .enums import (CONV_BWD_DATA_ALGO, CONV_BWD_FILTER_ALGO, CONV_FWD_ALGO, CONVOLUTION,
                    CROSS_CORRELATION, DATA_TYPES, DETERMINISTIC, MATH_DEFAULT, MATH_FMA,
                    MATH_NAMES, MATH_TENSOR_OP, STATUS_SUCCESS)

log = logging.getLogger("dnnkit")

CHOICES = algo_cache.CHOICES
_F, _D, _W = CONV_FWD_ALGO, CONV_BWD_DATA_ALGO, CONV_BWD_FILTER_ALGO
FWD_ALGOS = {"none": _F["implicit_gemm"], "small": _F["implicit_precomp_gemm"],
             "large": _F["gemm"], "direct": _F["direct"], "fft": _F["fft"],
             "fft_tiling": _F["fft_tiling"], "winograd": _F["winograd"],
             "winograd_non_fused": _F["winograd_nonfused"]}
BWD_DATA_ALGOS = {"none": _D["algo_0"], "deterministic": _D["algo_1"], "fft": _D["fft"],
                  "fft_tiling": _D["fft_tiling"], "winograd": _D["winograd"],
                  "winograd_non_fused": _D["winograd_nonfused"]}
BWD_FILTER_ALGOS = {"none": _W["algo_0"], "deterministic": _W["algo_1"], "fft": _W["fft"],
                    "small": _W["algo_3"], "fft_tiling": _W["fft_tiling"],
                    "winograd_non_fused": _W["winograd_nonfused"]}
# (data dtype -> compute dtypes cuDNN accepts: TRUE_HALF, PSEUDO_HALF, FLOAT, DOUBLE configs)
COMPUTE_DTYPES = {"float16": ("float16", "float32"), "float32": ("float32",),
                  "float64": ("float64",)}


class AlgoPerf(ctypes.Structure):
    """cudnnConvolution{Fwd,BwdData,BwdFilter}AlgoPerf_t (the three share this layout)."""
    _fields_ = [("algo", ctypes.c_int), ("status", ctypes.c_int), ("time", ctypes.c_float),
                ("memory", ctypes.c_size_t), ("determinism", ctypes.c_int),
                ("mathType", ctypes.c_int), ("reserved", ctypes.c_int * 3)]


@dataclasses.dataclass(frozen=True)
class _Direction:
    """One convolution direction: inputs a, b and output o, in cuDNN's argument order."""
    name: str               # cache key / logs: "fwd", "bwd_data", "bwd_filter"
    infix: str              # C names: cudnnConvolution<infix>, cudnnGetConvolution<infix>...
    algos: dict             # cuDNN algorithm name -> enum value
    named: dict             # flag value -> enum value
    nondeterministic: tuple
    filter_at: int          # which of (a, b, o) is described by a filter descriptor

    def default(self, deterministic):
        if self.name == "fwd":
            return _F["implicit_gemm"]
        return self.algos["algo_1" if deterministic else "algo_0"]

    def algo_name(self, enum):
        return {v: k for k, v in self.algos.items()}[enum]


FWD = _Direction("fwd", "Forward", _F, FWD_ALGOS, (), 1)
BWD_DATA = _Direction("bwd_data", "BackwardData", _D, BWD_DATA_ALGOS, (_D["algo_0"],), 0)
BWD_FILTER = _Direction("bwd_filter", "BackwardFilter", _W, BWD_FILTER_ALGOS,
                        (_W["algo_0"], _W["algo_3"]), 2)


@dataclasses.dataclass(frozen=True)
class ConvDims:
    """What cuDNN is told: 4-D tensors for a 2-D convolution, 5-D for a 3-D one."""
    x: tuple
    w: tuple
    y: tuple
    bias: tuple
    padding: tuple
    stride: tuple
    dilation: tuple


def descriptor_dims(geom):
    """ConvDims of ``geom`` (pure: no cuDNN, no GPU)."""
    y = geom.user_shape(geom.y_shape)
    return ConvDims(geom.user_shape(geom.x_shape), geom.user_shape(geom.w_shape), y,
                    (1, y[1]) + (1,) * geom.nd, geom.user_tuple(geom.padding),
                    geom.user_tuple(geom.stride), geom.user_tuple(geom.dilation))


def math_type(dtype, compute_dtype, allow_tf32):
    """cudnnMathType_t: tensor cores for float16 data; for float32, TF32 only if allowed."""
    dt = float_name(dtype)
    if dt == "float16":
        return MATH_TENSOR_OP
    if dt == "float32" and float_name(compute_dtype) == "float32":
        return MATH_DEFAULT if allow_tf32 else MATH_FMA  # DEFAULT lets Ampere+ use TF32
    return MATH_DEFAULT


_supported = {}             # supports()'s answers by its arguments (it runs on every call)


def supports(geom, dtype, compute_dtype, allow_empty=False):
    """None if cuDNN can run this convolution, else the reason it cannot (pure).
    ``allow_empty``: empty tensors pass (the op answers them without calling cuDNN)."""
    key = (geom, float_name(dtype) or str(dtype), str(compute_dtype), allow_empty)
    try:
        return _supported[key]
    except KeyError:
        pass
    if len(_supported) > 4096:
        _supported.clear()
    why = _supported[key] = _supports(geom, dtype, compute_dtype, allow_empty)
    return why


def _supports(geom, dtype, compute_dtype, allow_empty):
    dt, ct = np.dtype(dtype).name, str(compute_dtype)
    if dt not in DATA_TYPES:
        return f"data type {dt} (cuDNN convolutions take {', '.join(DATA_TYPES)})"
    if ct not in COMPUTE_DTYPES[dt]:
        return (f"{dt} data with {ct} compute (cuDNN computes {dt} data in "
                f"{' or '.join(COMPUTE_DTYPES[dt])})")
    if geom.nd not in (2, 3):
        return f"{geom.nd}-D convolution (cuDNN path: 2-D and 3-D)"
    if min(geom.stride + geom.dilation) < 1 or min(geom.padding) < 0:
        return (f"stride {geom.stride} and dilation {geom.dilation} must be >= 1 and padding "
                f"{geom.padding} >= 0")
    for name, shape in (("x", geom.x_shape), ("w", geom.w_shape), ("y", geom.y_shape)):
        if min(shape) < 1 and not allow_empty:
            return f"{name} shape {tuple(shape)} has an empty dimension"
        if math.prod(shape) > INT_MAX:
            return (f"{name} {tuple(shape)} has {math.prod(shape)} elements; cuDNN's "
                    "convolutions index with 32-bit integers (at most 2**31 - 1)")
    for name, t in (("padding", geom.padding), ("stride", geom.stride),
                    ("dilation", geom.dilation)):
        if max(t) > INT_MAX:
            return f"{name} {tuple(t)} exceeds cuDNN's 32-bit limit"
    if geom.x_shape[1] != geom.w_shape[1] * geom.groups or geom.w_shape[0] % geom.groups:
        return (f"x {geom.x_shape} and w {geom.w_shape} do not split into {geom.groups} "
                "groups")
    return None


@dataclasses.dataclass
class _Plan:
    """The descriptors of one convolution, kept open for reuse, and its workspace sizes by
    algorithm (every query is a cuDNN call: ~60 us for a workspace size, ~50 us per
    descriptor created, set and destroyed)."""
    descs: tuple            # descriptors of (a, b, o)
    conv: ConvolutionDescriptor
    ctx: str
    ws: dict                # algorithm enum -> workspace bytes

    def close(self):
        for desc in self.descs + (self.conv,):
            desc.close()


@dataclasses.dataclass
class _Call:
    """One convolution: its plan, handle and device pointers."""
    d: _Direction
    h: object
    plan: _Plan
    ptrs: tuple             # device pointers of (a, b, o)
    dtype: np.dtype
    stream: int

    @property
    def descs(self):
        return self.plan.descs

    @property
    def conv(self):
        return self.plan.conv

    @property
    def ctx(self):
        return self.plan.ctx

    def fn(self, pattern):
        return pattern.format(self.d.infix)


def _ctx(d, geom, dims, dtype, compute_dtype, math_t):
    return (f"{d.name} conv x {dims.x}, w {dims.w}, y {dims.y} {np.dtype(dtype).name} "
            f"(compute {compute_dtype}, math {MATH_NAMES[math_t]}), padding {dims.padding}, "
            f"stride {dims.stride}, dilation {dims.dilation}, groups {geom.groups}, "
            f"mode {'conv' if geom.flip else 'cross'}")


PLANS_MAX = 512             # plans kept (least recently used dropped first)
_plans = collections.OrderedDict()
_plans_lock = threading.Lock()


def _new_plan(d, geom, dtype, compute_dtype, math_t):
    dims = descriptor_dims(geom)
    shapes = {FWD.name: (dims.x, dims.w, dims.y), BWD_DATA.name: (dims.w, dims.y, dims.x),
              BWD_FILTER.name: (dims.x, dims.y, dims.w)}[d.name]
    with contextlib.ExitStack() as st:   # closes what was opened if a later step fails
        descs = tuple(st.enter_context((FilterDescriptor if i == d.filter_at else
                                        TensorDescriptor)(s, dtype))
                      for i, s in enumerate(shapes))
        cd = st.enter_context(ConvolutionDescriptor(
            dims.padding, dims.stride, dims.dilation,
            CONVOLUTION if geom.flip else CROSS_CORRELATION, compute_dtype, geom.groups, math_t))
        st.pop_all()
    return _Plan(descs, cd, _ctx(d, geom, dims, dtype, compute_dtype, math_t), {})


def _plan(d, geom, dtype, compute_dtype, math_t, device):
    """The cached plan of a convolution (created on first use)."""
    key = (d.name, device, geom, float_name(dtype), str(compute_dtype), math_t)
    with _plans_lock:
        plan = _plans.get(key)
        if plan is not None:
            _plans.move_to_end(key)
            return plan
    plan = _new_plan(d, geom, dtype, compute_dtype, math_t)
    with _plans_lock:
        old = _plans.setdefault(key, plan)
        evicted = [_plans.popitem(last=False)[1] for _ in range(len(_plans) - PLANS_MAX)]
    if old is not plan:        # another thread made it first
        plan.close()
    for p in evicted:
        p.close()
    return old


def clear_plans():
    """Destroy every cached descriptor (they are recreated on demand)."""
    with _plans_lock:
        plans = list(_plans.values())
        _plans.clear()
    for p in plans:
        p.close()


def _open(d, arrays, geom, dtype, compute_dtype, math_t, stream):
    h, device = handle.get(stream), handle.device_id()
    plan = _plan(d, geom, np.dtype(dtype), compute_dtype, math_t, device)
    return _Call(d, h, plan, tuple(_ptr(a) for a in arrays), np.dtype(dtype), stream)


def _check_arrays(d, arrays, geom):
    """Arrays shaped as the user's (N, C, H, W) or as ConvGeom's 5-D form."""
    want = {FWD.name: (geom.x_shape, geom.w_shape, geom.y_shape),
            BWD_DATA.name: (geom.w_shape, geom.y_shape, geom.x_shape),
            BWD_FILTER.name: (geom.x_shape, geom.y_shape, geom.w_shape)}[d.name]
    for a, shape in zip(arrays, want):
        if (tuple(a.shape) not in (tuple(shape), geom.user_shape(shape))
                or a.dtype != arrays[0].dtype):
            raise ValueError(f"cuDNN {d.name} convolution: array {tuple(a.shape)} {a.dtype}, "
                             f"expected {tuple(shape)} {arrays[0].dtype}")


# --- workspace ---------------------------------------------------------------------------


def _ws_size(c, algo):
    size = c.plan.ws.get(algo)
    if size is None:
        out = ctypes.c_size_t()
        api.call(c.fn("cudnnGetConvolution{}WorkspaceSize"), c.h, *c.descs[:2], c.conv,
                 c.descs[2], algo, ctypes.byref(out),
                 context=f"{c.ctx}, algo {c.d.algo_name(algo)}")
        size = c.plan.ws[algo] = out.value
    return size


def _workspace(c, algo, deterministic, limit):
    """(algo, buffer, nbytes): ``algo`` with its workspace, or the default with its own."""
    size = _ws_size(c, algo)
    if limit is None or size <= limit:
        ws = _alloc(size, c.stream)
        if ws is not None or not size:
            return algo, ws, size
        why = f"cannot allocate its {size}-byte workspace"
    else:
        why = f"needs {size} bytes of workspace, over workspace_limit {limit}"
    default = c.d.default(deterministic)
    if algo == default:
        raise DnnkitError(f"cuDNN {c.d.name} algorithm {c.d.algo_name(algo)} (the default) "
                          f"{why}: {c.ctx}")
    log.debug("cuDNN %s algorithm %s %s; using %s (%s)", c.d.name, c.d.algo_name(algo), why,
              c.d.algo_name(default), c.ctx)
    return _workspace(c, default, deterministic, limit)


# --- choosing ----------------------------------------------------------------------------


def _perf_array(c):
    n = ctypes.c_int()
    api.call(c.fn("cudnnGetConvolution{}AlgorithmMaxCount"), c.h, ctypes.byref(n),
             context=c.ctx)
    return (AlgoPerf * max(n.value, 1))(), ctypes.c_int()


def _guess(c):
    perfs, got = _perf_array(c)
    api.call(c.fn("cudnnGetConvolution{}Algorithm_v7"), c.h, *c.descs[:2], c.conv, c.descs[2],
             len(perfs), ctypes.byref(got), perfs, context=c.ctx)
    return list(perfs[:got.value])


def _timing_bytes(c, limit):
    """No algorithm uses more than the largest workspace any of them asks for."""
    most = 0
    for algo in c.d.algos.values():
        try:
            most = max(most, _ws_size(c, algo))
        except CudnnError as e:  # NOT_SUPPORTED and the like: cuDNN won't time it either
            log.debug("cuDNN %s %s workspace query: %s", c.d.name, c.d.algo_name(algo), e)
    return most if limit is None else min(most, limit)


def _time(c, limit):
    """cudnnFind...AlgorithmEx's list, or None when its workspace cannot be allocated.

    It writes the timing runs' results into the output array o, which is safe: the chosen
    algorithm then overwrites all of o (beta = 0), and a, b (inputs) are only read.
    """
    nbytes = _timing_bytes(c, limit)
    ws = _alloc(nbytes, c.stream)
    if nbytes and ws is None:
        log.debug("cuDNN %s: no memory for a %d-byte timing workspace; guessing instead (%s)",
                  c.d.name, nbytes, c.ctx)
        return None
    perfs, got = _perf_array(c)
    a, b, o = c.ptrs
    with _held(ws) as wp:
        api.call(c.fn("cudnnFindConvolution{}AlgorithmEx"), c.h, c.descs[0], a, c.descs[1], b,
                 c.conv, c.descs[2], o, len(perfs), ctypes.byref(got), perfs,
                 ctypes.c_void_p(wp), nbytes, context=c.ctx)
    return list(perfs[:got.value])


def pick(d, perfs, deterministic, limit):
    """The first usable entry's algorithm, else the default (pure; ``perfs``: AlgoPerf)."""
    for p in perfs:
        if (p.status == STATUS_SUCCESS and p.algo in d.algos.values()
                and (limit is None or p.memory <= limit)
                and (not deterministic or p.determinism == DETERMINISTIC)):
            return p.algo
    return d.default(deterministic)


_keys = {}  # the raw inputs -> make_key's JSON, which costs ~50 us to build on every call


def _cache_key(c, arrays, geom, compute_dtype, math_t, deterministic, limit, choice):
    from numba import cuda
    dev = cuda.get_current_device()
    raw = (c.d.name, choice, getattr(dev, "id", 0), loader.status().version, geom,
           tuple((tuple(a.shape), tuple(a.strides)) for a in arrays), c.dtype.name,
           str(compute_dtype), math_t, bool(deterministic), limit)
    key = _keys.get(raw)
    if key is None:
        strides = [tuple(s // a.dtype.itemsize for s in a.strides) for a in arrays]
        key = algo_cache.make_key(
            c.d.name, choice, device=algo_cache.current_device(),
            cudnn_version=raw[3], nd=geom.nd, shapes=[tuple(a.shape) for a in arrays],
            strides=strides, padding=geom.padding, stride=geom.stride,
            dilation=geom.dilation, groups=geom.groups, flip=geom.flip, dtype=c.dtype,
            compute_dtype=compute_dtype, math_type=math_t, deterministic=deterministic,
            workspace_limit=limit)
        if len(_keys) > 4096:  # bound the memo; rebuilding a key is only slower
            _keys.clear()
        _keys[raw] = key
    return key


def _choose(c, algo, arrays, geom, compute_dtype, math_t, deterministic, limit):
    if algo not in CHOICES:
        enum = c.d.named[algo]
        return c.d.default(True) if deterministic and enum in c.d.nondeterministic else enum
    key = _cache_key(c, arrays, geom, compute_dtype, math_t, deterministic, limit, algo)
    name = algo_cache.lookup(algo, c.d.name, key)
    if name in c.d.algos:         # (not a graph-API engine stored under the same key)
        return c.d.algos[name]
    perfs = _time(c, limit) if algo.startswith("time") else None
    enum = pick(c.d, _guess(c) if perfs is None else perfs, deterministic, limit)
    if perfs is not None or algo.startswith("guess"):  # don't remember an OOM stand-in
        algo_cache.store(algo, c.d.name, key, c.d.algo_name(enum))
    return enum


# --- running -----------------------------------------------------------------------------


def _execute(c, algo, deterministic, limit):
    algo, ws, nbytes = _workspace(c, algo, deterministic, limit)
    alpha, beta = scalar_refs(c.dtype)
    a, b, o = c.ptrs
    with _held(ws) as wp:
        api.call(c.fn("cudnnConvolution{}"), c.h, alpha, c.descs[0], a,
                 c.descs[1], b, c.conv, algo, wp, nbytes, beta, c.descs[2], o,
                 context=lambda: f"{c.ctx}, algo {c.d.algo_name(algo)}, workspace {nbytes}")
    return algo


def _graph_raw(d, geom, dtype, compute_dtype, allow_tf32, deterministic, limit, choice):
    """What shapes a graph-API choice: conv_graph's fast key for it (with handle, alignment)."""
    dt, ct, det = float_name(dtype), str(compute_dtype), bool(deterministic)
    # tensor cores: always for float16 data (the legacy path's TENSOR_OP math), for float32
    # only when TF32 is allowed
    allow_tc = dt == "float16" or (dt == "float32" and bool(allow_tf32))
    return (d.name, choice, geom, dt, ct, allow_tc, det, algo_cache._limit_bucket(limit))


def _graph_convolve(d, arrays, geom, dtype, compute_dtype, math_t, allow_tf32, deterministic,
                    limit, stream, choice):
    """A runtime choice through the graph API (conv_graph); None when it has no plan for
    this convolution (the legacy path then runs it)."""
    raw = _graph_raw(d, geom, dtype, compute_dtype, allow_tf32, deterministic, limit, choice)
    _, _, _, dt, ct, allow_tc, det, _ = raw
    a, b, o = arrays
    try:
        return conv_graph.convolve(
            d.name, (_ptr(a), _ptr(b), _ptr(o)), raw,
            lambda: _cache_key(types.SimpleNamespace(d=d, dtype=np.dtype(dt)),  # what it reads
                               arrays, geom, compute_dtype, math_t, det, limit, choice),
            lambda: (descriptor_dims(geom), dt, ct, geom.flip, allow_tc, det),
            limit, stream, choice)
    except CudnnError as e:
        if not e.not_supported:
            raise
        log.debug("cuDNN graph %s: %s; using the legacy API", d.name, e)
        return None


_valid = {}      # _convolve's checked arguments -> (dtype, math type): the checks run once


def _checked(d, arrays, geom, algo, compute_dtype, allow_tf32):
    """(dtype, math type) once the arguments are checked; raises ValueError otherwise."""
    a, b, o = arrays
    key = (d.name, algo, geom, compute_dtype, allow_tf32, a.shape, b.shape, o.shape, a.dtype,
           b.dtype, o.dtype)
    hit = _valid.get(key)
    if hit is not None:
        return hit
    if algo not in d.named and algo not in CHOICES:
        raise ValueError(f"cuDNN {d.name} algo must be one of "
                         f"{', '.join(list(d.named) + list(CHOICES))}; got {algo!r}")
    dtype = np.dtype(a.dtype)
    why = supports(geom, dtype, compute_dtype)
    if why:
        raise ValueError(f"cuDNN {d.name} convolution cannot run: {why}")
    _check_arrays(d, arrays, geom)
    if len(_valid) > 4096:
        _valid.clear()
    hit = _valid[key] = (dtype, math_type(dtype, compute_dtype, allow_tf32))
    return hit


def _convolve(d, arrays, geom, algo, compute_dtype, allow_tf32, deterministic, workspace_limit,
              stream):
    dtype, math_t = _checked(d, arrays, geom, algo, compute_dtype, allow_tf32)
    if algo in CHOICES:
        name = _graph_convolve(d, arrays, geom, dtype, compute_dtype, math_t, allow_tf32,
                               deterministic, workspace_limit, stream, algo)
        if name is not None:
            return name
    c = _open(d, arrays, geom, dtype, compute_dtype, math_t, stream)
    enum = _choose(c, algo, arrays, geom, compute_dtype, math_t, deterministic,
                   workspace_limit)
    try:
        enum = _execute(c, enum, deterministic, workspace_limit)
    except CudnnError as e:  # NOT_SUPPORTED from the workspace query or the run
        default = d.default(deterministic)
        if not e.not_supported or enum == default:
            raise
        log.debug("cuDNN %s algorithm %s: %s; retrying with %s", d.name,
                  d.algo_name(enum), e.status_name, d.algo_name(default))
        enum = _execute(c, default, deterministic, workspace_limit)
    return d.algo_name(enum)


def bind(d, geom, dtype, *, algo, compute_dtype, allow_tf32, deterministic, workspace_limit,
         stream):
    """``run(a, b, o)`` -> the algorithm's name: direction ``d``'s convolution (arrays in
    FWD's (x, w, y), BWD_DATA's (w, dy, dx), BWD_FILTER's (x, dy, dw) order) for one
    signature, made cheap to repeat. A runtime choice (``guess_once``, ...) runs its first
    call through the full path, then keeps the graph-API plan it chose per (handle, address
    alignment) and executes it directly: a workspace from the per-stream cache and one
    cudnnBackendExecute. Everything else (named legacy algorithms, a workspace that cannot be
    allocated) takes the full path every time."""
    args = (geom, algo, compute_dtype, allow_tf32, deterministic, workspace_limit, stream)

    def full(a, b, o):
        return _convolve(d, (a, b, o), *args)
    if algo not in CHOICES or not algo.endswith("once"):
        return full
    raw = _graph_raw(d, geom, dtype, compute_dtype, allow_tf32, deterministic, workspace_limit,
                     algo)
    plans = {}               # (handle, alignment) -> the plan the full path chose
    get = handle.getter(stream)

    def run(a, b, o):
        ptrs = (_ptr(a), _ptr(b), _ptr(o))
        h = get()
        key = (h.value, graph.alignment(ptrs))
        p = plans.get(key)
        if p is None:
            name = full(a, b, o)
            p = conv_graph.chosen(key, raw)
            if p is not None and p.name == name:
                plans[key] = p
            return name
        ws = _alloc(p.workspace, stream)
        if p.workspace and ws is None:      # out of memory for it: the full path's fallback
            return full(a, b, o)
        with _held(ws) as wp:
            p.execute(h, ptrs, wp, context=lambda: f"cuDNN graph {d.name} {p.name}")
        algo_cache.hit()
        return p.name
    return run


def forward(x, w, y, geom, *, algo, compute_dtype, allow_tf32, deterministic, workspace_limit,
            stream):
    """y = conv(x, w). Returns the name of the algorithm that ran."""
    return _convolve(FWD, (x, w, y), geom, algo, compute_dtype, allow_tf32, deterministic,
                     workspace_limit, stream)


def backward_data(dy, w, dx, geom, *, algo, compute_dtype, allow_tf32, deterministic,
                  workspace_limit, stream):
    """dx = gradient of conv wrt x, from dy and w."""
    return _convolve(BWD_DATA, (w, dy, dx), geom, algo, compute_dtype, allow_tf32,
                     deterministic, workspace_limit, stream)


def backward_filter(x, dy, dw, geom, *, algo, compute_dtype, allow_tf32, deterministic,
                    workspace_limit, stream):
    """dw = gradient of conv wrt w, from x and dy."""
    return _convolve(BWD_FILTER, (x, dy, dw), geom, algo, compute_dtype, allow_tf32,
                     deterministic, workspace_limit, stream)


def add_bias(y, bias, geom, stream):
    """y += bias (K,), broadcast over N and the spatial dims (cudnnAddTensor)."""
    one = scalar_refs(y.dtype)[0]  # C = alpha * A + beta * C with alpha = beta = 1
    dims = descriptor_dims(geom)
    api.call("cudnnAddTensor", handle.get(stream), one, tensor(dims.bias, y.dtype), _ptr(bias),
             one, tensor(dims.y, y.dtype), _ptr(y),
             context=lambda: f"bias {dims.bias} onto y {dims.y} {np.dtype(y.dtype).name}")


def backward_bias(dy, db, stream):
    """db (K,) = dy (4-D or 5-D) summed over N and the spatial dims
    (cudnnConvolutionBackwardBias)."""
    alpha, beta = scalar_refs(dy.dtype)
    y_dims = tuple(dy.shape)
    b_dims = (1, y_dims[1]) + (1,) * (len(y_dims) - 2)
    api.call("cudnnConvolutionBackwardBias", handle.get(stream), alpha,
             tensor(y_dims, dy.dtype), _ptr(dy), beta, tensor(b_dims, dy.dtype), _ptr(db),
             context=lambda: f"dy {y_dims} into db {b_dims} {np.dtype(dy.dtype).name}")
