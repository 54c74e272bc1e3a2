"""cuDNN 2-D and 3-D convolutions: forward, backward data, backward filter, bias.

The calls live here; ``conv_algos`` holds the algorithm tables and the choosing,
``conv_plans`` the descriptors kept per shape, ``conv_graph`` the graph-API route that the
runtime choices take first (``bind`` keeps its plans for repeated calls).

Arrays come in ConvGeom's 5-D form; a 2-D convolution is described to cuDNN as 4-D (the dummy
depth dimension dropped), since cuDNN picks among different kernels for 4-D and 5-D tensors.

``algo`` is a named algorithm (``conv_algos.FWD_ALGOS``, ``BWD_DATA_ALGOS``,
``BWD_FILTER_ALGOS``: Theano's flag values) or one of ``CHOICES``. ``guess_*`` asks cuDNN's
heuristics (cudnnGet...Algorithm_v7), ``time_*`` runs every algorithm once
(cudnnFind...AlgorithmEx); from either list the first entry that succeeded, fits in
``workspace_limit`` bytes and, when ``deterministic``, is deterministic, is taken; with none,
the direction's default. ``*_once`` remembers the answer for the process,
``*_on_shape_change`` only for the latest key (``dnnkit.cudnn.algo_cache``).

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

import math
import types
from ctypes import c_int, c_size_t, c_void_p

import numpy as np

from ..log import log
from ..arrays import float_name
from ..errors import CudnnError
from . import algo_cache, api, conv_graph, graph, handle
from .api import ptr
from .conv_algos import BWD_DATA, BWD_FILTER, CHOICES, FWD, cache_key, choose, workspace_for
from .conv_plans import check_arrays, descriptor_dims, open_call
from .descriptors import INT_MAX, scalar_refs, tensor
from .enums import DATA_TYPES, MATH_DEFAULT, MATH_FMA, MATH_TENSOR_OP
from .workspace import alloc, held


_p = c_void_p

PROTOTYPES = {
    # cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t handle, const void *alpha,
    #     const cudnnTensorDescriptor_t xDesc, const void *x,
    #     const cudnnFilterDescriptor_t wDesc, const void *w,
    #     const cudnnConvolutionDescriptor_t convDesc, cudnnConvolutionFwdAlgo_t algo,
    #     void *workSpace, size_t workSpaceSizeInBytes, const void *beta,
    #     const cudnnTensorDescriptor_t yDesc, void *y);
    "cudnnConvolutionForward": [_p, _p, _p, _p, _p, _p, _p, c_int, _p, c_size_t, _p, _p, _p],
    # cudnnStatus_t cudnnConvolutionBackwardData(cudnnHandle_t handle, const void *alpha,
    #     const cudnnFilterDescriptor_t wDesc, const void *w,
    #     const cudnnTensorDescriptor_t dyDesc, const void *dy,
    #     const cudnnConvolutionDescriptor_t convDesc, cudnnConvolutionBwdDataAlgo_t algo,
    #     void *workSpace, size_t workSpaceSizeInBytes, const void *beta,
    #     const cudnnTensorDescriptor_t dxDesc, void *dx);
    "cudnnConvolutionBackwardData": [_p, _p, _p, _p, _p, _p, _p, c_int, _p, c_size_t, _p, _p,
                                     _p],
    # cudnnStatus_t cudnnConvolutionBackwardFilter(cudnnHandle_t handle, const void *alpha,
    #     const cudnnTensorDescriptor_t xDesc, const void *x,
    #     const cudnnTensorDescriptor_t dyDesc, const void *dy,
    #     const cudnnConvolutionDescriptor_t convDesc, cudnnConvolutionBwdFilterAlgo_t algo,
    #     void *workSpace, size_t workSpaceSizeInBytes, const void *beta,
    #     const cudnnFilterDescriptor_t dwDesc, void *dw);
    "cudnnConvolutionBackwardFilter": [_p, _p, _p, _p, _p, _p, _p, c_int, _p, c_size_t, _p,
                                       _p, _p],
    # cudnnStatus_t cudnnConvolutionBackwardBias(cudnnHandle_t handle, const void *alpha,
    #     const cudnnTensorDescriptor_t dyDesc, const void *dy, const void *beta,
    #     const cudnnTensorDescriptor_t dbDesc, void *db);
    "cudnnConvolutionBackwardBias": [_p, _p, _p, _p, _p, _p, _p],
    # cudnnStatus_t cudnnAddTensor(cudnnHandle_t handle, const void *alpha,
    #     const cudnnTensorDescriptor_t aDesc, const void *A, const void *beta,
    #     const cudnnTensorDescriptor_t cDesc, void *C);
    "cudnnAddTensor": [_p, _p, _p, _p, _p, _p, _p],
}
api.register_prototypes(PROTOTYPES)

# (data dtype -> compute dtypes cuDNN accepts: TRUE_HALF, PSEUDO_HALF, FLOAT, DOUBLE configs)
COMPUTE_DTYPES = {"float16": ("float16", "float32"), "float32": ("float32",),
                  "float64": ("float64",)}


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


def execute(c, algo, deterministic, limit):
    """Run call ``c`` with algorithm ``algo`` (or the default, when its workspace does not
    fit); returns the algorithm that ran."""
    algo, ws, nbytes = workspace_for(c, algo, deterministic, limit)
    alpha, beta = scalar_refs(c.dtype)
    a, b, o = c.ptrs
    with held(ws) as wp:
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
    return (d.name, choice, geom, dt, ct, allow_tc, det, algo_cache.limit_bucket(limit))


def _graph_convolve(d, arrays, geom, dtype, compute_dtype, math_t, allow_tf32, deterministic,
                    limit, stream, choice):
    """A runtime choice through the graph API (conv_graph); None when it has no plan for
    this convolution (the legacy path then runs it)."""
    raw = _graph_raw(d, geom, dtype, compute_dtype, allow_tf32, deterministic, limit, choice)
    _, _, _, dt, ct, allow_tc, det, _ = raw
    a, b, o = arrays
    try:
        return conv_graph.convolve(
            d.name, (ptr(a), ptr(b), ptr(o)), raw,
            lambda: cache_key(types.SimpleNamespace(d=d, dtype=np.dtype(dt)),  # what it reads
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
    check_arrays(d, arrays, geom)
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
    c = open_call(d, arrays, geom, dtype, compute_dtype, math_t, stream)
    enum = choose(c, algo, arrays, geom, compute_dtype, math_t, deterministic, workspace_limit)
    try:
        enum = execute(c, enum, deterministic, workspace_limit)
    except CudnnError as e:  # NOT_SUPPORTED from the workspace query or the run
        default = d.default(deterministic)
        if not e.not_supported or enum == default:
            raise
        log.debug("cuDNN %s algorithm %s: %s; retrying with %s", d.name,
                  d.algo_name(enum), e.status_name, d.algo_name(default))
        enum = execute(c, default, deterministic, workspace_limit)
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
        ptrs = (ptr(a), ptr(b), ptr(o))
        h = get()
        key = (h.value, graph.alignment(ptrs))
        p = plans.get(key)
        if p is None:
            name = full(a, b, o)
            p = conv_graph.chosen(key, raw)
            if p is not None and p.name == name:
                plans[key] = p
            return name
        ws = alloc(p.workspace, stream)
        if p.workspace and ws is None:      # out of memory for it: the full path's fallback
            return full(a, b, o)
        with held(ws) as wp:
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
    api.call("cudnnAddTensor", handle.get(stream), one, tensor(dims.bias, y.dtype), ptr(bias),
             one, tensor(dims.y, y.dtype), ptr(y),
             context=lambda: f"bias {dims.bias} onto y {dims.y} {np.dtype(y.dtype).name}")


def backward_bias(dy, db, stream):
    """db (K,) = dy (4-D or 5-D) summed over N and the spatial dims
    (cudnnConvolutionBackwardBias)."""
    alpha, beta = scalar_refs(dy.dtype)
    y_dims = tuple(dy.shape)
    b_dims = (1, y_dims[1]) + (1,) * (len(y_dims) - 2)
    api.call("cudnnConvolutionBackwardBias", handle.get(stream), alpha,
             tensor(y_dims, dy.dtype), ptr(dy), beta, tensor(b_dims, dy.dtype), ptr(db),
             context=lambda: f"dy {y_dims} into db {b_dims} {np.dtype(dy.dtype).name}")
