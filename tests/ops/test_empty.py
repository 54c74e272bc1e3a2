"""No op returns memory it did not write: every public op at its edge shapes (an empty batch,
no channels, empty spatial dimensions, no filters or a filter window of no taps) and at a
small ordinary shape, on both backends, under ``dnn.debug.fill_uninitialized = nan``.

Every new array of dnnkit's allocator then starts as NaN; the inputs are finite, so a NaN in
an output is an element no kernel (and no memset) wrote. Where the answer is known (a sum over
nothing is 0, a convolution over no input channels is its bias) it is compared too. Where an
edge shape has no meaning (a filter window of 0 taps, an RNN over no steps) the rule is a
ValueError naming the op, checked before any backend runs. docs/<op>.md states each rule.

``test_every_registered_op_has_edge_cases`` keeps the table complete: a new op fails it until
its rows are added here.
"""

import types

import numpy as np
import pytest

import dnnkit
from dnnkit import config
from dnnkit.errors import CudnnUnavailableError
from dnnkit.registry import REGISTRY
from dnnkit.rnn_layout import param_size
from tests.conftest import backend_params

F32 = np.float32


def _x(*shape, dtype=F32, seed=0):
    """Finite values in [0.5, 1.5): no op makes a NaN of them."""
    rng = np.random.default_rng(seed + len(shape))
    return (0.5 + rng.random(shape)).astype(dtype)


def _zeros(out):
    assert not out.any(), out


def _all(value):
    def check(out):
        assert np.array_equal(out, np.full_like(out, value)), out
    return check


def _bias_planes(b):
    """y[n, k, ...] == b[k] everywhere."""
    def check(out):
        want = np.broadcast_to(np.asarray(b).reshape((1, -1) + (1,) * (out.ndim - 2)), out.shape)
        assert out.shape[1] == len(b) and np.array_equal(out, want), out
    return check


# (op, case id, call(backend) -> the op's result, checks of the outputs (one per array output,
# None: only "no NaN"), or the exception the rule raises)
CASES = []


def case(op, name, call, *checks, raises=None):
    CASES.append((op, name, call, checks, raises))


# ------------------------------------------------------------- activation, softmax

for shape in [(2, 3), (0, 3), (2, 0), (), (2, 3, 0, 4)]:
    case("activation", f"x{shape}", lambda b, s=shape: dnnkit.activation(_x(*s), "elu", 1.0,
                                                                          backend=b))
    case("activation_backward", f"x{shape}",
         lambda b, s=shape: dnnkit.activation_backward(_x(*s), _x(*s), _x(*s), "tanh",
                                                       backend=b))
for shape, mode in [((2, 3), "channel"), ((0, 3), "channel"), ((2, 0), "channel"),
                    ((2, 0, 3, 3), "channel"), ((2, 3, 0, 3), "channel"),
                    ((2, 3, 0, 3), "instance"), ((0, 3, 2, 2), "instance")]:
    case("softmax", f"x{shape}-{mode}",
         lambda b, s=shape, m=mode: dnnkit.softmax(_x(*s), "log", m, backend=b))
    case("softmax_backward", f"x{shape}-{mode}",
         lambda b, s=shape, m=mode: dnnkit.softmax_backward(_x(*s), _x(*s), "accurate", m,
                                                            backend=b))

# ------------------------------------------------------------- convolution

BIAS = np.array([1.5, -2.0, 0.25], F32)
case("conv2d", "small", lambda b: dnnkit.conv2d(_x(1, 2, 5, 5), _x(3, 2, 3, 3), BIAS,
                                                padding=1, backend=b))
case("conv2d", "N=0", lambda b: dnnkit.conv2d(_x(0, 2, 5, 5), _x(3, 2, 3, 3), BIAS, backend=b))
case("conv2d", "K=0", lambda b: dnnkit.conv2d(_x(1, 2, 5, 5), _x(0, 2, 3, 3), backend=b))
case("conv2d", "C=0: y = bias", lambda b: dnnkit.conv2d(_x(2, 0, 5, 5), _x(3, 0, 3, 3), BIAS,
                                                         backend=b), _bias_planes(BIAS))
case("conv2d", "C=0 groups=3 no bias: y = 0",
     lambda b: dnnkit.conv2d(_x(2, 0, 5, 5), _x(3, 0, 3, 3), groups=3, backend=b), _zeros)
case("conv2d", "H=0 padded: y = bias",
     lambda b: dnnkit.conv2d(_x(1, 2, 0, 5), _x(3, 2, 1, 1), BIAS, padding=1, backend=b),
     _bias_planes(BIAS))
case("conv2d", "H=0 unpadded", lambda b: dnnkit.conv2d(_x(1, 2, 0, 5), _x(3, 2, 1, 1),
                                                        backend=b), raises=ValueError)
case("conv2d", "window 0x0", lambda b: dnnkit.conv2d(_x(1, 2, 5, 5), _x(3, 2, 0, 0), BIAS,
                                                      backend=b), raises=ValueError)
case("conv2d", "window 3x0", lambda b: dnnkit.conv2d(_x(1, 2, 5, 5), _x(3, 2, 3, 0),
                                                      padding=1, backend=b), raises=ValueError)
case("conv3d", "C=0: y = bias", lambda b: dnnkit.conv3d(_x(1, 0, 3, 3, 3), _x(3, 0, 2, 2, 2),
                                                         BIAS, backend=b), _bias_planes(BIAS))
case("conv3d", "N=0", lambda b: dnnkit.conv3d(_x(0, 2, 3, 3, 3), _x(3, 2, 2, 2, 2),
                                              backend=b))
case("conv3d", "window 0", lambda b: dnnkit.conv3d(_x(1, 2, 3, 3, 3), _x(3, 2, 0, 1, 1),
                                                    backend=b), raises=ValueError)

case("conv2d_backward_data", "small",
     lambda b: dnnkit.conv2d_backward_data(_x(1, 3, 5, 5), _x(3, 2, 3, 3), (1, 2, 5, 5),
                                           padding=1, backend=b))
case("conv2d_backward_data", "N=0",
     lambda b: dnnkit.conv2d_backward_data(_x(0, 3, 3, 3), _x(3, 2, 3, 3), (0, 2, 5, 5),
                                           backend=b))
case("conv2d_backward_data", "K=0: dx = 0",
     lambda b: dnnkit.conv2d_backward_data(_x(1, 0, 3, 3), _x(0, 2, 3, 3), (1, 2, 5, 5),
                                           backend=b), _zeros)
case("conv2d_backward_data", "C=0",
     lambda b: dnnkit.conv2d_backward_data(_x(1, 3, 3, 3), _x(3, 0, 3, 3), (1, 0, 5, 5),
                                           backend=b))
case("conv2d_backward_data", "H=0 padded",
     lambda b: dnnkit.conv2d_backward_data(_x(1, 3, 2, 7), _x(3, 2, 1, 1), (1, 2, 0, 5),
                                           padding=1, backend=b))
case("conv2d_backward_data", "window 0",
     lambda b: dnnkit.conv2d_backward_data(_x(1, 3, 6, 6), _x(3, 2, 0, 0), (1, 2, 5, 5),
                                           backend=b), raises=ValueError)
case("conv3d_backward_data", "K=0: dx = 0",
     lambda b: dnnkit.conv3d_backward_data(_x(1, 0, 2, 2, 2), _x(0, 2, 2, 2, 2),
                                           (1, 2, 3, 3, 3), backend=b), _zeros)

case("conv2d_backward_filter", "small",
     lambda b: dnnkit.conv2d_backward_filter(_x(1, 2, 5, 5), _x(1, 3, 5, 5), (3, 2, 3, 3),
                                             padding=1, backend=b))
case("conv2d_backward_filter", "N=0: dw = 0",
     lambda b: dnnkit.conv2d_backward_filter(_x(0, 2, 5, 5), _x(0, 3, 3, 3), (3, 2, 3, 3),
                                             backend=b), _zeros)
case("conv2d_backward_filter", "K=0",
     lambda b: dnnkit.conv2d_backward_filter(_x(1, 2, 5, 5), _x(1, 0, 3, 3), (0, 2, 3, 3),
                                             backend=b))
case("conv2d_backward_filter", "C=0",
     lambda b: dnnkit.conv2d_backward_filter(_x(1, 0, 5, 5), _x(1, 3, 3, 3), (3, 0, 3, 3),
                                             backend=b))
case("conv2d_backward_filter", "H=0 padded: dw = 0",
     lambda b: dnnkit.conv2d_backward_filter(_x(1, 2, 0, 5), _x(1, 3, 2, 7), (3, 2, 1, 1),
                                             padding=1, backend=b), _zeros)
case("conv2d_backward_filter", "window 0",
     lambda b: dnnkit.conv2d_backward_filter(_x(1, 2, 5, 5), _x(1, 3, 6, 6), (3, 2, 0, 0),
                                             backend=b), raises=ValueError)
case("conv3d_backward_filter", "N=0: dw = 0",
     lambda b: dnnkit.conv3d_backward_filter(_x(0, 2, 3, 3, 3), _x(0, 3, 2, 2, 2),
                                             (3, 2, 2, 2, 2), backend=b), _zeros)

case("conv_backward_bias", "small", lambda b: dnnkit.conv_backward_bias(_x(2, 3, 2, 2),
                                                                        backend=b))
case("conv_backward_bias", "N=0: db = 0",
     lambda b: dnnkit.conv_backward_bias(_x(0, 3, 2, 2), backend=b), _zeros)
case("conv_backward_bias", "H=0: db = 0",
     lambda b: dnnkit.conv_backward_bias(_x(2, 3, 0, 2), backend=b), _zeros)
case("conv_backward_bias", "K=0", lambda b: dnnkit.conv_backward_bias(_x(2, 0, 2, 2),
                                                                      backend=b))
case("conv_backward_bias", "3-D dy", lambda b: dnnkit.conv_backward_bias(_x(2, 3, 4),
                                                                         backend=b))

# ------------------------------------------------------------- pooling

for mode in ("max", "average_exc_pad"):
    case("pool2d", f"small {mode}", lambda b, m=mode: dnnkit.pool2d(_x(1, 2, 5, 5), 2, 2, 1, m,
                                                                     backend=b))
    case("pool2d", f"N=0 {mode}", lambda b, m=mode: dnnkit.pool2d(_x(0, 2, 4, 4), 2, mode=m,
                                                                   backend=b))
    case("pool2d", f"C=0 {mode}", lambda b, m=mode: dnnkit.pool2d(_x(1, 0, 4, 4), 2, mode=m,
                                                                   backend=b))
    # windows that skip inputs (stride 3 > window 2): dx is 0 there, written all the same
    case("pool2d_backward", f"skipped inputs {mode}",
         lambda b, m=mode: dnnkit.pool2d_backward(_x(1, 2, 5, 5), _x(1, 2, 2, 2),
                                                  _x(1, 2, 2, 2), 2, 3, 0, m, backend=b))
    case("pool2d_backward", f"N=0 {mode}",
         lambda b, m=mode: dnnkit.pool2d_backward(_x(0, 2, 4, 4), _x(0, 2, 2, 2),
                                                  _x(0, 2, 2, 2), 2, mode=m, backend=b))
    case("pool2d_backward", f"C=0 {mode}",
         lambda b, m=mode: dnnkit.pool2d_backward(_x(1, 0, 4, 4), _x(1, 0, 2, 2),
                                                  _x(1, 0, 2, 2), 2, mode=m, backend=b))
case("pool2d", "H=0", lambda b: dnnkit.pool2d(_x(1, 2, 0, 4), 2, padding=1, backend=b),
     raises=ValueError)
case("pool2d", "window 0", lambda b: dnnkit.pool2d(_x(1, 2, 4, 4), 0, backend=b),
     raises=ValueError)
case("pool3d", "N=0", lambda b: dnnkit.pool3d(_x(0, 2, 4, 4, 4), 2, backend=b))
case("pool3d", "C=0", lambda b: dnnkit.pool3d(_x(1, 0, 4, 4, 4), 2, mode="sum", backend=b))
case("pool3d", "D=0", lambda b: dnnkit.pool3d(_x(1, 2, 0, 4, 4), 2, backend=b),
     raises=ValueError)
case("pool3d_backward", "skipped inputs",
     lambda b: dnnkit.pool3d_backward(_x(1, 1, 5, 5, 5), _x(1, 1, 2, 2, 2), _x(1, 1, 2, 2, 2),
                                      2, 3, 0, "max", backend=b))
case("pool3d_backward", "N=0",
     lambda b: dnnkit.pool3d_backward(_x(0, 1, 4, 4, 4), _x(0, 1, 2, 2, 2), _x(0, 1, 2, 2, 2),
                                      2, mode="sum", backend=b))
case("global_avg_pool", "small", lambda b: dnnkit.global_avg_pool(_x(2, 3, 3, 2), backend=b))
case("global_avg_pool", "N=0", lambda b: dnnkit.global_avg_pool(_x(0, 3, 3, 2), backend=b))
case("global_avg_pool", "C=0", lambda b: dnnkit.global_avg_pool(_x(2, 0, 2, 2, 2), backend=b))
case("global_avg_pool", "H=0", lambda b: dnnkit.global_avg_pool(_x(2, 3, 0, 2), backend=b),
     raises=ValueError)

# ------------------------------------------------------------- local response normalization

for shape in [(2, 5, 3), (0, 3, 2, 2), (2, 0, 2), (2, 3, 0, 2), (1, 2, 2, 0, 2)]:
    case("lrn", f"x{shape}", lambda b, s=shape: dnnkit.lrn(_x(*s), 3, 1.0, backend=b))
    case("lrn_backward", f"x{shape}",
         lambda b, s=shape: dnnkit.lrn_backward(_x(*s), _x(*s), _x(*s), 4, 1.0, backend=b))

# ------------------------------------------------------------- batch normalization


def _bn_params(c, mode="spatial", shape=None):
    p = (c,) if mode == "spatial" else shape[1:]
    return _x(*p), _x(*p, seed=1)


for shape in [(4, 3, 2, 2), (4, 0, 2, 2), (3, 2)]:
    case("batch_norm_train", f"x{shape}",
         lambda b, s=shape: dnnkit.batch_norm_train(_x(*s), *_bn_params(s[1]), backend=b))
for shape in [(0, 3, 2, 2), (4, 3, 0, 2), (1, 3, 1, 1)]:
    case("batch_norm_train", f"x{shape}",
         lambda b, s=shape: dnnkit.batch_norm_train(_x(*s), *_bn_params(s[1]), backend=b),
         raises=ValueError)
for shape in [(4, 3, 2, 2), (0, 3, 2, 2), (4, 0, 2, 2), (4, 3, 0, 2)]:
    case("batch_norm_inference", f"x{shape}",
         lambda b, s=shape: dnnkit.batch_norm_inference(_x(*s), *_bn_params(s[1]),
                                                        *_bn_params(s[1]), backend=b))
for shape, checks in [((4, 3, 2, 2), ()), ((4, 0, 2, 2), ()),
                      ((4, 3, 0, 2), (None, _zeros, _zeros))]:
    case("batch_norm_backward", f"x{shape}",
         lambda b, s=shape: dnnkit.batch_norm_backward(_x(*s), _x(*s), *_bn_params(s[1]),
                                                       _bn_params(s[1])[0], backend=b), *checks)
case("batch_norm_backward", "per-activation H=0",
     lambda b: dnnkit.batch_norm_backward(
         _x(4, 3, 0, 2), _x(4, 3, 0, 2), *_bn_params(3, "per-activation", (4, 3, 0, 2)),
         _x(3, 0, 2), mode="per-activation", backend=b))
case("batch_norm_backward", "N=0",
     lambda b: dnnkit.batch_norm_backward(_x(0, 3, 2, 2), _x(0, 3, 2, 2), *_bn_params(3),
                                          _bn_params(3)[0], backend=b), raises=ValueError)

# ------------------------------------------------------------- dropout

for shape, p in [((4, 5), 0.5), ((0, 5), 0.5), ((4, 0), 0.3), ((3, 3), 0.0)]:
    case("dropout", f"x{shape} p={p}",
         lambda b, s=shape, q=p: dnnkit.dropout(_x(*s), q, seed=7, backend=b)[0])

    def _dropout_backward(b, s=shape, q=p):
        _, state = dnnkit.dropout(_x(*s), q, seed=7, backend=b)
        return dnnkit.dropout_backward(_x(*s), state, backend=b)
    case("dropout_backward", f"x{shape} p={p}", _dropout_backward)

# ------------------------------------------------------------- recurrent networks


def _rnn(mode, bidirectional=False):
    cfg = dnnkit.ops.rnn.make_config(mode, 2, 3, 2, bidirectional=bidirectional)
    return cfg, _x(param_size(cfg)) * 0.2


for mode, bi in [("lstm", True), ("gru", False), ("rnn_tanh", False)]:
    def _forward(b, m=mode, d=bi):
        cfg, w = _rnn(m, d)    # sequences shorter than T: y past their end is 0, written
        return dnnkit.rnn_forward(cfg, w, _x(3, 2, 2), lengths=[1, 3], backend=b)[:3]

    def _backward(b, m=mode, d=bi):
        cfg, w = _rnn(m, d)
        x = _x(3, 2, 2)
        y, hy, cy, state = dnnkit.rnn_forward(cfg, w, x, lengths=[3, 2], training=True,
                                              backend=b)
        return dnnkit.rnn_backward(cfg, w, x, y, _x(*y.shape), state=state, lengths=[3, 2],
                                   backend=b)
    case("rnn_forward", f"{mode} bidirectional={bi} lengths", _forward)
    case("rnn_backward", f"{mode} bidirectional={bi} lengths", _backward)
for shape in [(0, 2, 2), (3, 0, 2)]:
    case("rnn_forward", f"x{shape}", lambda b, s=shape: dnnkit.rnn_forward(
        *_rnn("lstm"), _x(*s), backend=b), raises=ValueError)
    case("rnn_backward", f"x{shape}", lambda b, s=shape: dnnkit.rnn_backward(
        *_rnn("lstm"), _x(*s), _x(s[0], s[1], 3), _x(s[0], s[1], 3),
        state=types.SimpleNamespace(backend=b), backend=b), raises=ValueError)

# ------------------------------------------------------------- spatial transformer

THETA = np.tile(np.array([[0.9, 0.1, 0.05], [-0.1, 0.8, 0.0]], F32), (2, 1, 1))


def _grid(n, h, w):
    rng = np.random.default_rng(3)
    return rng.uniform(-1.1, 1.1, (n, h, w, 2)).astype(F32)


case("affine_grid", "small", lambda b: dnnkit.affine_grid(THETA, (2, 1, 3, 4), backend=b))
case("affine_grid", "N=0", lambda b: dnnkit.affine_grid(THETA[:0], (0, 1, 3, 4), backend=b))
case("affine_grid", "H'=0", lambda b: dnnkit.affine_grid(THETA, (2, 1, 0, 4), backend=b),
     raises=ValueError)
case("affine_grid_backward", "small", lambda b: dnnkit.affine_grid_backward(_grid(2, 3, 4),
                                                                            backend=b))
case("affine_grid_backward", "N=0", lambda b: dnnkit.affine_grid_backward(_grid(0, 3, 4),
                                                                          backend=b))
case("affine_grid_backward", "H'=0", lambda b: dnnkit.affine_grid_backward(
    _grid(2, 0, 4), backend=b), raises=ValueError)
for name, img, grid in [("small", (2, 2, 4, 5), (2, 3, 4)), ("N=0", (0, 2, 4, 5), (0, 3, 4)),
                        ("C=0", (2, 0, 4, 5), (2, 3, 4)), ("H'=0", (2, 2, 4, 5), (2, 0, 4))]:
    case("grid_sample", name, lambda b, i=img, g=grid: dnnkit.grid_sample(_x(*i), _grid(*g),
                                                                          backend=b))
    # dimg with no grid point, dgrid with no channel: sums over nothing
    checks = {"C=0": (None, _zeros), "H'=0": (_zeros, None)}.get(name, ())
    case("grid_sample_backward", name, lambda b, i=img, g=grid: dnnkit.grid_sample_backward(
        _x(*i), _grid(*g), _x(i[0], i[1], g[1], g[2]), backend=b), *checks)
case("grid_sample", "H=0", lambda b: dnnkit.grid_sample(_x(2, 2, 0, 5), _grid(2, 3, 4),
                                                        backend=b), raises=ValueError)
case("spatial_transformer", "small", lambda b: dnnkit.spatial_transformer(
    _x(2, 2, 4, 5), THETA, scale_height=0.5, backend=b))
case("spatial_transformer", "N=0", lambda b: dnnkit.spatial_transformer(
    _x(0, 2, 4, 5), THETA[:0], backend=b))
case("spatial_transformer", "C=0", lambda b: dnnkit.spatial_transformer(
    _x(2, 0, 4, 5), THETA, backend=b))
case("spatial_transformer", "W=0", lambda b: dnnkit.spatial_transformer(
    _x(2, 2, 4, 0), THETA, backend=b), raises=ValueError)

# ------------------------------------------------------------- matrix products

for name, a, bb in [("small", (3, 4), (4, 2)), ("k=0: y = 0", (3, 0), (0, 2)),
                    ("m=0", (0, 4), (4, 2)), ("n=0", (3, 4), (4, 0)),
                    ("batch 0", (0, 3, 4), (0, 4, 2)), ("batched k=0", (2, 3, 0), (2, 0, 2))]:
    case("matmul", name, lambda b, sa=a, sb=bb: dnnkit.matmul(_x(*sa), _x(*sb), backend=b),
         *((_zeros,) if "k=0" in name else ()))
LIN_BIAS = np.array([0.5, -1.0], F32)
case("linear", "small", lambda b: dnnkit.linear(_x(3, 4), _x(2, 4), LIN_BIAS, backend=b))
case("linear", "in=0: y = bias", lambda b: dnnkit.linear(_x(3, 0), _x(2, 0), LIN_BIAS,
                                                          backend=b),
     lambda out: np.testing.assert_array_equal(out, np.broadcast_to(LIN_BIAS, (3, 2))))
case("linear", "in=0 no bias: y = 0", lambda b: dnnkit.linear(_x(3, 0), _x(2, 0), backend=b),
     _zeros)
case("linear", "batch 0", lambda b: dnnkit.linear(_x(0, 4), _x(2, 4), LIN_BIAS, backend=b))
case("linear", "out=0", lambda b: dnnkit.linear(_x(3, 4), _x(0, 4), backend=b))

# ------------------------------------------------------------- embedding, losses

IDS = np.array([[0, 2, 2], [1, 0, 3]], np.int64)
case("embedding", "small", lambda b: dnnkit.embedding(IDS, _x(4, 3), backend=b))
case("embedding", "no ids", lambda b: dnnkit.embedding(IDS[:0], _x(4, 3), backend=b))
case("embedding", "dim 0", lambda b: dnnkit.embedding(IDS, _x(4, 0), backend=b))
case("embedding_backward", "small: unused rows 0",
     lambda b: dnnkit.embedding_backward(np.array([0, 2, 2]), _x(3, 3), 5, backend=b),
     lambda out: _zeros(out[[1, 3, 4]]))
case("embedding_backward", "no ids: dw = 0",
     lambda b: dnnkit.embedding_backward(IDS[:0], _x(0, 3, 3), 4, backend=b), _zeros)

TARGET = np.array([2, 0, 1], np.int64)
for op in ("cross_entropy", "nll_loss"):
    for name, x, t, red in [("small sum", (3, 4), TARGET, "sum"),
                            ("small none", (3, 4), TARGET, "none"),
                            ("N=0 sum: 0", (0, 4), TARGET[:0], "sum"),
                            ("N=0 none", (0, 4), TARGET[:0], "none"),
                            ("C=0 all ignored: 0", (3, 0), np.full(3, -100), "sum")]:
        case(op, name, lambda b, o=op, sx=x, tt=t, r=red: getattr(dnnkit, o)(
            _x(*sx), tt, r, backend=b), *((_zeros,) if name.endswith(": 0") else ()))
        dy = (lambda s, r: _x(*s) if r == "none" else np.array(0.75, F32))
        case(f"{op}_backward", name, lambda b, o=op, sx=x, tt=t, r=red: getattr(
            dnnkit, f"{o}_backward")(_x(*sx), tt, dy(tt.shape, r), r, backend=b))
for name, shape, red in [("small", (3, 4), "mean"), ("empty sum: 0", (0, 4), "sum"),
                         ("empty none", (2, 0), "none")]:
    case("mse_loss", name, lambda b, s=shape, r=red: dnnkit.mse_loss(_x(*s), _x(*s, seed=5), r,
                                                                      backend=b),
         *((_zeros,) if name.endswith(": 0") else ()))
    case("mse_loss_backward", name, lambda b, s=shape, r=red: dnnkit.mse_loss_backward(
        _x(*s), _x(*s, seed=5), _x(*s) if r == "none" else np.array(0.5, F32), r, backend=b))


# ------------------------------------------------------------- arithmetic, sums, shapes

for op in ("add", "subtract", "multiply", "divide"):
    for name, a, bb in [("small broadcast", (2, 3), (3,)), ("N=0", (0, 3), (3,)),
                        ("C=0", (2, 0), (2, 1)), ("0-d", (), (2, 2))]:
        case(op, name, lambda b, o=op, sa=a, sb=bb: getattr(dnnkit, o)(_x(*sa), _x(*sb, seed=4),
                                                                       backend=b))
    case(op, "scalar", lambda b, o=op: getattr(dnnkit, o)(_x(2, 2), 2.0, backend=b))
for name, shape, axis, checks in [("small", (2, 3), 1, ()), ("over an empty axis: 0", (2, 0), 1,
                                                             (_zeros,)),
                                  ("N=0 over N: 0", (0, 3), 0, (_zeros,)),
                                  ("N=0 all: 0", (0, 3), None, (_zeros,)),
                                  ("N=0 kept", (0, 3), 1, ())]:
    case("sum", name, lambda b, s=shape, a=axis: dnnkit.sum(_x(*s), a, backend=b), *checks)
    if not name.endswith(": 0"):       # a mean over nothing is NaN by definition (NumPy's)
        case("mean", name, lambda b, s=shape, a=axis: dnnkit.mean(_x(*s), a, backend=b))
        case("mean_backward", name, lambda b, s=shape, a=axis: dnnkit.mean_backward(
            _x(*[n for i, n in enumerate(s) if a is not None and i != a]), s, a, backend=b))
case("sum_to", "small", lambda b: dnnkit.sum_to(_x(2, 3), (1, 3), backend=b))
case("sum_to", "N=0: 0", lambda b: dnnkit.sum_to(_x(0, 3), (3,), backend=b), _zeros)
case("sum_to", "C=0", lambda b: dnnkit.sum_to(_x(2, 0), (1, 0), backend=b))
case("broadcast_to", "small", lambda b: dnnkit.broadcast_to(_x(3), (2, 3), backend=b))
case("broadcast_to", "to N=0", lambda b: dnnkit.broadcast_to(_x(3), (0, 3), backend=b))
case("broadcast_to", "C=0", lambda b: dnnkit.broadcast_to(_x(1, 0), (2, 0), backend=b))
case("reshape", "small", lambda b: dnnkit.reshape(_x(2, 3), (3, 2), backend=b))
case("reshape", "empty", lambda b: dnnkit.reshape(_x(0, 3), (3, 0), backend=b))
for name, shapes in [("small", [(2, 3), (1, 3)]), ("one empty", [(0, 3), (2, 3)]),
                     ("all empty", [(0, 3), (0, 3)]), ("C=0", [(2, 0), (1, 0)])]:
    case("concatenate", name, lambda b, ss=shapes: dnnkit.concatenate(
        [_x(*s, seed=i) for i, s in enumerate(ss)], 0, backend=b))
for name, shape, parts in [("small", (4, 3), 2), ("N=0", (0, 3), 2),
                           ("a piece of 0", (4, 3), [0, 1, 3]), ("C=0", (4, 0), 2)]:
    case("split", name, lambda b, s=shape, p=parts: dnnkit.split(_x(*s), p, backend=b))
for name, index in [("slice", slice(1, 3)), ("empty slice", slice(2, 2)), ("int", 1)]:
    case("take_batch", name, lambda b, i=index: dnnkit.take_batch(_x(4, 3), i, backend=b))
case("take_batch_backward", "slice: zeros outside",
     lambda b: dnnkit.take_batch_backward(_x(2, 3), (4, 3), slice(1, 3), backend=b),
     lambda out: _zeros(out[[0, 3]]))
case("take_batch_backward", "empty slice: 0",
     lambda b: dnnkit.take_batch_backward(_x(0, 3), (4, 3), slice(2, 2), backend=b), _zeros)
case("take_batch_backward", "N=0",
     lambda b: dnnkit.take_batch_backward(_x(0, 3), (0, 3), slice(0, 0), backend=b))


# ------------------------------------------------------------- the tests

def _arrays(result):
    """The device arrays among an op's outputs, in order (None and states left out)."""
    items = result if isinstance(result, (tuple, list)) else (result,)
    return [a for a in items if a is not None and hasattr(a, "copy_to_host")]


@pytest.mark.parametrize("backend", backend_params())
@pytest.mark.parametrize("op,name,call,checks,raises", CASES,
                         ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_every_output_element_is_written(op, name, call, checks, raises, backend):
    with config.change_flags({"dnn.debug.fill_uninitialized": "nan"}):
        if raises is not None:
            with pytest.raises(raises) as ei:
                call(backend)
            assert op in str(ei.value), ei.value
            return
        try:
            result = call(backend)
        except CudnnUnavailableError as e:     # a case cuDNN has no call for: Numba's row
            if backend != "cudnn":
                raise
            pytest.skip(f"cuDNN declines {op} {name}: {e.reason}")
        outs = [a.copy_to_host() for a in _arrays(result)]
    assert outs, f"{op} {name}: no array output"
    for i, out in enumerate(outs):
        if out.dtype.kind == "f":
            assert not np.isnan(out).any(), \
                f"{op} {name}: output {i} {out.shape} has elements no kernel wrote: {out}"
    for out, check in zip(outs, checks):
        if check is not None:
            check(out)


def test_every_registered_op_has_edge_cases():
    # ops other tests register for a while (a fault injector) are not public
    public = {op for op in REGISTRY if not op.startswith(("fault_", "test_"))}
    missing = sorted(public - {c[0] for c in CASES})
    assert not missing, f"no edge-shape cases in tests/ops/test_empty.py for: {missing}"


def test_the_fill_shows_an_unwritten_element():
    """The test above can fail: an output that an implementation leaves unwritten reads as
    NaN under the flag (a stand-in op that writes all but one element)."""
    from dnnkit import arrays
    with config.change_flags({"dnn.debug.fill_uninitialized": "nan"}):
        y = arrays.cuda_empty((2, 3), F32, None)
        y[:1].copy_to_device(np.zeros((1, 3), F32))
        got = y.copy_to_host()
    assert not np.isnan(got[0]).any() and np.isnan(got[1]).all()
