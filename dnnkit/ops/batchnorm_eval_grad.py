"""The gradient rule of batch_norm_inference (ops/batchnorm.py): the affine map with fixed
statistics, composed of glue ops (arith, reduce, shape) on the forward's backend, after the
fused relu's slope and with the residual's gradient where the forward had them. Its own file:
it imports those families, which ops/batchnorm.py does not need."""

import numpy as np

from .. import arrays
from ..autograd import gradient
from .batchnorm import batch_norm_inference


@gradient("batch_norm_inference", inputs=("x", "gamma", "beta", "residual"))
def _batch_norm_inference_grad(g, dy):
    """y = (x - mean) r gamma + beta with r = 1/sqrt(var + epsilon) fixed (the statistics get
    no gradient): dx = dy r gamma, dgamma = sum(dy (x - mean) r), dbeta = sum(dy), the sums
    over the batch (and the spatial positions in spatial mode). Composed of glue ops on the
    call's backend; the statistics' dtype must be x's (float32 statistics of float16 data
    would need mixed-dtype arithmetic)."""
    from . import arith, reduce, shape as shape_ops
    from .activation import activation_backward
    if g.activation:      # the fused relu first: dy through its slope, from y
        y = g.out
        dy = activation_backward(y, y, dy, g.activation, backend=g.backend, stream=g.stream)
    x = g.out if g.wrote_into("x") else g.x     # (out=x: x's value only for dgamma, below)
    if np.dtype(x.dtype) != np.dtype(g.gamma.dtype):
        raise RuntimeError(
            f"batch_norm_inference: the gradient of {x.dtype} data with {g.gamma.dtype} "
            f"statistics is not supported; run it under dnnkit.no_grad() or use "
            f"batch_norm_train")
    kw = dict(backend=g.backend, stream=g.stream)
    if g.mode == "spatial":
        bshape = (1, x.shape[1]) + (1,) * (x.ndim - 2)
        axes = (0,) + tuple(range(2, x.ndim))
    else:
        bshape, axes = (1,) + tuple(x.shape[1:]), (0,)
    c = int(np.prod(bshape))
    flat = (c,)
    pdt = g.gamma.dtype
    one = arrays.constant(np.ones((1, c)), pdt)
    ones, zeros = arrays.constant(np.ones(c), pdt), arrays.constant(np.zeros(c), pdt)
    var = shape_ops.reshape(g.var, flat, **kw)
    r = shape_ops.reshape(batch_norm_inference(one, ones, zeros, zeros, var,
                                               epsilon=g.epsilon, **kw), bshape, **kw)
    out = {"residual": dy} if g.needs("residual") else {}
    if g.needs("x"):
        out["x"] = arith.multiply(dy, arith.multiply(
            r, shape_ops.reshape(g.gamma, bshape, **kw), **kw), **kw)
    if g.needs("gamma"):
        xhat = arith.multiply(arith.subtract(g.x, shape_ops.reshape(g.mean, bshape, **kw),
                                             **kw), r, **kw)
        out["gamma"] = shape_ops.reshape(reduce.sum(arith.multiply(dy, xhat, **kw), axes,
                                                    **kw), g.gamma.shape, **kw)
    if g.needs("beta"):
        out["beta"] = shape_ops.reshape(reduce.sum(dy, axes, **kw), g.beta.shape, **kw)
    return out

