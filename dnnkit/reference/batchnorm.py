"""Float64 reference of batch normalization (training, inference, backward)."""

import numpy as np


def _bn_axes(ndim, mode):
    """Axes the statistics reduce over: (0, 2, 3, ...) spatial, (0,) per-activation."""
    return (0,) if mode == "per-activation" else (0,) + tuple(range(2, ndim))


def _bn_param(p, x, mode):
    """A parameter ((C,), (1, C, 1...), C*H*W... or (1, C, H, W...)) broadcast against x."""
    p = np.asarray(p, np.float64)
    if mode == "per-activation":
        return p.reshape((1,) + x.shape[1:])
    return p.reshape((1, x.shape[1]) + (1,) * (x.ndim - 2))


def _act(y, activation, residual=None):
    if residual is not None:
        y = y + np.asarray(residual, np.float64)
    return y if activation is None else np.where(y > 0, y, 0.0)    # "relu"


def batch_norm_train(x, gamma, beta, mode="spatial", epsilon=1e-5, momentum=0.1,
                     running_mean=None, running_var=None, activation=None, residual=None):
    """(y, saved_mean, saved_invstd, new_running_mean, new_running_var), statistics shaped like
    gamma. saved_invstd = 1/sqrt(biased var + eps); the running variance is updated with the
    unbiased variance var * m/(m-1) (m values per statistic), as cuDNN does. ``residual``: added
    to y; ``activation="relu"``: then y = max(y, 0)."""
    x = np.asarray(x, np.float64)
    mean = x.mean(axis=_bn_axes(x.ndim, mode), keepdims=True)
    m = x.size // mean.size
    var = ((x - mean) ** 2).mean(axis=_bn_axes(x.ndim, mode), keepdims=True)
    invstd = 1.0 / np.sqrt(var + epsilon)
    y = (x - mean) * invstd * _bn_param(gamma, x, mode) + _bn_param(beta, x, mode)
    shape = np.shape(gamma)
    new_rm = new_rv = None
    if running_mean is not None:
        new_rm = ((1 - momentum) * np.asarray(running_mean, np.float64)
                  + momentum * mean.reshape(shape))
        new_rv = ((1 - momentum) * np.asarray(running_var, np.float64)
                  + momentum * (var * m / (m - 1)).reshape(shape))
    return _act(y, activation, residual), mean.reshape(shape), invstd.reshape(shape), new_rm, new_rv


def batch_norm_inference(x, gamma, beta, mean, var, mode="spatial", epsilon=1e-5,
                         activation=None, residual=None):
    x = np.asarray(x, np.float64)
    p = [_bn_param(a, x, mode) for a in (gamma, beta, mean, var)]
    return _act((x - p[2]) / np.sqrt(p[3] + epsilon) * p[0] + p[1], activation, residual)


def batch_norm_backward(x, dy, gamma, saved_mean, saved_invstd, mode="spatial",
                        activation=None, y=None, residual=False):
    """(dx, dgamma, dbeta) of y = (x - mean) * invstd * gamma + beta with the batch statistics
    as functions of x (training mode), given the forward's saved mean and invstd; with
    ``activation="relu"``, of max(that, 0), whose output y (the forward's) gives the slope;
    ``residual``: also the gradient of the residual added before it (dy through the slope)."""
    x, dy = np.asarray(x, np.float64), np.asarray(dy, np.float64)
    if activation is not None:
        dy = np.where(np.asarray(y, np.float64) > 0, dy, 0.0)
    axes = _bn_axes(x.ndim, mode)
    mean, invstd = _bn_param(saved_mean, x, mode), _bn_param(saved_invstd, x, mode)
    m = x.size // mean.size
    xhat = (x - mean) * invstd
    dbeta = dy.sum(axis=axes, keepdims=True)
    dgamma = (dy * xhat).sum(axis=axes, keepdims=True)
    dx = _bn_param(gamma, x, mode) * invstd * (dy - dbeta / m - xhat * dgamma / m)
    shape = np.shape(gamma)
    out = dx, dgamma.reshape(shape), dbeta.reshape(shape)
    return out + (dy,) if residual else out
