"""dnnkit-backed versions of ``torch.nn`` modules.

Each class here subclasses the ``torch.nn`` class it stands for and overrides ``forward`` (and
``extra_repr``) only. :func:`dnnkit.torch.convert` turns a module into one by changing its
``__class__``: the module object stays where it was in the model, with the same Parameter
objects, buffers (running statistics included), hooks, training flag and state-dict keys;
undoing it restores the class. The backend is the attribute ``dnnkit_backend`` ("auto",
"cudnn" or "numba"); ``dnnkit_custom_ops`` (None, True or False) says whether ``forward`` calls
the ``torch.library`` custom operators (library.py, library_norm.py: what ``torch.compile``
traces) or the ``torch.autograd.Function``s (functions.py, functions_norm.py: lighter in eager
mode); None: the operators while ``torch.compile`` traces, the Functions otherwise. Both run
the same dnnkit ops. Conv1d and ConvTranspose1d run as the 2-D ops on (N, C, 1, L) views with
(K, C/groups, 1, k) weights: views, no copies.

``unsupported(module)`` says why a module's options cannot be run by dnnkit (a sentence), or
None; a module it refuses stays PyTorch's. The checks are those of the options; a tensor of an
unsupported dtype or layout reaching a converted module at run time raises dnnkit's TypeError.
"""

from __future__ import annotations

import torch
from torch import nn

from . import bridge
from .functions import Conv, ConvTranspose, Linear as LinearFn, Pool
from .functions_norm import Activation, BatchNormEval, BatchNormTrain, Dropout as DropoutFn, \
    Softmax as SoftmaxFn
from .modules_rnn import DnnGRU, DnnLSTM, DnnRNN, rnn_unsupported

try:
    from . import library, library_norm
except ImportError:         # PyTorch < 2.4 has no torch.library.custom_op: Functions only
    library = library_norm = None

FLOATS = (torch.float16, torch.float32, torch.float64)


def _tuple(v, nd):
    return tuple(v) if isinstance(v, (tuple, list)) else (v,) * nd


def _dtype_reason(module, floats=FLOATS):
    for name, p in list(module.named_parameters(recurse=False)) + \
            list(module.named_buffers(recurse=False)):
        if p is not None and p.is_floating_point() and p.dtype not in floats:
            return (f"{name} is {p.dtype}; dnnkit runs "
                    f"{', '.join(str(f).replace('torch.', '') for f in floats)}")
    return None


def _custom(m):
    """Whether module ``m`` runs the custom operators (the module docstring)."""
    return library is not None and library.use(m.__dict__.get("dnnkit_custom_ops"))


class _Dnn:
    """What every converted module shares: the backend in ``extra_repr``."""

    def extra_repr(self):
        base = super().extra_repr()
        tag = f"dnnkit={self.dnnkit_backend}"
        return f"{base}, {tag}" if base else tag


# ---------------------------------------------------------------- convolution

def _conv_padding(m, nd):
    """The symmetric zero padding per dim, or a reason why it is not symmetric."""
    if m.padding == "valid":
        return (0,) * nd
    if m.padding == "same":
        k, d = _tuple(m.kernel_size, nd), _tuple(m.dilation, nd)
        total = [di * (ki - 1) for ki, di in zip(k, d)]
        if any(t % 2 for t in total):
            return (f"padding='same' with an even dilation*(kernel-1) {tuple(total)} pads one "
                    f"side more than the other; dnnkit pads symmetrically")
        return tuple(t // 2 for t in total)
    return _tuple(m.padding, nd)


def conv_unsupported(m):
    if m.padding_mode != "zeros":
        return f"padding_mode={m.padding_mode!r}; dnnkit pads with zeros only"
    nd = 3 if isinstance(m, (nn.Conv3d, nn.ConvTranspose3d)) else \
        1 if isinstance(m, (nn.Conv1d, nn.ConvTranspose1d)) else 2
    if isinstance(m, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
        p = _conv_padding(m, nd)
        if isinstance(p, str):
            return p
    else:
        op = _tuple(m.output_padding, nd)
        if any(o >= s for o, s in zip(op, _tuple(m.stride, nd))):
            return (f"output_padding {op} >= stride {tuple(_tuple(m.stride, nd))}: the gradient "
                    f"of dnnkit's transposed convolution needs output_padding < stride")
    return _dtype_reason(m)


def _activation(m, activation):
    """``activation`` of a fused call (dnnkit.torch.fuse), checked: None or "relu"."""
    if activation not in (None, "relu"):
        raise ValueError(f"{type(m).__name__}: activation must be None or 'relu'; got "
                         f"{activation!r}")
    return activation


def _conv(m, x, w, nd, stride, padding, dilation, activation=None):
    if _custom(m):      # (the custom operators take no activation: PyTorch's relu after)
        y = library.conv(x, w, m.bias, stride, padding, dilation, m.groups, m.dnnkit_backend)
        return y if _activation(m, activation) is None else torch.relu(y)
    return bridge.function(Conv, x, w, m.bias, nd, stride, padding, dilation, m.groups,
                           m.dnnkit_backend, _activation(m, activation))


def _conv_nd(m, nd, x, activation):
    return _conv(m, x, m.weight, nd, _tuple(m.stride, nd), _conv_padding(m, nd),
                 _tuple(m.dilation, nd), activation)


def _unbatched(forward, x, rank, *args):
    """PyTorch's unbatched input (one fewer dim) through the batched ``forward``."""
    if x.dim() == rank - 1:
        return forward(x.unsqueeze(0), *args).squeeze(0)
    return forward(x, *args)


class DnnConv1d(_Dnn, nn.Conv1d):
    def forward(self, x, activation=None):
        """PyTorch's; ``activation="relu"`` (what dnnkit.torch.fuse passes) applies a relu
        in the same op call."""
        return _unbatched(self._forward, x, 3, activation)

    def _forward(self, x, activation):
        # (N, C, L) as (N, C, 1, L) and w (K, C/g, k) as (K, C/g, 1, k): views of contiguous
        # tensors, contiguous (a size-1 dim's stride is free), so no copy reaches the 2-D op
        y = _conv(self, x.unsqueeze(2), self.weight.unsqueeze(2), 2, (1,) + _tuple(self.stride, 1),
                  (0,) + _conv_padding(self, 1), (1,) + _tuple(self.dilation, 1), activation)
        return y.squeeze(2)


class DnnConv2d(_Dnn, nn.Conv2d):
    def forward(self, x, activation=None):
        """PyTorch's; ``activation="relu"`` as DnnConv1d's."""
        return _conv_nd(self, 2, x, activation)


class DnnConv3d(_Dnn, nn.Conv3d):
    def forward(self, x, activation=None):
        """PyTorch's; ``activation="relu"`` as DnnConv1d's."""
        return _conv_nd(self, 3, x, activation)


def _transpose(m, nd, x, output_size):
    # PyTorch's own rule for an output_size argument (the module's method)
    op = m._output_padding(x, output_size, _tuple(m.stride, nd), _tuple(m.padding, nd),
                           _tuple(m.kernel_size, nd), nd, _tuple(m.dilation, nd))
    args = (_tuple(m.stride, nd), _tuple(m.padding, nd), tuple(op), _tuple(m.dilation, nd))
    w = m.weight
    if nd == 1:               # as the 2-D op on (N, C, 1, L) and (C_in, C_out/g, 1, k) views
        x, w = x.unsqueeze(2), w.unsqueeze(2)
        args = tuple((lead,) + tuple(a) for lead, a in zip((1, 0, 0, 1), args))
    if _custom(m):
        y = library.conv_transpose(x, w, m.bias, *args, m.groups, m.dnnkit_backend)
    else:
        y = bridge.function(ConvTranspose, x, w, m.bias, max(nd, 2), *args, m.groups,
                            m.dnnkit_backend)
    return y.squeeze(2) if nd == 1 else y


class DnnConvTranspose1d(_Dnn, nn.ConvTranspose1d):
    def forward(self, x, output_size=None):
        return _unbatched(lambda v, o: _transpose(self, 1, v, o), x, 3, output_size)


class DnnConvTranspose2d(_Dnn, nn.ConvTranspose2d):
    def forward(self, x, output_size=None):
        return _transpose(self, 2, x, output_size)


class DnnConvTranspose3d(_Dnn, nn.ConvTranspose3d):
    def forward(self, x, output_size=None):
        return _transpose(self, 3, x, output_size)


# ---------------------------------------------------------------- pooling

def pool_unsupported(m):
    if isinstance(m, (nn.MaxPool2d, nn.MaxPool3d)):
        nd = 3 if isinstance(m, nn.MaxPool3d) else 2
        if m.return_indices:
            return "return_indices=True; dnnkit's max pooling returns no indices"
        if any(d != 1 for d in _tuple(m.dilation, nd)):
            return f"dilation={m.dilation}; dnnkit pools without dilation"
    elif isinstance(m, (nn.AvgPool2d, nn.AvgPool3d)):
        if m.divisor_override is not None:
            return f"divisor_override={m.divisor_override}; dnnkit divides by the window"
    elif isinstance(m, (nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d)):
        nd = 3 if isinstance(m, nn.AdaptiveAvgPool3d) else 2
        if _tuple(m.output_size, nd) != (1,) * nd:
            return (f"output_size={m.output_size}; dnnkit runs adaptive average pooling to "
                    f"1 only (global average pooling)")
    return None


def _pool(m, nd, x, mode):
    window = _tuple(m.kernel_size, nd)
    stride = _tuple(m.stride if m.stride is not None else m.kernel_size, nd)
    if _custom(m):
        return library.pool(x, window, stride, _tuple(m.padding, nd), mode, bool(m.ceil_mode),
                            m.dnnkit_backend)
    return bridge.function(Pool, x, nd, window, stride, _tuple(m.padding, nd), mode,
                           bool(m.ceil_mode), m.dnnkit_backend)


class DnnMaxPool2d(_Dnn, nn.MaxPool2d):
    def forward(self, x):
        return _pool(self, 2, x, "max")


class DnnMaxPool3d(_Dnn, nn.MaxPool3d):
    def forward(self, x):
        return _pool(self, 3, x, "max")


def _avg_mode(m):
    return "average_inc_pad" if m.count_include_pad else "average_exc_pad"


class DnnAvgPool2d(_Dnn, nn.AvgPool2d):
    def forward(self, x):
        return _pool(self, 2, x, _avg_mode(self))


class DnnAvgPool3d(_Dnn, nn.AvgPool3d):
    def forward(self, x):
        return _pool(self, 3, x, _avg_mode(self))


def _global_pool(m, nd, x):
    if _custom(m):            # an empty window: the whole map
        return library.pool(x, (), (), (), "average_inc_pad", False, m.dnnkit_backend)
    return bridge.function(Pool, x, nd, None, None, 0, "average_inc_pad", False, m.dnnkit_backend)


class DnnAdaptiveAvgPool2d(_Dnn, nn.AdaptiveAvgPool2d):
    def forward(self, x):
        return _global_pool(self, 2, x)


class DnnAdaptiveAvgPool3d(_Dnn, nn.AdaptiveAvgPool3d):
    def forward(self, x):
        return _global_pool(self, 3, x)


# ---------------------------------------------------------------- batch normalization

def bn_unsupported(m):
    reason = _dtype_reason(m, (torch.float32, torch.float64))
    return reason and reason + (" (batch norm's parameters and statistics are float32 for "
                                "float16 data, cuDNN's rule)")


class _DnnBatchNorm(_Dnn):
    def forward(self, x, residual=None, activation=None):
        """PyTorch's batch norm; with ``residual`` and/or ``activation="relu"`` (what
        dnnkit.torch.fuse passes), relu(bn(x) + residual) in one op call. A residual that is
        not a tensor of x's shape, dtype and device, and the custom operators' path
        (``torch.compile``), take PyTorch's add and relu after the batch norm instead."""
        if residual is not None or activation is not None:
            _activation(self, activation)
            if _custom(self) or (residual is not None and (
                    not isinstance(residual, torch.Tensor) or residual.shape != x.shape or
                    residual.dtype != x.dtype or residual.device != x.device)):
                y = self._bn(x, None, None)
                y = y if residual is None else y + residual
                return y if activation is None else torch.relu(y)
        return self._bn(x, residual, activation)

    def _bn(self, x, residual, activation):
        self._check_input_dim(x)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            # momentum None: a cumulative average (PyTorch reads the count on the host too)
            factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None \
                else self.momentum
        train = self.training or (self.running_mean is None and self.running_var is None)
        if train:
            track = not self.training or self.track_running_stats
            rm, rv = (self.running_mean, self.running_var) if track else (None, None)
            if _custom(self):
                return library_norm.batch_norm_train_update(x, self.weight, self.bias, rm, rv,
                                                            self.eps, factor,
                                                            self.dnnkit_backend)
            return bridge.function(BatchNormTrain, x, self.weight, self.bias, rm, rv, self.eps,
                                   factor, self.dnnkit_backend, residual, activation)
        if _custom(self):
            return library_norm.batch_norm_eval(x, self.weight, self.bias, self.running_mean,
                                                self.running_var, self.eps, self.dnnkit_backend)
        return bridge.function(BatchNormEval, x, self.weight, self.bias, self.running_mean,
                               self.running_var, self.eps, self.dnnkit_backend, residual,
                               activation)


def fused_tail(module):
    """The keywords of a fused tail ``module``'s forward takes (dnnkit/torch/fuse.py):
    ("residual", "activation") for a converted batch norm, ("activation",) for a converted
    convolution (not transposed) or linear layer, () for anything else."""
    if isinstance(module, _DnnBatchNorm):
        return ("residual", "activation")
    if isinstance(module, (DnnConv1d, DnnConv2d, DnnConv3d, DnnLinear)):
        return ("activation",)
    return ()


class DnnBatchNorm1d(_DnnBatchNorm, nn.BatchNorm1d):
    pass


class DnnBatchNorm2d(_DnnBatchNorm, nn.BatchNorm2d):
    pass


class DnnBatchNorm3d(_DnnBatchNorm, nn.BatchNorm3d):
    pass


# ---------------------------------------------------------------- softmax, activations, dropout

def softmax_unsupported(m):
    if m.dim is None:
        return "dim=None (PyTorch's implicit, deprecated choice of dim); give dim"
    return None


def _softmax(m, x, log):
    if _custom(m):
        return library_norm.softmax(x, m.dim, log, m.dnnkit_backend)
    return bridge.function(SoftmaxFn, x, m.dim, log, m.dnnkit_backend)


class DnnSoftmax(_Dnn, nn.Softmax):
    def forward(self, x):
        return _softmax(self, x, False)


class DnnLogSoftmax(_Dnn, nn.LogSoftmax):
    def forward(self, x):
        return _softmax(self, x, True)


def _act(mode, coef=0.0):
    def forward(self, x):
        c = coef if not callable(coef) else coef(self)
        if _custom(self):
            return library_norm.activation(x, mode, c, self.dnnkit_backend)
        return bridge.function(Activation, x, mode, c, self.dnnkit_backend)
    return forward


class DnnReLU(_Dnn, nn.ReLU):
    forward = _act("relu")


class DnnSigmoid(_Dnn, nn.Sigmoid):
    forward = _act("sigmoid")


class DnnTanh(_Dnn, nn.Tanh):
    forward = _act("tanh")


class DnnELU(_Dnn, nn.ELU):
    forward = _act("elu", lambda m: float(m.alpha))


class DnnSiLU(_Dnn, nn.SiLU):
    forward = _act("swish", 1.0)


class DnnReLU6(_Dnn, nn.ReLU6):
    forward = _act("clipped_relu", 6.0)


class DnnHardtanh(_Dnn, nn.Hardtanh):
    forward = _act("clipped_relu", lambda m: float(m.max_val))


def hardtanh_unsupported(m):
    if m.min_val != 0 or m.max_val <= 0:
        return (f"min_val={m.min_val}, max_val={m.max_val}; dnnkit's clipped_relu is "
                f"min(max(x, 0), ceiling): min_val 0 and max_val > 0 only")
    return None


def dropout_unsupported(m):
    if m.p >= 1:
        return f"p={m.p}; dnnkit's dropout takes p < 1 (p = 1 drops everything: zeros)"
    return None


class DnnDropout(_Dnn, nn.Dropout):
    def forward(self, x):
        if not self.training or self.p == 0:
            return x
        if _custom(self):       # the seed a CPU tensor drawn as bridge.seed draws it
            return library_norm.dropout(x, library_norm.draw_seed(), float(self.p),
                                        self.dnnkit_backend)
        return bridge.function(DropoutFn, x, float(self.p), self.dnnkit_backend)


class DnnLinear(_Dnn, nn.Linear):
    def forward(self, x, activation=None):
        """PyTorch's; ``activation="relu"`` as DnnConv1d's."""
        if _custom(self):
            y = library.linear(x, self.weight, self.bias, self.dnnkit_backend)
            return y if _activation(self, activation) is None else torch.relu(y)
        return bridge.function(LinearFn, x, self.weight, self.bias, self.dnnkit_backend,
                               _activation(self, activation))


# {torch.nn class: (dnnkit class, the options check or None)}; only these exact classes are
# converted (a subclass may have its own forward)
TABLE = {
    nn.Conv1d: (DnnConv1d, conv_unsupported),
    nn.Conv2d: (DnnConv2d, conv_unsupported), nn.Conv3d: (DnnConv3d, conv_unsupported),
    nn.ConvTranspose1d: (DnnConvTranspose1d, conv_unsupported),
    nn.ConvTranspose2d: (DnnConvTranspose2d, conv_unsupported),
    nn.ConvTranspose3d: (DnnConvTranspose3d, conv_unsupported),
    nn.MaxPool2d: (DnnMaxPool2d, pool_unsupported), nn.MaxPool3d: (DnnMaxPool3d, pool_unsupported),
    nn.AvgPool2d: (DnnAvgPool2d, pool_unsupported), nn.AvgPool3d: (DnnAvgPool3d, pool_unsupported),
    nn.AdaptiveAvgPool2d: (DnnAdaptiveAvgPool2d, pool_unsupported),
    nn.AdaptiveAvgPool3d: (DnnAdaptiveAvgPool3d, pool_unsupported),
    nn.BatchNorm1d: (DnnBatchNorm1d, bn_unsupported),
    nn.BatchNorm2d: (DnnBatchNorm2d, bn_unsupported),
    nn.BatchNorm3d: (DnnBatchNorm3d, bn_unsupported),
    nn.Softmax: (DnnSoftmax, softmax_unsupported), nn.LogSoftmax: (DnnLogSoftmax,
                                                                   softmax_unsupported),
    nn.ReLU: (DnnReLU, None), nn.Sigmoid: (DnnSigmoid, None), nn.Tanh: (DnnTanh, None),
    nn.ELU: (DnnELU, None), nn.SiLU: (DnnSiLU, None), nn.ReLU6: (DnnReLU6, None),
    nn.Hardtanh: (DnnHardtanh, hardtanh_unsupported),
    nn.Dropout: (DnnDropout, dropout_unsupported),
    nn.Linear: (DnnLinear, _dtype_reason),
    nn.RNN: (DnnRNN, rnn_unsupported), nn.LSTM: (DnnLSTM, rnn_unsupported),
    nn.GRU: (DnnGRU, rnn_unsupported),
}
ORIGINAL = {dnn: torch_cls for torch_cls, (dnn, _) in TABLE.items()}


def unsupported(module):
    """Why ``module`` (of a class in TABLE) cannot be converted, or None."""
    check = TABLE[type(module)][1]
    return check(module) if check is not None else None
