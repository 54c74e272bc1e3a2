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
LSTM projection (proj_size P): per forward step two more launches after the cell (which writes
hc = o*tanh(c') instead of h): pr = hc . W_hr^T ("01") and rnn_proj_fwd_kernel (h', y, hy,
masking); per backward step rnn_proj_bwd_kernel (dL/dh' into dpr) and d(hc) = dpr . W_hr
("00") before the cell, and dW_hr = dpr^T . hc over all steps ("10") after the loop.
Dropout between layers (training, cfg.dropout > 0): layer l's output is multiplied by the mask
of dnnkit.dropout(seed, offset*(L-1) + l) (dropout_layer, kernels/dropout.py) before layer l+1
reads it; the backward multiplies layer l+1's dx by the same mask, re-derived from the seed.
The ``algo`` argument names cuDNN's algorithms: this backend has one and notes so in trace().
Precision: gates, c and every gradient accumulate in float32 for float16 data (float64 for
float64); h, y, hy, dx, dhx and dw are in the data type (as cuDNN keeps them).
"""

import warnings

import numpy as np

from .. import arrays, device, fastpath
from ..launch import Site, at, launch
from ..registry import register
from ..seeds import fresh_seed
from ..tracing import note_algo
from ..rnn_layout import GATES, has_input_matrix, layer_input_size, param_layout
from . import gemm
from .rnn_common import draws_masks

# The kernels (dnnkit.kernels) are imported inside the functions that launch them: importing
# them imports numba, which ``import dnnkit`` must not pay for.

MODE_ID = {"rnn_relu": 0, "rnn_tanh": 1, "lstm": 2, "gru": 3}   # kernels/rnn.py
_STORED = {"rnn_relu": 1, "rnn_tanh": 1, "lstm": 4, "gru": 4}   # S: values kept per unit
_P3 = gemm.PLAIN * 3
_TOL = {"float16": (1e-2, 1e-2), "float32": (1e-4, 1e-5), "float64": (1e-10, 1e-12)}
SPLIT_K = None              # force the per-step GEMMs' split-k factor (tests); None: choose
_BIAS_BLOCK = (32, 8)        # bias-gradient block: 32 columns x 8 row strides
_BIAS_BLOCK_SIM = (8, 2)     # the simulator: a Python thread per CUDA thread
_DROP_BLOCKS = 4096          # the dropout kernel's grid (grid-stride: any size is correct)


class NumbaRNNState:
    """What the Numba backward needs from a training forward: per layer the stored gate
    activations (``ws``), the h and c states of every step (``hp``, ``cp``), the layer's input
    (the layer below's output, dropped) and, for a projection, o*tanh(c') of every step
    (``hc``); the shapes and lengths it was made for; ``drop``: (seed, offset) of the dropout
    masks between layers, or None."""

    backend = "numba"

    def __init__(self, cfg, shape, lengths, layers, drop=None):
        self.cfg, self.shape, self.lengths, self.layers = cfg, tuple(shape), lengths, layers
        self.drop = drop

    def memo_key(self):
        """The backward's checks of the state run in the backend (_check_state), on every
        call; the signature holds what picks the backend and the runner."""
        return self.cfg, self.shape

    def __repr__(self):
        return f"NumbaRNNState({self.cfg.mode}, x shape {self.shape})"


fastpath.carried_type(NumbaRNNState)


def _blocks(cfg):
    """Per layer: (input-matrix offsets per direction or None, recurrent-matrix offsets,
    bias offsets, projection offsets or None), from param_layout; checks the contiguity the
    GEMMs rely on (a direction's G input matrices, G recurrent matrices and 2G biases each
    one block)."""
    g, h, p = cfg.gates, cfg.hidden_size, cfg.out_size
    at = {(l_, d, lin, kind): off for l_, d, lin, kind, off, _ in param_layout(cfg)}
    out = []
    for layer in range(cfg.num_layers):
        i_l = layer_input_size(cfg, layer)
        w_off, r_off, b_off, p_off = [], [], [], []
        for d in range(cfg.directions):
            for lin in range(2 * g):
                first, size = (0, h * i_l) if lin < g else (g, h * p)
                if (layer, d, lin, "matrix") in at:
                    assert at[(layer, d, lin, "matrix")] == \
                        at[(layer, d, first, "matrix")] + (lin - first) * size
                assert at[(layer, d, lin, "bias")] == at[(layer, d, 0, "bias")] + lin * h
            if has_input_matrix(cfg, layer):
                w_off.append(at[(layer, d, 0, "matrix")])
            r_off.append(at[(layer, d, g, "matrix")])
            b_off.append(at[(layer, d, 0, "bias")])
            if cfg.proj_size:
                p_off.append(at[(layer, d, 2 * g, "matrix")])
        out.append((w_off or None, r_off, b_off, p_off or None))
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


# ---------------------------------------------------------------- dropout between layers

def _quiet_on_the_simulator():
    """The simulator runs the dropout kernel's uint64 arithmetic on NumPy scalars, which warn
    when they wrap (wrapping modulo 2**64 is the generator's meaning): set per call, since test
    runners restore the warning filters around each test."""
    if device.simulator():
        warnings.filterwarnings("ignore", message=r".*overflow encountered in scalar",
                                category=RuntimeWarning, module=r".*kernels[./]dropout$")


def dropout_layer(a, p, seed, offset, stream):
    """A new array a * mask / (1 - p) with the mask of ``dnnkit.dropout(a, p, seed=seed,
    offset=offset)`` on Numba (kernels/dropout.py: a pure function of (seed + offset, element
    index)), so the backward re-derives it: the same call on the gradient."""
    from ..kernels import dropout_fwd_kernel
    from ..kernels.dropout import mask_key
    out = arrays.empty_like(a, stream)
    _quiet_on_the_simulator()
    acc = arrays.acc_array(a.dtype)
    blocks, threads = arrays.grid_1d((a.size + 1) // 2, max_blocks=_DROP_BLOCKS)   # pairs
    launch(dropout_fwd_kernel, blocks, threads, stream,
           (arrays.flat(a), arrays.flat(out), mask_key((seed + offset) % 2**64),
            np.uint64(min(round(p * 2**32), 2**32)), acc.dtype.type(1.0 / (1.0 - p)), acc))
    return out


def mask_offset(cfg, offset, layer):
    """The dropout mask (of the seed's sequence) applied to ``layer``'s output in call
    ``offset``: each call uses L - 1 consecutive masks."""
    return offset * (cfg.num_layers - 1) + layer


# ---------------------------------------------------------------- forward

@register("rnn_forward", "numba", tolerance=_TOL, crosscheck_skip=draws_masks)
def rnn_forward_numba(cfg, w, x, hx, cx, lengths, training, seed, offset, algo, stream):
    from ..kernels import rnn_cell_fwd_kernel, rnn_proj_fwd_kernel
    note_algo("gemm+cell" if algo == "auto" else
              f"gemm+cell (algo={algo!r} chooses among cuDNN's algorithms: ignored on Numba)")
    t_, n_, _ = x.shape
    h, d_, pw, proj = cfg.hidden_size, cfg.directions, cfg.out_size, cfg.proj_size > 0
    s_, gh, lstm = _STORED[cfg.mode], GATES[cfg.mode] * cfg.hidden_size, cfg.mode == "lstm"
    dt, acc = x.dtype, arrays.acc_array(x.dtype)
    lens = _lens(lengths, t_, n_, stream)
    hy = arrays.cuda_empty((cfg.num_layers * d_, n_, pw), dt, stream)
    cy = arrays.cuda_empty((cfg.num_layers * d_, n_, h), dt, stream) if lstm else None
    slots = t_ + 1 if training else 1
    parts = split_k(n_, gh, pw, d_)
    kc = pw // parts
    gr = arrays.cuda_empty((parts * d_ * n_ * gh,), acc.dtype, stream)
    drop = training and cfg.dropout > 0 and cfg.num_layers > 1
    seed = fresh_seed() if drop and seed is None else seed
    hsteps = t_ if training else 1          # hc (projection input) keeps every step to train
    pr = arrays.cuda_empty((d_ * n_ * pw,), acc.dtype, stream) if proj else None
    hc = arrays.cuda_empty((d_ * hsteps * n_ * h,), dt, stream) if proj else None
    layers, inp = [], arrays.flat(x)
    for layer, (w_off, r_off, b_off, p_off) in enumerate(_blocks(cfg)):
        i_l = layer_input_size(cfg, layer)
        ws = arrays.cuda_empty((d_ * t_ * n_ * s_ * h,), acc.dtype, stream)
        hp = arrays.cuda_empty((d_ * slots * n_ * pw,), dt, stream)
        cp = arrays.cuda_empty((d_ * slots * n_ * h,), acc.dtype, stream) if lstm else ws
        y = arrays.cuda_empty((t_, n_, d_ * pw), dt, stream)
        if proj and training and layer:       # each layer's hc is kept for its dW_hr
            hc = arrays.cuda_empty((d_ * hsteps * n_ * h,), dt, stream)
        if w_off is not None:                 # ws[d] = X . W_d^T, all steps, both directions
            gemm.gemm("01", inp, w[w_off[0]:], ws, (t_ * n_, gh, i_l), (i_l, i_l, s_ * h), _P3,
                      (d_, 1, 0, 0, _stride(w_off), 0, t_ * n_ * s_ * h, 0), stream=stream)
        lo = layer * d_ * n_
        h0 = arrays.flat(hx)[lo * pw:] if hx is not None else hp
        c0 = arrays.flat(cx)[lo * h:] if cx is not None else hp
        hy_l, cy_l = arrays.flat(hy)[lo * pw:], arrays.flat(cy)[lo * h:] if lstm else hp
        flags = (1 if w_off is None else 0) | (4 if hx is not None else 0) | \
            (8 if cx is not None else 0) | (16 if proj else 0)
        # per-step host work kept to the launches (views made once per layer; launch sites
        # that keep the argument types: the same arrays, offsets and int tuples)
        w_r, y_f, mode = w[r_off[0]:], arrays.flat(y), MODE_ID[cfg.mode]
        rec_site, cell_site, proj_site, fin_site = Site(), Site(), Site(), Site()
        rbatch = (d_, parts, 0, kc, _stride(r_off), kc, n_ * gh, d_ * n_ * gh)
        for s in range(t_):
            hin, hout = (s, s + 1) if training else (0, 0)
            rec = s > 0 or hx is not None
            if rec:                           # gr[p, d] = h_prev[:, slice p] . R_d[:, slice p]^T
                a, a1 = (at(hp, hin * n_ * pw), slots * n_ * pw) if s > 0 else (h0, n_ * pw)
                gemm.gemm("01", a, w_r, gr, (n_, gh, kc), (pw, pw, gh), _P3,
                          rbatch[:2] + (a1,) + rbatch[3:], stream=stream, site=rec_site)
            geo = (mode, s, t_, n_, h, d_, s_, flags | (2 if rec else 0), hin, hout, slots,
                   b_off[0], _stride(b_off), parts, pw)
            _elementwise(rnn_cell_fwd_kernel, d_ * n_ * h, stream,
                         (ws, gr, w, inp, h0, c0, hp, cp, hc if proj else y_f, hy_l, cy_l, lens,
                          geo, acc), cell_site)
            if proj:                          # pr[d] = hc_s[d] . W_hr[d]^T; then h', y, hy
                gemm.gemm("01", at(hc, (s if training else 0) * n_ * h), w[p_off[0]:], pr,
                          (n_, pw, h), (h, h, pw), _P3,
                          (d_, 1, hsteps * n_ * h, 0, _stride(p_off), 0, n_ * pw, 0),
                          stream=stream, site=proj_site)
                _elementwise(rnn_proj_fwd_kernel, d_ * n_ * pw, stream,
                             (pr, hp, y_f, hy_l, lens, (s, t_, n_, pw, d_, hin, hout, slots)),
                             fin_site)
        layers.append((ws, hp, cp if lstm else None, inp, hc if proj else None))
        inp = arrays.flat(y)
        if drop and layer < cfg.num_layers - 1:   # the next layer reads (and keeps) y dropped
            inp = arrays.flat(dropout_layer(y, cfg.dropout, seed,
                                            mask_offset(cfg, offset, layer), stream))
    state = NumbaRNNState(cfg, x.shape, lengths, layers, (seed, offset) if drop else None) \
        if training else None
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
    from ..kernels import rnn_cell_bwd_kernel, rnn_proj_bwd_kernel
    t_, n_, _ = x.shape
    h, d_, g, pw = cfg.hidden_size, cfg.directions, GATES[cfg.mode], cfg.out_size
    s_, gh, lstm, proj = _STORED[cfg.mode], g * h, cfg.mode == "lstm", cfg.proj_size > 0
    dt, acc = x.dtype, arrays.acc_array(x.dtype)
    lens = _lens(lengths, t_, n_, stream)
    dw = arrays.cuda_empty(w.shape, dt, stream)
    dhx = arrays.cuda_empty((cfg.num_layers * d_, n_, pw), dt, stream)
    dcx = arrays.cuda_empty((cfg.num_layers * d_, n_, h), dt, stream) if lstm else None
    dgx = arrays.cuda_empty((d_ * t_ * n_ * gh,), acc.dtype, stream)
    dgr = arrays.cuda_empty((d_ * t_ * n_ * gh,), acc.dtype, stream)
    parts = split_k(n_, pw, gh, d_)
    kc = gh // parts
    dh = arrays.cuda_empty(((1 + parts) * d_ * n_ * pw,), acc.dtype, stream)
    dh_parts = dh[d_ * n_ * pw:]
    dc = arrays.cuda_empty((d_ * n_ * h,), acc.dtype, stream) if lstm else dh
    dpr = arrays.cuda_empty((d_ * t_ * n_ * pw,), acc.dtype, stream) if proj else None
    dhc = arrays.cuda_empty((d_ * n_ * h,), acc.dtype, stream) if proj else None
    blocks = _blocks(cfg)
    dout = arrays.flat(dy)
    for layer in range(cfg.num_layers - 1, -1, -1):
        w_off, r_off, b_off, p_off = blocks[layer]
        ws, hp, cp, inp, hc = state.layers[layer]
        i_l = layer_input_size(cfg, layer)
        lo = layer * d_ * n_
        dhx_l = arrays.flat(dhx)[lo * pw:]
        dcx_l = arrays.flat(dcx)[lo * h:] if lstm else dhx_l
        dhy_l = arrays.flat(dhy)[lo * pw:] if dhy is not None else dout
        dcy_l = arrays.flat(dcy)[lo * h:] if dcy is not None else dout
        flags = (1 if dhy is not None else 0) | (2 if dcy is not None else 0)
        w_r = w[r_off[0]:]
        cell_site, rec_site, pb_site, pg_site = Site(), Site(), Site(), Site()
        for s in range(t_ - 1, -1, -1):
            if proj:    # dpr_s = dL/dh' (P wide); d(hc) = dpr_s . W_hr; the cell reads d(hc)
                _elementwise(rnn_proj_bwd_kernel, d_ * n_ * pw, stream,
                             (dout, dh, dhy_l, dhx_l, dpr, lens,
                              (s, t_, n_, pw, d_, flags, parts), acc), pb_site)
                gemm.gemm("00", at(dpr, s * n_ * pw), w[p_off[0]:], dhc, (n_, h, pw),
                          (pw, h, h), _P3, (d_, 1, t_ * n_ * pw, 0, _stride(p_off), 0, n_ * h, 0),
                          stream=stream, site=pg_site)
                args = (ws, hp, cp, dout, dhc, dc, dhy_l, dcy_l, dcx_l, dcx_l, dgx, dgr, lens,
                        (MODE_ID[cfg.mode], s, t_, n_, h, d_, s_, flags | 4, t_ + 1, 0), acc)
            else:
                args = (ws, hp, cp if lstm else ws, dout, dh, dc, dhy_l, dcy_l, dhx_l, dcx_l,
                        dgx, dgr, lens,
                        (MODE_ID[cfg.mode], s, t_, n_, h, d_, s_, flags, t_ + 1, parts), acc)
            _elementwise(rnn_cell_bwd_kernel, d_ * n_ * h, stream, args, cell_site)
            a, a1 = at(dgr, s * n_ * gh), t_ * n_ * gh
            if s:       # dh[1 + p] = dgr_s[:, slice p] . R[slice p, :]  (summed by the cell)
                gemm.gemm("00", a, w_r, dh_parts, (n_, pw, kc), (gh, pw, pw), _P3,
                          (d_, parts, a1, kc, _stride(r_off), kc * pw, n_ * pw, d_ * n_ * pw),
                          stream=stream, site=rec_site)
            else:       # dhx += dgr_0 . R
                gemm.gemm("00", a, w_r, dhx_l, (n_, pw, gh), (gh, pw, pw), _P3,
                          (d_, 1, a1, 0, _stride(r_off), 0, n_ * pw, 0), beta=1.0, stream=stream)
        dx = arrays.cuda_empty((t_, n_, i_l), dt, stream)
        _input_gradients(cfg, layer, w, w_off, dw, dgx, inp, dx, (t_, n_, i_l), acc, stream)
        # dR_d = dgr_d^T . h_prev (all steps: hp slots 0 .. T-1)
        gemm.gemm("10", dgr, hp, dw[r_off[0]:], (gh, pw, t_ * n_), (gh, pw, pw), _P3,
                  (d_, 1, t_ * n_ * gh, 0, (t_ + 1) * n_ * pw, 0, _stride(r_off), 0),
                  stream=stream)
        if proj:    # dW_hr_d = dpr_d^T . hc_d (all steps; dpr is 0 past each sequence's end)
            gemm.gemm("10", dpr, hc, dw[p_off[0]:], (pw, h, t_ * n_), (pw, h, h), _P3,
                      (d_, 1, t_ * n_ * pw, 0, t_ * n_ * h, 0, _stride(p_off), 0), stream=stream)
        _bias_gradients(dgx, dgr, dw, (t_ * n_, gh, d_, b_off[0], _stride(b_off)), acc, stream)
        dout = arrays.flat(dx)
        if state.drop is not None and layer:  # through the dropout below this layer's input
            dout = arrays.flat(dropout_layer(dx, cfg.dropout, state.drop[0],
                                             mask_offset(cfg, state.drop[1], layer - 1), stream))
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
