"""Recurrent networks: rnn_relu, rnn_tanh, lstm, gru; multi-layer, bidirectional, variable
lengths, forward and backward (docs/rnn.md). Most users want the ``dnnkit.RNN`` class
(dnnkit/recurrent.py); these are the ops under it, time-major.

    rnn:   h' = act(W x + b_W + R h + b_R)                        act = relu | tanh
    lstm:  i, f, o = sigmoid(W_* x + b_W* + R_* h + b_R*),  g = tanh(W_g x + b_Wg + R_g h + b_Rg)
           c' = f*c + i*g,  h' = o*tanh(c')        (proj_size P: h' = W_hr (o*tanh(c')), P wide)
    gru:   r, z = sigmoid(W_* x + b_W* + R_* h + b_R*)
           n = tanh(W_n x + b_Wn + r*(R_n h + b_Rn)),  h' = (1 - z)*n + z*h   ("reset after")

One flat parameter buffer in cuDNN's weight-space order (rnn_layout.param_layout) serves both
backends. Dropout between layers (cfg.dropout, training forwards only): layer l's output is
dropped with mask ``offset*(L-1) + l`` of ``seed`` before layer l + 1 reads it (Numba: exactly
dnnkit.dropout's mask of that offset; cuDNN: its RNN's own dropout generator, restored at
offset 0 and advanced by each training forward). ``algo`` picks cuDNN's RNN algorithm
(ops/rnn_cudnn.py); the Numba path has one and says so in trace(). Backends: Numba (dnnkit/ops/rnn_numba.py) and cuDNN (dnnkit/ops/rnn_cudnn.py).
A training forward returns a state that only the backend which made it can use.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .. import arrays, fastpath, reference
from ..autograd import gradient
from ..dispatch import public_op
from ..hints import ArrayLike, Backend, Lengths, Stream
from ..rnn_layout import INPUT_MODES, MODES, RNNConfig, param_size
from . import rnn_numba  # noqa: F401 - registers the Numba implementations
# (the cuDNN ones: dnnkit/ops/rnn_cudnn.py, imported by dnnkit/ops/__init__.py)
from .rnn_common import ALGOS, RNNBackwardArgs, RNNForwardArgs

def _positive_int(op, name, v):
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"{op}: {name} must be an integer; got {v!r}")
    if v < 1:
        raise ValueError(f"{op}: {name} must be >= 1; got {v}")
    if v >= 2**31:      # cuDNN's RNN descriptor holds it as an int32 (both backends share it)
        raise ValueError(f"{op}: {name} must be < 2**31; got {v}")
    return int(v)


def _check_proj(op, mode, proj_size, hidden_size):
    if isinstance(proj_size, bool) or not isinstance(proj_size, (int, np.integer)):
        raise TypeError(f"{op}: proj_size must be an integer; got {proj_size!r}")
    if proj_size and mode != "lstm":
        raise ValueError(f"{op}: proj_size is an LSTM option (a projection of h); mode "
                         f"{mode!r} has none (got proj_size={proj_size})")
    if not 0 <= proj_size < hidden_size:
        raise ValueError(f"{op}: proj_size must be in [0, hidden_size={hidden_size}) (0: no "
                         f"projection); got {proj_size}")
    return int(proj_size)


def _check_dropout(op, p):
    if isinstance(p, bool) or not isinstance(p, (int, float, np.integer, np.floating)):
        raise TypeError(f"{op}: dropout must be a number in [0, 1); got {p!r}")
    if not 0.0 <= float(p) < 1.0:
        raise ValueError(f"{op}: dropout must be in [0, 1); got {p!r}")
    return float(p)


def make_config(mode, input_size, hidden_size, num_layers=1, *, bidirectional=False,
                input_mode="linear", dtype="float32", proj_size=0, dropout=0.0, op="RNN"):
    """A validated RNNConfig (ValueError/TypeError naming ``op`` and the value)."""
    if mode not in MODES:
        raise ValueError(f"{op}: mode must be one of {', '.join(MODES)}; got {mode!r}")
    if input_mode not in INPUT_MODES:
        raise ValueError(f"{op}: input_mode must be one of {', '.join(INPUT_MODES)}; "
                         f"got {input_mode!r}")
    i = _positive_int(op, "input_size", input_size)
    h = _positive_int(op, "hidden_size", hidden_size)
    layers = _positive_int(op, "num_layers", num_layers)
    if not isinstance(bidirectional, (bool, np.bool_)):
        raise TypeError(f"{op}: bidirectional must be a bool; got {bidirectional!r}")
    if input_mode == "skip" and i != h:
        raise ValueError(f"{op}: input_mode 'skip' adds the input to the gates as it is, so "
                         f"input_size must equal hidden_size; got {i} and {h}")
    name = arrays.float_name(dtype) if isinstance(dtype, (str, np.dtype, type)) else None
    if name is None:
        raise TypeError(f"{op}: dtype must be one of {', '.join(arrays.FLOAT_DTYPES)}; "
                        f"got {dtype!r}")
    proj = _check_proj(op, mode, proj_size, h)
    return RNNConfig(mode, i, h, layers, bool(bidirectional), input_mode, name, proj,
                     _check_dropout(op, dropout))


def _check_cfg(op, cfg):
    if not isinstance(cfg, RNNConfig):
        raise TypeError(f"{op}: cfg must be an RNNConfig (see dnnkit.RNN); got "
                        f"{type(cfg).__name__}")
    return make_config(cfg.mode, cfg.input_size, cfg.hidden_size, cfg.num_layers,
                       bidirectional=cfg.bidirectional, input_mode=cfg.input_mode,
                       dtype=cfg.dtype, proj_size=cfg.proj_size, dropout=cfg.dropout, op=op)


def _check_lengths(op, lengths, t, n):
    if lengths is None:
        return None
    if arrays.is_device_array(lengths) or hasattr(lengths, "__cuda_array_interface__"):
        raise TypeError(f"{op}: lengths must be host integers (a list or NumPy array), not a "
                        "device array")
    a = np.asarray(lengths)
    if a.dtype.kind not in "iu":
        raise TypeError(f"{op}: lengths must be integers; got dtype {a.dtype}")
    if a.shape != (n,):
        raise ValueError(f"{op}: lengths must have one entry per sequence, shape ({n},); got "
                         f"shape {a.shape}")
    if n and (a.min() < 1 or a.max() > t):
        raise ValueError(f"{op}: lengths must be in [1, T={t}]; got min {a.min()}, max "
                         f"{a.max()}")
    return a.astype(np.int32)


def _state_input(op, name, a, shape, dtype, s):
    if a is None:
        return None
    a = arrays.device_input(op, name, a, s)
    if tuple(a.shape) != shape:
        width = "P" if name in ("hx", "dhy") else "H"      # P: proj_size, or H
        raise ValueError(f"{op}: {name} must have shape (layers*directions, N, {width}) = "
                         f"{shape}; got {tuple(a.shape)}")
    if a.dtype != dtype:
        raise TypeError(f"{op}: {name} has dtype {a.dtype} but x has {dtype}")
    return a


def _inputs(op, cfg, w, x, hx, cx, s):
    """Validated (w, x, hx, cx) device arrays."""
    x = arrays.device_input(op, "x", x, s, ndim=(3,))
    t, n, i = x.shape
    if i != cfg.input_size:
        raise ValueError(f"{op}: x must be (T, N, input_size={cfg.input_size}); got shape "
                         f"{tuple(x.shape)}")
    if t < 1 or n < 1:
        raise ValueError(f"{op}: x needs at least one step and one sequence; got shape "
                         f"{tuple(x.shape)}")
    if np.dtype(x.dtype).name != cfg.dtype:
        raise TypeError(f"{op}: x has dtype {x.dtype} but the RNN's dtype is {cfg.dtype}")
    w = arrays.device_input(op, "w", w, s, ndim=(1,))
    if w.shape[0] != param_size(cfg):
        raise ValueError(f"{op}: w must be the flat parameter buffer of param_size = "
                         f"{param_size(cfg)} elements; got shape {tuple(w.shape)}")
    if w.dtype != x.dtype:
        raise TypeError(f"{op}: w has dtype {w.dtype} but x has {x.dtype}")
    shape = (cfg.num_layers * cfg.directions, n, cfg.hidden_size)
    hx = _state_input(op, "hx", hx, shape[:2] + (cfg.out_size,), x.dtype, s)
    if cx is not None and cfg.mode != "lstm":
        raise ValueError(f"{op}: cx is the lstm cell state; mode {cfg.mode!r} has none")
    cx = _state_input(op, "cx", cx, shape, x.dtype, s)
    return w, x, hx, cx


def _check_seed(op, seed, offset):
    if seed is not None:
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise TypeError(f"{op}: seed must be an integer or None; got {seed!r}")
        if not 0 <= seed < 2**64:
            raise ValueError(f"{op}: seed must be in [0, 2**64); got {seed}")
    if isinstance(offset, bool) or not isinstance(offset, (int, np.integer)):
        raise TypeError(f"{op}: offset must be an integer; got {offset!r}")
    if not 0 <= offset < 2**63:
        raise ValueError(f"{op}: offset must be in [0, 2**63); got {offset}")
    if offset and seed is None:
        raise ValueError(f"{op}: offset {offset} names a call of a seed's mask sequence; pass "
                         "the seed too")
    return None if seed is None else int(seed), int(offset)


# an RNNConfig is a frozen value: calls with one memoise (dnnkit/fastpath.py)
fastpath.value_type(RNNConfig)


def _memoisable_forward(args, kw):
    """A training forward with an explicit dropout seed is not memoised: whether cuDNN can
    start its masks at ``offset`` depends on the calls before (cudnn/rnn_dropout.py), a check
    the full path makes on every call. seed None (fresh masks) and inference calls are."""
    return not (kw.get("training") and kw.get("seed") is not None)


@public_op("rnn_forward", memo=_memoisable_forward)
def rnn_forward(cfg: RNNConfig, w: ArrayLike, x: ArrayLike, hx: ArrayLike | None = None,
                cx: ArrayLike | None = None, *, lengths: Lengths = None, training: bool = False,
                seed: int | None = None, offset: int = 0, algo: str = "auto",
                stream: Stream = None, backend: Backend | None = None) -> RNNForwardArgs:
    """Run the RNN ``cfg`` over x (T, N, input_size), time-major; returns ``(y, hy, cy, state)``.

    y (T, N, D*P), hy (layers*D, N, P) and cy (layers*D, N, H) with D = 2 when bidirectional
    and P = cfg.proj_size or H; cy None unless lstm; state None unless ``training`` (then pass
    it to :func:`rnn_backward`). ``cfg``: an RNNConfig (``dnnkit.RNN`` makes one): mode
    "rnn_relu", "rnn_tanh", "lstm" or "gru"; input_mode "linear" or "skip"; proj_size (lstm);
    dropout between layers. ``w``: the flat parameter buffer (one layout for both backends).
    ``hx``, ``cx``: initial states or None (zeros); cx only for lstm. ``lengths``: None (every
    sequence T steps) or host ints in [1, T], any order: outputs past a sequence's end are
    zero and hy/cy its state at its last step. ``training``: False (default) or True (keeps
    the state for the backward and applies cfg.dropout). ``seed``, ``offset``: the dropout
    masks (layer l: mask offset*(L-1) + l of the seed; seed None: fresh masks each call).
    ``algo``: cuDNN's RNN algorithm, "auto" (default), "standard", "persist_static",
    "persist_static_small_h" or "persist_dynamic" (docs/rnn.md; Numba has one algorithm).
    Raises TypeError for a cfg that is not an RNNConfig, a non-bool training, non-integer lengths,
    seed or offset, or mixed dtypes; ValueError for shapes that do not match cfg, lengths, seed
    or offset out of range, or an unknown algo."""
    op = "rnn_forward"
    cfg = _check_cfg(op, cfg)
    if not isinstance(training, (bool, np.bool_)):
        raise TypeError(f"{op}: training must be a bool; got {training!r}")
    if not isinstance(algo, str) or algo not in ALGOS:
        raise ValueError(f"{op}: algo must be one of {', '.join(ALGOS)}; got {algo!r}")
    seed, offset = _check_seed(op, seed, offset)
    s = arrays.as_stream(stream)
    w, x, hx, cx = _inputs(op, cfg, w, x, hx, cx, s)
    lengths = _check_lengths(op, lengths, x.shape[0], x.shape[1])
    return RNNForwardArgs(cfg, w, x, hx, cx, lengths, bool(training), seed, offset, algo, s)


@public_op("rnn_backward")
def rnn_backward(cfg: RNNConfig, w: ArrayLike, x: ArrayLike, y: ArrayLike, dy: ArrayLike,
                 dhy: ArrayLike | None = None, dcy: ArrayLike | None = None,
                 hx: ArrayLike | None = None, cx: ArrayLike | None = None, *, state: object,
                 lengths: Lengths = None, stream: Stream = None,
                 backend: Backend | None = None) -> RNNBackwardArgs:
    """Gradients of :func:`rnn_forward` (run with ``training=True`` and the same arguments):
    returns ``(dx, dhx, dcx, dw)``, dw a fresh flat buffer in the parameter layout (nothing is
    accumulated), dcx None unless lstm.

    y, dy: (T, N, D*P); ``dhy``, ``dcy``: gradients of hy (layers*D, N, P) and cy (layers*D,
    N, H), or None (zeros), dcy only for lstm. ``state``: the forward's (with its dropout masks
    and algorithm); only the backend that made it can use it. ``cfg`` (mode "rnn_relu",
    "rnn_tanh", "lstm" or "gru"), ``w``, ``x``, ``hx``, ``cx`` and ``lengths`` as in the
    forward call.
    Raises TypeError for a missing or foreign state, a cfg that is not an RNNConfig or mixed
    dtypes; ValueError for shapes that do not match cfg or lengths out of range."""
    op = "rnn_backward"
    cfg = _check_cfg(op, cfg)
    if state is None or not hasattr(state, "backend"):
        raise TypeError(f"{op}: state must be the state returned by rnn_forward(..., "
                        f"training=True); got {type(state).__name__}")
    s = arrays.as_stream(stream)
    w, x, hx, cx = _inputs(op, cfg, w, x, hx, cx, s)
    t, n, _ = x.shape
    yshape = (t, n, cfg.directions * cfg.out_size)
    y = arrays.device_input(op, "y", y, s, ndim=(3,))
    dy = arrays.device_input(op, "dy", dy, s, ndim=(3,))
    for name, a in (("y", y), ("dy", dy)):
        if tuple(a.shape) != yshape:
            raise ValueError(f"{op}: {name} must have shape (T, N, D*P) = {yshape}; got "
                             f"{tuple(a.shape)}")
        if a.dtype != x.dtype:
            raise TypeError(f"{op}: {name} has dtype {a.dtype} but x has {x.dtype}")
    shape = (cfg.num_layers * cfg.directions, n, cfg.hidden_size)
    dhy = _state_input(op, "dhy", dhy, shape[:2] + (cfg.out_size,), x.dtype, s)
    if dcy is not None and cfg.mode != "lstm":
        raise ValueError(f"{op}: dcy is the lstm cell state's gradient; mode {cfg.mode!r} "
                         "has none")
    dcy = _state_input(op, "dcy", dcy, shape, x.dtype, s)
    lengths = _check_lengths(op, lengths, t, n)
    return RNNBackwardArgs(cfg, w, x, y, dy, dhy, dcy, hx, cx, lengths, state, s)


# ---------------------------------------------------------------- python -m dnnkit check

def selfcheck_cases(Case):
    rows = []
    for mode in MODES:
        small = make_config(mode, 3, 4, 2, bidirectional=True)
        # big: sized for the float64 reference (a per-sequence NumPy loop) to take seconds;
        # validation/rnn_bench.py times the benchmark shapes
        big = make_config(mode, 256, 256, 2, bidirectional=True)
        shapes = {False: (small, 3, 2), True: (big, 20, 16)}

        def make(rng, dtype, is_big, shapes=shapes):
            c, t, n = shapes[is_big]
            h = c.hidden_size
            x = rng.standard_normal((t, n, c.input_size)).astype(dtype)
            w = (rng.uniform(-1, 1, param_size(c)) / np.sqrt(h)).astype(dtype)
            dy = rng.standard_normal((t, n, c.directions * h)).astype(dtype)
            return x, w, dy

        def cfg_of(i, shapes=shapes):
            big_ = i[0].shape[2] != shapes[False][0].input_size
            c = shapes[big_][0]
            return dataclasses.replace(c, dtype=np.dtype(i[0].dtype).name)

        # cfg_of is bound as a default: a plain closure would see the last mode's (the loop's)
        def run_fwd(backend, stream, i, cfg_of=cfg_of):
            return _Outputs(rnn_forward(cfg_of(i), i[1], i[0], backend=backend,
                                        stream=stream)[:3])

        def run_bwd(backend, stream, i, cfg_of=cfg_of):
            c = cfg_of(i)
            y, _, _, st = rnn_forward(c, i[1], i[0], training=True, backend=backend,
                                      stream=stream)
            return _Outputs(rnn_backward(c, i[1], i[0], y, i[2], state=st, backend=backend,
                                         stream=stream))

        def ref_fwd(i, cfg_of=cfg_of):
            return _concat(reference.rnn_forward(cfg_of(i), i[1], i[0])[:3])

        def ref_bwd(i, cfg_of=cfg_of):
            return _concat(reference.rnn_backward(cfg_of(i), i[1], i[0], i[2]))

        rows.append(Case("rnn_forward", f"{mode} 2x bidir", run_fwd, ref_fwd, make))
        rows.append(Case("rnn_backward", f"{mode} 2x bidir", run_bwd, ref_bwd, make))
    return rows


def _concat(outs):
    return np.concatenate([np.asarray(arrays.to_host(o), np.float64).ravel()
                           for o in outs if o is not None])


class _Outputs:
    """Several outputs as one flat host array (selfcheck compares one array per case)."""

    def __init__(self, outs):
        self.outs = outs

    def copy_to_host(self):
        return _concat(self.outs)


# ---------------------------------------------------------------- autograd

@gradient("rnn_forward", outputs=(0, 1, 2), inputs=("w", "x", "hx", "cx"))
def _rnn_grad(g, dy, dhy, dcy):
    y, _, _, state = g.out
    if state is None:
        raise RuntimeError("rnn_forward: to differentiate it, call it with training=True (the "
                           "backward needs the forward's training state)")
    if dy is None:           # only hy / cy reached the loss: y's gradient is zero
        s = arrays.as_stream(g.stream)
        dy = arrays.zero_fill(arrays.empty_like(y, s), s)
    dx, dhx, dcx, dw = rnn_backward(g.cfg, g.w, g.x, y, dy, dhy, dcy, g.hx, g.cx, state=state,
                                    lengths=g.lengths, backend=g.backend, stream=g.stream)
    return {"x": dx, "hx": dhx, "cx": dcx, "w": dw}
