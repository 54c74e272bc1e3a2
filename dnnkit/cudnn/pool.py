"""cuDNN pooling, 2-D (4-D tensors) and 3-D (5-D tensors): cudnnPoolingForward/Backward with an
Nd pooling descriptor, NaN propagated (CUDNN_PROPAGATE_NAN).

Modes (cudnnPoolingMode_t): max -> CUDNN_POOLING_MAX, max_deterministic ->
CUDNN_POOLING_MAX_DETERMINISTIC, average_inc_pad -> ..._AVERAGE_COUNT_INCLUDE_PADDING,
average_exc_pad -> ..._AVERAGE_COUNT_EXCLUDE_PADDING. cuDNN has no sum pooling: ``sum`` runs
AVERAGE_COUNT_INCLUDE_PADDING with alpha = the window size K in both directions
(y = K * (sum / K), dx = K * sum(dy / K)); K is an integer, exact in the float alpha, so the
only departure from a plain sum is cuDNN's own rounding of the division (a few ulps).

cuDNN has no ceil mode and pads both sides alike; ops/pool.py runs ceil mode as a floor-mode
pooling of x extended at its far edges, with three helpers built on cudnn/optensor.py:
``extend`` (cudnnSetTensor of the extended buffer to a fill value, then cudnnTransformTensor of
x into its leading corner), ``crop`` (cudnnTransformTensor of that corner back out) and
``rescale`` (cudnnOpTensor MUL by a per-position factor broadcast over N and C).
"""

import math
from ctypes import POINTER, c_int, c_void_p

from . import api, handle, optensor
from .api import ptr
from .descriptors import Descriptor, DescriptorCache, int_array, scalar_refs, tensor
from .enums import PROPAGATE_NAN

_p = c_void_p
_int_p = POINTER(c_int)

PROTOTYPES = {
    # cudnnStatus_t cudnnCreatePoolingDescriptor(cudnnPoolingDescriptor_t *poolingDesc);
    "cudnnCreatePoolingDescriptor": [POINTER(_p)],
    # cudnnStatus_t cudnnDestroyPoolingDescriptor(cudnnPoolingDescriptor_t poolingDesc);
    "cudnnDestroyPoolingDescriptor": [_p],
    # cudnnStatus_t cudnnSetPoolingNdDescriptor(cudnnPoolingDescriptor_t poolingDesc,
    #     const cudnnPoolingMode_t mode, const cudnnNanPropagation_t maxpoolingNanOpt,
    #     int nbDims, const int windowDimA[], const int paddingA[], const int strideA[]);
    "cudnnSetPoolingNdDescriptor": [_p, c_int, c_int, c_int, _int_p, _int_p, _int_p],
    # cudnnStatus_t cudnnPoolingForward(cudnnHandle_t handle,
    #     const cudnnPoolingDescriptor_t poolingDesc, const void *alpha,
    #     const cudnnTensorDescriptor_t xDesc, const void *x, const void *beta,
    #     const cudnnTensorDescriptor_t yDesc, void *y);
    "cudnnPoolingForward": [_p] * 8,
    # cudnnStatus_t cudnnPoolingBackward(cudnnHandle_t handle,
    #     const cudnnPoolingDescriptor_t poolingDesc, const void *alpha,
    #     const cudnnTensorDescriptor_t yDesc, const void *y,
    #     const cudnnTensorDescriptor_t dyDesc, const void *dy,
    #     const cudnnTensorDescriptor_t xDesc, const void *x, const void *beta,
    #     const cudnnTensorDescriptor_t dxDesc, void *dx);
    "cudnnPoolingBackward": [_p] * 12,
}
api.register_prototypes(PROTOTYPES)

# cudnnPoolingMode_t (cudnn_ops.h)
POOLING_MAX = 0
POOLING_AVERAGE_COUNT_INCLUDE_PADDING = 1
POOLING_AVERAGE_COUNT_EXCLUDE_PADDING = 2
POOLING_MAX_DETERMINISTIC = 3
MODES = {"max": POOLING_MAX, "max_deterministic": POOLING_MAX_DETERMINISTIC,
         "average_inc_pad": POOLING_AVERAGE_COUNT_INCLUDE_PADDING,
         "average_exc_pad": POOLING_AVERAGE_COUNT_EXCLUDE_PADDING,
         "sum": POOLING_AVERAGE_COUNT_INCLUDE_PADDING}


class PoolingDescriptor(Descriptor):
    """Mode, window, padding and stride per spatial dim (2 or 3 of each), NaN propagated
    (cudnnSetPoolingNdDescriptor)."""
    create_fn, destroy_fn = "cudnnCreatePoolingDescriptor", "cudnnDestroyPoolingDescriptor"

    def __init__(self, mode_id, window, padding, stride):
        n = len(window)
        if not len(padding) == len(stride) == n:
            raise ValueError(f"window {window}, padding {padding} and stride {stride} must have "
                             "one value per spatial dimension")
        arrays = [int_array(v, name) for v, name in
                  ((window, "window"), (padding, "padding"), (stride, "stride"))]
        super().__init__()   # after the checks, so a bad argument leaks nothing
        self.mode_id, self.window = mode_id, tuple(window)
        try:
            api.call("cudnnSetPoolingNdDescriptor", self.ptr, int(mode_id), PROPAGATE_NAN, n,
                     *arrays, context=f"mode {mode_id}, window {tuple(window)}, padding "
                                      f"{tuple(padding)}, stride {tuple(stride)}")
        except Exception:
            self.close()
            raise


_descs = DescriptorCache(PoolingDescriptor)


def _setup(x, y, window, padding, stride, mode):
    """(pooling descriptor, alpha, beta, context) from the caches: host scalars are double for
    double data and float otherwise (cuDNN's rule); alpha is 1, or the window size for
    ``sum``. The context is a function, formatted only when cuDNN reports an error."""
    pd = _descs.get(MODES[mode], tuple(window), tuple(padding), tuple(stride))
    alpha, beta = scalar_refs(x.dtype, float(math.prod(window)) if mode == "sum" else 1.0)
    ctx = lambda: (f"x {tuple(x.shape)} {x.dtype}, y {tuple(y.shape)}, mode {mode}, "  # noqa: E731
                   f"window {tuple(window)}, padding {tuple(padding)}, stride {tuple(stride)}")
    return pd, alpha, beta, ctx


def forward(x, y, window, padding, stride, mode, stream):
    """y = pool(x); x (N, C, [D,] H, W) and y C-contiguous device arrays; ``stream`` the raw
    cudaStream_t."""
    pd, alpha, beta, ctx = _setup(x, y, window, padding, stride, mode)
    api.call("cudnnPoolingForward", handle.get(stream), pd, alpha, tensor(x.shape, x.dtype),
             ptr(x), beta, tensor(y.shape, y.dtype), ptr(y),
             context=lambda: "pool forward: " + ctx())


def backward(x, y, dy, dx, window, padding, stride, mode, stream):
    """dx from x, y = pool(x) and dy (cuDNN's argument order: y, dy, x, then dx)."""
    pd, alpha, beta, ctx = _setup(x, y, window, padding, stride, mode)
    xd, yd = tensor(x.shape, x.dtype), tensor(y.shape, y.dtype)
    api.call("cudnnPoolingBackward", handle.get(stream), pd, alpha, yd, ptr(y), yd, ptr(dy),
             xd, ptr(x), beta, xd, ptr(dx), context=lambda: "pool backward: " + ctx())


def _packed(shape):
    """C-contiguous element strides of ``shape``."""
    strides, step = [], 1
    for d in reversed(shape):
        strides.append(step)
        step *= int(d)
    return tuple(reversed(strides))


def extend(x, xe, fill, stream):
    """xe = x in its leading corner (xe is x's shape with longer spatial dims) and ``fill``
    everywhere else."""
    optensor.set_tensor(xe, tuple(xe.shape), fill, stream)
    optensor.transform(x, tuple(x.shape), _packed(x.shape), 0, xe, tuple(x.shape),
                       _packed(xe.shape), 0, stream)


def crop(xe, x, stream):
    """x = the leading corner of xe, x's shape (``extend``'s inverse)."""
    optensor.transform(xe, tuple(x.shape), _packed(xe.shape), 0, x, tuple(x.shape),
                       _packed(x.shape), 0, stream)


def rescale(a, scale, c, stream):
    """c = a * scale, scale (1, 1, *spatial) broadcast over N and C (c is not a)."""
    optensor.op_tensor("mul", 1.0, a, tuple(a.shape), 1.0, scale, tuple(scale.shape), c,
                       tuple(c.shape), stream)
