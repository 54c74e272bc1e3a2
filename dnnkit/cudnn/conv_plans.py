"""What cuDNN is told about one convolution (the legacy API), kept open for reuse.

``descriptor_dims`` gives the dimensions cuDNN sees (4-D tensors for a 2-D convolution, 5-D
for a 3-D one); ``FilterDescriptor`` and ``ConvolutionDescriptor`` describe the filter and the
convolution. A ``Plan`` holds one convolution's descriptors and its workspace sizes by
algorithm, cached per (direction, device, geometry, dtypes, math type) (``plan_for``,
``clear_plans``); a ``Call`` binds a plan to a handle, device pointers and a stream.
"""

import collections
import contextlib
import dataclasses
import threading
from ctypes import POINTER, c_int, c_void_p

import numpy as np

from ..arrays import float_name
from ..device import device_id
from . import api, handle
from .api import ptr
from .conv_algos import BWD_DATA, BWD_FILTER, FWD, Direction
from .descriptors import Descriptor, TensorDescriptor, int_array
from .enums import CONVOLUTION, CROSS_CORRELATION, DATA_TYPES, MATH_NAMES, TENSOR_NCHW

_p = c_void_p
_int_p = POINTER(c_int)

PROTOTYPES = {
    # cudnnStatus_t cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t *filterDesc);
    "cudnnCreateFilterDescriptor": [POINTER(_p)],
    # cudnnStatus_t cudnnDestroyFilterDescriptor(cudnnFilterDescriptor_t filterDesc);
    "cudnnDestroyFilterDescriptor": [_p],
    # cudnnStatus_t cudnnSetFilterNdDescriptor(cudnnFilterDescriptor_t filterDesc,
    #     cudnnDataType_t dataType, cudnnTensorFormat_t format, int nbDims,
    #     const int filterDimA[]);
    "cudnnSetFilterNdDescriptor": [_p, c_int, c_int, c_int, _int_p],
    # cudnnStatus_t cudnnCreateConvolutionDescriptor(cudnnConvolutionDescriptor_t *convDesc);
    "cudnnCreateConvolutionDescriptor": [POINTER(_p)],
    # cudnnStatus_t cudnnDestroyConvolutionDescriptor(cudnnConvolutionDescriptor_t convDesc);
    "cudnnDestroyConvolutionDescriptor": [_p],
    # cudnnStatus_t cudnnSetConvolutionNdDescriptor(cudnnConvolutionDescriptor_t convDesc,
    #     int arrayLength, const int padA[], const int filterStrideA[], const int dilationA[],
    #     cudnnConvolutionMode_t mode, cudnnDataType_t computeType);
    "cudnnSetConvolutionNdDescriptor": [_p, c_int, _int_p, _int_p, _int_p, c_int, c_int],
    # cudnnStatus_t cudnnSetConvolutionGroupCount(cudnnConvolutionDescriptor_t convDesc,
    #     int groupCount);
    "cudnnSetConvolutionGroupCount": [_p, c_int],
    # cudnnStatus_t cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t convDesc,
    #     cudnnMathType_t mathType);
    "cudnnSetConvolutionMathType": [_p, c_int],
}
api.register_prototypes(PROTOTYPES)


class FilterDescriptor(Descriptor):
    """A packed NCHW (or NCDHW) filter (K, C/groups, [T,] R, S) of 4 or 5 dims."""
    create_fn, destroy_fn = "cudnnCreateFilterDescriptor", "cudnnDestroyFilterDescriptor"

    def __init__(self, shape, dtype):
        dims = int_array(shape, "filter")  # checked first, so a bad shape leaks nothing
        super().__init__()
        self.shape = tuple(shape)
        try:
            api.call("cudnnSetFilterNdDescriptor", self.ptr, DATA_TYPES[np.dtype(dtype).name],
                     TENSOR_NCHW, len(dims), dims,
                     context=f"filter {self.shape}, dtype {np.dtype(dtype).name}")
        except Exception:
            self.close()
            raise


class ConvolutionDescriptor(Descriptor):
    """Padding, stride and dilation per spatial dim (2 or 3 of each), mode, compute type, group
    count and math type (cudnnSetConvolutionNdDescriptor, ...GroupCount, ...MathType)."""
    create_fn, destroy_fn = "cudnnCreateConvolutionDescriptor", "cudnnDestroyConvolutionDescriptor"

    def __init__(self, padding, stride, dilation, mode, compute_dtype, groups=1, math_type=0):
        n = len(padding)
        if not len(stride) == len(dilation) == n:
            raise ValueError(f"padding {padding}, stride {stride} and dilation {dilation} must "
                             "have one value per spatial dimension")
        arrays = [int_array(v, name) for v, name in
                  ((padding, "padding"), (stride, "stride"), (dilation, "dilation"))]
        super().__init__()
        ctx = (f"padding {tuple(padding)}, stride {tuple(stride)}, dilation {tuple(dilation)}, "
               f"mode {mode}, compute {compute_dtype}, groups {groups}, math type {math_type}")
        try:
            api.call("cudnnSetConvolutionNdDescriptor", self.ptr, n, *arrays, int(mode),
                     DATA_TYPES[np.dtype(compute_dtype).name], context=ctx)
            api.call("cudnnSetConvolutionGroupCount", self.ptr, int(groups), context=ctx)
            api.call("cudnnSetConvolutionMathType", self.ptr, int(math_type), context=ctx)
        except Exception:
            self.close()
            raise


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


@dataclasses.dataclass
class Plan:
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
class Call:
    """One convolution: its plan, handle and device pointers."""
    d: Direction
    h: object
    plan: Plan
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
    with contextlib.ExitStack() as st:   # closes what is open if a later step fails
        descs = tuple(st.enter_context((FilterDescriptor if i == d.filter_at else
                                        TensorDescriptor)(s, dtype))
                      for i, s in enumerate(shapes))
        cd = st.enter_context(ConvolutionDescriptor(
            dims.padding, dims.stride, dims.dilation,
            CONVOLUTION if geom.flip else CROSS_CORRELATION, compute_dtype, geom.groups, math_t))
        st.pop_all()
    return Plan(descs, cd, _ctx(d, geom, dims, dtype, compute_dtype, math_t), {})


def plan_for(d, geom, dtype, compute_dtype, math_t, device):
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


def cached_plans():
    """A copy of the plan cache: {(direction, device, geometry, dtype, compute, math): Plan}."""
    with _plans_lock:
        return dict(_plans)


def clear_plans():
    """Destroy every cached descriptor (they are recreated on demand)."""
    with _plans_lock:
        plans = list(_plans.values())
        _plans.clear()
    for p in plans:
        p.close()


def open_call(d, arrays, geom, dtype, compute_dtype, math_t, stream):
    """The Call of direction ``d`` on ``arrays`` (a, b, o): this thread's handle for
    ``stream`` and the cached plan."""
    h, device = handle.get(stream), device_id()
    plan = plan_for(d, geom, np.dtype(dtype), compute_dtype, math_t, device)
    return Call(d, h, plan, tuple(ptr(a) for a in arrays), np.dtype(dtype), stream)


def check_arrays(d, arrays, geom):
    """Arrays shaped as the user's (N, C, H, W) or as ConvGeom's 5-D form."""
    want = {FWD.name: (geom.x_shape, geom.w_shape, geom.y_shape),
            BWD_DATA.name: (geom.w_shape, geom.y_shape, geom.x_shape),
            BWD_FILTER.name: (geom.x_shape, geom.y_shape, geom.w_shape)}[d.name]
    for a, shape in zip(arrays, want):
        if (tuple(a.shape) not in (tuple(shape), geom.user_shape(shape))
                or a.dtype != arrays[0].dtype):
            raise ValueError(f"cuDNN {d.name} convolution: array {tuple(a.shape)} {a.dtype}, "
                             f"expected {tuple(shape)} {arrays[0].dtype}")
