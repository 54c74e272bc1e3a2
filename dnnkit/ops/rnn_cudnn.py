"""The cuDNN implementations of "rnn_forward" and "rnn_backward" (contract: ops/rnn_common.py;
the cuDNN calls: cudnn/rnn.py).

Forward allocates y (T, N, D*P), hy (L*D, N, P) and (LSTM) cy (L*D, N, H) and runs
cudnnRNNForward; with ``training`` it returns a :class:`CudnnRNNState` holding cuDNN's reserve
space (with the dropout masks), which the backward hands to cudnnRNNBackwardData_v8 and
cudnnRNNBackwardWeights_v8 with the forward's descriptor (its algorithm). A state made by the
Numba backend cannot be used here (its saved gates are not cuDNN's reserve space): under
``auto`` the dispatcher then runs the Numba backward, under ``forced`` it says why.

Algorithms (``algo``, cudnnRNNAlgo_t): an explicit "persist_static", "persist_static_small_h"
or "persist_dynamic" that cuDNN refuses for the configuration and batch is a supports() reason
(under ``auto`` the dispatcher runs Numba, under ``forced`` it raises saying why): an LSTM
projection runs only on "standard"; otherwise cuDNN's own answer (cudnn_rnn.probe: the
descriptor set, the dynamic plan built, the temporary sizes asked, once per configuration,
batch and mode). "auto" runs persist_static when N <= AUTO_PERSIST_MAX_BATCH,
H <= AUTO_PERSIST_MAX_HIDDEN, there is no projection and cuDNN takes it (probed; a
NOT_SUPPORTED at the call itself also falls back), else standard; trace() records the one run.
validation/rnn_bench.py --algos times every algorithm side by side at batch 1, 4 and 16, the
measurements these thresholds stand on.

Dropout (cfg.dropout, training forwards): cuDNN's generator (cudnn/rnn_dropout.py), so the
masks differ from Numba's; call ``offset`` of a seed is reachable at offset 0 or right after
call offset - 1 on the stream, else a supports() reason. cuDNN takes p as a float32: where its
scale 1/(1 - p) is off by more than 4 ulps of the data type, cuDNN is not used (as for
dnnkit.dropout).
"""

import numpy as np

from .. import arrays, fastpath
from ..cudnn import rnn as cudnn_rnn, rnn_dropout
from ..cudnn.descriptors import INT_MAX
from ..errors import CudnnError
from ..registry import register
from ..rnn_layout import MODES
from ..tracing import note_algo
from .dropout import cudnn_scale_error
from .rnn_common import draws_masks

_DTYPES = ("float16", "float32", "float64")
# "auto": persist_static up to this batch size N and this hidden size H. Measured on an H100
# (validation/rnn_bench_algos_h100.md, T = 50, forward + backward): at N = 1 and 4 it took
# 0.29-0.71x standard's time for LSTM and GRU with H = 256 to 1024; at N = 16 it was slower
# than standard at every H (1.06-1.86x); cuDNN refuses it at H = 2048.
AUTO_PERSIST_MAX_BATCH = 4
AUTO_PERSIST_MAX_HIDDEN = 1024


class CudnnRNNState:
    """What the cuDNN backward needs: the configuration, x's shape and the lengths it was made
    for (None: all T) and the forward's reserve space and descriptors (``saved``, a
    cudnn.rnn.Saved). x's shape is ``x_shape``, not ``shape``: the dispatcher's cross-check
    compares every output that has a ``shape`` as an array."""
    backend = "cudnn"

    def __init__(self, cfg, x_shape, lengths, saved):
        self.cfg, self.x_shape, self.saved = cfg, tuple(int(s) for s in x_shape), saved
        self.lengths = None if lengths is None else np.array(lengths, np.int32)

    @property
    def algo(self):
        return self.saved.net.algo

    def memo_key(self):
        """The backward checks the state against its arguments on every call (cudnn/rnn.py);
        the signature holds what picks the backend and the runner."""
        return self.cfg, self.x_shape

    def __repr__(self):
        return (f"CudnnRNNState({self.cfg.mode}, x shape {self.x_shape}, algo {self.algo}, "
                f"{self.saved.reserve_bytes}-byte reserve space)")


fastpath.carried_type(CudnnRNNState)


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
    return size_reason(cfg, T, N)


def size_reason(cfg, T, N):
    """Why cuDNN's 32-bit sizes cannot describe this problem, or None (pure)."""
    D, H, L, P = cfg.directions, cfg.hidden_size, cfg.num_layers, cfg.out_size
    counts = {"x": T * N * cfg.input_size, "y": T * N * D * P, "hx": L * D * N * H,
              "a layer's gates": cfg.gates * H * max(cfg.input_size, D * P)}
    for name, n in counts.items():
        if n > INT_MAX:
            return (f"{name} has {n} elements; cuDNN's RNN describes tensors with 32-bit "
                    "integers (at most 2**31 - 1)")
    return None


def _dropout_reason(cfg, x, training, seed, offset, stream):
    if not (training and cfg.dropout > 0 and cfg.num_layers > 1):
        return None
    err, eps = cudnn_scale_error(cfg.dropout), float(np.finfo(x.dtype).eps)
    if err > 4 * eps:
        return (f"cuDNN takes the dropout p as a float32: its scale 1/(1 - p) for p = "
                f"{cfg.dropout!r} is off by {err:.1e} relative, more than {x.dtype}'s "
                f"precision allows ({4 * eps:.1e})")
    return rnn_dropout.reachable(cfg.dropout, seed, offset, stream)


def algo_reason(cfg, algo, x, lengths, training, stream):
    """Why cuDNN cannot run the explicit ``algo`` here, or None ("auto" and "standard": None)."""
    if algo in ("auto", "standard"):
        return None
    if cfg.proj_size:
        return (f"cuDNN runs an LSTM projection (proj_size {cfg.proj_size}) only with the "
                f"standard algorithm; got algo {algo!r}")
    return cudnn_rnn.probe(cfg, algo, int(x.shape[0]), int(x.shape[1]), lengths, training,
                           stream)


def auto_algo(cfg, x, lengths, training, stream):
    """The algorithm "auto" runs (module docstring)."""
    if cfg.proj_size or int(x.shape[1]) > AUTO_PERSIST_MAX_BATCH or \
            cfg.hidden_size > AUTO_PERSIST_MAX_HIDDEN:
        return "standard"
    why = algo_reason(cfg, "persist_static", x, lengths, training, stream)
    return "standard" if why else "persist_static"


def _supports_forward(cfg, w, x, hx, cx, lengths, training, seed, offset, algo, stream):
    return (_reason(cfg, x, lengths) or _dropout_reason(cfg, x, training, seed, offset, stream)
            or algo_reason(cfg, algo, x, lengths, training, stream))


def _supports_backward(cfg, w, x, y, dy, dhy, dcy, hx, cx, lengths, state, stream):
    backend = getattr(state, "backend", None)
    if backend != "cudnn":
        return (f"the state was made by the {backend} backend; cuDNN's backward needs the "
                "reserve space of its own training forward")
    return _reason(cfg, x, lengths)


def _state_shape(cfg, N, width=None):
    return (cfg.num_layers * cfg.directions, N, width or cfg.hidden_size)


@register("rnn_forward", "cudnn", supports=_supports_forward, crosscheck_skip=draws_masks)
def _forward_cudnn(cfg, w, x, hx, cx, lengths, training, seed, offset, algo, stream):
    T, N = int(x.shape[0]), int(x.shape[1])
    y = arrays.cuda_empty((T, N, cfg.directions * cfg.out_size), x.dtype, stream)
    hy = arrays.cuda_empty(_state_shape(cfg, N, cfg.out_size), x.dtype, stream)
    cy = arrays.cuda_empty(_state_shape(cfg, N), x.dtype, stream) if cfg.mode == "lstm" \
        else None
    chosen = auto_algo(cfg, x, lengths, training, stream) if algo == "auto" else algo
    args = (cfg, w, x, hx, cx if cfg.mode == "lstm" else None, y, hy, cy, lengths,
            bool(training), stream)
    try:
        saved = cudnn_rnn.forward(*args, algo=chosen, seed=seed, offset=offset)
    except CudnnError as e:
        if algo != "auto" or chosen == "standard" or not e.not_supported:
            raise
        chosen = "standard"      # "auto" takes a persistent kernel only where cuDNN runs it
        saved = cudnn_rnn.forward(*args, algo=chosen, seed=seed, offset=offset)
    note_algo(chosen)
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
    dhx = arrays.cuda_empty(_state_shape(cfg, x.shape[1], cfg.out_size), x.dtype, stream)
    dcx = arrays.cuda_empty(_state_shape(cfg, x.shape[1]), x.dtype, stream) if lstm else None
    dw = arrays.cuda_empty((w.size,), w.dtype, stream)
    cudnn_rnn.backward(cfg, w, x, y, dy, dhy, dcy if lstm else None, hx,
                       cx if lstm else None, dx, dhx, dcx, dw, state.saved, stream)
    note_algo(state.algo)
    return dx, dhx, dcx, dw
