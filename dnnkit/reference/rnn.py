"""Float64 reference of the recurrent networks (docs/rnn.md): the equations run per
sequence, and backpropagation through time.

LSTM projection (cfg.proj_size P > 0): the cell's o*tanh(c') (H wide) is multiplied by the
projection W_hr (P x H) to give h' (P wide), which is the output, the state and what R reads.
Dropout between layers: ``masks`` (optional) lists, for each layer but the last, the factor
(T, N, D*P) its output is multiplied by before the next layer reads it (mask / (1 - p): the
keep mask a backend drew, scaled); the backward multiplies the gradient by the same factor.
"""

import numpy as np

from ..rnn_layout import GATES, param_layout


def _sigmoid(a):
    return 1.0 / (1.0 + np.exp(-a))


def _rnn_params(cfg, w):
    """{(layer, direction, lin_id): matrix or bias} (float64 views) from the flat buffer."""
    w = np.asarray(w, np.float64)
    mats, biases = {}, {}
    for layer, d, lin, kind, off, shape in param_layout(cfg):
        a = w[off:off + int(np.prod(shape))].reshape(shape)
        (mats if kind == "matrix" else biases)[(layer, d, lin)] = a
    return mats, biases


def _rnn_step(mode, xi, rec, bw, br, h, c):
    """One cell step from the equations (docs/rnn.md). xi[q] = W_q x (or x: skip), rec[q] =
    R_q h. Returns (h', c', saved activations)."""
    a = [xi[q] + bw[q] + rec[q] + br[q] for q in range(len(xi))]
    if mode in ("rnn_relu", "rnn_tanh"):
        hn = np.maximum(a[0], 0.0) if mode == "rnn_relu" else np.tanh(a[0])
        return hn, c, (hn,)
    if mode == "lstm":
        i, f, g, o = _sigmoid(a[0]), _sigmoid(a[1]), np.tanh(a[2]), _sigmoid(a[3])
        cn = f * c + i * g
        return o * np.tanh(cn), cn, (i, f, g, o, cn)
    r, z = _sigmoid(a[0]), _sigmoid(a[1])
    hn = rec[2] + br[2]
    n = np.tanh(xi[2] + bw[2] + r * hn)
    return (1 - z) * n + z * h, c, (r, z, n, hn)


def _rnn_step_grad(mode, saved, h, c, e, dc):
    """(input-side pre-activation gradients, recurrent-side ones, d(h) not through R, d(c))
    of one step, given E = dL/dh' and dc = dL/dc'."""
    if mode in ("rnn_relu", "rnn_tanh"):
        hn = saved[0]
        da = e * (hn > 0) if mode == "rnn_relu" else e * (1 - hn * hn)
        return [da], [da], 0.0, dc
    if mode == "lstm":
        i, f, g, o, cn = saved
        tc = np.tanh(cn)
        dct = dc + e * o * (1 - tc * tc)
        da = [dct * g * i * (1 - i), dct * c * f * (1 - f), dct * i * (1 - g * g),
              e * tc * o * (1 - o)]
        return da, da, 0.0, dct * f
    r, z, n, hn = saved
    dn = e * (1 - z) * (1 - n * n)
    dr = dn * hn * r * (1 - r)
    dz = e * (h - n) * z * (1 - z)
    return [dr, dz, dn], [dr, dz, dn * r], e * z, dc


def _rnn_run(cfg, w, x, hx, cx, lengths, masks):
    """Forward per sequence, per direction over its own valid steps; returns y, hy, cy and
    the tape (per layer: its input and {(d, n): [(t, h, c, saved, hc), ...]}; hc the
    unprojected o*tanh(c') of a projected LSTM, else None)."""
    mats, biases = _rnn_params(cfg, w)
    x = np.asarray(x, np.float64)
    t_, n_, _ = x.shape
    g, h_, d_, L = GATES[cfg.mode], cfg.hidden_size, cfg.directions, cfg.num_layers
    p_ = cfg.out_size
    lens = [t_] * n_ if lengths is None else [int(v) for v in lengths]
    hx = np.zeros((L * d_, n_, p_)) if hx is None else np.asarray(hx, np.float64)
    cx = np.zeros((L * d_, n_, h_)) if cx is None else np.asarray(cx, np.float64)
    hy, cy = np.zeros((L * d_, n_, p_)), np.zeros((L * d_, n_, h_))
    inp, tape = x, []
    for layer in range(L):
        y = np.zeros((t_, n_, d_ * p_))
        steps = {}
        for d in range(d_):
            W = [mats.get((layer, d, q)) for q in range(g)]
            R = [mats[(layer, d, g + q)] for q in range(g)]
            bw = [biases[(layer, d, q)] for q in range(g)]
            br = [biases[(layer, d, g + q)] for q in range(g)]
            proj = mats.get((layer, d, 2 * g))
            for n in range(n_):
                h, c = hx[layer * d_ + d, n], cx[layer * d_ + d, n]
                rec_steps = steps[(d, n)] = []
                order = range(lens[n]) if d == 0 else range(lens[n] - 1, -1, -1)
                for t in order:
                    xt = inp[t, n]
                    xi = [xt if Wq is None else Wq @ xt for Wq in W]
                    hn, cn, saved = _rnn_step(cfg.mode, xi, [Rq @ h for Rq in R], bw, br, h, c)
                    hc = None
                    if proj is not None:
                        hc, hn = hn, proj @ hn
                    rec_steps.append((t, h, c, saved, hc))
                    h, c = hn, cn
                    y[t, n, d * p_:(d + 1) * p_] = h
                hy[layer * d_ + d, n], cy[layer * d_ + d, n] = h, c
        tape.append((inp, steps))
        inp = y if layer == L - 1 or masks is None else y * np.asarray(masks[layer], np.float64)
    return inp, hy, (cy if cfg.mode == "lstm" else None), tape


def rnn_forward(cfg, w, x, hx=None, cx=None, lengths=None, masks=None):
    """(y, hy, cy) of the RNN ``cfg`` (dnnkit.rnn_layout.RNNConfig) in float64, time-major
    x (T, N, I), written from the equations (cy None unless lstm). ``masks``: the dropout
    factors between layers (module docstring), or None for none."""
    return _rnn_run(cfg, w, x, hx, cx, lengths, masks)[:3]


def rnn_backward(cfg, w, x, dy, dhy=None, dcy=None, hx=None, cx=None, lengths=None,
                 masks=None):
    """(dx, dhx, dcx, dw) of rnn_forward for L = sum(y*dy) + sum(hy*dhy) + sum(cy*dcy),
    by backpropagation through time; dw in the flat parameter layout."""
    mats, _ = _rnn_params(cfg, w)
    g, h_, d_, L = GATES[cfg.mode], cfg.hidden_size, cfg.directions, cfg.num_layers
    p_ = cfg.out_size
    _, _, _, tape = _rnn_run(cfg, w, x, hx, cx, lengths, masks)
    n_ = np.shape(x)[1]
    dhy = np.zeros((L * d_, n_, p_)) if dhy is None else np.asarray(dhy, np.float64)
    dcy = np.zeros((L * d_, n_, h_)) if dcy is None else np.asarray(dcy, np.float64)
    dhx, dcx = np.zeros_like(dhy), np.zeros_like(dcy)
    grads = {}   # (layer, d, lin, kind) -> gradient
    dout = np.asarray(dy, np.float64)
    for layer in range(L - 1, -1, -1):
        inp, steps = tape[layer]
        dinp = np.zeros_like(inp)
        for d in range(d_):
            W = [mats.get((layer, d, q)) for q in range(g)]
            R = [mats[(layer, d, g + q)] for q in range(g)]
            gw = [np.zeros((h_, inp.shape[2])) for _ in range(g)]
            gr = [np.zeros((h_, p_)) for _ in range(g)]
            gbw = [np.zeros(h_) for _ in range(g)]
            gbr = [np.zeros(h_) for _ in range(g)]
            proj = mats.get((layer, d, 2 * g))
            gp = None if proj is None else np.zeros(proj.shape)
            for n in range(n_):
                dh, dc = dhy[layer * d_ + d, n], dcy[layer * d_ + d, n]
                for t, h, c, saved, hc in reversed(steps[(d, n)]):
                    e = dh + dout[t, n, d * p_:(d + 1) * p_]
                    if proj is not None:        # h' = W_hr hc: dW_hr += e hc^T, d(hc) = W_hr^T e
                        gp += np.outer(e, hc)
                        e = proj.T @ e
                    dax, dar, direct, dc = _rnn_step_grad(cfg.mode, saved, h, c, e, dc)
                    dh = direct + sum(R[q].T @ dar[q] for q in range(g))
                    for q in range(g):
                        gbw[q] += dax[q]
                        gbr[q] += dar[q]
                        gr[q] += np.outer(dar[q], h)
                        if W[q] is None:
                            dinp[t, n] += dax[q]
                        else:
                            gw[q] += np.outer(dax[q], inp[t, n])
                            dinp[t, n] += W[q].T @ dax[q]
                dhx[layer * d_ + d, n], dcx[layer * d_ + d, n] = dh, dc
            for q in range(g):
                grads[(layer, d, q, "matrix")], grads[(layer, d, g + q, "matrix")] = gw[q], gr[q]
                grads[(layer, d, q, "bias")], grads[(layer, d, g + q, "bias")] = gbw[q], gbr[q]
            if gp is not None:
                grads[(layer, d, 2 * g, "matrix")] = gp
        dout = dinp
        if layer and masks is not None:     # through the dropout between layer - 1 and layer
            dout = dout * np.asarray(masks[layer - 1], np.float64)
    layout = param_layout(cfg)
    dw = np.zeros(layout[-1][4] + layout[-1][5][0])
    for layer, d, lin, kind, off, shape in layout:
        dw[off:off + int(np.prod(shape))] = grads[(layer, d, lin, kind)].ravel()
    return dout, dhx, (dcx if cfg.mode == "lstm" else None), dw
