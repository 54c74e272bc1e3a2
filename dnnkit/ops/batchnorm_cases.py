"""Batch normalization's rows of ``python -m dnnkit check`` (dnnkit/selfcheck.py): each op on
both backends against the float64 reference, in both modes, with and without the fused relu.
"""

import numpy as np

from .. import arrays, reference
from .batchnorm import (MODES, batch_norm_backward, batch_norm_inference, batch_norm_train,
                        param_shapes)
from .batchnorm_numba import flat_copy

class _Joined:
    """Several device outputs checked as one: ``copy_to_host()`` concatenates them (float64,
    flat), in the order of the float64 reference's outputs."""

    def __init__(self, *outs):
        self.outs = [o for o in outs if o is not None]

    def copy_to_host(self):
        return np.concatenate([np.asarray(arrays.to_host(o), np.float64).ravel()
                               for o in self.outs])


def _inputs(mode, small, big, kind, act=None, res=False):
    """(rng, dtype, big) -> host inputs: x, gamma, beta, then running mean/var (train), mean/var
    (inference), or dy, saved mean, saved invstd and the forward's y (backward); then the
    residual (``res``: x's shape and dtype). Parameters in the parameter dtype (float32 for
    float16 data)."""
    def make(rng, dtype, b):
        shape = big if b else small
        pdt = arrays.acc_dtype(dtype)
        pshape = param_shapes(shape, mode)[0]
        x = (rng.standard_normal(shape) * 3 + 1).astype(dtype)
        gamma = (1 + 0.5 * rng.standard_normal(pshape)).astype(pdt)
        beta = rng.standard_normal(pshape).astype(pdt)
        z = (rng.standard_normal(shape).astype(dtype),) if res else ()
        if kind == "train":
            return (x, gamma, beta, rng.standard_normal(pshape).astype(pdt),
                    (1 + rng.random(pshape)).astype(pdt)) + z
        if kind == "inference":
            return (x, gamma, beta, rng.standard_normal(pshape).astype(pdt),
                    (0.5 + rng.random(pshape)).astype(pdt)) + z
        y, mean, invstd, _, _ = reference.batch_norm_train(x, gamma, beta, mode,
                                                           activation=act,
                                                           residual=z[0] if res else None)
        dy = rng.standard_normal(shape).astype(dtype)
        return x, gamma, beta, dy, mean.astype(pdt), invstd.astype(pdt), y.astype(dtype)
    return make


def _run_train(mode, act, res):
    def run(backend, stream, i):
        s = arrays.as_stream(stream)      # (fresh copies: every call updates them)
        rm, rv = (flat_copy(a, s).reshape(*a.shape) for a in (i[3], i[4]))
        y, mean, invstd = batch_norm_train(i[0], i[1], i[2], mode=mode, running_mean=rm,
                                           running_var=rv, backend=backend, stream=s,
                                           activation=act, residual=i[5] if res else None)
        return _Joined(y, mean, invstd, rm, rv)
    return run


# (activation, residual): plain, with the fused relu, and ResNet's relu(bn(x) + z)
FUSED = ((None, False), ("relu", False), ("relu", True))


def selfcheck_cases(Case):
    # N = 4: with N = 2 the per-activation dx is identically 0 (only rounding to compare)
    small, big = (4, 3, 2, 5), (32, 64, 28, 28)
    out = []
    for mode in MODES:
        for act, res in FUSED:
            name = mode + ("" if act is None else f"+{act}") + ("+residual" if res else "")
            z = (lambda i: i[5]) if res else (lambda i: None)
            out.append(Case("batch_norm_train", name, _run_train(mode, act, res),
                            lambda i, m=mode, a=act, z=z: np.concatenate(
                                [v.ravel() for v in reference.batch_norm_train(
                                    i[0], i[1], i[2], m, 1e-5, 0.1, i[3], i[4], a, z(i))]),
                            _inputs(mode, small, big, "train", res=res)))
            out.append(Case("batch_norm_inference", name,
                            lambda b, s, i, m=mode, a=act, z=z: batch_norm_inference(
                                *i[:5], mode=m, backend=b, stream=s, activation=a,
                                residual=z(i)),
                            lambda i, m=mode, a=act, z=z: reference.batch_norm_inference(
                                *i[:5], mode=m, activation=a, residual=z(i)),
                            _inputs(mode, small, big, "inference", res=res)))
            out.append(Case("batch_norm_backward", name,
                            lambda b, s, i, m=mode, a=act, r=res: _Joined(*batch_norm_backward(
                                i[0], i[3], i[1], i[4], i[5], mode=m, backend=b, stream=s,
                                activation=a, y=i[6] if a else None, residual=r)),
                            lambda i, m=mode, a=act, r=res: np.concatenate(
                                [v.ravel() for v in reference.batch_norm_backward(
                                    i[0], i[3], i[1], i[4], i[5], m, a, i[6], r)]),
                            _inputs(mode, small, big, "backward", act, res)))
    return out
