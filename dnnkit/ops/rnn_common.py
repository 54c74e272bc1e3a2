"""What the RNN's two backends share: the implementation contract and its argument tuples
(the configuration and the parameter layout: dnnkit/rnn_layout.py).

Both backends register implementations of two ops with ``dnnkit.registry.register``; the
public ops' argument checks return the arguments as ``RNNForwardArgs`` and ``RNNBackwardArgs``
(below), which the dispatcher passes on as positional arguments:

``"rnn_forward"``:  ``fn(cfg, w, x, hx, cx, lengths, training, seed, offset, algo, stream)
    -> (y, hy, cy, state)``
    cfg      RNNConfig (dnnkit/rnn_layout.py)
    w        flat device array of ``param_size(cfg)`` elements in the one layout both backends
             read (cuDNN's weight space order: rnn_layout.param_layout)
    x        (T, N, I) device array, time-major (``batch_first`` is undone by the caller)
    hx, cx   (L*D, N, P) and (L*D, N, H) device arrays, or None for zeros (cx only for lstm;
             P = cfg.out_size: the projection's width, else H)
    lengths  None (every sequence has T steps) or a host NumPy int32 array (N,) of lengths in
             [1, T], any order
    training bool: when True, ``state`` carries what backward needs, and cfg.dropout applies
    seed     int or None: the dropout masks' seed (None: fresh masks on every call)
    offset   int: call ``offset`` of the seed's sequence; layer l's mask is mask
             ``offset*(L-1) + l`` of the seed (Numba: dnnkit.dropout's mask of that offset)
    algo     one of ALGOS (cuDNN's RNN algorithm; Numba ignores it)
    y        (T, N, D*P); steps past a sequence's end are zero
    hy, cy   (L*D, N, P), (L*D, N, H): the state at each sequence's own last step; cy is None
             unless lstm
    state    None unless training; else an object with ``.backend`` ("numba" or "cudnn")

``"rnn_backward"``: ``fn(cfg, w, x, y, dy, dhy, dcy, hx, cx, lengths, state, stream)
    -> (dx, dhx, dcx, dw)``
    dhy, dcy (L*D, N, P), (L*D, N, H) or None for zeros; state from the forward pass on the
    same backend (it holds the dropout masks and, on cuDNN, the algorithm)
    dx (T, N, I); dhx (L*D, N, P); dcx (L*D, N, H) for lstm else None; dw a fresh flat buffer
    of param_size(cfg) elements in the same layout (nothing is accumulated into w)

(L = num_layers, D = 2 if bidirectional else 1, H = hidden_size, I = input_size.)
"""


import typing

# cuDNN's RNN algorithms (cudnnRNNAlgo_t) and "auto" (docs/rnn.md: the measured rule)
ALGOS = ("auto", "standard", "persist_static", "persist_static_small_h", "persist_dynamic")


class RNNForwardArgs(typing.NamedTuple):
    """The checked arguments of "rnn_forward" (see above)."""
    cfg: object
    w: object
    x: object
    hx: object
    cx: object
    lengths: object
    training: bool
    seed: object
    offset: int
    algo: str
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


def draws_masks(args, kw):
    """A training forward with dropout between layers: its masks come from the backend's own
    generator (Numba's counter-based masks, cuDNN's RNG states), so the other backend's result
    differs by design and ``dnn.crosscheck`` does not compare them (registry.OpInfo)."""
    return bool(args.training) and args.cfg.dropout > 0 and args.cfg.num_layers > 1
