"""``dnnkit.RNN``: a recurrent network (rnn_relu, rnn_tanh, lstm, gru) with one flat parameter
buffer that both backends read (docs/rnn.md). The ops under it: dnnkit.rnn_forward/backward.

    rnn = dnnkit.RNN("lstm", input_size, hidden_size, num_layers=2, bidirectional=True)
    w = dnnkit.tensor(rnn.init_params(seed=0), requires_grad=True)
    y, hy, cy = rnn.forward(w, x, training=True)     # Tensors in, Tensors out
    loss = ...; loss.backward()                      # w.grad (rnn_forward's gradient rule)

On arrays (no Tensor among the inputs) ``forward`` returns arrays and ``out.state``, and
``backward`` is the explicit call of ``rnn_backward`` -- the same op the gradient rule runs.

``proj_size`` (LSTM): h, hy and each direction's output are projected to proj_size units by
W_hr (cuDNN's projSize). ``dropout``: applied to the output of every layer but the last in a
training forward; ``forward(..., seed=, offset=)`` names the masks (seed None: fresh ones).
``algo``: cuDNN's RNN algorithm ("auto", "standard", "persist_static",
"persist_static_small_h", "persist_dynamic"; docs/rnn.md), ignored by the Numba backend.

``batch_first`` swaps the first two axes of x on the way in and of y on the way out. On
arrays it is one transpose kernel; on a Tensor that requires grad it is the time steps cut
apart (``split``) and joined along the first axis (``concatenate``), ops with gradient rules,
so the swap is differentiated too.
"""

import collections

import numpy as np

from . import arrays, ops
from .autograd import is_grad_enabled
from .ops import rnn as rnn_ops, shape as shape_ops
from .ops.rnn_common import ALGOS
from .ops.rnn_numba import transpose01
from .rnn_layout import param_layout, param_size
from .tensors import Tensor


class RNNResult(collections.namedtuple("RNNResult", "y hy cy")):
    """(y, hy, cy) of a forward pass; ``.state`` is the training state (None otherwise)."""
    state = None


class RNN:
    """mode: rnn_relu | rnn_tanh | lstm | gru; input_mode: linear | skip (no input matrix:
    input_size must equal hidden_size); x is (T, N, I), or (N, T, I) with ``batch_first``
    (y likewise); hx/hy are (num_layers*directions, N, P) and cx/cy (num_layers*directions,
    N, H), P = proj_size (LSTM, 0 < proj_size < H) or H; dropout in [0, 1) between layers
    (training forwards); algo: the cuDNN algorithm of every forward (module docstring)."""

    def __init__(self, mode, input_size, hidden_size, num_layers=1, *, bidirectional=False,
                 input_mode="linear", batch_first=False, dtype="float32", proj_size=0,
                 dropout=0.0, algo="auto", name="RNN"):
        self.cfg = rnn_ops.make_config(mode, input_size, hidden_size, num_layers,
                                       bidirectional=bidirectional, input_mode=input_mode,
                                       dtype=dtype, proj_size=proj_size, dropout=dropout,
                                       op=name)
        if not isinstance(batch_first, (bool, np.bool_)):
            raise TypeError(f"{name}: batch_first must be a bool; got {batch_first!r}")
        if not isinstance(algo, str) or algo not in ALGOS:
            raise ValueError(f"{name}: algo must be one of {', '.join(ALGOS)}; got {algo!r}")
        self.batch_first, self.algo = bool(batch_first), algo

    def __repr__(self):
        c = self.cfg
        return (f"RNN({c.mode!r}, {c.input_size}, {c.hidden_size}, {c.num_layers}, "
                f"bidirectional={c.bidirectional}, input_mode={c.input_mode!r}, "
                f"batch_first={self.batch_first}, dtype={c.dtype!r}"
                + (f", proj_size={c.proj_size}" if c.proj_size else "")
                + (f", dropout={c.dropout}" if c.dropout else "")
                + (f", algo={self.algo!r}" if self.algo != "auto" else "") + ")")

    @property
    def param_size(self):
        """Elements of the flat parameter buffer."""
        return param_size(self.cfg)

    @property
    def dtype(self):
        return np.dtype(self.cfg.dtype)

    def init_params(self, seed=0, *, stream=None):
        """A device buffer of ``param_size`` elements, uniform in [-1/sqrt(H), 1/sqrt(H)]
        (PyTorch's initialisation), from ``np.random.default_rng(seed)``."""
        from numba import cuda      # numba on first use: ``import dnnkit`` does not load it
        bound = 1.0 / np.sqrt(self.cfg.hidden_size)
        h = np.random.default_rng(seed).uniform(-bound, bound, self.param_size)
        return cuda.to_device(h.astype(self.dtype), stream=arrays.as_stream(stream))

    def split_params(self, w, layer, direction=0):
        """[(W, b), ...] for every linear layer of (layer, direction) in cuDNN's linear-layer
        order (rnn: input, recurrent; lstm: input {i, f, g, o} then recurrent {i, f, g, o};
        gru: input {r, z, n} then recurrent {r, z, n}); with proj_size, one more: (W_hr, None),
        the projection (P x H, no bias). W (H x in, row-major) and b (H,) are views into ``w``
        (no copy); W is None for the input layers of a skip layer 0."""
        c = self.cfg
        for name, v, hi in (("layer", layer, c.num_layers), ("direction", direction,
                                                               c.directions)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise TypeError(f"RNN.split_params: {name} must be an integer; got {v!r}")
            if not 0 <= v < hi:
                raise ValueError(f"RNN.split_params: {name} must be in [0, {hi}); got {v}")
        if tuple(w.shape) != (self.param_size,):
            raise ValueError(f"RNN.split_params: w must be the flat buffer of param_size = "
                             f"{self.param_size} elements; got shape {tuple(w.shape)}")
        mats, biases = {}, {}
        for l_, d, lin, kind, off, shape in param_layout(c):
            if (l_, d) == (layer, direction):
                view = w[off:off + int(np.prod(shape))].reshape(shape)
                (mats if kind == "matrix" else biases)[lin] = view
        return [(mats.get(lin), biases.get(lin)) for lin in range(c.lin_layers)]

    # ------------------------------------------------------------ passes

    def _time_major(self, a, stream):
        if a is None or not self.batch_first:
            return a
        if isinstance(a, Tensor):
            return _swap01(a, stream)
        # a device array is tested as in every other check (is_device_array first): the
        # simulator's arrays have no __cuda_array_interface__, and a non-contiguous device
        # view must be refused, not copied through the host (tests/fuzz/test_fuzz.py)
        if not (arrays.is_device_array(a) or hasattr(a, "__cuda_array_interface__")):
            h = np.asarray(a)
            return np.ascontiguousarray(h.swapaxes(0, 1)) if h.ndim == 3 else h
        d = arrays.device_input("RNN", "x", a, stream, ndim=(3,))
        return transpose01(d, stream)

    def _batch_major(self, a, stream):
        if a is None or not self.batch_first:
            return a
        if isinstance(a, Tensor):
            return _swap01(a, stream)
        return transpose01(a, stream)

    def forward(self, w, x, hx=None, cx=None, *, training=False, lengths=None, seed=None,
                offset=0, backend=None, stream=None):
        """Returns ``RNNResult(y, hy, cy)`` (unpacks as ``y, hy, cy``; cy None unless lstm)
        with ``.state`` set when ``training`` (for :meth:`backward`). ``lengths``: host ints,
        one per sequence, in [1, T], any order. ``training`` also applies the dropout between
        layers, masks ``offset*(L-1) + l`` of ``seed`` (None: fresh masks). With Tensors
        (``w``, ``x``, ``hx``, ``cx``) the outputs are Tensors and, with ``training=True``,
        the call is recorded for ``backward()`` (rnn_forward's gradient rule)."""
        s = arrays.as_stream(stream)
        y, hy, cy, state = rnn_ops.rnn_forward(self.cfg, w, self._time_major(x, s), hx, cx,
                                               lengths=lengths, training=training, seed=seed,
                                               offset=offset, algo=self.algo,
                                               backend=backend, stream=s)
        out = RNNResult(self._batch_major(y, s), hy, cy)
        out.state = state
        return out

    def backward(self, w, x, y, dy, dhy=None, dcy=None, hx=None, cx=None, *, state,
                 lengths=None, backend=None, stream=None):
        """``(dx, dhx, dcx, dw)``: gradients of sum(y*dy) + sum(hy*dhy) + sum(cy*dcy) with
        respect to x, hx, cx (dcx None unless lstm) and w (a fresh flat buffer). ``state``
        is the training forward's; the backward runs on the backend that made it unless
        ``backend`` says otherwise."""
        s = arrays.as_stream(stream)
        if backend is None and getattr(state, "backend", None) in ("numba", "cudnn"):
            backend = state.backend
        dx, dhx, dcx, dw = rnn_ops.rnn_backward(
            self.cfg, w, self._time_major(x, s), self._time_major(y, s),
            self._time_major(dy, s), dhy, dcy, hx, cx, state=state, lengths=lengths,
            backend=backend, stream=s)
        return self._batch_major(dx, s), dhx, dcx, dw


def _swap01(t, stream):
    """A Tensor (3-D) with its first two axes swapped, differentiable (module docstring)."""
    if not (t.requires_grad and is_grad_enabled()):
        return Tensor(transpose01(t.data, stream))
    a, b, f = t.shape
    steps = shape_ops.split(t, b, axis=1, stream=stream) if b > 1 else (t,)
    rows = [ops.reshape(p, (1, a, f), stream=stream) for p in steps]
    return ops.concatenate(rows, axis=0, stream=stream) if b > 1 else rows[0]
