"""cuDNN convolution algorithms (the legacy API): the algorithm tables, the three directions,
each algorithm's workspace, and choosing one.

``heuristics`` asks cuDNN (cudnnGetConvolution...Algorithm_v7) and ``timings`` runs every
algorithm once (cudnnFindConvolution...AlgorithmEx); ``pick`` takes the first entry of either
list that succeeded, fits the workspace limit and, when asked, is deterministic; ``choose``
turns a named algorithm or a runtime choice (``CHOICES``) into an algorithm, remembered in
``algo_cache``. ``workspace_for`` gives an algorithm its workspace, or falls back to the
direction's default. conv.py documents these rules as its callers see them.

The functions take a ``conv_plans.Call``: one convolution's descriptors, handle and pointers.
Numba is imported inside ``cache_key``: ``import dnnkit`` must not load it.
"""

import ctypes
import dataclasses
from ctypes import POINTER, c_int, c_size_t, c_void_p

from ..log import log
from .. import device
from ..errors import CudnnError, DnnkitError
from . import algo_cache, api, loader
from .enums import (CONV_BWD_DATA_ALGO, CONV_BWD_FILTER_ALGO, CONV_FWD_ALGO, DETERMINISTIC,
                    STATUS_SUCCESS)
from .workspace import alloc, held


_p = c_void_p
_int_p = POINTER(c_int)

# Every perfResults argument points to an array of
# cudnnConvolution{Fwd,BwdData,BwdFilter}AlgoPerf_t (``AlgoPerf``), declared void* here.
PROTOTYPES = {
    # cudnnStatus_t cudnnGetConvolutionForwardAlgorithmMaxCount(cudnnHandle_t handle, int *count);
    "cudnnGetConvolutionForwardAlgorithmMaxCount": [_p, _int_p],
    # cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithmMaxCount(cudnnHandle_t handle,
    #     int *count);
    "cudnnGetConvolutionBackwardDataAlgorithmMaxCount": [_p, _int_p],
    # cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(cudnnHandle_t handle,
    #     int *count);
    "cudnnGetConvolutionBackwardFilterAlgorithmMaxCount": [_p, _int_p],
    # cudnnStatus_t cudnnGetConvolutionForwardAlgorithm_v7(cudnnHandle_t handle,
    #     const cudnnTensorDescriptor_t srcDesc, const cudnnFilterDescriptor_t filterDesc,
    #     const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t destDesc,
    #     const int requestedAlgoCount, int *returnedAlgoCount,
    #     cudnnConvolutionFwdAlgoPerf_t *perfResults);
    "cudnnGetConvolutionForwardAlgorithm_v7": [_p, _p, _p, _p, _p, c_int, _int_p, _p],
    # cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithm_v7(cudnnHandle_t handle,
    #     const cudnnFilterDescriptor_t filterDesc, const cudnnTensorDescriptor_t diffDesc,
    #     const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t gradDesc,
    #     const int requestedAlgoCount, int *returnedAlgoCount,
    #     cudnnConvolutionBwdDataAlgoPerf_t *perfResults);
    "cudnnGetConvolutionBackwardDataAlgorithm_v7": [_p, _p, _p, _p, _p, c_int, _int_p, _p],
    # cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithm_v7(cudnnHandle_t handle,
    #     const cudnnTensorDescriptor_t srcDesc, const cudnnTensorDescriptor_t diffDesc,
    #     const cudnnConvolutionDescriptor_t convDesc, const cudnnFilterDescriptor_t gradDesc,
    #     const int requestedAlgoCount, int *returnedAlgoCount,
    #     cudnnConvolutionBwdFilterAlgoPerf_t *perfResults);
    "cudnnGetConvolutionBackwardFilterAlgorithm_v7": [_p, _p, _p, _p, _p, c_int, _int_p, _p],
    # cudnnStatus_t cudnnFindConvolutionForwardAlgorithmEx(cudnnHandle_t handle,
    #     const cudnnTensorDescriptor_t xDesc, const void *x,
    #     const cudnnFilterDescriptor_t wDesc, const void *w,
    #     const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t yDesc,
    #     void *y, const int requestedAlgoCount, int *returnedAlgoCount,
    #     cudnnConvolutionFwdAlgoPerf_t *perfResults, void *workSpace,
    #     size_t workSpaceSizeInBytes);
    "cudnnFindConvolutionForwardAlgorithmEx": [_p, _p, _p, _p, _p, _p, _p, _p, c_int, _int_p,
                                               _p, _p, c_size_t],
    # cudnnStatus_t cudnnFindConvolutionBackwardDataAlgorithmEx(cudnnHandle_t handle,
    #     const cudnnFilterDescriptor_t wDesc, const void *w,
    #     const cudnnTensorDescriptor_t dyDesc, const void *dy,
    #     const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t dxDesc,
    #     void *dx, const int requestedAlgoCount, int *returnedAlgoCount,
    #     cudnnConvolutionBwdDataAlgoPerf_t *perfResults, void *workSpace,
    #     size_t workSpaceSizeInBytes);
    "cudnnFindConvolutionBackwardDataAlgorithmEx": [_p, _p, _p, _p, _p, _p, _p, _p, c_int,
                                                    _int_p, _p, _p, c_size_t],
    # cudnnStatus_t cudnnFindConvolutionBackwardFilterAlgorithmEx(cudnnHandle_t handle,
    #     const cudnnTensorDescriptor_t xDesc, const void *x,
    #     const cudnnTensorDescriptor_t dyDesc, const void *y,
    #     const cudnnConvolutionDescriptor_t convDesc, const cudnnFilterDescriptor_t dwDesc,
    #     void *dw, const int requestedAlgoCount, int *returnedAlgoCount,
    #     cudnnConvolutionBwdFilterAlgoPerf_t *perfResults, void *workSpace,
    #     size_t workSpaceSizeInBytes);
    "cudnnFindConvolutionBackwardFilterAlgorithmEx": [_p, _p, _p, _p, _p, _p, _p, _p, c_int,
                                                      _int_p, _p, _p, c_size_t],
    # cudnnStatus_t cudnnGetConvolutionForwardWorkspaceSize(cudnnHandle_t handle,
    #     const cudnnTensorDescriptor_t xDesc, const cudnnFilterDescriptor_t wDesc,
    #     const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t yDesc,
    #     cudnnConvolutionFwdAlgo_t algo, size_t *sizeInBytes);
    "cudnnGetConvolutionForwardWorkspaceSize": [_p, _p, _p, _p, _p, c_int, POINTER(c_size_t)],
    # cudnnStatus_t cudnnGetConvolutionBackwardDataWorkspaceSize(cudnnHandle_t handle,
    #     const cudnnFilterDescriptor_t wDesc, const cudnnTensorDescriptor_t dyDesc,
    #     const cudnnConvolutionDescriptor_t convDesc, const cudnnTensorDescriptor_t dxDesc,
    #     cudnnConvolutionBwdDataAlgo_t algo, size_t *sizeInBytes);
    "cudnnGetConvolutionBackwardDataWorkspaceSize": [_p, _p, _p, _p, _p, c_int,
                                                     POINTER(c_size_t)],
    # cudnnStatus_t cudnnGetConvolutionBackwardFilterWorkspaceSize(cudnnHandle_t handle,
    #     const cudnnTensorDescriptor_t xDesc, const cudnnTensorDescriptor_t dyDesc,
    #     const cudnnConvolutionDescriptor_t convDesc, const cudnnFilterDescriptor_t gradDesc,
    #     cudnnConvolutionBwdFilterAlgo_t algo, size_t *sizeInBytes);
    "cudnnGetConvolutionBackwardFilterWorkspaceSize": [_p, _p, _p, _p, _p, c_int,
                                                       POINTER(c_size_t)],
}
api.register_prototypes(PROTOTYPES)

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


class AlgoPerf(ctypes.Structure):
    """cudnnConvolution{Fwd,BwdData,BwdFilter}AlgoPerf_t (the three share this layout)."""
    _fields_ = [("algo", ctypes.c_int), ("status", ctypes.c_int), ("time", ctypes.c_float),
                ("memory", ctypes.c_size_t), ("determinism", ctypes.c_int),
                ("mathType", ctypes.c_int), ("reserved", ctypes.c_int * 3)]


@dataclasses.dataclass(frozen=True)
class Direction:
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


FWD = Direction("fwd", "Forward", _F, FWD_ALGOS, (), 1)
BWD_DATA = Direction("bwd_data", "BackwardData", _D, BWD_DATA_ALGOS, (_D["algo_0"],), 0)
BWD_FILTER = Direction("bwd_filter", "BackwardFilter", _W, BWD_FILTER_ALGOS,
                       (_W["algo_0"], _W["algo_3"]), 2)


# --- workspace ---------------------------------------------------------------------------


def workspace_size(c, algo):
    """The workspace bytes of ``algo`` for call ``c`` (asked once per plan and algorithm)."""
    size = c.plan.ws.get(algo)
    if size is None:
        out = ctypes.c_size_t()
        api.call(c.fn("cudnnGetConvolution{}WorkspaceSize"), c.h, *c.descs[:2], c.conv,
                 c.descs[2], algo, ctypes.byref(out),
                 context=f"{c.ctx}, algo {c.d.algo_name(algo)}")
        size = c.plan.ws[algo] = out.value
    return size


def workspace_for(c, algo, deterministic, limit):
    """(algo, buffer, nbytes): ``algo`` with its workspace, or the default with its own."""
    size = workspace_size(c, algo)
    if limit is None or size <= limit:
        ws = alloc(size, c.stream)
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
    return workspace_for(c, default, deterministic, limit)


# --- choosing ----------------------------------------------------------------------------


def _perf_array(c):
    n = ctypes.c_int()
    api.call(c.fn("cudnnGetConvolution{}AlgorithmMaxCount"), c.h, ctypes.byref(n),
             context=c.ctx)
    return (AlgoPerf * max(n.value, 1))(), ctypes.c_int()


def heuristics(c):
    """cudnnGet...Algorithm_v7's list (AlgoPerf entries, best first)."""
    perfs, got = _perf_array(c)
    api.call(c.fn("cudnnGetConvolution{}Algorithm_v7"), c.h, *c.descs[:2], c.conv, c.descs[2],
             len(perfs), ctypes.byref(got), perfs, context=c.ctx)
    return list(perfs[:got.value])


def _timing_bytes(c, limit):
    """No algorithm uses more than the largest workspace any of them asks for."""
    most = 0
    for algo in c.d.algos.values():
        try:
            most = max(most, workspace_size(c, algo))
        except CudnnError as e:  # NOT_SUPPORTED and the like: cuDNN won't time it either
            log.debug("cuDNN %s %s workspace query: %s", c.d.name, c.d.algo_name(algo), e)
    return most if limit is None else min(most, limit)


def timings(c, limit):
    """cudnnFind...AlgorithmEx's list, or None when its workspace cannot be allocated.

    It writes the timing runs' results into the output array o, which is safe: the chosen
    algorithm then overwrites all of o (beta = 0), and a, b (inputs) are only read.
    """
    device.refuse_in_capture(f"cuDNN algorithm timing ({c.ctx})",
                             "it runs every candidate and waits for the timings; the warm-up "
                             "calls time the shapes they see", c.stream)
    nbytes = _timing_bytes(c, limit)
    perfs, got = _perf_array(c)        # (before the workspace: a kept one is entered at once)
    ws = alloc(nbytes, c.stream)
    if nbytes and ws is None:
        log.debug("cuDNN %s: no memory for a %d-byte timing workspace; guessing instead (%s)",
                  c.d.name, nbytes, c.ctx)
        return None
    a, b, o = c.ptrs
    with held(ws) as wp:
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


key_memo = {}  # the raw inputs -> make_key's JSON, which costs ~50 us to build on every call


def cache_key(c, arrays, geom, compute_dtype, math_t, deterministic, limit, choice):
    """The ``algo_cache`` key of this convolution and choice (memoised by its raw inputs)."""
    from numba import cuda
    dev = cuda.get_current_device()
    raw = (c.d.name, choice, getattr(dev, "id", 0), loader.status().version, geom,
           tuple((tuple(a.shape), tuple(a.strides)) for a in arrays), c.dtype.name,
           str(compute_dtype), math_t, bool(deterministic), limit)
    key = key_memo.get(raw)
    if key is None:
        strides = [tuple(s // a.dtype.itemsize for s in a.strides) for a in arrays]
        key = algo_cache.make_key(
            c.d.name, choice, device=algo_cache.current_device(),
            cudnn_version=raw[3], nd=geom.nd, shapes=[tuple(a.shape) for a in arrays],
            strides=strides, padding=geom.padding, stride=geom.stride,
            dilation=geom.dilation, groups=geom.groups, flip=geom.flip, dtype=c.dtype,
            compute_dtype=compute_dtype, math_type=math_t, deterministic=deterministic,
            workspace_limit=limit)
        if len(key_memo) > 4096:  # bound the memo; rebuilding a key is only slower
            key_memo.clear()
        key_memo[raw] = key
    return key


def choose(c, algo, arrays, geom, compute_dtype, math_t, deterministic, limit):
    """The algorithm enum to run: a named ``algo`` (the deterministic one in its place when
    asked and it is not), or a runtime choice's answer, remembered per ``algo_cache``."""
    if algo not in CHOICES:
        enum = c.d.named[algo]
        return c.d.default(True) if deterministic and enum in c.d.nondeterministic else enum
    key = cache_key(c, arrays, geom, compute_dtype, math_t, deterministic, limit, algo)
    name = algo_cache.lookup(algo, c.d.name, key)
    if name in c.d.algos:         # (not a graph-API engine stored under the same key)
        return c.d.algos[name]
    perfs = timings(c, limit) if algo.startswith("time") else None
    enum = pick(c.d, heuristics(c) if perfs is None else perfs, deterministic, limit)
    if perfs is not None or algo.startswith("guess"):  # don't remember an OOM stand-in
        algo_cache.store(algo, c.d.name, key, c.d.algo_name(enum))
    return enum
