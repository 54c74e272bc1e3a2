"""PyTorch's RNN, LSTM and GRU on dnnkit's ``rnn_forward`` / ``rnn_backward``.

dnnkit's recurrent ops read one flat parameter buffer in cuDNN's layout (dnnkit/rnn_layout.py),
whose pieces are PyTorch's per-layer tensors (dnnkit/nn/rnn.py ``pytorch_layout``: for each
layer and direction ``weight_ih`` (G*H, I), ``weight_hh`` (G*H, H), then every ``bias_ih``,
``bias_hh``; the gate order is PyTorch's: LSTM i, f, g, o; GRU r, z, n with the reset gate
applied after the recurrent matrix). :func:`flat_weights` concatenates them with ``torch.cat``
in buffer order, a PyTorch op whose backward splits the flat gradient back onto the
Parameters, so :class:`RNN` takes and differentiates the flat buffer only. Without biases
(``bias=False``) their place holds zeros.

    forward:   y, hy, cy, state = rnn_forward(cfg, w, x, hx, cx, training=...)   (time-major)
    backward:  dx, dhx, dcx, dw = rnn_backward(cfg, w, x, y, dy, dhy, dcy, hx, cx, state)

The backward runs on the backend whose state the forward made.
"""

from __future__ import annotations

import torch

from .. import ops
from ..nn.rnn import pytorch_layout
from ..ops.rnn import make_config

from .bridge import maybe, op_backend, pooled, stream_of, tensor, view


def config(module):
    """The dnnkit RNNConfig of a ``torch.nn.RNN``/``LSTM``/``GRU``: dtype from its weights,
    the projection of an LSTM, and the dropout between layers when the module is training
    (PyTorch applies it in training mode only)."""
    if isinstance(module, torch.nn.LSTM):
        mode = "lstm"
    elif isinstance(module, torch.nn.GRU):
        mode = "gru"
    else:
        mode = "rnn_relu" if module.nonlinearity == "relu" else "rnn_tanh"
    dtype = str(module.weight_ih_l0.dtype).replace("torch.", "")
    dropout = float(module.dropout) if module.training and module.num_layers > 1 else 0.0
    return make_config(mode, module.input_size, module.hidden_size, module.num_layers,
                       bidirectional=module.bidirectional, dtype=dtype,
                       proj_size=getattr(module, "proj_size", 0), dropout=dropout,
                       op=f"dnnkit.torch {type(module).__name__}")


def layout(cfg):
    """[(PyTorch parameter name, number of elements)] in flat-buffer order."""
    pieces = sorted(pytorch_layout(cfg), key=lambda p: p[1])
    out, off = [], 0
    for name, start, shape in pieces:
        if start != off:
            raise RuntimeError(f"dnnkit.torch: the flat RNN buffer has a gap before {name} "
                               f"(offset {start}, expected {off})")
        n = 1
        for d in shape:
            n *= d
        out.append((name, n))
        off += n
    return out


def flat_weights(module, pieces):
    """The module's parameters as one flat tensor in dnnkit's layout (``torch.cat``: the
    gradient flows back to each Parameter)."""
    parts = []
    for name, n in pieces:
        p = getattr(module, name, None)
        if p is None:       # bias=False: the bias pieces are zeros
            ref = module.weight_ih_l0
            parts.append(torch.zeros(n, dtype=ref.dtype, device=ref.device))
        else:
            parts.append(p.reshape(-1))
    return torch.cat(parts)


class RNN(torch.autograd.Function):
    """``RNN.apply(x, hx, cx, w, cfg, training, backend, seed=None)`` with x time-major
    (T, N, I) and hx (layers*D, N, P), cx (layers*D, N, H) or None (P: proj_size or H);
    returns (y, hy, cy) (cy an empty tensor unless lstm). ``seed``: the dropout masks between
    layers (cfg.dropout > 0, training)."""

    @staticmethod
    @pooled
    def forward(ctx, x, hx, cx, w, cfg, training, backend, seed=None):
        s = stream_of(x)
        b = op_backend(backend)
        xv, wv, hv, cv = view(x, s), view(w, s), view(hx, s), view(cx, s)
        kw = {"seed": seed} if cfg.dropout and training else {}
        y, hy, cy, state = ops.rnn_forward(cfg, wv, xv, hv, cv, training=training,
                                           backend=b, stream=s, **kw)
        yt, hyt = tensor(y, x), tensor(hy, x)
        cyt = tensor(cy, x) if cy is not None else x.new_empty(0)
        ctx.saved = (cfg, state, xv, wv, hv, cv, y)
        ctx.like = (x, w)
        ctx.lstm = cy is not None
        if cy is None:
            ctx.mark_non_differentiable(cyt)
        return yt, hyt, cyt

    @staticmethod
    @pooled
    def backward(ctx, dy, dhy, dcy):
        cfg, state, xv, wv, hv, cv, y = ctx.saved
        if state is None:
            raise RuntimeError("dnnkit.torch RNN: backward of a forward run without "
                               "training=True (under torch.no_grad or on tensors that did not "
                               "require grad)")
        x, w = ctx.like
        ref = dy if dy is not None else dhy
        s = stream_of(ref)
        if dy is None:
            dy = torch.zeros(tuple(y.shape), dtype=x.dtype, device=x.device)
        dx, dhx, dcx, dw = ops.rnn_backward(
            cfg, wv, xv, y, view(dy, s), view(dhy, s), view(dcy, s) if ctx.lstm else None,
            hv, cv, state=state, backend=state.backend, stream=s)
        return (tensor(dx, x), maybe(dhx, x) if hv is not None else None,
                maybe(dcx, x) if cv is not None else None, tensor(dw, w), None, None, None,
                None)
