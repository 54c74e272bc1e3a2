"""The cuDNN implementations of "rnn_forward" and "rnn_backward" (contract: ops/rnn_common.py;
the cuDNN calls: cudnn/rnn.py).

Forward allocates y (T, N, D*H), hy and (LSTM) cy and runs cudnnRNNForward; with
``training`` it returns a :class:`CudnnRNNState` holding cuDNN's reserve space, which the
backward hands to cudnnRNNBackwardData_v8 and cudnnRNNBackwardWeights_v8. A state made by the
Numba backend cannot be used here (its saved gates are not cuDNN's reserve space): under
``auto`` the dispatcher then runs the Numba backward, under ``forced`` it says why.
"""

import numpy as np

from .. import arrays
from ..cudnn import rnn as cudnn_rnn
from ..registry import register
from ..rnn_layout import MODES
from ..tracing import note_algo

_DTYPES = ("float16", "float32", "float64")


class CudnnRNNState:
    """What the cuDNN backward needs: the configuration, x's shape and the lengths it was made
    for (None: all T) and the forward's reserve space and descriptors (``saved``, a
    cudnn.rnn.Saved). x's shape is ``x_shape``, not ``shape``: the dispatcher's cross-check
    compares every output that has a ``shape`` as an array."""
    backend = "cudnn"

    def __init__(self, cfg, x_shape, lengths, saved):
        self.cfg, self.x_shape, self.saved = cfg, tuple(int(s) for s in x_shape), saved
        self.lengths = None if lengths is None else np.array(lengths, np.int32)

    def __repr__(self):
        return (f"CudnnRNNState({self.cfg.mode}, x shape {self.x_shape}, "
                f"{self.saved.reserve_bytes}-byte reserve space)")


def _same_lengths(a, b, t):
    """Equal as batches: None is every sequence at its full length T."""
    if a is None and b is None:
        return True
    n = len(b if a is None else a)
    a = np.full(n, t) if a is None else np.asarray(a)
    b = np.full(n, t) if b is None else np.asarray(b)
    return a.shape == b.shape and np.array_equal(a, b)


def _reason(cfg, x, lengths):
    """Why cuDNN cannot run this configuration and batch, or None (pure)."""
    dt = arrays.float_name(x.dtype)
    if dt not in _DTYPES:
        return f"data type {x.dtype} (cuDNN RNNs take {', '.join(_DTYPES)})"
    if cfg.mode not in MODES:
        return f"mode {cfg.mode!r} (cuDNN RNNs: {', '.join(MODES)})"
    T, N = int(x.shape[0]), int(x.shape[1])
    if T == 0 or N == 0:
        return f"x {tuple(x.shape)} is empty (cuDNN RNNs need T >= 1 and N >= 1)"
    if cfg.input_mode == "skip" and cfg.input_size != cfg.hidden_size:
        return (f"skip input needs input_size == hidden_size; got {cfg.input_size} and "
                f"{cfg.hidden_size}")
    if lengths is not None:
        ln = np.asarray(lengths)
        if ln.size and (ln.min() < 1 or ln.max() > T):
            return f"sequence lengths must be in [1, T={T}]; got {ln.min()}..{ln.max()}"
    return cudnn_rnn.size_reason(cfg, T, N)


def _supports_forward(cfg, w, x, hx, cx, lengths, training, stream):
    return _reason(cfg, x, lengths)


def _supports_backward(cfg, w, x, y, dy, dhy, dcy, hx, cx, lengths, state, stream):
    backend = getattr(state, "backend", None)
    if backend != "cudnn":
        return (f"the state was made by the {backend} backend; cuDNN's backward needs the "
                "reserve space of its own training forward")
    return _reason(cfg, x, lengths)


def _state_shape(cfg, N):
    return (cfg.num_layers * cfg.directions, N, cfg.hidden_size)


@register("rnn_forward", "cudnn", supports=_supports_forward)
def _forward_cudnn(cfg, w, x, hx, cx, lengths, training, stream):
    T, N = int(x.shape[0]), int(x.shape[1])
    y = arrays.cuda_empty((T, N, cfg.directions * cfg.hidden_size), x.dtype, stream)
    hy = arrays.cuda_empty(_state_shape(cfg, N), x.dtype, stream)
    cy = arrays.cuda_empty(_state_shape(cfg, N), x.dtype, stream) if cfg.mode == "lstm" \
        else None
    saved = cudnn_rnn.forward(cfg, w, x, hx, cx if cfg.mode == "lstm" else None, y, hy, cy,
                              lengths, bool(training), stream)
    note_algo("standard")
    state = CudnnRNNState(cfg, x.shape, lengths, saved) if training else None
    return y, hy, cy, state


def _check_state(cfg, x, lengths, state):
    """The public rnn_backward checks the same; the implementation may be called directly."""
    op = "rnn_backward"
    if not isinstance(state, CudnnRNNState):
        raise TypeError(f"{op}: the cuDNN backward needs the state of a cuDNN training forward "
                        f"(forward(..., training=True)); got {type(state).__name__}")
    if state.cfg != cfg or state.x_shape != tuple(x.shape):
        raise ValueError(f"{op}: the state is from a forward of {state.cfg} with x of shape "
                         f"{state.x_shape}; this backward has {cfg} with x {tuple(x.shape)}")
    if not _same_lengths(state.lengths, lengths, state.x_shape[0]):
        raise ValueError(f"{op}: lengths differ from the forward's "
                         f"({None if state.lengths is None else state.lengths.tolist()})")


@register("rnn_backward", "cudnn", supports=_supports_backward, crosscheck=False)
def _backward_cudnn(cfg, w, x, y, dy, dhy, dcy, hx, cx, lengths, state, stream):
    _check_state(cfg, x, lengths, state)
    lstm = cfg.mode == "lstm"
    dx = arrays.empty_like(x, stream)
    dhx = arrays.cuda_empty(_state_shape(cfg, x.shape[1]), x.dtype, stream)
    dcx = arrays.cuda_empty(_state_shape(cfg, x.shape[1]), x.dtype, stream) if lstm else None
    dw = arrays.cuda_empty((w.size,), w.dtype, stream)
    cudnn_rnn.backward(cfg, w, x, y, dy, dhy, dcy if lstm else None, hx,
                       cx if lstm else None, dx, dhx, dcx, dw, state.saved, stream)
    note_algo("standard")
    return dx, dhx, dcx, dw
