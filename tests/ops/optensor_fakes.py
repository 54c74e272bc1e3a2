"""Stand-ins for dnnkit/cudnn/optensor.py's calls, so that the cuDNN paths of the tensor ops
(ops/arith.py, ops/reduce.py, ops/shape.py) run on the simulator: each checks what cuDNN
requires of its arguments (dims per tensor, broadcast dims equal or 1, at most 5 or 8 dims,
the 32-bit limit) and computes cuDNN's documented result in float64 NumPy. They test the ops'
side (operand swaps, alphas, merged dims, slice strides and offsets), not the ctypes calls:
those run on a GPU (tests marked cudnn)."""

import numpy as np

from dnnkit import policy
from dnnkit.cudnn import optensor
from dnnkit.cudnn.loader import CudnnStatus
from dnnkit.ops import split


def _host(a, dims):
    assert a.is_c_contiguous() and a.size <= split.LIMIT
    assert int(np.prod(dims)) == a.size, (a.shape, dims)
    return a.copy_to_host().astype(np.float64).reshape(dims)


def _put(c, value):
    c.copy_to_device(np.ascontiguousarray(np.reshape(value, c.shape), dtype=c.dtype))


def _broadcasts(small, full):
    assert len(small) == len(full), (small, full)
    assert all(s in (f, 1) for s, f in zip(small, full)), (small, full)


def fake_optensor(monkeypatch):
    """Make cuDNN "available" and fake optensor's calls; returns [(call name, dims)] in call
    order."""
    calls = []
    monkeypatch.setattr(policy, "cudnn_status", lambda: CudnnStatus(True))

    def op_tensor(op, alpha1, a, a_dims, alpha2, b, b_dims, c, c_dims, stream):
        calls.append(("op_tensor", op, tuple(c_dims)))
        assert len(c_dims) <= 5 and tuple(a_dims) == tuple(c_dims)
        _broadcasts(b_dims, c_dims)
        x, y = alpha1 * _host(a, a_dims), alpha2 * _host(b, b_dims)
        _put(c, x + y if op == "add" else x * y)

    def add_tensor(alpha, a, a_dims, beta, c, c_dims, stream):
        calls.append(("add_tensor", tuple(c_dims)))
        assert len(c_dims) <= 5
        _broadcasts(a_dims, c_dims)
        out = alpha * np.broadcast_to(_host(a, a_dims), c_dims)
        if beta:                          # beta = 0: C is not read
            out = out + beta * _host(c, c_dims)
        _put(c, out)

    def set_tensor(c, dims, value, stream):
        calls.append(("set_tensor", tuple(dims)))
        assert int(np.prod(dims)) == c.size
        _put(c, np.full(c.shape, value))

    def reduce(a, a_dims, c, c_dims, op, stream):
        calls.append(("reduce", op, tuple(a_dims)))
        assert len(a_dims) <= 8
        _broadcasts(c_dims, a_dims)
        axes = tuple(k for k, (m, n) in enumerate(zip(a_dims, c_dims)) if n == 1 and m != 1)
        x = _host(a, a_dims)
        _put(c, (x.sum if op == "add" else x.mean)(axis=axes, keepdims=True))

    def transform(a, a_dims, a_strides, a_offset, c, c_dims, c_strides, c_offset, stream):
        calls.append(("transform", tuple(a_dims)))
        assert tuple(a_dims) == tuple(c_dims) and len(a_dims) <= 8
        src = a.copy_to_host().reshape(-1)
        dst = c.copy_to_host().reshape(-1)
        item = src.itemsize
        block = np.lib.stride_tricks.as_strided(src[a_offset:], a_dims,
                                                [s * item for s in a_strides])
        view = np.lib.stride_tricks.as_strided(dst[c_offset:], c_dims,
                                               [s * item for s in c_strides])
        view[...] = block
        c.copy_to_device(dst.reshape(c.shape))

    for name, fn in (("op_tensor", op_tensor), ("add_tensor", add_tensor),
                     ("set_tensor", set_tensor), ("reduce", reduce), ("transform", transform)):
        monkeypatch.setattr(optensor, name, fn)
    return calls
