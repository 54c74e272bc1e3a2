"""dnnkit-backed ``torch.nn.RNN``, ``LSTM`` and ``GRU`` (dnnkit/torch/modules.py describes
the conversion; dnnkit/torch/functions_rnn.py the flat buffer).

The forward takes what PyTorch's does -- batched (T, N, I) or, with ``batch_first``,
(N, T, I), or unbatched (T, I); hx (layers*D, N, H) or (layers*D, H), for LSTM the pair
(h0, c0) -- and returns PyTorch's ``(output, h_n)`` or ``(output, (h_n, c_n))``. An LSTM's
``proj_size`` and the ``dropout`` between layers (in training mode, dnnkit's masks seeded from
PyTorch's generator) are dnnkit's ops' own options. A PackedSequence is refused with a
TypeError (pad the batch instead).
"""

from __future__ import annotations

import torch
from torch import nn

from . import bridge
from .functions_rnn import RNN as RNNFn, config, flat_weights, layout


def rnn_unsupported(m):
    dt = m.weight_ih_l0.dtype
    if dt not in (torch.float16, torch.float32, torch.float64):
        return f"weights are {dt}; dnnkit runs float16, float32, float64"
    return None


class _DnnRecurrent:
    def extra_repr(self):
        base = super().extra_repr()
        return f"{base}, dnnkit={self.dnnkit_backend}"

    def _dnnkit_layout(self):
        """(RNNConfig, flat-buffer pieces) for the weights' current dtype and the training
        flag (the dropout between layers applies in training), cached per both."""
        key = (self.weight_ih_l0.dtype, self.training)
        cache = self.__dict__.setdefault("_dnnkit_layouts", {})
        got = cache.get(key)
        if got is None:
            cfg = config(self)
            got = cache[key] = (cfg, layout(cfg))
        return got

    # outside any torch.compile graph (a graph break): the recurrent layers stay
    # autograd.Functions (functions_rnn.py), whose cuDNN state Dynamo cannot trace
    @torch.compiler.disable
    def _dnnkit_run(self, x, h0, c0):
        if isinstance(x, nn.utils.rnn.PackedSequence):
            raise TypeError(f"dnnkit.torch {type(self).__name__}: a PackedSequence input is not "
                            f"supported; pass a padded tensor")
        batched = x.dim() == 3
        if not batched:
            x = x.unsqueeze(1)
            h0 = h0.unsqueeze(1) if h0 is not None else None
            c0 = c0.unsqueeze(1) if c0 is not None else None
        elif self.batch_first:
            x = x.transpose(0, 1)
        cfg, pieces = self._dnnkit_layout()
        w = flat_weights(self, pieces)
        # training=True keeps the state for the backward and applies the dropout between
        # layers: wanted when a gradient is, and whenever that dropout is on
        training = bool(cfg.dropout) or torch.is_grad_enabled() and (
            x.requires_grad or w.requires_grad or
            any(h is not None and h.requires_grad for h in (h0, c0)))
        seed = bridge.seed() if cfg.dropout else None
        y, hy, cy = RNNFn.apply(x, h0, c0, w, cfg, training, self.dnnkit_backend, seed)
        if not batched:
            y, hy = y.squeeze(1), hy.squeeze(1)
            cy = cy.squeeze(1) if cy.numel() else cy
        elif self.batch_first:
            y = y.transpose(0, 1)
        return y, hy, cy


class DnnRNN(_DnnRecurrent, nn.RNN):
    def forward(self, input, hx=None):   # noqa: A002 - PyTorch's parameter name
        y, hy, _ = self._dnnkit_run(input, hx, None)
        return y, hy


class DnnGRU(_DnnRecurrent, nn.GRU):
    def forward(self, input, hx=None):   # noqa: A002
        y, hy, _ = self._dnnkit_run(input, hx, None)
        return y, hy


class DnnLSTM(_DnnRecurrent, nn.LSTM):
    def forward(self, input, hx=None):   # noqa: A002
        h0, c0 = hx if hx is not None else (None, None)
        y, hy, cy = self._dnnkit_run(input, h0, c0)
        return y, (hy, cy)
