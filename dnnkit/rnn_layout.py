"""The RNN configuration and its flat parameter buffer's layout: pure Python, below every
module that reads them (both RNN backends, the float64 reference, ``dnnkit.RNN``).

The layout is decided here only. cuDNN's weight space order: pseudo-layers (layer 0 dir 0,
layer 0 dir 1, layer 1 dir 0, ...); within one, first the matrices of every linear layer in
linear-layer order, then the biases in the same order. Linear layers: the G input ones (W,
H x I_l), then the G recurrent ones (R, H x H); every one has a bias of H. Matrices are
row-major (out x in). With input_mode "skip" layer 0 has no input matrices (the input is added
as it is) but keeps its input biases.

An LSTM with a projection (``proj_size`` P > 0, cuDNN's projSize) has one more linear layer
per pseudo-layer, lin_id 2G = 8: the projection matrix W_hr (P x H), with no bias, after the
recurrent matrices of its pseudo-layer. The state h and the output are then P wide: the
recurrent matrices are H x P and the layers above the first read D*P inputs.
"""

import dataclasses

MODES = ("rnn_relu", "rnn_tanh", "lstm", "gru")
GATES = {"rnn_relu": 1, "rnn_tanh": 1, "lstm": 4, "gru": 3}
INPUT_MODES = ("linear", "skip")


@dataclasses.dataclass(frozen=True)
class RNNConfig:
    mode: str
    input_size: int
    hidden_size: int
    num_layers: int = 1
    bidirectional: bool = False
    input_mode: str = "linear"
    dtype: str = "float32"
    proj_size: int = 0          # LSTM only: h projected to P < H units (0: no projection)
    dropout: float = 0.0        # dropout on every layer's output but the last (training)

    @property
    def gates(self):
        return GATES[self.mode]

    @property
    def out_size(self):
        """The width of h, hy and each direction's output: proj_size if set, else H."""
        return self.proj_size or self.hidden_size

    @property
    def lin_layers(self):
        """Linear layers per pseudo-layer: 2G, plus the projection when proj_size is set."""
        return 2 * GATES[self.mode] + (1 if self.proj_size else 0)

    @property
    def directions(self):
        return 2 if self.bidirectional else 1


def layer_input_size(cfg, layer):
    """I_l: the input width of ``layer`` (input_size for layer 0, D*P above: P = out_size)."""
    return cfg.input_size if layer == 0 else cfg.out_size * cfg.directions


def has_input_matrix(cfg, layer):
    return not (cfg.input_mode == "skip" and layer == 0)


def param_layout(cfg):
    """[(layer, direction, lin_id, "matrix" | "bias", offset, shape), ...] in buffer order;
    offsets and shapes in elements.

    cuDNN 9's weight space (read back with cudnnGetRNNWeightParams on an H200, cuDNN 9.19;
    tests/gpu/test_rnn.py proves it for every mode): first every matrix, walking layers, then
    directions, then linear ids; then every bias in the same order. A matrix for gate q is
    (H, input) row-major, so W @ x is a plain GEMM on the view. The projection (lin_id 2G,
    P x H, no bias) follows the recurrent matrices of its pseudo-layer.
    """
    g, h, p = cfg.gates, cfg.hidden_size, cfg.out_size
    keys = [(layer, d, lin) for layer in range(cfg.num_layers)
            for d in range(cfg.directions) for lin in range(cfg.lin_layers)]
    out, off = [], 0
    for layer, d, lin in keys:
        if lin < g and not has_input_matrix(cfg, layer):
            continue
        shape = (h, layer_input_size(cfg, layer)) if lin < g else (h, p) if lin < 2 * g \
            else (p, h)
        out.append((layer, d, lin, "matrix", off, shape))
        off += shape[0] * shape[1]
    for layer, d, lin in keys:
        if lin < 2 * g:
            out.append((layer, d, lin, "bias", off, (h,)))
            off += h
    return out


def param_size(cfg):
    """Elements of the flat parameter buffer."""
    last = param_layout(cfg)[-1]
    return last[4] + last[5][0]
