"""Stand-ins for the cuDNN layer's calls, for tests/ops/test_split.py on the simulator: each
checks that the arrays it is given fit the lowered ``split.LIMIT``, are contiguous and match
their geometry, then writes its piece's float64 reference result (dnnkit.reference) into the
output view. ``fake_cudnn`` also makes the dispatcher see cuDNN as available."""

import numpy as np

from dnnkit import config, policy, reference
from dnnkit.cudnn import activation as cudnn_activation, conv as cconv, pool as cpool
from dnnkit.cudnn import softmax as cudnn_softmax
from dnnkit.cudnn.loader import CudnnStatus
from dnnkit.ops import split


def _fits(*arrays):
    for a in arrays:
        assert a.size <= split.LIMIT and a.is_c_contiguous(), (a.shape, split.LIMIT)


def _host(*arrays):
    _fits(*arrays)
    return [a.copy_to_host().astype(np.float64) for a in arrays]


def _put(out, value):
    _fits(out)
    out.copy_to_device(np.ascontiguousarray(value, dtype=out.dtype))


def _reference_kw(geom, *arrays_and_shapes):
    """The reference's keyword arguments of ``geom``, after checking that each array has the
    user shape of its 5-D geometry shape."""
    for a, shape in arrays_and_shapes:
        assert tuple(a.shape) == geom.user_shape(shape), (a.shape, shape)
    u = geom.user_tuple
    return dict(stride=u(geom.stride), padding=u(geom.padding), dilation=u(geom.dilation),
                groups=geom.groups, flip=geom.flip)


def _activation(seen):
    def forward(x, y, mode, coef, stream):
        seen.append(x.shape)
        _put(y, reference.activation(*_host(x), mode, coef))

    def backward(x, y, dy, dx, mode, coef, stream):
        seen.append(x.shape)
        xh, _, dyh = _host(x, y, dy)
        _put(dx, reference.activation_backward(xh, dyh, mode, coef))
    return dict(forward=forward, backward=backward)


def _softmax(seen):
    def forward(x, y, dims, mode, algo, stream):
        seen.append(x.shape)
        _put(y, reference.softmax(_host(x)[0].reshape(dims), algo, mode).reshape(x.shape))

    def backward(y, dy, dx, dims, mode, algo, stream):
        seen.append(y.shape)
        yh, dyh = (a.reshape(dims) for a in _host(y, dy))
        _put(dx, reference.softmax_backward(yh, dyh, algo, mode).reshape(y.shape))
    return dict(forward=forward, backward=backward)


def _pool(seen):
    def forward(x, y, window, padding, stride, mode, stream):
        seen.append(x.shape)
        _put(y, reference.pool_forward(*_host(x), window, stride, padding, mode))

    def backward(x, y, dy, dx, window, padding, stride, mode, stream):
        seen.append(x.shape)
        xh, _, dyh = _host(x, y, dy)
        _put(dx, reference.pool_backward(xh, dyh, window, stride, padding, mode))
    return dict(forward=forward, backward=backward)


def _conv(seen):
    def forward(x, w, y, geom, **kw):
        seen.append(x.shape)
        g = _reference_kw(geom, (x, geom.x_shape), (y, geom.y_shape))
        _put(y, reference.conv_forward(*_host(x, w), **g))
        return "fake"

    def backward_data(dy, w, dx, geom, **kw):
        seen.append(dx.shape)
        g = _reference_kw(geom, (dx, geom.x_shape), (dy, geom.y_shape))
        _put(dx, reference.conv_backward_data(*_host(dy, w), dx.shape, **g))
        return "fake"

    def backward_filter(x, dy, dw, geom, **kw):
        seen.append(x.shape)
        g = _reference_kw(geom, (x, geom.x_shape), (dy, geom.y_shape))
        _put(dw, reference.conv_backward_filter(*_host(x, dy), dw.shape, **g))
        return "fake"

    def add_bias(y, bias, geom, stream):
        yh, bh = _host(y, bias)
        _put(y, yh + bh.reshape((1, -1) + (1,) * (y.ndim - 2)))

    def backward_bias(dy, db, stream):
        _put(db, reference.conv_backward_bias(*_host(dy)))
    return dict(forward=forward, backward_data=backward_data, backward_filter=backward_filter,
                add_bias=add_bias, backward_bias=backward_bias)


def fake_cudnn(monkeypatch, limit):
    """Lower split.LIMIT to ``limit``, make cuDNN "available" and fake its calls; returns
    {family: [shape of each piece's main array, in call order]}."""
    seen = {"activation": [], "softmax": [], "pool": [], "conv": []}
    monkeypatch.setattr(split, "LIMIT", limit)
    monkeypatch.setattr(policy, "cudnn_status", lambda: CudnnStatus(True))
    config.set("dnn.conv.workspace_limit", 0)   # no device memory query on the simulator
    for module, fakes in ((cudnn_activation, _activation(seen["activation"])),
                          (cudnn_softmax, _softmax(seen["softmax"])), (cpool, _pool(seen["pool"])),
                          (cconv, _conv(seen["conv"]))):
        for name, fn in fakes.items():
            monkeypatch.setattr(module, name, fn)
    return seen
