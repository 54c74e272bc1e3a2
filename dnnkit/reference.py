"""Float64 NumPy references: the definitions every backend is checked against."""

import numpy as np


def activation(x, mode="relu", coef=0.0):
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(over="ignore"):
        if mode == "relu":
            return np.where(x > 0, x, np.where(np.isnan(x), x, 0.0))
        if mode == "clipped_relu":
            return np.where(np.isnan(x), x, np.clip(x, 0.0, coef))
        if mode == "tanh":
            return np.tanh(x)
        if mode == "sigmoid":
            return 1.0 / (1.0 + np.exp(-x))
        if mode == "elu":
            return np.where(x > 0, x, coef * np.expm1(np.minimum(x, 0)))
        if mode == "swish":
            return x / (1.0 + np.exp(-coef * x))
        if mode == "identity":
            return x.copy()
    raise ValueError(f"unknown activation mode {mode!r}")


def activation_backward(x, dy, mode="relu", coef=0.0):
    """dy * f'(x). At the kinks the slope is cuDNN's: relu 0 at x == 0, clipped_relu 1 at
    x == coef (0 at x == 0), elu 1 at x == 0. A NaN x gives 0 for relu/clipped_relu. relu and
    clipped_relu select rather than multiply, as cuDNN and PyTorch: where their slope is 0, dx
    is 0 even for a NaN or Inf dy."""
    x = np.asarray(x, dtype=np.float64)
    dy = np.asarray(dy, dtype=np.float64)
    with np.errstate(over="ignore"):
        if mode == "relu":
            d = (x > 0) * 1.0   # NaN > 0 is False: slope 0, as cuDNN
        elif mode == "clipped_relu":
            d = ((x > 0) & (x <= coef)) * 1.0
        elif mode == "tanh":
            d = 1.0 - np.tanh(x) ** 2
        elif mode == "sigmoid":
            s = 1.0 / (1.0 + np.exp(-x))
            d = s * (1.0 - s)
        elif mode == "elu":
            d = np.where(x >= 0, 1.0, coef * np.exp(np.minimum(x, 0)))
            d = np.where(np.isnan(x), np.nan, d)
        elif mode == "swish":
            s = 1.0 / (1.0 + np.exp(-coef * x))
            d = s + coef * x * s * (1.0 - s)
        elif mode == "identity":
            d = np.ones_like(x)
        else:
            raise ValueError(f"unknown activation mode {mode!r}")
    if mode in ("relu", "clipped_relu"):
        return np.where(d != 0, dy, 0.0)
    return dy * d


def _rows(x, mode):
    """View x as (N, C, S) with the reduction over axis 1."""
    x = np.asarray(x, dtype=np.float64)
    n, c = x.shape[0], x.shape[1]
    s = int(np.prod(x.shape[2:], dtype=np.int64))
    return x.reshape(n, c * s, 1) if mode == "instance" else x.reshape(n, c, s)


def softmax(x, algo="accurate", mode="channel"):
    shape = np.shape(x)
    r = _rows(x, mode)
    m = r.max(axis=1, keepdims=True)
    e = np.exp(r - m)
    tot = e.sum(axis=1, keepdims=True)
    out = (r - m - np.log(tot)) if algo == "log" else e / tot
    return out.reshape(shape)


def softmax_backward(y, dy, algo="accurate", mode="channel"):
    shape = np.shape(y)
    y, dy = _rows(y, mode), _rows(dy, mode)
    if algo == "log":
        out = dy - np.exp(y) * dy.sum(axis=1, keepdims=True)
    else:
        out = y * (dy - (dy * y).sum(axis=1, keepdims=True))
    return out.reshape(shape)


def rel_error(got, ref):
    """max |got - ref| / max |ref| (inf when got has a NaN where ref does not)."""
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if not np.array_equal(np.isnan(got), np.isnan(ref)):
        return float("inf")
    ok = ~np.isnan(ref)
    if not ok.any():
        return 0.0
    scale = np.abs(ref[ok]).max()
    err = np.abs(got[ok] - ref[ok]).max()
    return float(err / scale) if scale > 0 else float(err)


# ---------------------------------------------------------------- convolution (N-d, float64)

def _flip(w):
    nd = w.ndim - 2
    return w[(slice(None), slice(None)) + (slice(None, None, -1),) * nd]


def _windows(x, ks, stride, padding, dilation):
    """cols[N, C, *taps, *out]: the padded input seen by every kernel tap at every output."""
    nd = x.ndim - 2
    xp = np.pad(x, [(0, 0), (0, 0)] + [(p, p) for p in padding])
    out = tuple((xp.shape[2 + i] - dilation[i] * (ks[i] - 1) - 1) // stride[i] + 1
                for i in range(nd))
    cols = np.empty(x.shape[:2] + tuple(ks) + out)
    for taps in np.ndindex(*ks):
        sl = tuple(slice(t * d, t * d + s * (o - 1) + 1, s)
                   for t, d, s, o in zip(taps, dilation, stride, out))
        cols[(slice(None), slice(None)) + taps] = xp[(slice(None), slice(None)) + sl]
    return cols, out, xp.shape


def _group_slices(c, k, groups):
    cg, kg = c // groups, k // groups
    return [(slice(g * cg, (g + 1) * cg), slice(g * kg, (g + 1) * kg)) for g in range(groups)]


def conv_forward(x, w, bias=None, stride=1, padding=0, dilation=1, groups=1, flip=False):
    """y[n, k, o] = sum_{c, t} x_pad[n, g*Cg + c, o*s + t*d] * w[k, c, t] (+ bias[k]);
    ``flip`` reverses the kernel (true convolution). Tuples have one entry per spatial dim."""
    x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
    nd = x.ndim - 2
    w = _flip(w) if flip else w
    cols, out, _ = _windows(x, w.shape[2:], stride, padding, dilation)
    y = np.empty((x.shape[0], w.shape[0]) + out)
    axes = list(range(1, 2 + nd))
    for cs, ks in _group_slices(x.shape[1], w.shape[0], groups):
        part = np.tensordot(cols[:, cs], w[ks], axes=(axes, axes))   # (N, *out, Kg)
        y[:, ks] = np.moveaxis(part, -1, 1)
    if bias is not None:
        y += np.asarray(bias, np.float64).reshape((1, -1) + (1,) * nd)
    return y


def conv_backward_data(dy, w, x_shape, stride=1, padding=0, dilation=1, groups=1, flip=False):
    dy, w = np.asarray(dy, np.float64), np.asarray(w, np.float64)
    w = _flip(w) if flip else w
    ks = w.shape[2:]
    padded = tuple(x_shape[:2]) + tuple(s + 2 * p for s, p in zip(x_shape[2:], padding))
    dxp = np.zeros(padded)
    for cs, kk in _group_slices(x_shape[1], w.shape[0], groups):
        # dcols[N, Cg, *taps, *out] = sum_k dy[N, k, *out] * w[k, Cg, *taps]
        wk = w[kk].reshape(w[kk].shape[0], w.shape[1], -1)              # (Kg, Cg, taps)
        dyk = dy[:, kk].reshape(dy.shape[0], wk.shape[0], -1)           # (N, Kg, out)
        dcols = np.einsum("nko,kct->ncto", dyk, wk)                     # (N, Cg, taps, out)
        dcols = dcols.reshape((dy.shape[0], wk.shape[1]) + tuple(ks) + dy.shape[2:])
        for taps in np.ndindex(*ks):
            sl = tuple(slice(t * d, t * d + s * (o - 1) + 1, s)
                       for t, d, s, o in zip(taps, dilation, stride, dy.shape[2:]))
            dxp[(slice(None), cs) + sl] += dcols[(slice(None), slice(None)) + taps]
    crop = tuple(slice(p, p + s) for p, s in zip(padding, x_shape[2:]))
    return dxp[(slice(None), slice(None)) + crop]


def conv_backward_filter(x, dy, w_shape, stride=1, padding=0, dilation=1, groups=1, flip=False):
    x, dy = np.asarray(x, np.float64), np.asarray(dy, np.float64)
    nd = x.ndim - 2
    cols, out, _ = _windows(x, w_shape[2:], stride, padding, dilation)
    dw = np.empty(w_shape)
    out_axes = list(range(2, 2 + nd))
    for cs, ks in _group_slices(x.shape[1], w_shape[0], groups):
        # dw[k, c, *taps] = sum_{n, o} dy[n, k, o] * cols[n, c, *taps, o]
        dw[ks] = np.tensordot(dy[:, ks], cols[:, cs],
                              axes=([0] + out_axes, [0] + [2 + nd + i for i in range(nd)]))
    return _flip(dw) if flip else dw


def conv_backward_bias(dy):
    dy = np.asarray(dy, np.float64)
    return dy.sum(axis=(0,) + tuple(range(2, dy.ndim)))


# ---------------------------------------------------------------- pooling (N-d, float64)

def _pool_tuple(v, nd):
    return tuple(int(a) for a in v) if np.ndim(v) else (int(v),) * nd


def _pool_windows(x_shape, window, stride, padding):
    """(output shape, [(output index, clipped input slices)], window size) of a pooling
    (stride None: the window)."""
    nd = len(x_shape) - 2
    window = _pool_tuple(window, nd)
    stride = window if stride is None else _pool_tuple(stride, nd)
    padding = _pool_tuple(padding, nd)
    out = tuple((n + 2 * p - k) // s + 1
                for n, k, s, p in zip(x_shape[2:], window, stride, padding))
    spans = [(o, tuple(slice(max(i * s - p, 0), min(i * s - p + k, n))
                       for i, n, k, s, p in zip(o, x_shape[2:], window, stride, padding)))
             for o in np.ndindex(*out)]
    return out, spans, int(np.prod(window))


def pool_forward(x, window, stride=None, padding=0, mode="max"):
    """Direct loops over the output positions. The window is clipped to the input (padding
    never enters a max or a sum); average_inc_pad divides by the full window size,
    average_exc_pad by the number of inputs in the clipped window. NaN propagates."""
    x = np.asarray(x, np.float64)
    out, spans, ksize = _pool_windows(x.shape, window, stride, padding)
    nc = x.shape[:2]
    y = np.empty(nc + out)
    for o, sl in spans:
        w = x[(slice(None), slice(None)) + sl]
        w = w.reshape(nc + (int(np.prod(w.shape[2:])),))
        if mode in ("max", "max_deterministic"):
            v = w.max(axis=-1) if w.size else np.zeros(nc)
        else:
            v = w.sum(axis=-1)
            v = v / {"average_inc_pad": ksize, "average": ksize,
                     "average_exc_pad": w.shape[-1], "sum": 1}[mode]
        y[(slice(None), slice(None)) + o] = v
    return y


def pool_backward(x, dy, window, stride=None, padding=0, mode="max"):
    """dx of :func:`pool_forward`. Max routes dy[o] to the window's first maximum in scan order
    (the lowest address), or to its first NaN: numpy's argmax rule."""
    x, dy = np.asarray(x, np.float64), np.asarray(dy, np.float64)
    out, spans, ksize = _pool_windows(x.shape, window, stride, padding)
    nc = x.shape[:2]
    dx = np.zeros(x.shape)
    n_i, c_i = np.indices(nc)
    for o, sl in spans:
        g = dy[(slice(None), slice(None)) + o]
        if mode in ("max", "max_deterministic"):
            w = x[(slice(None), slice(None)) + sl]
            flat = w.reshape(nc + (int(np.prod(w.shape[2:])),))
            if not flat.size:
                continue
            taps = np.unravel_index(flat.argmax(axis=-1), w.shape[2:])
            at = (n_i, c_i) + tuple(t + s.start for t, s in zip(taps, sl))
            dx[at] += g      # one target per (n, c): no repeated index within this update
        else:
            count = int(np.prod([s.stop - s.start for s in sl]))
            div = {"average_inc_pad": ksize, "average": ksize, "average_exc_pad": count,
                   "sum": 1}[mode]
            dx[(slice(None), slice(None)) + sl] += (g / div)[(...,) + (None,) * len(sl)]
    return dx


# ---------------------------------------------------------------- batch normalization, dropout

def _bn_axes(ndim, mode):
    """Axes the statistics reduce over: (0, 2, 3, ...) spatial, (0,) per-activation."""
    return (0,) if mode == "per-activation" else (0,) + tuple(range(2, ndim))


def _bn_param(p, x, mode):
    """A parameter ((C,), (1, C, 1...), C*H*W... or (1, C, H, W...)) broadcast against x."""
    p = np.asarray(p, np.float64)
    if mode == "per-activation":
        return p.reshape((1,) + x.shape[1:])
    return p.reshape((1, x.shape[1]) + (1,) * (x.ndim - 2))


def batch_norm_train(x, gamma, beta, mode="spatial", epsilon=1e-5, momentum=0.1,
                     running_mean=None, running_var=None):
    """(y, saved_mean, saved_invstd, new_running_mean, new_running_var), statistics shaped like
    gamma. saved_invstd = 1/sqrt(biased var + eps); the running variance is updated with the
    unbiased variance var * m/(m-1) (m values per statistic), as cuDNN does."""
    x = np.asarray(x, np.float64)
    mean = x.mean(axis=_bn_axes(x.ndim, mode), keepdims=True)
    m = x.size // mean.size
    var = ((x - mean) ** 2).mean(axis=_bn_axes(x.ndim, mode), keepdims=True)
    invstd = 1.0 / np.sqrt(var + epsilon)
    y = (x - mean) * invstd * _bn_param(gamma, x, mode) + _bn_param(beta, x, mode)
    shape = np.shape(gamma)
    new_rm = new_rv = None
    if running_mean is not None:
        new_rm = ((1 - momentum) * np.asarray(running_mean, np.float64)
                  + momentum * mean.reshape(shape))
        new_rv = ((1 - momentum) * np.asarray(running_var, np.float64)
                  + momentum * (var * m / (m - 1)).reshape(shape))
    return y, mean.reshape(shape), invstd.reshape(shape), new_rm, new_rv


def batch_norm_inference(x, gamma, beta, mean, var, mode="spatial", epsilon=1e-5):
    x = np.asarray(x, np.float64)
    p = [_bn_param(a, x, mode) for a in (gamma, beta, mean, var)]
    return (x - p[2]) / np.sqrt(p[3] + epsilon) * p[0] + p[1]


def batch_norm_backward(x, dy, gamma, saved_mean, saved_invstd, mode="spatial"):
    """(dx, dgamma, dbeta) of y = (x - mean) * invstd * gamma + beta with the batch statistics
    as functions of x (training mode), given the forward's saved mean and invstd."""
    x, dy = np.asarray(x, np.float64), np.asarray(dy, np.float64)
    axes = _bn_axes(x.ndim, mode)
    mean, invstd = _bn_param(saved_mean, x, mode), _bn_param(saved_invstd, x, mode)
    m = x.size // mean.size
    xhat = (x - mean) * invstd
    dbeta = dy.sum(axis=axes, keepdims=True)
    dgamma = (dy * xhat).sum(axis=axes, keepdims=True)
    dx = _bn_param(gamma, x, mode) * invstd * (dy - dbeta / m - xhat * dgamma / m)
    shape = np.shape(gamma)
    return dx, dgamma.reshape(shape), dbeta.reshape(shape)


def dropout(x, mask, p):
    """x * mask / (1 - p) for a 0/1 (or boolean) mask."""
    return np.asarray(x, np.float64) * np.asarray(mask, np.float64) / (1.0 - p)


# ---------------------------------------------------------------- recurrent networks

def _sigmoid(a):
    return 1.0 / (1.0 + np.exp(-a))


def _rnn_params(cfg, w):
    """{(layer, direction, lin_id): matrix or bias} (float64 views) from the flat buffer."""
    from .ops.rnn_common import param_layout
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


def _rnn_run(cfg, w, x, hx, cx, lengths):
    """Forward per sequence, per direction over its own valid steps; returns y, hy, cy and
    the tape (per layer: its input and {(d, n): [(t, h, c, saved), ...]})."""
    from .ops.rnn_common import GATES
    mats, biases = _rnn_params(cfg, w)
    x = np.asarray(x, np.float64)
    t_, n_, _ = x.shape
    g, h_, d_, L = GATES[cfg.mode], cfg.hidden_size, cfg.directions, cfg.num_layers
    lens = [t_] * n_ if lengths is None else [int(v) for v in lengths]
    zeros = np.zeros((L * d_, n_, h_))
    hx = zeros if hx is None else np.asarray(hx, np.float64)
    cx = zeros if cx is None else np.asarray(cx, np.float64)
    hy, cy = zeros.copy(), zeros.copy()
    inp, tape = x, []
    for layer in range(L):
        y = np.zeros((t_, n_, d_ * h_))
        steps = {}
        for d in range(d_):
            W = [mats.get((layer, d, q)) for q in range(g)]
            R = [mats[(layer, d, g + q)] for q in range(g)]
            bw = [biases[(layer, d, q)] for q in range(g)]
            br = [biases[(layer, d, g + q)] for q in range(g)]
            for n in range(n_):
                h, c = hx[layer * d_ + d, n], cx[layer * d_ + d, n]
                rec_steps = steps[(d, n)] = []
                order = range(lens[n]) if d == 0 else range(lens[n] - 1, -1, -1)
                for t in order:
                    xt = inp[t, n]
                    xi = [xt if Wq is None else Wq @ xt for Wq in W]
                    hn, cn, saved = _rnn_step(cfg.mode, xi, [Rq @ h for Rq in R], bw, br, h, c)
                    rec_steps.append((t, h, c, saved))
                    h, c = hn, cn
                    y[t, n, d * h_:(d + 1) * h_] = h
                hy[layer * d_ + d, n], cy[layer * d_ + d, n] = h, c
        tape.append((inp, steps))
        inp = y
    return inp, hy, (cy if cfg.mode == "lstm" else None), tape


def rnn_forward(cfg, w, x, hx=None, cx=None, lengths=None):
    """(y, hy, cy) of the RNN ``cfg`` (dnnkit.ops.rnn_common.RNNConfig) in float64, time-major
    x (T, N, I), written from the equations (cy None unless lstm)."""
    return _rnn_run(cfg, w, x, hx, cx, lengths)[:3]


def rnn_backward(cfg, w, x, dy, dhy=None, dcy=None, hx=None, cx=None, lengths=None):
    """(dx, dhx, dcx, dw) of rnn_forward for L = sum(y*dy) + sum(hy*dhy) + sum(cy*dcy),
    by backpropagation through time; dw in the flat parameter layout."""
    from .ops.rnn_common import GATES, param_layout
    mats, _ = _rnn_params(cfg, w)
    g, h_, d_, L = GATES[cfg.mode], cfg.hidden_size, cfg.directions, cfg.num_layers
    _, _, _, tape = _rnn_run(cfg, w, x, hx, cx, lengths)
    n_ = np.shape(x)[1]
    zeros = np.zeros((L * d_, n_, h_))
    dhy = zeros if dhy is None else np.asarray(dhy, np.float64)
    dcy = zeros if dcy is None else np.asarray(dcy, np.float64)
    dhx, dcx = zeros.copy(), zeros.copy()
    grads = {}   # (layer, d, lin, kind) -> gradient
    dout = np.asarray(dy, np.float64)
    for layer in range(L - 1, -1, -1):
        inp, steps = tape[layer]
        dinp = np.zeros_like(inp)
        for d in range(d_):
            W = [mats.get((layer, d, q)) for q in range(g)]
            R = [mats[(layer, d, g + q)] for q in range(g)]
            gw = [np.zeros((h_, inp.shape[2])) for _ in range(g)]
            gr = [np.zeros((h_, h_)) for _ in range(g)]
            gbw = [np.zeros(h_) for _ in range(g)]
            gbr = [np.zeros(h_) for _ in range(g)]
            for n in range(n_):
                dh, dc = dhy[layer * d_ + d, n], dcy[layer * d_ + d, n]
                for t, h, c, saved in reversed(steps[(d, n)]):
                    e = dh + dout[t, n, d * h_:(d + 1) * h_]
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
        dout = dinp
    layout = param_layout(cfg)
    dw = np.zeros(layout[-1][4] + layout[-1][5][0])
    for layer, d, lin, kind, off, shape in layout:
        dw[off:off + int(np.prod(shape))] = grads[(layer, d, lin, kind)].ravel()
    return dout, dhx, (dcx if cfg.mode == "lstm" else None), dw


# ---------------------------------------------------------------- spatial transformer
# The coordinate convention is kernels/spatial.py's (ALIGN_CORNERS and its docstring).

def _spatial_align():
    from .kernels.spatial import ALIGN_CORNERS
    return ALIGN_CORNERS


def spatial_grid_coords(n):
    """Normalized coordinates of the n output points along one dimension."""
    i = np.arange(n, dtype=np.float64)
    return -1.0 + 2.0 * i / max(n - 1, 1) if _spatial_align() else -1.0 + (2.0 * i + 1.0) / n


def _spatial_pixel(x, n):
    """(pixel coordinate, d pixel / d normalized) of normalized x along n pixels."""
    s = (n - 1) / 2.0 if _spatial_align() else n / 2.0
    return ((x + 1.0) * s if _spatial_align() else (x + 1.0) * s - 0.5), s


def affine_grid(theta, out_shape):
    """grid (N, H', W', 2) = theta[n] @ (x_j, y_i, 1), stored (x, y)."""
    theta = np.asarray(theta, dtype=np.float64)
    _, _, oh, ow = out_shape
    ys, xs = np.meshgrid(spatial_grid_coords(oh), spatial_grid_coords(ow), indexing="ij")
    base = np.stack([xs, ys, np.ones_like(xs)], axis=-1)          # (H', W', 3)
    return np.einsum("hwk,nck->nhwc", base, theta)


def affine_grid_backward(dgrid):
    dgrid = np.asarray(dgrid, dtype=np.float64)
    _, oh, ow, _ = dgrid.shape
    ys, xs = np.meshgrid(spatial_grid_coords(oh), spatial_grid_coords(ow), indexing="ij")
    base = np.stack([xs, ys, np.ones_like(xs)], axis=-1)
    return np.einsum("hwk,nhwc->nck", base, dgrid)


def _spatial_taps(grid, h, w):
    u, su = _spatial_pixel(grid[..., 0], w)
    v, sv = _spatial_pixel(grid[..., 1], h)
    u0, v0 = np.floor(u), np.floor(v)
    return u0.astype(np.int64), v0.astype(np.int64), u - u0, v - v0, su, sv


def grid_sample(img, grid):
    """Bilinear sampling of img (N, C, H, W) at grid (N, H', W', 2); zero outside."""
    img, grid = np.asarray(img, dtype=np.float64), np.asarray(grid, dtype=np.float64)
    n_, c_, h, w = img.shape
    u0, v0, fu, fv, _, _ = _spatial_taps(grid, h, w)
    out = np.zeros((n_, c_) + grid.shape[1:3])
    nidx = np.arange(n_)[:, None, None]
    for a in (0, 1):
        for b in (0, 1):
            uu, vv = u0 + a, v0 + b
            wt = (fu if a else 1 - fu) * (fv if b else 1 - fv)
            ok = (uu >= 0) & (uu < w) & (vv >= 0) & (vv < h)
            vals = img[nidx, :, np.clip(vv, 0, h - 1), np.clip(uu, 0, w - 1)]  # (N,H',W',C)
            out += np.moveaxis(np.where(ok[..., None], vals * wt[..., None], 0.0), -1, 1)
    return out


def spatial_kinks(grid, hw, tol=1e-3):
    """(N, H', W') mask of grid points whose pixel coordinate u or v lies within ``tol`` of an
    integer: bilinear sampling has a kink there, so dgrid is a one-sided slope that depends on
    the last bit of the coordinate (the float64 reference and a float32 kernel may take
    different sides). Compare dgrid off these points."""
    g = np.asarray(grid, dtype=np.float64)
    h, w = hw
    u, v = _spatial_pixel(g[..., 0], w)[0], _spatial_pixel(g[..., 1], h)[0]
    return (np.abs(u - np.round(u)) < tol) | (np.abs(v - np.round(v)) < tol)


def off_kinks(dgrid, grid, hw):
    """dgrid with the points of :func:`spatial_kinks` zeroed (the comparison helper)."""
    d = np.array(dgrid, dtype=np.float64)
    d[spatial_kinks(grid, hw)] = 0.0
    return d


def grid_sample_backward(img, grid, dy):
    """(dimg, dgrid) of grid_sample."""
    img, grid = np.asarray(img, dtype=np.float64), np.asarray(grid, dtype=np.float64)
    dy = np.asarray(dy, dtype=np.float64)
    n_, c_, h, w = img.shape
    u0, v0, fu, fv, su, sv = _spatial_taps(grid, h, w)
    dimg = np.zeros_like(img)
    dgrid = np.zeros_like(grid)
    nidx = np.arange(n_)[:, None, None]
    g = np.moveaxis(dy, 1, -1)                                      # (N, H', W', C)
    for a in (0, 1):
        for b in (0, 1):
            uu, vv = u0 + a, v0 + b
            ok = (uu >= 0) & (uu < w) & (vv >= 0) & (vv < h)
            vals = np.where(ok[..., None],
                            img[nidx, :, np.clip(vv, 0, h - 1), np.clip(uu, 0, w - 1)], 0.0)
            wu, wv = (fu if a else 1 - fu), (fv if b else 1 - fv)
            dgrid[..., 0] += (g * vals).sum(-1) * (1 if a else -1) * wv * su
            dgrid[..., 1] += (g * vals).sum(-1) * (1 if b else -1) * wu * sv
            contrib = np.where(ok[..., None], g * (wu * wv)[..., None], 0.0)
            nn = np.broadcast_to(nidx, uu.shape)
            for c in range(c_):
                np.add.at(dimg[:, c], (nn[ok], vv[ok], uu[ok]), contrib[..., c][ok])
    return dimg, dgrid


def spatial_transformer(img, theta, scale_height=1.0, scale_width=1.0):
    n_, c_, h, w = np.shape(img)
    out = (n_, c_, int(np.ceil(h * scale_height)), int(np.ceil(w * scale_width)))
    return grid_sample(img, affine_grid(theta, out))
