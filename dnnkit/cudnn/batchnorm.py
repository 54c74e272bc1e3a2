"""cuDNN batch normalization: cudnnBatchNormalizationForwardTraining / ForwardInference /
Backward (the cuDNN 9 legacy API, cudnn_ops), modes CUDNN_BATCHNORM_SPATIAL and
CUDNN_BATCHNORM_PER_ACTIVATION.

x is described as packed NCHW (2-D and 3-D inputs padded to 4-D with trailing 1s) or NCDHW.
The descriptor of gamma/beta/means/variances comes from cudnnDeriveBNTensorDescriptor: 1xCx1x1
(spatial) or 1xCxHxW (per-activation), of type float for half data and the data's own type
otherwise (float, double); the op enforces the same rule on its arguments.

SPATIAL_PERSISTENT is not used: it may be faster but cuDNN documents that it can overflow for
some inputs ("imposes some limits on the range of values"), which cannot be detected from the
arguments; its speed would have to be measured per GPU before it is worth that risk.

alpha/beta (blend factors for y and dx) and alphaParamDiff/betaParamDiff (for dgamma, dbeta)
are host scalars, double for double data and float otherwise. exponentialAverageFactor and
epsilon are always double. Running statistics are updated by cuDNN in place as
    running = (1 - factor) * running + factor * batch value
with the unbiased variance for the running variance; dnnkit's momentum is this factor (the
same convention as PyTorch's momentum): the caller's running arrays are updated in place.

``activation="relu"`` (the ops' fused relu): the training forward's runner also calls
cudnnActivationForward on y in place (the API reference allows x == y); the backward's first
takes dy through relu's slope from y with cudnnActivationBackward into a scratch array, then
differentiates batch normalization with it. A residual z (y = relu(bn(x) + z)) is added to y
by cudnnAddTensor before the activation; its gradient is that scratch array (a copy of dy
without an activation). cuDNN's own fused form
(cudnnBatchNormalizationForwardTrainingEx with CUDNN_BATCHNORM_OPS_BN_ACTIVATION) takes only
NHWC half-precision data in SPATIAL_PERSISTENT mode, which dnnkit's NCHW layout never is.

``bind_training`` and ``bind_backward`` give a runner for repeated calls of one shape (dispatch's
memo): descriptors, scalars, handle and function looked up once; a call reads its arrays'
addresses and makes the one cuDNN call.
"""

import math
from ctypes import c_double, c_int, c_void_p

from . import activation as cudnn_act, api, handle
from . import conv  # noqa: F401  (declares cudnnAddTensor's prototype)
from .api import ptr
from .descriptors import Descriptor, DescriptorCache, scalar_refs, tensor

_p = c_void_p

# cudnnBatchNormMode_t
BN_MODE = {"per-activation": 0, "spatial": 1}   # 2 = SPATIAL_PERSISTENT, unused (see above)
# cuDNN 7 and older required epsilon >= CUDNN_BN_MIN_EPSILON = 1e-5; cuDNN 9's headers define
# it as 0.0. dnnkit keeps 1e-5 as the bound for the cuDNN path: smaller epsilons run on Numba
# under auto and raise under forced.
MIN_EPSILON = 1e-5

PROTOTYPES = {
    # cudnnStatus_t cudnnDeriveBNTensorDescriptor(cudnnTensorDescriptor_t derivedBnDesc,
    #     const cudnnTensorDescriptor_t xDesc, cudnnBatchNormMode_t mode);
    "cudnnDeriveBNTensorDescriptor": [_p, _p, c_int],
    # cudnnStatus_t cudnnBatchNormalizationForwardTraining(cudnnHandle_t handle,
    #     cudnnBatchNormMode_t mode, const void *alpha, const void *beta,
    #     const cudnnTensorDescriptor_t xDesc, const void *x,
    #     const cudnnTensorDescriptor_t yDesc, void *y,
    #     const cudnnTensorDescriptor_t bnScaleBiasMeanVarDesc, const void *bnScale,
    #     const void *bnBias, double exponentialAverageFactor, void *resultRunningMean,
    #     void *resultRunningVariance, double epsilon, void *resultSaveMean,
    #     void *resultSaveInvVariance);
    "cudnnBatchNormalizationForwardTraining": [_p, c_int, _p, _p, _p, _p, _p, _p, _p, _p, _p,
                                               c_double, _p, _p, c_double, _p, _p],
    # cudnnStatus_t cudnnBatchNormalizationForwardInference(cudnnHandle_t handle,
    #     cudnnBatchNormMode_t mode, const void *alpha, const void *beta,
    #     const cudnnTensorDescriptor_t xDesc, const void *x,
    #     const cudnnTensorDescriptor_t yDesc, void *y,
    #     const cudnnTensorDescriptor_t bnScaleBiasMeanVarDesc, const void *bnScale,
    #     const void *bnBias, const void *estimatedMean, const void *estimatedVariance,
    #     double epsilon);
    "cudnnBatchNormalizationForwardInference": [_p, c_int, _p, _p, _p, _p, _p, _p, _p, _p, _p,
                                                _p, _p, c_double],
    # cudnnStatus_t cudnnBatchNormalizationBackward(cudnnHandle_t handle,
    #     cudnnBatchNormMode_t mode, const void *alphaDataDiff, const void *betaDataDiff,
    #     const void *alphaParamDiff, const void *betaParamDiff,
    #     const cudnnTensorDescriptor_t xDesc, const void *x,
    #     const cudnnTensorDescriptor_t dyDesc, const void *dy,
    #     const cudnnTensorDescriptor_t dxDesc, void *dx,
    #     const cudnnTensorDescriptor_t dBnScaleBiasDesc, const void *bnScale,
    #     void *dBnScaleResult, void *dBnBiasResult, double epsilon, const void *savedMean,
    #     const void *savedInvVariance);
    "cudnnBatchNormalizationBackward": [_p, c_int, _p, _p, _p, _p, _p, _p, _p, _p, _p, _p, _p,
                                        _p, _p, _p, c_double, _p, _p],
}
api.register_prototypes(PROTOTYPES)


class BNParamDescriptor(Descriptor):
    """The scale/bias/mean/variance descriptor cuDNN derives from x's (type and shape)."""
    create_fn, destroy_fn = "cudnnCreateTensorDescriptor", "cudnnDestroyTensorDescriptor"

    def __init__(self, x_desc, mode):
        super().__init__()
        try:
            api.call("cudnnDeriveBNTensorDescriptor", self.ptr, x_desc, BN_MODE[mode],
                     context=f"x {x_desc.shape}, mode {mode}")
        except Exception:
            self.close()
            raise


def _ctx(op, x, mode, eps, more=""):
    return lambda: f"{op}: x {tuple(x.shape)} {x.dtype}, mode {mode}, epsilon {eps}{more}"


def _null(a):
    return None if a is None else ptr(a)


_params = DescriptorCache(lambda dims, dtype, mode: BNParamDescriptor(tensor(dims, dtype), mode))


def _descs(x, mode):
    """(x's descriptor, the derived parameter descriptor), both shared from the caches."""
    return _descs_of(tuple(x.shape), x.dtype, mode)


def _descs_of(shape, dtype, mode):
    dims = tuple(shape) + (1,) * (4 - len(shape))
    return tensor(dims, dtype), _params.get(dims, dtype, mode)


def bind_training(shape, dtype, mode, eps, momentum, stream, activation=None, residual=False):
    """``run(x, y, gamma, beta, mean, invstd, run_mean, run_var, z=None)`` for x of ``shape``
    and ``dtype``: y (+ z with ``residual``, then relu(y) with ``activation="relu"``), the saved
    mean and 1/sqrt(var + eps); run_mean/run_var (both or neither: None) updated in place."""
    name = "cudnnBatchNormalizationForwardTraining"
    alpha, beta_ = scalar_refs(dtype)
    xdesc, pdesc = _descs_of(shape, dtype, mode)
    xd, pd, md = xdesc.ptr.value, pdesc.ptr.value, BN_MODE[mode]
    mom, e = c_double(momentum), c_double(eps)
    fn, check, get = api.function(name), api.check, handle.getter(stream)

    def context():
        return (f"batch_norm_train: x {tuple(shape)} {dtype}, mode {mode}, epsilon {eps}, "
                f"momentum {momentum}")

    act = None if activation is None else \
        cudnn_act.bind(False, math.prod(shape), dtype, activation, 0.0, stream)
    add = api.function("cudnnAddTensor") if residual else None

    def run(x, y, gamma, beta, mean, invstd, run_mean, run_var, z=None):
        st = fn(get(), md, alpha, beta_, xd, ptr(x), xd, ptr(y), pd, ptr(gamma), ptr(beta), mom,
                _null(run_mean), _null(run_var), e, ptr(mean), ptr(invstd))
        if st:
            check(name, st, context)
        if add is not None:            # y = 1 * z + 1 * y
            st = add(get(), alpha, xd, ptr(z), alpha, xd, ptr(y))
            if st:
                check("cudnnAddTensor", st, context)
        if act is not None:
            act(y, y)
    run.keep = (xdesc, pdesc, act)   # the descriptors live as long as the runner
    return run


def forward_training(x, y, gamma, beta, mean, invstd, run_mean, run_var, mode, eps, momentum,
                     stream, activation=None, z=None):
    """y, saved mean and saved 1/sqrt(var + eps); run_mean/run_var (both or neither) updated in
    place."""
    bind_training(x.shape, x.dtype, mode, eps, momentum, stream, activation, z is not None)(
        x, y, gamma, beta, mean, invstd, run_mean, run_var, z)


def forward_inference(x, y, gamma, beta, mean, var, mode, eps, stream, activation=None,
                      z=None):
    alpha, beta_ = scalar_refs(x.dtype)
    xd, pd = _descs(x, mode)
    ctx = _ctx("batch_norm_inference", x, mode, eps)
    api.call("cudnnBatchNormalizationForwardInference", handle.get(stream), BN_MODE[mode],
             alpha, beta_, xd, ptr(x), xd, ptr(y), pd,
             ptr(gamma), ptr(beta), ptr(mean), ptr(var), c_double(eps), context=ctx)
    if z is not None:
        api.call("cudnnAddTensor", handle.get(stream), alpha, xd, ptr(z), alpha, xd, ptr(y),
                 context=ctx)
    if activation is not None:
        cudnn_act.forward(y, y, activation, 0.0, stream)


def bind_backward(shape, dtype, mode, eps, stream, activation=None):
    """``run(x, dy, dx, gamma, dgamma, dbeta, mean, invstd, y=None, scratch=None)`` for x of
    ``shape`` and ``dtype``: dx, dgamma, dbeta (all overwritten: beta factors 0) from the saved
    statistics; with ``activation="relu"``, of relu(batch norm): dy first goes through relu's
    slope from the forward's output y into ``scratch`` (an array of x's shape). Without an
    activation a given ``scratch`` gets a copy of dy (a residual's gradient)."""
    name = "cudnnBatchNormalizationBackward"
    alpha, beta_ = scalar_refs(dtype)
    xdesc, pdesc = _descs_of(shape, dtype, mode)
    xd, pd, md, e = xdesc.ptr.value, pdesc.ptr.value, BN_MODE[mode], c_double(eps)
    fn, check, get = api.function(name), api.check, handle.getter(stream)

    def context():
        return f"batch_norm_backward: x {tuple(shape)} {dtype}, mode {mode}, epsilon {eps}"

    act = None if activation is None else \
        cudnn_act.bind(True, math.prod(shape), dtype, activation, 0.0, stream)

    add = api.function("cudnnAddTensor")

    def run(x, dy, dx, gamma, dgamma, dbeta, mean, invstd, y=None, scratch=None):
        if act is not None:
            act(y, y, dy, scratch)       # (relu's slope from y: y > 0 exactly where x > 0)
            dy = scratch
        elif scratch is not None:        # scratch = 1 * dy + 0 * scratch (beta 0: not read)
            st = add(get(), alpha, xd, ptr(dy), beta_, xd, ptr(scratch))
            if st:
                check("cudnnAddTensor", st, context)
        st = fn(get(), md, alpha, beta_, alpha, beta_, xd, ptr(x), xd, ptr(dy), xd, ptr(dx), pd,
                ptr(gamma), ptr(dgamma), ptr(dbeta), e, ptr(mean), ptr(invstd))
        if st:
            check(name, st, context)
    run.keep = (xdesc, pdesc, act)
    return run


def backward(x, dy, dx, gamma, dgamma, dbeta, mean, invstd, mode, eps, stream,
             activation=None, y=None, scratch=None):
    """dx, dgamma, dbeta (all overwritten: beta factors 0) from the saved statistics (of
    relu(batch norm) with ``activation``: see bind_backward)."""
    bind_backward(x.shape, x.dtype, mode, eps, stream, activation)(
        x, dy, dx, gamma, dgamma, dbeta, mean, invstd, y, scratch)
