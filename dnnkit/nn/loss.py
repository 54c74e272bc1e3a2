"""Losses with an explicit backward (PyTorch's CrossEntropyLoss and MSELoss, upstream gradient 1).

    CrossEntropyLoss:  logp = log_softmax(logits) over dim 1 (at every spatial position)
                       loss = -sum_{counted (n, s)} logp[n, target[n, s], s] / K
                       dlogits = (softmax(logits) - onehot(target)) / K, 0 at ignored positions
    MSELoss:           loss = sum (x - t)^2 / K               dx = 2 (x - t) / K

with K the number of counted positions (targets != ignore_index) or elements for
``reduction="mean"`` and K = 1 for ``"sum"``. Logits are (N, C) or (N, C, d1, d2, ...) (the
spatial form is cudnn.torch's SpatialCrossEntropyCriterion); targets are (N,) or (N, d1, ...).
With every position ignored, the mean is NaN (0/0, as PyTorch) and the gradient 0.

Both are modules: the log-softmax runs through ``dnnkit.log_softmax`` on the loss's pinned
backend (``nn.convert`` pins a loss like any layer; unpinned, the library's policy picks and
``used`` records the choice); the gather/sum and the gradient are the Numba kernels of
kernels/loss.py, with a deterministic reduction. ``forward`` returns a Python float, so it
synchronises the stream.

The kernels (dnnkit.kernels) are imported inside the functions that launch them: importing
them imports numba, which ``import dnnkit`` must not pay for.
"""

import numpy as np

from .. import arrays, device, ops
from ..launch import launch, pow2_at_most
from .module import Module

REDUCTIONS = ("mean", "sum")
_MAX_THREADS, _MAX_BLOCKS = 256, 4096


def _check_reduction(cls, reduction):
    if reduction not in REDUCTIONS:
        raise ValueError(f"{cls}: reduction must be one of {', '.join(REDUCTIONS)}; "
                         f"got {reduction!r}")
    return reduction


def _reduce(kernel, args, positions, acc, stream):
    """Run a partial-sum kernel (kernels/loss.py) over ``positions`` and then the final
    one-block sum; returns (sum as a float, count as an int), synchronising the stream."""
    from ..kernels import loss_sum_fwd_kernel
    threads = pow2_at_most(positions, _MAX_THREADS)
    blocks = min(_MAX_BLOCKS, (positions + threads - 1) // threads)
    part = arrays.cuda_empty((blocks,), acc.dtype, stream)
    cnt = arrays.cuda_empty((blocks,), np.int64, stream)
    size = acc.dtype.itemsize
    launch(kernel, blocks, threads, stream, (*args[:2], part, cnt, *args[2:], acc),
           threads * size)
    out = arrays.cuda_empty((1,), acc.dtype, stream)
    out_cnt = arrays.cuda_empty((1,), np.int64, stream)
    t2 = pow2_at_most(blocks, _MAX_THREADS)
    launch(loss_sum_fwd_kernel, 1, t2, stream, (part, cnt, out, out_cnt, acc), t2 * size)
    total, count = out.copy_to_host(stream=stream), out_cnt.copy_to_host(stream=stream)
    stream.synchronize()
    return float(total[0]), int(count[0])


def _launch_1d(kernel, n, stream, args):
    if n:
        blocks, threads = arrays.grid_1d(n)
        launch(kernel, blocks, threads, stream, args)


def _device_target(cls, target, stream):
    """(device int array, host copy or None) for integer class indices."""
    cuda = device.numba_cuda()
    if arrays.is_device_array(target) or hasattr(target, "__cuda_array_interface__"):
        d = target if arrays.is_device_array(target) else cuda.as_cuda_array(target)
        if d.dtype.kind not in "iu":
            raise TypeError(f"{cls}: target must hold integer class indices; got dtype {d.dtype}")
        if not d.is_c_contiguous():
            raise ValueError(f"{cls}: target must be C-contiguous; got strides "
                             f"{tuple(d.strides)}")
        return d, None
    try:
        h = np.asarray(target)
    except Exception as e:
        raise TypeError(f"{cls}: target must be an array; got {type(target).__name__}") from e
    if h.dtype.kind not in "iu":
        raise TypeError(f"{cls}: target must hold integer class indices; got dtype {h.dtype}")
    # host_contiguous, not np.ascontiguousarray: a reversed or empty view keeps odd strides,
    # which Numba's copy to a real GPU rejects (found by the fuzzer on an H100)
    h = arrays.host_contiguous(h.astype(np.int64, copy=False))
    return cuda.to_device(h, stream=stream), h


def _check_classes(cls, target, c, ignore):
    """ValueError naming the first target that is neither in [0, C) nor ignore_index."""
    bad = ((target < 0) | (target >= c)) & (target != ignore)
    if bad.any():
        pos = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"{cls}: target values must be in [0, {c}) or ignore_index={ignore}; "
                         f"got {int(target[pos])} at {pos} ({int(bad.sum())} invalid)")


class CrossEntropyLoss(Module):
    """log_softmax over dim 1 + negative log-likelihood; see the module docstring."""

    def __init__(self, reduction="mean", ignore_index=-100):
        super().__init__()
        self.reduction = _check_reduction("CrossEntropyLoss", reduction)
        if isinstance(ignore_index, (bool, np.bool_)) or not isinstance(
                ignore_index, (int, np.integer)):
            raise TypeError(f"CrossEntropyLoss: ignore_index must be an integer; "
                            f"got {ignore_index!r}")
        self.ignore_index = int(ignore_index)
        self._saved = None

    def extra_repr(self):
        return f"reduction={self.reduction!r}, ignore_index={self.ignore_index}"

    def _inputs(self, logits, target, s):
        cls = "CrossEntropyLoss"
        x = arrays.device_input(cls, "logits", logits, s)
        if x.ndim < 2:
            raise ValueError(f"{cls}: logits must be (N, C) or (N, C, d1, ...); "
                             f"got shape {tuple(x.shape)}")
        t, host = _device_target(cls, target, s)
        want = (x.shape[0],) + tuple(x.shape[2:])
        if tuple(t.shape) != want:
            raise ValueError(f"{cls}: target shape {tuple(t.shape)} does not match logits "
                             f"shape {tuple(x.shape)} (expected {want})")
        if host is not None:
            _check_classes(cls, host, x.shape[1], self.ignore_index)
        return x, t, host is None

    def forward(self, logits, target, *, stream=None):
        """The loss as a Python float (synchronises); remembers what backward needs."""
        from ..kernels import nll_fwd_kernel
        s = arrays.as_stream(stream)
        x, t, on_device = self._inputs(logits, target, s)
        n, c = x.shape[0], x.shape[1]
        sp = x.size // (n * c) if n * c else int(np.prod(x.shape[2:]))
        if x.size == 0:
            total, count, logp = 0.0, 0, x
        else:
            # log_softmax takes 2-D or 4-D: any spatial dims become (N, C, S, 1), same memory
            logp = self.run(ops.log_softmax, x if x.ndim == 2 else x.reshape(n, c, sp, 1),
                            "channel", stream=s)
            args = (arrays.flat(logp), arrays.flat(t), n, c, sp, self.ignore_index)
            total, count = _reduce(nll_fwd_kernel, args, n * sp, arrays.acc_array(x.dtype), s)
            if on_device and np.isnan(total):   # NaN: an invalid target, or NaN logits
                _check_classes("CrossEntropyLoss", t.copy_to_host(), c, self.ignore_index)
        mean = self.reduction == "mean"
        scale = (1.0 / count if count else 0.0) if mean else 1.0
        self._saved = (logp, t, x.shape, x.dtype, n, c, sp, scale)
        if not mean:
            return total
        return total / count if count else float("nan")

    def backward(self, *, stream=None):
        """dloss/dlogits: a device array shaped like the logits."""
        from ..kernels import nll_bwd_kernel
        if self._saved is None:
            raise RuntimeError("CrossEntropyLoss: backward() called before forward()")
        logp, t, shape, dtype, n, c, sp, scale = self._saved
        s = arrays.as_stream(stream)
        dx = arrays.cuda_empty(shape, dtype, s)
        acc = arrays.acc_array(dtype)
        _launch_1d(nll_bwd_kernel, n * c * sp, s,
                   (arrays.flat(logp), arrays.flat(t), arrays.flat(dx), n, c, sp,
                    self.ignore_index, acc.dtype.type(scale), acc))
        return dx


class MSELoss(Module):
    """Mean (or sum) of squared differences; see the module docstring."""

    def __init__(self, reduction="mean"):
        super().__init__()
        self.reduction = _check_reduction("MSELoss", reduction)
        self._saved = None

    def extra_repr(self):
        return f"reduction={self.reduction!r}"

    def _inputs(self, x, target, s):
        cls = "MSELoss"
        x = arrays.device_input(cls, "x", x, s)
        if not (arrays.is_device_array(target) or hasattr(target, "__cuda_array_interface__")):
            h = np.asarray(target)
            if h.dtype.kind not in "iuf":
                raise TypeError(f"{cls}: target must be a real array; got dtype {h.dtype}")
            target = h.astype(x.dtype)   # a host target takes x's dtype (one copy anyway)
        t = arrays.device_input(cls, "target", target, s)
        if tuple(t.shape) != tuple(x.shape):
            raise ValueError(f"{cls}: target shape {tuple(t.shape)} does not match x shape "
                             f"{tuple(x.shape)}")
        if t.dtype != x.dtype:
            raise TypeError(f"{cls}: target dtype {t.dtype} does not match x dtype {x.dtype}")
        return x, t

    def forward(self, x, target, *, stream=None):
        """The loss as a Python float (synchronises); remembers x and target for backward."""
        from ..kernels import mse_fwd_kernel
        s = arrays.as_stream(stream)
        x, t = self._inputs(x, target, s)
        total = 0.0
        if x.size:
            args = (arrays.flat(x), arrays.flat(t))
            total, _ = _reduce(mse_fwd_kernel, args, x.size, arrays.acc_array(x.dtype), s)
        mean = self.reduction == "mean"
        scale = (2.0 / x.size if x.size else 0.0) if mean else 2.0
        self._saved = (x, t, scale)
        if not mean:
            return total
        return total / x.size if x.size else float("nan")

    def backward(self, *, stream=None):
        """dloss/dx: a device array shaped like x."""
        from ..kernels import mse_bwd_kernel
        if self._saved is None:
            raise RuntimeError("MSELoss: backward() called before forward()")
        x, t, scale = self._saved
        s = arrays.as_stream(stream)
        dx = arrays.cuda_empty(x.shape, x.dtype, s)
        acc = arrays.acc_array(x.dtype)
        _launch_1d(mse_bwd_kernel, x.size, s, (arrays.flat(x), arrays.flat(t), arrays.flat(dx),
                                               acc.dtype.type(scale), acc))
        return dx
