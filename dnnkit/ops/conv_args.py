"""Argument checking and flag resolution for the convolution ops (dnnkit/ops/conv.py).

Every bad argument raises ValueError/TypeError naming the op and the value, before any
backend runs. The checked arguments become one named tuple per direction (arrays, ConvGeom,
opts, stream: ``ConvForwardArgs`` and the others below), which the backends take as their
parameters.
"""

import time
import typing

import numpy as np

from .. import arrays, config, device
from ..geometry import ConvGeom
from .args import choice, fused_activation, int_tuple, shape_tuple


class ConvForwardArgs(typing.NamedTuple):
    """The checked arguments of conv2d/conv3d. ``opts``: the resolved flags (resolve_opts)."""
    x: object
    w: object
    bias: object
    geom: ConvGeom
    opts: dict
    stream: object
    activation: object = None     # None or one of args.FUSED_ACTIVATIONS, after the bias


class ConvBackwardDataArgs(typing.NamedTuple):
    """The checked arguments of conv2d/conv3d_backward_data."""
    dy: object
    w: object
    geom: ConvGeom
    opts: dict
    stream: object


class ConvBackwardFilterArgs(typing.NamedTuple):
    """The checked arguments of conv2d/conv3d_backward_filter."""
    x: object
    dy: object
    geom: ConvGeom
    opts: dict
    stream: object


class ConvBiasArgs(typing.NamedTuple):
    """The checked arguments of conv_backward_bias."""
    dy: object
    stream: object


CHOICES = ("guess_once", "guess_on_shape_change", "time_once", "time_on_shape_change")
ALGOS = {
    "fwd": ("none", "small", "large", "fft", "fft_tiling", "winograd", "winograd_non_fused",
            "direct") + CHOICES,
    "bwd_data": ("none", "deterministic", "fft", "fft_tiling", "winograd",
                 "winograd_non_fused") + CHOICES,
    "bwd_filter": ("none", "deterministic", "fft", "small", "fft_tiling",
                   "winograd_non_fused") + CHOICES,
}
PRECISIONS = ("as_input_f32", "as_input", "float16", "float32", "float64")
# Default workspace limit: this share of the free device memory, at most WORKSPACE_CAP bytes.
WORKSPACE_SHARE, WORKSPACE_CAP = 0.25, 4 * 2**30


def _workspace(flag, value):
    """'auto', or a whole number of bytes >= 0: an int, an integral float (``1e9``) or a
    string of either. There is no "unlimited" value (inf is refused: a limit the size of the
    device's memory is the same thing, and it is explicit)."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    v = value
    if isinstance(v, str):
        try:
            v = int(v.strip())
        except ValueError:
            try:
                v = float(v.strip())
            except ValueError:
                v = None
    if isinstance(v, (float, np.floating)) and np.isfinite(v) and float(v).is_integer():
        v = int(v)
    if not isinstance(v, (int, np.integer)) or isinstance(v, (bool, np.bool_)) or v < 0:
        raise ValueError(f"flag {flag}: bad value {value!r}; allowed: 'auto' or a whole number "
                         "of bytes >= 0 (no 'unlimited': give the device's memory size)")
    return int(v)


def _bool(flag, value):
    return config.parse_bool(flag, value)


# Default: cuDNN's heuristics through the graph API, remembered per shape (PyTorch's and
# cudnn.torch's default). Theano defaulted to named legacy algorithms ("small", "none"), which
# cuDNN 9 runs through its legacy API at 60-90 us of host time per call.
config.register_flag("dnn.conv.algo_fwd", "guess_once", config.enum(*ALGOS["fwd"]),
                     "cuDNN forward algorithm or runtime choice")
config.register_flag("dnn.conv.algo_bwd_data", "guess_once",
                     config.enum(*ALGOS["bwd_data"]),
                     "cuDNN backward-data algorithm or runtime choice")
config.register_flag("dnn.conv.algo_bwd_filter", "guess_once",
                     config.enum(*ALGOS["bwd_filter"]),
                     "cuDNN backward-filter algorithm or runtime choice")
config.register_flag("dnn.conv.workspace_limit", "auto", _workspace,
                     "largest cuDNN workspace in bytes; auto: a quarter of free memory, <= 4 GiB")
config.register_flag("dnn.conv.precision", "as_input_f32", config.enum(*PRECISIONS),
                     "compute type: as_input_f32 (float16 computes in float32), as_input, float16, "
                     "float32, float64")
config.register_flag("dnn.conv.allow_tf32", False, _bool,
                     "let cuDNN use TF32 tensor cores for float32 (off: float32 means float32)")


def _padding(op, padding, kernel, dilation, nd):
    if isinstance(padding, str):
        eff = [(k - 1) * d for k, d in zip(kernel, dilation)]
        modes = {"valid": [0] * nd, "full": eff, "half": [(e + 1) // 2 for e in eff]}
        if padding not in modes:
            raise ValueError(f"{op}: padding must be an int, a tuple or one of 'valid', 'full', "
                             f"'half'; got {padding!r}")
        return tuple(modes[padding])
    return int_tuple(op, "padding", padding, nd, 0)


def _mode(op, mode):
    return choice(op, "mode", mode, ("cross", "conv")) == "conv"


def resolve_opts(op, direction, dtype, algo, precision):
    """The call's options: the algorithm, data and compute types and the flags the cuDNN
    backend reads (``direction``: "fwd", "bwd_data" or "bwd_filter")."""
    flag = {"fwd": "dnn.conv.algo_fwd", "bwd_data": "dnn.conv.algo_bwd_data",
            "bwd_filter": "dnn.conv.algo_bwd_filter"}[direction]
    if algo is None:
        algo = config.get(flag)
    else:
        choice(op, "algo", algo, ALGOS[direction])
    if precision is None:
        precision = config.get("dnn.conv.precision")
    else:
        choice(op, "precision", precision, PRECISIONS)
    name = arrays.float_name(dtype)
    compute = {"as_input_f32": "float32" if name == "float16" else name,
               "as_input": name}.get(precision, precision)
    return dict(direction=direction, algo=algo, dtype=name, compute_dtype=compute,
                allow_tf32=config.get("dnn.conv.allow_tf32"),
                deterministic=config.get("dnn.deterministic"),
                workspace=config.get("dnn.conv.workspace_limit"))


_auto = {}                   # device id -> (monotonic time, limit)
AUTO_REFRESH_S = 1.0


def workspace_limit(opts):
    """The workspace limit in bytes: 'auto' is resolved against the device's free memory,
    re-read at most once a second (the query costs more than a cached convolution call)."""
    if opts["workspace"] != "auto":
        return opts["workspace"]
    now = time.monotonic()
    dev = device.device_id()
    hit = _auto.get(dev)
    if hit is None or now - hit[0] > AUTO_REFRESH_S:
        free, _total = device.numba_cuda().current_context().get_memory_info()
        hit = _auto[dev] = (now, int(min(WORKSPACE_CAP, free * WORKSPACE_SHARE)))
    return hit[1]


_geoms = {}          # make_geom's arguments -> ConvGeom: a training loop repeats its shapes
_GEOMS_MAX = 4096


def make_geom(op, nd, x_shape, w_shape, stride, padding, dilation, groups, mode):
    """Check every geometric argument and return the ConvGeom (3-D form); valid argument
    tuples are remembered, so a repeated call skips the checks."""
    # with the types: True == 1 and 2.0 == 2 hash alike but are not valid alike
    key = (op, nd, tuple(x_shape), tuple(w_shape), mode) + tuple(
        (type(v), v) if not isinstance(v, tuple) else tuple((type(e), e) for e in v)
        for v in (stride, padding, dilation, groups))
    try:
        geom = _geoms.get(key)
    except TypeError:                       # an unhashable argument (a list): check as usual
        return _make_geom(op, nd, x_shape, w_shape, stride, padding, dilation, groups, mode)
    if geom is None:
        geom = _make_geom(op, nd, x_shape, w_shape, stride, padding, dilation, groups, mode)
        if len(_geoms) >= _GEOMS_MAX:
            _geoms.clear()
        _geoms[key] = geom
    return geom


def _make_geom(op, nd, x_shape, w_shape, stride, padding, dilation, groups, mode):
    if not isinstance(groups, (int, np.integer)) or isinstance(groups, bool) or groups < 1:
        raise ValueError(f"{op}: groups must be a positive int; got {groups!r}")
    n, c = x_shape[:2]
    k, cg = w_shape[:2]
    if 0 in tuple(w_shape[2:]):
        # PyTorch's rule too: the output size (I + 2p - d(k-1) - 1) // s + 1 of a window of
        # 0 taps would exceed the input's, a sum over no taps at positions it never reads
        raise ValueError(f"{op}: the filter window must have >= 1 tap in every spatial dim; "
                         f"w {tuple(w_shape)}")
    if c % groups or k % groups:
        raise ValueError(f"{op}: groups={groups} must divide the input channels C={c} and the "
                         f"filters K={k}")
    if cg * groups != c:
        raise ValueError(f"{op}: w has {cg} input channels per group but x has C={c} with "
                         f"groups={groups} (expected {c // groups}); w {w_shape}, x {x_shape}")
    stride = int_tuple(op, "stride", stride, nd, 1)
    dilation = int_tuple(op, "dilation", dilation, nd, 1)
    pad = _padding(op, padding, w_shape[2:], dilation, nd)
    for i, (size, kk, p, d) in enumerate(zip(x_shape[2:], w_shape[2:], pad, dilation)):
        if (kk - 1) * d + 1 > size + 2 * p:
            raise ValueError(f"{op}: the dilated kernel ({(kk - 1) * d + 1} in spatial dim {i}, "
                             f"kernel {kk}, dilation {d}) is larger than the padded input "
                             f"({size} + 2*{p}); x {x_shape}, w {w_shape}")
    lift = (1,) * (3 - nd)
    return ConvGeom(nd, tuple(x_shape[:2]) + lift + tuple(x_shape[2:]),
                    tuple(w_shape[:2]) + lift + tuple(w_shape[2:]),
                    lift + stride, (0,) * (3 - nd) + pad, lift + dilation, int(groups),
                    _mode(op, mode))


def _inputs(op, nd, stream, **named):
    s = arrays.as_stream(stream)
    out = [arrays.device_input(op, k, v, s, ndim=(nd + 2,)) for k, v in named.items()]
    first = next(iter(named))
    for k, a in zip(list(named)[1:], out[1:]):
        if a.dtype != out[0].dtype:
            raise TypeError(f"{op}: {k} has dtype {a.dtype} but {first} has {out[0].dtype}")
    return out, s


def forward_args(op, nd, x, w, bias, stride, padding, dilation, groups, mode, algo, precision,
                 stream, activation=None):
    (x, w), s = _inputs(op, nd, stream, x=x, w=w)
    geom = make_geom(op, nd, x.shape, w.shape, stride, padding, dilation, groups, mode)
    if bias is not None:
        bias = arrays.device_input(op, "bias", bias, s, ndim=(1,))
        if bias.shape[0] != w.shape[0] or bias.dtype != x.dtype:
            raise ValueError(f"{op}: bias must be ({w.shape[0]},) {x.dtype}; got "
                             f"{tuple(bias.shape)} {bias.dtype}")
    act = fused_activation(op, activation)
    return ConvForwardArgs(x, w, bias, geom, resolve_opts(op, "fwd", x.dtype, algo, precision),
                           s, act)


def backward_data_args(op, nd, dy, w, x_shape, stride, padding, dilation, groups, mode, algo,
                       precision, stream):
    (dy, w), s = _inputs(op, nd, stream, dy=dy, w=w)
    x_shape = shape_tuple(op, "x_shape", x_shape, nd + 2)
    geom = make_geom(op, nd, x_shape, w.shape, stride, padding, dilation, groups, mode)
    _expect(op, "dy", dy.shape, geom.user_shape(geom.y_shape))
    return ConvBackwardDataArgs(dy, w, geom,
                                resolve_opts(op, "bwd_data", dy.dtype, algo, precision), s)


def backward_filter_args(op, nd, x, dy, w_shape, stride, padding, dilation, groups, mode, algo,
                         precision, stream):
    (x, dy), s = _inputs(op, nd, stream, x=x, dy=dy)
    w_shape = shape_tuple(op, "w_shape", w_shape, nd + 2)
    geom = make_geom(op, nd, x.shape, w_shape, stride, padding, dilation, groups, mode)
    _expect(op, "dy", dy.shape, geom.user_shape(geom.y_shape))
    return ConvBackwardFilterArgs(x, dy, geom,
                                  resolve_opts(op, "bwd_filter", x.dtype, algo, precision), s)


def _expect(op, name, got, want):
    if tuple(got) != tuple(want):
        raise ValueError(f"{op}: {name} has shape {tuple(got)} but the convolution's output "
                         f"is {tuple(want)}")
