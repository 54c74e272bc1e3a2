"""The RNN family's Numba backend: the contract of dnnkit/ops/rnn_common.py on the GEMM
(dnnkit/ops/gemm.py) and the cell kernels (kernels/rnn.py).

Forward, per layer (both directions in every launch, batched through the GEMM's batch index):
    1. ws = X . W^T for all T steps at once (layout "01"; skip layers read x in the cell)
    2. per step s: gr = h . R^T (layout "01"; skipped at s = 0 without hx), then the fused
       cell kernel (biases, activations, state update, masking, y, hy/cy): two launches
Backward, per layer from the top (the same two launches per step, in reverse):
    1. per step s = T-1 .. 0: the cell kernel writes the pre-activation gradients dgx (time-
       indexed) and dgr (step-indexed) and the direct part of d(h_prev); then
       d(h_prev) += dgr_s . R (layout "00", beta 1)
    2. dx = sum over directions of dgx . W ("00"; skip layers: rnn_skip_bwd_kernel),
       dW = dgx^T . X and dR = dgr^T . h_prev over all steps ("10"), bias gradients as column
       sums (rnn_bias_bwd_kernel)
Precision: gates, c and every gradient accumulate in float32 for float16 data (float64 for
float64); h, y, hy, dx, dhx and dw are in the data type (as cuDNN keeps them).
"""

import numpy as np

from .. import arrays, device
from ..launch import Site, at, launch
from ..registry import register
from ..rnn_layout import GATES, has_input_matrix, layer_input_size, param_layout
from . import gemm

# The kernels (dnnkit.kernels) are imported inside the functions that launch them: importing
# them imports numba, which ``import dnnkit`` must not pay for.

MODE_ID = {"rnn_relu": 0, "rnn_tanh": 1, "lstm": 2, "gru": 3}   # kernels/rnn.py
_STORED = {"rnn_relu": 1, "rnn_tanh": 1, "lstm": 4, "gru": 4}   # S: values kept per unit
_P3 = gemm.PLAIN * 3
_TOL = {"float16": (1e-2, 1e-2), "float32": (1e-4, 1e-5), "float64": (1e-10, 1e-12)}
SPLIT_K = None              # force the per-step GEMMs' split-k factor (tests); None: choose
_BIAS_BLOCK = (32, 8)        # bias-gradient block: 32 columns x 8 row strides
_BIAS_BLOCK_SIM = (8, 2)     # the simulator: a Python thread per CUDA thread


class NumbaRNNState:
    """What the Numba backward needs from a training forward: per layer the stored gate
    activations (``ws``), the h and c states of every step (``hp``, ``cp``) and the layer's
    output (the next layer's input); plus the shapes and lengths it was made for."""

    backend = "numba"

    def __init__(self, cfg, shape, lengths, layers):
        self.cfg, self.shape, self.lengths, self.layers = cfg, tuple(shape), lengths, layers

    def __repr__(self):
        return f"NumbaRNNState({self.cfg.mode}, x shape {self.shape})"


def _blocks(cfg):
    """Per layer: (input-matrix offsets per direction or None, recurrent-matrix offsets,
    bias offsets), from param_layout; checks the contiguity the GEMMs rely on (a direction's
    G input matrices, G recurrent matrices and 2G biases each one block)."""
    g, h = cfg.gates, cfg.hidden_size
    at = {(l_, d, lin, kind): off for l_, d, lin, kind, off, _ in param_layout(cfg)}
    out = []
    for layer in range(cfg.num_layers):
        i_l = layer_input_size(cfg, layer)
        w_off, r_off, b_off = [], [], []
        for d in range(cfg.directions):
            for lin in range(2 * g):
                first, size = (0, h * i_l) if lin < g else (g, h * h)
                if (layer, d, lin, "matrix") in at:
                    assert at[(layer, d, lin, "matrix")] == \
                        at[(layer, d, first, "matrix")] + (lin - first) * size
                assert at[(layer, d, lin, "bias")] == at[(layer, d, 0, "bias")] + lin * h
            if has_input_matrix(cfg, layer):
                w_off.append(at[(layer, d, 0, "matrix")])
            r_off.append(at[(layer, d, g, "matrix")])
            b_off.append(at[(layer, d, 0, "bias")])
        out.append((w_off or None, r_off, b_off))
    return out


def split_k(m, n, k, batch):
    """Split factor P of a per-step GEMM (m x n, depth k, ``batch`` products): the products
    of one step (N x G*H or N x H) have too few output tiles to fill the GPU, so the depth is
    cut into P slices computed by separate blocks into P partial buffers, which the cell
    kernel sums. P: a power of two, at most 32, at most one block per SM (tiles * P <= SMs),
    slices of >= 64. Measured on an H200 (sweep of P = 1..32 on the three benchmark shapes):
    this rule picks the fastest P, or one within 2%, for forward and backward; half of it
    (one block per two SMs) was 10-25% slower on N = 16 and 32."""
    if SPLIT_K is not None:
        return SPLIT_K if k % SPLIT_K == 0 else 1
    if device.simulator():
        return 1
    from ..kernels.gemm import CONFIGS
    wm, wn, tx, ty, _ = CONFIGS[gemm.gemm_config(m, n, batch)]
    tiles = -(-m // (ty * wm)) * -(-n // (tx * wn)) * batch
    p = 1
    sms = device.sm_count()
    while p < 32 and tiles * 2 * p <= 2 * sms and k % (2 * p) == 0 and k // (2 * p) >= 64:
        p *= 2
    return p


def _stride(offs):
    return offs[1] - offs[0] if len(offs) > 1 else 0


def _elementwise(kernel, n, stream, args, site=launch):
    # blocks no larger than the work (rounded to a warp): the per-step cell launches cover
    # only D*N*H elements, and the simulator runs a Python thread per CUDA thread
    threads = min(256, -(-n // 32) * 32)
    blocks, threads = arrays.grid_1d(n, threads)
    site(kernel, blocks, threads, stream, args)


def _lens(lengths, t, n, stream):
    return arrays.constant(np.full(n, t) if lengths is None else lengths, np.int32)


def transpose01(a, stream):
    """A new C-contiguous device array with a's first two axes swapped (3-D a)."""
    from ..kernels import rnn_transpose_fwd_kernel
    na, nb, nf = a.shape
    out = arrays.cuda_empty((nb, na, nf), a.dtype, stream)
    if a.size:
        _elementwise(rnn_transpose_fwd_kernel, a.size, stream,
                     (arrays.flat(a), arrays.flat(out), (na, nb, nf)))
    return out


# ---------------------------------------------------------------- forward

@register("rnn_forward", "numba", tolerance=_TOL)
def rnn_forward_numba(cfg, w, x, hx, cx, lengths, training, stream):
    from ..kernels import rnn_cell_fwd_kernel
    t_, n_, _ = x.shape
    h, d_ = cfg.hidden_size, cfg.directions
    s_, gh, lstm = _STORED[cfg.mode], GATES[cfg.mode] * cfg.hidden_size, cfg.mode == "lstm"
    dt, acc = x.dtype, arrays.acc_array(x.dtype)
    lens = _lens(lengths, t_, n_, stream)
    hy = arrays.cuda_empty((cfg.num_layers * d_, n_, h), dt, stream)
    cy = arrays.cuda_empty(hy.shape, dt, stream) if lstm else None
    slots = t_ + 1 if training else 1
    parts = split_k(n_, gh, h, d_)
    kc = h // parts
    gr = arrays.cuda_empty((parts * d_ * n_ * gh,), acc.dtype, stream)
    layers, inp = [], arrays.flat(x)
    for layer, (w_off, r_off, b_off) in enumerate(_blocks(cfg)):
        i_l = layer_input_size(cfg, layer)
        ws = arrays.cuda_empty((d_ * t_ * n_ * s_ * h,), acc.dtype, stream)
        hp = arrays.cuda_empty((d_ * slots * n_ * h,), dt, stream)
        cp = arrays.cuda_empty((d_ * slots * n_ * h,), acc.dtype, stream) if lstm else ws
        y = arrays.cuda_empty((t_, n_, d_ * h), dt, stream)
        if w_off is not None:                 # ws[d] = X . W_d^T, all steps, both directions
            gemm.gemm("01", inp, w[w_off[0]:], ws, (t_ * n_, gh, i_l), (i_l, i_l, s_ * h), _P3,
                      (d_, 1, 0, 0, _stride(w_off), 0, t_ * n_ * s_ * h, 0), stream=stream)
        lo = layer * d_ * n_ * h
        h0 = arrays.flat(hx)[lo:] if hx is not None else hp
        c0 = arrays.flat(cx)[lo:] if cx is not None else hp
        hy_l, cy_l = arrays.flat(hy)[lo:], arrays.flat(cy)[lo:] if lstm else hp
        flags = (1 if w_off is None else 0) | (4 if hx is not None else 0) | \
            (8 if cx is not None else 0)
        # per-step host work kept to the two launches (views made once per layer; launch
        # sites that keep the argument types: the same arrays, offsets and int tuples)
        w_r, y_f, mode = w[r_off[0]:], arrays.flat(y), MODE_ID[cfg.mode]
        rec_site, cell_site = Site(), Site()
        rbatch = (d_, parts, 0, kc, _stride(r_off), kc, n_ * gh, d_ * n_ * gh)
        for s in range(t_):
            hin, hout = (s, s + 1) if training else (0, 0)
            rec = s > 0 or hx is not None
            if rec:                           # gr[p, d] = h_prev[:, slice p] . R_d[:, slice p]^T
                a, a1 = (at(hp, hin * n_ * h), slots * n_ * h) if s > 0 else (h0, n_ * h)
                gemm.gemm("01", a, w_r, gr, (n_, gh, kc), (h, h, gh), _P3,
                          rbatch[:2] + (a1,) + rbatch[3:], stream=stream, site=rec_site)
            geo = (mode, s, t_, n_, h, d_, s_, flags | (2 if rec else 0), hin, hout, slots,
                   b_off[0], _stride(b_off), parts)
            _elementwise(rnn_cell_fwd_kernel, d_ * n_ * h, stream,
                         (ws, gr, w, inp, h0, c0, hp, cp, y_f, hy_l, cy_l, lens, geo, acc),
                         cell_site)
        layers.append((ws, hp, cp if lstm else None, inp))
        inp = arrays.flat(y)
    state = NumbaRNNState(cfg, x.shape, lengths, layers) if training else None
    return y, hy, cy, state


# ---------------------------------------------------------------- backward

# not cross-checked (dnn.crosscheck): a training state only works on the backend that made it
@register("rnn_backward", "numba", tolerance=_TOL, crosscheck=False)
def rnn_backward_numba(cfg, w, x, y, dy, dhy, dcy, hx, cx, lengths, state, stream):
    if getattr(state, "backend", None) != "numba" or not isinstance(state, NumbaRNNState):
        raise ValueError(
            f"rnn_backward: the state was made by the {getattr(state, 'backend', None)!r} "
            "backend; the Numba backward needs the state of a Numba forward with training=True "
            "(run backward on the backend that ran forward)")
    _check_state(cfg, x, lengths, state)
    from ..kernels import rnn_cell_bwd_kernel
    t_, n_, _ = x.shape
    h, d_, g = cfg.hidden_size, cfg.directions, GATES[cfg.mode]
    s_, gh, lstm = _STORED[cfg.mode], g * h, cfg.mode == "lstm"
    dt, acc = x.dtype, arrays.acc_array(x.dtype)
    lens = _lens(lengths, t_, n_, stream)
    dw = arrays.cuda_empty(w.shape, dt, stream)
    dhx = arrays.cuda_empty((cfg.num_layers * d_, n_, h), dt, stream)
    dcx = arrays.cuda_empty(dhx.shape, dt, stream) if lstm else None
    dgx = arrays.cuda_empty((d_ * t_ * n_ * gh,), acc.dtype, stream)
    dgr = arrays.cuda_empty((d_ * t_ * n_ * gh,), acc.dtype, stream)
    parts = split_k(n_, h, gh, d_)
    kc = gh // parts
    dh = arrays.cuda_empty(((1 + parts) * d_ * n_ * h,), acc.dtype, stream)
    dh_parts = dh[d_ * n_ * h:]
    dc = arrays.cuda_empty((d_ * n_ * h,), acc.dtype, stream) if lstm else dh
    blocks = _blocks(cfg)
    dout = arrays.flat(dy)
    for layer in range(cfg.num_layers - 1, -1, -1):
        w_off, r_off, b_off = blocks[layer]
        ws, hp, cp, inp = state.layers[layer]
        i_l = layer_input_size(cfg, layer)
        lo = layer * d_ * n_ * h
        dhx_l = arrays.flat(dhx)[lo:]
        dcx_l = arrays.flat(dcx)[lo:] if lstm else dhx_l
        dhy_l = arrays.flat(dhy)[lo:] if dhy is not None else dout
        dcy_l = arrays.flat(dcy)[lo:] if dcy is not None else dout
        flags = (1 if dhy is not None else 0) | (2 if dcy is not None else 0)
        w_r = w[r_off[0]:]
        cell_site, rec_site = Site(), Site()
        for s in range(t_ - 1, -1, -1):
            geo = (MODE_ID[cfg.mode], s, t_, n_, h, d_, s_, flags, t_ + 1, parts)
            _elementwise(rnn_cell_bwd_kernel, d_ * n_ * h, stream,
                         (ws, hp, cp if lstm else ws, dout, dh, dc, dhy_l, dcy_l, dhx_l, dcx_l,
                          dgx, dgr, lens, geo, acc), cell_site)
            a, a1 = at(dgr, s * n_ * gh), t_ * n_ * gh
            if s:       # dh[1 + p] = dgr_s[:, slice p] . R[slice p, :]  (summed by the cell)
                gemm.gemm("00", a, w_r, dh_parts, (n_, h, kc), (gh, h, h), _P3,
                          (d_, parts, a1, kc, _stride(r_off), kc * h, n_ * h, d_ * n_ * h),
                          stream=stream, site=rec_site)
            else:       # dhx += dgr_0 . R
                gemm.gemm("00", a, w_r, dhx_l, (n_, h, gh), (gh, h, h), _P3,
                          (d_, 1, a1, 0, _stride(r_off), 0, n_ * h, 0), beta=1.0, stream=stream)
        dx = arrays.cuda_empty((t_, n_, i_l), dt, stream)
        _input_gradients(cfg, layer, w, w_off, dw, dgx, inp, dx, (t_, n_, i_l), acc, stream)
        # dR_d = dgr_d^T . h_prev (all steps: hp slots 0 .. T-1)
        gemm.gemm("10", dgr, hp, dw[r_off[0]:], (gh, h, t_ * n_), (gh, h, h), _P3,
                  (d_, 1, t_ * n_ * gh, 0, (t_ + 1) * n_ * h, 0, _stride(r_off), 0),
                  stream=stream)
        _bias_gradients(dgx, dgr, dw, (t_ * n_, gh, d_, b_off[0], _stride(b_off)), acc, stream)
        dout = arrays.flat(dx)
    return dx, dhx, dcx, dw


def _check_state(cfg, x, lengths, state):
    op = "rnn_backward"
    if state.cfg != cfg or state.shape != tuple(x.shape):
        raise ValueError(f"{op}: the state was made for {state.cfg} with x of shape "
                         f"{state.shape}; got {cfg} with x of shape {tuple(x.shape)}")
    t_, n_ = state.shape[:2]

    def full(ln):
        return [t_] * n_ if ln is None else [int(v) for v in ln]
    if full(state.lengths) != full(lengths):
        raise ValueError(f"{op}: lengths {full(lengths)} differ from the forward's "
                         f"{full(state.lengths)}")


def _input_gradients(cfg, layer, w, w_off, dw, dgx, inp, dx, dims, acc, stream):
    """dx of the layer (its input) and dW = dgx^T . X."""
    t_, n_, i_l = dims
    d_, gh = cfg.directions, cfg.gates * cfg.hidden_size
    if w_off is None:
        from ..kernels import rnn_skip_bwd_kernel
        _elementwise(rnn_skip_bwd_kernel, dx.size, stream,
                     (dgx, arrays.flat(dx), (t_, n_, cfg.hidden_size, d_, cfg.gates), acc))
        return
    for d in range(d_):        # dx = sum_d dgx_d . W_d: one GEMM per direction, accumulating
        gemm.gemm("00", dgx[d * t_ * n_ * gh:], w[w_off[d]:], arrays.flat(dx),
                  (t_ * n_, i_l, gh), (gh, i_l, i_l), _P3, gemm.NO_BATCH, beta=float(d > 0),
                  stream=stream)
    gemm.gemm("10", dgx, inp, dw[w_off[0]:], (gh, i_l, t_ * n_), (gh, i_l, i_l), _P3,
              (d_, 1, t_ * n_ * gh, 0, 0, 0, _stride(w_off), 0), stream=stream)


def _bias_gradients(dgx, dgr, dw, geo, acc, stream):
    from ..kernels import rnn_bias_bwd_kernel
    bx, by = _BIAS_BLOCK_SIM if device.simulator() else _BIAS_BLOCK
    blocks = (min(-(-2 * geo[1] // bx), 1 if device.simulator() else 4096), geo[2])
    launch(rnn_bias_bwd_kernel, blocks, (bx, by), stream, (dgx, dgr, dw, geo, acc),
           bx * by * acc.dtype.itemsize)
