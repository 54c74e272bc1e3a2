"""What the RNN's two backends share: the implementation contract and its argument tuples
(the configuration and the parameter layout: dnnkit/rnn_layout.py).

Both backends register implementations of two ops with ``dnnkit.registry.register``; the
public ops' argument checks return the arguments as ``RNNForwardArgs`` and ``RNNBackwardArgs``
(below), which the dispatcher passes on as positional arguments:

``"rnn_forward"``:  ``fn(cfg, w, x, hx, cx, lengths, training, stream) -> (y, hy, cy, state)``
    cfg      RNNConfig (dnnkit/rnn_layout.py)
    w        flat device array of ``param_size(cfg)`` elements in the one layout both backends
             read (cuDNN's weight space order: rnn_layout.param_layout)
    x        (T, N, I) device array, time-major (``batch_first`` is undone by the caller)
    hx, cx   (L*D, N, H) device arrays, or None for zeros (cx only for lstm)
    lengths  None (every sequence has T steps) or a host NumPy int32 array (N,) of lengths in
             [1, T], any order
    training bool: when True, ``state`` carries what backward needs
    y        (T, N, D*H); steps past a sequence's end are zero
    hy, cy   (L*D, N, H): the state at each sequence's own last step; cy is None unless lstm
    state    None unless training; else an object with ``.backend`` ("numba" or "cudnn")

``"rnn_backward"``: ``fn(cfg, w, x, y, dy, dhy, dcy, hx, cx, lengths, state, stream)
    -> (dx, dhx, dcx, dw)``
    dhy, dcy (L*D, N, H) or None for zeros; state from the forward pass on the same backend
    dx (T, N, I); dhx (L*D, N, H); dcx (L*D, N, H) for lstm else None; dw a fresh flat buffer
    of param_size(cfg) elements in the same layout (nothing is accumulated into w)

(L = num_layers, D = 2 if bidirectional else 1, H = hidden_size, I = input_size.)
"""


import typing


class RNNForwardArgs(typing.NamedTuple):
    """The checked arguments of "rnn_forward" (see above)."""
    cfg: object
    w: object
    x: object
    hx: object
    cx: object
    lengths: object
    training: bool
    stream: object


class RNNBackwardArgs(typing.NamedTuple):
    """The checked arguments of "rnn_backward" (see above)."""
    cfg: object
    w: object
    x: object
    y: object
    dy: object
    dhy: object
    dcy: object
    hx: object
    cx: object
    lengths: object
    state: object
    stream: object
