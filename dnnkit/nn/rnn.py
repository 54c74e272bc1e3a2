"""Recurrent layers: ``dnnkit.RNN`` as modules, with PyTorch's state-dict names.

The parameters are one flat Parameter, ``weight``, in cuDNN's layout (docs/rnn.md), which both
backends read and rnn_forward's gradient rule differentiates as a whole. The state dict maps
it to and from PyTorch's per-layer tensors, for layer k and suffix "" or "_reverse":

    weight_ih_l{k}{suffix}  (G*H, I_k)   the G input matrices stacked in gate order
    weight_hh_l{k}{suffix}  (G*H, H)     the G recurrent matrices
    bias_ih_l{k}{suffix}    (G*H,)       bias_hh_l{k}{suffix}  (G*H,)

    weight_hr_l{k}{suffix}  (P, H)       LSTM with proj_size P: the projection (no bias);
                                         weight_hh is then (G*H, P), I_k = D*P above layer 0

with G = 4 for LSTM (gates i, f, g, o: cuDNN's linear-layer order is PyTorch's), 3 for GRU (r,
z, n, both with the reset gate applied after the recurrent matrix: PyTorch's GRU), 1 for RNN.
In the flat buffer the G input matrices of one (layer, direction) are consecutive (each
(H, I_k) row-major), so PyTorch's stacked (G*H, I_k) matrix is one contiguous piece of it;
the same holds for the recurrent matrices and each bias group (rnn_layout.param_layout).
With ``input_mode="skip"`` layer 0 has no input matrices and no ``weight_ih_l0``.

``dropout=p``: in training mode (``module.train()``) every layer's output but the last is
dropped with probability p (cuDNN's or Numba's masks: docs/rnn.md); in eval mode none is.
``dropout_seed``: the k-th training call draws call k of the seed's masks (reproducible runs);
None draws fresh masks on every call. ``algo``: cuDNN's RNN algorithm (docs/rnn.md).
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from .. import recurrent
from ..autograd import is_grad_enabled
from ..hints import ArrayLike, DType, Lengths
from ..tensors import Tensor
from ..rnn_layout import param_layout
from . import checks
from .checks import as_input
from .module import Module, Slot
from .parameter import Parameter


def pytorch_layout(cfg):
    """[(PyTorch name, offset, shape)] of ``cfg``'s flat buffer (module docstring), in
    PyTorch's order: per layer and direction weight_ih, weight_hh, bias_ih, bias_hh."""
    g = cfg.gates
    groups = {}         # (layer, direction, name stem) -> [(offset, shape), ...]
    for layer, d, lin, kind, off, shape in param_layout(cfg):
        stem = ("weight" if kind == "matrix" else "bias") + \
            ("_ih" if lin < g else "_hh" if lin < 2 * g else "_hr")
        groups.setdefault((layer, d, stem), []).append((off, shape))
    out = []
    for layer in range(cfg.num_layers):
        for d in range(cfg.directions):
            for stem in ("weight_ih", "weight_hh", "bias_ih", "bias_hh", "weight_hr"):
                parts = groups.get((layer, d, stem))
                if parts is None:           # skip input (no weight_ih_l0); no projection
                    continue
                off0, shape0 = parts[0]
                size = shape0[0] * (shape0[1] if len(shape0) == 2 else 1)
                if any(off != off0 + i * size for i, (off, _) in enumerate(parts)):
                    raise RuntimeError(f"rnn_layout: the {stem} pieces of layer {layer} "
                                       f"direction {d} are not consecutive, which the PyTorch "
                                       f"mapping needs")
                out.append((f"{stem}_l{layer}" + ("_reverse" if d else ""), off0,
                             (len(parts) * shape0[0],) + tuple(shape0[1:])))
    return out


class _Recurrent(Module):
    """``forward(x, hx=None, cx=None, *, lengths=None)`` returns y ((T, N, D*P), or (N, T,
    D*P) with ``batch_first``; P = proj_size or H) and keeps the final states in ``self.hy``
    (layers*D, N, P) / ``self.cy`` (layers*D, N, H) (Tensors; cy None unless LSTM), so a
    truncated-backpropagation loop can pass them, detached, to the next call."""
    mode = "lstm"

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, *,
                 bidirectional: bool = False, batch_first: bool = False,
                 input_mode: str = "linear", dtype: DType = "float32", seed: int | None = 0,
                 proj_size: int = 0, dropout: float = 0.0, dropout_seed: int | None = None,
                 algo: str = "auto", _mode: str | None = None) -> None:
        super().__init__()
        cls = type(self).__name__
        self.mode = _mode or self.mode
        self.rnn = recurrent.RNN(self.mode, input_size, hidden_size, num_layers,
                                 bidirectional=bidirectional, input_mode=input_mode,
                                 batch_first=batch_first, dtype=dtype, proj_size=proj_size,
                                 dropout=dropout, algo=algo, name=cls)
        # eval mode: the same network without dropout (one layout: w serves both)
        self._eval_rnn = copy.copy(self.rnn)
        self._eval_rnn.cfg = dataclasses.replace(self.rnn.cfg, dropout=0.0)
        self.dropout_seed = None if dropout_seed is None else \
            checks.integer(cls, "dropout_seed", dropout_seed, 0)
        self._calls = 0
        self.weight = Parameter(self.rnn.init_params(seed=checks.seed(cls, seed) or 0))
        self.hy: Tensor | None = None
        self.cy: Tensor | None = None

    def extra_repr(self) -> str:
        c = self.rnn.cfg
        s = f"{c.input_size}, {c.hidden_size}, num_layers={c.num_layers}"
        if c.bidirectional:
            s += ", bidirectional=True"
        if self.rnn.batch_first:
            s += ", batch_first=True"
        if c.proj_size:
            s += f", proj_size={c.proj_size}"
        if c.dropout:
            s += f", dropout={c.dropout}"
        return s

    def _state_slots(self):
        w = self.weight

        def slot(off, shape):
            n = 1
            for v in shape:
                n *= v

            def read():
                return w.data[off:off + n].copy_to_host().reshape(shape)

            def write(h):
                w.data[off:off + n].copy_to_device(h.reshape(-1).copy())
                w.bump_version()
            return Slot(shape, w.dtype, read, write)
        return {name: slot(off, shape) for name, off, shape in pytorch_layout(self.rnn.cfg)}

    def forward(self, x: ArrayLike, hx: ArrayLike | None = None, cx: ArrayLike | None = None, *,
                lengths: Lengths = None) -> Tensor:
        cls = type(self).__name__
        x = as_input(cls, x, self.weight.dtype)
        hx = None if hx is None else as_input(cls, hx, self.weight.dtype)
        cx = None if cx is None else as_input(cls, cx, self.weight.dtype)
        need = is_grad_enabled() and any(t is not None and t.requires_grad
                                         for t in (self.weight, x, hx, cx))
        c = self.rnn.cfg
        drop = self.training and c.dropout > 0 and c.num_layers > 1
        offset = 0
        if drop and self.dropout_seed is not None:     # call k: masks of call k of the seed
            offset, self._calls = self._calls, self._calls + 1
        rnn = self.rnn if self.training else self._eval_rnn
        y, self.hy, self.cy = rnn.forward(self.weight, x, hx, cx, training=need or drop,
                                          lengths=lengths, seed=self.dropout_seed if drop
                                          else None, offset=offset, backend=self.backend)
        return y


class RNN(_Recurrent):
    """Elman RNN; ``nonlinearity`` "tanh" or "relu"."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1, *,
                 nonlinearity: str = "tanh", **kw: Any) -> None:
        if nonlinearity not in ("tanh", "relu") or not isinstance(nonlinearity, str):
            raise ValueError(f"RNN: nonlinearity must be 'tanh' or 'relu'; got {nonlinearity!r}")
        super().__init__(input_size, hidden_size, num_layers, _mode=f"rnn_{nonlinearity}",
                         **kw)


class LSTM(_Recurrent):
    mode = "lstm"


class GRU(_Recurrent):
    mode = "gru"
