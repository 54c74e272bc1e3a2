"""``SyncBatchNorm``: batch normalization whose training statistics span every rank's batch.

Forward (training, or ``track_running_stats=False``), for x of shape (N, C, *spatial) with
m local values per channel (N times the spatial size):

    s = sum x,  q = sum x^2  per channel (local);  [s, q, m] all-reduced (sum): S, Q, M
    mean = S / M,  var = Q / M - mean^2   (biased; the statistics of the whole global batch)
    y = (x - mean) / sqrt(var + eps) * gamma + beta            (batch_norm_inference)
    running_mean = (1 - momentum) running_mean + momentum mean
    running_var  = (1 - momentum) running_var  + momentum var M / (M - 1)

Backward (its own gradient rule; xhat = (x - mean) invstd, invstd = 1/sqrt(var + eps)):

    local per channel: b = sum dy, a = sum dy xhat        (batch_norm_backward's dbeta, dgamma)
    [b, a] all-reduced (sum): B, A
    dx = gamma invstd (dy - B / M - xhat A / M)
    dgamma = a, dbeta = b     (this rank's share: DataParallel averages them over the ranks)

With a loss per rank whose gradients DataParallel averages, this is the gradient of the mean
of the ranks' losses, as PyTorch's SyncBatchNorm computes it. Each step costs two all-reduces
of 2C+1 and 2C values on dnnkit's current stream, and the elementwise ops run on the
module's backend (``backend`` pin or ``dnn.enabled``), Numba or cuDNN. var = Q/M - mean^2
loses precision when |mean| is large against the spread (float32: a mean 1e3 times the
standard deviation leaves about 1e-1 relative error in var); BatchNorm's Welford statistics
do not, so keep SyncBatchNorm for the layers that need the statistics of the global batch.

In eval mode with running statistics it is BatchNorm (no communication). float16 input is
refused: its statistics are float32 and dnnkit's arithmetic does not mix dtypes.
"""

import numpy as np

from .. import arrays, ops
from ..autograd import Node, Rule, is_grad_enabled, no_grad
from ..nn.checks import as_input
from ..nn.norm import BatchNorm1d, BatchNorm2d, BatchNorm3d
from ..tensors import Tensor
from . import group as group_mod

NORMS = (BatchNorm1d, BatchNorm2d, BatchNorm3d)


def _reduced(group, parts, stream, kw):
    """The sum over every rank of the 1-D arrays ``parts`` (one packed all-reduce); views of
    the result, one per part."""
    packed = ops.concatenate(parts, stream=stream, **kw)
    group.run("SyncBatchNorm statistics", lambda c: c.all_reduce(packed, packed, "sum",
                                                                  stream), stream)
    out, at = [], 0
    for p in parts:
        out.append(packed[at:at + p.shape[0]])
        at += p.shape[0]
    return out


class SyncBatchNorm(BatchNorm2d):
    """BatchNorm over (N, C), (N, C, L), (N, C, H, W) or (N, C, D, H, W) with statistics over
    every rank's batch (module docstring). Arguments and state as BatchNorm2d's (PyTorch's
    names); ``group``: the process group (default: dnnkit.distributed.init()'s, read at each
    forward)."""

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True,
                 track_running_stats=True, *, dtype="float32", group=None):
        super().__init__(num_features, eps, momentum, affine, track_running_stats,
                         dtype=dtype)
        self.ndims = (2, 3, 4, 5)
        self.group = group

    @classmethod
    def convert(cls, module, group=None):
        """``module`` with every BatchNorm1d/2d/3d replaced by a SyncBatchNorm holding the
        same parameters and buffers (the same Tensors, not copies), mode, backend pin and
        batch count; in place where the norm is a child, and returned (a norm itself gives
        the new module)."""
        def swap(m):
            if not isinstance(m, NORMS) or isinstance(m, SyncBatchNorm):
                return m
            held = m.weight if m.affine else m.running_mean
            dtype = held.dtype if held is not None else np.dtype(np.float32)
            new = cls(m.num_features, m.eps, m.momentum, m.affine, m.track_running_stats,
                      dtype=dtype, group=group)
            if m.affine:
                new.weight, new.bias = m.weight, m.bias
            if m.track_running_stats:
                new.running_mean, new.running_var = m.running_mean, m.running_var
                new.num_batches_tracked = m.num_batches_tracked
            new.training, new.backend = m.training, m.backend
            return new

        if isinstance(module, NORMS):
            return swap(module)
        for _, parent in list(module.named_modules()):
            for name, child in list(parent.named_children()):
                new = swap(child)
                if new is not child:
                    setattr(parent, name, new)
        return module

    def forward(self, x):
        if not self.training and self.track_running_stats:
            return super().forward(x)
        cls = type(self).__name__
        x = as_input(cls, x)
        if x.ndim not in self.ndims or x.shape[1] != self.num_features:
            raise ValueError(f"{cls}: input must be (N, {self.num_features}, ...) with 2 to 5 "
                             f"dimensions; got shape {x.shape}")
        if x.dtype == np.float16:
            raise TypeError(f"{cls}: float16 input is not supported (its statistics are "
                            f"float32 and dnnkit's arithmetic does not mix dtypes); use "
                            f"float32, or BatchNorm2d")
        g = self.group if self.group is not None else group_mod.current()
        g.check()
        m_local = x.size // x.shape[1]
        if m_local < 1 or (g.world_size == 1 and m_local < 2):
            raise ValueError(f"{cls}: needs more than one value per channel over the ranks to "
                             f"estimate a variance; x {x.shape} gives {m_local}")
        return self._sync_forward(g, x, m_local)

    def _sync_forward(self, g, x, m_local):
        kw = dict(backend=self.backend)
        s = arrays.as_stream(None)
        xd, c = x.data, self.num_features
        axes = (0,) + tuple(range(2, xd.ndim))
        with no_grad():
            gamma, beta = (w.data if isinstance(w, Tensor) else w
                           for w in self._gamma_beta(xd))
            total, sq, count = _reduced(g, [ops.sum(xd, axes, **kw),
                                            ops.sum(ops.multiply(xd, xd, **kw), axes, **kw),
                                            arrays.constant([m_local], xd.dtype)], s, kw)
            mean = ops.divide(total, count, **kw)
            var = ops.subtract(ops.divide(sq, count, **kw), ops.multiply(mean, mean, **kw),
                               **kw)
            y = ops.batch_norm_inference(xd, gamma, beta, mean, var, epsilon=self.eps, **kw)
            if self.track_running_stats and self.training:
                m = self.momentum
                unbiased = ops.multiply(var, ops.divide(count, ops.subtract(count, 1.0, **kw),
                                                        **kw), **kw)
                for buf, stat in ((self.running_mean, mean), (self.running_var, unbiased)):
                    new = ops.add(ops.multiply(buf.data, 1.0 - m, **kw),
                                  ops.multiply(stat, m, **kw), **kw)
                    arrays.copy_into(buf.data, new, s)
                self.num_batches_tracked += 1
        inputs = {"x": x}
        if self.affine:
            inputs.update(weight=self.weight, bias=self.bias)
        if not is_grad_enabled() or not any(t.requires_grad for t in inputs.values()):
            return Tensor(y)
        args = {"x": xd, "weight": gamma, "mean": mean, "var": var, "count": count,
                "eps": self.eps, "pin": self.backend, "group": g,
                "bshape": (1, c) + (1,) * (xd.ndim - 2)}
        node = Node("sync_batch_norm", self.backend or "auto", SYNC_RULE, args, y, inputs, 1)
        return Tensor(y, True, grad_fn=node)


def _backward(g, dy):
    """The gradient rule (module docstring); ``g`` reads the node's saved arrays by name."""
    kw = dict(backend=g.pin)
    x, gamma, mean, var, count = g.x, g.weight, g.mean, g.var, g.count
    c = x.shape[1]
    # 1/sqrt(var + eps) for batch_norm_backward: batch_norm_inference (the forward's rsqrt)
    # of a row of ones with mean 0
    pdt = gamma.dtype
    one = arrays.constant(np.ones((1, c)), pdt)
    ones, zeros = arrays.constant(np.ones(c), pdt), arrays.constant(np.zeros(c), pdt)
    invstd = ops.reshape(ops.batch_norm_inference(one, ones, zeros, zeros, var,
                                                  epsilon=g.eps, **kw), (c,), **kw)
    _, a, b = ops.batch_norm_backward(x, dy, gamma, mean, invstd, epsilon=g.eps, **kw)
    out = {}
    if g.needs("weight"):
        out["weight"], out["bias"] = a, b
    if g.needs("x"):
        # dx = k dy - k B/M - k invstd A/M (x - mean), k = gamma invstd:
        #    = k dy + shift - coef_x x  with coef_x = k invstd A/M, shift = coef_x mean - k B/M
        big_b, big_a = _reduced(g.group, [b, a], arrays.as_stream(None), kw)
        k = ops.multiply(gamma, invstd, **kw)
        coef_x = ops.multiply(ops.multiply(k, invstd, **kw), ops.divide(big_a, count, **kw),
                              **kw)
        shift = ops.subtract(ops.multiply(coef_x, mean, **kw),
                             ops.multiply(k, ops.divide(big_b, count, **kw), **kw), **kw)
        bshape = g.bshape
        out["x"] = ops.add(ops.multiply(dy, ops.reshape(k, bshape, **kw), **kw),
                           ops.subtract(ops.reshape(shift, bshape, **kw),
                                        ops.multiply(x, ops.reshape(coef_x, bshape, **kw),
                                                     **kw), **kw), **kw)
    return out


SYNC_RULE = Rule(_backward, None, None, None)
